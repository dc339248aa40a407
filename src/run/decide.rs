//! The one path a reply's decision takes, below HTTP: the manager takes it
//! (exactly one decision per pause), the store records it (a decision
//! answered 200 survives a crash that follows), the audit log records it
//! (fail closed), and only then is it delivered to the run. Nothing acts on
//! a decision that was not recorded, and nothing acknowledged is lost.
//!
//! Every answer tells the truth: "not taken" (503) only when the decision
//! certainly was not and never will be; when the store did not answer in
//! time the reply is told the outcome is unknown (504), the pause stays
//! decided-in-doubt, and the decision is settled in the background by
//! asking the store, which then either has it (the run acts on it) or
//! voids it for good (the pause waits again).

use std::sync::Arc;
use std::time::SystemTime;

use tokio_util::sync::CancellationToken;

use super::grants::Grants;
use super::journal::{Entry, Pause, PauseEvent, Subject};
use super::kept::Kept;
use crate::audit::{AuditLog, AuditRecord};
use crate::cluster::SETTLE_RETRY;
use crate::confirmation::quorum::{Partial, Progress};
use crate::confirmation::{Accepted, ConfirmationManager, DecideError, Decider, ReplyFrom};
use crate::protocol::{
    meta, Action, CancelReason, Chunk, ChunkType, ErrorType, Given, PauseKind, ReplyMessage,
    ReplyPayload, Via,
};
use crate::run::context::asked::Received;
use crate::run::registry::ReplayRegistry;
use crate::run::settings::RunSettings;
use crate::session::run_log;
use crate::session::{RunTag, SessionKey};
use crate::store::{DecidedBy, Fault, PauseNote, Resolution};
use crate::webhook::DecisionData;

/// The one path a decision takes: what it owns to take, record and
/// deliver one (the registry, the store and audit log through the
/// settings, the runs' logs, the grants it counts, the kept outcomes a
/// refused reply is told from). Cheap-clone handle; [`super::Runs::decide`]
/// is its door.
#[derive(Clone)]
pub struct DecidePath {
    pub(super) manager: ConfirmationManager,
    pub(super) settings: Arc<RunSettings>,
    pub(super) replays: ReplayRegistry,
    /// Cancelled when shutdown starts: a decision being settled is left to
    /// the store.
    pub(super) shutdown: CancellationToken,
    pub(super) grants: Grants,
    pub(super) kept: Kept,
}

/// What a [`DecidePath`] is built from.
pub struct DecidePathParts {
    pub manager: ConfirmationManager,
    pub settings: Arc<RunSettings>,
    pub replays: ReplayRegistry,
    pub shutdown: CancellationToken,
    pub grants: Grants,
    pub kept: Kept,
}

impl DecidePath {
    pub fn new(parts: DecidePathParts) -> DecidePath {
        DecidePath {
            manager: parts.manager,
            settings: parts.settings,
            replays: parts.replays,
            shutdown: parts.shutdown,
            grants: parts.grants,
            kept: parts.kept,
        }
    }
}

/// A reply, as the decision path takes it.
#[derive(Debug, Clone, Copy)]
pub struct Reply<'a> {
    pub message: &'a ReplyMessage,
    /// The pause it answers, when the client named it.
    pub confirmation_id: Option<&'a str>,
    /// What it carries: per-task decisions and a grant (with `confirm`),
    /// or answers to questions (with `answer`).
    pub payload: ReplyPayload<'a>,
    /// Where it came from, for the audit log.
    pub client: Option<&'a str>,
    /// Who decides: the key's label (`label=`, else `key-N`,
    /// `approver-N`, `anonymous`), its groups and scope.
    pub decider: &'a Decider,
    /// A forwarded reply's deadline: its forwarding replica gives up then,
    /// so after it the reply is not taken.
    pub not_after: Option<SystemTime>,
    /// The door it came through (a receipt's `via`).
    pub via: Via,
}

