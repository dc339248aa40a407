//! The tools file (`--tools`): one `[[tool]]` table per tool, checked at
//! start ([`Tools::load`]), each tool's argument schema
//! ([`Tool::check_args`]) and executor ([`Tool::run`]).

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use self::entry::{build, ToolEntry};
use super::command;
#[cfg(feature = "openai")]
use super::http;
use super::mcp::call::CallHost;
use super::mcp::{offered_name, McpEntry, McpServer, McpSpec, McpTool};
use super::outcome::ToolOutcome;
use super::rules::Rules;
use crate::protocol::question::{
    check_questions, Question, MAX_HEADER_CHARS, MAX_QUESTIONS, SCHEMA_KEYWORDS,
};
use crate::protocol::RiskLevel;

/// Default of a tool's `timeout_secs`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a tool's `timeout_secs` may be.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

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

/// One declared tool.
pub struct Tool {
    pub name: String,
    pub description: String,
    pub risk: RiskLevel,
    /// `false` only for read-only tools, which the `openai` engine then runs
    /// without asking. The planner always asks.
    pub confirm: bool,
    /// A person may grant later calls of it without asking (`grantable`;
    /// a low or medium risk tool always is, a high risk one only when its
    /// table says so).
    pub grantable: bool,
    /// The JSON Schema of its arguments, as written.
    pub parameters: Value,
    /// The SHA-256 of `parameters` (a grant covers only the schema it saw).
    pub schema_hash: String,
    /// Who decides a pause holding a call of it: only this group's members
    /// (`approvers`; the requester's own key no longer may).
    pub approvers: Option<String>,
    /// Confirms from distinct people a pause holding a call of it needs
    /// (`approvals`, 1-5).
    pub approvals: u8,
    /// Whether the requester's own key counts towards them
    /// (`requester_may_approve`; default: only when one is enough).
    pub requester_may_approve: Option<bool>,
    /// How long a pause holding a call of it waits (`timeout`; the
    /// pause's expiry is the smallest of its tasks' and `--confirm-timeout`).
    pub pause_timeout: Option<Duration>,
    /// `on_timeout = "reject"`: a pause whose tasks all say so rejects them
    /// when nobody answers, and the run goes on (default: it is cancelled).
    pub reject_on_timeout: bool,
    /// `remind_after`: an `interaction.reminder` event once a pause holding
    /// a call of it has waited this long.
    pub remind_after: Option<Duration>,
    /// `escalate_after` and `escalate_to`: once a pause holding a call of
    /// it has waited this long, the group's members may decide it too.
    pub escalate: Option<(Duration, String)>,
    validator: jsonschema::Validator,
    pub timeout: Duration,
    pub executor: Executor,
}

impl fmt::Debug for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tool")
            .field("name", &self.name)
            .field("risk", &self.risk)
            .field("confirm", &self.confirm)
            .field("executor", &self.executor)
            .finish_non_exhaustive()
    }
}

