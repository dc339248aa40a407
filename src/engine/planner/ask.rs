//! The planner's questions (#16), as text: a step `ask <id>: <question>?
//! <a> | <b> | ...` is a question with those options (no `| ...` part: free
//! text; `[multi]` right after the `?`: multi-select; `[integer]`,
//! `[integer 1..9]`, `[number]`, `[number 0..1]` or `[boolean]` there
//! instead: a typed question, its schema that type (and bounds); without
//! `<id>:` the ids are `q1`, `q2`, ... in order). The plan's leading `ask` steps, up to
//! four, are asked together before anything else; the answers then replace
//! `{<id>}` in the later steps, and a skip drops the steps that mention a
//! skipped question. Planner questions allow other text and are required.
//!
//! Pure functions; the planner engine asks and applies them.

use serde_json::{Map, Value};

use crate::protocol::question::{
    check_questions, Question, QuestionOption, MAX_HEADER_CHARS, MAX_ID_CHARS, MAX_QUESTIONS,
};

/// The leading questions of a plan, and the steps that follow them.
#[derive(Debug, Clone, PartialEq)]
pub struct Asked {
    pub questions: Vec<Question>,
    pub steps: Vec<String>,
}

/// The rest of `step` after a leading `ask` word, if it is a question.
fn ask_step(step: &str) -> Option<&str> {
    let trimmed = step.trim_start();
    let (word, rest) = trimmed.split_at(trimmed.find(char::is_whitespace)?);
    word.eq_ignore_ascii_case("ask").then(|| rest.trim())
}

fn is_id(text: &str) -> bool {
    !text.is_empty()
        && text.chars().count() <= MAX_ID_CHARS
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// An option's id from its label: lower case, runs of other characters as
/// `-`; `o<N>` when that leaves nothing or repeats an earlier one.
fn option_id(label: &str, n: usize, taken: &[QuestionOption]) -> String {
    let mut id = String::new();
    for c in label.to_lowercase().chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            id.push(c);
        } else if !id.ends_with('-') {
            id.push('-');
        }
    }
    let id: String = id.trim_matches('-').chars().take(MAX_ID_CHARS).collect();
    if id.is_empty() || taken.iter().any(|o| o.id == id) {
        format!("o{n}")
    } else {
        id
    }
}

/// One `ask` step (its text after `ask`) as the `n`th question.
fn question(rest: &str, n: usize) -> Question {
    let (id, rest) = match rest.split_once(':') {
        Some((id, after)) if is_id(id.trim()) => (id.trim().to_owned(), after.trim()),
        _ => (format!("q{n}"), rest),
    };
    let (text, tail) = match rest.find('?') {
        Some(at) => (&rest[..=at], rest[at + 1..].trim()),
        None => (rest, ""),
    };
    let (multi_select, tail) = match tail.strip_prefix("[multi]") {
        Some(after) => (true, after.trim()),
        None => (false, tail),
    };
    let (schema, tail) = match typed(tail) {
        Some((schema, after)) => (Some(schema), after),
        None => (None, tail),
    };
    let mut options = Vec::new();
    for (i, label) in tail
        .split('|')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .enumerate()
    {
        let id = option_id(label, i + 1, &options);
        options.push(QuestionOption {
            id,
            label: label.to_owned(),
            description: String::new(),
        });
    }
    Question {
        header: id.chars().take(MAX_HEADER_CHARS).collect(),
        id,
        question: text.trim().to_owned(),
        options,
        multi_select,
        allow_other: true,
        required: true,
        schema,
    }
}

/// A leading `[integer]`, `[integer <min>..<max>]`, `[number ...]` or
/// `[boolean]`: the schema it names, and the text after it.
fn typed(tail: &str) -> Option<(serde_json::Value, &str)> {
    let inner = tail.strip_prefix('[')?;
    let (tag, after) = inner.split_once(']')?;
    let mut words = tag.split_whitespace();
    let kind = words.next()?;
    if !matches!(kind, "integer" | "number" | "boolean") {
        return None;
    }
    let mut schema = serde_json::Map::new();
    schema.insert("type".into(), kind.into());
    if let Some(range) = words.next().filter(|_| kind != "boolean") {
        let (min, max) = range.split_once("..")?;
        let bound = |text: &str| -> Option<Option<serde_json::Value>> {
            if text.is_empty() {
                return Some(None);
            }
            let value: f64 = text.parse().ok()?;
            Some(Some(if kind == "integer" {
                serde_json::Value::from(value as i64)
            } else {
                serde_json::Number::from_f64(value)?.into()
            }))
        };
        if let Some(min) = bound(min)? {
            schema.insert("minimum".into(), min);
        }
        if let Some(max) = bound(max)? {
            schema.insert("maximum".into(), max);
        }
    }
    Some((serde_json::Value::Object(schema), after.trim()))
}

