//! A reply to an approval pause (a `confirmation_request`), checked
//! against its plan ([`check_reply`]): who may decide the tasks it
//! decides, the per-task decisions it carries (`decisions`: each task once
//! and known, a known kind, an edit that fits its tool and the rules), and
//! the grant a confirm gives. What the plan asks is [`super::plan_check`]'s.

use serde_json::{json, Value};

use super::grant::check_grant;
use super::plan_check::{PlanCheck, Quorum, TaskCheck};
use super::reply::{check_decider, Checked, DecisionsError, Refused, Reply};
use crate::protocol::given::Given;
use crate::protocol::{
    Action, DecisionKind, Decisions, TaskDecision, TaskDecisionRequest, Verdict,
};

/// Checks `reply` against `plan`: who may decide what it decides (the
/// tasks a `decide` names, or those still pending after some were decided
/// on their own), no answers, its decisions, and the grant a confirm (only)
/// may give. Every approval of it counts towards the plan's quorum.
pub fn check_reply(plan: &PlanCheck, reply: &Reply<'_>) -> Result<Checked, Refused> {
    let action = reply.action;
    // A decide decides as a confirm does, the tasks it names only; a
    // confirm after some decides, those still pending.
    let (deciding, part) = match action {
        Action::Decide => (
            Action::Confirm,
            deciding_part(
                plan,
                Some(reply.payload.decisions.unwrap_or_default()),
                reply.decided,
            ),
        ),
        Action::Confirm => (action, deciding_part(plan, None, reply.decided)),
        action => (action, None),
    };
    // An escalation admits its group to the tasks it was for (#42): to a
    // reply deciding only those.
    check_decider(
        part.as_ref().unwrap_or(plan),
        reply.decider,
        deciding,
        reply.escalations,
    )
    .map_err(Refused::Decider)?;
    if reply.payload.answers.is_some() {
        return Err(Refused::InvalidAnswer(
            "answers go with `answer` to questions; this pause is a confirmation request"
                .to_owned(),
        ));
    }
    let verdicts = check_decisions(action, reply.payload.decisions, plan)?;
    let granted = match (reply.payload.grant, &verdicts) {
        (None, _) => None,
        (Some(ask), Some(verdicts)) => Some(Box::new(
            check_grant(ask, verdicts, plan, reply.decider).map_err(Refused::InvalidGrant)?,
        )),
        (Some(_), None) => {
            return Err(Refused::InvalidGrant(
                "grant: a grant goes with confirm only".to_owned(),
            ))
        }
    };
    if granted.is_some() && action == Action::Decide {
        return Err(Refused::InvalidGrant(
            "grant: a grant goes with confirm only, not with decide".to_owned(),
        ));
    }
    Ok(Checked {
        given: verdicts.map(Given::Decisions),
        granted,
        quorum: Some(Quorum::of(plan)),
    })
}

/// Checks a reply's per-task decisions against the pending tasks: only with
/// `confirm` or `decide`, each task once and known, a known kind, `edit`
/// only of a declared tool's call and with `args` that fit it, `respond`
/// with a `result`. Returns, for a confirm, the verdict for every task
/// (approved unless named); for a decide, those of the tasks it names
/// (at least one).
pub fn check_decisions(
    action: Action,
    requests: Option<&[TaskDecisionRequest]>,
    plan: &PlanCheck,
) -> Result<Option<Decisions>, DecisionsError> {
    let given = requests.is_some();
    let requests = requests.unwrap_or_default();
    match action {
        Action::Confirm => {}
        Action::Decide if requests.is_empty() => {
            return Err(DecisionsError::Invalid(
                "decide names the tasks it decides: give `decisions` (the others stay pending)"
                    .to_owned(),
            ))
        }
        Action::Decide => return check_named(requests, plan).map(Some),
        _ if !requests.is_empty() => {
            return Err(DecisionsError::Invalid(format!(
                "decisions go with confirm only (or decide), not with {}",
                action.as_str()
            )))
        }
        _ => return Ok(None),
    }
    let named = check_named(requests, plan)?;
    let undecided = if plan.explicit && given {
        plan.tasks
            .iter()
            .filter(|task| named.0.iter().all(|d| d.index != task.index))
            .map(|task| task.index)
            .collect()
    } else {
        Vec::new()
    };
    if !undecided.is_empty() {
        return Err(undecided_tasks(&undecided));
    }
    Ok(Some(with_the_rest_approved(&plan.tasks, &named, &[])))
}

