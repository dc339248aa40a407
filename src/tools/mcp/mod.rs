//! MCP servers as tool sources (`[[mcp]]` tables in the tools file, see
//! docs/tools.md "MCP servers").
//!
//! At start chatgate spawns each server (stdio, through the call keeper so
//! nothing it starts outlives chatgate), initializes it with rmcp, lists its
//! tools and offers each as a declared tool named `<server>__<tool>`
//! ([`offered_name`]). A call is confirmed like any declared tool's, then
//! runs here ([`McpServer::call`]): one call at a time per server, so a
//! question the server asks mid-call (elicitation) is always about the call
//! in flight, and goes to that call's run ([`client::Asker`]).
//!
//! A server that exits is restarted ([`RESTART_BACKOFF`] doubling to
//! [`MAX_RESTART_BACKOFF`]); meanwhile its calls fail at once and `/readyz`
//! names it. Bounds on what a server can make chatgate hold:
//! [`MAX_MESSAGE_BYTES`] per message, [`MAX_TOOLS`] tools, [`MAX_SCHEMA_BYTES`]
//! per input schema, [`MAX_DESCRIPTION_CHARS`] per description, a result's
//! text capped like a command's output, and one pending question per call.

pub mod client;
pub mod elicit;
mod server;

pub use server::{McpServer, McpTool};

/// The outcome of a call that ran past its `timeout_secs`.
pub fn timed_out(started: std::time::Instant, timeout: Duration) -> crate::tools::ToolOutcome {
    server::failed(
        started,
        format!("timed out after {}", humantime::format_duration(timeout)),
    )
}

/// The outcome of a call its run stopped.
pub fn stopped(started: std::time::Instant) -> crate::tools::ToolOutcome {
    server::failed(started, "stopped: the run was stopped".to_owned())
}

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::command::CommandSpec;
use super::declared::{Executor, Tool, DEFAULT_TIMEOUT, MAX_TIMEOUT};
use crate::protocol::RiskLevel;

/// Most bytes of one message from a server (one line on stdio): a longer
/// one is dropped unread, and the call in flight fails saying so.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
/// Most tools one server may offer (its list is refused past it).
pub const MAX_TOOLS: usize = 128;
/// Most bytes of one tool's input schema, as JSON.
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;
/// Characters of a tool's description kept (the rest is cut).
pub const MAX_DESCRIPTION_CHARS: usize = 4 * 1024;
/// Pages of a tool list read at most.
pub const MAX_LIST_PAGES: usize = 16;
/// How long spawning, initializing and listing a server may take.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
/// First wait before restarting a server that exited.
pub const RESTART_BACKOFF: Duration = Duration::from_secs(1);
/// Longest wait between restarts.
pub const MAX_RESTART_BACKOFF: Duration = Duration::from_secs(60);

/// An `[[mcp]]` table as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpEntry {
    pub name: Option<String>,
    pub command: Option<Vec<String>>,
    pub url: Option<String>,
    #[serde(default)]
    pub headers: std::collections::HashMap<String, String>,
    #[serde(default)]
    pub env: Vec<String>,
    pub cwd: Option<PathBuf>,
    #[serde(default = "yes")]
    pub confirm: bool,
    pub risk: Option<String>,
    pub allow: Option<Vec<String>>,
    pub deny: Option<Vec<String>>,
    pub timeout_secs: Option<f64>,
}

fn yes() -> bool {
    true
}

/// An `[[mcp]]` entry, checked (see [`McpEntry::check`]).
#[derive(Debug, Clone)]
pub struct McpSpec {
    pub name: String,
    argv: Vec<String>,
    env: Vec<String>,
    cwd: Option<PathBuf>,
    confirm: bool,
    risk: RiskLevel,
    allow: Option<Vec<String>>,
    deny: Vec<String>,
    timeout: Duration,
}

