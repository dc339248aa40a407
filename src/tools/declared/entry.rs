//! One `[[tool]]` table as written ([`ToolEntry`]), and its checks
//! ([`build`]): every mistake names the key.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::protocol::{is_plain_name, RiskLevel};
use crate::tools::command;
use crate::tools::gate::preview_timeout_of;
use crate::tools::gate::GateKeys;
#[cfg(feature = "openai")]
use crate::tools::http;
use crate::tools::tool::{Executor, Preview, Tool, DEFAULT_TIMEOUT, MAX_TIMEOUT};

/// A tool as written in the file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ToolEntry {
    name: Option<String>,
    description: Option<String>,
    parameters: Option<toml::Value>,
    risk: Option<String>,
    #[serde(default = "yes")]
    confirm: bool,
    #[serde(default)]
    grantable: bool,
    approvers: Option<String>,
    approvals: Option<i64>,
    requester_may_approve: Option<bool>,
    timeout: Option<String>,
    on_timeout: Option<String>,
    remind_after: Option<String>,
    escalate_after: Option<String>,
    escalate_to: Option<String>,
    escalate_extends: Option<String>,
    command: Option<Vec<String>>,
    http: Option<String>,
    timeout_secs: Option<f64>,
    cwd: Option<PathBuf>,
    #[serde(default)]
    env: Vec<String>,
    #[serde(default)]
    headers: HashMap<String, String>,
    preview: Option<Vec<String>>,
    preview_http: Option<String>,
    preview_timeout: Option<String>,
    #[serde(default)]
    recheck: bool,
    #[serde(default)]
    idempotent: bool,
    reconcile: Option<Vec<String>>,
}

fn yes() -> bool {
    true
}

/// Checks one entry and builds its tool; the error names the key.
pub(super) fn build(entry: ToolEntry) -> Result<Tool, String> {
    let name = entry.name.ok_or("key `name` is missing")?;
    if !is_plain_name(&name, 64) {
        return Err(format!(
            "key `name`: `{name}` must be 1-64 characters of A-Z a-z 0-9 _ -"
        ));
    }
    let description = entry.description.ok_or("key `description` is missing")?;
    let risk = match entry.risk.as_deref() {
        Some("low") => RiskLevel::Low,
        Some("medium") => RiskLevel::Medium,
        Some("high") => RiskLevel::High,
        Some(other) => return Err(format!("key `risk`: `{other}` is not low, medium or high")),
        None => return Err("key `risk` is missing (low, medium or high)".to_owned()),
    };
    let parameters = entry
        .parameters
        .ok_or("key `parameters` is missing (a JSON Schema object)")?;
    let parameters = serde_json::to_value(parameters)
        .map_err(|err| format!("key `parameters`: not a JSON value: {err}"))?;
    let timeout = timeout_of(entry.timeout_secs)?;
    let preview_timeout = preview_timeout_of(entry.preview_timeout.as_deref())?;
    let preview = match (entry.preview, entry.preview_http, &entry.command) {
        (Some(_), Some(_), _) => {
            return Err(
                "keys `preview` and `preview_http`: a tool has at most one preview".to_owned(),
            )
        }
        (Some(argv), None, Some(_)) => Some(Preview {
            executor: Executor::Command(
                command::CommandSpec::new(argv, entry.cwd.clone(), entry.env.clone())
                    .map_err(|err| err.replace("key `command`", "key `preview`"))?,
            ),
            timeout: preview_timeout,
        }),
        (Some(_), None, None) => {
            return Err(
                "key `preview`: only for `command` tools (an http tool's is `preview_http`)"
                    .to_owned(),
            )
        }
        (None, Some(url), None) if entry.http.is_some() => Some(Preview {
            executor: http_executor(url, entry.headers.clone())
                .map_err(|err| err.replace("key `http`", "key `preview_http`"))?,
            timeout: preview_timeout,
        }),
        (None, Some(_), _) => {
            return Err(
                "key `preview_http`: only for `http` tools (a command tool's is `preview`)"
                    .to_owned(),
            )
        }
        (None, None, _) => None,
    };
    if preview.is_none() && entry.recheck {
        return Err(
            "key `recheck`: needs a preview to run again (`preview`, `preview_http`)".to_owned(),
        );
    }
    // Run like the tool's own command (its `cwd` and `env`), or with none.
    let reconcile = entry
        .reconcile
        .map(|argv| command::CommandSpec::new(argv, entry.cwd.clone(), entry.env.clone()))
        .transpose()
        .map_err(|err| err.replace("key `command`", "key `reconcile`"))?;
    let executor = match (entry.command, entry.http) {
        (Some(_), Some(_)) => {
            return Err("keys `command` and `http`: a tool has exactly one executor".to_owned())
        }
        (None, None) => {
            return Err("key `command` or `http` is missing: a tool needs an executor".to_owned())
        }
        (Some(argv), None) => {
            if !entry.headers.is_empty() {
                return Err("key `headers`: only for `http` tools".to_owned());
            }
            Executor::Command(command::CommandSpec::new(argv, entry.cwd, entry.env)?)
        }
        (None, Some(url)) => {
            if entry.cwd.is_some() || !entry.env.is_empty() {
                return Err("keys `cwd` and `env`: only for `command` tools".to_owned());
            }
            http_executor(url, entry.headers)?
        }
    };
    let mut tool = Tool::new(
        name,
        description,
        risk,
        entry.confirm,
        parameters,
        timeout,
        executor,
    )
    .map_err(|err| format!("key `parameters`: {err}"))?;
    tool.grantable = entry.grantable || risk != RiskLevel::High;
    tool.preview = preview;
    tool.recheck = entry.recheck;
    tool.idempotent = entry.idempotent;
    tool.reconcile = reconcile;
    tool.gate = GateKeys {
        approvers: entry.approvers,
        approvals: entry.approvals,
        requester_may_approve: entry.requester_may_approve,
        timeout: entry.timeout,
        on_timeout: entry.on_timeout,
        remind_after: entry.remind_after,
        escalate_after: entry.escalate_after,
        escalate_to: entry.escalate_to,
        escalate_extends: entry.escalate_extends,
    }
    .build()?;
    // What more than one person or a named group decides, no grant covers.
    if tool.gate.needs_people() {
        tool.grantable = false;
    }
    Ok(tool)
}

#[cfg(feature = "openai")]
fn http_executor(url: String, headers: HashMap<String, String>) -> Result<Executor, String> {
    Ok(Executor::Http(http::HttpSpec::new(url, headers)?))
}

#[cfg(not(feature = "openai"))]
fn http_executor(_url: String, _headers: HashMap<String, String>) -> Result<Executor, String> {
    Err(
        "key `http`: this chatgate was built without the `openai` feature, which http tools need"
            .to_owned(),
    )
}

/// A `timeout_secs` (none: [`DEFAULT_TIMEOUT`]); the error names the key.
pub(super) fn timeout_of(secs: Option<f64>) -> Result<Duration, String> {
    match secs {
        None => Ok(DEFAULT_TIMEOUT),
        Some(secs) if secs > 0.0 && secs <= MAX_TIMEOUT.as_secs_f64() => {
            Ok(Duration::from_secs_f64(secs))
        }
        Some(secs) => Err(format!(
            "key `timeout_secs`: {secs} is not from 0 to {} seconds",
            MAX_TIMEOUT.as_secs()
        )),
    }
}
