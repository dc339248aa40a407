//! A run's home: starting one, re-attaching to one, and driving its engine
//! to exactly one final chunk. No HTTP: the caller turns the
//! [`Subscription`] it gets into a response.
//!
//! - [`stop`]: why a run must end ([`RunStop`]), first cause wins.
//! - [`replay`]: its numbered, bounded output ([`Replay`]); [`registry`]: the
//!   logs a re-attach searches ([`ReplayRegistry`]).
//! - [`stream`]: one client's view of the log ([`Subscription`]): keep-alive,
//!   gap, detach and its grace.
//! - [`engine`], [`context`], [`plan`], [`outcome`]: what an engine
//!   implements and the context it drives ([`RunContext`]).
//! - [`start`]: a new message's path (supersede, claim, start);
//!   [`decide`]: the one path a decision takes ([`decide::DecidePath`]:
//!   manager, store, audit, delivery); [`kept`]: kept outcomes and what
//!   decided a pause; [`journal`]: what is written of each pause event (its audit
//!   record, webhook rows and stored decision: built there only);
//!   [`door`]: a decision from a link, a button or another face (the
//!   pause located by its id, the result typed as [`door::Outcome`]);
//!   [`place`]: where a session's run lives; `restore`: runs a
//!   durable store kept; `end`: a run's one final chunk; `park`: a
//!   paused run nobody holds leaves memory for its store, and wakes on a
//!   request or a timer (#46).
//! - [`readiness`]: what the probes and the metrics read (ready or why
//!   not; the run gauges).
//!
//! The run task ends when the engine returns. The engine returns promptly
//! when the run is stopped: by shutdown, by a slow client, or when a detached
//! run's grace ends.

pub mod a2a;
pub mod context;
pub mod decide;
pub mod door;
mod end;
pub mod engine;
mod expiry;
pub mod grants;
pub mod inbox;
pub mod journal;
pub mod kept;
pub mod outcome;
mod park;
pub mod pending;
pub mod place;
pub mod plan;
mod quorum_step;
pub mod readiness;
pub mod registry;
pub mod replay;
mod restore;
pub mod settings;
pub mod start;
pub mod stop;
pub mod stream;

pub use self::context::RunContext;
pub use self::engine::Engine;
pub use self::outcome::{Completion, RunError};
pub use self::plan::{Answers, Approval, Plan, Questions, Resumed, NOT_RUN_AGAIN};

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use self::decide::{DecidePath, DecidePathParts, Decided, Reply, ReplyError};
use self::grants::Grants;
use self::inbox::Inbox;
use self::kept::Kept;
use self::registry::ReplayRegistry;
use self::replay::{BeyondEnd, Replay, ReplayLimits};
use self::settings::RunSettings;
use self::stop::RunStop;
use self::stream::{StreamSettings, Subscription};
use crate::cluster::Cluster;
use crate::confirmation::{ConfirmationManager, RunLimits};
use crate::metrics::Metrics;
use crate::session::run_log;
use crate::session::{RunTag, SessionKey};
use crate::store::RunEnd;

/// Everything a run needs from the server: a cheap-clone handle, and a
/// front. It keeps where runs live (start, re-attach, place, park and
/// wake, restore: one state, the registry, the logs, the engine and the
/// cluster, that placing a run needs whole) and hands out the parts that
/// own theirs: [`Runs::inbox`], [`Runs::grants`], [`Runs::kept`], and the
/// decision path behind [`Runs::decide`]. Startup builds it from
/// [`RunsParts`].
#[derive(Clone)]
pub struct Runs {
    manager: ConfirmationManager,
    /// Runs' replay buffers, for re-attach.
    replays: ReplayRegistry,
    engine: Arc<dyn Engine>,
    settings: Arc<RunSettings>,
    replay_limits: ReplayLimits,
    /// Runs the registry may hold, in all and per API key.
    limits: RunLimits,
    stream: Arc<StreamSettings>,
    /// Cancelled once, when shutdown starts; every run's stop is its child.
    shutdown: CancellationToken,
    metrics: Arc<Metrics>,
    /// The replicas this server is one of (`--store redis://`).
    cluster: Option<Arc<Cluster>>,
    /// The pending pauses as people find them.
    inbox: Inbox,
    /// Live grants: listed, revoked, counted.
    grants: Grants,
    /// Kept outcomes and decided pauses, looked up.
    kept: Kept,
    /// The one path a decision takes.
    decide_path: DecidePath,
}

/// What startup builds a [`Runs`] from (the registry and the shutdown
/// token are its own, made new).
pub struct RunsParts {
    pub replays: ReplayRegistry,
    pub engine: Arc<dyn Engine>,
    pub settings: Arc<RunSettings>,
    pub replay_limits: ReplayLimits,
    pub limits: RunLimits,
    pub stream: Arc<StreamSettings>,
    pub metrics: Arc<Metrics>,
    pub cluster: Option<Arc<Cluster>>,
}

