//! Questions: the second kind of pause (#16), as data. What a question pause
//! asks ([`Question`]), the bounds it is checked against
//! ([`check_questions`]), and how a reply's answers are matched and
//! normalized ([`normalize_text`], [`normalize_answers`]). No I/O.
//!
//! An answer is normalized to what the asker works with: the chosen option's
//! label (single select), the labels in option order (multi-select), the
//! other text, or the typed value its `schema` accepts.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Questions in one pause.
pub const MAX_QUESTIONS: usize = 4;
/// Options of a question that has options (a question has none, or 2 to 8).
pub const MAX_OPTIONS: usize = 8;
/// Characters of a question's `header`.
pub const MAX_HEADER_CHARS: usize = 24;
/// Characters of an `id` (`[A-Za-z0-9_-]`).
pub const MAX_ID_CHARS: usize = 64;
/// Characters of a question's text, and of a pause's title.
pub const MAX_QUESTION_CHARS: usize = 1_000;
/// Characters of an option's label.
pub const MAX_LABEL_CHARS: usize = 200;
/// Characters of an option's description.
pub const MAX_DESCRIPTION_CHARS: usize = 1_000;
/// Bytes of a question's `schema`, as JSON.
pub const MAX_SCHEMA_BYTES: usize = 4 * 1024;
/// Bytes of all the questions of one pause, as JSON (a plan's bound is
/// 128 KiB; questions are smaller by nature).
pub const MAX_QUESTIONS_BYTES: usize = 32 * 1024;
/// Bytes of one answer (an other text, a typed value), and of all the
/// answers of one reply, as JSON.
pub const MAX_ANSWER_BYTES: usize = 4 * 1024;

/// One option of a question.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuestionOption {
    pub id: String,
    pub label: String,
    #[serde(default)]
    pub description: String,
}

/// One question of a question pause.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Question {
    pub id: String,
    #[serde(default)]
    pub header: String,
    pub question: String,
    #[serde(default)]
    pub options: Vec<QuestionOption>,
    #[serde(default)]
    pub multi_select: bool,
    #[serde(default)]
    pub allow_other: bool,
    #[serde(default)]
    pub required: bool,
    /// A JSON Schema for one value: the answer is parsed and checked by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
}

/// Why questions cannot be asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct QuestionsError(pub String);

/// Why an answer does not fit: the question, and what it expects.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidAnswer(pub String);

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.chars().count() <= MAX_ID_CHARS
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// The JSON Schema keywords a question's `schema` may use: one value of a
/// primitive type, nothing that refers elsewhere.
pub const SCHEMA_KEYWORDS: [&str; 12] = [
    "type",
    "title",
    "description",
    "maxLength",
    "minLength",
    "pattern",
    "format",
    "enum",
    "minimum",
    "maximum",
    "default",
    "examples",
];

/// Checks `schema` is one a question may carry (see [`Question::schema`]).
fn check_schema(id: &str, schema: &Value) -> Result<(), QuestionsError> {
    let bad = |why: &str| QuestionsError(format!("question `{id}`: its schema {why}"));
    let Some(object) = schema.as_object() else {
        return Err(bad("is not an object"));
    };
    if json_bytes(schema) > MAX_SCHEMA_BYTES {
        return Err(bad(&format!("is over {MAX_SCHEMA_BYTES} bytes")));
    }
    if let Some(key) = object
        .keys()
        .find(|k| !SCHEMA_KEYWORDS.contains(&k.as_str()))
    {
        return Err(bad(&format!(
            "uses `{key}`, which a question's schema may not"
        )));
    }
    match object.get("type").and_then(Value::as_str) {
        Some("string" | "number" | "integer" | "boolean") => {}
        _ => return Err(bad("needs a `type`: string, number, integer or boolean")),
    }
    compiled(schema).map(drop).map_err(|why| bad(&why))
}

fn compiled(schema: &Value) -> Result<jsonschema::Validator, String> {
    jsonschema::options()
        .should_validate_formats(true)
        .build(schema)
        .map_err(|err| format!("is not valid: {err}"))
}

