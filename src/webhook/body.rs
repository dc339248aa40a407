//! The `data` of each event type, typed: the field names live here once,
//! as the structs' fields (docs/operations.md pins them). `serde_json`
//! writes an object's keys in order, so a body's bytes do not depend on
//! the order of the fields below.

use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use crate::protocol::Given;
use crate::protocol::{Action, CancelReason, ChunkType, Decisions, Via};

/// `interaction.decided`: what a reply (or a supersede) decided, and who.
#[derive(Debug, Serialize)]
pub(super) struct Decided<'a> {
    action: Action,
    /// `decisions` or `answers`, whichever the reply gave.
    #[serde(flatten)]
    given: Option<&'a Given>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<CancelReason>,
    decided_by: DecidedBy<'a>,
    /// A quorum's labels, in order: only when more than one approved.
    #[serde(skip_serializing_if = "Option::is_none")]
    approved_by: Option<&'a [String]>,
    /// The door the decision came through (`chat`, `agui`, `link`, `slack`).
    via: Via,
}

/// Who decided: the deciding key's label and the client's address.
#[derive(Debug, Serialize)]
struct DecidedBy<'a> {
    key: &'a str,
    client: Option<&'a str>,
}

impl<'a> Decided<'a> {
    pub(super) fn of(decision: &DecisionData<'a>) -> Decided<'a> {
        Decided {
            action: decision.action,
            given: decision.given,
            reason: decision.reason,
            decided_by: DecidedBy {
                key: decision.decider,
                client: decision.client,
            },
            approved_by: (decision.approved_by.len() > 1).then_some(decision.approved_by),
            via: decision.via,
        }
    }
}

/// What an `interaction.decided` event says.
#[derive(Debug, Clone, Copy)]
pub struct DecisionData<'a> {
    pub action: Action,
    /// What the reply gave (verdicts, or answers).
    pub given: Option<&'a Given>,
    /// A cancel's reason (`user`, `superseded`).
    pub reason: Option<CancelReason>,
    pub decider: &'a str,
    pub client: Option<&'a str>,
    /// A quorum's labels, in order (reported when more than one approved).
    pub approved_by: &'a [String],
    /// A modify's text: kept with the decision (a run that goes on after a
    /// crash replans with it), never sent in an event.
    pub text: Option<&'a str>,
    /// The door the decision came through.
    pub via: Via,
}

impl DecisionData<'_> {
    /// A supersede: cancelled by a new message of the same key.
    pub fn superseded(decider: &str) -> DecisionData<'_> {
        DecisionData {
            action: Action::Cancel,
            given: None,
            reason: Some(CancelReason::Superseded),
            decider,
            client: None,
            approved_by: &[],
            text: None,
            via: Via::Chat,
        }
    }
}

/// `interaction.progress`: one approval of several a pause needs.
#[derive(Debug, Serialize)]
pub(super) struct Progress<'a> {
    pub approvals: &'a [String],
    pub required: usize,
    pub approved_by: &'a str,
    /// The door the approval came through.
    pub via: Via,
}

/// `interaction.progress` of a `decide` (#42): the tasks it decided, by
/// whom, and the tasks still pending.
#[derive(Debug, Serialize)]
pub(super) struct TasksDecided<'a> {
    pub decisions: &'a crate::protocol::Decisions,
    pub decided_by: &'a str,
    pub pending: &'a [usize],
    /// Tasks approved towards a quorum they do not have yet.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub task_approvals: &'a [crate::store::TaskApprovals],
    /// The door the decision came through (none: a timeout decided).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via: Option<Via>,
}

/// `interaction.reminder` and `interaction.escalated`: how long the pause
/// has waited, and (escalated) to which group.
#[derive(Debug, Serialize)]
pub(super) struct Waited<'a> {
    waited_seconds: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    escalated_to: Option<&'a str>,
    /// The tasks it is for (#42), still pending when it fired.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    tasks: &'a [usize],
}

impl<'a> Waited<'a> {
    pub(super) fn new(
        waited: Duration,
        escalated_to: Option<&'a str>,
        tasks: &'a [usize],
    ) -> Waited<'a> {
        Waited {
            waited_seconds: waited.as_secs(),
            escalated_to,
            tasks,
        }
    }
}