impl Runs {
    pub fn new(parts: RunsParts) -> Runs {
        let manager = ConfirmationManager::new();
        let stored = parts.cluster.is_some() || parts.stream.park_after.is_some();
        let inbox = Inbox::new(
            manager.clone(),
            parts.replays.clone(),
            parts.settings.clone(),
            stored,
        );
        let grants = Grants::new(parts.settings.clone());
        let kept = Kept::new(parts.settings.clone(), parts.replays.clone());
        let shutdown = CancellationToken::new();
        let decide_path = DecidePath::new(DecidePathParts {
            manager: manager.clone(),
            settings: parts.settings.clone(),
            replays: parts.replays.clone(),
            shutdown: shutdown.clone(),
            grants: grants.clone(),
            kept: kept.clone(),
        });
        Runs {
            inbox,
            grants,
            kept,
            decide_path,
            manager,
            replays: parts.replays,
            engine: parts.engine,
            settings: parts.settings,
            replay_limits: parts.replay_limits,
            limits: parts.limits,
            stream: parts.stream,
            shutdown,
            metrics: parts.metrics,
            cluster: parts.cluster,
        }
    }

    /// The pending pauses as people find them: listed, looked up, located.
    pub fn inbox(&self) -> &Inbox {
        &self.inbox
    }

    /// Live grants: listed as a caller sees them, revoked.
    pub fn grants(&self) -> &Grants {
        &self.grants
    }

    /// Kept outcomes (`--keep-outcome`) and what decided a pause.
    pub fn kept(&self) -> &Kept {
        &self.kept
    }

    /// Decides the pause of `key` with `reply`: the one door every way to
    /// decide comes through (a chat reply, a link, a Slack press, an AG-UI
    /// resume, an A2A message), down the one path ([`DecidePath::decide`]).
    pub async fn decide(&self, key: &SessionKey, reply: Reply<'_>) -> Result<Decided, ReplyError> {
        self.decide_path.decide(key, reply).await
    }

    /// What every run is configured with.
    pub fn settings(&self) -> &Arc<RunSettings> {
        &self.settings
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The replicas this server is one of (`--store redis://`).
    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.cluster.as_ref()
    }

    /// Cancelled once, when shutdown starts (cancelling it starts one).
    pub fn shutdown_token(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// Shutdown has started: no new run.
    pub fn is_shutting_down(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    /// The run registry (the drain, tests).
    pub fn manager(&self) -> &ConfirmationManager {
        &self.manager
    }

    /// The runs' replay buffers (tests).
    pub fn replays(&self) -> &ReplayRegistry {
        &self.replays
    }
}

/// Why a re-attach found nothing to attach to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReattachError {
    /// No run, or not one of this API key's, on the session.
    #[error(
        "no run to re-attach to on this session: none was started, it belongs to another \
         API key, its end was already delivered, or its grace after the client left is over"
    )]
    NoSuchRun,
    /// `Last-Event-ID` is beyond the last chunk sent.
    #[error("Last-Event-ID {last_seen} is beyond the last chunk sent ({last_sent})")]
    Beyond { last_seen: u64, last_sent: u64 },
}

impl Runs {
    /// [`Runs::reattach`], and once the run's log is gone (its grace is
    /// over), its kept outcome: the final chunk alone, under its own
    /// sequence (`gap: true` when the client had not read up to it). A
    /// client whose `Last-Event-ID` is the final chunk's read it: 404.
    pub async fn reattach_or_outcome(
        &self,
        key: SessionKey,
        last_seen: u64,
    ) -> Result<Subscription, ReattachError> {
        match self.reattach(key.clone(), last_seen) {
            Err(ReattachError::NoSuchRun) => {}
            attached => return attached,
        }
        let outcome = match self.kept.outcome(&key).await {
            Ok(Some(outcome)) => outcome,
            Ok(None) => return Err(ReattachError::NoSuchRun),
            Err(err) => {
                run_log!(Warn, RunTag::session(&key), "{err}");
                return Err(ReattachError::NoSuchRun);
            }
        };
        let last = outcome.final_chunk;
        if last_seen >= last.sequence {
            // Its end was read: nothing is left to re-attach to.
            return Err(ReattachError::NoSuchRun);
        }
        let end = RunEnd {
            frames: vec![String::from_utf8_lossy(&crate::sse::encode(&last)).into_owned()],
            next_seq: last.sequence + 1,
            pauses: outcome.pauses,
        };
        let log = Replay::restore_ended(self.replay_limits, RunStop::under(&self.shutdown), end);
        Subscription::attach(log, key, last_seen, self.stream.clone()).map_err(
            |BeyondEnd { last_sent }| ReattachError::Beyond {
                last_seen,
                last_sent,
            },
        )
    }

    /// Re-attaches to the run of `key`, replaying every chunk after `last_seen`.
    pub fn reattach(&self, key: SessionKey, last_seen: u64) -> Result<Subscription, ReattachError> {
        let log = self.replays.find(&key).ok_or_else(|| {
            run_log!(Debug, RunTag::session(&key), "nothing to re-attach to");
            ReattachError::NoSuchRun
        })?;
        Subscription::attach(log, key, last_seen, self.stream.clone()).map_err(
            |BeyondEnd { last_sent }| ReattachError::Beyond {
                last_seen,
                last_sent,
            },
        )
    }
}
