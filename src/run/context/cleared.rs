//! What lets a call run, the grants a run spent and the previews its
//! latest plan showed: the types its receipts and rechecks are made from
//! (`receipts`, `previews`), apart from [`RunContext`] so that the context
//! may hold them.
//!
//! [`RunContext`]: super::RunContext

use crate::protocol::ApprovedBy;

/// What lets a call run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cleared {
    /// A person's decision on the run's pause: a confirm, a quorum's last
    /// approval, a task's own decide.
    Person,
    /// A rule or a grant, without a person's yes now.
    Allowed(ApprovedBy),
    /// A tool that needs no confirmation (`confirm = false`): no decision,
    /// so no receipt.
    Unasked,
}

impl Cleared {
    /// What the `tool_output` chunk and the `executed` record name.
    pub fn approved_by(&self) -> Option<ApprovedBy> {
        match self {
            Cleared::Allowed(by) => Some(by.clone()),
            Cleared::Person | Cleared::Unasked => None,
        }
    }

    /// A person's decision, unless a rule or a grant let it run.
    pub fn or_person(by: Option<ApprovedBy>) -> Cleared {
        by.map_or(Cleared::Person, Cleared::Allowed)
    }
}

/// The grant a call is about to spend, as its receipt names it.
#[derive(Debug, Clone)]
pub struct Granted {
    pub id: String,
    pub granted_by: String,
    pub created_at_ms: u64,
}

/// A task's preview as its plan was asked: what its approval saw.
#[derive(Debug, Clone)]
pub(crate) struct Previewed {
    pub index: usize,
    pub digest: String,
    /// Where its body was cut (the pause's budget), for a recheck to cut
    /// the same.
    pub cut_at: usize,
}