/// `interaction.expired`: the pause's timeout decided: a cancel, or (its
/// tasks saying `on_timeout = "reject"`) every task rejected, `decisions`
/// saying which, and the run went on.
#[derive(Debug, Serialize)]
pub(super) struct Expired<'a> {
    action: Action,
    reason: CancelReason,
    timeout_seconds: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    decisions: Option<&'a Decisions>,
}

impl<'a> Expired<'a> {
    pub(super) fn after(timeout: Duration) -> Expired<'a> {
        Expired {
            action: Action::Cancel,
            reason: CancelReason::Timeout,
            timeout_seconds: timeout.as_secs(),
            decisions: None,
        }
    }

    pub(super) fn rejecting(timeout: Duration, rejected: &'a Decisions) -> Expired<'a> {
        Expired {
            action: Action::TimeoutReject,
            decisions: Some(rejected),
            ..Expired::after(timeout)
        }
    }
}

/// `run.resumed` (#44): the task continued after a crash, its key, how.
#[derive(Debug, Serialize)]
pub(super) struct Resumed<'a> {
    pub task: usize,
    pub tool: &'a str,
    pub idempotency_key: &'a str,
    pub how: crate::protocol::ResumedHow,
}

/// `run.ended`: the final chunk's type, and an error's type or a cancel's
/// reason (`null` when there is none).
#[derive(Debug, Serialize)]
pub(super) struct Ended<'a> {
    outcome: ChunkType,
    #[serde(flatten)]
    why: Why<'a>,
}

/// An error names its type; any other end its reason.
#[derive(Debug, Serialize)]
#[serde(rename_all = "snake_case")]
enum Why<'a> {
    ErrorType(Option<&'a str>),
    Reason(Option<&'a str>),
}

impl Ended<'_> {
    pub(super) fn new(outcome: ChunkType, why: Option<&str>) -> Ended<'_> {
        let why = match outcome {
            ChunkType::Error => Why::ErrorType(why),
            _ => Why::Reason(why),
        };
        Ended { outcome, why }
    }
}

/// `grant.created` and `grant.revoked`: the grant as the API lists it,
/// and (revoked) who revoked it.
#[derive(Debug, Serialize)]
pub(super) struct Grant<'a> {
    #[serde(flatten)]
    pub grant: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revoked_by: Option<&'a str>,
}

/// `body` as the event's `data`.
pub(super) fn data(body: impl Serialize) -> Value {
    serde_json::to_value(body).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_bodies_keep_their_documented_fields() {
        let decided = DecisionData {
            action: Action::Cancel,
            given: None,
            reason: Some(CancelReason::User),
            decider: "ops",
            client: None,
            approved_by: &["ops".to_owned()],
            text: None,
            via: Via::Link,
        };
        assert_eq!(
            data(Decided::of(&decided)),
            json!({"action": "cancel", "reason": "user",
                   "decided_by": {"key": "ops", "client": null}, "via": "link"})
        );
        let two = ["a".to_owned(), "b".to_owned()];
        let quorum = DecisionData {
            action: Action::Confirm,
            approved_by: &two,
            client: Some("127.0.0.1"),
            reason: None,
            ..decided
        };
        assert_eq!(
            data(Decided::of(&quorum)),
            json!({"action": "confirm", "approved_by": ["a", "b"],
                   "decided_by": {"key": "ops", "client": "127.0.0.1"}, "via": "link"})
        );
        assert_eq!(
            data(Ended::new(ChunkType::Error, Some("timeout"))),
            json!({"outcome": "error", "error_type": "timeout"})
        );
        assert_eq!(
            data(Ended::new(ChunkType::Completion, None)),
            json!({"outcome": "completion", "reason": null})
        );
        assert_eq!(
            data(Expired::after(Duration::from_secs(30))),
            json!({"action": "cancel", "reason": "timeout", "timeout_seconds": 30})
        );
        assert_eq!(
            data(Waited::new(Duration::from_secs(5), Some("oncall"), &[])),
            json!({"waited_seconds": 5, "escalated_to": "oncall"})
        );
        assert_eq!(
            data(Waited::new(Duration::from_secs(5), None, &[])),
            json!({"waited_seconds": 5})
        );
        let grant = Grant {
            grant: json!({"id": "g"}),
            revoked_by: Some("admin"),
        };
        assert_eq!(data(grant), json!({"id": "g", "revoked_by": "admin"}));
    }
}
