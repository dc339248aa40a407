//! The wire contract of `POST /api/v1/chat/stream`, as data: no I/O.
//!
//! - [`request`]: the request and its rules ([`ChatRequest::validate`] turns
//!   a decoded body into a [`ValidRequest`]), the `CONFIRM_ACTION` parser.
//! - [`kinds`]: the kinds of pause, listed once in its table:
//!   [`PauseData`] and [`Ask`] are generated from it; each kind's wire
//!   type lives in its own file under `kinds/` with what the faces read of
//!   it and what a stored record keeps of it.
//! - [`ask`]: what a pause asked, one value, as a stored record writes it.
//! - [`chunk`]: the chunk shape and its constructors, a pause's data, the
//!   verdicts of a confirm.
//! - [`given`]: what a reply gave its pause (verdicts or answers), one
//!   value, and the wire fields it is written as.
//! - [`pause_view`]: what the faces read of a pause whatever its kind
//!   (its tasks, questions, title, risk, who must decide it).
//! - [`names`]: the spelling of every chunk type, metadata key, error type,
//!   action and cancel reason.
//! - [`question`]: questions, the second kind of pause: their bounds, and
//!   how answers are matched and normalized.
//!
//! SSE framing lives in [`crate::sse`]; what the server does with a valid
//! request lives in [`crate::http`] and [`crate::run`].

pub mod a2a;
pub mod agui;
pub mod ask;
pub mod chunk;
pub mod given;
pub mod kinds;
pub mod names;
pub mod openapi;
pub mod pause_view;
pub mod question;
pub mod record;
pub mod request;
pub mod task_spec;

pub use chunk::{
    json_len, Chunk, Decisions, ResumedHow, TaskDecision, Verdict, Via, MAX_CONFIRMATION_BYTES,
    MAX_PLAN_TASKS,
};
pub use given::Given;
pub use kinds::confirmation_data::ConfirmationData;
pub use kinds::question_data::QuestionData;
pub use kinds::reconcile_data::ReconcileData;
pub use kinds::{Ask, PauseData};
pub use names::{
    meta, Action, CancelReason, ChunkType, DecisionKind, ErrorType, PauseKind, RiskLevel, TaskState,
};

pub use request::{
    is_plain_name, is_valid_session_id, parse_reply, ChatRequest, ReplyMessage, ReplyPayload,
    ReplySyntaxError, RequestError, TaskDecisionRequest, ValidRequest, CHAT_PATH, CONFIRM_PREFIX,
    GRANTS_PATH, INBOX_PATH, MAX_BODY_BYTES, MAX_MESSAGE_BYTES, MAX_MODIFY_TEXT_BYTES,
    MAX_SESSION_ID_CHARS, RULES_PATH, RUNS_PATH, TOOLS_PATH,
};
pub use task_spec::{ApprovedBy, Schema, TaskPreview, TaskSpec};
