//! A new message's path: it takes its session (superseding the session's
//! paused run, a decision recorded like any other before it takes effect),
//! claims the session in the cluster when there is one, and starts its run.
//!
//! A supersede is a decision on the old pause: with a durable store it is
//! recorded before the old run is told, so that an old pause that was
//! superseded never comes back after a restart or at another replica. With
//! replicas the record and the claim of the session are one Redis script.

use std::sync::Arc;
use std::time::SystemTime;

use super::context::RunContext;
use super::end::drive;
use super::journal::{Entry, Pause, PauseEvent, Subject};
use super::replay::Replay;
use super::stop::RunStop;
use super::stream::Subscription;
use super::Runs;
use crate::cluster::{Claimed, Cluster, Peer, SETTLE_PATIENCE};
use crate::confirmation::{BeginError, Begun, RunSlot};
use crate::session::run_log;
use crate::session::{RunTag, SessionKey};
use crate::store::{Fault, Resolution, StoreError};

/// Where a new message went.
pub enum Started {
    /// Its run started here: its first client's stream.
    Here(Subscription),
    /// A live replica owns the session: the message is to be forwarded.
    Elsewhere(Peer),
}

/// Why a new message did not start a run. None of these took effect.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Begin(#[from] BeginError),
    /// The store cannot record the supersede, or claim the session.
    #[error("the store cannot record this message's run now, so it was not started; retry")]
    Store(StoreError),
    /// The session's paused run is another replica's now: retry (the
    /// retry reaches the owner).
    #[error(
        "this session's paused run was taken over by another replica meanwhile; nothing was \
         started: retry"
    )]
    Moved,
    /// The store did not say whether the session was claimed.
    #[error(
        "the store did not answer in time, so whether this message started a run is not known \
         yet; re-attach (Last-Event-ID) to see the session's run, or send the message again"
    )]
    Unknown,
    /// Forwarded here, after the replica that forwarded it gave up on it.
    #[error("this forwarded request came after its forwarding replica gave up; it was not taken")]
    Late,
}

impl Runs {
    /// Starts a run of `message` on `key`, superseding the session's paused
    /// run, and returns the stream of its first client; or names the live
    /// replica that owns the session. `not_after`: a forwarded request's
    /// deadline, past which nothing is taken.
    pub async fn start(
        &self,
        key: SessionKey,
        message: String,
        not_after: Option<SystemTime>,
    ) -> Result<Started, StartError> {
        self.start_named(key, message, not_after, None).await
    }

    /// [`Runs::start`], the run named `run` (the id a store keeps its
    /// pauses under; a face that names runs, A2A, finds it again by it).
    /// Without a durable store nothing keeps the name.
    pub async fn start_named(
        &self,
        key: SessionKey,
        message: String,
        not_after: Option<SystemTime>,
        run: Option<Arc<str>>,
    ) -> Result<Started, StartError> {
        if not_after.is_some_and(|deadline| SystemTime::now() > deadline) {
            return Err(StartError::Late);
        }
        if self.cluster.is_none() {
            // A parked run on the session is woken, to be superseded (#46).
            self.wake(&key).await.map_err(StartError::Store)?;
        }
        let begun = self.manager.begin_run(key.clone(), self.limits)?;
        let (slot, stored_id) = match &self.cluster {
            None => {
                let named = run.filter(|_| self.settings.store.is_durable());
                (self.supersede_in_store(&key, begun).await?, named)
            }
            Some(cluster) => match self.claim(cluster.clone(), &key, begun, run).await? {
                Taken::Here(slot, run) => (slot, Some(run)),
                Taken::Elsewhere(peer) => return Ok(Started::Elsewhere(peer)),
            },
        };
        let stop = RunStop::under(&self.shutdown);
        let log = Replay::new(self.replay_limits, stop.clone());
        self.replays.publish(key.clone(), log.clone());
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
        Ok(Started::Here(subscription))
    }

