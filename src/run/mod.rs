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
use crate::audit;
use crate::cluster::Cluster;
use crate::confirmation::{
    BeginError, ConfirmationManager, PendingDecision, RunLimits, SessionKey,
};
use crate::engine::{Engine, RestoredParts, RunContext, RunError, RunSettings};
use crate::metrics::Metrics;
use crate::protocol::{meta, CancelReason, Chunk, ChunkType, ErrorType};
use crate::store::redis::{Claim, Owner, Remote};
use crate::store::{PausedRecord, StoreError};

/// What a suspended run's stream ends with: come back in a second (SSE's
/// `retry:` field), then the connection closes without a final chunk.
const SUSPEND_TRAILER: &[u8] = b"retry: 1000\n\n";

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
    /// The replicas this server is one of (`--store redis://`).
    pub cluster: Option<Arc<Cluster>>,
}

/// Why a re-attach found nothing to attach to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReattachError {
    /// No run, or not one of this API key's, on the session.
    NoSuchRun,
    /// `Last-Event-ID` is beyond the last chunk sent.
    Beyond(BeyondEnd),
}

/// Where a request about a session is to be answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// Here; for a new run, with its id in the store when it has one.
    Here(Option<Arc<str>>),
    /// At the live replica that owns the session.
    Owner(Remote),
    /// Nowhere while this replica shuts down: the run's owner is gone, and
    /// a replica that is stopping takes nothing over (retry elsewhere).
    Draining,
}

