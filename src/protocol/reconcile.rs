//! The wire types of a reconcile pause (#44): the `confirmation_data` of
//! the `input_request` that asks whether a call a crash cut short took
//! effect (its chunks are built in `chunk.rs`).

use serde::{Deserialize, Serialize};

use super::names::{Action, PauseKind, RiskLevel};
use super::task_spec::TaskSpec;

/// The `confirmation_data` object of an `input_request` chunk that asks
/// whether a call cut short by a crash took effect (#44): the task, its
/// idempotency key and when its last attempt started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReconcileData {
    /// Always `reconcile`.
    #[serde(default)]
    pub kind: PauseKind,
    pub confirmation_id: String,
    pub title: String,
    /// What happened and what each option does.
    pub message: String,
    /// The task, as its plan asked it (`index`, `tool`, `args`, its risk).
    pub task: Box<TaskSpec>,
    pub idempotency_key: String,
    /// When its last attempt started (RFC 3339, UTC).
    pub started_at: String,
    /// How many attempts started.
    pub attempt: u32,
    /// Always `run_again`, `skip`, `cancel`.
    pub options: Vec<Action>,
    pub risk_level: RiskLevel,
    /// Who decides `run_again`, as for the task's approval: how many
    /// distinct people (`required`, above 1) and the groups whose members
    /// alone decide (`approvers`).
    #[serde(default, skip_serializing_if = "is_one_or_less")]
    pub required: usize,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvers: Vec<String>,
    pub timeout_seconds: u64,
    /// RFC 3339, UTC.
    pub expires_at: String,
}

fn is_one_or_less(n: &usize) -> bool {
    *n <= 1
}
