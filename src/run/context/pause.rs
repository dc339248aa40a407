//! Asking, whatever the kind of pause: what is asked is checked, recorded
//! and built into its request by its kind ([`Kind`], listed once in
//! `kinds.rs`, each in its file under `kinds/`: a plan, questions, a call
//! a crash cut short); then, on one path for
//! every kind, kept in a durable store, registered as a pause and sent
//! (`put_to_person`); waited on, its fallback recorded; and its
//! decision counted and handed back to its kind, which acknowledges it on
//! the stream and turns it into what the engine gets (every stop as
//! `Cancelled`).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use super::asked::{Asked, Open, Received, Request, Running};
use super::RunContext;
use crate::confirmation::slot::{PauseSpec, PendingDecision, Waited};
use crate::confirmation::tasks::TaskStart;
use crate::confirmation::Decision;
use crate::pause::Asking;
use crate::protocol::kinds::contract::KindWire;
use crate::protocol::{Action, Ask, CancelReason, Chunk, ErrorType, PauseKind};
use crate::run::journal::{Pause, PauseEvent};
use crate::run::outcome::RunError;
use crate::run::plan::{Answers, Approval, Plan, Questions, Resumed};
use crate::session::run_log;
use crate::session::RunTag;
use crate::store::{PauseProgress, PausedRecord};

/// A kind of pause, as a run asks it: what the engine puts to the user
/// (`Self`) and what it gets back ([`Kind::Answer`]).
pub(super) trait Kind: Sized + Send {
    type Answer;
    /// Its wire type (`protocol/kinds/`): what its pause says on the wire
    /// and what a stored record keeps of it.
    type Wire: KindWire;
    /// Which kind it is.
    const KIND: PauseKind = <Self::Wire as KindWire>::KIND;
    /// Whether its pause is kept in a durable store as the run's record
    /// (a reconcile's is not: its call's journal entry asks it again).
    const STORED: bool = true;

    /// Checks what is asked and records it (the audit log) before anything
    /// is asked, and builds its request; `None`: nothing needs asking.
    fn request(
        self,
        ctx: &mut RunContext,
    ) -> impl Future<Output = Result<Option<Request>, RunError>> + Send;

    /// Acknowledges a person's `decision` on the stream and turns it into
    /// what the engine gets (a cancel into `Cancelled`).
    fn take(
        ctx: &mut RunContext,
        decision: Decision,
        asked: Asked,
    ) -> impl Future<Output = Result<Self::Answer, RunError>> + Send;

    /// The `confirmation_received` chunk that acknowledges `decided` on
    /// the reply's own stream.
    fn received(decided: &Received<'_>) -> Chunk;

    /// What a pause of this kind restored from its record (`asked`) asks,
    /// to check replies against.
    fn restore_asking(ctx: &mut RunContext, asked: &<Self::Wire as KindWire>::Asked) -> Asking;

    /// Waits on a restored pause of this kind and takes its decision, as
    /// asking it does.
    fn wait_restored(
        ctx: &mut RunContext,
        pending: PendingDecision,
        asked: Asked,
    ) -> impl Future<Output = Result<Resumed, RunError>> + Send;

    /// Takes `decision`, recorded before a crash, of a restored pause of
    /// this kind as if it had just come.
    fn take_decided(
        ctx: &mut RunContext,
        decision: Decision,
        asked: Asked,
    ) -> impl Future<Output = Result<Resumed, RunError>> + Send;
}

impl RunContext {
    /// Puts `plan` to the user and waits for the answer: sends the
    /// `confirmation_request` chunk, pauses, and on a decision sends a
    /// `confirmation_received` chunk. Cancel, timeout, too many rounds and
    /// every other stop come back as `Err(Cancelled(reason))`. A plan
    /// with nothing that needs a yes (no task, or every task allowed by a
    /// rule or a grant: `approved_by`) pauses nowhere: it is confirmed as
    /// it is.
    pub async fn confirm(&mut self, plan: Plan) -> Result<Approval, RunError> {
        // Boxed: what is built before the wait (the request, the records
        // being written) is freed before the pause, not kept in this
        // future, which a paused run holds for all of it.
        let Some((pending, asked)) = Box::pin(self.put_to_person(plan, false)).await? else {
            return Ok(Approval::Confirm(crate::protocol::Decisions::default()));
        };
        // The wait and the take are written out here and in `ask`, not in
        // one more generic `async fn`: its arguments would be kept twice
        // for the whole pause (+120 bytes a paused run; the size tests).
        let decision = self.wait_for(pending, &asked).await?;
        self.settled(Plan::KIND, &decision, &asked)?;
        Plan::take(self, decision, asked).await
    }