impl McpEntry {
    /// Checks the entry; the error names the key.
    pub fn check(self) -> Result<McpSpec, String> {
        let name = self.name.ok_or("key `name` is missing")?;
        let valid = !name.is_empty()
            && name.len() <= 32
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            return Err(format!(
                "key `name`: `{name}` must be 1-32 characters of A-Z a-z 0-9 _ -"
            ));
        }
        let argv = match (self.command, self.url) {
            (Some(_), Some(_)) => {
                return Err("keys `command` and `url`: a server has exactly one".to_owned())
            }
            (None, None) => {
                return Err(
                    "key `command` (stdio) or `url` (streamable HTTP) is missing".to_owned(),
                )
            }
            (None, Some(_)) => {
                return Err(
                    "key `url`: streamable HTTP servers are not supported yet; run the server \
                     over stdio (`command`)"
                        .to_owned(),
                )
            }
            (Some(argv), None) => argv,
        };
        if !self.headers.is_empty() {
            return Err("key `headers`: only for `url` servers".to_owned());
        }
        // The same checks as a command tool's: the program, `cwd`, `env`.
        let spec = CommandSpec::new(argv, self.cwd, self.env)?;
        let risk = match self.risk.as_deref() {
            None | Some("medium") => RiskLevel::Medium,
            Some("low") => RiskLevel::Low,
            Some("high") => RiskLevel::High,
            Some(other) => return Err(format!("key `risk`: `{other}` is not low, medium or high")),
        };
        if self.allow.is_some() && self.deny.is_some() {
            return Err("keys `allow` and `deny`: use one of them".to_owned());
        }
        let timeout = match self.timeout_secs {
            None => DEFAULT_TIMEOUT,
            Some(secs) if secs > 0.0 && secs <= MAX_TIMEOUT.as_secs_f64() => {
                Duration::from_secs_f64(secs)
            }
            Some(secs) => {
                return Err(format!(
                    "key `timeout_secs`: {secs} is not from 0 to {} seconds",
                    MAX_TIMEOUT.as_secs()
                ))
            }
        };
        Ok(McpSpec {
            name,
            argv: spec.argv,
            env: spec.env,
            cwd: spec.cwd,
            confirm: self.confirm,
            risk,
            allow: self.allow,
            deny: self.deny.unwrap_or_default(),
            timeout,
        })
    }
}

impl McpSpec {
    /// Starts the server and makes its tools (those `allow`/`deny` let
    /// through) declared tools. The error is one line.
    pub async fn start(&self) -> Result<(Arc<McpServer>, Vec<Tool>), String> {
        let (server, listed) = McpServer::start(
            self.name.clone(),
            self.argv.clone(),
            self.env.clone(),
            self.cwd.clone(),
        )
        .await?;
        if let Some(allow) = &self.allow {
            if let Some(missing) = allow.iter().find(|a| !listed.iter().any(|t| &t.name == *a)) {
                return Err(format!("key `allow`: the server has no tool `{missing}`"));
            }
        }
        let mut tools = Vec::new();
        for listed in listed {
            let allowed = match &self.allow {
                Some(allow) => allow.contains(&listed.name),
                None => !self.deny.contains(&listed.name),
            };
            if !allowed {
                continue;
            }
            let name = offered_name(&self.name, &listed.name);
            let executor = Executor::Mcp(McpTool {
                server: server.clone(),
                tool: listed.name.clone(),
            });
            let tool = Tool::new(
                name,
                listed.description,
                listed.risk.unwrap_or(self.risk),
                self.confirm,
                listed.input_schema,
                self.timeout,
                executor,
            )
            .map_err(|err| format!("tool `{}`: {err}", listed.name))?;
            tools.push(tool);
        }
        Ok((server, tools))
    }
}

/// The name a server's tool is offered under: `<server>__<tool>`, every
/// character outside `[A-Za-z0-9_-]` as `_`, at most 64 characters.
pub fn offered_name(server: &str, tool: &str) -> String {
    format!("{server}__{tool}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offered_names_are_safe_and_short() {
        assert_eq!(offered_name("fs", "read_text_file"), "fs__read_text_file");
        assert_eq!(offered_name("fs", "a.b/c d"), "fs__a_b_c_d");
        assert_eq!(offered_name("s", &"x".repeat(100)).len(), 64);
    }
}
