//! The Redis keys of sessions, pending lists, kept outcomes and runs.

/// `chatgate:session:NAMESPACE:SESSION`, `-` for the namespace without keys.
pub(super) fn session_key(namespace: Option<&str>, session_id: &str) -> String {
    format!("chatgate:session:{}:{session_id}", namespace.unwrap_or("-"))
}

/// `chatgate:pending:NAMESPACE`: the namespace's undecided stored pauses.
pub(super) fn pending_key(namespace: Option<&str>) -> String {
    format!("chatgate:pending:{}", namespace.unwrap_or("-"))
}

/// A session's kept outcome (`--keep-outcome`): expires by itself.
pub(super) fn outcome_key(namespace: Option<&str>, session_id: &str) -> String {
    format!("chatgate:outcome:{}:{session_id}", namespace.unwrap_or("-"))
}

/// `chatgate:parked`: the sessions whose run was parked (#46), scored by
/// when their data expires: how many are parked, for every replica.
pub(super) const PARKED_KEY: &str = "chatgate:parked";

pub(super) fn run_key(run: &str) -> String {
    format!("chatgate:run:{run}")
}

/// The fields of a run's hash a pause's progress steps are kept in (see
/// `progress.rs`).
pub(super) const PROGRESS_FIELDS: [&str; 4] = ["approvals", "reminded", "escalated", "started"];

/// [`PROGRESS_FIELDS`] as a Lua table named `PROGRESS`, for the scripts
/// that drop a pause's progress.
pub(super) fn progress_lua() -> String {
    let fields: Vec<String> = PROGRESS_FIELDS.iter().map(|f| format!("'{f}'")).collect();
    format!("local PROGRESS = {{{}}}\n", fields.join(", "))
}