    /// As [`RunContext::confirm`], for an engine that carries out tasks as
    /// they are decided (#42): a task decided on its own (`decide`) while
    /// others are pending comes back at once as [`Approval::Partly`] (every
    /// task decided so far), the pause still waiting; the engine carries
    /// out what it can, marking each task with [`RunContext::start_task`],
    /// and waits on with [`RunContext::confirm_rest`].
    pub async fn confirm_as_decided(&mut self, plan: Plan) -> Result<Approval, RunError> {
        // One task is decided whole: nothing is taken task by task, and
        // the pause holds what `confirm`'s does.
        if plan.tasks.len() <= 1 {
            return Box::pin(self.confirm(plan)).await;
        }
        let Some((pending, asked)) = Box::pin(self.put_to_person(plan, true)).await? else {
            return Ok(Approval::Confirm(crate::protocol::Decisions::default()));
        };
        Box::pin(self.wait_plan(Open {
            pending,
            asked,
            timers: None,
        }))
        .await
    }

    /// Waits on for the tasks still pending after [`Approval::Partly`]:
    /// the same pause, its expiry and timers going on. `ran`: the engine
    /// carried something out since, so the stream is told the run waits
    /// again (a `status` chunk naming the pause and its pending tasks).
    pub async fn confirm_rest(&mut self, ran: bool) -> Result<Approval, RunError> {
        let Some(open) = self.open.take() else {
            return Err(RunError::unacted(ErrorType::Internal));
        };
        if ran {
            let pending = self.slot.pending_tasks();
            let listed: Vec<String> = pending.iter().map(usize::to_string).collect();
            let waiting = self
                .chunk(
                    crate::protocol::ChunkType::Status,
                    format!(
                        "Waiting for a decision on task(s) {} of confirmation {}",
                        listed.join(", "),
                        open.asked.confirmation_id
                    ),
                )
                .with_meta(
                    crate::protocol::meta::CONFIRMATION_ID,
                    open.asked.confirmation_id.as_str(),
                )
                .with_meta(crate::protocol::meta::PENDING, pending);
            self.send(waiting).await?;
        }
        Box::pin(self.wait_plan(*open)).await
    }

    /// Marks task `index` of the current pause as starting, before it is
    /// carried out: `false` when it was started before (by this run before
    /// a restart) and its execution journal does not name it: whether it
    /// took effect is not known, so it is not run again. One the journal
    /// names goes on where it says (`exactly_once.rs`). While the pause still waits, a durable store keeps the mark
    /// first (a task is never started twice across a restart).
    pub async fn start_task(&mut self, index: usize) -> Result<bool, RunError> {
        let (run, confirmation_id, started) = match self.slot.start_task(index) {
            // Started before a restart: it goes on where its journal says
            // (#44), else it is not run again.
            TaskStart::Again => return Ok(self.journal_names(index)),
            TaskStart::Now => return Ok(true),
            TaskStart::Keep {
                run,
                confirmation_id,
                started,
            } => (run, confirmation_id, started),
        };
        let step = PauseProgress::started(&confirmation_id, &started);
        let key = self.session_key().clone();
        match self.settings.store.record_progress(&run, &key, &step).await {
            Ok(()) => Ok(true),
            Err(err) => {
                run_log!(Error, self.tag().pause(&confirmation_id), "{err}");
                Err(RunError::Failed {
                    error_type: ErrorType::StoreUnavailable,
                    message: format!(
                        "the store cannot keep that task {index} starts, so it was not run; \
                         the run has ended"
                    ),
                })
            }
        }
    }

