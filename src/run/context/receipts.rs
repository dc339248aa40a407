//! A call's signed receipt (#43): which decision let exactly this call
//! run, who took it, through which door, when (docs/tools.md, "Receipts").

use serde_json::Value;

use super::cleared::{Cleared, Granted};
use super::RunContext;
use crate::protocol::{ApprovedBy, Via};
use crate::receipt::{call_digest, Receipt, TaskClaim};

/// Who let a call run, as its receipt says.
struct Signer {
    confirmation_id: Option<String>,
    approved_by: Vec<String>,
    via: Via,
    at_ms: u64,
}

/// The grants a run remembers for its receipts: the calls of one model
/// turn at most (the calls routed before any runs).
const GRANTS_NOTED: usize = crate::protocol::MAX_PLAN_TASKS;

impl RunContext {
    /// Notes the grant a call is about to spend, for its receipt.
    pub(super) fn note_granted(&mut self, granted: Granted) {
        if self.granted.len() >= GRANTS_NOTED {
            self.granted.remove(0);
        }
        self.granted.push(granted);
    }

    /// The receipt of task `index`, a call of `tool` with `args` (as they
    /// run), cleared as `cleared`; `None` for a call nobody had to clear.
    pub(super) fn receipt(
        &self,
        index: usize,
        tool: &str,
        args: &Value,
        cleared: &Cleared,
        idempotency_key: &str,
    ) -> Option<String> {
        let signer = match cleared {
            Cleared::Unasked => return None,
            Cleared::Allowed(ApprovedBy::Rule(rule)) => Signer {
                confirmation_id: None,
                approved_by: vec![rule.clone()],
                via: Via::Rule,
                at_ms: crate::clock::now_ms(),
            },
            Cleared::Allowed(ApprovedBy::Grant(id)) => {
                let (granted_by, at_ms) = self
                    .granted
                    .iter()
                    .rfind(|g| g.id == *id)
                    .map_or((Vec::new(), crate::clock::now_ms()), |g| {
                        (vec![g.granted_by.clone()], g.created_at_ms)
                    });
                Signer {
                    confirmation_id: None,
                    approved_by: granted_by,
                    via: Via::Grant,
                    at_ms,
                }
            }
            Cleared::Person => self.person_signer(index),
        };
        let receipts = &self.settings.receipts;
        let receipt = Receipt {
            iss: receipts.issuer().to_owned(),
            confirmation_id: signer.confirmation_id,
            session_id: self.session_id().to_owned(),
            round: self.round,
            task: TaskClaim {
                index,
                tool: tool.to_owned(),
                args_digest: call_digest(tool, args),
                // What a person was shown: a rule or a grant was shown nothing.
                preview_digest: (*cleared == Cleared::Person)
                    .then(|| self.previewed(index).map(str::to_owned))
                    .flatten(),
            },
            approved_by: signer.approved_by,
            via: signer.via,
            decided_at: crate::clock::rfc3339_ms(signer.at_ms),
            idempotency_key: Some(idempotency_key.to_owned()),
        };
        Some(receipts.sign(&receipt))
    }

    /// Who decided task `index`: its own decide while the pause waits on,
    /// else the decision of the run's last pause (the run's log notes it
    /// before the run learns it).
    fn person_signer(&self, index: usize) -> Signer {
        if let Some((confirmation_id, done)) = self.slot.decided_task(index) {
            let approved_by = if done.approved_by.is_empty() {
                vec![done.by]
            } else {
                done.approved_by
            };
            return Signer {
                confirmation_id: Some(confirmation_id),
                approved_by,
                via: done.via,
                at_ms: if done.at_ms == 0 {
                    crate::clock::now_ms()
                } else {
                    done.at_ms
                },
            };
        }
        let note = self.replay.decided(None);
        let confirmation_id = note.as_ref().map(|note| note.confirmation_id.clone());
        match note.and_then(|note| note.decided) {
            Some(decided) => Signer {
                confirmation_id,
                approved_by: if decided.approved_by.is_empty() {
                    vec![decided.by]
                } else {
                    decided.approved_by
                },
                via: decided.via,
                at_ms: decided.at_ms,
            },
            // A run restored from a store after its decision: who decided
            // is in the audit log's `decided` record, not in this process.
            None => Signer {
                confirmation_id,
                approved_by: Vec::new(),
                via: Via::Chat,
                at_ms: crate::clock::now_ms(),
            },
        }
    }
}
