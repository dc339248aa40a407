//! [`RunContext`]: everything an engine may do during a run. Sending chunks,
//! waiting, asking ([`RunContext::confirm`], [`RunContext::ask`]: one path
//! for every kind of pause in `pause`, each kind's request,
//! acknowledgement and restore in its own file under `kinds/`), and
//! running declared tools (`tools`). Engines see only its public methods;
//! the run's settings (store, audit log, webhooks) stay the run's.
//!
//! A paused run holds the future of its `confirm` call for the whole pause:
//! every method keeps what it awaits small, and boxes what it need not hold.

pub(crate) mod asked;
mod calls;
mod cleared;
mod exactly_once;
mod expiry;
mod fallback;
mod grants;
pub(crate) mod kinds;
mod links;
mod pause;
pub mod policy;
pub mod previews;
mod receipts;
mod restored;
mod timers;
pub mod tools;

pub use cleared::Cleared;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::journal::{PauseEvent, Subject};
use super::outcome::RunError;
use super::replay::Replay;
use super::settings::RunSettings;
use super::stop::RunStop;
use crate::audit::{AuditError, AuditRecord};
use crate::confirmation::RunSlot;
use crate::metrics::Metrics;
use crate::pause::grant::GrantSpec;
use crate::protocol::{Chunk, ChunkType};
use crate::protocol::{ErrorType, PauseKind};
use crate::session::{RunTag, SessionKey};
use crate::tools::Tools;

/// What a restored run's context is made of.
pub(crate) struct RestoredParts {
    pub message: String,
    pub slot: RunSlot,
    pub settings: Arc<RunSettings>,
    pub replay: Arc<Replay>,
    pub stop: RunStop,
    pub metrics: Arc<Metrics>,
    pub stored_id: Arc<str>,
    pub round: u32,
}

/// Everything an engine may do during a run.
pub struct RunContext {
    message: String,
    slot: RunSlot,
    /// Shared by every run of the server.
    settings: Arc<RunSettings>,
    replay: Arc<Replay>,
    round: u32,
    /// Fires on every reason to stop, server shutdown included.
    stop: RunStop,
    metrics: Arc<Metrics>,
    /// The run's id in the store, unique across restarts: given at start
    /// by a replica (its claim on the session), else made when the run
    /// first stores a pause (never with the memory store).
    stored_id: Option<Arc<str>>,
    /// The current pause is kept in a durable store: a shutdown suspends
    /// the run instead of cancelling it.
    pause_stored: bool,
    /// Calls run without a confirmation so far (`confirm = false` tools).
    unconfirmed_calls: usize,
    /// With webhooks: the last pause (its id and kind), which `run.ended`
    /// names; `None` for a run that never paused (it has no such event).
    last_pause: Option<Box<(String, PauseKind)>>,
    /// A confirm's grant (and the pause it was given on), taken with the
    /// decision and kept before the run goes on.
    pending_grant: Option<Box<(GrantSpec, String)>>,
    /// A plan's pause left open while the tasks decided so far are
    /// carried out (`Approval::Partly`).
    open: Option<Box<asked::Open>>,
    /// The grants the run's calls spent, latest last (a few), for their
    /// receipts.
    granted: Vec<cleared::Granted>,
    /// The preview digests of the latest plan asked, by task index: what
    /// its approval was shown (a receipt names it; `recheck` compares).
    previewed: Vec<cleared::Previewed>,
    /// Its calls' idempotency keys and, restored after a crash, its
    /// pause's execution journal (#44); made at the first call.
    calls: Option<Box<calls::Calls>>,
}

impl RunContext {
    pub(crate) fn new(
        message: String,
        slot: RunSlot,
        settings: Arc<RunSettings>,
        replay: Arc<Replay>,
        stop: RunStop,
        metrics: Arc<Metrics>,
    ) -> RunContext {
        RunContext {
            message,
            slot,
            settings,
            replay,
            round: 0,
            stop,
            metrics,
            stored_id: None,
            pause_stored: false,
            unconfirmed_calls: 0,
            last_pause: None,
            pending_grant: None,
            open: None,
            granted: Vec::new(),
            previewed: Vec::new(),
            calls: None,
        }
    }

