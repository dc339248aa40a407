//! A pause as AG-UI interrupts, and a `resume` as the reply the decision
//! path takes. An interrupt's id begins with its pause's
//! `confirmation_id`:
//!
//! - an approval's task: its `task_id` (`<confirmation_id>-t<index>`),
//!   reason `tool_approval`, payload a decision object per the task's
//!   `response_schema` (or AG-UI's `{approved, editedArgs, reason}`);
//! - a question: `<confirmation_id>-q-<question id>`, reason `question`,
//!   payload the answer;
//! - a reconcile pause: its `confirmation_id`, reason `reconcile`, payload
//!   `{"action": "run_again" | "skip"}`.
//!
//! `cancelled` rejects a task (every open task cancelled: the run is
//! cancelled), leaves a question unanswered (every one: `skip`), and
//! cancels a reconcile pause's run.

use serde_json::{json, Map, Value};

use super::{Interrupt, ResumeEntry, ResumeStatus};
use crate::protocol::question::Question;
use crate::protocol::{
    ConfirmationData, PauseData, QuestionData, ReconcileData, TaskDecisionRequest, TaskSpec,
};

/// Length of a `confirmation_id` (a UUID's text).
const CONFIRMATION_ID_LEN: usize = 36;

/// The pause an interrupt id names: its leading `confirmation_id`.
pub fn confirmation_id_of(interrupt_id: &str) -> &str {
    interrupt_id
        .get(..CONFIRMATION_ID_LEN)
        .unwrap_or(interrupt_id)
}

/// The interrupts of `pause`: for an approval, one per task still open
/// (`open`: the indexes the pause still waits on).
pub fn interrupts(pause: &PauseData, open: &[usize]) -> Vec<Interrupt> {
    match pause {
        PauseData::Approval(plan) => plan
            .tasks
            .iter()
            .filter(|task| open.contains(&task.index))
            .map(|task| task_interrupt(plan, task))
            .collect(),
        PauseData::Question(asked) => asked
            .questions
            .iter()
            .map(|question| question_interrupt(asked, question))
            .collect(),
        PauseData::Reconcile(data) => vec![reconcile_interrupt(data)],
    }
}

/// A task's interrupt id (its `task_id`).
pub fn task_interrupt_id(confirmation_id: &str, task: &TaskSpec) -> String {
    task.task_id
        .clone()
        .unwrap_or_else(|| format!("{confirmation_id}-t{}", task.index))
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
            .map(crate::protocol::Schema::to_value)
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

fn question_interrupt(asked: &QuestionData, question: &Question) -> Interrupt {
    let mut metadata = Map::new();
    metadata.insert("confirmation_id".into(), json!(asked.confirmation_id));
    metadata.insert("question_id".into(), json!(question.id));
    metadata.insert("header".into(), json!(question.header));
    metadata.insert("options".into(), json!(question.options));
    metadata.insert("multi_select".into(), json!(question.multi_select));
    metadata.insert("allow_other".into(), json!(question.allow_other));
    metadata.insert("required".into(), json!(question.required));
    Interrupt {
        id: format!("{}-q-{}", asked.confirmation_id, question.id),
        reason: "question",
        message: question.question.clone(),
        tool_call_id: None,
        response_schema: answer_schema(question),
        expires_at: asked.expires_at.clone(),
        metadata,
    }
}

/// The schema of one answer: the question's own, else a list of strings
/// (multi-select), one of the options (no other text), or a string.
fn answer_schema(question: &Question) -> Value {
    if let Some(schema) = &question.schema {
        return schema.clone();
    }
    if question.multi_select {
        return json!({"type": "array", "items": {"type": "string"}, "minItems": 1});
    }
    if !question.options.is_empty() && !question.allow_other {
        let names: Vec<&str> = question
            .options
            .iter()
            .flat_map(|o| [o.id.as_str(), o.label.as_str()])
            .collect();
        return json!({"type": "string", "enum": names});
    }
    json!({"type": "string"})
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

/// A `resume` as a reply: its `CONFIRM_ACTION` message and what it
/// carries.
#[derive(Debug, Clone, PartialEq)]
pub struct ResumeReply {
    pub message: String,
    pub decisions: Option<Vec<TaskDecisionRequest>>,
    pub answers: Option<Map<String, Value>>,
}

impl ResumeReply {
    fn action(action: &str) -> ResumeReply {
        ResumeReply {
            message: format!("CONFIRM_ACTION:{action}"),
            decisions: None,
            answers: None,
        }
    }
}

/// Why a `resume` cannot be a reply to the pause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResumeError {
    /// An interrupt id that is not one of the pause's.
    Unknown(String),
    /// A payload that is no decision (`invalid_decision`).
    Decision(String),
    /// A payload that is no answer (`invalid_answer`).
    Answer(String),
}

/// The reply `resume` makes to `pause`, whose open tasks are `open`.
pub fn reply_of(
    pause: &PauseData,
    open: &[usize],
    resume: &[ResumeEntry],
) -> Result<ResumeReply, ResumeError> {
    match pause {
        PauseData::Approval(plan) => decide_tasks(plan, open, resume),
        PauseData::Question(asked) => answer_questions(asked, resume),
        PauseData::Reconcile(data) => reconcile(data, resume),
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

fn answer_questions(
    asked: &QuestionData,
    resume: &[ResumeEntry],
) -> Result<ResumeReply, ResumeError> {
    let prefix = format!("{}-q-", asked.confirmation_id);
    let mut answers = Map::new();
    for entry in resume {
        let question = entry
            .interrupt_id
            .strip_prefix(&prefix)
            .filter(|id| asked.questions.iter().any(|q| q.id == *id))
            .ok_or_else(|| ResumeError::Unknown(entry.interrupt_id.clone()))?;
        if answers.contains_key(question) {
            return Err(ResumeError::Answer(format!(
                "question {question} is answered twice"
            )));
        }
        match (entry.status, &entry.payload) {
            (ResumeStatus::Resolved, Some(payload)) => {
                answers.insert(question.to_owned(), payload.clone());
            }
            (ResumeStatus::Resolved, None) => {
                return Err(ResumeError::Answer(format!(
                    "question {question} is resolved without an answer (payload)"
                )))
            }
            (ResumeStatus::Cancelled, _) => {}
        }
    }
    if answers.is_empty() {
        return Ok(ResumeReply::action("skip"));
    }
    Ok(ResumeReply {
        answers: Some(answers),
        ..ResumeReply::action("answer")
    })
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
