//! Runs a durable store kept: restored at start (`sqlite:`) or when taken
//! over from a replica that is gone (`redis://`), ended when they cannot go
//! on, and handed back when another replica took them over.

use std::sync::Arc;
use std::time::Duration;

use super::context::{RestoredParts, RunContext};
use super::end::{drive_decided, drive_restored, end_record, kept_outcome, remove_record};
use super::journal::{Entry, Pause, PauseEvent, Subject};
use super::replay::Replay;
use super::stop::RunStop;
use super::stream;
use super::Runs;
use crate::confirmation::{Begun, Decision};
use crate::pause::plan_check::PlanCheck;
use crate::protocol::{meta, Action, CancelReason, Chunk, ErrorType, Given};
use crate::session::run_log;
use crate::session::{RunTag, SessionKey};
use crate::store::{PausedRecord, StoredDecision};

impl Runs {
    /// Restores the paused runs a durable store kept (at start): each waits
    /// again, with the time it has left, for its decision, and its engine
    /// goes on from it. Returns how many runs were restored. (Replicas
    /// restore lazily, see [`Runs::place`].)
    pub async fn restore(&self) -> Result<usize, String> {
        let store = self.settings.store.clone();
        if !store.is_durable() || self.cluster.is_some() {
            return Ok(0);
        }
        // Parked pauses stay in the store until something wakes them.
        let records = if self.parks() {
            store.load_unparked().await
        } else {
            store.load().await
        };
        let records = records.map_err(|err| err.to_string())?;
        if self.parks() {
            // The sessions whose runs wait parked: a request about one of
            // them wakes it (see `park.rs`).
            let parked = store
                .parked_sessions()
                .await
                .map_err(|err| err.to_string())?;
            for (namespace, session_id) in parked {
                if let Some(owner) = self.settings.namespaces.owner(namespace.as_deref()) {
                    self.replays
                        .note_parked(&SessionKey::new(owner, &session_id));
                }
            }
        }
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
    pub(super) async fn restore_one(&self, record: PausedRecord) -> bool {
        let Some(owner) = self.settings.namespaces.owner(record.namespace.as_deref()) else {
            // Its API key is not configured any more: no client can reach
            // it, and it must not land in anyone else's namespace.
            ::log::warn!(
                "session={} run {}: dropped, its API key is not configured",
                serde_json::Value::from(record.session_id.as_str()),
                record.run
            );
            let orphan = SessionKey::new(None, &record.session_id);
            remove_record(&self.settings.store, &record.run, &orphan).await;
            return false;
        };
        let key = SessionKey::new(owner, &record.session_id);
        if let Some(end) = record.ended {
            // It had ended, and its client may not have read the end: shown
            // for the rest of the grace, as the process that ended it would.
            let stop = RunStop::under(&self.shutdown);
            let log = Replay::restore_ended(self.replay_limits, stop, end.clone());
            self.replays.publish(key.clone(), log.clone());
            stream::expire_unclaimed(log, key.clone(), self.stream.clone());
            // Taken over from a replica: the session is this one's for the
            // grace. Restored at a start, the row is already what it should
            // be (and goes at its own grace): not written again, so that a
            // restart over many ended runs costs no write each.
            if self.cluster.is_some() {
                let store = &self.settings.store;
                end_record(store, &record.run, &key, end, Vec::new(), None).await;
            }
            return false;
        }
        let now_ms = crate::clock::now_ms();
        let decided = StoredDecision::of(&record);
        let cancelled = decided
            .as_ref()
            .filter(|decision| decision.action == Action::Cancel);
        let ending = if let Some(cancel) = cancelled {
            // Decided, and it ends here: a cancel (a user's, a supersede, a
            // timeout) whose end was not removed from the store in time.
            let reason = cancel.reason.unwrap_or(CancelReason::User);
            Some(Chunk::cancelled(&record.session_id, reason))
        } else if let Some(decision) = self.resumes(&record, decided.as_ref()) {
            // Decided, and cut short at work: it goes on where its journal
            // says (#44).
            return self.resume_one(key, record, decision);
        } else if record.decision.is_some() {
            Some(Chunk::failed(
                &record.session_id,
                ErrorType::Interrupted,
                "The server stopped after this run's decision and before its work was done; \
                 it is not run again (it may have partly run)."
                    .to_owned(),
            ))
        } else if record.expires_at_ms <= now_ms && !self.rejects_on_timeout(&key, &record) {
            // Expired while nobody held it. A plan whose tasks say
            // `on_timeout = "reject"` is restored instead: its wait ends at
            // once, and silence rejects its tasks as its owner would have.
            Some(Chunk::cancelled(&record.session_id, CancelReason::Timeout))
        } else if record.in_memory {
            Some(Chunk::failed(
                &record.session_id,
                ErrorType::Interrupted,
                "This run's pause lived in the memory of the process that asked it (an MCP \
                 server's question, or a model's), which is gone; it cannot go on."
                    .to_owned(),
            ))
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
            // A run that was at work may have sent chunks past its record.
            let at_work = record.decision.is_some() && cancelled.is_none();
            self.end_restored(key, record, ending, at_work).await;
            return false;
        }
        let Some(mut ctx) = self.restored_context(key, &record, false) else {
            return false;
        };
        let pending = ctx.restore_pause(&record);
        tokio::spawn(drive_restored(self.engine.clone(), ctx, record, pending));
        true
    }

    /// The decision a stored run cut short at work goes on with (#44): a
    /// confirm, a timeout's rejects, answers or a skip, of a run whose
    /// engine is the server's and whose pause was not in a process's memory
    /// only. A modify is not (its text is not kept): it ends `interrupted`,
    /// as every decided run did before.
    fn resumes(&self, record: &PausedRecord, decided: Option<&StoredDecision>) -> Option<Decision> {
        if record.in_memory || record.engine != self.engine.name() {
            return None;
        }
        let decided = decided?;
        let decisions = || {
            decided
                .given
                .as_ref()
                .and_then(Given::decisions)
                .cloned()
                .unwrap_or_default()
        };
        match decided.action {
            Action::Confirm => Some(Decision::Confirm(decisions(), None)),
            Action::TimeoutReject => Some(Decision::TimedOut(decisions())),
            Action::Answer => Some(Decision::Answer(decided.given.as_ref()?.answers()?.clone())),
            Action::Skip => Some(Decision::Skip),
            // Replanned with its text (a record of an older version kept
            // none: that run ends `interrupted`).
            Action::Modify => Some(Decision::Modify(decided.text.clone()?)),
            _ => None,
        }
    }

    /// Goes on with the decided run of `record` (see [`Runs::resumes`]):
    /// its log restored (what it sent past its record is unknown: a
    /// re-attach is told of the gap), its decision taken again, its engine
    /// driven on. Returns whether it goes on.
    fn resume_one(&self, key: SessionKey, record: PausedRecord, decision: Decision) -> bool {
        let tag = RunTag::session(&key).pause(&record.confirmation_id);
        let Some(ctx) = self.restored_context(key, &record, true) else {
            return false;
        };
        run_log!(
            Info,
            tag,
            "run {} resumes after a crash ({} journaled calls)",
            record.run,
            record.calls.len()
        );
        tokio::spawn(drive_decided(self.engine.clone(), ctx, record, decision));
        true
    }

    /// The context of the stored run of `record` on `key`, its log
    /// restored from its frames and published (`at_work`: it sent chunks
    /// past its record, a re-attach is told of the gap); `None` when the
    /// session is not free. A restored run never supersedes anything.
    fn restored_context(
        &self,
        key: SessionKey,
        record: &PausedRecord,
        at_work: bool,
    ) -> Option<RunContext> {
        let Ok(Begun::Fresh(slot)) = self.manager.begin_restored_run(key.clone()) else {
            return None;
        };
        let stop = RunStop::under(&self.shutdown);
        let log = Replay::restore(
            self.replay_limits,
            stop.clone(),
            record.frames.clone(),
            record.next_seq,
            at_work,
            Some(&record.confirmation_id),
        );
        if let Some(request_seq) = record.request_seq.filter(|_| !at_work) {
            log.woken(request_seq, &record.confirmation_id);
        }
        self.replays.publish(key.clone(), log.clone());
        stream::expire_unclaimed(log.clone(), key, self.stream.clone());
        Some(RunContext::restored(RestoredParts {
            message: record.message.clone(),
            slot,
            settings: self.settings.clone(),
            replay: log,
            stop,
            metrics: self.metrics.clone(),
            stored_id: Arc::from(record.run.as_str()),
            round: record.round,
        }))
    }

    /// Whether silence rejects the stored pause of `record` (a plan whose
    /// every task's gate, with the rules, says `on_timeout = "reject"`).
    fn rejects_on_timeout(&self, key: &SessionKey, record: &PausedRecord) -> bool {
        let Some(tasks) = record.asked.plan_tasks() else {
            return false;
        };
        let tools = &self.settings.tools;
        let label = self.settings.namespaces.label(key.owner);
        PlanCheck::of(tasks, tools)
            .with_rules(tasks, tools, label)
            .rejects_on_timeout()
    }

    /// A stored run that cannot go on: its end is written after its frames,
    /// and kept re-attachable (and in its record) for the grace.
    async fn end_restored(
        &self,
        key: SessionKey,
        record: PausedRecord,
        ending: Chunk,
        at_work: bool,
    ) {
        let why = ending
            .metadata
            .get(meta::REASON)
            .or(ending.metadata.get(meta::ERROR_TYPE))
            .and_then(|w| w.as_str())
            .map(str::to_owned);
        let run = Subject {
            key: &key,
            run_id: self.manager.number_run(),
            stored: Some(&record.run),
        };
        let pause = Pause {
            confirmation_id: &record.confirmation_id,
            kind: record.asked.kind(),
        };
        let journal = self.settings.journal();
        let ended = PauseEvent::Ended {
            last: Some(pause),
            outcome: ending.chunk_type,
            why: why.as_deref(),
        };
        let Entry { audit, events, .. } = journal.pause(run, ended);
        let _ = journal.audit(audit.as_ref()).await;
        // A pause that expired while no process held it: its timeout
        // decided it, and is announced as its owner's timer would have.
        let expired = record.decision.is_none() && why.as_deref() == Some("timeout");
        let mut events = events;
        if expired {
            // As asked, in whole seconds (records of older versions: the
            // server's timeout).
            let asked_for = record.expires_at_ms.saturating_sub(record.asked_at_ms);
            let timeout = if record.asked_at_ms == 0 {
                self.settings.confirm_timeout
            } else {
                Duration::from_secs(asked_for.div_ceil(1000))
            };
            let expired = journal.pause(run, PauseEvent::Expired { pause, timeout });
            events.splice(0..0, expired.events);
        }
        let stop = RunStop::under(&self.shutdown);
        let log = Replay::restore(
            self.replay_limits,
            stop,
            record.frames,
            record.next_seq,
            at_work,
            None,
        );
        let mut last = ending.clone();
        last.sequence = log.push(ending);
        let outcome = kept_outcome(&self.settings, &key, &log, last);
        self.replays.publish(key.clone(), log.clone());
        stream::expire_unclaimed(log.clone(), key.clone(), self.stream.clone());
        let (store, end) = (&self.settings.store, log.end());
        end_record(store, &record.run, &key, end, events.clone(), outcome).await;
        self.settings.wake_sender(&events);
    }

    /// Another replica took the run of `key` over (this one's heartbeat had
    /// lapsed): the copy here is suspended, as at a shutdown, so that its
    /// stream ends with `retry:` and its client re-attaches to the owner.
    pub fn relinquish(&self, key: &SessionKey) {
        self.replays.hand_over(key);
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
    /// owns, a pause whose decision is in doubt included (its settling then
    /// finds it is not this replica's). Only paused ones: a run at work here
    /// goes on to its end (what it does was decided here, and stopping it
    /// would be a shutdown that is not one).
    async fn hand_over_taken(&self) {
        let Some(cluster) = &self.cluster else {
            return;
        };
        let keys: Vec<SessionKey> = self
            .replays
            .keys()
            .into_iter()
            .filter(|key| self.manager.is_paused_or_in_doubt(key))
            .collect();
        match cluster.owners(&keys).await {
            Ok(owners) => {
                let me = cluster.instance();
                for (key, owner) in keys.iter().zip(owners) {
                    if owner.is_some_and(|owner| !owner.is_empty() && owner != me) {
                        self.relinquish(key);
                    }
                }
            }
            Err(err) => ::log::warn!("cannot check which runs are still ours: {err}"),
        }
    }
}
