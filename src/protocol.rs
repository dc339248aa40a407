//! The wire contract of `POST /api/v1/chat/stream`: the request and its rules
//! ([`ChatRequest::validate`] turns a decoded body into a [`ValidRequest`]),
//! the chunk shape and one constructor per kind of chunk the server builds in
//! more than one place, and the spelling of every chunk type, metadata key,
//! error type and cancel reason.
//!
//! Pure data and parsing, no I/O. SSE framing lives in [`crate::sse`]; what the
//! handler does with a valid request lives in [`crate::http`].

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use strum::{EnumIter, IntoStaticStr};

/// Upper bound of a request body, in bytes (413 beyond it).
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Upper bound of `message`, in bytes of UTF-8 (400 beyond it).
pub const MAX_MESSAGE_BYTES: usize = 32 * 1024;
/// Upper bound of `session_id`, in characters.
pub const MAX_SESSION_ID_CHARS: usize = 128;
/// Prefix that turns a message into a confirmation reply, in any letter case.
pub const CONFIRM_PREFIX: &str = "CONFIRM_ACTION";
/// Most tasks one plan may put to the user; a larger plan ends the run with
/// `plan_too_large` before anything is asked.
pub const MAX_PLAN_TASKS: usize = 100;
/// Largest `confirmation_data` of one request, in bytes of JSON: what a
/// paused run holds for its pause (`plan_too_large` beyond it).
pub const MAX_CONFIRMATION_BYTES: usize = 128 * 1024;
/// Longest text of `CONFIRM_ACTION:modify:<text>`, in bytes: how much one
/// modify may grow a plan (422 `invalid_confirm_action` beyond it).
pub const MAX_MODIFY_TEXT_BYTES: usize = 4 * 1024;

/// Metadata keys, spelled once.
pub mod meta {
    pub const ACTION: &str = "action";
    pub const DECISIONS: &str = "decisions";
    pub const DURATION_MS: &str = "duration_ms";
    pub const ERROR: &str = "error";
    pub const RESULT: &str = "result";
    pub const RETRY_AFTER: &str = "retry_after";
    pub const SKIPPED: &str = "skipped";
    pub const TRUNCATED: &str = "truncated";
    pub const CONFIRMATION_ID: &str = "confirmation_id";
    pub const CONFIRMATION_ROUND: &str = "confirmation_round";
    pub const ERROR_TYPE: &str = "error_type";
    pub const FINISH_REASON: &str = "finish_reason";
    pub const GAP: &str = "gap";
    pub const LAST_ROUND: &str = "last_round";
    pub const MODEL: &str = "model";
    pub const OK: &str = "ok";
    pub const OPTIONS: &str = "options";
    pub const REASON: &str = "reason";
    pub const RISK_LEVEL: &str = "risk_level";
    pub const STEP: &str = "step";
    pub const TASKS_COMPLETED: &str = "tasks_completed";
    pub const TIMEOUT_SECONDS: &str = "timeout_seconds";
    pub const TOOL: &str = "tool";
    pub const TOTAL_TASKS: &str = "total_tasks";
}

/// The JSON body of a request. Unknown fields are ignored.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ChatRequest {
    pub message: Option<String>,
    pub session_id: Option<String>,
    pub confirmation_id: Option<String>,
    /// A reply's decisions per task (see [`TaskDecisionRequest`]).
    pub decisions: Option<Vec<TaskDecisionRequest>>,
}

/// One entry of a reply's `decisions`, as sent: checked against the pending
/// confirmation by [`crate::confirmation`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TaskDecisionRequest {
    /// The task's `index` (1-based).
    pub index: u64,
    /// `approve`, `reject`, `edit` or `respond`.
    pub decision: String,
    pub reason: Option<String>,
    pub args: Option<Value>,
    pub result: Option<String>,
}

/// What was decided for one task of a confirmed plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
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

/// A task's verdict, with the task's index.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TaskDecision {
    pub index: usize,
    #[serde(flatten)]
    pub verdict: Verdict,
}

