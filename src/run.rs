//! Starting a run: wires an engine, a registry slot and an SSE response
//! together and drives the engine on its own task.
//!
//! The run task outlives no one: it ends when the engine returns, and the
//! engine returns promptly when the client goes away (the response stream's
//! drop guard cancels `client_gone`) or the server shuts down.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use actix_web::HttpResponse;
use futures_util::FutureExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::confirmation::RunSlot;
use crate::engine::{Engine, RunContext, RunError};
use crate::protocol::ErrorType;
use crate::sse;
use crate::startup::AppState;

/// Chunks a run may have in flight towards a slow client before `send` waits.
const RUN_CHANNEL_CAPACITY: usize = 16;

/// Starts the run for `slot` and returns its streaming response.
pub fn start(state: &AppState, slot: RunSlot, message: String) -> HttpResponse {
    let (chunk_tx, chunk_rx) = mpsc::channel(RUN_CHANNEL_CAPACITY);
    let client_gone = CancellationToken::new();
    let response = sse::event_stream(
        chunk_rx,
        state.keep_alive,
        client_gone.clone().drop_guard(),
        state.metrics.clone(),
    );
    let ctx = RunContext::new(
        message,
        slot,
        state.run_settings,
        chunk_tx,
        client_gone.clone(),
        state.shutdown.clone(),
        state.metrics.clone(),
    );
    tokio::spawn(drive(state.engine.clone(), ctx, client_gone));
    response
}

/// Runs the engine to its end and sends exactly one final chunk.
async fn drive(engine: Arc<dyn Engine>, mut ctx: RunContext, client_gone: CancellationToken) {
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
    let (final_chunk, chunk_tx) = ctx.finish(result);
    log::debug!(
        "run on session {} ended: {:?}",
        final_chunk.session_id,
        final_chunk.chunk_type
    );
    tokio::select! {
        _ = chunk_tx.send(Box::new(final_chunk)) => {}
        () = client_gone.cancelled() => {}
    }
}
