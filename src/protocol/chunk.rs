//! The chunk: one JSON object on the stream, and one constructor per kind
//! of chunk the server builds in more than one place; how a pause's data
//! is read back by its `kind` (its types live in `protocol/kinds/`) and the
//! verdicts a confirm gives its tasks.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::kinds::confirmation_data::ConfirmationData;
use super::kinds::question_data::QuestionData;
use super::kinds::reconcile_data::ReconcileData;
use super::kinds::PauseData;
use super::names::{meta, Action, CancelReason, ChunkType, ErrorType, PauseKind, TaskState};
pub use super::task_spec::{ApprovedBy, TaskPreview, TaskSpec};

/// Most tasks one plan may put to the user; a larger plan ends the run with
/// `plan_too_large` before anything is asked. Each task is a decision of
/// its own (#42), and a pause's per-task state is bounded by it.
pub const MAX_PLAN_TASKS: usize = 64;
/// Largest `confirmation_data` of one request, in bytes of JSON: what a
/// paused run holds for its pause (`plan_too_large` beyond it).
pub const MAX_CONFIRMATION_BYTES: usize = 128 * 1024;

/// What was decided for one task of a confirmed plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum Verdict {
    /// Runs as proposed.
    Approve,
    /// Does not run; the engine may tell why.
    Reject {
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Runs with these arguments instead (checked against the tool's schema).
    Edit { args: Value },
    /// Does not run; `result` stands in for its output.
    Respond { result: String },
}

impl Verdict {
    /// Its `decision` word.
    pub fn as_str(&self) -> &'static str {
        match self {
            Verdict::Approve => "approve",
            Verdict::Reject { .. } => "reject",
            Verdict::Edit { .. } => "edit",
            Verdict::Respond { .. } => "respond",
        }
    }

    /// The state it gives its task.
    pub fn state(&self) -> TaskState {
        match self {
            Verdict::Approve => TaskState::Approved,
            Verdict::Reject { .. } => TaskState::Rejected,
            Verdict::Edit { .. } => TaskState::Edited,
            Verdict::Respond { .. } => TaskState::Responded,
        }
    }
}

/// A task's verdict, with the task's index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskDecision {
    pub index: usize,
    #[serde(flatten)]
    pub verdict: Verdict,
}

/// The verdicts of a confirmed plan, one per task, in task order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Decisions(pub Vec<TaskDecision>);

impl Decisions {
    /// Every one of `tasks` tasks approved.
    pub fn approve_all(tasks: usize) -> Decisions {
        Decisions(
            (1..=tasks)
                .map(|index| TaskDecision {
                    index,
                    verdict: Verdict::Approve,
                })
                .collect(),
        )
    }

    /// The verdict this decision names for task `index`, if it names one.
    pub fn named(&self, index: usize) -> Option<&Verdict> {
        self.0.iter().find(|d| d.index == index).map(|d| &d.verdict)
    }

    /// The verdict for task `index` (approved unless said otherwise).
    pub fn verdict(&self, index: usize) -> &Verdict {
        self.0
            .iter()
            .find(|d| d.index == index)
            .map_or(&Verdict::Approve, |d| &d.verdict)
    }
}

/// How a receipt's decision came: the door it took, or what allowed the
/// call without a person.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Via {
    /// A reply on the chat endpoint (a client, the page, a CLI).
    #[default]
    Chat,
    /// A decision link's page.
    Link,
    /// A Slack button.
    Slack,
    /// An AG-UI run's `resume` (`POST /api/v1/agui`).
    Agui,
    /// An A2A message to a task, or its cancel (`POST /a2a`).
    A2a,
    /// A person's grant covered the call.
    Grant,
    /// An allow rule of the tools file.
    Rule,
}

impl Via {
    pub fn is_chat(&self) -> bool {
        *self == Via::Chat
    }
}

/// How a task of a decided pause went on after a crash (#44).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResumedHow {
    /// It had finished: its output shown again, not run.
    Replayed,
    /// Called again with the same key (`idempotent`, or its `reconcile`
    /// said it had not taken effect).
    Reran,
    /// Its `reconcile` said it had taken effect: not run again.
    Reconciled,
    /// Nobody could know: a person chose (`reconcile` pause).
    Asked,
}

