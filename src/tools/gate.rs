//! Who decides a pause holding a call, and what happens while nobody
//! answers it: a tool's keys (`approvers`, `approvals`,
//! `requester_may_approve`, `timeout`, `on_timeout`, `remind_after`,
//! `escalate_after` with `escalate_to`, `escalate_extends`), which an `ask`
//! rule may write too. A call an `ask` rule matches takes the stricter of
//! both ([`Gate::and`]): the most approvals, every group named, the
//! shortest timeout and timers; the rule's `on_timeout` where it gives one.

use std::time::Duration;

use serde::Deserialize;

use crate::protocol::is_plain_name;

/// The keys a `[[tool]]` and an `ask` `[[rule]]` share.
pub const GATE_KEYS: [&str; 9] = [
    "approvers",
    "approvals",
    "requester_may_approve",
    "timeout",
    "on_timeout",
    "remind_after",
    "escalate_after",
    "escalate_to",
    "escalate_extends",
];

/// Most approvals a pause may need.
pub const MAX_APPROVALS: u8 = 5;

/// The gate's keys as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateKeys {
    pub approvers: Option<String>,
    pub approvals: Option<i64>,
    pub requester_may_approve: Option<bool>,
    pub timeout: Option<String>,
    pub on_timeout: Option<String>,
    pub remind_after: Option<String>,
    pub escalate_after: Option<String>,
    pub escalate_to: Option<String>,
    pub escalate_extends: Option<String>,
}

/// What a pause does when nobody answers in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnTimeout {
    /// The run ends (`cancelled`, reason timeout).
    Cancel,
    /// The waiting tasks are rejected and the run goes on.
    Reject,
}

/// An escalation: after `after`, the members of `to` may decide too; the
/// expiry moves by `extends` if given (never otherwise).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Escalation {
    pub after: Duration,
    pub to: String,
    pub extends: Option<Duration>,
}

/// Who decides, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gate {
    /// Groups whose members alone decide (each of them).
    pub approvers: Vec<String>,
    /// Confirms from distinct labels needed (1-5).
    pub approvals: u8,
    /// Whether the requester's own key counts (default: only when one is
    /// enough).
    pub requester_may_approve: Option<bool>,
    /// How long its task waits for a decision (else `--confirm-timeout`;
    /// see `run/context/expiry.rs`).
    pub timeout: Option<Duration>,
    pub on_timeout: Option<OnTimeout>,
    /// An `interaction.reminder` event once a pause waited this long.
    pub remind_after: Option<Duration>,
    pub escalate: Option<Escalation>,
}

impl Default for Gate {
    fn default() -> Gate {
        Gate {
            approvers: Vec::new(),
            approvals: 1,
            requester_may_approve: None,
            timeout: None,
            on_timeout: None,
            remind_after: None,
            escalate: None,
        }
    }
}

impl Gate {
    /// Whether the requester's own key counts towards the approvals.
    pub fn requester_may_approve(&self) -> bool {
        self.requester_may_approve.unwrap_or(self.approvals <= 1)
    }

    /// Whether more than one person, or a named group, decides (no grant
    /// covers such a call, no `allow` rule may run it).
    pub fn needs_people(&self) -> bool {
        self.approvals > 1 || !self.approvers.is_empty()
    }

    /// Whether the people this gate asks for are enough for `other`: as
    /// many approvals, every one of its groups, and the requester kept out
    /// where `other` keeps it out. An edited call whose gate this is not
    /// goes to a new round (its people were not asked).
    pub fn covers(&self, other: &Gate) -> bool {
        other.approvals <= self.approvals
            && other.approvers.iter().all(|g| self.approvers.contains(g))
            && (other.requester_may_approve() || !self.requester_may_approve())
    }

    /// Who it asks, in words: `2 approvals of leads, not the requester`.
    pub fn describe(&self) -> String {
        let mut text = match self.approvals {
            1 => "1 approval".to_owned(),
            n => format!("{n} approvals"),
        };
        if !self.approvers.is_empty() {
            text.push_str(&format!(" of {}", self.approvers.join(" and ")));
        }
        if !self.requester_may_approve() {
            text.push_str(", not the requester");
        }
        text
    }

