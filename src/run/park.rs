//! Parked pauses (#46), the runs' side: waking one, and the one timer that
//! drives the expiries and timers of them all.
//!
//! With a durable store, a paused run that no client holds is parked once
//! it has been detached for `--park-after` (`stream.rs` tries, the log
//! decides, `end.rs` writes its whole log to its record and lets go of
//! it): its task, engine state, replay buffer and timers leave memory, and
//! its record is all that is left of it.
//!
//! A request about its session wakes it ([`Runs::wake`], from
//! [`Runs::place`]: a reply, a re-attach, a new message, an approver's
//! link or button, another face), restored from its record as after a
//! restart, before the request goes on as if it had never left: one wake
//! per session at a time, the next request finds it held.
//!
//! With one process (`sqlite:`), one sweep ([`Runs::start_park_sweep`])
//! reads the store's ordered index of parked pauses whose expiry or next
//! timer is due, in bounded batches, their records with them (one read for
//! a batch), and wakes each: a record is used as read unless its run parked
//! again since the look began (the sessions noted as parked carry a mark
//! of when: then it is read anew). An expired one ends
//! `timeout`, announced as its own timer would have; one whose reminder or
//! escalation came due fires it, and parks again. Replicas park by handing
//! the run back to nobody, and their sweep (`expiry.rs`) already finds a
//! run nobody holds whose expiry or timer is due.

use std::time::Duration;

use futures_util::StreamExt;

use super::replay::park::Visit;
use super::Runs;
use crate::session::run_log;
use crate::session::{RunTag, SessionKey};
use crate::store::{DueBatch, DueFrom, PausedRecord, StoreError};

/// How often the sweep looks for parked pauses that came due.
pub const PARK_SWEEP: Duration = Duration::from_secs(1);
/// Most parked pauses one look takes of each order (expiry, next timer);
/// a full batch is followed by the next one at once, read while it is
/// woken.
const SWEEP_BATCH: usize = 512;
/// Parked pauses the sweep wakes at once.
const SWEEP_WAKES: usize = 128;

impl Runs {
    /// Whether pauses park here (a durable store): a session's run may
    /// then be in the store and nowhere in memory.
    pub(super) fn parks(&self) -> bool {
        self.stream.park_after.is_some()
    }

    /// Whether this process holds `key`'s run (or a run's end), for a
    /// request about to act on it: a run being parked is waited for, and
    /// then is not held; one that is not being parked stays (see
    /// [`Visit`]). A run suspended here is not held: it goes on elsewhere.
    pub(super) async fn held(&self, key: &SessionKey) -> bool {
        loop {
            let Some(log) = self.replays.find(key).filter(|log| !log.is_suspended()) else {
                return self.manager.holds(key);
            };
            match log.visit() {
                Visit::Held => return true,
                Visit::Parking => log.until_parked().await,
            }
        }
    }

    /// Wakes `key`'s parked run, if it has one that no process holds: it
    /// is restored from its record as after a restart (an expired one
    /// ends `timeout`). One wake at a time per session; a wake that finds
    /// the run held does nothing.
    pub(super) async fn wake(&self, key: &SessionKey) -> Result<(), StoreError> {
        if !self.parks() {
            return Ok(());
        }
        // A session stays noted until its wake has registered its pause
        // again: a request that finds the run held meanwhile waits for the
        // wake's turn, so that it never finds a pause half restored.
        let held = self.held(key).await;
        if !self.replays.may_be_parked(key) {
            return Ok(());
        }
        if held {
            let _turn = self.replays.turn(key).lock().await;
            return Ok(());
        }
        self.wake_from_store(key, None).await.map(drop)
    }

