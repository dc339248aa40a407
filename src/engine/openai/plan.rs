//! Without declared tools the model acts only through `propose_plan`: its
//! plan is the confirmation, and the tool's result tells the model what the
//! user decided (confirm: carry it out in prose; modify: propose again).

use serde::Deserialize;
use serde_json::{json, Value};

use super::reply::{ModelReply, ToolCall};
use super::turn::{modify_text, paused_state, tool_result, Pending, Resumable};
use crate::protocol::{meta, ChunkType, Decisions, RiskLevel, TaskSpec, Verdict, MAX_PLAN_TASKS};
use crate::run::context::RunContext;
use crate::run::outcome::RunError;
use crate::run::plan::{Approval, Plan};

/// The only tool the model has.
pub const PLAN_TOOL: &str = "propose_plan";

/// One answer's `propose_plan` call(s): the first plan is put to the user;
/// the others are told to wait. Returns whether the plan was confirmed.
pub async fn plan_turn(
    ctx: &mut RunContext,
    messages: &mut Vec<Value>,
    reply: &ModelReply,
    go_on: Resumable,
) -> Result<bool, RunError> {
    let call = &reply.tool_calls[0];
    // Every call needs a result; only the first plan is put to the user.
    for other in &reply.tool_calls[1..] {
        messages.push(tool_result(
            &other.id,
            "Ignored: propose one plan at a time.",
        ));
    }
    let mut plan = match parse_plan(call) {
        Ok(plan) => plan,
        Err(why) => {
            messages.push(tool_result(&call.id, &why));
            return Ok(false);
        }
    };
    let total = plan.tasks.len();
    let pending = Pending::Plan {
        call_id: call.id.clone(),
        total,
    };
    plan.state = paused_state(ctx, messages, go_on, pending);
    let answer = ctx.confirm(plan).await;
    plan_answered(ctx, messages, &call.id, total, answer).await
}

/// Tells the model what the user answered to its plan (`call_id`).
pub async fn plan_answered(
    ctx: &mut RunContext,
    messages: &mut Vec<Value>,
    call_id: &str,
    total: usize,
    mut answer: Result<Approval, RunError>,
) -> Result<bool, RunError> {
    // The model carries out a plan whole: a restored pause woken by tasks
    // decided on their own waits on until the plan is decided.
    while let Ok(Approval::Partly(_)) = answer {
        answer = Box::pin(ctx.confirm_rest(false)).await;
    }
    match answer {
        Ok(Approval::Partly(_)) => Err(RunError::unacted(crate::protocol::ErrorType::Internal)),
        Ok(Approval::Confirm(decisions)) => {
            messages.push(tool_result(call_id, &confirmed_text(&decisions)));
            let status = ctx
                .chunk(ChunkType::Status, format!("Carrying out {total} task(s)"))
                .with_meta(meta::TOTAL_TASKS, total);
            ctx.send(status).await?;
            Ok(true)
        }
        Ok(Approval::Modify(feedback)) => {
            messages.push(tool_result(
                call_id,
                &format!(
                    "{} Propose a revised plan with propose_plan.",
                    modify_text(&feedback)
                ),
            ));
            ctx.emit(ChunkType::Status, "Re-planning with your feedback")
                .await?;
            Ok(false)
        }
        Err(RunError::Cancelled(reason)) => {
            messages.push(tool_result(
                call_id,
                &format!(
                    "The plan was not confirmed ({}); nothing was carried out.",
                    reason.as_str()
                ),
            ));
            Err(RunError::Cancelled(reason))
        }
        Err(failed) => Err(failed),
    }
}

/// The arguments of `propose_plan`.
#[derive(Deserialize)]
struct PlanArguments {
    summary: Option<String>,
    risk_level: Option<RiskLevel>,
    tasks: Vec<PlanTask>,
}

#[derive(Deserialize)]
struct PlanTask {
    description: String,
    tool: Option<String>,
    args: Option<Value>,
}

