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