    /// The context of a run restored from a store, at its stored round.
    pub(crate) fn restored(parts: RestoredParts) -> RunContext {
        let RestoredParts {
            message,
            slot,
            settings,
            replay,
            stop,
            metrics,
            stored_id,
            round,
        } = parts;
        let mut ctx = RunContext::new(message, slot, settings, replay, stop, metrics);
        ctx.stored_id = Some(stored_id);
        ctx.round = round;
        ctx
    }

    /// The run's last pause (id and kind), once it paused while webhooks
    /// are on.
    pub(crate) fn last_pause(&self) -> Option<&(String, PauseKind)> {
        self.last_pause.as_deref()
    }

    /// The run's id in the store.
    pub(crate) fn stored_id(&self) -> Option<&Arc<str>> {
        self.stored_id.as_ref()
    }

    /// Gives the run its id in the store from the start (a replica's
    /// claim on the session names it).
    pub(crate) fn with_stored_id(mut self, stored_id: Option<Arc<str>>) -> RunContext {
        self.stored_id = stored_id;
        self
    }

    /// The server's shared run settings (store, audit log, tools).
    pub(crate) fn settings_handle(&self) -> Arc<RunSettings> {
        self.settings.clone()
    }

    /// The user's chat message that started this run.
    pub fn message(&self) -> &str {
        &self.message
    }

    pub fn session_id(&self) -> &str {
        self.slot.session_id()
    }

    /// The session within its API key's namespace: what conversation state
    /// must be keyed by, so two keys using the same session id never share it.
    pub fn session_key(&self) -> &SessionKey {
        self.slot.key()
    }

    /// This run's number: unique in the process, and later runs of a
    /// session have larger ones (engines order saved turns by it).
    pub fn run_id(&self) -> u64 {
        self.slot.run_id()
    }

    /// Who this run's log lines are about (its session, number and key).
    pub fn tag(&self) -> RunTag {
        RunTag::of(self.session_key(), self.run_id())
    }

    /// The pause between an engine's simulated steps (`--step-delay`).
    pub fn step_delay(&self) -> Duration {
        self.settings.step_delay
    }

    /// A chunk stamped with this run's session; its sequence number is given
    /// when it is sent.
    pub fn chunk(&self, chunk_type: ChunkType, text: impl Into<String>) -> Chunk {
        Chunk::new(chunk_type, text, self.slot.session_id(), 0)
    }

    /// Sends a chunk to the client (into the run's replay buffer; the run never
    /// waits for a slow client). Fails with `Cancelled` when the run must stop.
    pub async fn send(&mut self, chunk: Chunk) -> Result<(), RunError> {
        self.push(chunk)
    }

    fn push(&self, chunk: Chunk) -> Result<(), RunError> {
        self.push_framed(chunk, None)
    }

    /// [`RunContext::push`] with the chunk's frame already encoded at a
    /// sequence number (see [`Replay::push_framed`]).
    fn push_framed(&self, chunk: Chunk, frame: Option<(u64, Bytes)>) -> Result<(), RunError> {
        if let Some(reason) = self.stop.reason() {
            return Err(RunError::Cancelled(reason));
        }
        self.replay.push_framed(chunk, frame);
        Ok(())
    }

    /// Sends a chunk of `chunk_type` with `text` and no metadata.
    pub async fn emit(
        &mut self,
        chunk_type: ChunkType,
        text: impl Into<String>,
    ) -> Result<(), RunError> {
        let chunk = self.chunk(chunk_type, text);
        self.send(chunk).await
    }

    /// Waits `duration`, or less if the run must stop.
    pub async fn sleep(&self, duration: Duration) -> Result<(), RunError> {
        if duration.is_zero() {
            // tokio rounds a zero sleep up to the next 1 ms timer tick.
            return match self.stop.reason() {
                Some(reason) => Err(RunError::Cancelled(reason)),
                None => Ok(()),
            };
        }
        self.until_stopped(tokio::time::sleep(duration)).await
    }

