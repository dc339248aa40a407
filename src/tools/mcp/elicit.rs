//! An MCP server's own question (elicitation) as a question pause, and the
//! answers back as the content the server asked for. No I/O.
//!
//! A form elicitation's `requestedSchema` is a flat object: one question per
//! property, in the schema's order, at most
//! [`MAX_QUESTIONS`]:
//! - `enum` (or `oneOf` of `{const, title}`) with 2 to 8 values: the values
//!   are the options (their titles the labels); more or fewer: a typed
//!   string question whose schema carries the `enum`;
//! - `type: "array"` with `items.enum` (or `items.anyOf`): the same, multi-select;
//! - `boolean`: options `yes` / `no`;
//! - `string`, `number`, `integer`: a typed question with that property's
//!   schema (the keywords a question may carry).
//!
//! The property's `title` is the header, its `description` (else its title,
//! else its name) the question; `required` binds an answer. What cannot be
//! mapped (a nested object, more than 4 properties) is declined, and the
//! reason is shown on the stream.

use serde_json::{Map, Value};

use crate::protocol::question::{
    check_questions, Question, QuestionOption, MAX_DESCRIPTION_CHARS, MAX_HEADER_CHARS,
    MAX_ID_CHARS, MAX_LABEL_CHARS, MAX_OPTIONS, MAX_QUESTIONS, MAX_QUESTION_CHARS, SCHEMA_KEYWORDS,
};

/// The questions of one elicitation, and how to turn answers back into the
/// server's content.
#[derive(Debug, Clone, PartialEq)]
pub struct Mapped {
    pub questions: Vec<Question>,
    /// Per question (same order): the property it asks for and how its
    /// answer becomes a value.
    fields: Vec<Field>,
}

#[derive(Debug, Clone, PartialEq)]
struct Field {
    property: String,
    kind: FieldKind,
}

#[derive(Debug, Clone, PartialEq)]
enum FieldKind {
    /// Options: the enum value of each option, in option order.
    Choice { values: Vec<Value>, multi: bool },
    /// Yes / no.
    Boolean,
    /// A typed value, taken as normalized.
    Typed,
}