/// The verdicts of a confirmed plan, one per task, in task order.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
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

    /// The verdict for task `index` (approved unless said otherwise).
    pub fn verdict(&self, index: usize) -> &Verdict {
        self.0
            .iter()
            .find(|d| d.index == index)
            .map_or(&Verdict::Approve, |d| &d.verdict)
    }

    /// Whether any task was not simply approved.
    pub fn any_changed(&self) -> bool {
        self.0.iter().any(|d| d.verdict != Verdict::Approve)
    }
}

/// What a request asks for, once every rule of the request is checked.
#[derive(Debug, Clone, PartialEq)]
pub enum ValidRequest {
    /// A chat message: starts a run. Without `session_id` the server makes one.
    Chat {
        session_id: Option<String>,
        message: String,
    },
    /// A `CONFIRM_ACTION` reply to the paused run of `session_id`.
    Reply {
        session_id: String,
        reply: ReplyMessage,
        confirmation_id: Option<String>,
        decisions: Option<Vec<TaskDecisionRequest>>,
    },
    /// `Last-Event-ID`: re-attach to the run of `session_id` after `last_seen`.
    Reattach { session_id: String, last_seen: u64 },
}

/// Why a request breaks a rule of its own (before any state is consulted).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error(
        "session_id must be 1-{MAX_SESSION_ID_CHARS} characters of UTF-8 without control characters"
    )]
    BadSessionId,
    #[error("Last-Event-ID must be a chunk sequence number")]
    BadLastEventId,
    #[error("a re-attach (Last-Event-ID) needs the session_id of the run")]
    ReattachWithoutSession,
    #[error("message is required")]
    MissingMessage,
    #[error("message must not be empty")]
    EmptyMessage,
    #[error("message is longer than {MAX_MESSAGE_BYTES} bytes")]
    MessageTooLong,
    #[error("a reply needs session_id: the session of the paused run it answers")]
    ReplyWithoutSession,
    #[error("{0}")]
    MalformedReply(#[from] ReplySyntaxError),
}

impl ChatRequest {
    /// Checks the request's rules, in the documented order: the session id,
    /// then `Last-Event-ID` (a re-attach ignores `message`), then the
    /// message, then a reply's syntax.
    pub fn validate(self, last_event_id: Option<&[u8]>) -> Result<ValidRequest, RequestError> {
        if let Some(id) = &self.session_id {
            if !is_valid_session_id(id) {
                return Err(RequestError::BadSessionId);
            }
        }
        if let Some(value) = last_event_id {
            let last_seen = std::str::from_utf8(value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or(RequestError::BadLastEventId)?;
            let session_id = self
                .session_id
                .ok_or(RequestError::ReattachWithoutSession)?;
            return Ok(ValidRequest::Reattach {
                session_id,
                last_seen,
            });
        }
        let message = self.message.ok_or(RequestError::MissingMessage)?;
        if message.trim().is_empty() {
            return Err(RequestError::EmptyMessage);
        }
        if message.len() > MAX_MESSAGE_BYTES {
            return Err(RequestError::MessageTooLong);
        }
        match parse_reply(&message) {
            None => Ok(ValidRequest::Chat {
                session_id: self.session_id,
                message,
            }),
            Some(reply) => {
                let reply = reply?;
                let session_id = self.session_id.ok_or(RequestError::ReplyWithoutSession)?;
                Ok(ValidRequest::Reply {
                    session_id,
                    reply,
                    confirmation_id: self.confirmation_id,
                    decisions: self.decisions,
                })
            }
        }
    }
}

/// What a chunk is, as written in `chunk_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChunkType {
    TaskInit,
    Status,
    Content,
    ToolOutput,
    ConfirmationRequest,
    ConfirmationReceived,
    Completion,
    Cancelled,
    Error,
}

/// Why a run ended with a `cancelled` chunk, as written in `metadata.reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, IntoStaticStr, EnumIter)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum CancelReason {
    /// The user answered `cancel`.
    User,
    /// Nobody answered before the confirmation expired.
    Timeout,
    /// More modify rounds than `--max-rounds`.
    MaxRounds,
    /// A new chat message on the same session replaced the paused run.
    Superseded,
    /// The client of the stream went away.
    ClientGone,
    /// The server is shutting down.
    Shutdown,
    /// The attached client read so slowly that the replay buffer overflowed.
    SlowConsumer,
}

