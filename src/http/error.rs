//! Every way a request can be refused, and its status and `error_type`.
//! This is the one place that maps errors to the wire: [`ChatError::wire`]
//! is the table, [`ChatError::to_response`] the answer. Handlers return a
//! [`Refusal`] (the error and the session it concerns) with `?`, and
//! [`super::state::AppState::refuse`] counts and answers it.

use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::HttpResponse;
use std::time::Duration;

use serde_json::Value;

use super::event_stream;
use crate::confirmation::{BeginError, DecideError};
use crate::protocol::{meta, Action, Chunk, ErrorType, RequestError};
use crate::run::decide::ReplyError;
use crate::run::start::StartError;
use crate::run::ReattachError;
use crate::session::run_log;
use crate::session::RunTag;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("{0}")]
    InvalidRequest(String),
    #[error("{0}")]
    Request(#[from] RequestError),
    #[error("request body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    #[error(
        "Content-Type must be application/json; the request sent {}",
        .0.as_deref().map_or_else(|| "none".to_owned(), |sent| format!("`{sent}`"))
    )]
    UnsupportedMediaType(Option<String>),
    #[error("{0} is not allowed here: send POST with a JSON body")]
    MethodNotAllowed(String),
    #[error("{0}")]
    Reply(#[from] ReplyError),
    #[error("{0}")]
    Reattach(#[from] ReattachError),
    #[error("{0}")]
    Start(#[from] StartError),
    #[error("the server is shutting down; retry on another replica or later")]
    ShuttingDown,
    #[error("missing or unknown API key: send `Authorization: Bearer <key>`")]
    Unauthorized,
    #[error("cross-site requests from this origin are not allowed")]
    ForbiddenOrigin,
    #[error(
        "this server does not answer for that Host name; use 127.0.0.1 or localhost, or \
         start the server with --allowed-host NAME (or API keys)"
    )]
    ForbiddenHost,
    #[error("the request body did not arrive in time")]
    RequestTimeout,
    #[error(
        "an approver key may list, decide and re-attach to pending pauses, not start runs; \
         start runs with a namespace's API key"
    )]
    ForbiddenRole,
    #[error(
        "an approver names the pause by its confirmation_id (session ids are per namespace): \
         send the confirmation_id the inbox lists"
    )]
    ApproverWithoutConfirmationId,
    #[error("the store cannot be reached to find or claim this session's run; retry shortly")]
    StoreUnreachable,
    #[error("no such grant: it expired, was spent or revoked, or is another key's")]
    NoSuchGrant,
    /// `GET /api/v1/runs/SESSION` with no kept outcome.
    #[error(
        "no ended run of this key's on this session within --keep-outcome: none was started, \
         it belongs to another API key, it is still going (re-attach to it), or its outcome is \
         no longer kept"
    )]
    NoSuchOutcome,
    #[error("{0}")]
    ForbiddenScope(String),
    #[error(
        "this request carries a replica's header with a wrong --cluster-secret (or this \
         server is not a replica): clients must not send x-chatgate-cluster-secret"
    )]
    ForbiddenReplica,
    #[error(
        "the replica that holds this session's run cannot be reached; retry after the \
         Retry-After seconds, when another replica may take the run over"
    )]
    OwnerUnavailable {
        /// Until the owner's heartbeat expires (at least a second).
        retry_after: Duration,
    },
    #[error(
        "the replica that holds this session's run did not answer in time, so whether this \
         request was taken is not known; re-attach (Last-Event-ID) to see the run's state"
    )]
    OutcomeUnknown,
}

impl ChatError {
    /// A store that cannot answer (where a session's run is, its outcome,
    /// the inbox): the details are logged, about `tag`'s session when the
    /// request names one, and never sent.
    pub fn store(tag: Option<RunTag>) -> impl FnOnce(StoreError) -> ChatError {
        move |err| {
            match tag {
                Some(tag) => run_log!(Error, tag, "{err}"),
                None => log::error!("{err}"),
            }
            ChatError::StoreUnreachable
        }
    }

