//! A run's end: driving its engine (or a restored run's) to exactly one
//! final chunk, then its store record (which keeps the end for the grace)
//! and its `ended` audit record. A run
//! suspended by a shutdown ends without a final chunk instead (its stream
//! gets SSE's `retry:`), its record kept for the next process.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use super::context::RunContext;
use super::engine::Engine;
use super::journal::{Entry, Pause, PauseEvent, Subject};
use super::outcome::{Completion, Ending, RunError};
use super::replay::Replay;
use crate::confirmation::slot::{PendingDecision, WritingEnd};
use crate::protocol::{Chunk, ChunkType, ErrorType};
use crate::run::settings::RunSettings;
use crate::session::run_log;
use crate::session::{RunTag, SessionKey};
use crate::sse;
use crate::store::{KeptOutcome, OutboxEvent, PausedRecord, RunEnd, Store, StoreError};

/// First wait before writing an ended run's record again.
const STORE_RETRY: Duration = Duration::from_secs(1);
/// How long an ended run's record is tried to be written.
const STORE_RETRY_FOR: Duration = Duration::from_secs(3600);

/// Runs the engine to its end and sends exactly one final chunk.
pub(super) async fn drive(engine: Arc<dyn Engine>, mut ctx: RunContext) {
    // A panicking engine must still end its stream with a final chunk and
    // free its session; the panic itself is logged, never sent.
    let result = AssertUnwindSafe(engine.run(&mut ctx))
        .catch_unwind()
        .await
        .unwrap_or_else(|_| panicked(&ctx));
    // Boxed: the records written at the end must not enlarge the task every
    // paused run is held in.
    Box::pin(conclude(ctx, result)).await;
}

/// A restored run: waits on its stored pause, then its engine goes on.
pub(super) async fn drive_restored(
    engine: Arc<dyn Engine>,
    mut ctx: RunContext,
    record: PausedRecord,
    pending: Result<PendingDecision, RunError>,
) {
    let resumed = match pending {
        Ok(pending) => ctx.resume_pause(pending, &record).await,
        Err(err) => Err(err),
    };
    go_on(engine, ctx, record, resumed).await;
}

/// A restored run whose decision was recorded before a crash cut its work
/// short: the decision is taken again, and its engine goes on (#44).
pub(super) async fn drive_decided(
    engine: Arc<dyn Engine>,
    mut ctx: RunContext,
    record: PausedRecord,
    decision: crate::confirmation::Decision,
) {
    let resumed = Box::pin(ctx.resume_decided(&record, decision)).await;
    go_on(engine, ctx, record, resumed).await;
}

/// A restored run's engine, from what its pause came to.
async fn go_on(
    engine: Arc<dyn Engine>,
    mut ctx: RunContext,
    record: PausedRecord,
    resumed: Result<super::plan::Resumed, RunError>,
) {
    let result = match resumed {
        Ok(resumed) => {
            let ran = match engine.resume(&mut ctx, record.state, resumed) {
                Some(going_on) => Some(AssertUnwindSafe(going_on).catch_unwind().await),
                None => None,
            };
            match ran {
                Some(Ok(result)) => result,
                Some(Err(_)) => panicked(&ctx),
                None => Err(RunError::failed(
                    ErrorType::Interrupted,
                    "this run's engine cannot go on after a restart",
                )),
            }
        }
        Err(err) => Err(err),
    };
    Box::pin(conclude(ctx, result)).await;
}

fn panicked(ctx: &RunContext) -> Result<Completion, RunError> {
    run_log!(Error, ctx.tag(), "engine panicked during a run");
    Err(RunError::unacted(ErrorType::Internal))
}

/// Ends a run: its final chunk, its store record, its audit record. A run
/// suspended by a shutdown (its pause kept in a durable store) gets no
/// final chunk: its stream ends with a `retry:` line, its record stays.
async fn conclude(ctx: RunContext, result: Result<Completion, RunError>) {
    let settings = ctx.settings_handle();
    if matches!(result, Err(RunError::Suspended)) {
        // The record stays for the next process; with replicas the run is
        // handed back, for any of them to take over at once. A parked run's
        // record keeps its log as it was, for its wake (#46).
        let parking = ctx.replay().is_parking();
        if let Some(stored_id) = ctx.stored_id() {
            let (store, key) = (&settings.store, ctx.session_key());
            let kept = if parking {
                store.park(stored_id, key, &ctx.replay().parked()).await
            } else {
                store.suspend(stored_id, key).await
            };
            if let Err(err) = kept {
                run_log!(Warn, ctx.tag(), "{err}");
            }
        }
        if parking {
            run_log!(
                Debug,
                ctx.tag(),
                "parked until a decision, a re-attach or a timer"
            );
        } else {
            run_log!(Debug, ctx.tag(), "suspended until the next start");
        }
        let (slot, log) = ctx.into_parts();
        drop(slot);
        log.suspend(sse::retry_trailer());
        return;
    }
    let stored_id = ctx.stored_id().cloned();
    let key = ctx.session_key().clone();
    let run_id = ctx.run_id();
    let last_pause = ctx.last_pause().cloned();
    // Held until the end is written: a shutdown waits for it.
    let (ended, why, log, last, _ending) = finish(ctx, result);
    let outcome = kept_outcome(&settings, &key, &log, last);
    run_log!(Debug, RunTag::of(&key, run_id), "ended with {ended:?}");
    // `run.ended` for a run that paused: with its end's record when it has
    // one; the `ended` audit record last.
    let run = Subject {
        key: &key,
        run_id,
        stored: stored_id.as_deref(),
    };
    let last = last_pause.as_ref().map(|(confirmation_id, kind)| Pause {
        confirmation_id,
        kind: *kind,
    });
    let ended = PauseEvent::Ended {
        last,
        outcome: ended,
        why,
    };
    let Entry { audit, events, .. } = settings.journal().pause(run, ended);
    if let Some(stored_id) = &stored_id {
        let end = log.end();
        end_record(
            &settings.store,
            stored_id,
            &key,
            end,
            events.clone(),
            outcome,
        )
        .await;
        settings.wake_sender(&events);
    } else {
        keep_outcome(&settings, &key, outcome).await;
        settings.announce(&events).await;
    }
    // The run is over: a failure here is logged and shows on /readyz.
    let _ = settings.journal().audit(audit.as_ref()).await;
}

