//! With declared tools (`--tools`) the model calls them directly: each
//! answer's calls are checked, the ones that need a yes are one
//! confirmation (a task per call), and what is confirmed is exactly what
//! runs, once; every call's result goes back to the model. A call that
//! lacks only required values of a primitive type asks the user for them
//! first (an `input_request`); a skip sends the schema error back instead.

use std::sync::Arc;

use serde_json::{json, Value};

use super::reply::ModelReply;
use super::turn::{modify_text, paused_state, tool_result, Pending, PendingCall, Resumable};
use crate::protocol::{meta, ApprovedBy, ChunkType, RiskLevel, TaskSpec, Verdict};
use crate::run::context::policy::Route;
use crate::run::context::{Cleared, RunContext};
use crate::run::outcome::RunError;
use crate::run::plan::{Answers, Approval, Plan, Questions};
use crate::run::NOT_RUN_AGAIN;
use crate::tools::{Tool, ToolOutcome, Tools};

/// One answer's calls of declared tools. Calls to unknown tools, and calls
/// whose arguments are not a JSON object fitting the tool's schema, go back
/// to the model as errors and never reach the user. The rules of the tools
/// file route each call (a denied call goes back to the model as
/// `denied_by_rule`); calls to `confirm = false` tools no rule asks for run
/// at once, and so do calls a rule allows when nothing else needs a yes
/// (else they are listed in the confirmation, marked as allowed). The
/// rest are one confirmation, one task per
/// call; after a confirm each runs as decided (approved, edited, rejected or
/// answered by the user). Every call gets its result as a `tool` message.
/// Returns whether any call ran.
pub async fn tool_turn(
    ctx: &mut RunContext,
    messages: &mut Vec<Value>,
    reply: &ModelReply,
    tools: &Tools,
    go_on: Resumable,
) -> Result<bool, RunError> {
    let calls = &reply.tool_calls;
    let call_ids: Vec<String> = calls.iter().map(|call| call.id.clone()).collect();
    let mut results: Vec<String> = vec![String::new(); calls.len()];
    let mut batch: Vec<(usize, Arc<Tool>, Value, Option<ApprovedBy>)> = Vec::new();
    let mut allowed: Vec<(usize, Arc<Tool>, Value, ApprovedBy)> = Vec::new();
    let mut ran = false;
    let filled = match Box::pin(fill_missing(ctx, reply, tools)).await {
        Ok(filled) => filled,
        Err(stopped) => {
            let why = match &stopped {
                RunError::Cancelled(reason) => reason.as_str(),
                _ => "the run failed",
            };
            let results =
                vec![
                    format!("Not run: the user did not provide the missing values ({why}).");
                    calls.len()
                ];
            push_results(messages, &call_ids, results);
            return Err(stopped);
        }
    };
    for (position, call) in calls.iter().enumerate() {
        let Some(tool) = tools.get(&call.name).cloned() else {
            let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
            results[position] = format!(
                "Error: there is no tool `{}`; the tools are: {}.",
                call.name,
                names.join(", ")
            );
            continue;
        };
        let parsed = match filled.as_ref().filter(|(at, _)| *at == position) {
            Some((_, args)) => Ok(args.clone()),
            None => serde_json::from_str::<Value>(&call.arguments),
        };
        let args = match parsed {
            Ok(args) if args.is_object() => args,
            Ok(_) | Err(_) => {
                results[position] = "Error: the arguments were not a JSON object. Call the tool again with valid arguments.".to_owned();
                continue;
            }
        };
        if let Err(why) = tool.check_args(&args) {
            results[position] = format!(
                "Error: the arguments do not fit the tool's parameters: {why}. Call it again with valid arguments."
            );
            continue;
        }
        match Box::pin(ctx.route(&tool, &args, tool.confirm, tool.risk)).await? {
            Route::Deny { rule, reason } => {
                let text = ctx
                    .denied(position + 1, &tool.name, &rule, reason.as_deref())
                    .await?;
                results[position] = format!(
                    "Error (denied_by_rule): {text}. The server's rules forbid this call; do \
                     not try it again."
                );
            }
            Route::Allow(Some(by)) => allowed.push((position, tool, args, by)),
            Route::Allow(None) => {
                // Read-only by the tools file's word, never by the model's.
                ctx.unconfirmed_call()?;
                let status = ctx
                    .chunk(
                        ChunkType::Status,
                        format!("Running {} (read-only, no confirmation)", tool.name),
                    )
                    .with_meta(meta::TOOL, tool.name.as_str());
                ctx.send(status).await?;
                let outcome = ctx
                    .run_tool(position + 1, &tool, &args, Cleared::Unasked)
                    .await?;
                results[position] = outcome_text(&outcome);
                ran = true;
            }
            Route::Ask => batch.push((position, tool, args, None)),
        }
    }
    if batch.is_empty() {
        // Nothing to ask: the calls rules allowed run now.
        for (position, tool, args, by) in allowed {
            ctx.unconfirmed_call()?;
            let status = ctx
                .chunk(
                    ChunkType::Status,
                    format!("Running {} ({})", tool.name, allowed_text(&by)),
                )
                .with_meta(meta::TOOL, tool.name.as_str());
            ctx.send(status).await?;
            let outcome = ctx
                .run_tool(position + 1, &tool, &args, Cleared::Allowed(by))
                .await?;
            results[position] = outcome_text(&outcome);
            ran = true;
        }
        push_results(messages, &call_ids, results);
        return Ok(ran);
    }
    // Asked with the others, marked as allowed: the person may still
    // reject them.
    batch.extend(
        allowed
            .into_iter()
            .map(|(position, tool, args, by)| (position, tool, args, Some(by))),
    );
    batch.sort_by_key(|(position, ..)| *position);
    let mut plan = Plan {
        state: None,
        summary: format!("Confirm {} tool call(s)?", batch.len()),
        risk_level: batch
            .iter()
            .map(|(_, tool, ..)| tool.risk)
            .max()
            .unwrap_or(RiskLevel::Low),
        tasks: batch
            .iter()
            .enumerate()
            .map(|(k, (_, tool, args, by))| TaskSpec {
                index: k + 1,
                description: describe(tool, args),
                tool: tool.name.clone(),
                args: Some(args.clone()),
                risk_level: Some(tool.risk),
                approved_by: by.clone(),
                ..TaskSpec::default()
            })
            .collect(),
    };
    let pending = Pending::Tools {
        call_ids: call_ids.clone(),
        results: results.clone(),
        batch: batch
            .iter()
            .map(|(position, tool, args, by)| PendingCall {
                position: *position,
                tool: tool.name.clone(),
                args: args.clone(),
                approved_by: by.clone(),
            })
            .collect(),
        ran,
    };
    plan.state = paused_state(ctx, messages, go_on, pending);
    let answer = ctx.confirm_as_decided(plan).await;
    tools_answered(ctx, messages, &call_ids, results, &batch, answer, ran).await
}