/// The plan's leading `ask` steps as questions (at most four, checked
/// against every bound), and the steps after them; `None` when the plan
/// does not start with a question.
pub fn leading_questions(steps: &[String]) -> Result<Option<Asked>, String> {
    let asks: Vec<&str> = steps.iter().map_while(|s| ask_step(s)).collect();
    if asks.is_empty() {
        return Ok(None);
    }
    if asks.len() > MAX_QUESTIONS {
        return Err(format!(
            "a plan may start with at most {MAX_QUESTIONS} questions, not {}",
            asks.len()
        ));
    }
    let questions: Vec<Question> = asks
        .iter()
        .enumerate()
        .map(|(i, rest)| question(rest, i + 1))
        .collect();
    check_questions(&questions).map_err(|err| err.to_string())?;
    Ok(Some(Asked {
        questions,
        steps: steps[asks.len()..].to_vec(),
    }))
}

/// An answer as it reads in a step: labels joined with `, `.
fn as_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Array(items) => items.iter().map(as_text).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}

/// The steps after the answers, and the steps a skip dropped.
#[derive(Debug, PartialEq)]
pub struct Applied {
    pub kept: Vec<String>,
    pub dropped: Vec<String>,
}

/// The steps with `{<id>}` replaced by the answers, once, over each step as
/// written: text an answer put in is never read for marks again (an answer
/// holding another question's `{id}` stays as typed). With `None` (a skip),
/// or for a question left unanswered, the steps that mention it are
/// dropped. The kept steps may add up to at most `limit` bytes: an answer
/// repeated by many marks could otherwise make a step of any size, so past
/// it the work stops.
pub fn apply_answers(
    steps: &[String],
    questions: &[Question],
    answers: Option<&Map<String, Value>>,
    limit: usize,
) -> Result<Applied, TooLarge> {
    let texts: Vec<(&str, Option<String>)> = questions
        .iter()
        .map(|q| {
            let answer = answers.and_then(|a| a.get(&q.id)).map(as_text);
            (q.id.as_str(), answer)
        })
        .collect();
    let mut applied = Applied {
        kept: Vec::with_capacity(steps.len()),
        dropped: Vec::new(),
    };
    let mut total = 0;
    for step in steps {
        match fill(step, &texts, limit - total) {
            Filled::Kept(text) => {
                total += text.len();
                applied.kept.push(text);
            }
            Filled::Dropped => applied.dropped.push(step.clone()),
            Filled::TooLarge => return Err(TooLarge),
        }
    }
    Ok(applied)
}

/// The steps with their answers would be over the limit.
#[derive(Debug, PartialEq)]
pub struct TooLarge;

enum Filled {
    Kept(String),
    /// It mentions a question with no answer.
    Dropped,
    /// It would be over the bytes left.
    TooLarge,
}

