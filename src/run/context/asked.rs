//! A pause between its request and its decision: the request built and
//! not yet asked ([`Request`]), then asked and waiting ([`Asked`]).

use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use tokio::task::JoinHandle;

use crate::confirmation::slot::PendingDecision;
use crate::pause::{Asking, Scope};
use crate::protocol::{Action, CancelReason, Chunk, Given};
use crate::store::Escalated;
use crate::tools::gate::Escalation;

/// A confirmation request on its way to a decision.
pub(super) struct Asked {
    pub(super) confirmation_id: String,
    pub(super) round: u32,
    pub(super) paused_at: Instant,
    /// Why the request could not be sent, if it could not.
    pub(super) sent: Option<CancelReason>,
    /// How long it waits (the smallest of its tasks' and `--confirm-timeout`).
    pub(super) timeout: Duration,
    /// Its tasks, when nobody answering rejects them (every task's tool
    /// says `on_timeout = "reject"`) rather than cancelling the run.
    pub(super) rejects_on_timeout: Option<Box<[usize]>>,
    /// Its reminder and escalation, if its tools ask for them.
    pub(super) timers: Option<Box<Timers>>,
}

/// A confirmation request or questions, built and not yet asked.
pub(super) struct Request {
    pub(super) chunk: Chunk,
    pub(super) asking: Asking,
    pub(super) options: Vec<Action>,
    pub(super) confirmation_id: String,
    pub(super) round: u32,
    /// What the engine needs to resume from this pause (stored if durable).
    pub(super) state: Option<Value>,
    pub(super) timeout: Duration,
    pub(super) rejects_on_timeout: Option<Box<[usize]>>,
    pub(super) timers: Option<Box<Timers>>,
    pub(super) expires_at: SystemTime,
    /// The request chunk's frame as the stored record has it, and the
    /// sequence number it was encoded with: sent as it is when the chunk
    /// gets that number (encoded once, not twice).
    pub(super) frame: Option<(u64, bytes::Bytes)>,
}

/// A plan's pause left open while its engine carries out the tasks decided
/// so far (#42): waited on again by [`super::RunContext::confirm_rest`].
pub(super) struct Open {
    pub(super) pending: PendingDecision,
    pub(super) asked: Asked,
    /// Its reminder and escalation, running on through the open spell.
    pub(super) timers: Option<Running>,
}

/// A pause's timers, running: stopped when dropped (a run that ends with
/// its pause open stops them: a timer acts only on its own pause).
pub(super) struct Running(pub(super) JoinHandle<()>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What a pause's tasks ask of it while it waits, and what already fired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Timers {
    /// Each reminder and escalation still to fire, soonest first (#42:
    /// each for the tasks whose gates ask for it).
    pub(super) dues: Vec<Due>,
    /// What fired before (a restored pause): the tasks reminded, and the
    /// escalations.
    pub(super) reminded: Vec<usize>,
    pub(super) escalations: Vec<Escalated>,
    pub(super) asked_at: SystemTime,
    /// Who its escalation's links go to.
    pub(super) scope: Scope,
}

/// One reminder (no `escalation`) or escalation of a pause: when, counted
/// from when it was asked, and the tasks it is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Due {
    pub(super) after: Duration,
    pub(super) escalation: Option<Escalation>,
    pub(super) tasks: Vec<usize>,
}

impl Timers {
    /// When the first of them is due.
    pub(super) fn first_due(&self) -> Option<SystemTime> {
        self.dues.first().map(|due| self.asked_at + due.after)
    }
}

/// What a taken reply decided, as its acknowledgement says it.
pub(crate) struct Received<'a> {
    pub(crate) session_id: &'a str,
    pub(crate) action: Action,
    pub(crate) confirmation_id: &'a str,
    pub(crate) round: u32,
    /// What the reply gave (verdicts, or answers).
    pub(crate) given: Option<&'a Given>,
    /// Every label that approved (a quorum's, in order).
    pub(crate) approved_by: &'a [String],
}
