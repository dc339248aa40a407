//! The per-task decisions a `confirm` may carry (`decisions` of a reply),
//! checked against the pending tasks before the pause is decided.

use std::sync::Arc;

use crate::protocol::{Action, Decisions, TaskDecision, TaskDecisionRequest, TaskSpec, Verdict};
use crate::tools::{Tool, Tools};

/// What the pause knows of a task, to check the decisions made on it.
#[derive(Debug, Clone, Default)]
pub struct TaskCheck {
    /// The declared tool the task calls, if any (its schema checks edits).
    pub tool: Option<Arc<Tool>>,
}

impl TaskCheck {
    /// What the decisions on `tasks` are checked against: each task's
    /// declared tool, if it calls one.
    pub fn of(tasks: &[TaskSpec], tools: &Tools) -> Arc<[TaskCheck]> {
        tasks
            .iter()
            .map(|task| TaskCheck {
                tool: tools.get(&task.tool).cloned(),
            })
            .collect()
    }
}

/// Checks a reply's per-task decisions against the pending tasks: only with
/// `confirm`, each index once and known, a known kind, `edit` only of a
/// declared tool's call and with `args` that fit it, `respond` with a
/// `result`. Returns the verdict
/// for every task (approved unless named) for a confirm.
pub fn check_decisions(
    action: Action,
    requests: Option<&[TaskDecisionRequest]>,
    tasks: &[TaskCheck],
) -> Result<Option<Decisions>, String> {
    let requests = requests.unwrap_or_default();
    if action != Action::Confirm {
        if !requests.is_empty() {
            return Err(format!(
                "decisions go with confirm only, not with {}",
                action.as_str()
            ));
        }
        return Ok(None);
    }
    let mut verdicts = Decisions::approve_all(tasks.len());
    let mut named = vec![false; tasks.len()];
    for request in requests {
        let index = usize::try_from(request.index).unwrap_or(usize::MAX);
        if index == 0 || index > tasks.len() {
            return Err(format!(
                "decisions: no task {} (the tasks are 1 to {})",
                request.index,
                tasks.len()
            ));
        }
        if std::mem::replace(&mut named[index - 1], true) {
            return Err(format!("decisions: task {index} is decided twice"));
        }
        let verdict = match request.decision.as_str() {
            "approve" => Verdict::Approve,
            "reject" => Verdict::Reject {
                reason: request.reason.clone(),
            },
            "edit" => {
                let args = request
                    .args
                    .clone()
                    .ok_or_else(|| format!("decisions: task {index}: edit needs args"))?;
                // What is recorded is what runs: only a declared tool's
                // call runs with arguments an edit can change.
                let tool = tasks[index - 1].tool.as_ref().ok_or_else(|| {
                    format!(
                        "decisions: task {index} calls no declared tool, so there are no \
                         arguments to edit; reject it, respond for it, or modify the plan"
                    )
                })?;
                tool.check_args(&args).map_err(|why| {
                    format!(
                        "decisions: task {index}: the args do not fit the tool `{}`: {why}",
                        tool.name
                    )
                })?;
                Verdict::Edit { args }
            }
            "respond" => Verdict::Respond {
                result: request
                    .result
                    .clone()
                    .ok_or_else(|| format!("decisions: task {index}: respond needs result"))?,
            },
            other => {
                return Err(format!(
                    "decisions: task {index}: `{other}` is not approve, reject, edit or respond"
                ))
            }
        };
        verdicts.0[index - 1] = TaskDecision { index, verdict };
    }
    Ok(Some(verdicts))
}
