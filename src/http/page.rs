//! The browser page and the JS client module it imports, embedded at build
//! time; and the JSON 404 of every other path.

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse};

use crate::protocol::CHAT_PATH;

/// The browser chat page, embedded at build time.
const INDEX_HTML: &str = include_str!("../../clients/web/index.html");
/// The JS client module the page imports, served at a stable path.
const CLIENT_MJS: &str = include_str!("../../clients/js/chatgate-client.mjs");
/// The page runs its own inline module and talks to its own origin only.
const PAGE_CSP: &str = "default-src 'none'; script-src 'self' 'unsafe-inline'; \
                        style-src 'unsafe-inline'; connect-src 'self'; base-uri 'none'; \
                        form-action 'none'; frame-ancestors 'none'";

/// Any other path: 404 with a JSON body that says where the API is.
pub async fn not_found(req: HttpRequest) -> HttpResponse {
    HttpResponse::NotFound().json(serde_json::json!({
        "error_type": "not_found",
        "error": format!(
            "no such path: {}; the chat endpoint is POST {CHAT_PATH}, health GET /healthz",
            req.path()
        ),
    }))
}

/// A method a documented path does not answer: 405, `Allow`, and the
/// JSON error body.
pub async fn method_not_allowed(req: HttpRequest, allow: &'static str) -> HttpResponse {
    HttpResponse::MethodNotAllowed()
        .insert_header((header::ALLOW, allow))
        .json(serde_json::json!({
            "error_type": "method_not_allowed",
            "message": format!("{} is not allowed on {}: {allow}", req.method(), req.path()),
        }))
}

pub async fn index() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header((header::CONTENT_SECURITY_POLICY, PAGE_CSP))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .body(INDEX_HTML)
}

pub async fn client_module() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/javascript; charset=utf-8")
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .body(CLIENT_MJS)
}
