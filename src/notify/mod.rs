//! Notifications that a person can act on: signed decision links
//! ([`links`]), approval mail ([`mail`]) and Slack messages with buttons
//! ([`slack`]). A link is just another way to reply: it decides through the
//! same path, scopes, quorum and journal as a reply on the chat endpoint.

pub mod links;
pub mod mail;
pub mod slack;

use serde_json::Value;

/// Who decides the pause whose `confirmation_data` is `data`, and what
/// silence does, in one line for a person: "Needs 2 approvals of leads.
/// If nobody answers by T: it is cancelled, nothing runs. Escalates to
/// oncall at T2." (mail and Slack say it; the page reads the fields).
pub fn who_decides(data: &Value) -> String {
    let text = |k: &str| data.get(k).and_then(Value::as_str).unwrap_or("");
    let required = data.get("required").and_then(Value::as_u64).unwrap_or(1);
    let groups: Vec<&str> = data
        .get("approvers")
        .and_then(Value::as_array)
        .map(|list| list.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut line = match (required, groups.is_empty()) {
        (1, true) => "Needs one approval".to_owned(),
        (1, false) => format!("Needs one approval of {}", groups.join(" and ")),
        (n, true) => format!("Needs {n} approvals from different people"),
        (n, false) => format!("Needs {n} approvals of {}", groups.join(" and ")),
    };
    let silence = if text("on_timeout") == "reject" {
        "its tasks are rejected and the run goes on"
    } else {
        "it is cancelled, nothing runs"
    };
    line.push_str(&format!(
        ". If nobody answers by {}: {silence}.",
        text("expires_at")
    ));
    if !text("escalate_to").is_empty() {
        line.push_str(&format!(
            " Escalates to {} at {}.",
            text("escalate_to"),
            text("escalates_at")
        ));
    }
    line
}
