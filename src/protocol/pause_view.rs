//! What the faces read of a pause, whatever its kind (#39): the inbox, the
//! link page and its form, the waiting pauses, AG-UI and A2A ask these of
//! a [`PauseData`] instead of matching its kinds. Each kind answers them
//! in its own file ([`crate::protocol::kinds::contract::KindData`]), and the
//! compiler names every question for a new one.

pub use super::kinds::contract::Deciding;
use super::kinds::PauseData;
use super::names::RiskLevel;
use super::question::Question;
use super::task_spec::TaskSpec;

/// What the faces read of a pause's data, asked of its kind
/// ([`crate::protocol::kinds::contract::KindData`]).
impl PauseData {
    /// The id of the pause this request asks.
    pub fn confirmation_id(&self) -> &str {
        self.view().confirmation_id()
    }

    /// When it expires (RFC 3339, UTC).
    pub fn expires_at(&self) -> &str {
        self.view().expires_at()
    }

    /// Who decides it, and what silence does.
    pub fn deciding(&self) -> Deciding<'_> {
        self.view().deciding()
    }

    /// The tasks decided one by one, each its own pending entry (a plan's;
    /// questions and a reconcile pause are decided whole).
    pub fn tasks_one_by_one(&self) -> &[TaskSpec] {
        self.view().tasks_one_by_one()
    }

    /// The tasks its decision is about (a plan's; the call a reconcile
    /// pause asks about; none for questions).
    pub fn tasks(&self) -> &[TaskSpec] {
        self.view().tasks()
    }

    /// The questions it asks (none but a question pause's).
    pub fn questions(&self) -> &[Question] {
        self.view().questions()
    }

    /// Its risk, where it decides on tasks.
    pub fn risk_level(&self) -> Option<RiskLevel> {
        self.view().risk_level()
    }

    /// Its title, where it has one of its own (a plan is shown by its
    /// request's text).
    pub fn title(&self) -> Option<&str> {
        self.view().title()
    }

    /// What it says of itself beside its tasks (a reconcile pause: what
    /// happened and what each option does).
    pub fn message(&self) -> Option<&str> {
        self.view().message()
    }

    /// What an inbox line sums it up with: a plan, its request's text
    /// (`request`); a reconcile pause, what happened; questions, nothing
    /// beyond their title.
    pub fn summary<'a>(&'a self, request: &'a str) -> Option<&'a str> {
        self.view().summary(request)
    }

    /// Whether people other than one requester must decide it: a group
    /// decides it, or it needs the approvals of several people (its own,
    /// or one of its tasks').
    pub fn needs_others(&self) -> bool {
        self.view().needs_others()
    }
}
