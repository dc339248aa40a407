//! The wire contract of `POST /api/v1/chat/stream`: request body, chunk shape,
//! and the spelling of every chunk type, error type and cancel reason.
//!
//! Pure data and parsing, no I/O. SSE framing lives in [`crate::sse`]; what the
//! handler does with a parsed request lives in [`crate::routes`].

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use strum::{EnumIter, IntoStaticStr};

/// Upper bound of a request body, in bytes (413 beyond it).
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Upper bound of `message`, in bytes of UTF-8 (400 beyond it).
pub const MAX_MESSAGE_BYTES: usize = 32 * 1024;
/// Upper bound of `session_id`, in characters.
pub const MAX_SESSION_ID_CHARS: usize = 128;
/// Prefix that turns a message into a confirmation reply. Case-sensitive.
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

/// The JSON body of a request. Unknown fields are ignored.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    pub message: Option<String>,
    pub session_id: Option<String>,
    pub confirmation_id: Option<String>,
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
    /// Without API keys, the `Host` header names neither loopback, the bound
    /// address nor an `--allowed-host` (DNS rebinding).
    ForbiddenHost,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RiskLevel {
    Low,
    Medium,
    High,
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

/// True when `id` is 1-128 characters of `[A-Za-z0-9._:-]`.
pub fn is_valid_session_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_SESSION_ID_CHARS
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
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
/// anything that starts with [`CONFIRM_PREFIX`] (a reply, well-formed or not).
pub fn parse_reply(message: &str) -> Option<Result<ReplyMessage, ReplySyntaxError>> {
    let rest = message.strip_prefix(CONFIRM_PREFIX)?;
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
        for message in [
            "hello",
            "confirm_action:confirm",
            " CONFIRM_ACTION:confirm",
            "",
        ] {
            assert_eq!(parse_reply(message), None, "{message:?}");
        }
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
    fn session_ids_follow_the_documented_alphabet() {
        assert!(is_valid_session_id("abc-DEF_1.2:3"));
        assert!(is_valid_session_id(&"a".repeat(128)));
        assert!(!is_valid_session_id(""));
        assert!(!is_valid_session_id(&"a".repeat(129)));
        for bad in ["a b", "a/b", "é", "a\nb", "a\"b"] {
            assert!(!is_valid_session_id(bad), "{bad:?}");
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
