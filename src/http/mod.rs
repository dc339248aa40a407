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
    .route(AGUI_CAPABILITIES_PATH, web::get().to(agui::capabilities))
    .route(A2A_PATH, web::post().to(a2a::rpc))
    .route(AGENT_CARD_PATH, web::get().to(a2a::card))
    .route(INBOX_PATH, web::get().to(inbox::interactions))
    .route(TOOLS_PATH, web::get().to(tools::list))
    .route(RULES_PATH, web::get().to(tools::rules))
    .route(GRANTS_PATH, web::get().to(grants::list))
    .route(
        &format!("{GRANTS_PATH}/{{id}}"),
        web::delete().to(grants::revoke),
    )
    .route(
        &format!("{RUNS_PATH}/{{session_id}}"),
        web::get().to(runs::outcome),
    )
    .route("/healthz", web::get().to(probes::health))
    .route("/health", web::get().to(probes::health))
    // simacode's paths, for its clients and probes.
    .route("/health/", web::get().to(probes::health))
    .route("/health/live", web::get().to(probes::health))
    .route("/health/ready", web::get().to(probes::ready))
    .route("/readyz", web::get().to(probes::ready))
    .route("/metrics", web::get().to(probes::metrics))
    .route(JWKS_PATH, web::get().to(probes::jwks))
    .service(
        web::resource("/d/{token}")
            .route(web::get().to(links::show))
            .route(web::post().to(links::decide)),
    )
    .route(SLACK_ACTIONS_PATH, web::post().to(slack::actions))
    .route("/", web::get().to(page::index))
    .route("/chatgate-client.mjs", web::get().to(page::client_module))
    .default_service(web::to(page::not_found));
}