impl<'de> Deserialize<'de> for PauseData {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<PauseData, D::Error> {
        deserializer.deserialize_map(PauseDataVisitor)
    }
}

/// Reads a pause's data by its `kind`. This server writes `kind` first: it
/// is read, and the rest goes straight into its kind's type (one pass, no
/// tree of values in between: a face reads every pause it answers). An
/// object whose first key is another (an older version's record, a map
/// in key order) is read whole, then by its `kind`.
struct PauseDataVisitor;

impl<'de> serde::de::Visitor<'de> for PauseDataVisitor {
    type Value = PauseData;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a pause's confirmation_data object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<PauseData, A::Error> {
        use serde::de::value::MapAccessDeserializer;
        use serde::de::Error;
        let first = map.next_key::<String>()?;
        if first.as_deref() == Some("kind") {
            let kind: PauseKind = map.next_value()?;
            return PauseData::of_kind(kind, MapAccessDeserializer::new(map));
        }
        let mut object = Map::new();
        if let Some(first) = first {
            object.insert(first, map.next_value()?);
            while let Some((key, value)) = map.next_entry::<String, Value>()? {
                object.insert(key, value);
            }
        }
        let object = Value::Object(object);
        let kind = match object.get("kind") {
            Some(kind) => PauseKind::deserialize(kind).map_err(A::Error::custom)?,
            None => PauseKind::default(),
        };
        PauseData::of_kind(kind, object).map_err(A::Error::custom)
    }
}

/// One JSON object on the stream, written as one `data:` line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Chunk {
    pub chunk: String,
    pub session_id: String,
    pub finished: bool,
    pub chunk_type: ChunkType,
    pub metadata: Map<String, Value>,
    pub confirmation_data: Option<PauseData>,
    pub requires_response: bool,
    pub stream_paused: bool,
    pub sequence: u64,
}

impl Chunk {
    /// A plain chunk; callers set the flags that differ.
    pub fn new(
        chunk_type: ChunkType,
        text: impl Into<String>,
        session_id: &str,
        sequence: u64,
    ) -> Chunk {
        Chunk {
            chunk: text.into(),
            session_id: session_id.to_owned(),
            finished: false,
            chunk_type,
            metadata: Map::new(),
            confirmation_data: None,
            requires_response: false,
            stream_paused: false,
            sequence,
        }
    }

    /// The plan of a `confirmation_request`.
    pub fn approval(&self) -> Option<&ConfirmationData> {
        match &self.confirmation_data {
            Some(PauseData::Approval(data)) => Some(data),
            _ => None,
        }
    }

    /// The questions of an `input_request`.
    pub fn questions(&self) -> Option<&QuestionData> {
        match &self.confirmation_data {
            Some(PauseData::Question(data)) => Some(data),
            _ => None,
        }
    }

    pub fn with_meta(mut self, key: &str, value: impl Into<Value>) -> Chunk {
        self.metadata.insert(key.to_owned(), value.into());
        self
    }

    pub fn finished(mut self) -> Chunk {
        self.finished = true;
        self
    }

    /// Some tasks of a pause decided on their own (`decide`, #42): what
    /// was decided (`decisions`) and the tasks still pending (`pending`).
    pub fn decision_recorded(
        session_id: &str,
        confirmation_id: &str,
        decisions: &Decisions,
        pending: &[usize],
    ) -> Chunk {
        let named: Vec<String> = decisions.0.iter().map(|d| d.index.to_string()).collect();
        let text = format!(
            "Decided task(s) {}; {} still pending",
            named.join(", "),
            pending.len()
        );
        Chunk::new(ChunkType::DecisionRecorded, text, session_id, 0)
            .with_meta(meta::CONFIRMATION_ID, confirmation_id)
            .with_meta(
                meta::DECISIONS,
                serde_json::to_value(decisions).unwrap_or_default(),
            )
            .with_meta(meta::PENDING, pending.to_vec())
    }

