//! Who may decide a pause: the one rule. Every door and every list asks
//! [`may_decide`]: the decide path (a reply, a link, a Slack press), the
//! inbox (what an approver sees, and `may_approve` / `why_not`, which the
//! page's Confirm button follows), and who is sent links and mail. Nothing
//! else compares a risk or a group.
//!
//! The rule, in the order it is checked (the first that fails answers):
//! 1. the requester's own key may always cancel its run (nothing runs);
//! 2. a pause holding a task above the key's `max_risk` is not its to
//!    decide;
//! 3. a pause a group decides (`approvers = "leads"`) is never decided by
//!    the requester's own key, escalated or not (it may only cancel);
//! 4. a key outside a deciding group may not decide it, unless the pause
//!    was escalated to a group the key is in;
//! 5. the requester's own key may not approve where the pause's tools say
//!    so (`approvals` above 1 without `requester_may_approve`).
//!
//! A key's namespaces (`namespaces=`) are the access policy's, checked
//! before this: a pause out of them is not even found.

use crate::protocol::{Action, RiskLevel};

/// The key a reply comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decider {
    /// What records name it by (`label=`, else `key-N`, `approver-N`,
    /// `anonymous`).
    pub label: String,
    pub groups: Vec<String>,
    /// The highest risk of a task it may decide.
    pub max_risk: RiskLevel,
    /// It is the requester's own key (the run's namespace), not an approver.
    pub requester: bool,
}

impl Decider {
    /// A requester's key with no attributes (tests, and servers without
    /// a keys file).
    pub fn requester(label: &str) -> Decider {
        Decider {
            label: label.to_owned(),
            groups: Vec::new(),
            max_risk: RiskLevel::High,
            requester: true,
        }
    }

    /// Whether a task of `risk` is within what the key decides (`max_risk`).
    pub fn decides(&self, risk: RiskLevel) -> bool {
        within(risk, self.max_risk)
    }

    /// Whether the key is a member of `group`.
    pub fn is_member(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }

    /// An approver key (decision links and mail go to approvers).
    pub fn approver(label: &str, groups: &[String], max_risk: Option<RiskLevel>) -> Decider {
        Decider {
            label: label.to_owned(),
            groups: groups.to_vec(),
            max_risk: max_risk.unwrap_or(RiskLevel::High),
            requester: false,
        }
    }
}

/// Whether `risk` is within `max_risk` (what a key, or a grant that key
/// made, may let run).
pub fn within(risk: RiskLevel, max_risk: RiskLevel) -> bool {
    risk <= max_risk
}

/// What a pause asks of whoever decides it.
#[derive(Debug, Clone, Copy)]
pub struct Deciding<'a> {
    /// Its riskiest task's risk, and that task's index when known.
    pub risk: RiskLevel,
    pub riskiest: Option<usize>,
    /// The groups whose members alone decide it (each of them).
    pub groups: &'a [String],
    /// Whether the requester's own key counts towards its approvals.
    pub requester_may_approve: bool,
    /// The group it was escalated to: its members may decide it too.
    pub escalated_to: Option<&'a str>,
}

/// Why a key may not decide a pause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Out of its scope: a task above its `max_risk`, a group it is not in
    /// (403 `forbidden_scope`).
    OutOfScope(String),
    /// The requester's own key where it may not approve (403
    /// `self_approval`).
    SelfApproval(String),
}

impl Refusal {
    /// What the refusal says.
    pub fn text(&self) -> &str {
        match self {
            Refusal::OutOfScope(why) | Refusal::SelfApproval(why) => why,
        }
    }
}

