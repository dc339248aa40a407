//! The tools file (`--tools`): one `[[tool]]` table per tool (each a
//! [`Tool`], checked by `entry`), its `[[mcp]]` servers and its `[[rule]]`
//! tables, checked at start ([`Tools::load`], [`Tools::start_mcp`]).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use self::entry::{build, timeout_of, ToolEntry};
use super::mcp::{offered_name, McpEntry, McpServer, McpSpec, McpTool};
use super::rules::Rules;
use super::tool::{Executor, Tool};

/// The tools of `--tools`, by name. Cheap to share behind an `Arc`.
#[derive(Debug, Default)]
pub struct Tools {
    by_name: HashMap<String, Arc<Tool>>,
    /// In file order, for offering them to a model.
    order: Vec<String>,
    /// The file, for errors of [`Tools::start_mcp`].
    file: String,
    /// `[[mcp]]` entries checked, not started yet.
    mcp: Vec<McpSpec>,
    /// The MCP servers started.
    servers: Vec<Arc<McpServer>>,
    /// The `[[rule]]` tables, in file order.
    rules: Rules,
}

/// Why the tools file cannot be used: one line naming the file, the tool
/// and the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {place}: {message}")]
pub struct ToolsFileError {
    pub file: String,
    /// `tool "name"`, `tool #3` when the name is missing, or `the file`.
    pub place: String,
    pub message: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolsFile {
    #[serde(default)]
    tool: Vec<toml::Value>,
    #[serde(default)]
    mcp: Vec<toml::Value>,
    #[serde(default)]
    rule: Vec<toml::Value>,
}

impl Tools {
    /// Reads and checks `path`. Relative `command` programs with a `/` and
    /// relative `cwd`s are taken from the directory the server starts in.
    pub fn load(path: &Path) -> Result<Tools, ToolsFileError> {
        let file = path.display().to_string();
        let whole = |message: String| ToolsFileError {
            file: file.clone(),
            place: "the file".to_owned(),
            message,
        };
        let text =
            std::fs::read_to_string(path).map_err(|err| whole(format!("cannot read it: {err}")))?;
        let parsed: ToolsFile = toml::from_str(&text).map_err(|err| {
            whole(format!(
                "not a tools file: {}",
                err.to_string().lines().collect::<Vec<_>>().join(" ")
            ))
        })?;
        let mut tools = Tools::default();
        for (position, raw) in parsed.tool.into_iter().enumerate() {
            let name_hint = raw
                .get("name")
                .and_then(toml::Value::as_str)
                .map(|name| format!("tool \"{name}\""))
                .unwrap_or_else(|| format!("tool #{}", position + 1));
            let fail = |message: String| ToolsFileError {
                file: file.clone(),
                place: name_hint.clone(),
                message,
            };
            let entry: ToolEntry = raw
                .try_into()
                .map_err(|err: toml::de::Error| fail(err.message().to_owned()))?;
            let tool = build(entry).map_err(fail)?;
            if tools.by_name.contains_key(&tool.name) {
                return Err(ToolsFileError {
                    file: file.clone(),
                    place: name_hint,
                    message: "key `name`: a tool of that name is declared earlier".to_owned(),
                });
            }
            tools.order.push(tool.name.clone());
            tools.by_name.insert(tool.name.clone(), Arc::new(tool));
        }
        tools.file = file.clone();
        for (position, raw) in parsed.mcp.into_iter().enumerate() {
            let place = mcp_place(&raw, position);
            let fail = |message: String| ToolsFileError {
                file: file.clone(),
                place: place.clone(),
                message,
            };
            let entry: McpEntry = raw
                .try_into()
                .map_err(|err: toml::de::Error| fail(err.message().to_owned()))?;
            let timeout = timeout_of(entry.timeout_secs).map_err(&fail)?;
            let spec = entry.check(timeout).map_err(fail)?;
            if tools.mcp.iter().any(|other| other.name == spec.name) {
                return Err(fail(
                    "key `name`: a server of that name is declared earlier".to_owned(),
                ));
            }
            tools.mcp.push(spec);
        }
        tools.rules = Rules::parse(parsed.rule).map_err(|err| ToolsFileError {
            file: file.clone(),
            place: err.place,
            message: err.message,
        })?;
        Ok(tools)
    }

