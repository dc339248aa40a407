//! How a run ends, as its engine reports it: a [`Completion`] or a
//! [`RunError`]; and the stream's one final chunk either becomes
//! ([`Ending`]): the one place a run's end is mapped to the wire.

use serde_json::{Map, Value};

use crate::protocol::{meta, CancelReason, Chunk, ErrorType};

/// How a successful run ends: the text and metadata of the `completion` chunk.
#[derive(Debug, Clone, Default)]
pub struct Completion {
    pub text: String,
    pub metadata: Map<String, Value>,
}

/// How an unsuccessful run ends.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RunError {
    /// Ends with a `cancelled` chunk. Returned by [`RunContext`](crate::run::RunContext) methods when
    /// the run must stop; engines pass it on with `?`.
    #[error("run cancelled: {}", .0.as_str())]
    Cancelled(CancelReason),
    /// Ends with an `error` chunk carrying `error_type`.
    #[error("{message}")]
    Failed {
        error_type: ErrorType,
        message: String,
    },
    /// The process is shutting down and the run's pause is kept in a durable
    /// store: the run ends here without a final chunk (its stream closes
    /// after a `retry:` line) and goes on in the next process.
    #[error("run suspended until the server is back")]
    Suspended,
    /// Ends with an `error` chunk, `error_type: rate_limited`, and
    /// `metadata.retry_after` (seconds) when the model server said.
    #[error("{message}")]
    RateLimited {
        message: String,
        retry_after_secs: Option<u64>,
    },
}

impl RunError {
    /// Ends the run with an `error` chunk of `error_type` saying `message`.
    pub fn failed(error_type: ErrorType, message: impl Into<String>) -> RunError {
        RunError::Failed {
            error_type,
            message: message.into(),
        }
    }

    /// A decision that could not be acted on: it could not be recorded
    /// (the audit log, the store), or something broke. Nothing ran.
    pub fn unacted(error_type: ErrorType) -> RunError {
        let message = match error_type {
            ErrorType::AuditUnavailable => {
                "the decision could not be recorded in the audit log; nothing was run"
            }
            ErrorType::StoreUnavailable => {
                "the decision could not be recorded in the store; nothing was run"
            }
            _ => "internal error",
        };
        RunError::failed(error_type, message)
    }
}

/// A run's final chunk, as the driver sends it.
#[derive(Debug)]
pub struct Ending {
    pub chunk: Chunk,
    /// A cancel's reason or an error's type, for the audit log.
    pub why: Option<&'static str>,
    /// An error's type, for the metrics.
    pub error: Option<ErrorType>,
}

impl Ending {
    /// The one final chunk of a run that ended with `result`. (A suspended
    /// run gets none; it is given `cancelled`/`shutdown` here only for the
    /// type's sake.)
    pub fn of(session_id: &str, result: Result<Completion, RunError>) -> Ending {
        let cancelled = |reason: CancelReason| Ending {
            chunk: Chunk::cancelled(session_id, reason),
            why: Some(reason.as_str()),
            error: None,
        };
        let failed = |chunk: Chunk, error_type: ErrorType| Ending {
            chunk,
            why: Some(error_type.as_str()),
            error: Some(error_type),
        };
        match result {
            Ok(completion) => Ending {
                chunk: Chunk::completion(session_id, completion.text, completion.metadata),
                why: None,
                error: None,
            },
            Err(RunError::Cancelled(reason)) => cancelled(reason),
            Err(RunError::Suspended) => cancelled(CancelReason::Shutdown),
            Err(RunError::Failed {
                error_type,
                message,
            }) => failed(Chunk::failed(session_id, error_type, message), error_type),
            Err(RunError::RateLimited {
                message,
                retry_after_secs,
            }) => {
                let error_type = ErrorType::RateLimited;
                let mut chunk = Chunk::failed(session_id, error_type, message);
                if let Some(secs) = retry_after_secs {
                    chunk = chunk.with_meta(meta::RETRY_AFTER, secs);
                }
                failed(chunk, error_type)
            }
        }
    }
}
