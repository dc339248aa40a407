//! The run's side of the handshake: a [`RunSlot`] registers a pause, waits
//! for its decision (or decides it itself on a timeout or a stop), and frees
//! the session's entry when dropped.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::FutureExt;
use tokio::sync::{oneshot, Notify};
use tokio_util::sync::CancellationToken;

use super::{Asking, ConfirmationManager, Decision, Pause, RunSlot};
use crate::protocol::{Action, CancelReason, PauseKind};
use crate::session::SessionKey;

/// What a pause is registered with.
#[derive(Debug)]
pub struct PauseSpec {
    pub confirmation_id: String,
    pub round: u32,
    pub options: Vec<Action>,
    /// Its kind (what the inbox, webhooks and a reply's acknowledgement
    /// say it is); `asking` is how a reply to it is checked.
    pub kind: PauseKind,
    pub asking: Asking,
    /// The run's id in a durable store, when this pause is kept there.
    pub stored: Option<Arc<str>>,
    /// When it was asked and when it expires (for the inbox).
    pub asked_at: SystemTime,
    pub expires_at: SystemTime,
    /// A quorum's approvals so far and the tasks they rejected (a pause
    /// restored from a store).
    pub tally: super::quorum::Tally,
    /// The group it was escalated to, and for which tasks (a pause
    /// restored from a store).
    pub escalated_to: Option<String>,
    pub escalations: Vec<crate::store::Escalated>,
    /// A plan whose tasks run as they are decided: its wait also ends
    /// when a task decided on its own is kept ([`Waited::Partly`]).
    pub as_decided: bool,
}

impl PauseSpec {
    /// An approval asked now, expiring in 5 minutes, kept in no store
    /// (tests).
    pub fn new(
        confirmation_id: String,
        round: u32,
        options: Vec<Action>,
        asking: Asking,
    ) -> PauseSpec {
        let asked_at = SystemTime::now();
        PauseSpec {
            confirmation_id,
            round,
            options,
            kind: PauseKind::Approval,
            asking,
            stored: None,
            asked_at,
            expires_at: asked_at + Duration::from_secs(300),
            tally: super::quorum::Tally::default(),
            escalated_to: None,
            escalations: Vec::new(),
            as_decided: false,
        }
    }
}

/// A registered pause, waiting for its decision.
pub struct PendingDecision {
    decide_rx: oneshot::Receiver<Decision>,
    /// Woken when a task decided on its own is kept (a plan whose tasks
    /// run as they are decided).
    released: Option<Arc<Notify>>,
}

/// How a wait ended.
pub enum Waited {
    /// The pause is decided.
    Decided(Decision),
    /// Tasks of a plan that runs as it is decided were decided on their
    /// own ([`RunSlot::decided_so_far`]); the pause waits on.
    Partly(PendingDecision),
}

impl RunSlot {
    pub fn session_id(&self) -> &str {
        &self.key.session_id
    }

    /// The registry this run is in.
    pub fn manager(&self) -> &super::ConfirmationManager {
        &self.manager
    }

    pub fn key(&self) -> &SessionKey {
        &self.key
    }

    pub fn run_id(&self) -> u64 {
        self.run_id
    }

    /// Registers a pause. Replies are accepted from this moment on, so call it
    /// before telling the client about the confirmation request. Once `stop`
    /// fires, replies are refused (`AlreadyDecided`): the stop decides.
    pub fn pause(
        &self,
        spec: PauseSpec,
        stop: CancellationToken,
    ) -> Result<PendingDecision, CancelReason> {
        let (decide_tx, decide_rx) = oneshot::channel();
        let released = spec.as_decided.then(|| Arc::new(Notify::new()));
        let kept_tasks = spec.tally.decided.len();
        let mut registry = self.manager.lock();
        match registry.sessions.get_mut(&self.key) {
            Some(entry) if entry.run_id == self.run_id => {
                entry.restoring = false;
                entry.pause = Some(Pause {
                    confirmation_id: spec.confirmation_id,
                    round: spec.round,
                    options: spec.options,
                    kind: spec.kind,
                    asking: spec.asking,
                    stored: spec.stored,
                    asked_at: spec.asked_at,
                    expires_at: spec.expires_at,
                    decide_tx: Some(decide_tx),
                    settling: None,
                    in_doubt: false,
                    tally: spec.tally,
                    approving: false,
                    escalated_to: spec.escalated_to,
                    escalations: spec.escalations,
                    extended: false,
                    kept_tasks,
                    released: released.clone(),
                    stop,
                });
                Ok(PendingDecision {
                    decide_rx,
                    released,
                })
            }
            // Another run took the session while this one was streaming.
            _ => Err(CancelReason::Superseded),
        }
    }