/// The plan of a `propose_plan` call, or what to tell the model instead.
fn parse_plan(call: &ToolCall) -> Result<Plan, String> {
    if call.name != PLAN_TOOL {
        return Err(format!(
            "Unknown tool `{}`: the only tool is {PLAN_TOOL}.",
            call.name
        ));
    }
    let arguments: PlanArguments = serde_json::from_str(&call.arguments)
        .map_err(|err| format!("The arguments were not valid: {err}. Call {PLAN_TOOL} again."))?;
    if arguments.tasks.is_empty() {
        return Err(format!(
            "A plan needs at least one task. Call {PLAN_TOOL} again."
        ));
    }
    if arguments.tasks.len() > MAX_PLAN_TASKS {
        return Err(format!(
            "A plan may have at most {MAX_PLAN_TASKS} tasks. Call {PLAN_TOOL} again with fewer."
        ));
    }
    // A model that does not say is not assumed to be harmless. It rates the
    // plan as a whole: each task carries that rating.
    let risk_level = arguments.risk_level.unwrap_or(RiskLevel::Medium);
    let tasks: Vec<TaskSpec> = arguments
        .tasks
        .into_iter()
        .enumerate()
        .map(|(i, task)| TaskSpec {
            index: i + 1,
            tool: task.tool.unwrap_or_else(|| "model".to_owned()),
            description: task.description,
            args: task.args,
            risk_level: Some(risk_level),
            ..TaskSpec::default()
        })
        .collect();
    Ok(Plan {
        state: None,
        summary: arguments
            .summary
            .unwrap_or_else(|| format!("Confirm the plan of {} task(s)?", tasks.len())),
        tasks,
        risk_level,
    })
}

pub fn plan_tool() -> Value {
    json!({
        "type": "function",
        "function": {
            "name": PLAN_TOOL,
            "description": "Propose the tasks you would carry out. Nothing is carried out \
                            until the user confirms; the result says what the user decided.",
            "parameters": {
                "type": "object",
                "properties": {
                    "summary": { "type": "string", "description": "one line for the user" },
                    "risk_level": { "type": "string", "enum": ["low", "medium", "high"] },
                    "tasks": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "description": { "type": "string" },
                                "tool": { "type": "string" },
                                "args": { "type": "object" }
                            },
                            "required": ["description"]
                        }
                    }
                },
                "required": ["tasks"]
            }
        }
    })
}

/// What the model is told after a confirm: carry the plan out, except the
/// tasks the user rejected, answered or changed.
fn confirmed_text(decisions: &Decisions) -> String {
    let mut text = "The user confirmed the plan. Carry it out now and report the result of each \
                    task."
        .to_owned();
    for decision in &decisions.0 {
        let index = decision.index;
        match &decision.verdict {
            Verdict::Approve => {}
            Verdict::Reject { reason } => text.push_str(&format!(
                "\nTask {index} was rejected by the user{}: do not carry it out.",
                reason
                    .as_deref()
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default()
            )),
            Verdict::Edit { args } => text.push_str(&format!(
                "\nTask {index}: the user changed its arguments to {args}; use those."
            )),
            Verdict::Respond { result } => text.push_str(&format!(
                "\nTask {index}: do not carry it out; the user gave its result: {result}"
            )),
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_plan_is_explained_to_the_model() {
        let call = |name: &str, arguments: &str| ToolCall {
            id: "c".into(),
            name: name.into(),
            arguments: arguments.into(),
            ..ToolCall::default()
        };
        assert!(parse_plan(&call("rm_rf", "{}"))
            .unwrap_err()
            .contains("Unknown tool"));
        assert!(parse_plan(&call(PLAN_TOOL, "{not json"))
            .unwrap_err()
            .contains("not valid"));
        assert!(parse_plan(&call(PLAN_TOOL, "{\"tasks\":[]}"))
            .unwrap_err()
            .contains("at least one task"));
    }

    #[test]
    fn a_plan_with_too_many_tasks_goes_back_to_the_model() {
        let tasks: Vec<Value> = (0..=MAX_PLAN_TASKS)
            .map(|i| json!({ "description": i.to_string() }))
            .collect();
        let call = ToolCall {
            id: "c".into(),
            name: PLAN_TOOL.into(),
            arguments: json!({ "tasks": tasks }).to_string(),
            ..ToolCall::default()
        };
        assert!(parse_plan(&call).unwrap_err().contains("at most"));
    }
}