impl CancelReason {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The human text of a `cancelled` chunk.
    pub fn text(self) -> &'static str {
        match self {
            CancelReason::User => "Cancelled by the user; nothing was executed.",
            CancelReason::Timeout => {
                "No answer before the confirmation expired; nothing was executed."
            }
            CancelReason::MaxRounds => "Too many modify rounds; nothing was executed.",
            CancelReason::Superseded => "Superseded by a new message on this session.",
            CancelReason::ClientGone => "The client went away.",
            CancelReason::Shutdown => "The server is shutting down.",
            CancelReason::SlowConsumer => "The client read too slowly; the run was stopped.",
        }
    }
}

/// The `metadata.error_type` of an `error` chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, IntoStaticStr, EnumIter)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum ErrorType {
    InvalidRequest,
    NoPendingConfirmation,
    AlreadyDecided,
    StaleConfirmation,
    SessionBusy,
    PayloadTooLarge,
    UnsupportedMediaType,
    InvalidConfirmAction,
    TaskFailed,
    ShuttingDown,
    Overloaded,
    Unauthorized,
    ForbiddenOrigin,
    RequestTimeout,
    NoSuchRun,
    /// The engine's model server could not be reached or failed.
    EngineUnavailable,
    /// The model server sent more than chatgate accepts (an index, a line,
    /// arguments or text past a documented bound).
    EngineLimit,
    /// The plan has more than [`MAX_PLAN_TASKS`] tasks or more than
    /// [`MAX_CONFIRMATION_BYTES`] of confirmation data.
    PlanTooLarge,
    /// A plan's step would call a declared tool with arguments that do not
    /// fit its schema; nothing was asked.
    InvalidToolArgs,
    /// A reply's `decisions` do not fit the pending confirmation (422).
    InvalidDecision,
    /// The audit log cannot be written: nothing runs (fail closed).
    AuditUnavailable,
    /// The model kept calling tools past the calls a run may make.
    ToolCallLimit,
    /// The model server kept answering 429/503 within the call's deadline.
    RateLimited,
    /// The store (`--store`) cannot record a pause or a decision.
    StoreUnavailable,
    /// The decision was recorded but the process stopped before the run had
    /// acted on it all: after the restart the run is not run again.
    Interrupted,
    /// Without API keys, the `Host` header names neither loopback, the bound
    /// address nor an `--allowed-host` (DNS rebinding).
    ForbiddenHost,
    /// A method other than POST (or OPTIONS) on the chat endpoint.
    MethodNotAllowed,
    /// A request posing as a replica's (a wrong or unexpected cluster secret).
    ForbiddenReplica,
    /// The replica that owns the session's run cannot be reached (503).
    OwnerUnavailable,
    Internal,
}

impl ErrorType {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// An answer a user can give to a confirmation request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, IntoStaticStr, EnumIter)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Action {
    Confirm,
    Modify,
    Cancel,
}

impl Action {
    /// Every action, in the order offered by default.
    pub const ALL: [Action; 3] = [Action::Confirm, Action::Modify, Action::Cancel];

    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Parses an already trimmed, lower-cased action word.
    pub fn from_word(word: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.as_str() == word)
    }
}

/// How risky a plan is, as judged by the engine.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    IntoStaticStr,
    EnumIter,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum RiskLevel {
    Low,
    Medium,
    High,
}

impl RiskLevel {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// One step of a plan shown to the user for confirmation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskSpec {
    /// 1-based position in the plan.
    pub index: usize,
    pub description: String,
    pub tool: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub args: Option<Value>,
}

/// The `confirmation_data` object of a `confirmation_request` chunk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConfirmationData {
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
}

