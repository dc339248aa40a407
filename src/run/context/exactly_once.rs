//! Exactly once after a crash (#44): every call a decision lets run gets
//! an idempotency key; with a durable store its execution journal entry
//! is kept `started` before the call and `finished` after it; and a run
//! restored after a crash goes on from its decided pause where the journal
//! says: a finished task's output is shown again (never run again), a task
//! cut short is called again with the same key only when its tool says it
//! is `idempotent`, its `reconcile` says it did not take effect, or a
//! person chooses so on a reconcile pause.

use std::sync::Arc;

use serde_json::Value;

use super::calls::{Calls, KEYS_KEPT};
use super::kinds::reconcile::{Reconcile, Reconciled};
use super::{Cleared, RunContext};
use crate::protocol::{meta, Chunk, ErrorType, ResumedHow};
use crate::receipt::{call_digest, idempotency_key};
use crate::run::journal::CallEvent;
use crate::run::outcome::RunError;
use crate::session::run_log;
use crate::store::{CallEntry, Fault};
use crate::tools::{Stamp, Tool, ToolOutcome};

/// How long a journal entry is tried again while the store is out of
/// reach (a Redis stall, a restart) before the run ends.
pub const JOURNAL_RETRY_FOR: std::time::Duration = std::time::Duration::from_secs(30);

/// How a task the journal names goes on.
pub(super) enum GoOn {
    /// Done without a call: its outcome (shown again, reconciled, skipped).
    Done(ToolOutcome),
    /// Called again with its key: this attempt.
    Again(u32),
}

/// What a call carries into its run, its `tool_output` and its journal.
pub(super) struct Attempt {
    pub key: String,
    pub number: u32,
    /// Called again after a crash (`resumed_after_crash`).
    pub resumed: bool,
    /// Its journal entry is kept (a durable store, a stored run, a call
    /// someone cleared).
    pub journaled: bool,
}

impl RunContext {
    fn calls(&mut self) -> &mut Calls {
        self.calls.get_or_insert_with(Box::default)
    }

    /// The pause whose tasks the next calls are (a plan asked, a pause
    /// restored).
    pub(super) fn anchor_calls(&mut self, confirmation_id: &str) {
        let calls = self.calls();
        calls.anchor = Some(Arc::from(confirmation_id));
        calls.anchor_stored = true;
    }

    /// The pause whose tasks the calls are, once there is one.
    pub(super) fn calls_anchor(&self) -> Option<Arc<str>> {
        self.calls.as_ref()?.anchor.clone()
    }

    /// Restored after a crash: the journal of the decided pause.
    pub(super) fn resume_journal(&mut self, journal: Vec<CallEntry>) {
        self.calls().journal = journal;
    }

    /// The idempotency key of call `index` of `tool` with `args`: the same
    /// for the same approved call after a restart, and never one this run
    /// gave another call.
    pub(super) fn idempotency_key(&mut self, index: usize, tool: &str, args: &Value) -> String {
        let calls = self.calls();
        let anchor = calls
            .anchor
            .get_or_insert_with(|| Arc::from(uuid::Uuid::new_v4().to_string()))
            .clone();
        let digest = call_digest(tool, args);
        let mut key = idempotency_key(&anchor, index, &digest);
        let mut again = 0;
        while calls.given.contains(&key) {
            again += 1;
            key = idempotency_key(&format!("{anchor}#{again}"), index, &digest);
        }
        if calls.given.len() >= KEYS_KEPT {
            calls.given.remove(0);
        }
        calls.given.push(key.clone());
        key
    }

    /// The journal's entry of the call whose key is `key` (task `index`)
    /// among the pause's the calls are of, taken (a call goes on once). A
    /// call is known by its key: the same call of the same pause, in the
    /// same order, after a restart (an unreadable entry, whose key is lost,
    /// by its index).
    pub(super) fn journaled_entry(&mut self, key: &str, index: usize) -> Option<CallEntry> {
        let calls = self.calls.as_deref_mut()?;
        let anchor = calls.anchor.clone()?;
        let ours = |e: &CallEntry| *e.confirmation_id == *anchor;
        let unreadable =
            |e: &CallEntry| e.key.is_empty() && (e.index == index || e.index == usize::MAX);
        let journal = &calls.journal;
        let at = (journal.iter().position(|e| ours(e) && e.key == key))
            .or_else(|| journal.iter().position(|e| ours(e) && unreadable(e)))?;
        Some(calls.journal.remove(at))
    }

