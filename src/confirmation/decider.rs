//! Who decides a pause, as the decision path checks it: the deciding key's
//! label, its groups and the highest risk it may decide, and whether it is
//! the key of the run's own namespace (the requester).

use crate::protocol::RiskLevel;

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
}