/// The first call of `reply` that lacks only required primitive values,
/// with the user's answers merged into its arguments (its position, and
/// the arguments); `None` when no call lacks them or the user skipped. A
/// cancel or any other stop comes back as the error.
async fn fill_missing(
    ctx: &mut RunContext,
    reply: &ModelReply,
    tools: &Tools,
) -> Result<Option<(usize, Value)>, RunError> {
    let found = reply
        .tool_calls
        .iter()
        .enumerate()
        .find_map(|(position, call)| {
            let tool = tools.get(&call.name)?;
            let args = serde_json::from_str::<Value>(&call.arguments)
                .ok()
                .filter(Value::is_object)?;
            let questions = tool.missing_inputs(&args)?;
            Some((position, tool.clone(), args, questions))
        });
    let Some((position, tool, mut args, questions)) = found else {
        return Ok(None);
    };
    let names: Vec<&str> = questions.iter().map(|q| q.id.as_str()).collect();
    let title = format!("{} needs {}", tool.name, names.join(", "));
    // Not kept by a durable store (no state): a restart ends the run.
    let asked = Questions {
        title,
        questions,
        state: None,
    };
    match ctx.ask(asked).await? {
        Answers::Given(given) => {
            if let Some(object) = args.as_object_mut() {
                object.extend(given);
            }
            Ok(Some((position, args)))
        }
        Answers::Skipped => Ok(None),
    }
}

