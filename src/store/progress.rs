//! What happened to a pause while it waited: a quorum's approvals, its
//! reminder, its escalation (and the expiry that moved with it). A durable
//! store keeps it beside the paused run's record, each step as it happens
//! and before it is announced, so that a restart or a takeover restores
//! the pause as it was and fires no timer twice. It is joined to the
//! record on load only when it is the progress of the pause the record
//! holds (a new round starts from nothing).

use serde::{Deserialize, Serialize};

use crate::protocol::{TaskDecision, Via};

/// A pause's progress, or one step of it (the fields that step sets).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PauseProgress {
    pub confirmation_id: String,
    /// A quorum's approvals so far (labels, in order), and how many it
    /// needs. Older files name them `labels`.
    #[serde(default, alias = "labels", skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<String>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub required: usize,
    /// Tasks an approver rejected while approving the rest, carried to the
    /// decision (a reject given on the way to a quorum stands).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejected: Vec<CarriedReject>,
    /// Tasks decided on their own so far (`decide`, #42), by whom, in the
    /// order they were decided. Kept with the approvals: one step, the
    /// pause's tally as it stands.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decided: Vec<DecidedTask>,
    /// Approvals of tasks that need several (`approvals = N`), given by
    /// `decide` and not yet enough: per task, the labels so far.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub task_approvals: Vec<TaskApprovals>,
    /// Tasks decided on their own that the run started while the pause
    /// still waited (their indexes): after a restart they are not run
    /// again. Written by the run alone, the whole list each time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub started: Vec<usize>,
    /// Its `interaction.reminder` was sent (or is queued).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reminded: bool,
    /// The group it was escalated to, and its expiry since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalated_to: Option<String>,
    /// Every escalation so far (#42), each for its own tasks; none in an
    /// older record, whose `escalated_to` was for every task.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub escalations: Vec<Escalated>,
    /// The tasks whose reminders were sent (#42; none in an older record,
    /// whose `reminded` was the first reminder's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reminded_tasks: Vec<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    /// A timer's step: when the pause's next timer is due (ms), `None`
    /// when none is left. Not kept in the step: it moves the index of due
    /// timers a store replicas share.
    #[serde(skip)]
    pub next_timer_ms: Option<u64>,
}

impl PauseProgress {
    /// Whether this step is a timer's (a reminder, an escalation), which
    /// moves the pause's next timer to [`PauseProgress::next_timer_ms`].
    pub fn is_timer_step(&self) -> bool {
        self.reminded
            || !self.reminded_tasks.is_empty()
            || self.escalated_to.is_some()
            || !self.escalations.is_empty()
    }
}

/// A task one approver of a quorum rejected while approving the rest:
/// whatever the later approvers say, it does not run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CarriedReject {
    /// The label that rejected it.
    pub by: String,
    pub index: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A task decided on its own (`decide`): whatever the pause's other tasks
/// become, this is its decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecidedTask {
    /// The label that decided it (`timeout` for a task that expired).
    pub by: String,
    #[serde(flatten)]
    pub decision: TaskDecision,
    /// Nobody decided it in its time: its `on_timeout = "reject"`
    /// rejected it (its state is `expired`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub expired: bool,
    /// A task that needed several approvals: every label that approved
    /// it, in order (its receipt's `approved_by`); else empty (`by`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approved_by: Vec<String>,
    /// The door its decision came through.
    #[serde(default, skip_serializing_if = "Via::is_chat")]
    pub via: Via,
    /// When it was decided (ms since the Unix epoch; 0 in older records).
    #[serde(default, skip_serializing_if = "is_zero_ms")]
    pub at_ms: u64,
}

fn is_zero_ms(ms: &u64) -> bool {
    *ms == 0
}

/// The approvals of one task that needs several, so far (labels, in
/// order), and how many it needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskApprovals {
    pub index: usize,
    pub approvals: Vec<String>,
    pub required: usize,
}

/// One escalation of a pause: its group, and the tasks it admits the
/// group to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Escalated {
    pub group: String,
    pub tasks: Vec<usize>,
}

impl TaskApprovals {
    /// Where it stands, as every face says it: "task 3: 1 of 2 approvals
    /// (lead-1)".
    pub fn progress(&self) -> String {
        format!(
            "task {}: {} of {} approvals ({})",
            self.index,
            self.approvals.len(),
            self.required,
            self.approvals.join(", ")
        )
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Which of a pause's steps a [`PauseProgress`] records (a store that keeps
/// them apart writes each to its own place).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Approvals,
    Reminded,
    Escalated,
    Started,
}

impl Step {
    /// Its name as a field (Redis).
    pub fn field(self) -> &'static str {
        match self {
            Step::Approvals => "approvals",
            Step::Reminded => "reminded",
            Step::Escalated => "escalated",
            Step::Started => "started",
        }
    }
}