/// Keeps only an ended run's end in its record, for the grace, and its
/// outcome (see [`Store::end`]); see [`retry`] for a store that cannot
/// write.
pub(super) async fn end_record(
    store: &Arc<dyn Store>,
    run: &str,
    key: &SessionKey,
    end: RunEnd,
    events: Vec<OutboxEvent>,
    outcome: Option<KeptOutcome>,
) {
    let ending = Arc::new((end, events, outcome));
    retry(store, run, key, "end", move |store, run, key| {
        let ending = ending.clone();
        Box::pin(async move {
            let (end, events, outcome) = &*ending;
            store.end(&run, &key, end, events, outcome.as_ref()).await
        })
    })
    .await;
}

/// Removes the record of a run no client can reach; see [`retry`].
pub(super) async fn remove_record(store: &Arc<dyn Store>, run: &str, key: &SessionKey) {
    retry(store, run, key, "removal", |store, run, key| {
        Box::pin(async move { store.remove(&run, &key).await })
    })
    .await;
}

/// Writes an ended run's record with `write`; one that fails is tried
/// again in the background, [`STORE_RETRY`] apart and doubling, for
/// [`STORE_RETRY_FOR`] (one task per run that ended while the store could
/// not write). Nothing ended comes back meanwhile, nor if it never
/// succeeds: every decision that ends a stored pause is recorded in the
/// store before the run acts on it, so a restore shows the run's end.
async fn retry(
    store: &Arc<dyn Store>,
    run: &str,
    key: &SessionKey,
    what: &'static str,
    write: impl Fn(Arc<dyn Store>, String, SessionKey) -> BoxFuture<'static, Result<(), StoreError>>
        + Send
        + 'static,
) {
    let Err(err) = write(store.clone(), run.to_owned(), key.clone()).await else {
        return;
    };
    run_log!(
        Error,
        RunTag::session(key),
        "{err}; trying the {what} of run {run} again in the background"
    );
    let (store, run, key) = (store.clone(), run.to_owned(), key.clone());
    tokio::spawn(async move {
        let started = tokio::time::Instant::now();
        let mut delay = STORE_RETRY;
        while started.elapsed() < STORE_RETRY_FOR {
            tokio::time::sleep(delay).await;
            match write(store.clone(), run.clone(), key.clone()).await {
                Ok(()) => {
                    let tag = RunTag::session(&key);
                    run_log!(
                        Info,
                        tag,
                        "the ended run {run}'s record is written ({what})"
                    );
                    return;
                }
                Err(err) => {
                    let tag = RunTag::session(&key);
                    run_log!(Debug, tag, "the ended run {run}'s record ({what}): {err}");
                }
            }
            delay = (delay * 2).min(Duration::from_secs(60));
        }
        run_log!(
            Warn,
            RunTag::session(&key),
            "gave up the {what} of the ended run {run}'s record; a restart shows its end"
        );
    });
}

/// Turns the engine's result into the final chunk, frees the session, then
/// sends the final chunk. Returns its type, its reason or error type, and
/// the run's log.
///
/// The session is freed *before* the final chunk is sent: a client that
/// sends its next message the instant it reads the final chunk must not be
/// told `session_busy` by a run that is already over.
fn finish(
    ctx: RunContext,
    result: Result<Completion, RunError>,
) -> (
    ChunkType,
    Option<&'static str>,
    Arc<Replay>,
    Chunk,
    WritingEnd,
) {
    let ending = Ending::of(ctx.session_id(), result);
    if let Some(error_type) = ending.error {
        ctx.metrics().error(error_type);
    }
    let (slot, log) = ctx.into_parts();
    // The session is free before its final chunk is out: a client that
    // starts its next run at once is not refused.
    let writing = slot.into_ending();
    let chunk_type = ending.chunk.chunk_type;
    let mut last = ending.chunk.clone();
    last.sequence = log.push(ending.chunk);
    (chunk_type, ending.why, log, last, writing)
}

/// The outcome of a run that ended with `last`, to keep for
/// `--keep-outcome` (none when it is zero).
pub(super) fn kept_outcome(
    settings: &RunSettings,
    key: &SessionKey,
    log: &Replay,
    last: Chunk,
) -> Option<KeptOutcome> {
    if settings.keep_outcome.is_zero() {
        return None;
    }
    Some(KeptOutcome {
        namespace: settings.namespaces.name(key.owner),
        outcome: log.outcome(last),
        keep: settings.keep_outcome,
    })
}

/// Keeps the outcome of a run that has no record to end it with; a store
/// that cannot keep it says so in the log (the run's end is not held up).
async fn keep_outcome(settings: &RunSettings, key: &SessionKey, outcome: Option<KeptOutcome>) {
    let Some(kept) = outcome else {
        return;
    };
    let namespace = kept.namespace.as_deref();
    let store = &settings.store;
    if let Err(err) = store
        .keep_outcome(namespace, &kept.outcome, kept.keep)
        .await
    {
        run_log!(Warn, RunTag::session(key), "its outcome is not kept: {err}");
    }
}