    /// Whether the journal names task `index` of the pause the calls are
    /// of (restored after a crash, not yet gone on from).
    pub(super) fn journal_names(&self, index: usize) -> bool {
        self.calls.as_deref().is_some_and(|calls| {
            calls
                .journal
                .iter()
                .any(|e| e.index == index && calls.anchor.as_deref() == Some(&*e.confirmation_id))
        })
    }

    /// Whether a call cleared as `cleared` is journaled.
    pub(super) fn journals(&self, cleared: &Cleared) -> bool {
        self.durable()
            && self.stored_id.is_some()
            && *cleared != Cleared::Unasked
            && self.calls.as_ref().is_some_and(|calls| calls.anchor_stored)
    }

    /// Keeps `entry` in the journal before the run goes on. A store out of
    /// reach is tried again (the same entry written twice is one entry)
    /// for [`JOURNAL_RETRY_FOR`], or until the run must stop; then, or
    /// when the run's record is gone, the run ends (`store_unavailable`),
    /// before its call when it is a `started`. One refused because another
    /// replica owns the run now hands the run over (`Suspended`: it goes
    /// on there, from the journal).
    pub(super) async fn keep_entry(&self, entry: &CallEntry) -> Result<(), RunError> {
        let Some(run) = self.stored_id.as_deref() else {
            return Ok(());
        };
        let store = &self.settings.store;
        let began = tokio::time::Instant::now();
        let mut wait = std::time::Duration::from_millis(50);
        let err = loop {
            let err = match store.journal_call(run, self.session_key(), entry).await {
                Ok(()) => return Ok(()),
                Err(err) => err,
            };
            match err.fault {
                Fault::Moved => {
                    // Another replica took the run over (this one's lease
                    // lapsed): the stream here ends with `retry:`, and its
                    // client re-attaches there.
                    run_log!(Warn, self.tag(), "{err}; handed over");
                    return Err(RunError::Suspended);
                }
                Fault::Lost => break err,
                Fault::Unreachable | Fault::Unknown if began.elapsed() >= JOURNAL_RETRY_FOR => {
                    break err
                }
                Fault::Unreachable | Fault::Unknown => {
                    run_log!(Warn, self.tag(), "{err}; trying again");
                    self.sleep(wait).await?;
                    wait = (wait * 2).min(std::time::Duration::from_secs(1));
                }
            }
        };
        run_log!(Error, self.tag(), "{err}");
        let what = if entry.finished.is_some() {
            "that it finished"
        } else {
            "that it starts, so it was not run"
        };
        Err(RunError::failed(
            ErrorType::StoreUnavailable,
            format!(
                "the store cannot keep task {}'s call ({what}); the run has ended",
                entry.index
            ),
        ))
    }

    /// A task the journal names after a crash: shown again when it had
    /// finished; cut short, called again only when its tool is
    /// `idempotent`, its `reconcile` says it did not take effect, or a
    /// person says so; audited (`resumed`) and announced (`run.resumed`)
    /// before it goes on.
    pub(super) async fn go_on(
        &mut self,
        tool: &Tool,
        args: &Value,
        entry: CallEntry,
    ) -> Result<GoOn, RunError> {
        let index = entry.index;
        if let Some(chunk) = entry.finished.clone() {
            self.resumed(&entry, ResumedHow::Replayed).await?;
            let outcome = replayed_outcome(&chunk);
            self.replay.push(chunk.with_meta(meta::REPLAYED, true));
            return Ok(GoOn::Done(outcome));
        }
        let next = entry.attempt + 1;
        if tool.idempotent && !entry.key.is_empty() {
            self.resumed(&entry, ResumedHow::Reran).await?;
            return Ok(GoOn::Again(next));
        }
        if let (Some(reconcile), false) = (&tool.reconcile, entry.key.is_empty()) {
            let stamp = Stamp {
                receipt: None,
                idempotency_key: Some(&entry.key),
            };
            let stop = self.stop.clone();
            let asked = reconcile
                .run(
                    args,
                    tool.timeout,
                    async move {
                        stop.stopped().await;
                    },
                    Some(&self.tag()),
                    stamp,
                )
                .await;
            match asked.exit_status {
                Some(0) => {
                    run_log!(Info, self.tag(), "{}: task {index} took effect", tool.name);
                    self.resumed(&entry, ResumedHow::Reconciled).await?;
                    let mut outcome = asked;
                    outcome.exit_status = Some(0);
                    let chunk = self
                        .tool_output(index, &tool.name, &outcome, None)
                        .with_meta(meta::IDEMPOTENCY_KEY, entry.key.as_str())
                        .with_meta(meta::RECONCILED, true);
                    let mut done = entry.clone();
                    done.finished = Some(chunk.clone());
                    self.keep_entry(&done).await?;
                    self.replay.push(chunk);
                    return Ok(GoOn::Done(outcome));
                }
                Some(3) => {
                    self.resumed(&entry, ResumedHow::Reran).await?;
                    return Ok(GoOn::Again(next));
                }
                _ => run_log!(
                    Info,
                    self.tag(),
                    "{}: whether task {index} took effect is not known",
                    tool.name
                ),
            }
        }
        self.ask_reconcile(tool, args, entry).await
    }