    /// Waits on the plan of `open` (its timers started unless they run
    /// already): its decision taken, or tasks decided on their own
    /// ([`Approval::Partly`], the pause left open in `self.open`).
    pub(super) async fn wait_plan(&mut self, open: Open) -> Result<Approval, RunError> {
        let Open {
            pending,
            asked,
            timers,
        } = open;
        let timers = timers.or_else(|| {
            let timers = asked.timers.as_deref()?;
            Some(Running(self.start_timers(timers, &asked.confirmation_id)))
        });
        let wake = self.next_task_expiry(&asked);
        match self.wait_once(pending, &asked, wake).await {
            Waited::Partly(pending) => {
                // Woken by a task's own expiry, or by tasks decided on
                // their own: either way the engine hears what is decided.
                if wake.is_some() {
                    // Boxed: what expiring writes is not held by every
                    // paused run's wait.
                    Box::pin(self.expire_due(&asked)).await?;
                }
                self.open = Some(Box::new(Open {
                    pending,
                    asked,
                    timers,
                }));
                Ok(Approval::Partly(self.slot.decided_so_far()))
            }
            Waited::Decided(decision) => {
                drop(timers);
                let decision = self.ended_wait(decision, &asked).await?;
                self.settled(Plan::KIND, &decision, &asked)?;
                Plan::take(self, decision, asked).await
            }
        }
    }

    /// Puts `questions` to the user and waits for the answer: sends the
    /// `input_request` chunk, pauses, and on an answer or a skip sends a
    /// `confirmation_received` chunk. Cancel, timeout and every other stop
    /// come back as `Err(Cancelled(reason))`.
    pub async fn ask(&mut self, questions: Questions) -> Result<Answers, RunError> {
        // Boxed, as in `confirm`; questions are always asked.
        let Some((pending, asked)) = Box::pin(self.put_to_person(questions, false)).await? else {
            return Err(RunError::unacted(ErrorType::Internal));
        };
        let decision = self.wait_for(pending, &asked).await?;
        self.settled(Questions::KIND, &decision, &asked)?;
        Questions::take(self, decision, asked).await
    }

    /// Everything before the wait, for every kind: the request built by
    /// its kind, kept in a durable store, registered and sent; `None`:
    /// nothing needed asking. `as_decided`: a plan whose tasks run as
    /// they are decided.
    pub(super) async fn put_to_person<K: Kind>(
        &mut self,
        asks: K,
        as_decided: bool,
    ) -> Result<Option<(PendingDecision, Asked)>, RunError> {
        let Some(mut request) = asks.request(self).await? else {
            return Ok(None);
        };
        self.store_pause(&mut request, K::KIND, K::STORED).await?;
        self.put(request, K::KIND, as_decided).map(Some)
    }

    /// Waits for the decision of a registered pause: a reply, or the run's
    /// own fallback (its timeout, a stop), recorded when the pause is stored.
    pub(super) async fn wait_for(
        &mut self,
        pending: PendingDecision,
        asked: &Asked,
    ) -> Result<Decision, RunError> {
        let timers = asked
            .timers
            .as_deref()
            .map(|timers| self.start_timers(timers, &asked.confirmation_id));
        let timeout = asked.timeout;
        let stop = async {
            match asked.sent {
                // Sending failed: the pause must still be settled, at once.
                Some(reason) => reason,
                None => self.stop.stopped().await,
            }
        };
        let decision = self.slot.wait(pending, timeout, stop).await;
        if let Some(timers) = timers {
            timers.abort();
        }
        self.replay.pause_ended();
        // Silence turned into what the tasks say it is (a reject), then
        // recorded as that. Boxed, like `put_to_person`: a store call does
        // not grow every pause.
        let decision = self.silence(decision, asked.rejects_on_timeout.as_deref());
        Box::pin(self.record_fallback(decision, asked)).await
    }

    /// One wait on a registered pause, for the time it has left.
    async fn wait_once(
        &self,
        pending: PendingDecision,
        asked: &Asked,
        wake: Option<Duration>,
    ) -> Waited {
        let timeout = asked.timeout.saturating_sub(asked.paused_at.elapsed());
        let stop = async {
            match asked.sent {
                // Sending failed: the pause must still be settled, at once.
                Some(reason) => reason,
                None => self.stop.stopped().await,
            }
        };
        self.slot.wait_or_partly(pending, timeout, stop, wake).await
    }

