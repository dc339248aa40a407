//! The kinds of pause, each in its own file: what a pause of that kind
//! asks and how a reply to it is checked.
//!
//! - [`approval`]: a plan put to the user (`confirmation_request`): who
//!   may decide the tasks a reply decides, the per-task decisions a
//!   confirm carries, its [`grant`]; what the plan asks (its tasks'
//!   checks, who must approve it: [`plan_check::Quorum`]) is
//!   [`plan_check`]'s.
//! - [`questions`]: questions put to the user (`input_request`): the
//!   answers a reply carries.
//! - [`reconcile`]: a call a crash cut short (`input_request`, #44):
//!   `run_again`, `skip` or `cancel`, decided as the task's approval.
//!
//! Each kind's file has its `check_reply`: a [`reply::Reply`] checked
//! against what the pause asks, to what it gave ([`reply::Checked`]) or
//! why it is refused ([`reply::Refused`]). [`Asking`] is what a pause
//! asks, and dispatches the check ([`Asking::check`]): the registry
//! (`confirmation`) keeps one per pause, checks what every pause shares
//! (the action offered, the round, still pending) and asks it the rest;
//! the run reads who may decide it ([`Asking::scope`]). The
//! wire types of each kind live in `protocol/kinds/`, listed once in the
//! table of `protocol/kinds.rs`; its audit records and webhook events in
//! `run/journal.rs`.
//!
//! Adding a kind (#39), every file but its own named by the compiler:
//!
//! - its `PauseKind` word and its error row (`protocol/names.rs`);
//! - its wire type in `protocol/kinds/`, answering `KindData`, `KindWire`,
//!   `KindAsked` and `AguiFace` (what the faces read, what it offers, what
//!   a stored record keeps, its AG-UI interrupts and how a `resume` of
//!   them reads), and a row of the table in `protocol/kinds.rs`;
//! - its run side, a file in `run/context/kinds/` implementing `Kind` (its
//!   request, how its decision is taken and acknowledged, how a stored
//!   pause of it is restored), and its row (and `mod` line) in
//!   `run/context/kinds.rs`;
//! - only where it checks replies in a way no kind does yet: a file here
//!   (its `check_reply`) and its arms of [`Asking`] (this file). [`Asking`]
//!   is how replies are checked, not the kind: the registry keeps each pause's kind beside it, so a kind
//!   checked as questions are (one answer) asks with [`Asking::Questions`];
//! - its card on the link page (`http/links/page.rs`).
//!
//! Where the faces treat kinds differently (buttons, the audit record, an
//! answer form) they ask what the kind offers ([`PauseKind::asks_a_yes`]
//! and its siblings), never its name.
//! The run side lives above the registry, this below it: the registry
//! checks replies against an [`Asking`] and must not know runs.

pub mod approval;
pub mod grant;
pub mod plan_check;
pub mod questions;
pub mod reconcile;
pub mod reply;

use std::sync::Arc;

use self::plan_check::{PlanCheck, Quorum};
use crate::protocol::question::Question;
use crate::protocol::{Action, PauseKind, RiskLevel};

/// What a pause asks, to check the replies to it against.
#[derive(Debug, Clone)]
pub enum Asking {
    /// A plan: one check per task asked, in order.
    Plan(Arc<PlanCheck>),
    /// Questions: an answer must fit them.
    Questions(Arc<[Question]>),
    /// A call a crash cut short: its task's check, decided as its
    /// approval was (`run_again` its yes).
    Reconcile(Arc<PlanCheck>),
}

impl Asking {
    /// The tasks whose approvals it counts (a plan's, a reconcile's one),
    /// checked by the tasks' rule of who may decide.
    pub fn plan(&self) -> Option<&Arc<PlanCheck>> {
        match self {
            Asking::Plan(plan) | Asking::Reconcile(plan) => Some(plan),
            Asking::Questions(_) => None,
        }
    }

    /// The plan whose tasks are decided one by one (`decide`, per-task
    /// decisions): a plan's; a reconcile pause and questions are decided
    /// whole.
    pub fn plan_by_task(&self) -> Option<&Arc<PlanCheck>> {
        match self {
            Asking::Plan(plan) => Some(plan),
            Asking::Questions(_) | Asking::Reconcile(_) => None,
        }
    }

    /// Who must approve the pause: a plan's tools say; questions are
    /// answered by one reply from anyone who may decide the session.
    pub fn quorum(&self) -> Quorum {
        match self {
            Asking::Plan(plan) | Asking::Reconcile(plan) => Quorum::of(plan),
            Asking::Questions(_) => Quorum::default(),
        }
    }

    /// The tasks it asks a decision on, each its own (a plan's; questions
    /// have none).
    pub fn tasks(&self) -> &[plan_check::TaskCheck] {
        match self {
            Asking::Plan(plan) | Asking::Reconcile(plan) => &plan.tasks,
            Asking::Questions(_) => &[],
        }
    }

    /// Checks `reply` against what the pause asks: its kind's own check
    /// (`check_reply` in its file).
    pub fn check(&self, reply: &reply::Reply<'_>) -> Result<reply::Checked, reply::Refused> {
        match self {
            Asking::Plan(plan) => approval::check_reply(plan, reply),
            Asking::Reconcile(task) => reconcile::check_reply(task, reply),
            Asking::Questions(questions) => questions::check_reply(questions, reply),
        }
    }

    /// Who the pause's decision links and mails go to.
    pub fn scope(&self) -> Scope {
        match self {
            Asking::Plan(plan) | Asking::Reconcile(plan) => Scope::of(plan),
            Asking::Questions(_) => Scope {
                risk: RiskLevel::Low,
                groups: Vec::new(),
            },
        }
    }
}

/// Where the faces treat the kinds differently, asked of what the kind
/// offers (`PauseKind::offers`, from its wire type): nothing outside
/// `pause/` compares kinds, and no match here names them.
impl PauseKind {
    /// Whether it asks for a yes (a Confirm button: Slack's buttons, the
    /// inbox's `may_approve`, the approvals metric).
    pub fn asks_a_yes(self) -> bool {
        self.offers().contains(&Action::Confirm)
    }

    /// Whether it asks whether a call a crash cut short runs again (Run
    /// again, Skip and Cancel buttons).
    pub fn asks_run_again(self) -> bool {
        self.offers().contains(&Action::RunAgain)
    }

    /// Whether a reply to it carries answers (an answer form: Answer and
    /// Skip).
    pub fn asks_answers(self) -> bool {
        self.offers().contains(&Action::Answer)
    }
}

/// Who a pause's links go to: its riskiest task and its deciding groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    pub risk: RiskLevel,
    pub groups: Vec<String>,
}

impl Scope {
    /// The scope of a plan's tasks.
    pub fn of(plan: &PlanCheck) -> Scope {
        Scope {
            risk: plan
                .tasks
                .iter()
                .map(|task| task.risk)
                .max()
                .unwrap_or(RiskLevel::Low),
            groups: Quorum::of(plan).groups,
        }
    }
}
