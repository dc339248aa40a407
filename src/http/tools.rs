//! `GET /api/v1/tools`: the tools the server offers, as the planner and a
//! model may call them: name, description, argument schema, risk, whether a
//! call needs a yes, and where the tool comes from (the tools file, or an
//! MCP server). Who may call it: whoever may use the chat endpoint.

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;
use serde_json::Value;

use super::error::ChatError;
use super::state::AppState;
use crate::protocol::RiskLevel;
use crate::tools::Executor;

/// One offered tool, as listed.
#[derive(Debug, Serialize)]
struct Listed<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
    risk: RiskLevel,
    confirm: bool,
    /// Whether a confirm's grant may cover it.
    grantable: bool,
    /// Who decides a call of it: the groups whose members alone decide,
    /// how many distinct people, whether the requester counts.
    approvers: &'a [String],
    approvals: u8,
    requester_may_approve: bool,
    /// How long a pause holding it waits (seconds; `null`: the server's
    /// `--confirm-timeout`), and what silence does (`cancel`, `reject`).
    timeout_seconds: Option<u64>,
    on_timeout: &'static str,
    /// Its reminder and escalation, when it has them (seconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    remind_after_seconds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    escalate_after_seconds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    escalate_to: Option<&'a str>,
    source: Source<'a>,
}

/// Where a tool comes from.
#[derive(Debug, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Source<'a> {
    /// A `[[tool]]` of the tools file (a command or an http tool).
    File,
    /// A tool of the `[[mcp]]` server `server`, under its own name `tool`.
    Mcp { server: &'a str, tool: &'a str },
}

pub async fn list(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    match listing(&req, &state) {
        Ok(response) => response,
        Err(err) => {
            state.runs.metrics().error(err.error_type());
            err.to_json_response()
        }
    }
}

fn listing(req: &HttpRequest, state: &AppState) -> Result<HttpResponse, ChatError> {
    let headers = req.headers();
    state.access.json_caller(headers)?;
    let tools: Vec<Listed<'_>> = state
        .runs
        .settings()
        .tools
        .iter()
        .map(|tool| Listed {
            name: &tool.name,
            description: &tool.description,
            parameters: &tool.parameters,
            risk: tool.risk,
            confirm: tool.confirm,
            grantable: tool.grantable && !tool.gate.needs_people(),
            approvers: &tool.gate.approvers,
            approvals: tool.gate.approvals,
            requester_may_approve: tool.gate.requester_may_approve(),
            timeout_seconds: tool.gate.timeout.map(|t| t.as_secs()),
            on_timeout: if tool.gate.rejects_on_timeout() {
                "reject"
            } else {
                "cancel"
            },
            remind_after_seconds: tool.gate.remind_after.map(|t| t.as_secs()),
            escalate_after_seconds: tool.gate.escalate.as_ref().map(|e| e.after.as_secs()),
            escalate_to: tool.gate.escalate.as_ref().map(|e| e.to.as_str()),
            source: match &tool.executor {
                Executor::Mcp(mcp) => Source::Mcp {
                    server: &mcp.server.name,
                    tool: &mcp.tool,
                },
                _ => Source::File,
            },
        })
        .collect();
    let mut response = HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .json(serde_json::json!({ "tools": tools }));
    state.access.allow_origin(headers, &mut response);
    Ok(response)
}

/// `GET /api/v1/rules`: the tools file's rules in force, in file order
/// (what each matches and decides, its mode), as a person checks them
/// (Claude Code's `/permissions`). Who may call it: whoever may use the
/// chat endpoint.
pub async fn rules(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let headers = req.headers();
    if let Err(err) = state.access.json_caller(headers) {
        state.runs.metrics().error(err.error_type());
        return err.to_json_response();
    }
    let rules = state.runs.settings().tools.rules().views();
    let mut response = HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .json(serde_json::json!({ "rules": rules }));
    state.access.allow_origin(headers, &mut response);
    response
}
