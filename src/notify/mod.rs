//! Notifications that a person can act on: signed decision links
//! ([`links`]), approval mail ([`mail`]) and Slack messages with buttons
//! ([`slack`]). A link is just another way to reply: it decides through the
//! same path, scopes, quorum and journal as a reply on the chat endpoint.

pub mod links;
pub mod mail;
pub mod slack;

use crate::protocol::{PauseData, TaskSpec};

/// What a pause's mail says of it, read from its typed data: its risk, its
/// expiry, its tasks (a plan's; none for questions), and who decides it.
pub struct Card<'a> {
    pub risk: &'a str,
    pub expires_at: &'a str,
    pub tasks: &'a [TaskSpec],
    pub who_decides: String,
}

impl<'a> Card<'a> {
    /// `pause`'s card; an unknown pause (its request no longer at hand)
    /// has one approval to give by an unknown time, and no tasks.
    pub fn of(pause: Option<&'a PauseData>) -> Card<'a> {
        let one_reply = |expires_at: &'a str| Deciding {
            required: 1,
            groups: &[],
            on_timeout: None,
            expires_at,
            escalate_to: None,
            escalates_at: None,
        };
        match pause {
            Some(PauseData::Approval(plan)) => Card {
                risk: plan.risk_level.as_str(),
                expires_at: &plan.expires_at,
                tasks: &plan.tasks,
                who_decides: who_decides(Deciding {
                    required: plan.required,
                    groups: &plan.approvers,
                    on_timeout: plan.on_timeout.as_deref(),
                    expires_at: &plan.expires_at,
                    escalate_to: plan.escalate_to.as_deref(),
                    escalates_at: plan.escalates_at.as_deref(),
                }),
            },
            // Decided as its task's approval was; silence cancels.
            Some(PauseData::Reconcile(call)) => Card {
                risk: call.risk_level.as_str(),
                expires_at: &call.expires_at,
                tasks: std::slice::from_ref(&call.task),
                who_decides: who_decides(Deciding {
                    required: call.required,
                    groups: &call.approvers,
                    ..one_reply(&call.expires_at)
                }),
            },
            // One reply from anyone who may decide; silence cancels.
            Some(PauseData::Question(asked)) => Card {
                risk: "",
                expires_at: &asked.expires_at,
                tasks: &[],
                who_decides: who_decides(one_reply(&asked.expires_at)),
            },
            None => Card {
                risk: "",
                expires_at: "",
                tasks: &[],
                who_decides: who_decides(one_reply("")),
            },
        }
    }
}

/// Who decides a pause and what silence does.
pub struct Deciding<'a> {
    pub required: usize,
    pub groups: &'a [String],
    pub on_timeout: Option<&'a str>,
    pub expires_at: &'a str,
    pub escalate_to: Option<&'a str>,
    pub escalates_at: Option<&'a str>,
}

/// Who decides a pause, and what silence does, in one line for a person:
/// "Needs 2 approvals of leads. If nobody answers by T: it is cancelled,
/// nothing runs. Escalates to oncall at T2." (mail and Slack say it; the
/// page reads the fields).
pub fn who_decides(pause: Deciding<'_>) -> String {
    let groups = pause.groups.join(" and ");
    let mut line = match (pause.required.max(1), pause.groups.is_empty()) {
        (1, true) => "Needs one approval".to_owned(),
        (1, false) => format!("Needs one approval of {groups}"),
        (n, true) => format!("Needs {n} approvals from different people"),
        (n, false) => format!("Needs {n} approvals of {groups}"),
    };
    let silence = if pause.on_timeout == Some("reject") {
        "its tasks are rejected and the run goes on"
    } else {
        "it is cancelled, nothing runs"
    };
    line.push_str(&format!(
        ". If nobody answers by {}: {silence}.",
        pause.expires_at
    ));
    if let Some(group) = pause.escalate_to.filter(|group| !group.is_empty()) {
        line.push_str(&format!(
            " Escalates to {group} at {}.",
            pause.escalates_at.unwrap_or("")
        ));
    }
    line
}