    /// The table: each case's HTTP status and `error_type`.
    pub fn wire(&self) -> (StatusCode, ErrorType) {
        use ErrorType as T;
        use StatusCode as S;
        match self {
            ChatError::InvalidRequest(_) => (S::BAD_REQUEST, T::InvalidRequest),
            ChatError::Request(RequestError::MalformedReply(_)) => {
                (S::UNPROCESSABLE_ENTITY, T::InvalidConfirmAction)
            }
            ChatError::Request(_) => (S::BAD_REQUEST, T::InvalidRequest),
            ChatError::PayloadTooLarge(_) => (S::PAYLOAD_TOO_LARGE, T::PayloadTooLarge),
            ChatError::UnsupportedMediaType(_) => {
                (S::UNSUPPORTED_MEDIA_TYPE, T::UnsupportedMediaType)
            }
            ChatError::MethodNotAllowed(_) => (S::METHOD_NOT_ALLOWED, T::MethodNotAllowed),
            ChatError::Reply(ReplyError::OutcomeUnknown)
            | ChatError::Start(StartError::Unknown)
            | ChatError::OutcomeUnknown => (S::GATEWAY_TIMEOUT, T::OutcomeUnknown),
            ChatError::Reply(ReplyError::Late) | ChatError::Start(StartError::Late) => {
                (S::SERVICE_UNAVAILABLE, T::OwnerUnavailable)
            }
            ChatError::Start(StartError::Store(_) | StartError::Moved) => {
                (S::SERVICE_UNAVAILABLE, T::StoreUnavailable)
            }
            ChatError::Reply(ReplyError::Refused(refused)) => match refused {
                DecideError::NoPending => (S::NOT_FOUND, T::NoPendingConfirmation),
                DecideError::Restoring => (S::SERVICE_UNAVAILABLE, T::OwnerUnavailable),
                DecideError::NotOffered { .. } | DecideError::ModifyTooLong { .. } => {
                    (S::UNPROCESSABLE_ENTITY, T::InvalidConfirmAction)
                }
                DecideError::Stale => (S::CONFLICT, T::StaleConfirmation),
                DecideError::PreviewStale(_) => (S::CONFLICT, T::PreviewStale),
                DecideError::InvalidDecision(_) => (S::UNPROCESSABLE_ENTITY, T::InvalidDecision),
                DecideError::DeniedByRule(_) => (S::UNPROCESSABLE_ENTITY, T::DeniedByRule),
                DecideError::UndecidedTasks(_) => (S::UNPROCESSABLE_ENTITY, T::UndecidedTasks),
                DecideError::InvalidGrant(_) => (S::UNPROCESSABLE_ENTITY, T::InvalidGrant),
                DecideError::TooManyGrants => (S::UNPROCESSABLE_ENTITY, T::TooManyGrants),
                DecideError::ForbiddenScope(_) => (S::FORBIDDEN, T::ForbiddenScope),
                DecideError::SelfApproval(_) => (S::FORBIDDEN, T::SelfApproval),
                DecideError::AlreadyApproved(_) => (S::CONFLICT, T::AlreadyApproved),
                DecideError::EditNeedsNewRound(_) => {
                    (S::UNPROCESSABLE_ENTITY, T::EditNeedsNewRound)
                }
                DecideError::InvalidAnswer(_) => (S::UNPROCESSABLE_ENTITY, T::InvalidAnswer),
                DecideError::AlreadyDecided | DecideError::TaskDecided(_) => {
                    (S::CONFLICT, T::AlreadyDecided)
                }
                DecideError::Settling | DecideError::Counting => {
                    (S::SERVICE_UNAVAILABLE, T::StoreUnavailable)
                }
            },
            ChatError::Reply(ReplyError::Decided(_)) => (S::CONFLICT, T::AlreadyDecided),
            ChatError::Reply(ReplyError::AuditUnavailable) => {
                (S::SERVICE_UNAVAILABLE, T::AuditUnavailable)
            }
            ChatError::Reply(ReplyError::StoreUnavailable | ReplyError::StoreLost)
            | ChatError::StoreUnreachable => (S::SERVICE_UNAVAILABLE, T::StoreUnavailable),
            ChatError::Reattach(ReattachError::NoSuchRun) => (S::NOT_FOUND, T::NoSuchRun),
            ChatError::NoSuchGrant => (S::NOT_FOUND, T::NoSuchGrant),
            ChatError::NoSuchOutcome => (S::NOT_FOUND, T::NoSuchRun),
            ChatError::ForbiddenScope(_) => (S::FORBIDDEN, T::ForbiddenScope),
            ChatError::Reattach(ReattachError::Beyond { .. }) => {
                (S::BAD_REQUEST, T::InvalidRequest)
            }
            ChatError::Start(StartError::Begin(BeginError::SessionBusy)) => {
                (S::CONFLICT, T::SessionBusy)
            }
            ChatError::Start(StartError::Begin(
                BeginError::Overloaded | BeginError::KeyOverloaded { .. },
            )) => (S::SERVICE_UNAVAILABLE, T::Overloaded),
            ChatError::ShuttingDown => (S::SERVICE_UNAVAILABLE, T::ShuttingDown),
            ChatError::Unauthorized => (S::UNAUTHORIZED, T::Unauthorized),
            ChatError::ForbiddenOrigin => (S::FORBIDDEN, T::ForbiddenOrigin),
            ChatError::ForbiddenHost => (S::MISDIRECTED_REQUEST, T::ForbiddenHost),
            ChatError::RequestTimeout => (S::REQUEST_TIMEOUT, T::RequestTimeout),
            ChatError::ForbiddenReplica => (S::FORBIDDEN, T::ForbiddenReplica),
            ChatError::ForbiddenRole => (S::FORBIDDEN, T::ForbiddenRole),
            ChatError::ApproverWithoutConfirmationId => (S::BAD_REQUEST, T::InvalidRequest),
            ChatError::OwnerUnavailable { .. } => (S::SERVICE_UNAVAILABLE, T::OwnerUnavailable),
        }
    }

    pub fn status(&self) -> StatusCode {
        self.wire().0
    }

    pub fn error_type(&self) -> ErrorType {
        self.wire().1
    }

