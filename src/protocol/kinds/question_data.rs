//! Questions, the second kind of pause (#16): their wire type (the
//! `confirmation_data` of an `input_request`), what the faces read of it,
//! what a stored paused record keeps of it ([`Asked`]) and its AG-UI
//! interrupts (one per question). Questions
//! themselves, their bounds and answers live in `protocol/question.rs`,
//! the reply checks in `crate::pause::questions`.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::contract::{Deciding, Fields, KindAsked, KindData, KindWire, WrittenAsk};
use crate::protocol::agui::face::{
    AguiFace, Interrupt, ResumeEntry, ResumeError, ResumeReply, ResumeStatus,
};
use crate::protocol::names::{Action, PauseKind, RiskLevel};
use crate::protocol::question::Question;
use crate::protocol::task_spec::TaskSpec;

/// The `confirmation_data` object of an `input_request` chunk: questions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuestionData {
    /// Always `question`.
    #[serde(default)]
    pub kind: PauseKind,
    pub confirmation_id: String,
    pub title: String,
    pub questions: Vec<Question>,
    /// Always `answer`, `skip`, `cancel`.
    pub options: Vec<Action>,
    pub timeout_seconds: u64,
    /// RFC 3339, UTC.
    pub expires_at: String,
}

impl KindData for QuestionData {
    fn confirmation_id(&self) -> &str {
        &self.confirmation_id
    }

    fn expires_at(&self) -> &str {
        &self.expires_at
    }

    /// One reply from anyone who may decide; silence cancels.
    fn deciding(&self) -> Deciding<'_> {
        Deciding::one_reply(&self.expires_at)
    }

    fn tasks_one_by_one(&self) -> &[TaskSpec] {
        &[]
    }

    fn tasks(&self) -> &[TaskSpec] {
        &[]
    }

    fn questions(&self) -> &[Question] {
        &self.questions
    }

    fn risk_level(&self) -> Option<RiskLevel> {
        None
    }

    fn title(&self) -> Option<&str> {
        Some(&self.title)
    }

    fn message(&self) -> Option<&str> {
        None
    }

    /// Nothing beyond their title.
    fn summary<'a>(&'a self, _request: &'a str) -> Option<&'a str> {
        None
    }

    fn needs_others(&self) -> bool {
        false
    }
}

impl KindWire for QuestionData {
    const KIND: PauseKind = PauseKind::Question;
    const OFFERS: &'static [Action] = &Action::QUESTION;
    type Asked = Asked;

    fn asked(&self) -> Asked {
        Asked {
            title: self.title.clone(),
            questions: self.questions.clone(),
        }
    }

    fn kind_mut(&mut self) -> &mut PauseKind {
        &mut self.kind
    }
}

/// What a question pause's record keeps: its questions and the title they
/// were put under.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Asked {
    pub title: String,
    pub questions: Vec<Question>,
}

impl KindAsked for Asked {
    fn from_fields(fields: Fields) -> Self {
        Asked {
            title: fields.title,
            questions: fields.questions,
        }
    }

    fn fields(&self) -> WrittenAsk<'_> {
        WrittenAsk {
            tasks: &[],
            title: &self.title,
            questions: &self.questions,
        }
    }

    fn plan_tasks(&self) -> Option<&[TaskSpec]> {
        None
    }

    fn deciding_tasks(&self) -> Option<&[TaskSpec]> {
        None
    }
}

/// In AG-UI, questions are an interrupt each (`question`), and a `resume`
/// answers the ones it names.
impl AguiFace for QuestionData {
    fn interrupts(&self, _open: &[usize]) -> Vec<Interrupt> {
        self.questions
            .iter()
            .map(|question| question_interrupt(self, question))
            .collect()
    }

    fn reply_of(
        &self,
        _open: &[usize],
        resume: &[ResumeEntry],
    ) -> Result<ResumeReply, ResumeError> {
        answer_questions(self, resume)
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
