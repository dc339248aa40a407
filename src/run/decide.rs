//! The one path a reply's decision takes, below HTTP: the manager takes it
//! (exactly one decision per pause), the store records it (a decision
//! answered 200 survives a crash that follows), the audit log records it
//! (fail closed), and only then is it delivered to the run. Nothing acts on
//! a decision that was not recorded, and nothing acknowledged is lost.

use super::Runs;
use crate::audit::{self, AuditRecord};
use crate::confirmation::{Accepted, DecideError};
use crate::protocol::{Action, Chunk, Decisions, ErrorType, ReplyMessage, TaskDecisionRequest};
use crate::session::SessionKey;
use crate::store::Fault;

/// A reply, as the decision path takes it.
#[derive(Debug, Clone, Copy)]
pub struct Reply<'a> {
    pub message: &'a ReplyMessage,
    /// The pause it answers, when the client named it.
    pub confirmation_id: Option<&'a str>,
    /// Its per-task decisions (with `confirm`).
    pub decisions: Option<&'a [TaskDecisionRequest]>,
    /// Where it came from, for the audit log.
    pub client: Option<&'a str>,
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
}

/// What a taken reply decided: its acknowledgement.
#[derive(Debug, Clone)]
pub struct Decided {
    pub action: Action,
    pub confirmation_id: String,
    pub round: u32,
    pub decisions: Option<Decisions>,
}

impl Decided {
    /// The reply's own stream: one final `confirmation_received` chunk.
    pub fn acknowledgement(&self, session_id: &str) -> Chunk {
        Chunk::confirmation_received(
            session_id,
            format!("Received {}", self.action.as_str()),
            self.action,
            &self.confirmation_id,
            self.round,
            self.decisions.as_ref(),
        )
        .finished()
    }
}

impl Runs {
    /// Decides the pause of `key` with `reply`: taken, recorded (store,
    /// then audit log) and delivered, or refused with the pause as it was
    /// (or, when the audit log or the store lost it, with the run ended).
    pub async fn decide(&self, key: &SessionKey, reply: Reply<'_>) -> Result<Decided, ReplyError> {
        let accepted =
            self.manager
                .decide(key, reply.message, reply.confirmation_id, reply.decisions)?;
        let decided = Decided {
            action: accepted.action,
            confirmation_id: accepted.confirmation_id.clone(),
            round: accepted.confirmation_round,
            decisions: accepted.decisions.clone(),
        };
        let accepted = self.record_in_store(key, accepted).await?;
        self.audit_and_deliver(key, reply.client, accepted).await?;
        Ok(decided)
    }

    /// A decision on a stored pause is recorded in the store first: a
    /// decision answered 200 must survive a crash that follows.
    async fn record_in_store(
        &self,
        key: &SessionKey,
        accepted: Accepted,
    ) -> Result<Accepted, ReplyError> {
        let Some(run) = &accepted.stored else {
            return Ok(accepted);
        };
        let decision = serde_json::json!({
            "action": accepted.action.as_str(),
            "confirmation_id": accepted.confirmation_id,
            "decisions": accepted.decisions,
        });
        let Err(err) = self.settings.store.record_decision(run, decision).await else {
            return Ok(accepted);
        };
        log::error!("{err}");
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
                self.relinquish(key);
                ReplyError::StoreUnavailable
            }
            // Nobody can decide it any more: it ends, nothing run, with
            // an error chunk that says so.
            Fault::Lost => {
                accepted.ticket.fail(ErrorType::StoreUnavailable);
                ReplyError::StoreLost
            }
        })
    }

    /// Hands the decision to its run: at once without an audit log; with
    /// one, only once the `decided` record is on disk. If it cannot be
    /// written the run ends with `audit_unavailable` and the reply is
    /// refused: a decision is never acted on unrecorded, nor acknowledged
    /// unacted.
    async fn audit_and_deliver(
        &self,
        key: &SessionKey,
        client: Option<&str>,
        accepted: Accepted,
    ) -> Result<(), ReplyError> {
        let Some(audit) = self.settings.audit.clone() else {
            accepted.ticket.deliver();
            return Ok(());
        };
        let record = AuditRecord::Decided {
            run: audit::RunFields::new(
                accepted.run_id,
                &key.session_id,
                accepted.stored.as_deref(),
            ),
            confirmation_id: accepted.confirmation_id,
            round: accepted.confirmation_round,
            action: accepted.action,
            decisions: accepted.decisions,
            key: crate::session::owner_label(key.owner),
            client: client.map(str::to_owned),
        };
        let ticket = accepted.ticket;
        // A task of its own: a client that goes away while the record is
        // being written cannot leave its decision half done.
        let written = tokio::spawn(async move {
            match audit.write(&record).await {
                Ok(()) => {
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
