//! The spelling of everything the wire names: chunk types, cancel reasons,
//! error types, actions, risk levels and metadata keys, each defined once
//! with its serde name (the clients use the same spelling).

use serde::{Deserialize, Serialize};
use strum::{EnumIter, IntoStaticStr};

/// Metadata keys, spelled once.
pub mod meta {
    pub const ACTION: &str = "action";
    pub const ANSWERS: &str = "answers";
    pub const KIND: &str = "kind";
    pub const TOTAL_QUESTIONS: &str = "total_questions";
    pub const DECISIONS: &str = "decisions";
    pub const DURATION_MS: &str = "duration_ms";
    pub const ERROR: &str = "error";
    pub const RESULT: &str = "result";
    pub const RETRY_AFTER: &str = "retry_after";
    pub const SKIPPED: &str = "skipped";
    /// On a `tool_output`: no declared tool ran; the step was pretended.
    pub const SIMULATED: &str = "simulated";
    pub const TRUNCATED: &str = "truncated";
    pub const CONFIRMATION_ID: &str = "confirmation_id";
    pub const CONFIRMATION_ROUND: &str = "confirmation_round";
    /// Who decided a pause (the key's label), on `already_decided`.
    pub const DECIDED_BY: &str = "decided_by";
    /// When (RFC 3339), on `already_decided`.
    pub const DECIDED_AT: &str = "decided_at";
    pub const ERROR_TYPE: &str = "error_type";
    pub const FINISH_REASON: &str = "finish_reason";
    pub const LAST_ROUND: &str = "last_round";
    pub const MODEL: &str = "model";
    pub const OK: &str = "ok";
    pub const OPTIONS: &str = "options";
    pub const REASON: &str = "reason";
    pub const RISK_LEVEL: &str = "risk_level";
    pub const STEP: &str = "step";
    pub const TASKS_COMPLETED: &str = "tasks_completed";
    /// On a planner's `completion`: tasks the person rejected.
    pub const TASKS_REJECTED: &str = "tasks_rejected";
    /// Tasks a `deny` rule left out (never run, never asked).
    pub const TASKS_DENIED: &str = "tasks_denied";
    /// A rule's name (a denied call's `tool_output`).
    pub const RULE: &str = "rule";
    /// Why a call ran without a person: `{"rule": name}` or `{"grant": id}`.
    pub const APPROVED_BY: &str = "approved_by";
    /// A `tool_output`'s signed receipt of the call's approval (#43).
    pub const RECEIPT: &str = "receipt";
    /// A call's idempotency key (#44): the same on every attempt.
    pub const IDEMPOTENCY_KEY: &str = "idempotency_key";
    /// A finished call's output shown again from the execution journal
    /// after a crash (it did not run again).
    pub const REPLAYED: &str = "replayed";
    /// A call made again after a crash cut it short, and which attempt.
    pub const RESUMED_AFTER_CRASH: &str = "resumed_after_crash";
    pub const ATTEMPT: &str = "attempt";
    /// A call cut short by a crash that its `reconcile` says took effect.
    pub const RECONCILED: &str = "reconciled";
    /// A call not run for `precondition_changed`: the digest of the
    /// preview approved, and of the preview now.
    pub const APPROVED_DIGEST: &str = "approved_digest";
    pub const CURRENT_DIGEST: &str = "current_digest";
    /// A grant kept, as `GET /api/v1/grants` lists it.
    pub const GRANT: &str = "grant";
    /// A quorum's approvals so far (labels, in order).
    pub const APPROVALS: &str = "approvals";
    /// The groups whose members alone approve a pause.
    pub const APPROVERS: &str = "approvers";
    /// How many approvals a quorum needs.
    pub const REQUIRED: &str = "required";
    /// Every label that approved a decided quorum.
    pub const APPROVED_BY_LABELS: &str = "approved_by";
    pub const TIMEOUT_SECONDS: &str = "timeout_seconds";
    pub const TOOL: &str = "tool";
    pub const TOTAL_TASKS: &str = "total_tasks";
    /// The tasks of a pause still pending (their indexes), after a `decide`.
    pub const PENDING: &str = "pending";
    /// Tasks that need several approvals, approved by a `decide` short of
    /// them: `[{"index", "approvals", "required"}]`.
    pub const TASK_APPROVALS: &str = "task_approvals";
}

/// What a chunk is, as written in `chunk_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, EnumIter)]
#[serde(rename_all = "snake_case")]
pub enum ChunkType {
    TaskInit,
    Status,
    Content,
    ToolOutput,
    ConfirmationRequest,
    /// A question pause (#16).
    InputRequest,
    ConfirmationReceived,
    /// One approval of several a pause needs (a quorum): the reply's
    /// acknowledgement; the pause stays pending.
    ApprovalRecorded,
    /// Some tasks of an approval pause decided on their own (`decide`,
    /// #42): the reply's acknowledgement (final) and a note on the paused
    /// stream (not final); the other tasks stay pending.
    DecisionRecorded,
    Completion,
    Cancelled,
    Error,
}