impl Runs {
    /// Starts a run of `message` on `key` (superseding a paused one) and
    /// returns the stream of its first client. `stored_id` is the run's id
    /// in the store when a replica's claim named it (see [`Runs::claim`]).
    pub fn start(
        &self,
        key: SessionKey,
        message: String,
        stored_id: Option<Arc<str>>,
    ) -> Result<Subscription, BeginError> {
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
        )
        .with_stored_id(stored_id);
        tokio::spawn(drive(self.engine.clone(), ctx));
        Ok(subscription)
    }

    /// Where a new run on `key` starts: here (with replicas, once this one
    /// has claimed the session in the store), or at the live replica that
    /// owns the session (whose run a new message supersedes or is refused by).
    pub async fn claim(&self, key: &SessionKey) -> Result<Place, StoreError> {
        let Some(cluster) = &self.cluster else {
            return Ok(Place::Here(None));
        };
        let run = uuid::Uuid::new_v4().to_string();
        match cluster.store().claim(key, &run).await? {
            Claim::Claimed => Ok(Place::Here(Some(Arc::from(run)))),
            Claim::Owned(owner) => Ok(Place::Owner(owner)),
        }
    }

    /// Where a reply or a re-attach on `key` is answered: here when the
    /// session's run is here (or nowhere), at its owner when a live replica
    /// holds it. A run whose owner is gone is taken over and restored here
    /// first, as after a restart.
    pub async fn place(&self, key: &SessionKey) -> Result<Place, StoreError> {
        let Some(cluster) = &self.cluster else {
            return Ok(Place::Here(None));
        };
        if self.holds(key) {
            return Ok(Place::Here(None));
        }
        // One takeover at a time per session: a second request waits, then
        // finds the run here.
        let _turn = cluster.stripe(key).lock().await;
        if self.holds(key) {
            return Ok(Place::Here(None));
        }
        let store = cluster.store();
        match store.take_over(key, !self.shutdown.is_cancelled()).await? {
            Owner::Nobody | Owner::Mine(_) => {}
            Owner::Elsewhere(owner) => return Ok(Place::Owner(owner)),
            Owner::Orphan => return Ok(Place::Draining),
            Owner::TakenOver(run) => match store.get(&run).await? {
                Some(record) => {
                    ::log::info!("took over run {run} of a replica that is gone");
                    self.restore_one(record).await;
                }
                // It was working when its owner went, or it had ended.
                None => store.forget(key, &run).await?,
            },
        }
        Ok(Place::Here(None))
    }

    /// Whether this process has a run (or a run's end, re-attachable) on
    /// `key`. A run suspended here is not: with replicas it goes on elsewhere.
    fn holds(&self, key: &SessionKey) -> bool {
        self.logs.find(key).is_some_and(|log| !log.is_suspended()) || self.manager.holds(key)
    }

    /// Restores the paused runs a durable store kept (at start): each waits
    /// again, with the time it has left, for its decision, and its engine
    /// goes on from it. Returns how many runs were restored. (Replicas
    /// restore lazily, see [`Runs::place`].)
    pub async fn restore(&self) -> Result<usize, String> {
        let store = self.settings.store.clone();
        if !store.is_durable() || self.cluster.is_some() {
            return Ok(0);
        }
        let records = store.load().await.map_err(|err| err.to_string())?;
        let mut restored = 0;
        for record in records {
            restored += usize::from(self.restore_one(record).await);
        }
        Ok(restored)
    }

    /// Restores one stored run; returns whether it waits again. A pause
    /// that expired meanwhile ends `timeout`; a run whose decision was
    /// recorded but whose work was cut short ends `interrupted` (never run
    /// twice). Either end stays re-attachable for `--detach-grace`. The
    /// pause is registered before this returns: a reply that follows finds it.
    async fn restore_one(&self, record: PausedRecord) -> bool {
        let Some(owner) = self.settings.namespaces.owner(record.namespace.as_deref()) else {
            // Its API key is not configured any more: no client can reach
            // it, and it must not land in anyone else's namespace.
            ::log::warn!(
                "dropping stored run {} of session {:?}: its API key is not configured",
                record.run,
                record.session_id
            );
            let orphan = SessionKey::new(None, &record.session_id);
            if let Err(err) = self.settings.store.remove(&record.run, &orphan).await {
                ::log::error!("{err}");
            }
            return false;
        };
        let key = SessionKey::new(owner, &record.session_id);
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let ending = if record.decision.is_some() {
            Some(Chunk::failed(
                &record.session_id,
                ErrorType::Interrupted,
                "The server stopped after this run's decision and before its work was done; \
                 it is not run again (it may have partly run)."
                    .to_owned(),
            ))
        } else if record.expires_at_ms <= now_ms {
            Some(Chunk::cancelled(&record.session_id, CancelReason::Timeout))
        } else if record.engine != self.engine.name() {
            Some(Chunk::failed(
                &record.session_id,
                ErrorType::Interrupted,
                format!(
                    "This run's engine ({}) is not the server's now.",
                    record.engine
                ),
            ))
        } else {
            None
        };
        if let Some(ending) = ending {
            self.end_restored(key, record, ending).await;
            return false;
        }
        let Ok(slot) = self.manager.begin_run(key.clone(), RunLimits::UNLIMITED) else {
            return false;
        };
        let stop = RunStop::under(&self.shutdown);
        let log = RunLog::restore(
            self.log_limits,
            stop.clone(),
            record.frames.clone(),
            record.next_seq,
        );
        self.logs.publish(key.clone(), log.clone());
        stream::expire_unclaimed(log.clone(), key, self.stream.clone());
        let mut ctx = RunContext::restored(RestoredParts {
            message: record.message.clone(),
            slot,
            settings: self.settings.clone(),
            log,
            stop,
            metrics: self.metrics.clone(),
            stored_id: Arc::from(record.run.as_str()),
            round: record.round,
        });
        let pending = ctx.restore_pause(&record);
        tokio::spawn(drive_restored(self.engine.clone(), ctx, record, pending));
        true
    }

    /// A stored run that cannot go on: its end is written after its frames,
    /// kept re-attachable for the grace, and the record is removed.
    async fn end_restored(&self, key: SessionKey, record: PausedRecord, ending: Chunk) {
        if let Some(audit) = &self.settings.audit {
            let run_id = self.manager.number_run();
            let fields = audit::run_fields(run_id, &record.session_id, Some(&record.run));
            let why = ending
                .metadata
                .get(meta::REASON)
                .or(ending.metadata.get(meta::ERROR_TYPE));
            let why = why.and_then(|w| w.as_str()).map(str::to_owned);
            audit_ended(audit, fields, ending.chunk_type, why.as_deref()).await;
        }
        let stop = RunStop::under(&self.shutdown);
        let log = RunLog::restore(self.log_limits, stop, record.frames, record.next_seq);
        log.push(ending);
        self.logs.publish(key.clone(), log.clone());
        stream::expire_unclaimed(log, key.clone(), self.stream.clone());
        if let Err(err) = self.settings.store.remove(&record.run, &key).await {
            ::log::error!("{err}");
        }
    }

    /// Another replica took the run of `key` over (this one's heartbeat had
    /// lapsed): the copy here is suspended, as at a shutdown, so that its
    /// stream ends with `retry:` and its client re-attaches to the owner.
    pub fn relinquish(&self, key: &SessionKey) {
        if let Some(log) = self.logs.find(key) {
            log.stop.stop(CancelReason::Shutdown);
        }
    }

    /// With replicas: keeps this replica's heartbeat, and when it finds the
    /// heartbeat had lapsed, hands over every run here that another replica
    /// took over meanwhile (see [`Runs::relinquish`]).
    pub async fn start_heartbeat(&self) {
        let Some(cluster) = self.cluster.clone() else {
            return;
        };
        let runs = self.clone();
        cluster
            .start_heartbeat(move || {
                let runs = runs.clone();
                tokio::spawn(async move { runs.hand_over_taken().await });
            })
            .await;
    }

    /// Relinquishes the paused runs here whose session another process
    /// owns. Only paused ones: a run at work here goes on to its end (what
    /// it does was decided here, and stopping it would be a shutdown that
    /// is not one).
    async fn hand_over_taken(&self) {
        let Some(cluster) = &self.cluster else {
            return;
        };
        let keys: Vec<SessionKey> = self
            .logs
            .keys()
            .into_iter()
            .filter(|key| self.manager.is_paused(key))
            .collect();
        match cluster.store().instances(&keys).await {
            Ok(owners) => {
                let me = cluster.store().instance();
                for (key, owner) in keys.iter().zip(owners) {
                    if owner.is_some_and(|owner| !owner.is_empty() && owner != me) {
                        self.relinquish(key);
                    }
                }
            }
            Err(err) => ::log::warn!("cannot check which runs are still ours: {err}"),
        }
    }

    /// Re-attaches to the run of `key`, replaying every chunk after `last_seen`.
    pub fn reattach(&self, key: SessionKey, last_seen: u64) -> Result<Subscription, ReattachError> {
        let log = self.logs.find(&key).ok_or(ReattachError::NoSuchRun)?;
        Subscription::attach(log, key, last_seen, self.stream.clone())
            .map_err(ReattachError::Beyond)
    }
}

