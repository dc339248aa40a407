//! An approval pause (a `confirmation_request`): what its plan's tasks
//! ask (one [`TaskCheck`] each: the tool, the risk, the gate), who must
//! approve it ([`Quorum`]), and the per-task decisions a `confirm` may
//! carry (`decisions` of a reply), checked against the pending tasks
//! before the pause is decided.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::protocol::{
    Action, DecisionKind, Decisions, RiskLevel, TaskDecision, TaskDecisionRequest, TaskSpec,
    Verdict,
};
use crate::tools::gate::Gate;
use crate::tools::{Tool, Tools};

/// Default of `--max-grant-ttl`, and of a grant that names no `ttl`.
pub const MAX_GRANT_TTL: std::time::Duration = std::time::Duration::from_secs(3600);

/// What the pause knows of a task, to check the decisions made on it.
#[derive(Debug, Clone)]
pub struct TaskCheck {
    /// The task's index in the plan (a task a rule denied is not asked,
    /// so the indices of a pause may have gaps).
    pub index: usize,
    /// Its `task_id`, by which a reply may name it instead (none in a
    /// record an older version stored).
    pub task_id: Option<String>,
    /// The declared tool the task calls, if any (its schema checks edits).
    pub tool: Option<Arc<Tool>>,
    /// The task's own risk (who may decide it).
    pub risk: RiskLevel,
    /// Who decides it and what happens while nobody does: its tool's gate,
    /// made stricter by the `ask` rule its call matches, if any.
    pub gate: Gate,
    /// The digest of the preview it was asked with, if its tool has one.
    pub preview_digest: Option<String>,
}

/// Checks the `preview_digest`s a reply carries against the previews its
/// tasks were asked with: a digest that is not a task's current one (or
/// one for a task without a preview) is refused, naming the task.
pub fn check_preview_digests(
    tasks: &[TaskCheck],
    requests: &[TaskDecisionRequest],
) -> Result<(), String> {
    for request in requests {
        let Some(given) = request.preview_digest.as_deref() else {
            continue;
        };
        let task = tasks.iter().find(|task| {
            request.index.is_some_and(|i| i == task.index as u64)
                || (request.task_id.is_some() && request.task_id == task.task_id)
        });
        // A request that names no task is refused by the decisions' own check.
        let Some(task) = task else { continue };
        match task.preview_digest.as_deref() {
            Some(current) if current == given => {}
            Some(current) => {
                return Err(format!(
                    "task {}: the preview you were shown ({given}) is not its preview now                      ({current}); look at the task again before you decide",
                    task.index
                ))
            }
            None => {
                return Err(format!(
                    "task {}: it has no preview, so no preview_digest can be right for it",
                    task.index
                ))
            }
        }
    }
    Ok(())
}

/// What a reply's decisions on a plan are checked against.
#[derive(Debug)]
pub struct PlanCheck {
    pub tasks: Vec<TaskCheck>,
    /// `--explicit-decisions`: a `decisions` reply names every task.
    pub explicit: bool,
    /// The tools file's rules (an edit's new arguments a `deny` rule
    /// matches are refused) and the requester's key label they apply to.
    pub rules: Option<(Arc<Tools>, String)>,
    /// `--max-grant-ttl`: the longest a grant given on this pause may last.
    pub max_grant_ttl: std::time::Duration,
}

impl PlanCheck {
    /// What the decisions on `tasks` are checked against: each task's
    /// index and declared tool, if it calls one.
    pub fn of(tasks: &[TaskSpec], tools: &Arc<Tools>) -> PlanCheck {
        PlanCheck {
            tasks: tasks
                .iter()
                .map(|task| {
                    let tool = tools.get(&task.tool).cloned();
                    TaskCheck {
                        index: task.index,
                        task_id: task.task_id.clone(),
                        gate: tool.as_ref().map(|t| t.gate.clone()).unwrap_or_default(),
                        tool,
                        risk: task.risk_level.unwrap_or(RiskLevel::Low),
                        preview_digest: task.preview.as_ref().map(|p| p.digest.clone()),
                    }
                })
                .collect(),
            explicit: false,
            rules: None,
            max_grant_ttl: MAX_GRANT_TTL,
        }
    }