    /// Waits for the decision of `pending`, deciding it ourselves if `timeout`
    /// passes first (`Cancel(Timeout)`) or `stop` resolves first
    /// (`Cancel(<its reason>)`). Whatever wins, the pause is decided when this
    /// returns; later replies get `AlreadyDecided` while the run lives, and
    /// `NoPending` once it has ended.
    pub fn wait<'a>(
        &'a self,
        pending: PendingDecision,
        timeout: Duration,
        stop: impl Future<Output = CancelReason> + 'a,
    ) -> impl Future<Output = Decision> + 'a {
        // Not an `async fn` around the wait: its arguments would be held
        // twice for the whole pause.
        self.wait_until(pending, timeout, stop, std::future::pending())
            .map(|waited| match waited {
                Waited::Decided(decision) => decision,
                // Never woken so: `partly` never resolves.
                Waited::Partly(_) => Decision::Failed(crate::protocol::ErrorType::Internal),
            })
    }

    /// As [`RunSlot::wait`], for a plan whose tasks run as they are
    /// decided: also ends, the pause still waiting, when a task decided on
    /// its own is kept, or `wake` (a task's own expiry) has passed
    /// ([`Waited::Partly`]).
    pub async fn wait_or_partly(
        &self,
        mut pending: PendingDecision,
        timeout: Duration,
        stop: impl Future<Output = CancelReason>,
        wake: Option<Duration>,
    ) -> Waited {
        let released = pending.released.take();
        let partly = async {
            let notified = async {
                match &released {
                    Some(released) => released.notified().await,
                    None => std::future::pending().await,
                }
            };
            let due = async {
                match wake {
                    Some(after) => tokio::time::sleep(after).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = notified => {}
                () = due => {}
            }
        };
        let waited = self.wait_until(pending, timeout, stop, partly).await;
        match waited {
            Waited::Partly(mut pending) => {
                pending.released = released;
                Waited::Partly(pending)
            }
            decided => decided,
        }
    }

    async fn wait_until(
        &self,
        mut pending: PendingDecision,
        timeout: Duration,
        stop: impl Future<Output = CancelReason>,
        partly: impl Future<Output = ()>,
    ) -> Waited {
        let mut deadline = tokio::time::Instant::now() + timeout;
        let mut stop = std::pin::pin!(stop);
        let mut partly = std::pin::pin!(partly);
        let fallback = loop {
            tokio::select! {
                biased;
                decided = &mut pending.decide_rx => {
                    // Only a superseding run drops a sender unsent... and it sends.
                    return Waited::Decided(
                        decided.unwrap_or(Decision::Cancel(CancelReason::Superseded)),
                    );
                }
                () = &mut partly => return Waited::Partly(pending),
                () = tokio::time::sleep_until(deadline) => {
                    // An escalation may have moved the expiry (`escalate_extends`).
                    match self.time_left() {
                        Some(left) => deadline = tokio::time::Instant::now() + left,
                        None => break CancelReason::Timeout,
                    }
                }
                reason = &mut stop => break reason,
            }
        };
        Waited::Decided(match self.settle(fallback) {
            Some(decision) => decision,
            // Somebody decided first and their decision is on its way (an
            // audit record being written): it stands, so wait for it.
            None => pending
                .decide_rx
                .await
                .unwrap_or(Decision::Cancel(CancelReason::Superseded)),
        })
    }

    /// How long the pause has left by its expiry now, when an escalation
    /// moved it (`escalate_extends`) past the wait's deadline (by more
    /// than a second).
    /// How long this run's latest pause was given, from when it was asked
    /// to its expiry (an escalation's extension included): what its
    /// `interaction.expired` says it waited.
    pub fn pause_span(&self) -> Option<Duration> {
        let registry = self.manager.lock();
        let pause = registry
            .sessions
            .get(&self.key)
            .filter(|entry| entry.run_id == self.run_id)?
            .pause
            .as_ref()?;
        pause.expires_at.duration_since(pause.asked_at).ok()
    }

    fn time_left(&self) -> Option<Duration> {
        let registry = self.manager.lock();
        let pause = registry
            .sessions
            .get(&self.key)
            .filter(|entry| entry.run_id == self.run_id)?
            .pause
            .as_ref()
            .filter(|pause| pause.extended)?;
        pause
            .expires_at
            .duration_since(SystemTime::now())
            .ok()
            .filter(|left| *left > Duration::from_secs(1))
    }

    /// Decides the pause with `fallback` if nobody has yet (`Some`); `None`
    /// when a decision was taken first: a reply that was (or will be) told
    /// `confirmation_received` is never overruled.
    fn settle(&self, fallback: CancelReason) -> Option<Decision> {
        let mut registry = self.manager.lock();
        let entry = registry
            .sessions
            .get_mut(&self.key)
            .filter(|entry| entry.run_id == self.run_id)?;
        // Superseded runs (no entry) return None above: the superseding run
        // sent its decision before replacing us.
        let pause = entry.pause.as_mut()?;
        match pause.decide_tx.take() {
            // Nobody decided yet: we do, by dropping the only sender.
            Some(_decide_tx) => Some(Decision::Cancel(fallback)),
            None => {
                // A decision is on its way; should it be withdrawn, ours stands.
                pause.settling = Some(fallback);
                None
            }
        }
    }
}

impl Drop for RunSlot {
    fn drop(&mut self) {
        let mut registry = self.manager.lock();
        if registry
            .sessions
            .get(&self.key)
            .is_some_and(|entry| entry.run_id == self.run_id)
        {
            registry.remove(&self.key);
        }
        drop(registry);
        // Woken after the lock is released.
        self.manager.shared.entry_removed.notify_waiters();
    }
}

/// A run that has freed its session (its final chunk is out, the session
/// may start its next run) and still writes its end: its outcome, its
/// store record, its audit record. A shutdown waits for it as for a run
/// (see [`ConfirmationManager::wait_until_empty`]), so what a client was
/// shown as the end is also what the next process finds.
pub struct WritingEnd {
    manager: ConfirmationManager,
}

impl RunSlot {
    /// Frees the session's entry (as dropping the slot does) and holds the
    /// shutdown until the returned [`WritingEnd`] is dropped.
    pub fn into_ending(self) -> WritingEnd {
        let manager = self.manager.clone();
        manager.shared.ending.fetch_add(1, Ordering::SeqCst);
        drop(self);
        WritingEnd { manager }
    }
}

impl Drop for WritingEnd {
    fn drop(&mut self) {
        self.manager.shared.ending.fetch_sub(1, Ordering::SeqCst);
        self.manager.shared.entry_removed.notify_waiters();
    }
}