/// `--explicit-decisions`: the tasks a reply left undecided.
pub fn undecided_tasks(undecided: &[usize]) -> DecisionsError {
    let list: Vec<String> = undecided.iter().map(usize::to_string).collect();
    DecisionsError::Undecided(format!(
        "decisions: task(s) {} not decided; this server takes a decision for every task \
         (--explicit-decisions)",
        list.join(", ")
    ))
}

/// The verdict for every task of `tasks`, in order: `named`'s, else what
/// was `decided` on its own before, else approved.
pub fn with_the_rest_approved(
    tasks: &[TaskCheck],
    named: &Decisions,
    decided: &[TaskDecision],
) -> Decisions {
    Decisions(
        tasks
            .iter()
            .map(|task| {
                let given = named
                    .0
                    .iter()
                    .chain(decided)
                    .find(|d| d.index == task.index);
                given.cloned().unwrap_or(TaskDecision {
                    index: task.index,
                    verdict: Verdict::Approve,
                })
            })
            .collect(),
    )
}

/// The verdicts of the tasks `requests` name, checked (each named once).
pub fn check_named(
    requests: &[TaskDecisionRequest],
    plan: &PlanCheck,
) -> Result<Decisions, DecisionsError> {
    let tasks = &plan.tasks;
    let mut named = vec![false; tasks.len()];
    let mut verdicts = Vec::new();
    for request in requests {
        let at = named_task(tasks, request)?;
        let index = tasks[at].index;
        if std::mem::replace(&mut named[at], true) {
            return Err(DecisionsError::Invalid(format!(
                "decisions: task {index} is decided twice"
            )));
        }
        let verdict = verdict_of(request, plan, at)?;
        verdicts.push(TaskDecision { index, verdict });
    }
    Ok(Decisions(verdicts))
}

/// The verdict `request` gives task `at` of `plan`, checked.
fn verdict_of(
    request: &TaskDecisionRequest,
    plan: &PlanCheck,
    at: usize,
) -> Result<Verdict, DecisionsError> {
    let tasks = &plan.tasks;
    let index = tasks[at].index;
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
            let tool = tasks[at].tool.as_ref().ok_or_else(|| {
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
            if let Some((tools, key)) = &plan.rules {
                if let Some(rule) = tools.rules().denies(&tool.name, &args, key) {
                    return Err(denied(index, &tool.name, rule));
                }
                // The edited call routed with its new arguments: an
                // `ask` rule that wants more or other people than this
                // pause's sends it to them, in a new round.
                let ruling = tools.rules().evaluate(&tool.name, &args, key);
                let gate = match ruling.enforced.and_then(|rule| rule.gate.as_ref()) {
                    Some(gate) => tool.gate.and(gate),
                    None => tool.gate.clone(),
                };
                if !tasks[at].gate.covers(&gate) {
                    return Err(DecisionsError::NeedsNewRound(format!(
                        "decisions: task {index}: the edited call of `{}` needs other \
                         approvers than this pause's ({}); modify the plan so that it \
                         is asked of them (a new round), or reject the task",
                        tool.name,
                        gate.describe()
                    )));
                }
            }
            Verdict::Edit { args }
        }
        "respond" => Verdict::Respond {
            result: request
                .result
                .clone()
                .ok_or_else(|| format!("decisions: task {index}: respond needs result"))?,
        },
        other => {
            return Err(DecisionsError::Invalid(format!(
                "decisions: task {index}: `{other}` is not approve, reject, edit or respond"
            )))
        }
    };
    Ok(verdict)
}

/// The part of `plan` a reply decides, when that is not all of it: the
/// tasks a `decide` names (those it names well: a bad name is refused by
/// the decisions' own check), or, once some tasks were decided on their
/// own, the tasks not among `decided`. Who may decide is asked of these.
pub fn deciding_part(
    plan: &PlanCheck,
    named: Option<&[TaskDecisionRequest]>,
    decided: &[usize],
) -> Option<PlanCheck> {
    let part: Vec<TaskCheck> = match named {
        Some(requests) => requests
            .iter()
            .filter_map(|request| named_task(&plan.tasks, request).ok())
            .map(|at| plan.tasks[at].clone())
            .collect(),
        None if decided.is_empty() => return None,
        None => plan
            .tasks
            .iter()
            .filter(|task| !decided.contains(&task.index))
            .cloned()
            .collect(),
    };
    Some(PlanCheck {
        tasks: part,
        ..PlanCheck::default()
    })
}