    /// One node: a superseded pause kept in the store has its decision
    /// recorded before the new run takes the session.
    async fn supersede_in_store(
        &self,
        key: &SessionKey,
        begun: Begun,
    ) -> Result<RunSlot, StartError> {
        let Begun::Supersedes(taken) = &begun else {
            return Ok(begun.now());
        };
        // Announced by the taker, before the new run can pause: a
        // session's events stay in order.
        let Entry {
            events, decision, ..
        } = self.superseded(key, taken);
        let (Some(run), Some(decision)) = (taken.stored(), decision) else {
            self.settings.announce(&events).await;
            return Ok(begun.now());
        };
        match self
            .settings
            .store
            .record_decision(run, key, &decision, &events)
            .await
        {
            Ok(()) => {
                self.settings.wake_sender(&events);
                Ok(begun.now())
            }
            // Nothing of it is left to protect: supersede it.
            Err(err) if err.fault == Fault::Lost => Ok(begun.now()),
            // `begun` is dropped: the old pause waits again.
            Err(err) => {
                run_log!(Error, RunTag::session(key), "{err}");
                Err(StartError::Store(err))
            }
        }
    }

    /// What is written of a supersede: the decision kept on the old pause
    /// and its `interaction.decided` (none without webhooks).
    fn superseded(&self, key: &SessionKey, taken: &crate::confirmation::Superseding) -> Entry {
        let run = Subject {
            key,
            run_id: taken.run_id(),
            stored: taken.stored().map(|run| &**run),
        };
        let pause = Pause {
            confirmation_id: taken.confirmation_id(),
            kind: taken.kind(),
        };
        self.settings
            .journal()
            .pause(run, PauseEvent::Superseded { pause })
    }

    /// Replicas: the session is claimed for the new run (the superseded
    /// pause, this replica's, decided in the same step).
    async fn claim(
        &self,
        cluster: Arc<Cluster>,
        key: &SessionKey,
        begun: Begun,
        run: Option<Arc<str>>,
    ) -> Result<Taken, StartError> {
        let (decision, events) = match &begun {
            Begun::Supersedes(taken) => {
                let entry = self.superseded(key, taken);
                let kept = taken.stored().cloned().zip(entry.decision);
                (kept, entry.events)
            }
            Begun::Fresh(_) => (None, Vec::new()),
        };
        // A stored pause's supersede is queued with its decision; another's
        // on its own once the claim stands.
        let (with_claim, after_claim) = match decision {
            Some(_) => (events, Vec::new()),
            None => (Vec::new(), events),
        };
        let claimed = cluster
            .claim(
                key,
                run,
                decision.as_ref().map(|(run, d)| (run.as_ref(), d)),
                &with_claim,
            )
            .await;
        match claimed {
            Ok(Claimed::Here(run)) => {
                self.settings.wake_sender(&with_claim);
                self.settings.announce(&after_claim).await;
                Ok(Taken::Here(begun.now(), run))
            }
            Ok(Claimed::Elsewhere(peer)) => {
                if matches!(begun, Begun::Supersedes(_)) {
                    // The copy here is stale: another replica owns it now.
                    drop(begun);
                    self.relinquish(key);
                }
                Ok(Taken::Elsewhere(peer))
            }
            Ok(Claimed::Moved) => {
                drop(begun);
                self.relinquish(key);
                Err(StartError::Moved)
            }
            Ok(Claimed::Unknown(pending)) => {
                // Settled in the background; the client re-attaches to learn.
                tokio::spawn(async move {
                    let settled = cluster.settle_claim(&pending, SETTLE_PATIENCE * 15).await;
                    match (settled, begun) {
                        (Ok(Resolution::Recorded), Begun::Supersedes(taken)) => taken.abandon(),
                        // Void, or still unknown: the old pause waits again;
                        // a late claim is fenced (its epoch) and never acts.
                        (_, begun) => drop(begun),
                    }
                });
                Err(StartError::Unknown)
            }
            Err(err) => {
                run_log!(Error, RunTag::session(key), "{err}");
                Err(StartError::Store(err))
            }
        }
    }
}

/// What a claim gave the new run.
enum Taken {
    Here(RunSlot, Arc<str>),
    Elsewhere(Peer),
}
