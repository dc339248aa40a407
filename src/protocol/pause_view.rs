//! What the faces read of a pause, whatever its kind (#39): the inbox, the
//! link page and its form, the waiting pauses, AG-UI and A2A ask these of
//! a [`PauseData`] (and a stored [`Ask`]) instead of matching its kinds.
//! Each is one exhaustive match here, so a new kind of pause says what it
//! is in this file, once, and the compiler names every question.

use super::ask::Ask;
use super::chunk::PauseData;
use super::names::RiskLevel;
use super::question::Question;
use super::task_spec::TaskSpec;

/// Who decides a pause and what silence does, as its data says (mail,
/// Slack and the page word it).
pub struct Deciding<'a> {
    pub required: usize,
    pub groups: &'a [String],
    pub on_timeout: Option<&'a str>,
    pub expires_at: &'a str,
    pub escalate_to: Option<&'a str>,
    pub escalates_at: Option<&'a str>,
}

impl<'a> Deciding<'a> {
    /// One reply from anyone who may decide, by `expires_at`; silence
    /// cancels.
    pub fn one_reply(expires_at: &'a str) -> Deciding<'a> {
        Deciding {
            required: 1,
            groups: &[],
            on_timeout: None,
            expires_at,
            escalate_to: None,
            escalates_at: None,
        }
    }
}

impl PauseData {
    /// When it expires (RFC 3339, UTC).
    pub fn expires_at(&self) -> &str {
        match self {
            PauseData::Approval(plan) => &plan.expires_at,
            PauseData::Question(asked) => &asked.expires_at,
            PauseData::Reconcile(call) => &call.expires_at,
        }
    }

    /// Who decides it, and what silence does.
    pub fn deciding(&self) -> Deciding<'_> {
        match self {
            PauseData::Approval(plan) => Deciding {
                required: plan.required,
                groups: &plan.approvers,
                on_timeout: plan.on_timeout.as_deref(),
                expires_at: &plan.expires_at,
                escalate_to: plan.escalate_to.as_deref(),
                escalates_at: plan.escalates_at.as_deref(),
            },
            // Decided as its task's approval was; silence cancels.
            PauseData::Reconcile(call) => Deciding {
                required: call.required,
                groups: &call.approvers,
                ..Deciding::one_reply(&call.expires_at)
            },
            // One reply from anyone who may decide; silence cancels.
            PauseData::Question(asked) => Deciding::one_reply(&asked.expires_at),
        }
    }

    /// The tasks decided one by one, each its own pending entry (a plan's;
    /// questions and a reconcile pause are decided whole).
    pub fn tasks_one_by_one(&self) -> &[TaskSpec] {
        match self {
            PauseData::Approval(plan) => &plan.tasks,
            PauseData::Question(_) | PauseData::Reconcile(_) => &[],
        }
    }

    /// The tasks its decision is about (a plan's; the call a reconcile
    /// pause asks about; none for questions).
    pub fn tasks(&self) -> &[TaskSpec] {
        match self {
            PauseData::Approval(plan) => &plan.tasks,
            PauseData::Reconcile(call) => std::slice::from_ref(&*call.task),
            PauseData::Question(_) => &[],
        }
    }

    /// The questions it asks (none but a question pause's).
    pub fn questions(&self) -> &[Question] {
        match self {
            PauseData::Question(asked) => &asked.questions,
            PauseData::Approval(_) | PauseData::Reconcile(_) => &[],
        }
    }

    /// Its risk, where it decides on tasks.
    pub fn risk_level(&self) -> Option<RiskLevel> {
        match self {
            PauseData::Approval(plan) => Some(plan.risk_level),
            PauseData::Reconcile(call) => Some(call.risk_level),
            PauseData::Question(_) => None,
        }
    }

    /// Its title, where it has one of its own (a plan is shown by its
    /// request's text).
    pub fn title(&self) -> Option<&str> {
        match self {
            PauseData::Question(asked) => Some(&asked.title),
            PauseData::Reconcile(call) => Some(&call.title),
            PauseData::Approval(_) => None,
        }
    }

    /// What it says of itself beside its tasks (a reconcile pause: what
    /// happened and what each option does).
    pub fn message(&self) -> Option<&str> {
        match self {
            PauseData::Reconcile(call) => Some(&call.message),
            PauseData::Approval(_) | PauseData::Question(_) => None,
        }
    }

    /// What an inbox line sums it up with: a plan, its request's text
    /// (`request`); a reconcile pause, what happened; questions, nothing
    /// beyond their title.
    pub fn summary<'a>(&'a self, request: &'a str) -> Option<&'a str> {
        match self {
            PauseData::Approval(_) => Some(request),
            PauseData::Reconcile(_) | PauseData::Question(_) => self.message(),
        }
    }

    /// Whether people other than one requester must decide it: a group
    /// decides it, or it needs the approvals of several people (its own,
    /// or one of its tasks').
    pub fn needs_others(&self) -> bool {
        match self {
            PauseData::Approval(plan) => {
                !plan.approvers.is_empty()
                    || plan.required > 1
                    || plan.tasks.iter().any(|t| t.required.is_some_and(|n| n > 1))
            }
            PauseData::Reconcile(call) => !call.approvers.is_empty() || call.required > 1,
            PauseData::Question(_) => false,
        }
    }
}

impl Ask {
    /// A plan's tasks, whose gates (timers, what silence does) hold while
    /// it waits; `None` for the kinds whose wait has no such gates.
    pub fn plan_tasks(&self) -> Option<&[TaskSpec]> {
        match self {
            Ask::Approval { tasks } => Some(tasks),
            Ask::Question { .. } | Ask::Reconcile { .. } => None,
        }
    }

    /// The tasks whose tools say who decides it (a plan's, a reconcile
    /// pause's call); `None` when one reply from anyone who may decide the
    /// session does (questions).
    pub fn deciding_tasks(&self) -> Option<&[TaskSpec]> {
        match self {
            Ask::Approval { tasks } => Some(tasks),
            Ask::Reconcile { task } => Some(std::slice::from_ref(&**task)),
            Ask::Question { .. } => None,
        }
    }
}