/// One call of a confirmed batch: its position among the model's calls,
/// its tool and arguments, and what allowed it before the pause (a rule,
/// a grant), if anything did.
type BatchCall = (usize, Arc<Tool>, Value, Option<ApprovedBy>);

/// Runs the confirmed `batch` as decided (or not at all) and gives the
/// model every call's result. The calls of one model turn are independent:
/// each runs as soon as it is decided (`decide`, #42), the pause waiting
/// on for the rest; the model's next turn starts once every call is
/// decided and done. Returns whether any call ran.
pub async fn tools_answered(
    ctx: &mut RunContext,
    messages: &mut Vec<Value>,
    call_ids: &[String],
    mut results: Vec<String>,
    batch: &[BatchCall],
    mut answer: Result<Approval, RunError>,
    mut ran: bool,
) -> Result<bool, RunError> {
    // The calls carried out so far (decided on their own, while the
    // pause waited).
    let mut done = vec![false; batch.len()];
    loop {
        match answer {
            Ok(Approval::Partly(decisions)) => {
                let mut now = false;
                for (k, call) in batch.iter().enumerate() {
                    let Some(verdict) = decisions.named(k + 1) else {
                        continue;
                    };
                    if done[k] {
                        continue;
                    }
                    done[k] = true;
                    now = true;
                    let (text, called) = Box::pin(run_call(ctx, k + 1, call, verdict)).await?;
                    results[call.0] = text;
                    ran |= called;
                }
                answer = Box::pin(ctx.confirm_rest(now)).await;
            }
            Ok(Approval::Confirm(decisions)) => {
                for (k, call) in batch.iter().enumerate() {
                    if done[k] {
                        continue;
                    }
                    let verdict = decisions.verdict(k + 1);
                    let (text, called) = Box::pin(run_call(ctx, k + 1, call, verdict)).await?;
                    results[call.0] = text;
                    ran |= called;
                }
                break;
            }
            Ok(Approval::Modify(feedback)) => {
                let text = format!(
                    "Not run. {} Call the tools again as they should be.",
                    modify_text(&feedback)
                );
                for (position, ..) in batch {
                    results[*position] = text.clone();
                }
                ctx.emit(ChunkType::Status, "Re-planning with your feedback")
                    .await?;
                break;
            }
            Err(RunError::Cancelled(reason)) => {
                for (k, (position, ..)) in batch.iter().enumerate() {
                    if !done[k] {
                        results[*position] =
                            format!("Not run: the user did not confirm ({}).", reason.as_str());
                    }
                }
                push_results(messages, call_ids, results);
                return Err(RunError::Cancelled(reason));
            }
            Err(failed) => return Err(failed),
        }
    }
    push_results(messages, call_ids, results);
    Ok(ran)
}