    pub fn rejects_on_timeout(&self) -> bool {
        self.on_timeout == Some(OnTimeout::Reject)
    }

    /// This gate (a tool's) with an `ask` rule's `rule` on top: the
    /// stricter of each, the rule's `on_timeout` where it gives one.
    pub fn and(&self, rule: &Gate) -> Gate {
        let mut approvers = self.approvers.clone();
        for group in &rule.approvers {
            if !approvers.contains(group) {
                approvers.push(group.clone());
            }
        }
        let shorter = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let escalate = match (&self.escalate, &rule.escalate) {
            (Some(mine), Some(theirs)) if mine.after < theirs.after => Some(mine.clone()),
            (mine, theirs) => theirs.clone().or_else(|| mine.clone()),
        };
        Gate {
            approvers,
            approvals: self.approvals.max(rule.approvals),
            // Only if both allow it: a side that leaves it unset says what
            // its own approvals imply (a tool of two approvals keeps the
            // requester out, whatever a rule says).
            requester_may_approve: match (self.requester_may_approve, rule.requester_may_approve) {
                (None, None) => None,
                _ => Some(self.requester_may_approve() && rule.requester_may_approve()),
            },
            timeout: shorter(self.timeout, rule.timeout),
            on_timeout: rule.on_timeout.or(self.on_timeout),
            remind_after: shorter(self.remind_after, rule.remind_after),
            escalate,
        }
    }
}

impl GateKeys {
    /// Checks the keys; the error names the key.
    pub fn build(self) -> Result<Gate, String> {
        let mut gate = Gate::default();
        if let Some(group) = self.approvers {
            if !is_plain_name(&group, 32) {
                return Err(format!(
                    "key `approvers`: `{group}` must be a group name of 1-32 characters of A-Z \
                     a-z 0-9 _ -"
                ));
            }
            gate.approvers.push(group);
        }
        gate.approvals = match self.approvals {
            None => 1,
            Some(n) if (1..=i64::from(MAX_APPROVALS)).contains(&n) => n as u8,
            Some(n) => {
                return Err(format!(
                    "key `approvals`: {n} is not from 1 to {MAX_APPROVALS}"
                ))
            }
        };
        gate.requester_may_approve = self.requester_may_approve;
        gate.timeout = self.timeout.map(|t| duration("timeout", t)).transpose()?;
        gate.remind_after = self
            .remind_after
            .map(|t| duration("remind_after", t))
            .transpose()?;
        let extends = self
            .escalate_extends
            .map(|t| duration("escalate_extends", t))
            .transpose()?;
        gate.escalate = match (self.escalate_after, self.escalate_to) {
            (None, None) if extends.is_some() => {
                return Err(
                    "key `escalate_extends`: only with `escalate_after` and `escalate_to`"
                        .to_owned(),
                )
            }
            (None, None) => None,
            (Some(after), Some(to)) => {
                if !is_plain_name(&to, 32) {
                    return Err(format!("key `escalate_to`: `{to}` is not a group name"));
                }
                Some(Escalation {
                    after: duration("escalate_after", after)?,
                    to,
                    extends,
                })
            }
            _ => {
                return Err(
                    "keys `escalate_after` and `escalate_to` go together (when, and to whom)"
                        .to_owned(),
                )
            }
        };
        gate.on_timeout = match self.on_timeout.as_deref() {
            None => None,
            Some("cancel") => Some(OnTimeout::Cancel),
            Some("reject") => Some(OnTimeout::Reject),
            Some(other) => {
                return Err(format!(
                    "key `on_timeout`: `{other}` is not cancel or reject"
                ))
            }
        };
        Ok(gate)
    }