/// Why a reply was not taken.
#[derive(Debug, thiserror::Error)]
pub enum ReplyError {
    /// Refused as it stands (nothing pending, not offered, stale, already
    /// decided, invalid decisions): the pause is untouched.
    #[error("{0}")]
    Refused(#[from] DecideError),
    /// The store cannot record it now: not taken, the pause waits on.
    #[error(
        "the store cannot record this decision, so it was not taken; the confirmation is \
         still pending: retry"
    )]
    StoreUnavailable,
    /// The store no longer has the run's record: the run has ended.
    #[error(
        "the store no longer has this run's record (did Redis restart without its data?), so \
         this decision was not taken and the run has ended; nothing was run"
    )]
    StoreLost,
    /// The audit log cannot record it: the run has ended, nothing ran.
    #[error("the audit log cannot be written, so this decision was not taken; the run has ended")]
    AuditUnavailable,
    /// The store did not answer in time: the decision may or may not have
    /// been recorded. It is being settled; the run's stream shows which.
    #[error(
        "the store did not answer in time, so whether this decision was taken is not known \
         yet; it is being settled: re-attach (Last-Event-ID) to see the outcome on the run's \
         stream, where a taken decision shows as confirmation_received"
    )]
    OutcomeUnknown,
    /// Forwarded here after the replica that forwarded it gave up on it.
    #[error("this forwarded reply came after its forwarding replica gave up; it was not taken")]
    Late,
    /// The pause it names was decided by a reply already (this one, sent
    /// again after an unknown outcome, or another): what was decided, and
    /// who. Told for as long as the run's log is kept.
    #[error(
        "this confirmation has already been decided: {} by {}",
        .0.decided.as_ref().map_or("?", |d| d.action.as_str()),
        .0.decided.as_ref().map_or("?", |d| d.by.as_str())
    )]
    Decided(PauseNote),
}

/// What a taken reply decided: its acknowledgement.
#[derive(Debug, Clone)]
pub struct Decided {
    pub action: Action,
    pub confirmation_id: String,
    pub round: u32,
    /// What the reply gave (verdicts, or answers).
    pub given: Option<Given>,
    pub kind: PauseKind,
    /// Every label that approved (a quorum's, in order).
    pub approved_by: Vec<String>,
    /// One approval of several: those so far, and how many are needed.
    pub progress: Option<Progress>,
    /// Some tasks decided on their own (`decide`): which, and which are
    /// still pending.
    pub partial: Option<Box<Partial>>,
}

impl Decided {
    /// The reply's own stream: one final `confirmation_received` chunk
    /// (`approval_recorded` for one approval of several).
    pub fn acknowledgement(&self, session_id: &str) -> Chunk {
        if let Some(partial) = &self.partial {
            return partial_chunk(session_id, &self.confirmation_id, partial).finished();
        }
        if let Some(Progress {
            approvals,
            required,
            groups,
            ..
        }) = &self.progress
        {
            let ack = Chunk::new(
                ChunkType::ApprovalRecorded,
                format!(
                    "Approval recorded: {} of {required} ({})",
                    approvals.len(),
                    approvals.join(", ")
                ),
                session_id,
                0,
            )
            .with_meta(meta::CONFIRMATION_ID, self.confirmation_id.as_str())
            .with_meta(meta::APPROVALS, approvals.clone())
            .with_meta(meta::REQUIRED, *required)
            .finished();
            // The groups whose members alone approve (a client says whose
            // approval it waits for).
            if groups.is_empty() {
                return ack;
            }
            return ack.with_meta(meta::APPROVERS, groups.clone());
        }
        // Its `confirmation_received`, as its kind writes it.
        super::context::kinds::received(
            self.kind,
            &Received {
                session_id,
                action: self.action,
                confirmation_id: &self.confirmation_id,
                round: self.round,
                given: self.given.as_ref(),
                approved_by: &self.approved_by,
            },
        )
        .finished()
    }
}

