//! Starting a run, and re-attaching to one: wires an engine, a registry slot,
//! a replay log and an SSE response together, and drives the engine on its
//! own task.
//!
//! The run task ends when the engine returns. The engine returns promptly
//! when the run is stopped: by shutdown, by a slow client, or when a detached
//! run's grace ends (see [`crate::replay`]).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use actix_web::HttpResponse;
use futures_util::FutureExt;

use crate::confirmation::{RunSlot, SessionKey};
use crate::engine::{Engine, RunContext, RunError};
use crate::error::ChatError;
use crate::protocol::ErrorType;
use crate::replay::{RunLog, RunStop, Subscription};
use crate::sse;
use crate::startup::AppState;

/// Starts the run for `slot` and returns its streaming response.
pub fn start(state: &AppState, slot: RunSlot, key: SessionKey, message: String) -> HttpResponse {
    let stop = RunStop::under(&state.shutdown);
    let log = RunLog::new(state.log_limits, stop.clone());
    state.logs.publish(key.clone(), log.clone());
    let subscription = Subscription::open(log.clone(), key, state.stream_settings());
    let ctx = RunContext::new(
        message,
        slot,
        state.run_settings.clone(),
        log,
        stop,
        state.metrics.clone(),
    );
    tokio::spawn(drive(state.engine.clone(), ctx));
    sse::stream_response(subscription)
}

/// Re-attaches to the run of `key`, replaying every chunk after `last_seen`.
pub fn reattach(
    state: &AppState,
    key: SessionKey,
    last_seen: u64,
) -> Result<HttpResponse, ChatError> {
    let log = state.logs.find(&key).ok_or(ChatError::NoSuchRun)?;
    let subscription =
        Subscription::attach(log, key, last_seen, state.stream_settings()).map_err(|beyond| {
            ChatError::InvalidRequest(format!(
                "Last-Event-ID {last_seen} is beyond the last chunk sent ({})",
                beyond.last_sent
            ))
        })?;
    Ok(sse::stream_response(subscription))
}

/// Runs the engine to its end and sends exactly one final chunk.
async fn drive(engine: Arc<dyn Engine>, mut ctx: RunContext) {
    // A panicking engine must still end its stream with a final chunk and
    // free its session; the panic itself is logged, never sent.
    let result = AssertUnwindSafe(engine.run(&mut ctx))
        .catch_unwind()
        .await
        .unwrap_or_else(|_| {
            log::error!("engine panicked during a run");
            Err(RunError::Failed {
                error_type: ErrorType::Internal,
                message: "internal error".to_owned(),
            })
        });
    let ended = ctx.finish(result);
    log::debug!("run ended with {ended:?}");
}
