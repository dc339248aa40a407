//! An approval, the first kind of pause: a plan put to the user. Its wire
//! type (the `confirmation_data` of a `confirmation_request`), what the
//! faces read of it and what a stored paused record keeps of it (its
//! tasks). Its reply checks live in `crate::pause::approval`, its chunks
//! are built in `protocol/chunk.rs`.

use serde::{Deserialize, Serialize};

use super::contract::{Deciding, Fields, KindAsked, KindData, KindWire, WrittenAsk};
use crate::protocol::names::{Action, PauseKind, RiskLevel};
use crate::protocol::question::Question;
use crate::protocol::task_spec::TaskSpec;

/// The `confirmation_data` object of a `confirmation_request` chunk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConfirmationData {
    /// Always `approval` here (questions are the other kind).
    #[serde(default)]
    pub kind: PauseKind,
    pub confirmation_id: String,
    pub confirmation_round: u32,
    pub tasks: Vec<TaskSpec>,
    pub options: Vec<Action>,
    pub timeout_seconds: u64,
    /// RFC 3339, UTC.
    pub expires_at: String,
    pub risk_level: RiskLevel,
    /// This is the last round: `modify` is not offered.
    #[serde(default)]
    pub last_round: bool,
    /// Who decides, when more than one yes from anyone who may decide:
    /// how many distinct people (`required`, above 1) and the groups whose
    /// members alone decide (`approvers`).
    #[serde(default, skip_serializing_if = "is_one_or_less")]
    pub required: usize,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvers: Vec<String>,
    /// What silence does when it is not a cancel: `reject` (every task
    /// rejected, the run goes on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_timeout: Option<String>,
    /// Its escalation, when it has one: to whom, and when (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalate_to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalates_at: Option<String>,
}

pub(super) fn is_one_or_less(n: &usize) -> bool {
    *n <= 1
}

impl KindData for ConfirmationData {
    fn confirmation_id(&self) -> &str {
        &self.confirmation_id
    }

    fn expires_at(&self) -> &str {
        &self.expires_at
    }

    fn deciding(&self) -> Deciding<'_> {
        Deciding {
            required: self.required,
            groups: &self.approvers,
            on_timeout: self.on_timeout.as_deref(),
            expires_at: &self.expires_at,
            escalate_to: self.escalate_to.as_deref(),
            escalates_at: self.escalates_at.as_deref(),
        }
    }

    fn tasks_one_by_one(&self) -> &[TaskSpec] {
        &self.tasks
    }

    fn tasks(&self) -> &[TaskSpec] {
        &self.tasks
    }

    fn questions(&self) -> &[Question] {
        &[]
    }

    fn risk_level(&self) -> Option<RiskLevel> {
        Some(self.risk_level)
    }

    /// A plan is shown by its request's text.
    fn title(&self) -> Option<&str> {
        None
    }

    fn message(&self) -> Option<&str> {
        None
    }

    fn summary<'a>(&'a self, request: &'a str) -> Option<&'a str> {
        Some(request)
    }

    fn needs_others(&self) -> bool {
        !self.approvers.is_empty()
            || self.required > 1
            || self.tasks.iter().any(|t| t.required.is_some_and(|n| n > 1))
    }
}

impl KindWire for ConfirmationData {
    const KIND: PauseKind = PauseKind::Approval;
    const OFFERS: &'static [Action] = &Action::ALL;
    type Asked = Vec<TaskSpec>;

    fn asked(&self) -> Vec<TaskSpec> {
        self.tasks.clone()
    }

    fn kind_mut(&mut self) -> &mut PauseKind {
        &mut self.kind
    }
}

/// A plan's record keeps its tasks.
impl KindAsked for Vec<TaskSpec> {
    fn from_fields(fields: Fields) -> Self {
        fields.tasks
    }

    fn fields(&self) -> WrittenAsk<'_> {
        WrittenAsk {
            tasks: self,
            title: "",
            questions: &[],
        }
    }

    fn plan_tasks(&self) -> Option<&[TaskSpec]> {
        Some(self)
    }

    fn deciding_tasks(&self) -> Option<&[TaskSpec]> {
        Some(self)
    }
}
