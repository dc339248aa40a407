//! Questions, the second kind of pause (#16): their wire type (the
//! `confirmation_data` of an `input_request`), what the faces read of it
//! and what a stored paused record keeps of it ([`Asked`]). Questions
//! themselves, their bounds and answers live in `protocol/question.rs`,
//! the reply checks in `crate::pause::questions`.

use serde::{Deserialize, Serialize};

use super::contract::{Deciding, Fields, KindAsked, KindData, KindWire, WrittenAsk};
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