impl PauseProgress {
    pub fn approvals(
        confirmation_id: &str,
        approvals: &[String],
        required: usize,
        rejected: &[CarriedReject],
    ) -> Self {
        PauseProgress {
            confirmation_id: confirmation_id.to_owned(),
            approvals: approvals.to_vec(),
            required,
            rejected: rejected.to_vec(),
            ..PauseProgress::default()
        }
    }

    /// The tasks decided on their own so far (a `decide`), and the
    /// approvals of those that need several.
    pub fn tasks(
        confirmation_id: &str,
        decided: &[DecidedTask],
        task_approvals: &[TaskApprovals],
    ) -> Self {
        PauseProgress {
            confirmation_id: confirmation_id.to_owned(),
            decided: decided.to_vec(),
            task_approvals: task_approvals.to_vec(),
            ..PauseProgress::default()
        }
    }

    /// The tasks the run has started while the pause waits (all so far).
    pub fn started(confirmation_id: &str, started: &[usize]) -> Self {
        PauseProgress {
            confirmation_id: confirmation_id.to_owned(),
            started: started.to_vec(),
            ..PauseProgress::default()
        }
    }

    /// A reminder sent; `tasks`: every task reminded so far.
    pub fn reminded(confirmation_id: &str, tasks: &[usize]) -> Self {
        PauseProgress {
            confirmation_id: confirmation_id.to_owned(),
            reminded: true,
            reminded_tasks: tasks.to_vec(),
            ..PauseProgress::default()
        }
    }

    /// An escalation to `group`; `escalations`: every one so far, this
    /// one included.
    pub fn escalated(
        confirmation_id: &str,
        group: &str,
        escalations: &[Escalated],
        expires_at_ms: u64,
    ) -> Self {
        PauseProgress {
            confirmation_id: confirmation_id.to_owned(),
            escalated_to: Some(group.to_owned()),
            escalations: escalations.to_vec(),
            expires_at_ms: Some(expires_at_ms),
            ..PauseProgress::default()
        }
    }

    /// Which step this is.
    pub fn step(&self) -> Step {
        if self.escalated_to.is_some() {
            Step::Escalated
        } else if self.reminded {
            Step::Reminded
        } else if !self.started.is_empty() {
            Step::Started
        } else {
            Step::Approvals
        }
    }

    /// `step` taken after this: a step of another pause starts over.
    pub fn then(self, step: PauseProgress) -> PauseProgress {
        if self.confirmation_id != step.confirmation_id {
            return step;
        }
        let mut progress = self;
        match step.step() {
            Step::Approvals => {
                progress.approvals = step.approvals;
                progress.required = step.required;
                progress.rejected = step.rejected;
                progress.decided = step.decided;
                progress.task_approvals = step.task_approvals;
            }
            Step::Reminded => {
                progress.reminded = true;
                progress.reminded_tasks = step.reminded_tasks;
            }
            Step::Started => progress.started = step.started,
            Step::Escalated => {
                progress.escalated_to = step.escalated_to;
                progress.escalations = step.escalations;
                progress.expires_at_ms = step.expires_at_ms;
            }
        }
        progress
    }

    /// The progress of the pause `confirmation_id` among `steps` (JSON as
    /// stored; unreadable or other pauses' steps count for nothing).
    pub fn join<'a>(
        confirmation_id: &str,
        steps: impl IntoIterator<Item = Option<&'a str>>,
    ) -> Option<PauseProgress> {
        steps
            .into_iter()
            .flatten()
            .filter_map(|json| serde_json::from_str::<PauseProgress>(json).ok())
            .filter(|step| step.confirmation_id == confirmation_id)
            .reduce(PauseProgress::then)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_join_for_their_own_pause_only() {
        let approvals =
            serde_json::to_string(&PauseProgress::approvals("c1", &["a".into()], 2, &[]));
        let escalated = serde_json::to_string(&PauseProgress::escalated("c1", "oncall", &[], 9));
        let other = serde_json::to_string(&PauseProgress::reminded("c0", &[]));
        let (approvals, escalated, other) =
            (approvals.unwrap(), escalated.unwrap(), other.unwrap());
        let joined =
            PauseProgress::join("c1", [Some(&*approvals), Some(&*other), Some(&*escalated)]);
        let joined = joined.unwrap();
        assert_eq!(joined.approvals, ["a"]);
        assert_eq!(joined.required, 2);
        assert!(!joined.reminded);
        assert_eq!(joined.escalated_to.as_deref(), Some("oncall"));
        assert_eq!(joined.expires_at_ms, Some(9));
        assert_eq!(PauseProgress::join("c2", [Some(&*approvals), None]), None);
    }

    #[test]
    fn the_last_versions_approvals_are_read() {
        let old = r#"{"confirmation_id":"c1","labels":["lead-1"]}"#;
        let joined = PauseProgress::join("c1", [Some(old)]).unwrap();
        assert_eq!(joined.approvals, ["lead-1"]);
    }
}
