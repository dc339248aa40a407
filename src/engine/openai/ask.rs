//! `ask_user`: the model's questions to the user (#16). A call becomes one
//! `input_request`; the answers go back to the model as the tool's result.
//! The model's text is untrusted: a call that does not parse or breaks a
//! bound of a question pause goes back to the model as an error and never
//! reaches the user. Off with `--no-ask-user`.

use serde::Deserialize;
use serde_json::{json, Value};

use super::reply::{ModelReply, ToolCall};
use super::turn::{paused_state, tool_result, Pending, Resumable};
use crate::protocol::question::{check_questions, Question, QuestionOption};
use crate::run::context::RunContext;
use crate::run::outcome::RunError;
use crate::run::plan::{Answers, Questions};

/// The built-in tool's name.
pub const ASK_TOOL: &str = "ask_user";

/// `ask_user`, as the model is offered it.
pub fn ask_tool() -> Value {
    json!({
        "type": "function",
        "function": {
            "name": ASK_TOOL,
            "description": "Ask the user 1 to 4 questions when you need a decision or a missing \
                            detail before going on. Each question may offer 2 to 8 options; the \
                            user may always answer in their own words instead. The result is \
                            the user's answers, or that they chose not to answer.",
            "parameters": {
                "type": "object",
                "properties": {
                    "questions": {
                        "type": "array", "minItems": 1, "maxItems": 4,
                        "items": {
                            "type": "object",
                            "properties": {
                                "question": {"type": "string", "description": "The question, ending with ?"},
                                "header": {"type": "string", "description": "A label of at most 24 characters"},
                                "options": {
                                    "type": "array", "maxItems": 8,
                                    "items": {
                                        "type": "object",
                                        "properties": {
                                            "label": {"type": "string"},
                                            "description": {"type": "string"}
                                        },
                                        "required": ["label"]
                                    }
                                },
                                "multi_select": {"type": "boolean"}
                            },
                            "required": ["question"]
                        }
                    }
                },
                "required": ["questions"]
            }
        }
    })
}

#[derive(Deserialize)]
struct AskArguments {
    questions: Vec<AskQuestion>,
}

#[derive(Deserialize)]
struct AskQuestion {
    question: String,
    #[serde(default)]
    header: String,
    #[serde(default)]
    options: Vec<AskOption>,
    #[serde(default)]
    multi_select: bool,
}

#[derive(Deserialize)]
struct AskOption {
    label: String,
    #[serde(default)]
    description: String,
}

/// The questions of an `ask_user` call, or what to tell the model instead.
/// Ids are `q1`, `q2`, ...; option ids `1`, `2`, ... (what a person types
/// at a terminal); other text is always allowed, every question required.
pub fn parse_questions(call: &ToolCall) -> Result<Vec<Question>, String> {
    let arguments: AskArguments = serde_json::from_str(&call.arguments).map_err(|err| {
        format!("Error: the arguments were not valid: {err}. Call {ASK_TOOL} again.")
    })?;
    let questions: Vec<Question> = arguments
        .questions
        .into_iter()
        .enumerate()
        .map(|(i, q)| Question {
            id: format!("q{}", i + 1),
            header: q.header,
            question: q.question,
            options: q
                .options
                .into_iter()
                .enumerate()
                .map(|(k, o)| QuestionOption {
                    id: (k + 1).to_string(),
                    label: o.label,
                    description: o.description,
                })
                .collect(),
            multi_select: q.multi_select,
            allow_other: true,
            required: true,
            schema: None,
        })
        .collect();
    check_questions(&questions).map_err(|err| {
        format!("Error: these questions cannot be asked: {err}. Call {ASK_TOOL} again within the bounds.")
    })?;
    Ok(questions)
}

