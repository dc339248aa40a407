//! Fuzzes answer normalization: any questions that pass their bounds and
//! any reply (a text, or an `answers` object) either normalize or are
//! refused with a reason, never a panic; and what normalizes answers only
//! the questions asked, every required one, with values of the documented
//! shapes (a label, labels of the question's options, other text, a typed value).
#![no_main]

use chatgate::protocol::question::{check_questions, normalize_answers, normalize_text, Question};
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};

fuzz_target!(|data: &[u8]| {
    // Questions, a NUL, then the reply: an `answers` object if it parses
    // as one, else an `answer:<text>` text.
    let Some(split) = data.iter().position(|&b| b == 0) else {
        return;
    };
    let Ok(questions) = serde_json::from_slice::<Vec<Question>>(&data[..split]) else {
        return;
    };
    if check_questions(&questions).is_err() {
        return;
    }
    let reply = &data[split + 1..];
    let normalized = match serde_json::from_slice::<Map<String, Value>>(reply) {
        Ok(given) => normalize_answers(&questions, &given),
        Err(_) => normalize_text(&questions, &String::from_utf8_lossy(reply)),
    };
    let Ok(answers) = normalized else {
        return;
    };
    for (id, value) in &answers {
        let q = questions.iter().find(|q| &q.id == id).expect("only asked questions are answered");
        let is_label = |v: &Value| v.as_str().is_some_and(|t| q.options.iter().any(|o| o.label == t));
        match value {
            Value::Array(items) => {
                assert!(q.multi_select && !items.is_empty() && items.iter().all(is_label));
            }
            Value::String(text) => {
                assert!(!text.trim().is_empty() || q.schema.is_some());
                assert!(is_label(value) || q.allow_other || q.options.is_empty());
            }
            Value::Number(_) | Value::Bool(_) => assert!(q.schema.is_some()),
            other => panic!("an answer of an undocumented shape: {other}"),
        }
    }
    for q in questions.iter().filter(|q| q.required) {
        assert!(answers.contains_key(&q.id), "required `{}` unanswered", q.id);
    }
});
