//! The HTTP glue: the routes ([`configure`]), the chat endpoint ([`chat`]),
//! the inbox ([`inbox`]), the offered tools ([`tools`]), grants
//! ([`grants`]), kept run
//! outcomes ([`runs`]),
//! probes ([`probes`]), the page ([`page`]), forwarding to a run's owner
//! ([`forward`]), the error table ([`error`]), the chat endpoint's SSE
//! responses ([`event_stream`]), who may call ([`access`]),
//! per-connection deadlines ([`connection`]) and the request log
//! ([`access_log`]). Extract, validate, call [`crate::run`], respond:
//! nothing else.

pub mod a2a;
pub mod access;
pub mod access_log;
pub mod agui;
pub mod chat;
pub mod connection;
pub mod error;
pub mod event_stream;
pub mod forward;
pub mod grants;
pub mod inbox;
pub mod keys;
pub mod links;
pub mod page;
pub mod probes;
pub mod runs;
pub mod slack;
pub mod state;
pub mod tools;

use actix_web::http::Method;
use actix_web::web;

use crate::protocol::a2a::{A2A_PATH, AGENT_CARD_PATH};
use crate::protocol::agui::{AGUI_CAPABILITIES_PATH, AGUI_PATH};
use crate::protocol::openapi::OPENAPI_PATH;
use crate::protocol::{CHAT_PATH, GRANTS_PATH, INBOX_PATH, RULES_PATH, RUNS_PATH, TOOLS_PATH};

/// The Slack app's interactivity request URL.
pub const SLACK_ACTIONS_PATH: &str = "/api/v1/slack/actions";
/// The public keys signed receipts verify against (#43).
pub const JWKS_PATH: &str = "/.well-known/jwks.json";

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource(CHAT_PATH)
            .route(web::post().to(chat::chat_stream))
            .route(web::method(Method::OPTIONS).to(chat::preflight))
            .default_service(web::to(chat::method_not_allowed)),
    )
    .service(
        web::resource(AGUI_PATH)
            .route(web::post().to(agui::run))
            .route(web::method(Method::OPTIONS).to(chat::preflight))
            .default_service(web::to(chat::method_not_allowed)),
    )
    .service(only(
        AGUI_CAPABILITIES_PATH,
        "GET",
        web::get().to(agui::capabilities),
    ))
    .service(only(A2A_PATH, "POST", web::post().to(a2a::rpc)))
    .service(only(AGENT_CARD_PATH, "GET", web::get().to(a2a::card)))
    .service(only(OPENAPI_PATH, "GET", web::get().to(probes::openapi)))
    .service(only(INBOX_PATH, "GET", web::get().to(inbox::interactions)))
    .service(only(TOOLS_PATH, "GET", web::get().to(tools::list)))
    .service(only(RULES_PATH, "GET", web::get().to(tools::rules)))
    .service(only(GRANTS_PATH, "GET", web::get().to(grants::list)))
    .service(only(
        &format!("{GRANTS_PATH}/{{id}}"),
        "DELETE",
        web::delete().to(grants::revoke),
    ))
    .service(only(
        &format!("{RUNS_PATH}/{{session_id}}"),
        "GET",
        web::get().to(runs::outcome),
    ))
    .service(only("/healthz", "GET", web::get().to(probes::health)))
    .service(only("/health", "GET", web::get().to(probes::health)))
    // simacode's paths, for its clients and probes.
    .service(only("/health/", "GET", web::get().to(probes::health)))
    .service(only("/health/live", "GET", web::get().to(probes::health)))
    .service(only("/health/ready", "GET", web::get().to(probes::ready)))
    .service(only("/readyz", "GET", web::get().to(probes::ready)))
    .service(only("/metrics", "GET", web::get().to(probes::metrics)))
    .service(only(JWKS_PATH, "GET", web::get().to(probes::jwks)))
    .service(
        web::resource("/d/{token}")
            .route(web::get().to(links::show))
            .route(web::post().to(links::decide))
            .default_service(web::to(|req| page::method_not_allowed(req, "GET, POST"))),
    )
    .service(only(
        SLACK_ACTIONS_PATH,
        "POST",
        web::post().to(slack::actions),
    ))
    .service(only("/", "GET", web::get().to(page::index)))
    .service(only(
        "/chatgate-client.mjs",
        "GET",
        web::get().to(page::client_module),
    ))
    .default_service(web::to(page::not_found));
}

/// `path`, answered by `route` for `method`; any other method is 405
/// with `Allow` (the documented routes answer no method they do not
/// document).
fn only(path: &str, method: &'static str, route: actix_web::Route) -> actix_web::Resource {
    web::resource(path)
        .route(route)
        .default_service(web::to(move |req| page::method_not_allowed(req, method)))
}
