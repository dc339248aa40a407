//! A planner message's steps: how a message splits into them, and what
//! each one calls (a declared tool and its arguments, or nothing: a step
//! to pretend), a misspelt tool refused. Pure functions.

use serde_json::{json, Value};

use crate::protocol::ErrorType;
use crate::run::outcome::RunError;
use crate::tools::{Executor, Tools};

/// Splits a task message into steps: on newlines, `;` and ` then `, with list
/// markers (`1.`, `2)`, `-`, `*`, `+`) stripped and empty steps dropped. A
/// message with no step left is one step: the message itself.
pub fn plan_steps(message: &str) -> Vec<String> {
    let steps: Vec<String> = message
        .split(['\n', ';'])
        .flat_map(split_on_then)
        .map(strip_list_marker)
        .filter(|step| !step.is_empty())
        .map(str::to_owned)
        .collect();
    if steps.is_empty() {
        vec![message.trim().to_owned()]
    } else {
        steps
    }
}

/// Splits on the word `then` between spaces, in any letter case.
fn split_on_then(line: &str) -> Vec<&str> {
    let lower = line.to_ascii_lowercase();
    let mut parts = Vec::new();
    let mut start = 0;
    // ASCII lower-casing keeps byte offsets, so indexes into `lower` fit `line`.
    while let Some(found) = lower[start..].find(" then ") {
        parts.push(&line[start..start + found]);
        start += found + " then ".len();
    }
    parts.push(&line[start..]);
    parts
}

fn strip_list_marker(step: &str) -> &str {
    let step = step.trim();
    let digits = step.bytes().take_while(u8::is_ascii_digit).count();
    let rest = if digits > 0 && step[digits..].starts_with(['.', ')']) {
        &step[digits + 1..]
    } else if step.starts_with(['-', '*', '+']) {
        &step[1..]
    } else {
        return step;
    };
    // Only a marker when followed by a space or nothing ("-rf" is not a marker).
    if rest.is_empty() || rest.starts_with(char::is_whitespace) {
        rest.trim()
    } else {
        step
    }
}

pub(super) fn has_word(text: &str, matches: impl Fn(&str) -> bool) -> bool {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .any(|w| matches(&w.to_lowercase()))
}

/// The tool a step calls and its arguments: `<tool> {json object}` for a
/// declared tool takes the object as its arguments (checked against its
/// schema when planned); a tool of an MCP server with nothing after its
/// name gets `{}`; else the step's first word and `{"step": <step>}`.
pub(super) fn call_of(step: &str, tools: &Tools) -> (String, Value) {
    let (first, rest) = step
        .trim()
        .split_once(char::is_whitespace)
        .unwrap_or((step.trim(), ""));
    // The first word names a tool in any letter case (`Note`, `NOTE`).
    if let Some(tool) = tools
        .get(first)
        .or_else(|| tools.get(&first.to_lowercase()))
    {
        let rest = rest.trim();
        let args = if rest.is_empty() && matches!(tool.executor, Executor::Mcp(_)) {
            Some(json!({}))
        } else if rest.starts_with('{') {
            serde_json::from_str::<Value>(rest)
                .ok()
                .filter(Value::is_object)
        } else {
            None
        };
        if let Some(args) = args {
            return (tool.name.clone(), args);
        }
    }
    (tool_for(step), json!({ "step": step }))
}

/// The step that calls `name` with `args`, as [`call_of`] reads it back: a
/// `{"step": text}` call as its text, any other as `name {json}`.
pub(super) fn step_of(name: &str, args: &Value, tools: &Tools) -> String {
    if let Some(text) = args.get("step").and_then(Value::as_str) {
        let read = call_of(text, tools);
        if read.0 == name && &read.1 == args {
            return text.to_owned();
        }
    }
    format!("{name} {args}")
}

/// With a tools file, a step whose first word is no tool but looks like
/// one (it has `__`, as MCP tools' names do, or it is a small edit away
/// from a tool's name) is a misspelt call, not a step to pretend: refused
/// before anything is asked, with the closest name.
pub(super) fn refuse_lookalike(index: usize, step: &str, tools: &Tools) -> Result<(), RunError> {
    let first = step.split_whitespace().next().unwrap_or("");
    let lower = first.to_lowercase();
    if tools.is_empty()
        || first.is_empty()
        || tools.get(&lower).is_some()
        || tools.get(first).is_some()
    {
        return Ok(());
    }
    let closest = tools
        .iter()
        .map(|tool| (strsim::levenshtein(first, &tool.name), tool.name.as_str()))
        .min();
    let Some((distance, name)) = closest else {
        return Ok(());
    };
    // One edit per five characters, at least one: `deplyo` for `deploy`,
    // not `test` for `text`-like plain words of four letters or fewer.
    let near = first.chars().count() > 4 && distance <= (name.chars().count() / 5).max(1);
    if !first.contains("__") && !near {
        return Ok(());
    }
    Err(RunError::Failed {
        error_type: ErrorType::UnknownTool,
        message: format!(
            "step {index} (`{step}`) calls `{first}`, which is not a tool; did you mean \
             `{name}`? (GET /api/v1/tools lists them)"
        ),
    })
}

pub(super) fn tool_for(step: &str) -> String {
    step.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-'))
        .map(|w| w.trim_matches('-'))
        .find(|w| !w.is_empty())
        .map(str::to_lowercase)
        .unwrap_or_else(|| "task".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_split_on_newlines_semicolons_and_then() {
        assert_eq!(
            plan_steps("create a file; write notes\nthen nothing Then email it"),
            ["create a file", "write notes", "then nothing", "email it"]
        );
    }

    #[test]
    fn list_markers_are_stripped() {
        assert_eq!(
            plan_steps("1. build\n2) test\n- ship\n* tell\n+ rest\n-rf stays"),
            ["build", "test", "ship", "tell", "rest", "-rf stays"]
        );
    }

    #[test]
    fn empty_steps_are_dropped_and_a_planless_message_is_one_step() {
        assert_eq!(plan_steps("a;;\n\n b ;"), ["a", "b"]);
        assert_eq!(plan_steps(";;;"), [";;;"]);
    }

    #[test]
    fn only_the_word_fail_fails() {
        assert!(has_word("this will FAIL now", |w| w == "fail"));
        assert!(!has_word("failover test", |w| w == "fail"));
    }
}