    /// An owner that cannot be reached, to try again in a second.
    pub fn owner_unavailable() -> ChatError {
        ChatError::OwnerUnavailable {
            retry_after: Duration::from_secs(1),
        }
    }

    /// Whole seconds a 503 asks the client to wait (`Retry-After`): until
    /// an unreachable owner's runs can be taken over, else one.
    fn retry_after_secs(&self) -> u64 {
        match self {
            ChatError::OwnerUnavailable { retry_after } => {
                retry_after.as_millis().div_ceil(1000).max(1) as u64
            }
            _ => 1,
        }
    }

    /// The actions a reply could have used, for `invalid_confirm_action`.
    fn options(&self) -> Option<Vec<Action>> {
        match self {
            ChatError::Request(RequestError::MalformedReply(_)) => Some(Action::ALL.to_vec()),
            ChatError::Reply(ReplyError::Refused(
                DecideError::NotOffered { options, .. } | DecideError::ModifyTooLong { options },
            )) => Some(options.clone()),
            _ => None,
        }
    }

    /// A reply that was refused (for the decisions metric).
    pub fn is_refused_reply(&self) -> bool {
        matches!(
            self,
            ChatError::Request(RequestError::MalformedReply(_) | RequestError::ReplyWithoutSession)
                | ChatError::Reply(ReplyError::Refused(_) | ReplyError::Decided(_))
        )
    }

    /// The headers every refusal carries: `Retry-After` on a 503, and
    /// `WWW-Authenticate` on a 401.
    fn add_headers(&self, response: &mut HttpResponse) {
        let status = response.status();
        let headers = response.headers_mut();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(
                header::RETRY_AFTER,
                HeaderValue::from(self.retry_after_secs()),
            );
        }
        if matches!(self, ChatError::Unauthorized) {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
    }

    /// The error as a JSON endpoint answers it (the inbox):
    /// `{"error_type": ..., "message": ...}` with the table's status and the
    /// same headers as [`ChatError::to_response`].
    pub fn to_json_response(&self) -> HttpResponse {
        let (status, error_type) = self.wire();
        let body =
            serde_json::json!({"error_type": error_type.as_str(), "message": self.to_string()});
        let mut response = HttpResponse::build(status)
            .insert_header((header::CACHE_CONTROL, "no-store"))
            .json(body);
        self.add_headers(&mut response);
        response
    }

    /// The error as a one-chunk stream. `session_id` is echoed when the
    /// request carried a valid one (or the server made one), else empty.
    pub fn to_response(&self, session_id: &str) -> HttpResponse {
        let (status, error_type) = self.wire();
        let mut chunk = Chunk::failed(session_id, error_type, self.to_string());
        if let Some(options) = self.options() {
            let names: Vec<Value> = options.iter().map(|a| Value::from(a.as_str())).collect();
            chunk = chunk.with_meta(meta::OPTIONS, names);
        }
        if let ChatError::Reply(ReplyError::Decided(note)) = self {
            chunk = chunk.with_meta(meta::CONFIRMATION_ID, note.confirmation_id.as_str());
            if let Some(decided) = &note.decided {
                chunk = chunk
                    .with_meta(meta::ACTION, decided.action.as_str())
                    .with_meta(meta::DECIDED_BY, decided.by.as_str())
                    .with_meta(meta::DECIDED_AT, crate::clock::rfc3339_ms(decided.at_ms));
            }
        }
        let mut response = event_stream::single_chunk(status, chunk);
        if matches!(self, ChatError::RequestTimeout) {
            // The rest of a body that came too slowly is not worth reading:
            // close the connection rather than drain it.
            response
                .head_mut()
                .set_connection_type(actix_http::ConnectionType::Close);
        }
        self.add_headers(&mut response);
        response
    }
}

/// A refused request: the error, and the session it concerns (echoed in the
/// error chunk when the request named a valid one; empty otherwise).
#[derive(Debug)]
pub struct Refusal {
    pub error: ChatError,
    pub session_id: String,
}

impl Refusal {
    pub fn new(error: impl Into<ChatError>, session_id: &str) -> Refusal {
        Refusal {
            error: error.into(),
            session_id: session_id.to_owned(),
        }
    }
}

impl<E: Into<ChatError>> From<E> for Refusal {
    fn from(error: E) -> Refusal {
        Refusal::new(error, "")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retry_after(error: ChatError) -> String {
        let response = error.to_response("s");
        let value = response.headers().get(header::RETRY_AFTER).unwrap();
        value.to_str().unwrap().to_owned()
    }

    #[test]
    fn an_unreachable_owner_asks_to_wait_for_what_its_heartbeat_has_left() {
        let owner = |ms| ChatError::OwnerUnavailable {
            retry_after: Duration::from_millis(ms),
        };
        assert_eq!(retry_after(owner(14_200)), "15");
        assert_eq!(retry_after(owner(1_000)), "1");
        // Expired or unknown: a second, never 0 (a client must not spin).
        assert_eq!(retry_after(owner(0)), "1");
        assert_eq!(retry_after(ChatError::StoreUnreachable), "1");
        assert_eq!(retry_after(ChatError::ShuttingDown), "1");
    }
}