/// What a reply that decided some tasks (or approved some towards their
/// quorums) and left others pending is shown as: `decision_recorded`
/// when it decided a task (with `task_approvals` for the tasks it
/// approved short of their quorum), else `approval_recorded` naming the
/// tasks it approved (and for one task its `approvals` and `required`).
pub(super) fn partial_chunk(session_id: &str, confirmation_id: &str, partial: &Partial) -> Chunk {
    let approving = serde_json::to_value(&partial.approving).unwrap_or_default();
    if !partial.now.0.is_empty() {
        let chunk =
            Chunk::decision_recorded(session_id, confirmation_id, &partial.now, &partial.pending);
        if partial.approving.is_empty() {
            return chunk;
        }
        return chunk.with_meta(meta::TASK_APPROVALS, approving);
    }
    let each: Vec<String> = partial.approving.iter().map(|t| t.progress()).collect();
    let text = format!("Approval recorded for {}", each.join("; "));
    let mut chunk = Chunk::new(ChunkType::ApprovalRecorded, text, session_id, 0)
        .with_meta(meta::CONFIRMATION_ID, confirmation_id)
        .with_meta(meta::TASK_APPROVALS, approving)
        .with_meta(meta::PENDING, partial.pending.clone());
    if let [one] = partial.approving.as_slice() {
        chunk = chunk
            .with_meta(meta::APPROVALS, one.approvals.clone())
            .with_meta(meta::REQUIRED, one.required);
    }
    chunk
}

/// What a reply that does not decide its pause counted.
#[derive(Debug, Clone)]
pub(super) enum Step {
    /// One approval of several.
    Approval(Progress),
    /// Some tasks decided on their own.
    Tasks(Box<Partial>),
}

impl DecidePath {
    /// Decides the pause of `key` with `reply`: taken, recorded (store,
    /// then audit log) and delivered, or refused with the pause as it was
    /// (or, when the audit log or the store lost it, with the run ended).
    pub async fn decide(&self, key: &SessionKey, reply: Reply<'_>) -> Result<Decided, ReplyError> {
        // As late as can be before the pause is taken: a reply whose
        // forwarder answered "not taken" must not be taken now.
        if reply
            .not_after
            .is_some_and(|deadline| SystemTime::now() > deadline)
        {
            return Err(ReplyError::Late);
        }
        if reply.payload.grant.is_some() && self.grants.full(key).await {
            return Err(DecideError::TooManyGrants.into());
        }
        let accepted = match self.take(key, &reply).await {
            Ok(accepted) => accepted,
            Err(refused) => {
                return Err(self.told_decided(key, reply.confirmation_id, refused).await)
            }
        };
        let step = match (accepted.progress.clone(), accepted.partial.clone()) {
            (Some(progress), _) => Some(Step::Approval(progress)),
            (None, Some(partial)) => Some(Step::Tasks(partial)),
            (None, None) => None,
        };
        if let Some(step) = step {
            return self.step_recorded(key, &reply, accepted, step).await;
        }
        let decided = Decided {
            action: accepted.action,
            confirmation_id: accepted.confirmation_id.clone(),
            round: accepted.confirmation_round,
            given: accepted.given.clone(),
            kind: accepted.kind,
            approved_by: accepted.approved_by.clone(),
            progress: None,
            partial: None,
        };
        let decision = DecisionData {
            action: accepted.action,
            given: accepted.given.as_ref(),
            reason: (accepted.action == Action::Cancel).then_some(CancelReason::User),
            decider: &reply.decider.label,
            client: reply.client,
            approved_by: &accepted.approved_by,
            text: (accepted.action == Action::Modify)
                .then(|| reply.message.text.as_deref().unwrap_or("")),
            via: reply.via,
        };
        let run = Subject {
            key,
            run_id: accepted.run_id,
            stored: accepted.stored.as_deref(),
        };
        let pause = Pause {
            confirmation_id: &accepted.confirmation_id,
            kind: accepted.kind,
        };
        let round = accepted.confirmation_round;
        let decided_event = PauseEvent::Decided {
            pause,
            round,
            decision,
        };
        let Entry {
            audit,
            events,
            decision,
        } = self.settings.journal().pause(run, decided_event);
        let recorder = Recorder {
            key: key.clone(),
            decider: reply.decider.label.clone(),
            via: reply.via,
            record: audit.zip(self.settings.audit.clone()),
            replays: self.replays.clone(),
        };
        let (Some(run), Some(decision)) = (accepted.stored.clone(), decision) else {
            self.settings.announce(&events).await;
            return recorder.audit_and_deliver(accepted).await.map(|()| decided);
        };
        let Err(err) = self
            .settings
            .store
            .record_decision(&run, key, &decision, &events)
            .await
        else {
            self.settings.wake_sender(&events);
            return recorder.audit_and_deliver(accepted).await.map(|()| decided);
        };
        run_log!(
            Error,
            RunTag::of(key, accepted.run_id).pause(&accepted.confirmation_id),
            "{err}"
        );
        Err(match err.fault {
            // Not recorded, so not taken: the pause waits on, for a retry.
            Fault::Unreachable => {
                accepted.ticket.withdraw();
                ReplyError::StoreUnavailable
            }
            Fault::Moved => {
                // Another replica took this run over: the copy here is
                // suspended, and its client re-attaches to the owner.
                accepted.ticket.withdraw();
                self.replays.hand_over(key);
                ReplyError::StoreUnavailable
            }
            // Nobody can decide it any more: it ends, nothing run, with
            // an error chunk that says so.
            Fault::Lost => {
                accepted.ticket.fail(ErrorType::StoreUnavailable);
                ReplyError::StoreLost
            }
            Fault::Unknown => {
                accepted.ticket.in_doubt();
                let settling = Settling {
                    path: self.clone(),
                    run,
                    nonce: decision.nonce,
                };
                tokio::spawn(settling.settle(recorder, accepted));
                ReplyError::OutcomeUnknown
            }
        })
    }
}

