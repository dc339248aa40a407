//! An approval, the first kind of pause: a plan put to the user. Its wire
//! type (the `confirmation_data` of a `confirmation_request`), what the
//! faces read of it, what a stored paused record keeps of it (its tasks)
//! and its AG-UI interrupts (one per open task). Its reply checks live in
//! `crate::pause::approval`, its chunks are built in `protocol/chunk.rs`.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::contract::{Deciding, Fields, KindAsked, KindData, KindWire, WrittenAsk};
use crate::protocol::agui::face::{
    task_interrupt_id, AguiFace, Interrupt, ResumeEntry, ResumeError, ResumeReply, ResumeStatus,
};
use crate::protocol::names::{Action, PauseKind, RiskLevel};
use crate::protocol::question::Question;
use crate::protocol::request::TaskDecisionRequest;
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

/// In AG-UI, a plan is an interrupt per task still open (`tool_approval`),
/// and a `resume` decides the tasks it names.
impl AguiFace for ConfirmationData {
    fn interrupts(&self, open: &[usize]) -> Vec<Interrupt> {
        self.tasks
            .iter()
            .filter(|task| open.contains(&task.index))
            .map(|task| task_interrupt(self, task))
            .collect()
    }

    fn reply_of(&self, open: &[usize], resume: &[ResumeEntry]) -> Result<ResumeReply, ResumeError> {
        decide_tasks(self, open, resume)
    }
}

fn task_interrupt(plan: &ConfirmationData, task: &TaskSpec) -> Interrupt {
    let id = task_interrupt_id(&plan.confirmation_id, task);
    let mut metadata = Map::new();
    metadata.insert("confirmation_id".into(), json!(plan.confirmation_id));
    metadata.insert("index".into(), json!(task.index));
    metadata.insert("tool".into(), json!(task.tool));
    metadata.insert("args".into(), task.args.clone().unwrap_or(json!({})));
    metadata.insert("risk_level".into(), json!(task.risk_level));
    metadata.insert("decisions".into(), json!(task.decisions));
    if let Some(preview) = &task.preview {
        metadata.insert("preview".into(), json!(preview));
    }
    if let Some(required) = task.required {
        metadata.insert("required".into(), json!(required));
        metadata.insert("approvals".into(), json!(task.approvals));
    }
    if !plan.approvers.is_empty() {
        metadata.insert("approvers".into(), json!(plan.approvers));
    }
    Interrupt {
        message: format!("Approve {}: {}?", task.tool, task.description),
        tool_call_id: Some(id.clone()),
        response_schema: task
            .response_schema
            .as_ref()
            .map(crate::protocol::task_spec::Schema::to_value)
            .unwrap_or_else(
                || json!({"type": "object", "properties": {"decision": {"type": "string"}}}),
            ),
        expires_at: task
            .expires_at
            .clone()
            .unwrap_or_else(|| plan.expires_at.clone()),
        id,
        reason: "tool_approval",
        metadata,
    }
}

fn decide_tasks(
    plan: &ConfirmationData,
    open: &[usize],
    resume: &[ResumeEntry],
) -> Result<ResumeReply, ResumeError> {
    let mut decisions = Vec::with_capacity(resume.len());
    let mut cancelled = Vec::new();
    for entry in resume {
        let task = plan
            .tasks
            .iter()
            .find(|task| task_interrupt_id(&plan.confirmation_id, task) == entry.interrupt_id)
            .ok_or_else(|| ResumeError::Unknown(entry.interrupt_id.clone()))?;
        let decision = match (entry.status, &entry.payload) {
            (ResumeStatus::Cancelled, _) => {
                cancelled.push(task.index);
                rejected(Some("cancelled".to_owned()))
            }
            (ResumeStatus::Resolved, Some(payload)) => task_decision(payload)?,
            (ResumeStatus::Resolved, None) => {
                return Err(ResumeError::Decision(format!(
                    "interrupt {} is resolved without a payload: send a decision object \
                     (its responseSchema) or {{\"approved\": true}}",
                    entry.interrupt_id
                )))
            }
        };
        decisions.push(TaskDecisionRequest {
            task_id: Some(entry.interrupt_id.clone()),
            ..decision
        });
    }
    let all_cancelled = !open.is_empty() && open.iter().all(|index| cancelled.contains(index));
    if all_cancelled && cancelled.len() == resume.len() {
        return Ok(ResumeReply::action("cancel"));
    }
    Ok(ResumeReply {
        decisions: Some(decisions),
        ..ResumeReply::action("decide")
    })
}

fn rejected(reason: Option<String>) -> TaskDecisionRequest {
    TaskDecisionRequest {
        index: None,
        task_id: None,
        decision: "reject".to_owned(),
        reason,
        args: None,
        result: None,
        preview_digest: None,
    }
}

/// A payload as a task's decision: chatgate's decision object, or AG-UI's
/// `{"approved": bool, "editedArgs": {...}, "reason": "..."}`.
fn task_decision(payload: &Value) -> Result<TaskDecisionRequest, ResumeError> {
    let invalid = |why: String| ResumeError::Decision(why);
    if payload.get("decision").is_some() {
        return serde_json::from_value(payload.clone())
            .map_err(|err| invalid(format!("the payload is not a decision object: {err}")));
    }
    let Some(approved) = payload.get("approved").and_then(Value::as_bool) else {
        return Err(invalid(
            "the payload has neither `decision` (see the interrupt's responseSchema) nor a \
             boolean `approved`"
                .to_owned(),
        ));
    };
    let reason = payload
        .get("reason")
        .and_then(Value::as_str)
        .map(str::to_owned);
    if !approved {
        return Ok(rejected(reason));
    }
    let edited = payload.get("editedArgs").filter(|args| !args.is_null());
    Ok(TaskDecisionRequest {
        decision: if edited.is_some() { "edit" } else { "approve" }.to_owned(),
        args: edited.cloned(),
        ..rejected(None)
    })
}