    /// `confirmation_received`: a decision was taken on a confirmation
    /// (with the verdict per task for a confirm).
    pub fn confirmation_received(
        session_id: &str,
        text: String,
        action: Action,
        confirmation_id: &str,
        round: u32,
        decisions: Option<&Decisions>,
    ) -> Chunk {
        let mut chunk = Chunk::new(ChunkType::ConfirmationReceived, text, session_id, 0)
            .with_meta(meta::ACTION, action.as_str())
            .with_meta(meta::CONFIRMATION_ID, confirmation_id)
            .with_meta(meta::CONFIRMATION_ROUND, round);
        if let Some(decisions) = decisions {
            chunk = chunk.with_meta(
                meta::DECISIONS,
                serde_json::to_value(decisions).unwrap_or_default(),
            );
        }
        chunk
    }

    /// With `approved_by` (a quorum's labels, when more than one approved).
    pub fn with_approvers(self, approved_by: &[String]) -> Chunk {
        if approved_by.len() > 1 {
            self.with_meta(meta::APPROVED_BY_LABELS, approved_by.to_vec())
        } else {
            self
        }
    }

    /// `confirmation_request`: the run pauses on `data`.
    pub fn confirmation_request(
        session_id: &str,
        summary: String,
        data: ConfirmationData,
    ) -> Chunk {
        let mut chunk = Chunk::new(ChunkType::ConfirmationRequest, summary, session_id, 0)
            .with_meta(meta::TOTAL_TASKS, data.tasks.len())
            .with_meta(meta::RISK_LEVEL, data.risk_level.as_str())
            .with_meta(meta::TIMEOUT_SECONDS, data.timeout_seconds)
            .with_meta(meta::CONFIRMATION_ROUND, data.confirmation_round)
            .with_meta(meta::CONFIRMATION_ID, data.confirmation_id.as_str());
        if data.last_round {
            chunk = chunk.with_meta(meta::LAST_ROUND, true);
        }
        chunk.confirmation_data = Some(PauseData::Approval(data));
        chunk.requires_response = true;
        chunk.stream_paused = true;
        chunk
    }

    /// `input_request`: the run pauses on questions.
    pub fn input_request(session_id: &str, data: QuestionData) -> Chunk {
        let mut chunk = Chunk::new(ChunkType::InputRequest, &*data.title, session_id, 0)
            .with_meta(meta::CONFIRMATION_ID, data.confirmation_id.as_str())
            .with_meta(meta::KIND, data.kind.as_str())
            .with_meta(meta::TIMEOUT_SECONDS, data.timeout_seconds)
            .with_meta(meta::TOTAL_QUESTIONS, data.questions.len());
        chunk.confirmation_data = Some(PauseData::Question(data));
        chunk.requires_response = true;
        chunk.stream_paused = true;
        chunk
    }

    /// `input_request`: the run pauses on a call a crash cut short.
    pub fn reconcile_request(session_id: &str, data: ReconcileData) -> Chunk {
        let mut chunk = Chunk::new(ChunkType::InputRequest, &*data.title, session_id, 0)
            .with_meta(meta::CONFIRMATION_ID, data.confirmation_id.as_str())
            .with_meta(meta::KIND, data.kind.as_str())
            .with_meta(meta::TIMEOUT_SECONDS, data.timeout_seconds)
            .with_meta(meta::RISK_LEVEL, data.risk_level.as_str())
            .with_meta(meta::IDEMPOTENCY_KEY, data.idempotency_key.as_str());
        chunk.confirmation_data = Some(PauseData::Reconcile(Box::new(data)));
        chunk.requires_response = true;
        chunk.stream_paused = true;
        chunk
    }

    /// `confirmation_received` of a reconcile pause: its action.
    pub fn reconcile_received(
        session_id: &str,
        text: String,
        action: Action,
        confirmation_id: &str,
    ) -> Chunk {
        Chunk::new(ChunkType::ConfirmationReceived, text, session_id, 0)
            .with_meta(meta::ACTION, action.as_str())
            .with_meta(meta::CONFIRMATION_ID, confirmation_id)
            .with_meta(meta::KIND, PauseKind::Reconcile.as_str())
    }