fn json_bytes(value: &Value) -> usize {
    serde_json::to_vec(value).map_or(usize::MAX, |v| v.len())
}

/// Checks questions against every bound above: 1 to 4 questions, unique
/// ids, 0 or 2 to 8 options with unique ids, lengths, schemas, total size.
pub fn check_questions(questions: &[Question]) -> Result<(), QuestionsError> {
    let err = |why: String| Err(QuestionsError(why));
    if questions.is_empty() || questions.len() > MAX_QUESTIONS {
        return err(format!(
            "a pause asks 1 to {MAX_QUESTIONS} questions, not {}",
            questions.len()
        ));
    }
    let mut ids = HashSet::new();
    for q in questions {
        if !valid_id(&q.id) {
            return err(format!(
                "question id `{}` is not 1-{MAX_ID_CHARS} of A-Z a-z 0-9 _ -",
                q.id
            ));
        }
        if !ids.insert(q.id.as_str()) {
            return err(format!("question id `{}` is used twice", q.id));
        }
        if q.header.chars().count() > MAX_HEADER_CHARS {
            return err(format!(
                "question `{}`: its header is over {MAX_HEADER_CHARS} characters",
                q.id
            ));
        }
        let text = q.question.trim();
        if text.is_empty() || text.chars().count() > MAX_QUESTION_CHARS {
            return err(format!(
                "question `{}`: its text must be 1-{MAX_QUESTION_CHARS} characters",
                q.id
            ));
        }
        if q.options.len() == 1 || q.options.len() > MAX_OPTIONS {
            return err(format!(
                "question `{}` has {} options: a question has none or 2 to {MAX_OPTIONS}",
                q.id,
                q.options.len()
            ));
        }
        let mut option_ids = HashSet::new();
        for option in &q.options {
            if !valid_id(&option.id) || !option_ids.insert(option.id.as_str()) {
                return err(format!(
                    "question `{}`: option id `{}` is not a valid unique id",
                    q.id, option.id
                ));
            }
            let label = option.label.trim();
            if label.is_empty() || label.chars().count() > MAX_LABEL_CHARS {
                return err(format!(
                    "question `{}`: option `{}` needs a label of 1-{MAX_LABEL_CHARS} characters",
                    q.id, option.id
                ));
            }
            if option.description.chars().count() > MAX_DESCRIPTION_CHARS {
                return err(format!("question `{}`: option `{}`'s description is over {MAX_DESCRIPTION_CHARS} characters", q.id, option.id));
            }
        }
        if q.multi_select && q.options.is_empty() {
            return err(format!("question `{}`: multi_select needs options", q.id));
        }
        if let Some(schema) = &q.schema {
            if !q.options.is_empty() {
                return err(format!(
                    "question `{}`: a typed question has no options",
                    q.id
                ));
            }
            check_schema(&q.id, schema)?;
        }
    }
    let total = serde_json::to_vec(questions).map_or(usize::MAX, |v| v.len());
    if total > MAX_QUESTIONS_BYTES {
        return err(format!(
            "the questions are {total} bytes; at most {MAX_QUESTIONS_BYTES}"
        ));
    }
    Ok(())
}

/// A typed question's schema as a person reads it: "an integer from 1 to
/// 5", "a text of at most 20 characters, like ^[a-z]+$", "one of: a, b".
fn in_words(schema: &Value) -> String {
    let number = |key: &str| {
        schema
            .get(key)
            .filter(|v| v.is_number())
            .map(Value::to_string)
    };
    let kind = schema.get("type").and_then(Value::as_str).unwrap_or("");
    if let Some(Value::Array(values)) = schema.get("enum") {
        let values: Vec<String> = values
            .iter()
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
            .collect();
        return format!("one of: {}", values.join(", "));
    }
    let mut words = match kind {
        "integer" => "an integer".to_owned(),
        "number" => "a number".to_owned(),
        "boolean" => return "yes or no (true or false)".to_owned(),
        "string" => "a text".to_owned(),
        _ => "a value".to_owned(),
    };
    match (number("minimum"), number("maximum")) {
        (Some(min), Some(max)) => words += &format!(" from {min} to {max}"),
        (Some(min), None) => words += &format!(" of at least {min}"),
        (None, Some(max)) => words += &format!(" of at most {max}"),
        (None, None) => {}
    }
    if let Some(above) = number("exclusiveMinimum") {
        words += &format!(" above {above}");
    }
    if let Some(below) = number("exclusiveMaximum") {
        words += &format!(" below {below}");
    }
    match (number("minLength"), number("maxLength")) {
        (Some(min), Some(max)) => words += &format!(" of {min} to {max} characters"),
        (Some(min), None) => words += &format!(" of at least {min} characters"),
        (None, Some(max)) => words += &format!(" of at most {max} characters"),
        (None, None) => {}
    }
    if let Some(format) = schema.get("format").and_then(Value::as_str) {
        words += &format!(" in the {format} format");
    }
    if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
        words += &format!(", matching {pattern}");
    }
    words
}