    /// [`Runs::wake`], asking the store whatever the sessions noted as
    /// parked say (the sweep: the store's schedule is the truth); whether
    /// it found a parked run. `read`: its record as a look at the store
    /// that began at a mark read it, used if the run has not parked again
    /// since (else read anew).
    async fn wake_from_store(
        &self,
        key: &SessionKey,
        read: Option<(PausedRecord, u64)>,
    ) -> Result<bool, StoreError> {
        if self.shutdown.is_cancelled() {
            return Ok(false);
        }
        let _turn = self.replays.turn(key).lock().await;
        if self.held(key).await {
            return Ok(false);
        }
        let namespace = self.settings.namespaces.name(key.owner);
        let store = &self.settings.store;
        let record = match read {
            Some((record, mark)) if self.replays.parked_before(key, mark) => Some(record),
            _ => {
                store
                    .parked_run(namespace.as_deref(), &key.session_id)
                    .await?
            }
        };
        let Some(record) = record else {
            self.replays.note_woken(key);
            return Ok(false);
        };
        run_log!(Debug, RunTag::session(key), "run {} woken", record.run);
        let run = record.run.clone();
        let restored = self.restore_one(record).await;
        self.replays.note_woken(key);
        if restored {
            // Off the request's path: a decision that follows unparks it too.
            let store = store.clone();
            tokio::spawn(async move {
                if let Err(err) = store.unpark(&run).await {
                    ::log::debug!("run {run} stays marked parked: {err}");
                }
            });
        }
        Ok(true)
    }

    /// With one process and a durable store: wakes the parked pauses whose
    /// expiry or next timer came due, until shutdown.
    pub fn start_park_sweep(&self) {
        if self.cluster.is_some() || !self.parks() {
            return;
        }
        let runs = self.clone();
        tokio::spawn(async move {
            // The first pass at once: what came due while no process ran.
            loop {
                runs.sweep_parked().await;
                tokio::select! {
                    () = tokio::time::sleep(PARK_SWEEP) => {}
                    () = runs.shutdown.cancelled() => return,
                }
            }
        });
    }

    /// One pass over the parked pauses that came due: batches of at most
    /// [`SWEEP_BATCH`] of each order, each woken [`SWEEP_WAKES`] at once
    /// while the next batch is read.
    async fn sweep_parked(&self) {
        let mut look = self.look_due(DueFrom::default()).await;
        // More than one batch due: webhook deliveries give way until the
        // pass is done (what it announces waits in the outbox).
        let backlog = look.as_ref().is_some_and(|(_, due)| due.more.is_some());
        let _give_way = match &self.settings.webhooks {
            Some(hooks) if backlog => Some(hooks.give_way()),
            _ => None,
        };
        while let Some((mark, batch)) = look.take() {
            let next = batch.more.map(|from| self.look_due(from));
            let woken = self.wake_due(batch.records, mark);
            look = match next {
                Some(next) => tokio::join!(woken, next).1,
                None => {
                    woken.await;
                    None
                }
            };
            if self.shutdown.is_cancelled() {
                return;
            }
        }
    }

    /// The next batch of parked pauses that came due, from `from` on, with
    /// the mark it was read at (see [`Runs::wake_from_store`]).
    async fn look_due(&self, from: DueFrom) -> Option<(u64, DueBatch<PausedRecord>)> {
        let mark = self.replays.parked_mark();
        let now_ms = crate::clock::now_ms();
        match self
            .settings
            .store
            .parked_due(now_ms, from, SWEEP_BATCH)
            .await
        {
            Ok(batch) if !batch.records.is_empty() || batch.more.is_some() => Some((mark, batch)),
            Ok(_) => None,
            Err(err) => {
                ::log::debug!("parked pauses that came due: {err}");
                None
            }
        }
    }

    /// Wakes the parked pauses of `due` (read at `mark`), [`SWEEP_WAKES`]
    /// at once.
    async fn wake_due(&self, due: Vec<PausedRecord>, mark: u64) {
        futures_util::stream::iter(due)
            .for_each_concurrent(SWEEP_WAKES, |record| async move {
                // A namespace no longer configured: its records go at a
                // start (`restore_one`); nobody can reach them meanwhile.
                let namespace = record.namespace.as_deref();
                let Some(owner) = self.settings.namespaces.owner(namespace) else {
                    return;
                };
                let key = SessionKey::new(owner, &record.session_id);
                if self.held(&key).await {
                    return;
                }
                if let Err(err) = self.wake_from_store(&key, Some((record, mark))).await {
                    run_log!(Debug, RunTag::session(&key), "{err}");
                }
            })
            .await;
    }
}