/// Where in `tasks` the task a decision names is: by `index` or by
/// `task_id` (both: the same task).
fn named_task(tasks: &[TaskCheck], request: &TaskDecisionRequest) -> Result<usize, DecisionsError> {
    let no_task = |what: String| {
        DecisionsError::Invalid(format!(
            "decisions: no task {what} (the tasks are {})",
            task_list(tasks)
        ))
    };
    let by_index = match request.index {
        Some(index) => {
            let index = usize::try_from(index).unwrap_or(usize::MAX);
            let at = tasks.iter().position(|task| task.index == index);
            Some(at.ok_or_else(|| no_task(index.to_string()))?)
        }
        None => None,
    };
    let by_id = match request.task_id.as_deref() {
        Some(id) => {
            let at = tasks
                .iter()
                .position(|task| task.task_id.as_deref() == Some(id));
            Some(at.ok_or_else(|| no_task(format!("with task_id {}", Value::from(id))))?)
        }
        None => None,
    };
    match (by_index, by_id) {
        (Some(at), None) | (None, Some(at)) => Ok(at),
        (Some(at), Some(same)) if at == same => Ok(at),
        (Some(at), Some(other)) => Err(DecisionsError::Invalid(format!(
            "decisions: index {} and task_id {} name different tasks (task_id {} is task {})",
            tasks[at].index,
            Value::from(request.task_id.as_deref().unwrap_or_default()),
            Value::from(request.task_id.as_deref().unwrap_or_default()),
            tasks[other].index
        ))),
        (None, None) => Err(DecisionsError::Invalid(
            "decisions: a decision names its task by index or task_id".to_owned(),
        )),
    }
}

/// The JSON Schema (draft 2020-12) of one decision object for `task`,
/// which takes the decisions `takes`: the task named by `index` or
/// `task_id` (both optional here: the reply's own check says which task),
/// and a `oneOf`, one branch per decision, carrying what that decision
/// carries (an edit's `args` fit the tool's own input schema); no other
/// property (`unevaluatedProperties`).
pub fn response_schema(task: &TaskCheck, takes: &[DecisionKind]) -> Value {
    // What names the task, once; each branch adds what its decision
    // carries, and `unevaluatedProperties` refuses anything else.
    let mut names = json!({"index": {"const": task.index}});
    if let Some(id) = &task.task_id {
        names["task_id"] = json!({"const": id});
    }
    let branch = |decision: DecisionKind| {
        let mut properties = json!({"decision": {"const": decision.as_str()}});
        let mut required = vec!["decision"];
        match decision {
            DecisionKind::Approve => {}
            DecisionKind::Reject => properties["reason"] = json!({"type": "string"}),
            DecisionKind::Edit => {
                let args = task
                    .tool
                    .as_ref()
                    .map_or_else(|| json!({"type": "object"}), |tool| tool.parameters.clone());
                properties["args"] = args;
                required.push("args");
            }
            DecisionKind::Respond => {
                properties["result"] = json!({"type": "string"});
                required.push("result");
            }
        }
        json!({"properties": properties, "required": required})
    };
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": names,
        "oneOf": takes.iter().map(|decision| branch(*decision)).collect::<Vec<_>>(),
        "unevaluatedProperties": false,
    })
}

/// The refusal of an edit whose new call `rule` denies.
fn denied(index: usize, tool: &str, rule: &crate::tools::rules::Rule) -> DecisionsError {
    DecisionsError::Denied(format!(
        "decisions: task {index}: the edited call of `{tool}` is denied by rule \"{}\"{}; the \
         pause stays as it was",
        rule.name,
        rule.reason
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default()
    ))
}

/// `1 to 3`, or `1, 3` when there are gaps.
fn task_list(tasks: &[TaskCheck]) -> String {
    let contiguous = tasks.iter().enumerate().all(|(i, t)| t.index == i + 1);
    match (tasks.first(), tasks.last()) {
        (Some(first), Some(last)) if contiguous => format!("{} to {}", first.index, last.index),
        (Some(_), Some(_)) => tasks
            .iter()
            .map(|t| t.index.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        _ => "none".to_owned(),
    }
}