/// What `q` accepts, for an error's text.
fn expected(q: &Question) -> String {
    if let Some(schema) = &q.schema {
        return in_words(schema);
    }
    if q.options.is_empty() {
        return "a text".to_owned();
    }
    let options: Vec<String> = q
        .options
        .iter()
        .map(|o| format!("{} ({})", o.id, o.label))
        .collect();
    let how = if q.multi_select {
        "one or more of"
    } else {
        "one of"
    };
    let other = if q.allow_other {
        ", or a text of your own"
    } else {
        ""
    };
    format!("{how} {}{other}", options.join(", "))
}

/// The option `text` names: its id, else its label (trimmed, any case).
fn option_named<'q>(q: &'q Question, text: &str) -> Option<&'q QuestionOption> {
    let text = text.trim();
    q.options
        .iter()
        .find(|o| o.id.eq_ignore_ascii_case(text))
        .or_else(|| {
            q.options
                .iter()
                .find(|o| o.label.trim().to_lowercase() == text.to_lowercase())
        })
}

/// One answer to `q`, given as a text (the `answer:<text>` form, or a string
/// in `answers`): normalized, or why it does not fit.
fn answer_from_text(q: &Question, text: &str) -> Result<Value, InvalidAnswer> {
    let wrong = || InvalidAnswer(format!("question `{}` expects {}", q.id, expected(q)));
    if text.len() > MAX_ANSWER_BYTES {
        return Err(InvalidAnswer(format!(
            "the answer to question `{}` is over {MAX_ANSWER_BYTES} bytes",
            q.id
        )));
    }
    if let Some(schema) = &q.schema {
        let value = typed(schema, text.trim()).ok_or_else(wrong)?;
        return checked(q, schema, value);
    }
    if q.options.is_empty() {
        let text = text.trim();
        return if text.is_empty() {
            Err(wrong())
        } else {
            Ok(Value::from(text))
        };
    }
    if q.multi_select {
        let parts: Vec<&str> = text
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .collect();
        let chosen: Option<Vec<&QuestionOption>> =
            parts.iter().map(|p| option_named(q, p)).collect();
        if let Some(chosen) = chosen.filter(|c| !c.is_empty()) {
            return Ok(labels_in_order(q, &chosen));
        }
    } else if let Some(option) = option_named(q, text) {
        return Ok(Value::from(option.label.as_str()));
    }
    let text = text.trim();
    if q.allow_other && !text.is_empty() {
        return Ok(Value::from(text));
    }
    Err(wrong())
}

/// The labels of `chosen`, in the question's option order, each once.
fn labels_in_order(q: &Question, chosen: &[&QuestionOption]) -> Value {
    Value::Array(
        q.options
            .iter()
            .filter(|o| chosen.iter().any(|c| c.id == o.id))
            .map(|o| Value::from(o.label.as_str()))
            .collect(),
    )
}