    /// `confirmation_received` of a question pause: its action and, for
    /// `answer`, the normalized answers.
    pub fn questions_answered(
        session_id: &str,
        text: String,
        action: Action,
        confirmation_id: &str,
        answers: Option<&Map<String, Value>>,
    ) -> Chunk {
        let mut chunk = Chunk::new(ChunkType::ConfirmationReceived, text, session_id, 0)
            .with_meta(meta::ACTION, action.as_str())
            .with_meta(meta::CONFIRMATION_ID, confirmation_id)
            .with_meta(meta::KIND, PauseKind::Question.as_str());
        if let Some(answers) = answers {
            chunk = chunk.with_meta(meta::ANSWERS, Value::Object(answers.clone()));
        }
        chunk
    }

    /// The final `cancelled` chunk.
    pub fn cancelled(session_id: &str, reason: CancelReason) -> Chunk {
        Chunk::new(ChunkType::Cancelled, reason.text(), session_id, 0)
            .with_meta(meta::REASON, reason.as_str())
            .finished()
    }

    /// The final `error` chunk of a failed run or a refused request.
    pub fn failed(session_id: &str, error_type: ErrorType, message: String) -> Chunk {
        Chunk::new(ChunkType::Error, message, session_id, 0)
            .with_meta(meta::ERROR_TYPE, error_type.as_str())
            .finished()
    }

    /// The final `completion` chunk.
    pub fn completion(session_id: &str, text: String, metadata: Map<String, Value>) -> Chunk {
        let mut chunk = Chunk::new(ChunkType::Completion, text, session_id, 0).finished();
        chunk.metadata = metadata;
        chunk
    }
}

/// The length of `value`'s JSON encoding, in bytes, without building it.
pub fn json_len(value: &impl Serialize) -> usize {
    struct ByteCount(usize);
    impl std::io::Write for ByteCount {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = ByteCount(0);
    // Counting cannot fail; a value that cannot serialize counts what it wrote.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pause_data_written_kind_first_reads_as_read_whole() {
        let question = json!({"kind": "question", "confirmation_id": "q", "title": "t",
            "questions": [], "options": ["answer"], "timeout_seconds": 1, "expires_at": "x"});
        let approval = json!({"kind": "approval", "confirmation_id": "c", "confirmation_round": 0,
            "tasks": [], "options": ["confirm"], "timeout_seconds": 1, "expires_at": "x",
            "risk_level": "low", "last_round": false});
        for value in [question, approval] {
            let whole: PauseData = serde_json::from_value(value.clone()).unwrap();
            let text = serde_json::to_string(&whole).unwrap();
            assert!(text.starts_with("{\"kind\":"), "{text}");
            let streamed: PauseData = serde_json::from_str(&text).unwrap();
            assert_eq!(streamed, whole);
            assert_eq!(serde_json::to_value(&streamed).unwrap(), value);
        }
        // Kind first, the rest of another kind's shape: refused, not guessed.
        let wrong = r#"{"kind":"question","confirmation_id":"c","confirmation_round":0}"#;
        assert!(serde_json::from_str::<PauseData>(wrong).is_err());
    }

    #[test]
    fn pause_data_is_read_by_its_kind_and_no_kind_is_an_approval() {
        let approval = json!({"confirmation_id": "c", "confirmation_round": 0, "tasks": [],
            "options": ["confirm"], "timeout_seconds": 1, "expires_at": "x", "risk_level": "low"});
        let data: PauseData = serde_json::from_value(approval.clone()).unwrap();
        assert_eq!(
            data.kind(),
            PauseKind::Approval,
            "an older version's: no kind"
        );
        let mut tagged = approval.clone();
        tagged["kind"] = json!("approval");
        assert_eq!(serde_json::from_value::<PauseData>(tagged).unwrap(), data);

        let question = json!({"kind": "question", "confirmation_id": "q", "title": "t",
            "questions": [], "options": ["answer"], "timeout_seconds": 1, "expires_at": "x"});
        let data: PauseData = serde_json::from_value(question.clone()).unwrap();
        assert_eq!(data.kind(), PauseKind::Question);
        assert_eq!(serde_json::to_value(&data).unwrap(), question);
        // A question pause missing its questions is no approval either.
        let mut broken = question;
        broken.as_object_mut().unwrap().remove("questions");
        let err = serde_json::from_value::<PauseData>(broken).unwrap_err();
        assert!(err.to_string().contains("questions"), "{err}");
    }
}
