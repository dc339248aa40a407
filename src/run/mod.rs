//! A run's home: starting one, re-attaching to one, and driving its engine
//! to exactly one final chunk. No HTTP: the caller turns the
//! [`Subscription`] it gets into a response.
//!
//! - [`stop`]: why a run must end ([`RunStop`]), first cause wins.
//! - [`log`]: its numbered, bounded output ([`RunLog`]) and the registry a
//!   re-attach searches ([`LogRegistry`]).
//! - [`stream`]: one client's view of the log ([`Subscription`]): keep-alive,
//!   gap, detach and its grace.
//!
//! The run task ends when the engine returns. The engine returns promptly
//! when the run is stopped: by shutdown, by a slow client, or when a detached
//! run's grace ends.

pub mod log;
pub mod stop;
pub mod stream;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;
use tokio_util::sync::CancellationToken;

use self::log::{BeyondEnd, LogLimits, LogRegistry, RunLog};
use self::stop::RunStop;
use self::stream::{StreamSettings, Subscription};
use crate::audit::{self, AuditLog};
use crate::confirmation::{BeginError, ConfirmationManager, RunLimits, SessionKey};
use crate::engine::{Engine, RunContext, RunError, RunSettings};
use crate::metrics::Metrics;
use crate::protocol::{meta, Chunk, ChunkType, ErrorType};

/// Everything a run needs from the server: a cheap-clone handle.
#[derive(Clone)]
pub struct Runs {
    pub manager: ConfirmationManager,
    /// Runs' replay logs, for re-attach.
    pub logs: LogRegistry,
    pub engine: Arc<dyn Engine>,
    pub settings: Arc<RunSettings>,
    pub log_limits: LogLimits,
    /// Runs the registry may hold, in all and per API key.
    pub limits: RunLimits,
    pub stream: Arc<StreamSettings>,
    /// Cancelled once, when shutdown starts; every run's stop is its child.
    pub shutdown: CancellationToken,
    pub metrics: Arc<Metrics>,
}

/// Why a re-attach found nothing to attach to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReattachError {
    /// No run, or not one of this API key's, on the session.
    NoSuchRun,
    /// `Last-Event-ID` is beyond the last chunk sent.
    Beyond(BeyondEnd),
}

impl Runs {
    /// Starts a run of `message` on `key` (superseding a paused one) and
    /// returns the stream of its first client.
    pub fn start(&self, key: SessionKey, message: String) -> Result<Subscription, BeginError> {
        let slot = self.manager.begin_run(key.clone(), self.limits)?;
        let stop = RunStop::under(&self.shutdown);
        let log = RunLog::new(self.log_limits, stop.clone());
        self.logs.publish(key.clone(), log.clone());
        let subscription = Subscription::open(log.clone(), key, self.stream.clone());
        let ctx = RunContext::new(
            message,
            slot,
            self.settings.clone(),
            log,
            stop,
            self.metrics.clone(),
        );
        tokio::spawn(drive(self.engine.clone(), ctx, self.settings.audit.clone()));
        Ok(subscription)
    }

    /// Re-attaches to the run of `key`, replaying every chunk after `last_seen`.
    pub fn reattach(&self, key: SessionKey, last_seen: u64) -> Result<Subscription, ReattachError> {
        let log = self.logs.find(&key).ok_or(ReattachError::NoSuchRun)?;
        Subscription::attach(log, key, last_seen, self.stream.clone())
            .map_err(ReattachError::Beyond)
    }
}

/// Runs the engine to its end and sends exactly one final chunk; records
/// the end in the audit log, if there is one.
async fn drive(engine: Arc<dyn Engine>, mut ctx: RunContext, audit: Option<Arc<AuditLog>>) {
    // A panicking engine must still end its stream with a final chunk and
    // free its session; the panic itself is logged, never sent.
    let result = AssertUnwindSafe(engine.run(&mut ctx))
        .catch_unwind()
        .await
        .unwrap_or_else(|_| {
            ::log::error!("engine panicked during a run");
            Err(RunError::Failed {
                error_type: ErrorType::Internal,
                message: "internal error".to_owned(),
            })
        });
    let (run_id, session_id) = (ctx.run_id(), ctx.session_id().to_owned());
    let (ended, why) = finish(ctx, result);
    ::log::debug!("run ended with {ended:?}");
    if let Some(audit) = audit {
        let mut fields = audit::run_fields(run_id, &session_id);
        fields.insert(
            "outcome".into(),
            serde_json::to_value(ended).unwrap_or_default(),
        );
        fields.insert("reason".into(), why.into());
        // The run is over: a failure here is logged and shows on /readyz.
        let _ = audit.write("ended", fields).await;
    }
}

/// Turns the engine's result into the final chunk, frees the session, then
/// sends the final chunk. Returns its type and its reason or error type.
///
/// The session is freed *before* the final chunk is sent: a client that
/// sends its next message the instant it reads the final chunk must not be
/// told `session_busy` by a run that is already over.
fn finish(
    ctx: RunContext,
    result: Result<crate::engine::Completion, RunError>,
) -> (ChunkType, Option<&'static str>) {
    let session_id = ctx.session_id().to_owned();
    let (chunk, why) = match result {
        Ok(completion) => (
            Chunk::completion(&session_id, completion.text, completion.metadata),
            None,
        ),
        Err(RunError::Cancelled(reason)) => {
            (Chunk::cancelled(&session_id, reason), Some(reason.as_str()))
        }
        Err(RunError::Failed {
            error_type,
            message,
        }) => {
            ctx.metrics().error(error_type);
            (
                Chunk::failed(&session_id, error_type, message),
                Some(error_type.as_str()),
            )
        }
        Err(RunError::RateLimited {
            message,
            retry_after_secs,
        }) => {
            let error_type = ErrorType::RateLimited;
            ctx.metrics().error(error_type);
            let mut chunk = Chunk::failed(&session_id, error_type, message);
            if let Some(secs) = retry_after_secs {
                chunk = chunk.with_meta(meta::RETRY_AFTER, secs);
            }
            (chunk, Some(error_type.as_str()))
        }
    };
    let (slot, log) = ctx.into_parts();
    drop(slot);
    let chunk_type = chunk.chunk_type;
    log.push(chunk);
    (chunk_type, why)
}