    /// The gate keys of a rule's table (others are the rule's own).
    pub fn of_table(table: &toml::Table) -> Result<GateKeys, String> {
        let keys: toml::Table = table
            .iter()
            .filter(|(key, _)| GATE_KEYS.contains(&key.as_str()))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        if keys.is_empty() {
            return Ok(GateKeys::default());
        }
        let read = |table: toml::Table| toml::Value::Table(table).try_into::<GateKeys>();
        read(keys.clone()).map_err(|err| {
            // Which key: the first that does not read on its own.
            keys.iter()
                .find_map(|(key, value)| {
                    let alone = toml::Table::from_iter([(key.clone(), value.clone())]);
                    read(alone)
                        .err()
                        .map(|err| format!("key `{key}`: {}", err.message()))
                })
                .unwrap_or_else(|| err.message().to_owned())
        })
    }
}

/// Default of a tool's `preview_timeout`.
pub const DEFAULT_PREVIEW_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a `preview_timeout` may be.
pub const MAX_PREVIEW_TIMEOUT: Duration = Duration::from_secs(600);

/// A `preview_timeout` (none: 10s): from 100ms to
/// 10 minutes; the error names the key.
pub fn preview_timeout_of(text: Option<&str>) -> Result<Duration, String> {
    let Some(text) = text else {
        return Ok(DEFAULT_PREVIEW_TIMEOUT);
    };
    humantime::parse_duration(text.trim())
        .ok()
        .filter(|t| *t >= Duration::from_millis(100) && *t <= MAX_PREVIEW_TIMEOUT)
        .ok_or_else(|| {
            format!(
                "key `preview_timeout`: `{text}` is not a duration from 100ms to {}s (such as 10s)",
                MAX_PREVIEW_TIMEOUT.as_secs()
            )
        })
}

/// A duration from 1s to 30 days; the error names the key.
fn duration(key: &str, text: String) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .ok()
        .filter(|t| *t >= Duration::from_secs(1) && *t <= Duration::from_secs(30 * 86_400))
        .ok_or_else(|| {
            format!("key `{key}`: `{text}` is not a duration from 1s to 30 days (such as 10m)")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(keys: &str) -> Result<Gate, String> {
        let table: toml::Table = toml::from_str(keys).unwrap();
        GateKeys::of_table(&table)?.build()
    }

    #[test]
    fn a_rule_makes_a_tool_stricter_never_looser() {
        let tool = gate("approvals = 2\napprovers = \"leads\"\ntimeout = \"1h\"").unwrap();
        let rule = gate("approvals = 1\napprovers = \"oncall\"\ntimeout = \"10m\"").unwrap();
        let both = tool.and(&rule);
        assert_eq!(both.approvals, 2);
        assert_eq!(both.approvers, ["leads", "oncall"]);
        assert_eq!(both.timeout, Some(Duration::from_secs(600)));
        assert!(!both.requester_may_approve());
        let looser = gate("requester_may_approve = true").unwrap();
        let strict = gate("requester_may_approve = false").unwrap();
        assert_eq!(looser.and(&strict).requester_may_approve, Some(false));
    }

    #[test]
    fn the_rules_on_timeout_wins_and_the_earlier_escalation() {
        let tool =
            gate("on_timeout = \"reject\"\nescalate_after = \"15m\"\nescalate_to = \"a\"").unwrap();
        let rule = gate("on_timeout = \"cancel\"\nescalate_after = \"5m\"\nescalate_to = \"b\"\nescalate_extends = \"15m\"").unwrap();
        let both = tool.and(&rule);
        assert!(!both.rejects_on_timeout());
        let escalation = both.escalate.unwrap();
        assert_eq!(escalation.to, "b");
        assert_eq!(escalation.extends, Some(Duration::from_secs(900)));
        assert!(tool.and(&Gate::default()).rejects_on_timeout());
    }

    #[test]
    fn mistakes_name_their_key() {
        let err = |keys: &str| gate(keys).unwrap_err();
        assert!(err("approvals = 6").contains("`approvals`"));
        assert!(err("approvers = \"a b\"").contains("`approvers`"));
        assert!(err("timeout = \"soon\"").contains("`timeout`"));
        assert!(err("on_timeout = \"approve\"").contains("`on_timeout`"));
        assert!(err("escalate_after = \"5m\"").contains("go together"));
        assert!(err("escalate_extends = \"5m\"").contains("`escalate_extends`"));
        assert!(err("approvals = \"2\"").starts_with("key `approvals`: invalid type"));
    }
}
