//! How a run ends, as its engine reports it: a [`Completion`] or a
//! [`RunError`]; the driver turns either into the stream's one final chunk.

use serde_json::{Map, Value};

use crate::protocol::{CancelReason, ErrorType};

/// How a successful run ends: the text and metadata of the `completion` chunk.
#[derive(Debug, Clone, Default)]
pub struct Completion {
    pub text: String,
    pub metadata: Map<String, Value>,
}

/// How an unsuccessful run ends.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RunError {
    /// Ends with a `cancelled` chunk. Returned by [`RunContext`] methods when
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