/// Runs the engine to its end and sends exactly one final chunk.
async fn drive(engine: Arc<dyn Engine>, mut ctx: RunContext) {
    // A panicking engine must still end its stream with a final chunk and
    // free its session; the panic itself is logged, never sent.
    let result = AssertUnwindSafe(engine.run(&mut ctx))
        .catch_unwind()
        .await
        .unwrap_or_else(|_| panicked());
    // Boxed: the records written at the end must not enlarge the task every
    // paused run is held in.
    Box::pin(conclude(ctx, result)).await;
}

/// A restored run: waits on its stored pause, then its engine goes on.
async fn drive_restored(
    engine: Arc<dyn Engine>,
    mut ctx: RunContext,
    record: PausedRecord,
    pending: Result<PendingDecision, RunError>,
) {
    let resumed = match pending {
        Ok(pending) => ctx.resume_pause(pending, &record).await,
        Err(err) => Err(err),
    };
    let result = match resumed {
        Ok(approval) => match engine.resume(&mut ctx, record.state, approval) {
            Some(going_on) => AssertUnwindSafe(going_on)
                .catch_unwind()
                .await
                .unwrap_or_else(|_| panicked()),
            None => Err(RunError::Failed {
                error_type: ErrorType::Interrupted,
                message: "this run's engine cannot go on after a restart".to_owned(),
            }),
        },
        Err(err) => Err(err),
    };
    Box::pin(conclude(ctx, result)).await;
}

fn panicked() -> Result<crate::engine::Completion, RunError> {
    ::log::error!("engine panicked during a run");
    Err(RunError::Failed {
        error_type: ErrorType::Internal,
        message: "internal error".to_owned(),
    })
}

/// Ends a run: its final chunk, its store record, its audit record. A run
/// suspended by a shutdown (its pause kept in a durable store) gets no
/// final chunk: its stream ends with a `retry:` line, its record stays.
async fn conclude(ctx: RunContext, result: Result<crate::engine::Completion, RunError>) {
    let settings = ctx.settings_handle();
    if matches!(result, Err(RunError::Suspended)) {
        // The record stays for the next process; with replicas the run is
        // handed back, for any of them to take over at once.
        if let Some(stored_id) = ctx.stored_id() {
            if let Err(err) = settings.store.suspend(stored_id, ctx.session_key()).await {
                ::log::warn!("{err}");
            }
        }
        let (slot, log) = ctx.into_parts();
        drop(slot);
        log.suspend(bytes::Bytes::from_static(SUSPEND_TRAILER));
        ::log::debug!("run suspended until the next start");
        return;
    }
    let stored_id = ctx.stored_id().cloned();
    let key = ctx.session_key().clone();
    let (run_id, session_id) = (ctx.run_id(), ctx.session_id().to_owned());
    let (ended, why) = finish(ctx, result);
    ::log::debug!("run ended with {ended:?}");
    if let Some(stored_id) = &stored_id {
        if let Err(err) = settings.store.remove(stored_id, &key).await {
            ::log::error!("{err}");
        }
    }
    if let Some(audit) = &settings.audit {
        let fields = audit::run_fields(run_id, &session_id, stored_id.as_deref());
        audit_ended(audit, fields, ended, why).await;
    }
}

/// The `ended` audit record: the run's outcome (its final chunk's type)
/// and reason (a cancel's reason or an error's type).
async fn audit_ended(
    audit: &Arc<audit::AuditLog>,
    mut fields: serde_json::Map<String, serde_json::Value>,
    ended: ChunkType,
    why: Option<&str>,
) {
    fields.insert(
        "outcome".into(),
        serde_json::to_value(ended).unwrap_or_default(),
    );
    fields.insert("reason".into(), why.into());
    // The run is over: a failure here is logged and shows on /readyz.
    let _ = audit.write("ended", fields).await;
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
        Err(RunError::Suspended) => (
            // Handled by `conclude`; kept total for the type's sake.
            Chunk::cancelled(&session_id, CancelReason::Shutdown),
            Some(CancelReason::Shutdown.as_str()),
        ),
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