/// Why a run ended with a `cancelled` chunk, as written in `metadata.reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, IntoStaticStr, EnumIter)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum CancelReason {
    /// The user answered `cancel`.
    User,
    /// Nobody answered before the confirmation expired.
    Timeout,
    /// More modify rounds than `--max-rounds`.
    MaxRounds,
    /// A new chat message on the same session replaced the paused run.
    Superseded,
    /// The client of the stream went away.
    ClientGone,
    /// The server is shutting down.
    Shutdown,
    /// The attached client read so slowly that the replay buffer overflowed.
    SlowConsumer,
}

impl CancelReason {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The human text of a `cancelled` chunk.
    pub fn text(self) -> &'static str {
        match self {
            CancelReason::User => "Cancelled by the user; nothing was executed.",
            CancelReason::Timeout => {
                "No answer before the confirmation expired; nothing was executed."
            }
            CancelReason::MaxRounds => "Too many modify rounds; nothing was executed.",
            CancelReason::Superseded => "Superseded by a new message on this session.",
            CancelReason::ClientGone => "The client went away.",
            CancelReason::Shutdown => "The server is shutting down.",
            CancelReason::SlowConsumer => "The client read too slowly; the run was stopped.",
        }
    }
}

/// The `metadata.error_type` of an `error` chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, IntoStaticStr, EnumIter)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum ErrorType {
    InvalidRequest,
    NoPendingConfirmation,
    AlreadyDecided,
    StaleConfirmation,
    SessionBusy,
    PayloadTooLarge,
    UnsupportedMediaType,
    InvalidConfirmAction,
    TaskFailed,
    /// A call whose preview, run again just before it (`recheck`), shows
    /// another effect than the one approved: it did not run (#43).
    PreconditionChanged,
    ShuttingDown,
    Overloaded,
    Unauthorized,
    ForbiddenOrigin,
    RequestTimeout,
    NoSuchRun,
    /// The engine's model server could not be reached or failed.
    EngineUnavailable,
    /// The model server sent more than chatgate accepts (an index, a line,
    /// arguments or text past a documented bound).
    EngineLimit,
    /// The plan has more than [`MAX_PLAN_TASKS`](super::MAX_PLAN_TASKS) tasks or more than
    /// [`MAX_CONFIRMATION_BYTES`](super::MAX_CONFIRMATION_BYTES) of confirmation data.
    PlanTooLarge,
    /// A plan's step would call a declared tool with arguments that do not
    /// fit its schema; nothing was asked.
    InvalidToolArgs,
    /// With a tools file, a plan's step names what looks like a tool but is
    /// none (a misspelling); nothing was asked.
    UnknownTool,
    /// A reply's `decisions` do not fit the pending confirmation (422).
    InvalidDecision,
    /// A `deny` rule of the tools file matches the call (a `tool_output`
    /// of a call left out; an edit's new arguments: 422).
    DeniedByRule,
    /// With `--explicit-decisions`, a `decisions` reply leaves tasks
    /// undecided (422).
    UndecidedTasks,
    /// A confirm's `grant` does not fit the pause (422).
    InvalidGrant,
    /// The requester's namespace holds the most live grants (422).
    TooManyGrants,
    /// A grant's revoke names no grant the caller can see (404).
    NoSuchGrant,
    /// The deciding key may not decide this pause: a task's risk above its
    /// `max_risk`, a group it is not in, a namespace it does not see (403).
    ForbiddenScope,
    /// The requester's own key may not approve this pause (403).
    SelfApproval,
    /// This label approved this pause already (409).
    AlreadyApproved,
    /// A reply's `preview_digest` is not the task's current preview (409).
    PreviewStale,
    /// An edit on a pause whose approvals others give (422).
    EditNeedsNewRound,
    /// A reply's answer does not fit the pending questions (422).
    InvalidAnswer,
    /// An engine's questions break a bound of a question pause; nothing was asked.
    InvalidQuestions,
    /// The audit log cannot be written: nothing runs (fail closed).
    AuditUnavailable,
    /// The model kept calling tools past the calls a run may make.
    ToolCallLimit,
    /// The model server kept answering 429/503 within the call's deadline.
    RateLimited,
    /// The store (`--store`) cannot record a pause or a decision.
    StoreUnavailable,
    /// The decision was recorded but the process stopped before the run had
    /// acted on it all: after the restart the run is not run again.
    Interrupted,
    /// Without API keys, the `Host` header names neither loopback, the bound
    /// address nor an `--allowed-host` (DNS rebinding).
    ForbiddenHost,
    /// A method other than POST (or OPTIONS) on the chat endpoint.
    MethodNotAllowed,
    /// A request posing as a replica's (a wrong or unexpected cluster secret).
    ForbiddenReplica,
    /// An approver key asked for what only a namespace's key may do (start a run).
    ForbiddenRole,
    /// The replica that owns the session's run cannot be reached (503):
    /// the request was not taken.
    OwnerUnavailable,
    /// Whether the request was taken is not known (504): the store or the
    /// owning replica did not answer in time. Re-attach to see the run.
    OutcomeUnknown,
    Internal,
}