    pub fn max_grant_ttl(mut self, ttl: std::time::Duration) -> PlanCheck {
        self.max_grant_ttl = ttl;
        self
    }

    /// Refuses edits a `deny` rule matches, for the key labelled `key`,
    /// and makes each of `tasks` as strict as the `ask` rule its call
    /// matches says.
    pub fn with_rules(mut self, tasks: &[TaskSpec], tools: &Arc<Tools>, key: String) -> PlanCheck {
        if tools.rules().is_empty() {
            return self;
        }
        for (check, task) in self.tasks.iter_mut().zip(tasks) {
            let args = task.args.as_ref().unwrap_or(&serde_json::Value::Null);
            let ruling = tools.rules().evaluate(&task.tool, args, &key);
            if let Some(rule) = ruling.enforced {
                if let Some(gate) = &rule.gate {
                    check.gate = check.gate.and(gate);
                }
            }
        }
        self.rules = Some((tools.clone(), key));
        self
    }

    /// Whether silence rejects this plan: every task's gate says
    /// `on_timeout = "reject"` (a plan of no task: no).
    pub fn rejects_on_timeout(&self) -> bool {
        !self.tasks.is_empty() && self.tasks.iter().all(|task| task.gate.rejects_on_timeout())
    }

    pub fn explicit(mut self, explicit: bool) -> PlanCheck {
        self.explicit = explicit;
        self
    }
}

impl Default for PlanCheck {
    fn default() -> PlanCheck {
        PlanCheck {
            tasks: Vec::new(),
            explicit: false,
            rules: None,
            max_grant_ttl: MAX_GRANT_TTL,
        }
    }
}

/// What a plan's tasks ask of their deciders.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Quorum {
    /// Confirms from distinct labels the pause needs (1: one yes).
    pub required: usize,
    /// Whether the requester's own key counts towards them.
    pub requester_may_approve: bool,
    /// The groups whose members alone decide (every one of them).
    pub groups: Vec<String>,
}

impl Quorum {
    /// What the tasks of `plan` ask: the most approvals any of its tools
    /// asks, the requester counting only when every tool lets it, every
    /// group named.
    pub fn of(plan: &PlanCheck) -> Quorum {
        let mut quorum = Quorum {
            required: 1,
            requester_may_approve: true,
            groups: Vec::new(),
        };
        for gate in plan.tasks.iter().map(|task| &task.gate) {
            quorum.required = quorum.required.max(usize::from(gate.approvals));
            quorum.requester_may_approve &= gate.requester_may_approve();
            for group in &gate.approvers {
                if !quorum.groups.contains(group) {
                    quorum.groups.push(group.clone());
                }
            }
        }
        quorum
    }
}

/// Who may decide one task of a plan: what the one rule
/// ([`crate::decider::may_decide`]) is asked of it alone (#42).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskWho {
    pub index: usize,
    pub risk: RiskLevel,
    /// The groups whose members alone decide it.
    pub groups: Vec<String>,
    /// Whether the requester's own key counts towards its approvals.
    pub requester_may_approve: bool,
}

impl TaskWho {
    /// Each task of `plan`'s.
    pub fn of(plan: &PlanCheck) -> Vec<TaskWho> {
        plan.tasks
            .iter()
            .map(|task| TaskWho {
                index: task.index,
                risk: task.risk,
                groups: task.gate.approvers.clone(),
                requester_may_approve: task.gate.requester_may_approve(),
            })
            .collect()
    }
}

/// Why a reply's decisions are refused (422 each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecisionsError {
    /// `invalid_decision`.
    Invalid(String),
    /// `denied_by_rule`: an edit's new arguments.
    Denied(String),
    /// `undecided_tasks` (`--explicit-decisions`).
    Undecided(String),
    /// `edit_needs_new_round`: an edit's new call needs more or other
    /// people than the pause's (an `ask` rule matches it).
    NeedsNewRound(String),
}

impl From<String> for DecisionsError {
    fn from(why: String) -> DecisionsError {
        DecisionsError::Invalid(why)
    }
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
