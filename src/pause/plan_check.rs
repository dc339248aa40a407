//! An approval pause (a `confirmation_request`): what its plan's tasks
//! ask (one [`TaskCheck`] each: the tool, the risk, the gate), who must
//! approve it ([`Quorum`]), and the per-task decisions a `confirm` may
//! carry (`decisions` of a reply), checked against the pending tasks
//! before the pause is decided.

use std::sync::Arc;

use crate::protocol::{RiskLevel, TaskDecisionRequest, TaskSpec};
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