/// One step with its marks replaced, in one pass from left to right, at
/// most `room` bytes long.
fn fill(step: &str, texts: &[(&str, Option<String>)], room: usize) -> Filled {
    let mut out = String::with_capacity(step.len().min(room));
    let mut rest = step;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let mark = after
            .find('}')
            .and_then(|close| texts.iter().find(|(id, _)| *id == &after[..close]));
        match mark {
            Some((id, Some(answer))) => {
                out.push_str(answer);
                rest = &after[id.len() + 1..];
            }
            Some((_, None)) => return Filled::Dropped,
            None => {
                out.push('{');
                rest = after;
            }
        }
        if out.len() > room {
            return Filled::TooLarge;
        }
    }
    out.push_str(rest);
    if out.len() > room {
        return Filled::TooLarge;
    }
    Filled::Kept(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::protocol::question::normalize_text;

    const LIMIT: usize = crate::protocol::MAX_CONFIRMATION_BYTES;

    fn steps(text: &str) -> Vec<String> {
        crate::engine::planner::plan_steps(text)
    }

    #[test]
    fn the_issue_s_example_asks_then_plans_with_the_answer() {
        let plan = steps("ask region: which region? eu-west | us-east; deploy to {region}");
        let asked = leading_questions(&plan).unwrap().unwrap();

        let q = &asked.questions[0];
        assert_eq!(q.id, "region");
        assert_eq!(q.question, "which region?");
        let ids: Vec<&str> = q.options.iter().map(|o| o.id.as_str()).collect();
        assert_eq!(ids, ["eu-west", "us-east"]);
        assert!(q.allow_other && q.required && !q.multi_select);
        assert_eq!(asked.steps, ["deploy to {region}"]);

        let answers = normalize_text(&asked.questions, "eu-west").unwrap();
        let applied = apply_answers(&asked.steps, &asked.questions, Some(&answers), LIMIT).unwrap();
        assert_eq!(applied.kept, ["deploy to eu-west"]);
        assert!(applied.dropped.is_empty());
    }

    #[test]
    fn ids_default_to_q1_q2_free_text_and_multi_select_are_spelled_in_the_step() {
        let plan = steps(
            "ask what should the report cover?; \
             ask which checks? [multi] Lint | Unit tests | Lint; \
             ASK owner: who signs off?; write the report on {q1} checked by {q2} for {owner}",
        );
        let asked = leading_questions(&plan).unwrap().unwrap();

        let ids: Vec<&str> = asked.questions.iter().map(|q| q.id.as_str()).collect();
        assert_eq!(ids, ["q1", "q2", "owner"]);
        assert!(asked.questions[0].options.is_empty(), "free text");
        let checks = &asked.questions[1];
        assert!(checks.multi_select);
        let option_ids: Vec<&str> = checks.options.iter().map(|o| o.id.as_str()).collect();
        assert_eq!(
            option_ids,
            ["lint", "unit-tests", "o3"],
            "a repeated label gets its own id"
        );

        let answers = json!({"q1": "costs", "q2": ["Lint", "Unit tests"], "owner": "Ana"});
        let applied = apply_answers(&asked.steps, &asked.questions, answers.as_object(), LIMIT);
        assert_eq!(
            applied.unwrap().kept,
            ["write the report on costs checked by Lint, Unit tests for Ana"]
        );
    }

    #[test]
    fn a_skip_drops_the_steps_that_mention_a_question() {
        let plan = steps("ask region: where?; build; deploy to {region}; tell {nobody}");
        let asked = leading_questions(&plan).unwrap().unwrap();
        let applied = apply_answers(&asked.steps, &asked.questions, None, LIMIT).unwrap();
        assert_eq!(applied.kept, ["build", "tell {nobody}"]);
        assert_eq!(applied.dropped, ["deploy to {region}"]);
    }

    #[test]
    fn an_answer_is_put_in_once_and_never_read_for_marks_again() {
        let plan = steps("ask a: first?; ask b: second?; {a}{a} and {b} {unknown} {; {a");
        let asked = leading_questions(&plan).unwrap().unwrap();
        let answers = json!({"a": "{b}{a}", "b": "B"});
        let applied = apply_answers(&asked.steps, &asked.questions, answers.as_object(), LIMIT);
        assert_eq!(
            applied.unwrap().kept,
            ["{b}{a}{b}{a} and B {unknown} {", "{a"]
        );
    }

    #[test]
    fn answers_that_would_make_the_plan_too_large_stop_at_the_limit() {
        // The hostile review's reply: every `{a}` a copy of the answer.
        let marks = "{a}".repeat(10_000);
        let plan = steps(&format!("ask a: first?; {marks}"));
        let asked = leading_questions(&plan).unwrap().unwrap();
        let answers = json!({"a": "x".repeat(4_000)});
        let applied = apply_answers(&asked.steps, &asked.questions, answers.as_object(), LIMIT);
        assert_eq!(applied, Err(TooLarge));
        // Exactly at the limit is still a plan.
        let answers = json!({"a": "x".repeat(LIMIT / 10_000)});
        let kept = apply_answers(&asked.steps, &asked.questions, answers.as_object(), LIMIT);
        assert_eq!(kept.unwrap().kept[0].len(), LIMIT / 10_000 * 10_000);
    }

    #[test]
    fn a_type_tag_makes_a_typed_question() {
        let plan = steps("ask n: how many? [integer 1..9]; ask ok: go? [boolean]; ask x: ratio? [number ..1.5]; run {n}");
        let asked = leading_questions(&plan).unwrap().unwrap();
        let schemas: Vec<_> = asked
            .questions
            .iter()
            .map(|q| q.schema.clone().unwrap())
            .collect();
        assert_eq!(
            schemas[0],
            json!({"type": "integer", "minimum": 1, "maximum": 9})
        );
        assert_eq!(schemas[1], json!({"type": "boolean"}));
        assert_eq!(schemas[2], json!({"type": "number", "maximum": 1.5}));
        assert!(asked.questions.iter().all(|q| q.options.is_empty()));
        let answers = normalize_text(&asked.questions[..1], " 4 ").unwrap();
        assert_eq!(answers["n"], json!(4));
        assert!(normalize_text(&asked.questions[..1], "12").is_err());
        // Not a type: an ordinary option text.
        let plain = leading_questions(&steps("ask pick? [a] | [b]"))
            .unwrap()
            .unwrap();
        assert_eq!(plain.questions[0].options.len(), 2);
    }

    #[test]
    fn only_leading_asks_are_questions_and_their_bounds_hold() {
        assert_eq!(leading_questions(&steps("build; ask why?")).unwrap(), None);
        assert_eq!(leading_questions(&steps("asking around")).unwrap(), None);
        let five = steps("ask a?; ask b?; ask c?; ask d?; ask e?");
        assert!(leading_questions(&five).unwrap_err().contains("at most 4"));
        let one_option = steps("ask pick? only");
        assert!(leading_questions(&one_option)
            .unwrap_err()
            .contains("none or 2 to 8"));
        let twice = steps("ask x: a?; ask x: b?");
        assert!(leading_questions(&twice)
            .unwrap_err()
            .contains("used twice"));
    }
}