    /// A pause's wait is over with `decision`: silence turned into what
    /// the tasks say it is (a reject), then recorded as that.
    async fn ended_wait(
        &mut self,
        decision: Decision,
        asked: &Asked,
    ) -> Result<Decision, RunError> {
        self.replay.pause_ended();
        let decision = self.silence(decision, asked.rejects_on_timeout.as_deref());
        // Boxed, like `put_to_person`: a store call does not grow every
        // pause.
        Box::pin(self.record_fallback(decision, asked)).await
    }

    /// With a durable store and an engine that can resume, keeps the pause
    /// in the store before anything is asked: its record holds the frames a
    /// re-attach replays, the request's own included. A store replicas
    /// share keeps a pause that cannot be resumed too (its record
    /// [`PausedRecord::in_memory`]), so that it is listed, found and
    /// decided from any replica.
    async fn store_pause(
        &mut self,
        request: &mut Request,
        kind: PauseKind,
        keep: bool,
    ) -> Result<(), RunError> {
        self.pause_stored = false;
        let events = match self.settings.webhooks {
            Some(_) => {
                let requested = PauseEvent::Requested {
                    pause: Pause {
                        confirmation_id: &request.confirmation_id,
                        kind,
                    },
                    data: serde_json::to_value(&request.chunk.confirmation_data)
                        .unwrap_or_default(),
                    summary: &request.chunk.chunk,
                    links: self.links_of(request),
                    slack: self.slack_of(request),
                    mail_to: self.mails_of(request),
                };
                self.settings
                    .journal()
                    .pause(self.subject(), requested)
                    .events
            }
            None => Vec::new(),
        };
        if self.settings.webhooks.is_some() {
            self.last_pause = Some(Box::new((request.confirmation_id.clone(), kind)));
        }
        let store = &self.settings.store;
        let (state, in_memory) = match request.state.clone() {
            // Not the run's record (a reconcile's): listed aside where
            // replicas share a store, so that any of them finds it.
            _ if !keep => {
                if store.indexes_every_pause() {
                    if let Some(record) = self.pause_record(request, Value::Null, true) {
                        let store = &self.settings.store;
                        let (run, key) = (&record.run, self.session_key());
                        if let Err(err) = store.list_aside(run, key, Some(&record)).await {
                            run_log!(Warn, self.tag(), "{err}; listed on this replica only");
                        }
                    }
                }
                self.settings.announce(&events).await;
                return Ok(());
            }
            Some(state) if store.is_durable() => (state, false),
            _ if store.indexes_every_pause() => (Value::Null, true),
            _ => {
                self.settings.announce(&events).await;
                return Ok(());
            }
        };
        let Some(record) = self.pause_record(request, state, in_memory) else {
            return Ok(());
        };
        let store = &self.settings.store;
        let (key, run_id) = (self.session_key().clone(), self.run_id());
        let stored = (
            record.next_seq - record.frames.len() as u64,
            record.next_seq,
        );
        store.save(record, &events).await.map_err(|err| {
            run_log!(Error, RunTag::of(&key, run_id), "{err}");
            RunError::Failed {
                error_type: ErrorType::StoreUnavailable,
                message: "the store cannot keep this pause; nothing was asked".to_owned(),
            }
        })?;
        self.settings.wake_sender(&events);
        self.pause_stored = true;
        if !in_memory {
            self.replay.pause_parkable(Some(stored));
        }
        Ok(())
    }

    /// The record a store keeps of the pause `request` asks: the frames a
    /// re-attach replays (the request's own included), what the engine
    /// needs to go on (`state`).
    fn pause_record(
        &mut self,
        request: &mut Request,
        state: Value,
        in_memory: bool,
    ) -> Option<PausedRecord> {
        let stored_id = self
            .stored_id
            .get_or_insert_with(|| Arc::from(uuid::Uuid::new_v4().to_string()))
            .clone();
        let (mut frames, next_seq) = self.replay.snapshot();
        // The chunk as it will be sent, numbered as it will be: encoded
        // once, for the record and for the stream (`put`).
        let sequence = std::mem::replace(&mut request.chunk.sequence, next_seq);
        let frame = crate::sse::encode(&request.chunk);
        request.chunk.sequence = sequence;
        frames.push(String::from_utf8_lossy(&frame).into_owned());
        request.frame = Some((next_seq, frame));
        let asked = request.chunk.confirmation_data.as_ref().map(Ask::of)?;
        Some(PausedRecord {
            run: stored_id.to_string(),
            namespace: self.settings.namespaces.name(self.session_key().owner),
            session_id: self.session_id().to_owned(),
            engine: self.settings.engine_name.to_owned(),
            state,
            message: self.message.clone(),
            confirmation_id: request.confirmation_id.clone(),
            round: request.round,
            options: request.options.clone(),
            asked,
            expires_at_ms: unix_ms(request.expires_at),
            asked_at_ms: unix_ms(SystemTime::now()),
            frames,
            next_seq: next_seq + 1,
            decision: None,
            ended: None,
            in_memory,
            timer_due_ms: request
                .timers
                .as_deref()
                .and_then(|timers| timers.first_due())
                .map(unix_ms),
            request_seq: None,
            progress: None,
            calls: Vec::new(),
        })
    }

