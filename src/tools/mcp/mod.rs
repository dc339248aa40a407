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

pub mod call;
pub mod client;
pub mod elicit;
#[cfg(feature = "openai")]
mod http;
mod server;

pub use server::{
    stopped, timed_out, Listed, McpServer, McpTool, Reach, MAX_DESCRIPTION_CHARS, MAX_LIST_PAGES,
    MAX_MESSAGE_BYTES, MAX_RESTART_BACKOFF, MAX_SCHEMA_BYTES, MAX_TOOLS, RESTART_BACKOFF,
    START_TIMEOUT,
};

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::protocol::RiskLevel;
use crate::tools::command::CommandSpec;

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
    /// A tool's preview: another tool of this server, called with the
    /// same arguments (`{ write_file = "read_text_file" }`).
    #[serde(default)]
    pub preview_tool: std::collections::BTreeMap<String, String>,
    pub preview_timeout: Option<String>,
    /// Every previewed tool's preview runs again before its call.
    #[serde(default)]
    pub recheck: bool,
    /// Its tools may be called again with the same idempotency key after a
    /// crash cut a call short (#44): the server dedupes by the key.
    #[serde(default)]
    pub idempotent: bool,
}

fn yes() -> bool {
    true
}

/// An `[[mcp]]` entry, checked (see [`McpEntry::check`]).
#[derive(Debug, Clone)]
pub struct McpSpec {
    pub name: String,
    reach: Reach,
    /// `confirm`: whether its tools' calls are confirmed.
    pub confirm: bool,
    /// The risk of its tools whose annotations do not say.
    pub risk: RiskLevel,
    allow: Option<Vec<String>>,
    deny: Vec<String>,
    /// Per call (`timeout_secs`).
    pub timeout: Duration,
    /// Tool to its preview tool (`preview_tool`), the previews' time limit
    /// and `recheck`.
    pub preview_tool: std::collections::BTreeMap<String, String>,
    pub preview_timeout: Duration,
    pub recheck: bool,
    /// `idempotent`: every tool of it.
    pub idempotent: bool,
}

impl McpEntry {
    /// Checks the entry (its `timeout_secs` already read as `timeout`); the
    /// error names the key.
    pub fn check(self, timeout: Duration) -> Result<McpSpec, String> {
        let name = self.name.ok_or("key `name` is missing")?;
        if !crate::protocol::is_plain_name(&name, 32) {
            return Err(format!(
                "key `name`: `{name}` must be 1-32 characters of A-Z a-z 0-9 _ -"
            ));
        }
        let reach = match (self.command, self.url) {
            (Some(_), Some(_)) => {
                return Err("keys `command` and `url`: a server has exactly one".to_owned())
            }
            (None, None) => {
                return Err(
                    "key `command` (stdio) or `url` (streamable HTTP) is missing".to_owned(),
                )
            }
            (None, Some(url)) => {
                if self.cwd.is_some() || !self.env.is_empty() {
                    return Err("keys `cwd` and `env`: only for `command` servers".to_owned());
                }
                http_reach(url, self.headers)?
            }
            (Some(argv), None) => {
                if !self.headers.is_empty() {
                    return Err("key `headers`: only for `url` servers".to_owned());
                }
                // The same checks as a command tool's: the program, `cwd`, `env`.
                let spec = CommandSpec::new(argv, self.cwd, self.env)?;
                Reach::Stdio {
                    argv: spec.argv,
                    env: spec.env,
                    cwd: spec.cwd,
                }
            }
        };
        let risk = match self.risk.as_deref() {
            None | Some("medium") => RiskLevel::Medium,
            Some("low") => RiskLevel::Low,
            Some("high") => RiskLevel::High,
            Some(other) => return Err(format!("key `risk`: `{other}` is not low, medium or high")),
        };
        if self.allow.is_some() && self.deny.is_some() {
            return Err("keys `allow` and `deny`: use one of them".to_owned());
        }
        let preview_timeout =
            crate::tools::gate::preview_timeout_of(self.preview_timeout.as_deref())?;
        if self.recheck && self.preview_tool.is_empty() {
            return Err("key `recheck`: needs a preview to run again (`preview_tool`)".to_owned());
        }
        Ok(McpSpec {
            name,
            reach,
            confirm: self.confirm,
            risk,
            allow: self.allow,
            deny: self.deny.unwrap_or_default(),
            timeout,
            preview_tool: self.preview_tool,
            preview_timeout,
            recheck: self.recheck,
            idempotent: self.idempotent,
        })
    }
}

impl McpSpec {
    /// Starts the server; its tools that `allow` / `deny` let through. The
    /// error is one line.
    pub async fn start(&self) -> Result<(Arc<McpServer>, Vec<Listed>), String> {
        let (server, listed) = McpServer::start(self.name.clone(), self.reach.clone()).await?;
        if let Some(allow) = &self.allow {
            if let Some(missing) = allow.iter().find(|a| !listed.iter().any(|t| &t.name == *a)) {
                return Err(format!("key `allow`: the server has no tool `{missing}`"));
            }
        }
        let offered = listed
            .into_iter()
            .filter(|tool| match &self.allow {
                Some(allow) => allow.contains(&tool.name),
                None => !self.deny.contains(&tool.name),
            })
            .collect::<Vec<Listed>>();
        for (tool, preview) in &self.preview_tool {
            for name in [tool, preview] {
                if !offered.iter().any(|t| &t.name == name) {
                    return Err(format!(
                        "key `preview_tool`: the server offers no tool `{name}`"
                    ));
                }
            }
        }
        Ok((server, offered))
    }
}

/// A `url` server: an http(s) URL, its headers resolved (`${NAME}` from the
/// environment, as for http tools).
#[cfg(feature = "openai")]
fn http_reach(
    url: String,
    headers: std::collections::HashMap<String, String>,
) -> Result<Reach, String> {
    crate::tools::http::checked_url("url", &url)?;
    Ok(Reach::Http {
        url,
        headers: crate::tools::http::resolved_headers(headers)?,
    })
}

#[cfg(not(feature = "openai"))]
fn http_reach(
    _url: String,
    _headers: std::collections::HashMap<String, String>,
) -> Result<Reach, String> {
    Err(
        "key `url`: this chatgate was built without the `openai` feature, which HTTP MCP servers need"
            .to_owned(),
    )
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
