//! Every way a request can be refused, and its status and `error_type`.
//! This is the one place that maps errors to the wire.

use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::HttpResponse;
use serde_json::Value;

use crate::confirmation::{BeginError, DecideError};
use crate::protocol::{Action, Chunk, ChunkType, ErrorType, ReplySyntaxError, MAX_BODY_BYTES};
use crate::sse;

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("{0}")]
    InvalidRequest(String),
    #[error("request body is larger than {MAX_BODY_BYTES} bytes")]
    PayloadTooLarge,
    #[error("Content-Type must be application/json")]
    UnsupportedMediaType,
    #[error("{0}")]
    MalformedReply(#[from] ReplySyntaxError),
    #[error("{0}")]
    Decide(#[from] DecideError),
    #[error("{0}")]
    Begin(#[from] BeginError),
    #[error("the server is shutting down; retry on another replica or later")]
    ShuttingDown,
    #[error("missing or unknown API key: send `Authorization: Bearer <key>`")]
    Unauthorized,
    #[error("cross-site requests from this origin are not allowed")]
    ForbiddenOrigin,
    #[error("the request body did not arrive in time")]
    RequestTimeout,
    #[error("no run to re-attach to on this session")]
    NoSuchRun,
}

impl ChatError {
    pub fn status(&self) -> StatusCode {
        match self {
            ChatError::InvalidRequest(_) => StatusCode::BAD_REQUEST,
            ChatError::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ChatError::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ChatError::MalformedReply(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ChatError::Decide(err) => match err {
                DecideError::NoPending => StatusCode::NOT_FOUND,
                DecideError::NotOffered { .. } | DecideError::ModifyWithoutText { .. } => {
                    StatusCode::UNPROCESSABLE_ENTITY
                }
                DecideError::Stale | DecideError::AlreadyDecided => StatusCode::CONFLICT,
            },
            ChatError::Begin(BeginError::SessionBusy) => StatusCode::CONFLICT,
            ChatError::Begin(BeginError::Overloaded) | ChatError::ShuttingDown => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ChatError::Unauthorized => StatusCode::UNAUTHORIZED,
            ChatError::ForbiddenOrigin => StatusCode::FORBIDDEN,
            ChatError::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ChatError::NoSuchRun => StatusCode::NOT_FOUND,
        }
    }

    pub fn error_type(&self) -> ErrorType {
        match self {
            ChatError::InvalidRequest(_) => ErrorType::InvalidRequest,
            ChatError::PayloadTooLarge => ErrorType::PayloadTooLarge,
            ChatError::UnsupportedMediaType => ErrorType::UnsupportedMediaType,
            ChatError::MalformedReply(_) => ErrorType::InvalidConfirmAction,
            ChatError::Decide(err) => match err {
                DecideError::NoPending => ErrorType::NoPendingConfirmation,
                DecideError::NotOffered { .. } | DecideError::ModifyWithoutText { .. } => {
                    ErrorType::InvalidConfirmAction
                }
                DecideError::Stale => ErrorType::StaleConfirmation,
                DecideError::AlreadyDecided => ErrorType::AlreadyDecided,
            },
            ChatError::Begin(BeginError::SessionBusy) => ErrorType::SessionBusy,
            ChatError::Begin(BeginError::Overloaded) => ErrorType::Overloaded,
            ChatError::ShuttingDown => ErrorType::ShuttingDown,
            ChatError::Unauthorized => ErrorType::Unauthorized,
            ChatError::ForbiddenOrigin => ErrorType::ForbiddenOrigin,
            ChatError::RequestTimeout => ErrorType::RequestTimeout,
            ChatError::NoSuchRun => ErrorType::NoSuchRun,
        }
    }

    /// The actions a reply could have used, for `invalid_confirm_action`.
    fn options(&self) -> Option<Vec<Action>> {
        match self {
            ChatError::MalformedReply(_) => Some(Action::ALL.to_vec()),
            ChatError::Decide(DecideError::NotOffered { options, .. })
            | ChatError::Decide(DecideError::ModifyWithoutText { options }) => {
                Some(options.clone())
            }
            _ => None,
        }
    }

    /// The error as a one-chunk stream. `session_id` is echoed when the
    /// request carried a valid one (or the server made one), else empty.
    pub fn to_response(&self, session_id: &str) -> HttpResponse {
        let mut chunk = Chunk::new(ChunkType::Error, self.to_string(), session_id, 1)
            .with_meta("error_type", self.error_type().as_str())
            .finished();
        if let Some(options) = self.options() {
            let names: Vec<Value> = options.iter().map(|a| Value::from(a.as_str())).collect();
            chunk = chunk.with_meta("options", names);
        }
        let mut response = sse::single_chunk(self.status(), &chunk);
        let headers = response.headers_mut();
        if self.status() == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if matches!(self, ChatError::Unauthorized) {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}