    /// Starts the `[[mcp]]` servers and adds their tools. A server that
    /// cannot start, and a name that collides with a declared tool or
    /// another server's, stop chatgate with one line naming both.
    pub async fn start_mcp(&mut self) -> Result<(), ToolsFileError> {
        for spec in std::mem::take(&mut self.mcp) {
            let fail = |message: String| ToolsFileError {
                file: self.file.clone(),
                place: format!("mcp \"{}\"", spec.name),
                message,
            };
            let (server, listed) = spec.start().await.map_err(&fail)?;
            for listed in listed {
                let executor = Executor::Mcp(McpTool {
                    server: server.clone(),
                    tool: listed.name.clone(),
                });
                let tool = Tool::new(
                    offered_name(&spec.name, &listed.name),
                    listed.description,
                    listed.risk.unwrap_or(spec.risk),
                    spec.confirm,
                    listed.input_schema,
                    spec.timeout,
                    executor,
                )
                .map_err(|err| fail(format!("tool `{}`: its input schema: {err}", listed.name)))?;
                let mut tool = tool;
                tool.idempotent = spec.idempotent;
                if let Some(preview) = spec.preview_tool.get(&listed.name) {
                    tool.preview = Some(crate::tools::tool::Preview {
                        executor: Executor::Mcp(McpTool {
                            server: server.clone(),
                            tool: preview.clone(),
                        }),
                        timeout: spec.preview_timeout,
                    });
                    tool.recheck = spec.recheck;
                }
                if let Some(other) = self.by_name.get(&tool.name) {
                    let other = match &other.executor {
                        Executor::Mcp(call) => {
                            format!("tool `{}` of MCP server {}", call.tool, call.server.name)
                        }
                        _ => format!("the declared tool \"{}\"", other.name),
                    };
                    return Err(fail(format!(
                        "its tool is offered as `{}`, the name of {other}",
                        tool.name
                    )));
                }
                self.order.push(tool.name.clone());
                self.by_name.insert(tool.name.clone(), Arc::new(tool));
            }
            log::info!(
                "MCP server {}: {} tool(s) offered",
                server.name,
                self.by_name
                    .values()
                    .filter(|t| matches!(&t.executor, Executor::Mcp(c) if Arc::ptr_eq(&c.server, &server)))
                    .count()
            );
            self.servers.push(server);
        }
        // Every tool is known now: a rule that matches none is a mistake.
        self.rules
            .check_tools(self.order.iter().map(String::as_str))
            .map_err(|err| ToolsFileError {
                file: self.file.clone(),
                place: err.place,
                message: err.message,
            })?;
        // What more than one person or a named group decides, no rule allows.
        for tool in self.iter() {
            if !tool.gate.needs_people() {
                continue;
            }
            if let Some(rule) = self.rules.allows(&tool.name) {
                return Err(ToolsFileError {
                    file: self.file.clone(),
                    place: format!("rule \"{}\"", rule.name),
                    message: format!(
                        "key `decision`: `allow` would run tool \"{}\" without the people its \
                         `approvals`/`approvers` name",
                        tool.name
                    ),
                });
            }
        }
        Ok(())
    }

    /// The `[[rule]]` tables, in file order.
    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// The MCP servers that are not running now (restarting), by name.
    pub fn mcp_down(&self) -> Vec<String> {
        self.servers
            .iter()
            .filter(|server| !server.is_running())
            .map(|server| server.name.clone())
            .collect()
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Tool>> {
        self.by_name.get(name)
    }

    /// The tools in file order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Tool>> {
        self.order.iter().filter_map(|name| self.by_name.get(name))
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }
}

/// `mcp "name"`, or `mcp #3` when the name is missing.
fn mcp_place(raw: &toml::Value, position: usize) -> String {
    raw.get("name")
        .and_then(toml::Value::as_str)
        .map(|name| format!("mcp \"{name}\""))
        .unwrap_or_else(|| format!("mcp #{}", position + 1))
}

mod entry;
#[cfg(test)]
mod tests;