/// One JSON object on the stream, written as one `data:` line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Chunk {
    pub chunk: String,
    pub session_id: String,
    pub finished: bool,
    pub chunk_type: ChunkType,
    pub metadata: Map<String, Value>,
    pub confirmation_data: Option<ConfirmationData>,
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

    pub fn with_meta(mut self, key: &str, value: impl Into<Value>) -> Chunk {
        self.metadata.insert(key.to_owned(), value.into());
        self
    }

    pub fn finished(mut self) -> Chunk {
        self.finished = true;
        self
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
        chunk.confirmation_data = Some(data);
        chunk.requires_response = true;
        chunk.stream_paused = true;
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

/// True when `id` is 1-128 characters (of UTF-8, as every JSON string is)
/// and none is a control character. Any such id is safe on the wire: it
/// only ever leaves JSON-escaped.
pub fn is_valid_session_id(id: &str) -> bool {
    !id.is_empty()
        && id.chars().count() <= MAX_SESSION_ID_CHARS
        && !id.chars().any(char::is_control)
}

/// A syntactically valid `CONFIRM_ACTION` message. Whether the action is
/// offered, and whether `modify` has text, is judged against the pending
/// request (see [`crate::confirmation`]), because the order of checks puts
/// "nothing pending" (404) before "action not offered" (422).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyMessage {
    /// Trimmed and lower-cased; not necessarily a known action.
    pub action: String,
    /// Everything after the second colon, verbatim; `None` without one.
    pub text: Option<String>,
}

/// Why a `CONFIRM_ACTION` message could not be read at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplySyntaxError {
    #[error("expected `CONFIRM_ACTION:<action>[:<text>]`: the prefix must be followed by a colon")]
    MissingColon,
    #[error("expected `CONFIRM_ACTION:<action>[:<text>]`: the action is empty")]
    EmptyAction,
}