    /// Awaits `work` unless the run must stop first (then `Cancelled`): for
    /// engines waiting on something slow, such as a model's next token.
    pub async fn until_stopped<F: Future>(&self, work: F) -> Result<F::Output, RunError> {
        if let Some(reason) = self.stop.reason() {
            return Err(RunError::Cancelled(reason));
        }
        tokio::select! {
            output = work => Ok(output),
            reason = self.stop.stopped() => Err(RunError::Cancelled(reason)),
        }
    }

    /// Whether pauses are kept in a durable store (`--store`): only then is
    /// [`Plan::state`](crate::run::Plan::state) used, so an engine may skip building it otherwise.
    pub fn durable(&self) -> bool {
        self.settings.store.is_durable()
    }

    /// The declared tools (`--tools`).
    pub fn tools(&self) -> &Arc<Tools> {
        &self.settings.tools
    }

    /// This run, as its journal's events name it.
    pub(crate) fn subject(&self) -> Subject<'_> {
        Subject {
            key: self.session_key(),
            run_id: self.run_id(),
            stored: self.stored_id.as_deref(),
        }
    }

    /// Writes the audit record of `event` before anything of it is done:
    /// a record that cannot be written ends the run (`audit_unavailable`).
    pub(crate) async fn audit_first(&self, event: PauseEvent<'_>) -> Result<(), RunError> {
        let entry = self.settings.journal().pause(self.subject(), event);
        self.audit(entry.audit.as_ref()).await
    }

    /// Writes `record` (where there is an audit log); one that cannot be
    /// written ends the run (`audit_unavailable`).
    pub(crate) async fn audit(&self, record: Option<&AuditRecord>) -> Result<(), RunError> {
        let written = self.settings.journal().audit(record).await;
        written.map_err(|err| audit_failed(&err))
    }

    /// The run's metrics, for the driver that ends it.
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The run's registry slot and log, for the driver that ends it.
    /// The run's log.
    pub(crate) fn replay(&self) -> &Arc<Replay> {
        &self.replay
    }

    pub(crate) fn into_parts(self) -> (RunSlot, Arc<Replay>) {
        (self.slot, self.replay)
    }
}

/// Ends the run with `audit_unavailable` (the details were logged).
fn audit_failed(err: &AuditError) -> RunError {
    RunError::Failed {
        error_type: ErrorType::AuditUnavailable,
        message: format!("{err}; nothing more runs"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::confirmation::{ConfirmationManager, RunLimits};
    use crate::protocol::RiskLevel;
    use crate::run::plan::Plan;
    use crate::run::replay::ReplayLimits;

    /// A paused run holds its `confirm` future for the whole pause, once per
    /// paused run: it must stay small (it was 1,184 bytes when the request
    /// was built inside it; docs/benchmarks.md has what that cost).
    #[tokio::test]
    async fn the_future_a_paused_run_holds_stays_small() {
        let manager = ConfirmationManager::new();
        let slot = manager
            .begin_run(SessionKey::new(None, "s"), RunLimits::total(1))
            .unwrap()
            .now();
        let stop = RunStop::default();
        let settings = Arc::new(RunSettings {
            confirm_timeout: Duration::from_secs(1),
            max_rounds: 1,
            ..RunSettings::default()
        });
        let limits = ReplayLimits {
            frames: 8,
            bytes: 1 << 20,
        };
        let log = Replay::new(limits, stop.clone());
        let mut ctx = RunContext::new("a".into(), slot, settings, log, stop, Arc::default());
        let plan = Plan {
            summary: String::new(),
            tasks: Vec::new(),
            risk_level: RiskLevel::Low,
            state: None,
        };

        let paused = ctx.confirm(plan);

        let size = std::mem::size_of_val(&paused);
        println!("confirm() future is {size} bytes");
        assert!(size <= 768, "confirm() future is {size} bytes");
    }
}