/// The questions of `schema` (a `requestedSchema`), in the properties'
/// `order` (names not in `order` follow, by name), or why it cannot be asked.
pub fn questions(schema: &Value, order: &[String]) -> Result<Mapped, String> {
    let properties = schema
        .get("properties")
        .and_then(Value::as_object)
        .ok_or("the requested schema has no properties")?;
    if properties.is_empty() {
        return Err("the requested schema has no properties".to_owned());
    }
    if properties.len() > MAX_QUESTIONS {
        return Err(format!(
            "the requested schema has {} properties; at most {MAX_QUESTIONS} can be asked at once",
            properties.len()
        ));
    }
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut questions = Vec::new();
    let mut fields = Vec::new();
    let mut names: Vec<&String> = order
        .iter()
        .filter(|n| properties.contains_key(*n))
        .collect();
    names.extend(properties.keys().filter(|n| !order.contains(n)));
    for (position, name) in names.into_iter().enumerate() {
        let property = &properties[name];
        let property = property
            .as_object()
            .ok_or_else(|| format!("property `{name}` is not a schema"))?;
        let id = if valid_id(name) {
            name.clone()
        } else {
            format!("q{}", position + 1)
        };
        let title = text(property, "title");
        let header: String = title
            .unwrap_or(name)
            .chars()
            .take(MAX_HEADER_CHARS)
            .collect();
        // Cut to the question bounds rather than refused: a long
        // description is still a question worth asking.
        let question = text(property, "description")
            .or(title)
            .map_or_else(|| format!("A value for `{name}`?"), str::to_owned)
            .chars()
            .take(MAX_QUESTION_CHARS)
            .collect();
        let mut asked = Question {
            id,
            header,
            question,
            options: Vec::new(),
            multi_select: false,
            allow_other: false,
            required: required.contains(&name.as_str()),
            schema: None,
        };
        let kind = match property.get("type").and_then(Value::as_str) {
            Some("boolean") => {
                asked.options = vec![option("yes", "yes"), option("no", "no")];
                FieldKind::Boolean
            }
            Some("array") => {
                let items = property
                    .get("items")
                    .and_then(Value::as_object)
                    .ok_or_else(|| format!("property `{name}`: an array without `items`"))?;
                let choices = choices(items).ok_or_else(|| {
                    format!("property `{name}`: an array of anything but choices")
                })?;
                if choices.len() < 2 || choices.len() > MAX_OPTIONS {
                    return Err(format!(
                        "property `{name}`: a multi-select of {} values (2 to {MAX_OPTIONS} can be offered)",
                        choices.len()
                    ));
                }
                asked.multi_select = true;
                let values = offer(&mut asked, choices);
                FieldKind::Choice {
                    values,
                    multi: true,
                }
            }
            Some("string" | "number" | "integer") | None => match choices(property) {
                Some(choices) if (2..=MAX_OPTIONS).contains(&choices.len()) => {
                    let values = offer(&mut asked, choices);
                    FieldKind::Choice {
                        values,
                        multi: false,
                    }
                }
                _ => {
                    let mut typed: Map<String, Value> = property
                        .iter()
                        .filter(|(k, _)| SCHEMA_KEYWORDS.contains(&k.as_str()))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    if let Some(Value::Array(values)) = property.get("oneOf") {
                        let consts: Vec<Value> = values
                            .iter()
                            .filter_map(|v| v.get("const").cloned())
                            .collect();
                        typed.insert("enum".to_owned(), Value::Array(consts));
                    }
                    typed
                        .entry("type".to_owned())
                        .or_insert_with(|| Value::from("string"));
                    asked.schema = Some(Value::Object(typed));
                    FieldKind::Typed
                }
            },
            Some(other) => {
                return Err(format!(
                    "property `{name}` is of type {other}; only flat string, number, integer, \
                     boolean and choice properties can be asked"
                ))
            }
        };
        questions.push(asked);
        fields.push(Field {
            property: name.clone(),
            kind,
        });
    }
    check_questions(&questions).map_err(|err| err.to_string())?;
    Ok(Mapped { questions, fields })
}

impl Mapped {
    /// The content of an `accept`: `answers` (normalized, by question id)
    /// as the server's property names and values.
    pub fn content(&self, answers: &Map<String, Value>) -> Value {
        let mut content = Map::new();
        for (question, field) in self.questions.iter().zip(&self.fields) {
            let Some(answer) = answers.get(&question.id) else {
                continue;
            };
            let value = match &field.kind {
                FieldKind::Typed => answer.clone(),
                FieldKind::Boolean => Value::Bool(answer.as_str() == Some("yes")),
                FieldKind::Choice { values, multi } => {
                    let value_of = |label: &Value| {
                        question
                            .options
                            .iter()
                            .position(|o| Some(o.label.as_str()) == label.as_str())
                            .and_then(|at| values.get(at).cloned())
                    };
                    if *multi {
                        let chosen = answer.as_array().cloned().unwrap_or_default();
                        Value::Array(chosen.iter().filter_map(value_of).collect())
                    } else {
                        match value_of(answer) {
                            Some(value) => value,
                            None => continue,
                        }
                    }
                }
            };
            content.insert(field.property.clone(), value);
        }
        Value::Object(content)
    }
}

/// A schema's choices: `enum` (with `enumNames` as labels), or `oneOf` /
/// `anyOf` of `{const, title}`; `(value, label)` pairs.
fn choices(schema: &Map<String, Value>) -> Option<Vec<(Value, String)>> {
    if let Some(Value::Array(values)) = schema.get("enum") {
        let names = schema.get("enumNames").and_then(Value::as_array);
        return Some(
            values
                .iter()
                .enumerate()
                .map(|(at, value)| {
                    let label = names
                        .and_then(|n| n.get(at))
                        .and_then(Value::as_str)
                        .map_or_else(|| plain(value), str::to_owned);
                    (value.clone(), label)
                })
                .collect(),
        );
    }
    let listed = schema
        .get("oneOf")
        .or_else(|| schema.get("anyOf"))
        .and_then(Value::as_array)?;
    listed
        .iter()
        .map(|entry| {
            let value = entry.get("const")?.clone();
            let label = entry
                .get("title")
                .and_then(Value::as_str)
                .map_or_else(|| plain(&value), str::to_owned);
            Some((value, label))
        })
        .collect()
}