/// Whether `decider` may take `action` on a pause asking `deciding`: the
/// one rule (see the module's docs for its order).
pub fn may_decide(decider: &Decider, deciding: &Deciding, action: Action) -> Result<(), Refusal> {
    if decider.requester && action == Action::Cancel {
        // A run's own key may always stop it: nothing runs.
        return Ok(());
    }
    if !decider.decides(deciding.risk) {
        let what = match deciding.riskiest {
            Some(index) => format!("task {index} is {} risk", deciding.risk.as_str()),
            None => format!("it holds a {} risk task", deciding.risk.as_str()),
        };
        return Err(Refusal::OutOfScope(format!(
            "{what}; this key ({}) decides up to {} risk",
            decider.label,
            decider.max_risk.as_str()
        )));
    }
    let grouped = !deciding.groups.is_empty();
    if grouped && decider.requester {
        return Err(Refusal::SelfApproval(format!(
            "this pause is decided by the group {}; the requester's own key ({}) may not \
             decide it (only cancel), even when its key is in the group it was escalated to",
            deciding.groups.join(" and "),
            decider.label
        )));
    }
    let escalated = deciding
        .escalated_to
        .is_some_and(|group| decider.is_member(group));
    if grouped && !escalated {
        if let Some(group) = deciding.groups.iter().find(|g| !decider.is_member(g)) {
            return Err(Refusal::OutOfScope(format!(
                "this pause is decided by the group {group}; this key ({}) is not in it",
                decider.label
            )));
        }
    }
    if decider.requester && !deciding.requester_may_approve && action == Action::Confirm {
        return Err(Refusal::SelfApproval(format!(
            "the requester's own key ({}) may not approve this pause: it needs approvals from \
             other people",
            decider.label
        )));
    }
    Ok(())
}

/// The group of a pause's escalations (`escalated`: each group with the
/// tasks it was escalated for, none: every task) that admits `decider` to
/// every one of `tasks`, if one does: what [`Deciding::escalated_to`] is
/// for a reply deciding `tasks`.
pub fn admitting<'a>(
    decider: &Decider,
    escalated: impl IntoIterator<Item = (&'a str, &'a [usize])>,
    tasks: &[usize],
) -> Option<&'a str> {
    escalated
        .into_iter()
        .filter(|(group, _)| decider.is_member(group))
        .find(|(_, admits)| admits.is_empty() || tasks.iter().all(|t| admits.contains(t)))
        .map(|(group, _)| group)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deciding<'a>(groups: &'a [String], escalated_to: Option<&'static str>) -> Deciding<'a> {
        Deciding {
            risk: RiskLevel::Medium,
            riskiest: Some(1),
            groups,
            requester_may_approve: false,
            escalated_to,
        }
    }

    #[test]
    fn the_rule_in_its_order() {
        let leads = vec!["leads".to_owned()];
        let oncall = vec!["oncall".to_owned()];
        let mut requester = Decider::requester("ci-bot");
        requester.groups = oncall.clone();
        let lead = Decider::approver("lead-1", &leads, None);
        let paged = Decider::approver("pager", &oncall, None);
        let junior = Decider::approver("junior", &leads, Some(RiskLevel::Low));
        let pause = deciding(&leads, None);
        let escalated = deciding(&leads, Some("oncall"));

        assert_eq!(may_decide(&requester, &escalated, Action::Cancel), Ok(()));
        assert!(matches!(
            may_decide(&junior, &pause, Action::Confirm),
            Err(Refusal::OutOfScope(why)) if why.contains("task 1 is medium risk")
        ));
        assert!(matches!(
            may_decide(&requester, &escalated, Action::Confirm),
            Err(Refusal::SelfApproval(_))
        ));
        assert!(matches!(
            may_decide(&paged, &pause, Action::Confirm),
            Err(Refusal::OutOfScope(why)) if why.contains("leads")
        ));
        assert_eq!(may_decide(&paged, &escalated, Action::Confirm), Ok(()));
        assert_eq!(may_decide(&lead, &pause, Action::Confirm), Ok(()));
        let plain = Decider::requester("ci-bot");
        assert!(matches!(
            may_decide(&plain, &deciding(&[], None), Action::Confirm),
            Err(Refusal::SelfApproval(_))
        ));
        assert_eq!(
            may_decide(&plain, &deciding(&[], None), Action::Modify),
            Ok(())
        );
        assert!(within(RiskLevel::Low, RiskLevel::Medium));
        assert!(within(RiskLevel::Medium, RiskLevel::Medium));
        assert!(!within(RiskLevel::High, RiskLevel::Medium));
        assert!(!junior.decides(RiskLevel::Medium));
    }
}