    /// Nobody can know whether task `entry` took effect: a person is asked
    /// on a reconcile pause (`run_again`, `skip`, `cancel`).
    async fn ask_reconcile(
        &mut self,
        tool: &Tool,
        args: &Value,
        entry: CallEntry,
    ) -> Result<GoOn, RunError> {
        let index = entry.index;
        let asks = Reconcile::of(tool, args, entry.clone());
        let chosen = Box::pin(self.reconcile(asks)).await?;
        self.resumed(&entry, ResumedHow::Asked).await?;
        match chosen {
            Reconciled::RunAgain => Ok(GoOn::Again(entry.attempt + 1)),
            Reconciled::Skip => {
                let outcome = ToolOutcome::skipped(
                    true,
                    None,
                    Some(
                        "skipped after the server stopped while it ran: recorded as not run".into(),
                    ),
                );
                let chunk = self
                    .tool_output(index, &tool.name, &outcome, None)
                    .with_meta(meta::IDEMPOTENCY_KEY, entry.key.as_str());
                // Kept before the run goes on: a restart shows it again.
                let mut done = entry;
                done.finished = Some(chunk.clone());
                self.keep_entry(&done).await?;
                self.replay.push(chunk);
                Ok(GoOn::Done(outcome))
            }
        }
    }

    /// Audits (`resumed`) and announces (`run.resumed`) that task `entry`
    /// goes on `how`.
    async fn resumed(&self, entry: &CallEntry, how: ResumedHow) -> Result<(), RunError> {
        run_log!(
            Info,
            self.tag(),
            "task {} resumed after a crash: {how:?}",
            entry.index
        );
        let event = CallEvent::Resumed {
            pause: &entry.confirmation_id,
            task: entry.index,
            tool: &entry.tool,
            idempotency_key: &entry.key,
            how,
        };
        let journal = self.settings.journal();
        let events = journal.resumed_events(self.subject(), &event);
        let record = journal.call(self.subject(), event);
        self.audit(record.as_ref()).await?;
        self.settings.announce(&events).await;
        Ok(())
    }
}

/// A finished call's outcome as its `tool_output` chunk says it.
fn replayed_outcome(chunk: &Chunk) -> ToolOutcome {
    let flag = |key: &str| chunk.metadata.get(key).and_then(Value::as_bool);
    let text = |key: &str| {
        chunk
            .metadata
            .get(key)
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let mut outcome = ToolOutcome::skipped(flag(meta::OK).unwrap_or(false), None, None);
    outcome.skipped = flag(meta::SKIPPED).unwrap_or(false);
    outcome.truncated = flag(meta::TRUNCATED).unwrap_or(false);
    outcome.result = text(meta::RESULT);
    outcome.error = text(meta::ERROR);
    outcome.duration_ms = chunk
        .metadata
        .get(meta::DURATION_MS)
        .and_then(Value::as_u64)
        .unwrap_or(0);
    outcome
}

/// A call's journal entry as it starts.
pub(super) fn started(
    confirmation_id: &str,
    index: usize,
    tool: &str,
    attempt: &Attempt,
) -> CallEntry {
    CallEntry {
        confirmation_id: confirmation_id.to_owned(),
        index,
        tool: tool.to_owned(),
        key: attempt.key.clone(),
        attempt: attempt.number,
        started_at_ms: crate::clock::now_ms(),
        finished: None,
        asked_until_ms: None,
    }
}