/// One answer's `ask_user` call (the first, when there are several):
/// asked, and every call of the answer gets a result (the others are told
/// to wait for the answer). Nothing is carried out here.
pub async fn ask_turn(
    ctx: &mut RunContext,
    messages: &mut Vec<Value>,
    reply: &ModelReply,
    go_on: Resumable,
) -> Result<(), RunError> {
    let calls = &reply.tool_calls;
    let call_ids: Vec<String> = calls.iter().map(|call| call.id.clone()).collect();
    let position = calls
        .iter()
        .position(|call| call.name == ASK_TOOL)
        .unwrap_or(0);
    let mut results: Vec<String> = calls
        .iter()
        .map(|_| {
            format!(
                "Not run: the user is being asked a question ({ASK_TOOL}); call it again \
                 once you have the answer, if it is still needed."
            )
        })
        .collect();
    let questions = match parse_questions(&calls[position]) {
        Ok(questions) => questions,
        Err(why) => {
            results[position] = why;
            push_results(messages, &call_ids, results);
            return Ok(());
        }
    };
    let title = match questions.as_slice() {
        [one] => one.question.clone(),
        many => format!("The assistant asks {} questions", many.len()),
    };
    let pending = Pending::Ask {
        call_ids: call_ids.clone(),
        results: results.clone(),
        position,
        questions: questions.clone(),
    };
    let state = paused_state(ctx, messages, go_on, pending);
    let answers = ctx
        .ask(Questions {
            title,
            questions: questions.clone(),
            state,
        })
        .await;
    asked_answered(messages, &call_ids, results, position, &questions, answers)
}

/// Tells the model what the user answered to its `ask_user` call (at
/// `position` among the answer's calls).
pub fn asked_answered(
    messages: &mut Vec<Value>,
    call_ids: &[String],
    mut results: Vec<String>,
    position: usize,
    questions: &[Question],
    answers: Result<Answers, RunError>,
) -> Result<(), RunError> {
    let outcome = match answers {
        Ok(Answers::Given(given)) => {
            let answered: Vec<Value> = questions
                .iter()
                .map(|q| json!({"question": q.question, "answer": given.get(&q.id)}))
                .collect();
            results[position] = json!({ "answers": answered }).to_string();
            Ok(())
        }
        Ok(Answers::Skipped) => {
            results[position] = "The user chose not to answer. Go on without the answers, or \
                                 say what you cannot do without them."
                .to_owned();
            Ok(())
        }
        Err(RunError::Cancelled(reason)) => {
            results[position] = format!("Not answered ({}).", reason.as_str());
            Err(RunError::Cancelled(reason))
        }
        Err(failed) => return Err(failed),
    };
    push_results(messages, call_ids, results);
    outcome
}

/// One `tool` message per call, in the calls' order.
fn push_results(messages: &mut Vec<Value>, call_ids: &[String], results: Vec<String>) {
    for (id, result) in call_ids.iter().zip(results) {
        messages.push(tool_result(id, &result));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(arguments: Value) -> ToolCall {
        ToolCall {
            id: "c".into(),
            server_id: true,
            name: ASK_TOOL.into(),
            arguments: arguments.to_string(),
        }
    }

    #[test]
    fn a_call_becomes_questions_with_numbered_options_and_other_text() {
        let questions = parse_questions(&call(json!({"questions": [
            {"question": "Which region?", "header": "Region",
             "options": [{"label": "eu-west", "description": "Frankfurt"}, {"label": "us-east"}]},
            {"question": "Which checks?", "multi_select": true,
             "options": [{"label": "lint"}, {"label": "test"}]}
        ]})))
        .unwrap();

        assert_eq!(questions[0].id, "q1");
        assert_eq!(questions[1].id, "q2");
        assert_eq!(questions[0].options[1].id, "2");
        assert_eq!(questions[0].options[0].description, "Frankfurt");
        assert!(questions.iter().all(|q| q.allow_other && q.required));
        assert!(questions[1].multi_select);
    }

    #[test]
    fn a_call_that_breaks_a_bound_goes_back_to_the_model() {
        let five = json!({"questions": [{"question": "a?"}, {"question": "b?"}, {"question": "c?"},
                                        {"question": "d?"}, {"question": "e?"}]});
        let one_option = json!({"questions": [{"question": "a?", "options": [{"label": "x"}]}]});
        let long_header = json!({"questions": [{"question": "a?", "header": "h".repeat(25)}]});
        for bad in [
            five,
            one_option,
            long_header,
            json!({"questions": "no"}),
            json!([]),
        ] {
            let why = parse_questions(&call(bad.clone())).unwrap_err();
            assert!(why.starts_with("Error:"), "{bad}: {why}");
        }
    }
}