/// How a tool runs.
#[derive(Debug)]
pub enum Executor {
    Command(command::CommandSpec),
    /// A tool of an MCP server (`[[mcp]]`).
    Mcp(super::mcp::McpTool),
    #[cfg(feature = "openai")]
    Http(http::HttpSpec),
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
            if tool.approvals <= 1 && tool.approvers.is_none() {
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

/// A `timeout_secs` (none: [`DEFAULT_TIMEOUT`]); the error names the key.
fn timeout_of(secs: Option<f64>) -> Result<Duration, String> {
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

/// `mcp "name"`, or `mcp #3` when the name is missing.
fn mcp_place(raw: &toml::Value, position: usize) -> String {
    raw.get("name")
        .and_then(toml::Value::as_str)
        .map(|name| format!("mcp \"{name}\""))
        .unwrap_or_else(|| format!("mcp #{}", position + 1))
}

impl Tool {
    /// A tool with the argument schema `parameters` (an object schema; the
    /// error says what is wrong with it).
    pub fn new(
        name: String,
        description: String,
        risk: RiskLevel,
        confirm: bool,
        parameters: Value,
        timeout: Duration,
        executor: Executor,
    ) -> Result<Tool, String> {
        if parameters.get("type").and_then(Value::as_str) != Some("object") {
            return Err("the schema must have `type = \"object\"`".to_owned());
        }
        jsonschema::meta::validate(&parameters)
            .map_err(|err| format!("not a valid JSON Schema: {err}"))?;
        let validator = jsonschema::validator_for(&parameters)
            .map_err(|err| format!("not a valid JSON Schema: {err}"))?;
        let schema_hash = {
            use sha2::{Digest, Sha256};
            hex::encode(Sha256::digest(parameters.to_string().as_bytes()))
        };
        Ok(Tool {
            name,
            description,
            grantable: risk != RiskLevel::High,
            approvers: None,
            approvals: 1,
            requester_may_approve: None,
            pause_timeout: None,
            reject_on_timeout: false,
            remind_after: None,
            escalate: None,
            risk,
            confirm,
            schema_hash,
            parameters,
            validator,
            timeout,
            executor,
        })
    }

    /// Whether the requester's own key counts towards the approvals a pause
    /// holding a call of it needs: as the table says, else only when one
    /// is enough.
    pub fn requester_may_approve(&self) -> bool {
        self.requester_may_approve.unwrap_or(self.approvals <= 1)
    }

    /// Checks `args` against the tool's schema; the error lists what is wrong.
    pub fn check_args(&self, args: &Value) -> Result<(), String> {
        let errors: Vec<String> = self
            .validator
            .iter_errors(args)
            .take(5)
            .map(|err| {
                let at = err.instance_path().to_string();
                if at.is_empty() {
                    err.to_string()
                } else {
                    format!("{at}: {err}")
                }
            })
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }

    /// When `args` fail the schema only because required properties of a
    /// primitive type (string, number, integer, boolean) are missing: a
    /// question per missing property (its name the id, its `description`
    /// the question, its schema the question's, keywords a question may not
    /// carry left out: the merged arguments are checked again anyway).
    /// `None` when anything else is wrong, or the questions cannot be asked.
    pub fn missing_inputs(&self, args: &Value) -> Option<Vec<Question>> {
        let mut questions = Vec::new();
        for err in self.validator.iter_errors(args) {
            let jsonschema::error::ValidationErrorKind::Required { property } = err.kind() else {
                return None;
            };
            if !err.instance_path().to_string().is_empty() || questions.len() == MAX_QUESTIONS {
                return None;
            }
            let name = property.as_str()?;
            let declared = self.parameters.get("properties")?.get(name)?.as_object()?;
            match declared.get("type").and_then(Value::as_str) {
                Some("string" | "number" | "integer" | "boolean") => {}
                _ => return None,
            }
            let schema: serde_json::Map<String, Value> = declared
                .iter()
                .filter(|(k, _)| SCHEMA_KEYWORDS.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let question = declared
                .get("description")
                .and_then(Value::as_str)
                .filter(|d| !d.trim().is_empty())
                .map_or_else(|| format!("A value for `{name}`?"), str::to_owned);
            questions.push(Question {
                id: name.to_owned(),
                header: name.chars().take(MAX_HEADER_CHARS).collect(),
                question,
                options: Vec::new(),
                multi_select: false,
                allow_other: false,
                required: true,
                schema: Some(Value::Object(schema)),
            });
        }
        if questions.is_empty() {
            return None;
        }
        check_questions(&questions).ok()?;
        Some(questions)
    }

    /// Runs one call with `args` (already checked), unless `stop` resolves
    /// first: then a running command is terminated (SIGTERM, SIGKILL 2 s
    /// later) and the outcome says it was stopped. An MCP server's
    /// questions and progress go to `host`; its error, if asking ended the
    /// call, comes back with the outcome.
    pub async fn run<H: CallHost>(
        &self,
        args: &Value,
        stop: impl std::future::Future<Output = ()>,
        host: &mut H,
    ) -> (ToolOutcome, Option<H::Error>) {
        match &self.executor {
            Executor::Command(spec) => (spec.run(args, self.timeout, stop).await, None),
            #[cfg(feature = "openai")]
            Executor::Http(spec) => (spec.run(args, self.timeout, stop).await, None),
            // A server's questions and progress go to `host` (the run).
            Executor::Mcp(call) => {
                super::mcp::call::run(call, args, self.timeout, stop, host).await
            }
        }
    }
}

mod entry;
#[cfg(test)]
mod tests;
