//! One tool ([`Tool`]): its argument schema ([`Tool::check_args`], the
//! questions for what it lacks), who decides its calls, and its executor
//! ([`Tool::run`]).

use std::fmt;
use std::time::Duration;

use serde_json::Value;

use super::command;
use super::gate::Gate;
#[cfg(feature = "openai")]
use super::http;
use super::mcp::call::CallHost;
use super::outcome::ToolOutcome;
use super::stamp::Stamp;
use crate::protocol::question::{
    check_questions, Question, MAX_HEADER_CHARS, MAX_QUESTIONS, SCHEMA_KEYWORDS,
};
use crate::protocol::RiskLevel;

/// Default of a tool's `timeout_secs`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a tool's `timeout_secs` may be.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

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
    /// Who decides a pause holding a call of it, and what happens while
    /// nobody answers (see [`Gate`]).
    pub gate: Gate,
    validator: jsonschema::Validator,
    pub timeout: Duration,
    pub executor: Executor,
    /// What a call would do, shown on its card (`preview`, `preview_http`,
    /// `preview_tool`).
    pub preview: Option<Preview>,
    /// Its preview runs again just before an approved call runs; a
    /// different digest stops the call (`recheck`).
    pub recheck: bool,
    /// A call of it may be made again with the same idempotency key after
    /// a crash cut it short (`idempotent = true`, #44).
    pub idempotent: bool,
    /// Says whether a call cut short by a crash took effect (`reconcile`,
    /// #44): exit 0 it did, 3 it did not, anything else nobody knows.
    pub reconcile: Option<command::CommandSpec>,
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

/// A tool's preview, as checked at start: run by [`Preview::run`]
/// (`tools::preview`).
#[derive(Debug)]
pub struct Preview {
    pub executor: Executor,
    pub timeout: Duration,
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
            gate: Gate::default(),
            risk,
            confirm,
            schema_hash,
            parameters,
            validator,
            timeout,
            executor,
            preview: None,
            recheck: false,
            idempotent: false,
            reconcile: None,
        })
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
        stamp: Stamp<'_>,
        stop: impl std::future::Future<Output = ()>,
        host: &mut H,
    ) -> (ToolOutcome, Option<H::Error>) {
        match &self.executor {
            Executor::Command(spec) => {
                let tag = host.tag();
                let outcome = spec.run(args, self.timeout, stop, tag.as_ref(), stamp);
                (outcome.await, None)
            }
            #[cfg(feature = "openai")]
            Executor::Http(spec) => (spec.run(args, self.timeout, stop, stamp).await, None),
            // A server's questions and progress go to `host` (the run).
            Executor::Mcp(call) => {
                super::mcp::call::run(call, args, stamp, self.timeout, stop, host).await
            }
        }
    }
}