/// Puts `choices` on `question` as its options; their values, in order.
///
/// An answer names an option by its id or its label, in any case, and is
/// carried back by its label: so every option gets an id and a label that
/// no other option of the question has in any case, even where the server
/// gave two the same title, or titles that agree in their first
/// [`MAX_LABEL_CHARS`]. Such a label gets its option's number (` #2`), and
/// the value it stands for as its description.
fn offer(question: &mut Question, choices: Vec<(Value, String)>) -> Vec<Value> {
    let mut values = Vec::new();
    for (at, (value, label)) in choices.into_iter().enumerate() {
        let text = plain(&value);
        let mut id = if valid_id(&text) {
            text.clone()
        } else {
            format!("o{}", at + 1)
        };
        let mut n = at + 1;
        while question
            .options
            .iter()
            .any(|o| o.id.eq_ignore_ascii_case(&id))
        {
            n += MAX_OPTIONS;
            id = format!("o{n}");
        }
        let mut shown: String = label.chars().take(MAX_LABEL_CHARS).collect();
        let mut description = String::new();
        let mut n = at + 1;
        while question
            .options
            .iter()
            .any(|o| o.label.trim().to_lowercase() == shown.trim().to_lowercase())
        {
            let mark = format!(" #{n}");
            let room = MAX_LABEL_CHARS - mark.chars().count();
            shown = label.chars().take(room).collect::<String>() + &mark;
            description = text.chars().take(MAX_DESCRIPTION_CHARS).collect();
            n += MAX_OPTIONS;
        }
        question.options.push(QuestionOption {
            id,
            label: shown,
            description,
        });
        values.push(value);
    }
    question.allow_other = false;
    values
}

fn option(id: &str, label: &str) -> QuestionOption {
    QuestionOption {
        id: id.to_owned(),
        label: label.to_owned(),
        description: String::new(),
    }
}

