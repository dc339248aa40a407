//! Probes: liveness, readiness (shutdown, the audit log, the store, MCP
//! servers) and the Prometheus metrics.

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};

use super::state::AppState;
use crate::run::readiness::NotReady;

/// Alive: answers as long as the process serves HTTP.
pub async fn health() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({ "status": "ok" }))
}

/// Ready for new runs: 503 from the moment shutdown starts, or while
/// something a run needs is down (see [`NotReady`]).
pub async fn ready(state: web::Data<AppState>) -> HttpResponse {
    let down = match state.runs.readiness() {
        Ok(()) => return HttpResponse::Ok().json(serde_json::json!({ "status": "ready" })),
        Err(down) => down,
    };
    HttpResponse::ServiceUnavailable().json(match down {
        NotReady::Audit(path) => serde_json::json!({
            "status": "audit_unavailable",
            "audit_log": path,
            "error": "the audit log cannot be written: nothing runs until it can",
        }),
        NotReady::Store(store) => serde_json::json!({
            "status": "store_unavailable",
            "store": store,
            "error": "the store cannot be reached: decisions are refused until it can",
        }),
        NotReady::Engine(why) => serde_json::json!({
            "status": "engine_unavailable",
            "error": why,
        }),
        NotReady::Mcp(down) => serde_json::json!({
            "status": "mcp_unavailable",
            "mcp": down,
            "error": "an MCP server is not running (it is being restarted): its tools fail until it is back",
        }),
        NotReady::ShuttingDown => serde_json::json!({ "status": "shutting_down" }),
    })
}

/// Prometheus text (0.0.4) by default, OpenMetrics when the scraper asks
/// for it in `Accept`.
pub async fn metrics(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let openmetrics = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("application/openmetrics-text"));
    let runs = &state.runs;
    let gauges = runs.gauges().await;
    let (content_type, body) = if openmetrics {
        (
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            runs.metrics().render_openmetrics(gauges),
        )
    } else {
        (
            "text/plain; version=0.0.4; charset=utf-8",
            runs.metrics().render_text(gauges),
        )
    };
    HttpResponse::Ok().content_type(content_type).body(body)
}

/// `GET /.well-known/jwks.json`: the public keys receipts verify against
/// (docs/tools.md, "Receipts"), the signing key first. Public: a JWKS
/// holds no secret.
pub async fn jwks(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/jwk-set+json")
        .insert_header((header::CACHE_CONTROL, "max-age=300"))
        .json(state.runs.settings().receipts.jwks())
}

/// `GET /openapi.json`: the OpenAPI 3.1 document of every route. Public:
/// it names no secret.
pub async fn openapi() -> HttpResponse {
    HttpResponse::Ok().json(crate::protocol::openapi::document(env!(
        "CARGO_PKG_VERSION"
    )))
}