/// `text` as the value `schema`'s type names (`"3"` for an integer is 3).
fn typed(schema: &Value, text: &str) -> Option<Value> {
    match schema.get("type").and_then(Value::as_str)? {
        "string" => Some(Value::from(text)),
        "integer" => text.parse::<i64>().ok().map(Value::from),
        "number" => text
            .parse::<f64>()
            .ok()
            .filter(|n| n.is_finite())
            .and_then(|n| serde_json::Number::from_f64(n).map(Value::Number)),
        "boolean" => match text.to_lowercase().as_str() {
            "true" | "yes" | "y" => Some(Value::Bool(true)),
            "false" | "no" | "n" => Some(Value::Bool(false)),
            _ => None,
        },
        _ => None,
    }
}

/// `value` if `schema` accepts it.
fn checked(q: &Question, schema: &Value, value: Value) -> Result<Value, InvalidAnswer> {
    let validator = compiled(schema).map_err(InvalidAnswer)?;
    match validator.validate(&value) {
        Ok(()) => Ok(value),
        Err(why) => Err(InvalidAnswer(format!(
            "the answer to question `{}` does not fit: {why}; it expects {}",
            q.id,
            expected(q)
        ))),
    }
}

/// One answer to `q` as a JSON value of `answers`: a string (option id,
/// label or other text), a list of them (multi-select), or a number or
/// boolean for a typed question.
fn answer_from_value(q: &Question, value: &Value) -> Result<Value, InvalidAnswer> {
    let wrong = || InvalidAnswer(format!("question `{}` expects {}", q.id, expected(q)));
    match value {
        Value::String(text) => answer_from_text(q, text),
        Value::Array(items) if q.multi_select => {
            let mut chosen = Vec::with_capacity(items.len());
            for item in items {
                let option = item
                    .as_str()
                    .and_then(|t| option_named(q, t))
                    .ok_or_else(wrong)?;
                chosen.push(option);
            }
            if chosen.is_empty() {
                return Err(wrong());
            }
            Ok(labels_in_order(q, &chosen))
        }
        Value::Number(_) | Value::Bool(_) => match &q.schema {
            Some(schema) => checked(q, schema, value.clone()),
            None => Err(wrong()),
        },
        _ => Err(wrong()),
    }
}

/// `CONFIRM_ACTION:answer:<text>`: the one question of a pause answered by
/// a text. A pause with several questions takes `answers` instead.
pub fn normalize_text(
    questions: &[Question],
    text: &str,
) -> Result<Map<String, Value>, InvalidAnswer> {
    let [q] = questions else {
        let ids: Vec<&str> = questions.iter().map(|q| q.id.as_str()).collect();
        return Err(InvalidAnswer(format!(
            "this pause asks {} questions: answer them with \"answers\": {{{}}}",
            questions.len(),
            ids.iter()
                .map(|id| format!("\"{id}\": ..."))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    };
    let mut answers = Map::new();
    answers.insert(q.id.clone(), answer_from_text(q, text)?);
    Ok(answers)
}

/// `CONFIRM_ACTION:answer` with `"answers": {"<id>": value}`: every
/// required question answered, no unknown id, each value fitting its question.
pub fn normalize_answers(
    questions: &[Question],
    given: &Map<String, Value>,
) -> Result<Map<String, Value>, InvalidAnswer> {
    if json_bytes(&Value::Object(given.clone())) > MAX_ANSWER_BYTES * MAX_QUESTIONS {
        return Err(InvalidAnswer(format!(
            "the answers are over {} bytes",
            MAX_ANSWER_BYTES * MAX_QUESTIONS
        )));
    }
    if let Some(unknown) = given
        .keys()
        .find(|id| !questions.iter().any(|q| &q.id == *id))
    {
        let ids: Vec<&str> = questions.iter().map(|q| q.id.as_str()).collect();
        return Err(InvalidAnswer(format!(
            "there is no question `{unknown}`; the questions are {}",
            ids.join(", ")
        )));
    }
    let mut answers = Map::new();
    for q in questions {
        match given.get(&q.id) {
            Some(Value::Null) | None if q.required => {
                return Err(InvalidAnswer(format!(
                    "question `{}` is required: it expects {}",
                    q.id,
                    expected(q)
                )));
            }
            Some(Value::Null) | None => {}
            Some(value) => {
                answers.insert(q.id.clone(), answer_from_value(q, value)?);
            }
        }
    }
    Ok(answers)
}

#[cfg(test)]
mod tests;