/// A value as the text a person reads: a string without its quotes.
fn plain(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

fn text<'a>(object: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    object
        .get(key)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

fn valid_id(id: &str) -> bool {
    crate::protocol::is_plain_name(id, MAX_ID_CHARS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_kind_of_property_becomes_a_question_and_answers_go_back_as_content() {
        let schema = json!({
            "type": "object",
            "properties": {
                "region": {"type": "string", "title": "Region", "enum": ["eu-west", "us east"],
                           "enumNames": ["Frankfurt", "Virginia"]},
                "confirm": {"type": "boolean", "description": "Really?"},
                "count": {"type": "integer", "minimum": 1, "maximum": 5},
                "tags": {"type": "array", "items": {"anyOf": [{"const": "a", "title": "A"},
                                                               {"const": "b", "title": "B"}]}}
            },
            "required": ["region", "count"]
        });
        let order = ["region", "confirm", "count", "tags"].map(str::to_owned);
        let mapped = questions(&schema, &order).unwrap();
        let [region, confirm, count, tags] = &mapped.questions[..] else {
            panic!("{mapped:?}");
        };
        assert_eq!(region.header, "Region");
        assert!(region.required && !confirm.required && count.required);
        assert_eq!(region.options[1].id, "o2");
        assert_eq!(region.options[1].label, "Virginia");
        assert_eq!(confirm.question, "Really?");
        assert_eq!(confirm.options.len(), 2);
        assert_eq!(count.schema.as_ref().unwrap()["maximum"], 5);
        assert!(tags.multi_select);

        let answers = json!({"region": "Virginia", "confirm": "no", "count": 3, "tags": ["B"]});
        let content = mapped.content(answers.as_object().unwrap());
        assert_eq!(
            content,
            json!({"region": "us east", "confirm": false, "count": 3, "tags": ["b"]})
        );
        // An optional question left unanswered is left out.
        let content = mapped.content(json!({"region": "Frankfurt"}).as_object().unwrap());
        assert_eq!(content, json!({"region": "eu-west"}));
    }

    #[test]
    fn long_texts_are_cut_to_the_question_bounds() {
        let long = "x".repeat(5000);
        let schema = json!({"properties": {"a": {"type": "string", "description": long,
                                                  "enum": [long, "b"]}}});
        let mapped = questions(&schema, &[]).unwrap();
        assert_eq!(
            mapped.questions[0].question.chars().count(),
            MAX_QUESTION_CHARS
        );
        assert_eq!(
            mapped.questions[0].options[0].label.chars().count(),
            MAX_LABEL_CHARS
        );
        // The answer still maps back to the full value.
        let label = mapped.questions[0].options[0].label.clone();
        let content = mapped.content(json!({"a": label}).as_object().unwrap());
        assert_eq!(content["a"].as_str().unwrap().len(), 5000);
    }

    #[test]
    fn same_titled_or_same_cut_choices_stay_distinct_through_every_answer_form() {
        let long = "y".repeat(300);
        let schema = json!({"properties": {
            "file": {"type": "string", "oneOf": [
                {"const": "/srv/a/report.pdf", "title": "report.pdf"},
                {"const": "/srv/b/report.pdf", "title": "report.pdf"},
                {"const": "/srv/c/report.pdf", "title": "Report.PDF"}]},
            "case": {"type": "string", "enum": ["Report", "report", "o1"]},
            "cut": {"type": "array", "items": {"enum": [format!("{long}1"), format!("{long}2")]}}
        }});
        let mapped = questions(&schema, &[]).unwrap();
        let by_name = |name: &str| {
            let at = mapped
                .fields
                .iter()
                .position(|f| f.property == name)
                .unwrap();
            &mapped.questions[at]
        };
        let ask = |name: &str, text: &str| {
            let q = by_name(name).clone();
            let answers = crate::protocol::question::normalize_text(&[q], text).unwrap();
            mapped.content(&answers)[name].clone()
        };
        for (at, path) in [
            "/srv/a/report.pdf",
            "/srv/b/report.pdf",
            "/srv/c/report.pdf",
        ]
        .iter()
        .enumerate()
        {
            let option = &by_name("file").options[at];
            assert_eq!(ask("file", &option.id), json!(path), "{option:?}");
            assert_eq!(ask("file", &option.label), json!(path), "{option:?}");
        }
        assert_eq!(by_name("file").options[1].label, "report.pdf #2");
        assert_eq!(by_name("file").options[1].description, "/srv/b/report.pdf");
        for (at, value) in ["Report", "report", "o1"].iter().enumerate() {
            let option = &by_name("case").options[at];
            assert_eq!(ask("case", &option.id), json!(value), "{option:?}");
            assert_eq!(ask("case", &option.label), json!(value), "{option:?}");
        }
        let cut = by_name("cut");
        assert_ne!(cut.options[0].label, cut.options[1].label);
        assert!(cut.options[1].label.chars().count() <= MAX_LABEL_CHARS);
        let q = cut.clone();
        let second = json!({"cut": [cut.options[1].label.clone()]});
        let answers =
            crate::protocol::question::normalize_answers(&[q], second.as_object().unwrap())
                .unwrap();
        assert_eq!(mapped.content(&answers)["cut"], json!([format!("{long}2")]));
    }

    #[test]
    fn what_cannot_be_asked_says_why() {
        let nested = json!({"properties": {"a": {"type": "object"}}});
        assert!(questions(&nested, &[]).unwrap_err().contains("type object"));
        let five = json!({"properties": {"a": {}, "b": {}, "c": {}, "d": {}, "e": {}}});
        assert!(questions(&five, &[]).unwrap_err().contains("at most 4"));
        assert!(questions(&json!({"properties": {}}), &[]).is_err());
        let one_choice = json!({"properties": {"a": {"type": "array", "items": {"enum": ["x"]}}}});
        assert!(questions(&one_choice, &[])
            .unwrap_err()
            .contains("multi-select"));
        // A single-value enum is a typed question that accepts that value.
        let single = questions(
            &json!({"properties": {"a": {"type": "string", "enum": ["x"]}}}),
            &[],
        )
        .unwrap();
        assert_eq!(
            single.questions[0].schema.as_ref().unwrap()["enum"],
            json!(["x"])
        );
    }
}