    /// Registers the pause and sends its request chunk.
    fn put(
        &mut self,
        request: Request,
        kind: PauseKind,
        as_decided: bool,
    ) -> Result<(PendingDecision, Asked), RunError> {
        let Request {
            chunk,
            asking,
            options,
            confirmation_id,
            round,
            expires_at,
            timeout,
            rejects_on_timeout,
            timers,
            frame,
            ..
        } = request;
        let stored = self.stored_id.clone().filter(|_| self.pause_stored);
        let spec = PauseSpec {
            confirmation_id: confirmation_id.clone(),
            round,
            options,
            kind,
            asking,
            stored,
            asked_at: SystemTime::now(),
            expires_at,
            tally: Default::default(),
            escalated_to: None,
            escalations: Vec::new(),
            as_decided,
        };
        let pending = self
            .slot
            .pause(spec, self.stop.token())
            .map_err(RunError::Cancelled)?;
        // The pause is registered before the chunk leaves, so a client that
        // answers the instant it reads the chunk always finds it pending;
        // and the log knows it, so a client that leaves ends nothing.
        self.replay.pause_started();
        self.replay.note_pause(&confirmation_id);
        let sent = match self.push_framed(chunk, frame) {
            Err(RunError::Cancelled(reason)) => Some(reason),
            _ => None,
        };
        let asked = Asked {
            confirmation_id,
            round,
            paused_at: Instant::now(),
            sent,
            timeout,
            rejects_on_timeout,
            timers,
        };
        Ok((pending, asked))
    }

    /// Counts the decision of a pause of `kind`; a stop, a timeout or a
    /// failure ends the run here (`Err`), a reply goes on (`Ok`).
    pub(super) fn settled(
        &mut self,
        kind: PauseKind,
        decision: &Decision,
        asked: &Asked,
    ) -> Result<(), RunError> {
        self.metrics.confirmation_waited(asked.paused_at.elapsed());
        let outcome = match decision {
            Decision::Confirm(..) => Action::Confirm.as_str(),
            Decision::Modify(_) => Action::Modify.as_str(),
            Decision::Answer(_) => Action::Answer.as_str(),
            Decision::Skip => Action::Skip.as_str(),
            Decision::TimedOut(_) => Action::TimeoutReject.as_str(),
            Decision::Cancel(CancelReason::User) => Action::Cancel.as_str(),
            Decision::Cancel(reason) => reason.as_str(),
            Decision::Failed(error_type) => return Err(RunError::unacted(*error_type)),
        };
        if let Decision::Cancel(CancelReason::Shutdown) = decision {
            // A stored pause outlives the process: not cancelled, suspended
            // (a reconcile's with its run's record, asked again from the
            // journal).
            if self.pause_stored
                || (kind.asks_run_again() && self.stored_id.is_some() && self.durable())
            {
                return Err(RunError::Suspended);
            }
        }
        self.metrics.pause_ended(kind, outcome);
        if kind.asks_a_yes() {
            self.metrics.decision(outcome, "accepted");
        }
        match decision {
            Decision::Cancel(reason) if *reason != CancelReason::User => {
                Err(RunError::Cancelled(*reason))
            }
            _ => Ok(()),
        }
    }
}

use crate::clock::ms as unix_ms;

/// Whole seconds of `timeout`, rounded up: a sub-second timeout is not "0".
pub(super) fn timeout_seconds(timeout: Duration) -> u64 {
    timeout.as_secs() + u64::from(timeout.subsec_nanos() > 0)
}
