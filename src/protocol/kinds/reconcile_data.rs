//! The wire types of a reconcile pause (#44): the `confirmation_data` of
//! the `input_request` that asks whether a call a crash cut short took
//! effect, what the faces read of it, what a stored record keeps of it and
//! its AG-UI interrupt (its chunks are built in `protocol/chunk.rs`).

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::confirmation_data::is_one_or_less;
use super::contract::{Deciding, Fields, KindAsked, KindData, KindWire, WrittenAsk};
use crate::protocol::agui::face::{
    AguiFace, Interrupt, ResumeEntry, ResumeError, ResumeReply, ResumeStatus,
};
use crate::protocol::names::{Action, PauseKind, RiskLevel};
use crate::protocol::question::Question;
use crate::protocol::task_spec::TaskSpec;

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

impl KindData for ReconcileData {
    fn confirmation_id(&self) -> &str {
        &self.confirmation_id
    }

    fn expires_at(&self) -> &str {
        &self.expires_at
    }

    /// Decided as its task's approval was; silence cancels.
    fn deciding(&self) -> Deciding<'_> {
        Deciding {
            required: self.required,
            groups: &self.approvers,
            ..Deciding::one_reply(&self.expires_at)
        }
    }

    /// Decided whole.
    fn tasks_one_by_one(&self) -> &[TaskSpec] {
        &[]
    }

    fn tasks(&self) -> &[TaskSpec] {
        std::slice::from_ref(&*self.task)
    }

    fn questions(&self) -> &[Question] {
        &[]
    }

    fn risk_level(&self) -> Option<RiskLevel> {
        Some(self.risk_level)
    }

    fn title(&self) -> Option<&str> {
        Some(&self.title)
    }

    /// What happened and what each option does.
    fn message(&self) -> Option<&str> {
        Some(&self.message)
    }

    fn summary<'a>(&'a self, _request: &'a str) -> Option<&'a str> {
        Some(&self.message)
    }

    fn needs_others(&self) -> bool {
        !self.approvers.is_empty() || self.required > 1
    }
}

impl KindWire for ReconcileData {
    const KIND: PauseKind = PauseKind::Reconcile;
    const OFFERS: &'static [Action] = &Action::RECONCILE;
    type Asked = Box<TaskSpec>;

    fn asked(&self) -> Box<TaskSpec> {
        self.task.clone()
    }

    fn kind_mut(&mut self) -> &mut PauseKind {
        &mut self.kind
    }
}

/// A reconcile pause's record keeps its call's task (it is never stored:
/// asked again from its call's journal entry; read back all the same).
impl KindAsked for Box<TaskSpec> {
    fn from_fields(fields: Fields) -> Self {
        Box::new(fields.tasks.into_iter().next().unwrap_or_default())
    }

    fn fields(&self) -> WrittenAsk<'_> {
        WrittenAsk {
            tasks: std::slice::from_ref(&**self),
            title: "",
            questions: &[],
        }
    }

    fn plan_tasks(&self) -> Option<&[TaskSpec]> {
        None
    }

    fn deciding_tasks(&self) -> Option<&[TaskSpec]> {
        Some(std::slice::from_ref(&**self))
    }
}

/// In AG-UI, a reconcile pause is one interrupt (`reconcile`), resumed
/// with the action to take.
impl AguiFace for ReconcileData {
    fn interrupts(&self, _open: &[usize]) -> Vec<Interrupt> {
        vec![reconcile_interrupt(self)]
    }

    fn reply_of(
        &self,
        _open: &[usize],
        resume: &[ResumeEntry],
    ) -> Result<ResumeReply, ResumeError> {
        reconcile(self, resume)
    }
}

fn reconcile_interrupt(data: &ReconcileData) -> Interrupt {
    let mut metadata = Map::new();
    metadata.insert("confirmation_id".into(), json!(data.confirmation_id));
    metadata.insert("tool".into(), json!(data.task.tool));
    metadata.insert("args".into(), data.task.args.clone().unwrap_or(json!({})));
    metadata.insert("idempotency_key".into(), json!(data.idempotency_key));
    metadata.insert("started_at".into(), json!(data.started_at));
    metadata.insert("attempt".into(), json!(data.attempt));
    metadata.insert("risk_level".into(), json!(data.risk_level));
    Interrupt {
        id: data.confirmation_id.clone(),
        reason: "reconcile",
        message: data.message.clone(),
        tool_call_id: None,
        response_schema: json!({
            "type": "object",
            "properties": {"action": {"enum": ["run_again", "skip"]}},
            "required": ["action"],
        }),
        expires_at: data.expires_at.clone(),
        metadata,
    }
}

fn reconcile(data: &ReconcileData, resume: &[ResumeEntry]) -> Result<ResumeReply, ResumeError> {
    let [entry] = resume else {
        return Err(ResumeError::Decision(
            "a reconcile pause has one interrupt: resume it alone".to_owned(),
        ));
    };
    if entry.interrupt_id != data.confirmation_id {
        return Err(ResumeError::Unknown(entry.interrupt_id.clone()));
    }
    if entry.status == ResumeStatus::Cancelled {
        return Ok(ResumeReply::action("cancel"));
    }
    let action = match &entry.payload {
        Some(Value::String(action)) => Some(action.as_str()),
        Some(payload) => payload.get("action").and_then(Value::as_str),
        None => None,
    };
    match action {
        Some(action @ ("run_again" | "skip" | "cancel")) => Ok(ResumeReply::action(action)),
        _ => Err(ResumeError::Decision(
            "a reconcile interrupt is resolved with {\"action\": \"run_again\"} or \
             {\"action\": \"skip\"}"
                .to_owned(),
        )),
    }
}
