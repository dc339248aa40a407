//! A confirm's `grant` ("allow this for a while"), checked against the
//! pause it approves before the pause is decided: a refused grant refuses
//! the reply (422 `invalid_grant`) and leaves the pause as it was.

use std::time::Duration;

use serde_json::{Map, Value};

use crate::pause::plan_check::PlanCheck;
use crate::protocol::{Decisions, Verdict};
use crate::store::GrantScope;
use crate::tools::rules::matchers_of_json;

pub use super::plan_check::MAX_GRANT_TTL;
/// Longest `--max-grant-ttl`.
pub const MAX_GRANT_TTL_LIMIT: Duration = Duration::from_secs(7 * 24 * 3600);
/// Most calls one grant may allow; the default of a grant that names none
/// is [`DEFAULT_GRANT_CALLS`].
pub const MAX_GRANT_CALLS: u32 = 1_000;
pub const DEFAULT_GRANT_CALLS: u32 = 100;

/// A grant as checked: what the run then keeps.
#[derive(Debug, Clone, PartialEq)]
pub struct GrantSpec {
    pub scope: GrantScope,
    pub tools: Vec<String>,
    /// Each tool's parameters' hash, in the order of `tools`.
    pub schemas: Vec<String>,
    pub args: Map<String, Value>,
    pub ttl: Duration,
    pub max_calls: u32,
    /// The deciding key's label, and the highest risk it may decide (the
    /// grant covers no call above it).
    pub granted_by: String,
    pub max_risk: crate::protocol::RiskLevel,
}

/// Checks `raw` (a reply's `grant`) against the pause's tasks and their
/// verdicts: `scope` `session` or `key`; `tools` names (no globs) of
/// tools of tasks in the pause, each approved (or edited) in it, none of
/// high risk unless its table says `grantable = true`; `args` rule
/// matchers; `ttl` 1 s to `max_ttl` (a duration such as `30m`, or
/// seconds); `max_calls` 1 to 1,000. The error says what is wrong.
pub fn check_grant(
    raw: &Value,
    verdicts: &Decisions,
    plan: &PlanCheck,
    decider: &crate::decider::Decider,
) -> Result<GrantSpec, String> {
    let granted_by = decider.label.as_str();
    let Value::Object(fields) = raw else {
        return Err("grant: an object with scope, tools, args, ttl, max_calls".to_owned());
    };
    const KEYS: [&str; 5] = ["scope", "tools", "args", "ttl", "max_calls"];
    if let Some(unknown) = fields.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(format!(
            "grant: `{unknown}` is unknown (a grant has {})",
            KEYS.join(", ")
        ));
    }
    let scope = match fields.get("scope").and_then(Value::as_str) {
        Some("session") => GrantScope::Session,
        Some("key") => GrantScope::Key,
        _ => return Err("grant: `scope` is `session` or `key`".to_owned()),
    };
    let names: Vec<&str> = match fields.get("tools").and_then(Value::as_array) {
        Some(list) if !list.is_empty() && list.len() <= 16 => list
            .iter()
            .map(|name| name.as_str().ok_or("grant: `tools` are names"))
            .collect::<Result<_, _>>()?,
        _ => return Err("grant: `tools` is a list of 1-16 tool names".to_owned()),
    };
    let mut tools = Vec::with_capacity(names.len());
    let mut schemas = Vec::with_capacity(names.len());
    for name in names {
        if tools.iter().any(|t| t == name) {
            continue;
        }
        let in_pause: Vec<_> = plan
            .tasks
            .iter()
            .filter(|task| task.tool.as_ref().is_some_and(|tool| tool.name == name))
            .collect();
        let Some(tool) = in_pause.first().and_then(|task| task.tool.clone()) else {
            return Err(format!(
                "grant: `{name}` is not a tool of a task in this pause (no globs)"
            ));
        };
        let approved = in_pause.iter().all(|task| {
            matches!(
                verdicts.verdict(task.index),
                Verdict::Approve | Verdict::Edit { .. }
            )
        });
        if !approved {
            return Err(format!(
                "grant: `{name}` is not approved in this pause (a grant allows only what is \
                 approved)"
            ));
        }
        if in_pause.iter().any(|task| task.gate.needs_people()) {
            return Err(format!(
                "grant: `{name}` is decided here by more than one person or a named group; no \
                 grant covers it"
            ));
        }
        // A grant lets later calls run without a person: never a tool of a
        // risk above what the granting key may decide itself.
        if !decider.decides(tool.risk) {
            return Err(format!(
                "grant: `{name}` is {} risk; this key ({}) decides up to {} risk, so it may \
                 not let its calls run without asking",
                tool.risk.as_str(),
                decider.label,
                decider.max_risk.as_str()
            ));
        }
        if !tool.grantable {
            return Err(format!(
                "grant: `{name}` is a high risk tool that is not grantable (its table says \
                 `grantable = true` to allow it)"
            ));
        }
        tools.push(name.to_owned());
        schemas.push(tool.schema_hash.clone());
    }
    let args = match fields.get("args") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(args)) => args.clone(),
        Some(_) => return Err("grant: `args` is an object of matchers".to_owned()),
    };
    matchers_of_json(&args).map_err(|why| format!("grant: {why}"))?;
    let ttl = match fields.get("ttl") {
        None | Some(Value::Null) => plan.max_grant_ttl,
        Some(Value::String(text)) => humantime::parse_duration(text.trim())
            .map_err(|_| format!("grant: `ttl` `{text}` is not a duration (such as 30m)"))?,
        Some(Value::Number(secs)) => secs
            .as_u64()
            .map(Duration::from_secs)
            .ok_or("grant: `ttl` in seconds is a whole number")?,
        Some(_) => return Err("grant: `ttl` is a duration such as 30m".to_owned()),
    };
    if ttl < Duration::from_secs(1) || ttl > plan.max_grant_ttl {
        return Err(format!(
            "grant: `ttl` is from 1s to {} (--max-grant-ttl)",
            humantime::format_duration(plan.max_grant_ttl)
        ));
    }
    let max_calls = match fields.get("max_calls") {
        None | Some(Value::Null) => DEFAULT_GRANT_CALLS,
        Some(value) => value
            .as_u64()
            .filter(|n| (1..=u64::from(MAX_GRANT_CALLS)).contains(n))
            .map(|n| n as u32)
            .ok_or("grant: `max_calls` is from 1 to 1000")?,
    };
    Ok(GrantSpec {
        scope,
        tools,
        schemas,
        args,
        ttl,
        max_calls,
        granted_by: granted_by.to_owned(),
        max_risk: decider.max_risk,
    })
}