/// How long a confirm waits its turn behind another approval of the same
/// pause that is being kept (a store write: milliseconds; a store that does
/// not answer, its command timeout): then it is told to retry (503).
const COUNTING_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

impl DecidePath {
    /// The manager takes `reply` (see [`crate::confirmation::ConfirmationManager::decide`]).
    /// An approval of a quorum waits while another approval of the same
    /// pause is being kept (an approval counts only once kept: no quorum
    /// completes with one that is then lost), at most [`COUNTING_WAIT`]
    /// and never past the reply's deadline.
    async fn take(&self, key: &SessionKey, reply: &Reply<'_>) -> Result<Accepted, DecideError> {
        let waited_from = tokio::time::Instant::now();
        loop {
            let taken = self.manager.decide(
                key,
                reply.message,
                reply.confirmation_id,
                reply.payload.decisions,
                reply.payload.answers,
                ReplyFrom {
                    decider: reply.decider,
                    grant: reply.payload.grant,
                    via: reply.via,
                },
            );
            let late = reply
                .not_after
                .is_some_and(|deadline| SystemTime::now() > deadline);
            match taken {
                Err(DecideError::Counting) if waited_from.elapsed() < COUNTING_WAIT && !late => {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
                taken => return taken,
            }
        }
    }

    /// `refused` as the reply is told: a pause its run noted as decided
    /// (the one it names, else the latest when that one is decided) is
    /// told what and who, whatever the manager knows of it now (the run
    /// resumed, paused again or ended); once the run's log is gone, its
    /// kept outcome (`--keep-outcome`) still says, for the pause it names.
    async fn told_decided(
        &self,
        key: &SessionKey,
        confirmation_id: Option<&str>,
        refused: DecideError,
    ) -> ReplyError {
        let asks = match (&refused, confirmation_id) {
            (DecideError::AlreadyDecided, id) => Some(id),
            (DecideError::NoPending | DecideError::Stale, Some(id)) => Some(Some(id)),
            _ => None,
        };
        let Some(asks) = asks else {
            return ReplyError::Refused(refused);
        };
        let logged = self.replays.find(key).and_then(|log| log.decided(asks));
        // Its log just went (its client read the final chunk) while its end
        // is still being written: what the log noted is remembered.
        let remembered = || asks.and_then(|id| self.replays.remembered_decision(key, id));
        if let Some(note) = logged.or_else(remembered) {
            return ReplyError::Decided(note);
        }
        let kept = match (asks, self.kept.outcome(key).await) {
            (Some(id), Ok(Some(outcome))) => outcome
                .pauses
                .into_iter()
                .find(|p| p.confirmation_id == id && p.decided.is_some()),
            _ => None,
        };
        kept.map_or(ReplyError::Refused(refused), ReplyError::Decided)
    }
}

/// What a decision's records need: who decided, the audit log, and the
/// run's log (which notes what was decided, for a retry).
struct Recorder {
    key: SessionKey,
    decider: String,
    via: Via,
    /// The `decided` (or `answered`) record, and the log it goes to.
    record: Option<(AuditRecord, Arc<AuditLog>)>,
    replays: ReplayRegistry,
}

impl Recorder {
    /// Hands the decision to its run: at once without an audit log; with
    /// one, only once the `decided` record is on disk. If it cannot be
    /// written the run ends with `audit_unavailable` and the reply is
    /// refused: a decision is never acted on unrecorded, nor acknowledged
    /// unacted. Delivered, the run's log notes what was decided and who (a
    /// retry of the reply is told so).
    async fn audit_and_deliver(self, accepted: Accepted) -> Result<(), ReplyError> {
        let note = Note {
            replays: self.replays,
            key: self.key.clone(),
            confirmation_id: accepted.confirmation_id.clone(),
            decided: DecidedBy {
                action: accepted.action,
                by: self.decider.clone(),
                at_ms: crate::clock::now_ms(),
                approved_by: match &accepted.approved_by {
                    several if several.len() > 1 => several.clone(),
                    _ => Vec::new(),
                },
                via: self.via,
            },
        };
        let Some((record, audit)) = self.record else {
            note.write();
            accepted.ticket.deliver();
            return Ok(());
        };
        let ticket = accepted.ticket;
        // A task of its own: a client that goes away while the record is
        // being written cannot leave its decision half done.
        let written = tokio::spawn(async move {
            match audit.write(&record).await {
                Ok(()) => {
                    note.write();
                    ticket.deliver();
                    true
                }
                Err(_) => {
                    ticket.fail(ErrorType::AuditUnavailable);
                    false
                }
            }
        })
        .await;
        match written {
            Ok(true) => Ok(()),
            _ => Err(ReplyError::AuditUnavailable),
        }
    }
}

/// What a taken decision's run log notes (see [`Replay::note_decided`]).
///
/// [`Replay::note_decided`]: crate::run::replay::Replay::note_decided
struct Note {
    replays: ReplayRegistry,
    key: SessionKey,
    confirmation_id: String,
    decided: DecidedBy,
}

impl Note {
    fn write(self) {
        if let Some(log) = self.replays.find(&self.key) {
            log.note_decided(&self.confirmation_id, self.decided);
        }
    }
}

/// A decision whose recording had an unknown outcome, being settled.
struct Settling {
    path: DecidePath,
    run: Arc<str>,
    nonce: String,
}

impl Settling {
    /// Asks the store, [`SETTLE_RETRY`] apart, until it answers: recorded,
    /// the run acts on the decision (the audit log records it first);
    /// void, the pause waits again.
    async fn settle(self, recorder: Recorder, accepted: Accepted) {
        let store = self.path.settings.store.clone();
        loop {
            let resolved = tokio::select! {
                resolved = store.resolve(&self.run, &recorder.key, &self.nonce) => resolved,
                // At shutdown the decision is left to the store: the next
                // process (or replica) finds it recorded, or not.
                () = self.path.shutdown.cancelled() => {
                    accepted.ticket.withdraw();
                    return;
                }
            };
            match resolved {
                Ok(Resolution::Recorded) => {
                    run_log!(
                        Info,
                        RunTag::of(&recorder.key, accepted.run_id).pause(&accepted.confirmation_id),
                        "a decision with an unknown outcome was recorded; it stands"
                    );
                    let _ = recorder.audit_and_deliver(accepted).await;
                    return;
                }
                Ok(Resolution::Void) => {
                    run_log!(
                        Info,
                        RunTag::of(&recorder.key, accepted.run_id).pause(&accepted.confirmation_id),
                        "a decision with an unknown outcome was not recorded; the pause waits"
                    );
                    accepted.ticket.withdraw();
                    return;
                }
                Err(err) if err.fault == Fault::Lost => {
                    accepted.ticket.fail(ErrorType::StoreUnavailable);
                    return;
                }
                Err(err) if err.fault == Fault::Moved => {
                    // Another replica owns the run now: it decides there.
                    accepted.ticket.withdraw();
                    self.path.replays.hand_over(&recorder.key);
                    return;
                }
                Err(_) => tokio::time::sleep(SETTLE_RETRY).await,
            }
        }
    }
}