impl ErrorType {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// A per-task decision a confirm may carry (`decisions[].decision`); each
/// task of a `confirmation_request` lists the ones it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, IntoStaticStr, EnumIter)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum DecisionKind {
    Approve,
    Reject,
    /// New arguments: only for a task that calls a declared tool.
    Edit,
    Respond,
}

impl DecisionKind {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// What a task takes: every kind when it calls a declared tool, else
    /// all but `edit` (there are no arguments that would run).
    pub fn for_task(calls_a_tool: bool) -> Vec<DecisionKind> {
        if calls_a_tool {
            vec![Self::Approve, Self::Reject, Self::Edit, Self::Respond]
        } else {
            vec![Self::Approve, Self::Reject, Self::Respond]
        }
    }
}

/// Where one task of an approval pause stands (`confirmation_data.tasks[].
/// state`, #42): `pending` until a decision names it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum TaskState {
    #[default]
    Pending,
    Approved,
    Rejected,
    Edited,
    Responded,
    Expired,
}

impl TaskState {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// What kind of pause a `confirmation_data` holds: a plan to approve (a
/// `confirmation_request`), or questions (an `input_request`, #16).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, IntoStaticStr, EnumIter,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum PauseKind {
    /// Stored records of older versions have no kind: they are approvals.
    #[default]
    Approval,
    Question,
    /// A call cut short by a crash whose effect nobody can know (#44):
    /// run it again, skip it, or cancel the run.
    Reconcile,
}

impl PauseKind {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// A reply a user can give to a pause: `confirm`, `modify`, `cancel` to a
/// confirmation request; `answer`, `skip`, `cancel` to questions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, IntoStaticStr, EnumIter)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Action {
    Confirm,
    Modify,
    Cancel,
    Answer,
    Skip,
    /// Decides only the tasks its `decisions` name (#42); accepted wherever
    /// `confirm` is, and not listed in `options`.
    Decide,
    /// Call again, with its key, a task a crash cut short (a reconcile
    /// pause's yes, #44).
    RunAgain,
    /// Nobody answered a pause whose tasks say `on_timeout = "reject"`:
    /// every task rejected, the run goes on. Recorded and shown, never
    /// sent by a client (no pause offers it).
    TimeoutReject,
}

impl Action {
    /// What a confirmation request offers, in order (its last round: no modify).
    pub const ALL: [Action; 3] = [Action::Confirm, Action::Modify, Action::Cancel];
    /// What a question pause offers, always.
    pub const QUESTION: [Action; 3] = [Action::Answer, Action::Skip, Action::Cancel];
    /// What a reconcile pause offers, always.
    pub const RECONCILE: [Action; 3] = [Action::RunAgain, Action::Skip, Action::Cancel];

    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Parses an already trimmed, lower-cased action word (what a reply
    /// may say: never `timeout_reject`).
    pub fn from_word(word: &str) -> Option<Action> {
        use strum::IntoEnumIterator;
        Action::iter().find(|a| a.as_str() == word && *a != Action::TimeoutReject)
    }
}

/// How risky a plan is, as judged by the engine.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    IntoStaticStr,
    EnumIter,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum RiskLevel {
    Low,
    Medium,
    High,
}

impl RiskLevel {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn wire_names_match_serde_names_for_every_variant() {
        use strum::IntoEnumIterator;
        for reason in CancelReason::iter() {
            assert_eq!(serde_json::to_value(reason).unwrap(), reason.as_str());
        }
        for error_type in ErrorType::iter() {
            assert_eq!(
                serde_json::to_value(error_type).unwrap(),
                error_type.as_str()
            );
        }
        for action in Action::iter() {
            assert_eq!(serde_json::to_value(action).unwrap(), action.as_str());
        }
        assert_eq!(ErrorType::EngineLimit.as_str(), "engine_limit");
        assert_eq!(CancelReason::ClientGone.as_str(), "client_gone");
        assert_eq!(
            serde_json::to_value(ChunkType::ConfirmationRequest).unwrap(),
            Value::from("confirmation_request")
        );
    }
}
