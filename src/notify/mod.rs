//! Notifications that a person can act on: signed decision links
//! ([`links`]), approval mail ([`mail`]) and Slack messages with buttons
//! ([`slack`]). A link is just another way to reply: it decides through the
//! same path, scopes, quorum and journal as a reply on the chat endpoint.

pub mod links;
pub mod mail;
pub mod slack;

pub use crate::protocol::pause_view::Deciding;
use crate::protocol::{PauseData, RiskLevel, TaskSpec};

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
        match pause {
            Some(pause) => Card {
                risk: pause.risk_level().map_or("", RiskLevel::as_str),
                expires_at: pause.expires_at(),
                tasks: pause.tasks(),
                who_decides: who_decides(pause.deciding()),
            },
            None => Card {
                risk: "",
                expires_at: "",
                tasks: &[],
                who_decides: who_decides(Deciding::one_reply("")),
            },
        }
    }
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