/// Carries out the call `index` of a batch as `verdict` says: what the
/// model is told of it, and whether it ran. A call started before a
/// restart is not run again (whether it took effect is not known).
async fn run_call(
    ctx: &mut RunContext,
    index: usize,
    (_, tool, args, allowed_by): &BatchCall,
    verdict: &Verdict,
) -> Result<(String, bool), RunError> {
    if !ctx.start_task(index).await? {
        let skipped = ToolOutcome::skipped(false, None, Some(NOT_RUN_AGAIN.to_owned()));
        ctx.record_tool(index, &tool.name, None, &skipped).await?;
        return Ok((format!("Error: {NOT_RUN_AGAIN}."), false));
    }
    let (used, approved_by) = match verdict {
        // What allowed it before the pause (a rule, a grant): approved as
        // is, it runs as that, else as the person's.
        Verdict::Approve => (args.clone(), allowed_by.clone()),
        Verdict::Edit { args } if tool.preview.is_some() => {
            // #43: an edited call is never run unseen. The model is told
            // the edit; calling again asks a new round, with the edited
            // call's own preview on the card.
            let why = "edited by the user: a call with a preview is not run before its edited                        form is previewed and confirmed";
            let skipped = ToolOutcome::skipped(false, None, Some(why.to_owned()));
            ctx.record_tool(index, &tool.name, None, &skipped).await?;
            return Ok((
                format!(
                    "Not run: the user edited this call to the arguments {args}. Call {} again                      with exactly these arguments: it will be previewed and put to the user                      to confirm.",
                    tool.name
                ),
                false,
            ));
        }
        Verdict::Edit { args } => {
            // The person decided what runs; the rules see it again.
            if let Route::Deny { rule, reason } = Box::pin(ctx.route_edited(tool, args)).await? {
                let text = ctx
                    .denied(index, &tool.name, &rule, reason.as_deref())
                    .await?;
                return Ok((format!("Error (denied_by_rule): {text}."), false));
            }
            (args.clone(), None)
        }
        Verdict::Reject { reason } => {
            let why = reason.as_deref().unwrap_or("no reason given");
            let skipped = ToolOutcome::skipped(false, None, Some(format!("rejected: {why}")));
            ctx.record_tool(index, &tool.name, None, &skipped).await?;
            return Ok((
                format!("The user rejected this call ({why}); it was not run."),
                false,
            ));
        }
        Verdict::Respond { result } => {
            let answered = ToolOutcome::skipped(true, Some(result.clone()), None);
            ctx.record_tool(index, &tool.name, None, &answered).await?;
            return Ok((
                format!("The user gave this result instead of running the call: {result}"),
                false,
            ));
        }
    };
    // What runs, as it runs: an edit's arguments, not the plan's.
    let edited = if matches!(verdict, Verdict::Edit { .. }) {
        ", edited"
    } else {
        ""
    };
    let status = ctx
        .chunk(
            ChunkType::Status,
            format!("Running task {index}{edited}: {}", describe(tool, &used)),
        )
        .with_meta(meta::STEP, index)
        .with_meta(meta::TOOL, tool.name.as_str());
    ctx.send(status).await?;
    let outcome = ctx
        .run_tool(index, tool, &used, Cleared::or_person(approved_by))
        .await?;
    if outcome.changed.is_some() {
        return Ok((
            "Error (precondition_changed): the call was not run because its effect changed              since the user approved it (its preview now shows something else). Call it again              to put its new preview to the user."
                .to_owned(),
            false,
        ));
    }
    Ok((outcome_text(&outcome), true))
}

/// One `tool` message per call, in the calls' order.
fn push_results(messages: &mut Vec<Value>, call_ids: &[String], results: Vec<String>) {
    for (id, result) in call_ids.iter().zip(results) {
        messages.push(tool_result(id, &result));
    }
}

/// Why a call runs without asking, in a status line.
fn allowed_text(by: &ApprovedBy) -> String {
    match by {
        ApprovedBy::Rule(rule) => format!("allowed by rule \"{rule}\""),
        ApprovedBy::Grant(grant) => format!("allowed by grant {grant}"),
    }
}

/// What the model is told a call did.
fn outcome_text(outcome: &ToolOutcome) -> String {
    match (outcome.ok, &outcome.result, &outcome.error) {
        (true, Some(result), _) if outcome.truncated => {
            format!("{result}\n[output truncated at {} bytes]", result.len())
        }
        (true, Some(result), _) => result.clone(),
        (_, _, Some(error)) => format!("Error: {error}"),
        _ => "Error: the call failed".to_owned(),
    }
}

/// A task's readable description: the tool and its arguments, on one line.
fn describe(tool: &Tool, args: &Value) -> String {
    let args = args.to_string();
    let mut text = format!("{} {}", tool.name, args);
    if text.chars().count() > 200 {
        text = text.chars().take(199).collect::<String>() + "…";
    }
    text
}

/// A declared tool, as the model is offered it.
pub fn tool_spec(tool: &Tool) -> Value {
    json!({
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        }
    })
}