/// Classifies a chat message: `None` for ordinary chat, `Some(..)` for
/// anything that starts with [`CONFIRM_PREFIX`] in any letter case (a reply,
/// well-formed or not: `confirm_action:confirm` must not become a new plan).
pub fn parse_reply(message: &str) -> Option<Result<ReplyMessage, ReplySyntaxError>> {
    let prefix = message.get(..CONFIRM_PREFIX.len())?;
    if !prefix.eq_ignore_ascii_case(CONFIRM_PREFIX) {
        return None;
    }
    let rest = &message[CONFIRM_PREFIX.len()..];
    let Some(rest) = rest.strip_prefix(':') else {
        return Some(Err(ReplySyntaxError::MissingColon));
    };
    let (action, text) = match rest.split_once(':') {
        Some((action, text)) => (action, Some(text.to_owned())),
        None => (rest, None),
    };
    let action = action.trim().to_lowercase();
    if action.is_empty() {
        return Some(Err(ReplySyntaxError::EmptyAction));
    }
    Some(Ok(ReplyMessage { action, text }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(message: &str) -> ReplyMessage {
        parse_reply(message)
            .expect("is a reply")
            .expect("is well formed")
    }

    #[test]
    fn plain_chat_is_not_a_reply() {
        for message in ["hello", " CONFIRM_ACTION:confirm", "", "CONFIRM", "é"] {
            assert_eq!(parse_reply(message), None, "{message:?}");
        }
    }

    #[test]
    fn the_prefix_is_recognised_in_any_letter_case() {
        assert_eq!(ok("confirm_action:confirm").action, "confirm");
        assert_eq!(ok("Confirm_Action:Cancel").action, "cancel");
        assert_eq!(
            parse_reply("confirm_actionconfirm"),
            Some(Err(ReplySyntaxError::MissingColon))
        );
    }

    #[test]
    fn bare_actions_parse_case_insensitively_and_trimmed() {
        assert_eq!(ok("CONFIRM_ACTION:confirm").action, "confirm");
        assert_eq!(ok("CONFIRM_ACTION: Cancel ").action, "cancel");
        assert_eq!(ok("CONFIRM_ACTION:MODIFY:x").action, "modify");
        assert_eq!(ok("CONFIRM_ACTION:confirm").text, None);
    }

    #[test]
    fn text_is_everything_after_the_second_colon() {
        let reply = ok("CONFIRM_ACTION:modify:use a: b\nthen c:");
        assert_eq!(reply.action, "modify");
        assert_eq!(reply.text.as_deref(), Some("use a: b\nthen c:"));
        assert_eq!(ok("CONFIRM_ACTION:modify:").text.as_deref(), Some(""));
    }

    #[test]
    fn unknown_actions_still_parse_so_the_manager_can_reject_them_in_order() {
        assert_eq!(ok("CONFIRM_ACTION:launch").action, "launch");
    }

    #[test]
    fn malformed_replies_are_errors_not_chat() {
        let cases = [
            ("CONFIRM_ACTION", ReplySyntaxError::MissingColon),
            ("CONFIRM_ACTIONconfirm", ReplySyntaxError::MissingColon),
            ("CONFIRM_ACTION confirm", ReplySyntaxError::MissingColon),
            ("CONFIRM_ACTION:", ReplySyntaxError::EmptyAction),
            ("CONFIRM_ACTION:  ", ReplySyntaxError::EmptyAction),
            ("CONFIRM_ACTION::text", ReplySyntaxError::EmptyAction),
        ];
        for (message, expected) in cases {
            assert_eq!(parse_reply(message), Some(Err(expected)), "{message:?}");
        }
    }

    #[test]
    fn session_ids_are_any_text_of_1_to_128_characters_without_controls() {
        for good in [
            "abc-DEF_1.2:3",
            "user@example.com",
            "会话1",
            "my session",
            "a/b\"c",
        ] {
            assert!(is_valid_session_id(good), "{good:?}");
        }
        assert!(
            is_valid_session_id(&"é".repeat(128)),
            "characters, not bytes"
        );
        for bad in ["", "a\nb", "a\u{7f}", "tab\there", "\u{85}"] {
            assert!(!is_valid_session_id(bad), "{bad:?}");
        }
        assert!(!is_valid_session_id(&"a".repeat(129)));
    }

    fn request(message: Option<&str>, session: Option<&str>) -> ChatRequest {
        ChatRequest {
            message: message.map(str::to_owned),
            session_id: session.map(str::to_owned),
            confirmation_id: None,
            decisions: None,
        }
    }

    #[test]
    fn a_request_is_a_chat_a_reply_or_a_re_attach() {
        assert!(matches!(
            request(Some("hi"), None).validate(None),
            Ok(ValidRequest::Chat {
                session_id: None,
                ..
            })
        ));
        assert!(matches!(
            request(Some("CONFIRM_ACTION:confirm"), Some("s")).validate(None),
            Ok(ValidRequest::Reply { .. })
        ));
        assert_eq!(
            request(None, Some("s")).validate(Some(b" 7 ")),
            Ok(ValidRequest::Reattach {
                session_id: "s".into(),
                last_seen: 7
            })
        );
    }

    #[test]
    fn broken_rules_are_reported_in_order() {
        let long = "x".repeat(MAX_MESSAGE_BYTES + 1);
        let cases: [(ChatRequest, Option<&[u8]>, RequestError); 8] = [
            (
                request(Some("hi"), Some("")),
                None,
                RequestError::BadSessionId,
            ),
            (
                request(None, Some("a\u{0}")),
                Some(b"1"),
                RequestError::BadSessionId,
            ),
            (
                request(None, Some("s")),
                Some(b"x"),
                RequestError::BadLastEventId,
            ),
            (
                request(None, None),
                Some(b"1"),
                RequestError::ReattachWithoutSession,
            ),
            (request(None, Some("s")), None, RequestError::MissingMessage),
            (
                request(Some(" \n"), Some("s")),
                None,
                RequestError::EmptyMessage,
            ),
            (
                request(Some(&long), Some("s")),
                None,
                RequestError::MessageTooLong,
            ),
            (
                request(Some("CONFIRM_ACTION:confirm"), None),
                None,
                RequestError::ReplyWithoutSession,
            ),
        ];
        for (request, last_event_id, expected) in cases {
            assert_eq!(request.validate(last_event_id), Err(expected));
        }
    }

    #[test]
    fn wire_names_match_serde_names_for_every_variant() {
        use strum::IntoEnumIterator;
        for reason in CancelReason::iter() {
            assert_eq!(serde_json::to_value(reason).unwrap(), reason.as_str());
        }
        for error_type in ErrorType::iter() {
            assert_eq!(
                serde_json::to_value(error_type).unwrap(),
                error_type.as_str()
            );
        }
        for action in Action::iter() {
            assert_eq!(serde_json::to_value(action).unwrap(), action.as_str());
        }
        assert_eq!(ErrorType::EngineLimit.as_str(), "engine_limit");
        assert_eq!(CancelReason::ClientGone.as_str(), "client_gone");
        assert_eq!(
            serde_json::to_value(ChunkType::ConfirmationRequest).unwrap(),
            Value::from("confirmation_request")
        );
    }
}
