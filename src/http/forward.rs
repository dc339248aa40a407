//! Forwarding a request to the replica that owns its session, and telling a
//! forwarded request from a client's.
//!
//! The forwarded request is the client's own: the same body, with its
//! `Authorization`, `Content-Type`, `Last-Event-ID` and `Origin`, plus the
//! cluster secret and the client's address. The owner applies it exactly as
//! a local one and never forwards it again. Its answer goes back as it
//! came: status, the headers a client reads, and the body streamed through
//! (a re-attach is a proxied stream), so nothing is buffered here.
//!
//! A reply or a new message is forwarded with a deadline
//! ([`DEADLINE_HEADER`], [`FORWARD_BUDGET`] from now): the owner takes
//! nothing past it. The forwarder waits [`FORWARD_WAIT`] for the owner's
//! answer; an owner it could not reach is `owner_unavailable` (503: not
//! taken), one that did not answer in time `outcome_unknown` (504: it may
//! have been taken before its deadline; the client re-attaches to see).
//! Deadlines are wall-clock times: the replicas' clocks must agree to well
//! within [`FORWARD_WAIT`] - [`FORWARD_BUDGET`] (NTP does).

use std::time::{Duration, SystemTime};

use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};
use bytes::Bytes;
use secrecy::ExposeSecret;

use super::error::ChatError;
use crate::cluster::{Cluster, Peer};
use crate::protocol::CHAT_PATH;
use crate::session::run_log;
use crate::session::RunTag;

/// Carries `--cluster-secret` on a forwarded request.
pub const SECRET_HEADER: &str = "x-chatgate-cluster-secret";
/// The client's address, on a forwarded request (for the audit log).
pub const CLIENT_HEADER: &str = "x-chatgate-client";
/// The replica that forwarded a request (for logs).
pub const FROM_HEADER: &str = "x-chatgate-forwarded-by";
/// A forwarded request's deadline, in milliseconds since the Unix epoch:
/// the owner takes nothing past it.
pub const DEADLINE_HEADER: &str = "x-chatgate-deadline";
/// How long after forwarding a reply or a message the owner may still take it.
pub const FORWARD_BUDGET: Duration = Duration::from_secs(5);
/// How long the forwarder waits for the owner's answer: the budget, plus
/// time for a decision taken at its last instant to be recorded.
pub const FORWARD_WAIT: Duration = Duration::from_secs(9);

/// A request, as forwarding sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forwarding {
    /// A reply or a new message: it changes something, so an answer that
    /// does not come means an unknown outcome.
    Change,
    /// A re-attach: it changes nothing.
    Read,
}

/// A forwarded request, as its owner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forwarded {
    /// Past this, nothing is taken (its forwarder has given up).
    pub not_after: Option<SystemTime>,
}

/// Request headers the owner needs to answer as if the client had come.
const PASSED_ON: [&str; 5] = [
    "authorization",
    "content-type",
    "last-event-id",
    "origin",
    "a2a-version",
];
/// Response headers a client reads.
const PASSED_BACK: [&str; 6] = [
    "content-type",
    "cache-control",
    "retry-after",
    "www-authenticate",
    "x-accel-buffering",
    "allow",
];

/// Whether `headers` are a forwarded request's: `Some` with the right
/// cluster secret (and its deadline), `None` without the header, and an
/// error for a wrong secret (or any secret when this server is not a
/// replica): a client can never pose as a replica.
pub fn forwarded(
    cluster: Option<&Cluster>,
    headers: &HeaderMap,
) -> Result<Option<Forwarded>, ChatError> {
    let Some(presented) = headers.get(SECRET_HEADER) else {
        return Ok(None);
    };
    let cluster = cluster.ok_or(ChatError::ForbiddenReplica)?;
    if !cluster.is_secret(presented.as_bytes()) {
        return Err(ChatError::ForbiddenReplica);
    }
    let not_after = headers
        .get(DEADLINE_HEADER)
        .and_then(|value| value.to_str().ok())
        .and_then(|ms| ms.parse::<u64>().ok())
        .map(crate::clock::at);
    Ok(Some(Forwarded { not_after }))
}

/// The client's address: the one a forwarding replica names, or the peer.
pub fn client_address(req: &HttpRequest, forwarded: bool) -> Option<String> {
    if forwarded {
        if let Some(client) = req.headers().get(CLIENT_HEADER) {
            return client.to_str().ok().map(str::to_owned);
        }
    }
    req.peer_addr().map(|peer| peer.ip().to_string())
}

/// Sends the client's request (`body` as it came) to `owner` and returns
/// the owner's answer, streamed. An owner that cannot be reached is
/// `owner_unavailable` (503: nothing was taken), with a Retry-After of what
/// its heartbeat has left: then another replica can take its runs over. A
/// change the owner did not answer in time is `outcome_unknown` (504).
pub async fn forward(
    cluster: &Cluster,
    owner: &Peer,
    tag: &RunTag,
    req: &HttpRequest,
    body: Bytes,
    forwarding: Forwarding,
) -> Result<HttpResponse, ChatError> {
    let deadline = SystemTime::now() + FORWARD_BUDGET;
    let deadline_ms = crate::clock::ms(deadline);
    let mut request = cluster
        .http()
        .post(format!("{}{}", owner.url, forwarded_path(req)))
        .header(SECRET_HEADER, cluster.secret().expose_secret())
        .header(FROM_HEADER, cluster.replica_id())
        .header(DEADLINE_HEADER, deadline_ms.to_string())
        .body(body);
    for name in PASSED_ON {
        if let Some(value) = req.headers().get(name) {
            request = request.header(name, value.as_bytes());
        }
    }
    if let Some(client) = client_address(req, false) {
        request = request.header(CLIENT_HEADER, client);
    }
    let unreachable = || ChatError::OwnerUnavailable {
        retry_after: owner.lease,
    };
    let url = &owner.url;
    let answer = match tokio::time::timeout(FORWARD_WAIT, request.send()).await {
        Ok(Ok(answer)) => answer,
        // Never connected: nothing was sent, so nothing was taken.
        Ok(Err(err)) if err.is_connect() || forwarding == Forwarding::Read => {
            run_log!(Warn, tag, "cannot reach the owner at {url}: {err}");
            return Err(unreachable());
        }
        Ok(Err(err)) => {
            run_log!(Warn, tag, "the owner at {url} did not answer: {err}");
            return Err(ChatError::OutcomeUnknown);
        }
        Err(_) => {
            run_log!(Warn, tag, "the owner at {url} did not answer in time");
            return Err(match forwarding {
                Forwarding::Read => unreachable(),
                _ => ChatError::OutcomeUnknown,
            });
        }
    };
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut response = HttpResponse::build(status);
    for name in PASSED_BACK {
        if let Some(value) = answer.headers().get(name) {
            if let Ok(value) = HeaderValue::from_bytes(value.as_bytes()) {
                response.insert_header((HeaderName::from_static(name), value));
            }
        }
    }
    Ok(response.streaming(answer.bytes_stream()))
}

/// The path a request is forwarded to: the endpoint it came to (the chat
/// endpoint, the AG-UI one or the A2A one), nothing a client could choose
/// beyond it.
fn forwarded_path(req: &HttpRequest) -> &'static str {
    match req.path() {
        crate::protocol::agui::AGUI_PATH => crate::protocol::agui::AGUI_PATH,
        crate::protocol::a2a::A2A_PATH => crate::protocol::a2a::A2A_PATH,
        _ => CHAT_PATH,
    }
}

/// Sends a decision link's request (`GET` or `POST /d/<token>`, `body` as
/// it came), or a Slack button's (`POST /api/v1/slack/actions`, its
/// signature headers with it), to `owner`, which checks the token (or the
/// signature) again and answers it as its own: the page comes back as it
/// came. A `POST` carries the chat path's deadline: the owner takes
/// nothing past it, an owner never reached is 503 `owner_unavailable`
/// (nothing taken), one that did not answer in time `outcome_unknown`.
pub async fn pass_link(
    cluster: &Cluster,
    owner: &Peer,
    tag: &RunTag,
    req: &HttpRequest,
    path: &str,
    post: bool,
    body: Bytes,
) -> Result<HttpResponse, ChatError> {
    let request = link_request(cluster, owner, req, path, post, body);
    let url = &owner.url;
    let answer = match tokio::time::timeout(FORWARD_WAIT, request.send()).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(err)) if err.is_connect() || !post => {
            run_log!(Warn, tag, "cannot reach the owner at {url}: {err}");
            return Err(ChatError::OwnerUnavailable {
                retry_after: owner.lease,
            });
        }
        _ if !post => {
            run_log!(Warn, tag, "the owner at {url} did not answer in time");
            return Err(ChatError::OwnerUnavailable {
                retry_after: owner.lease,
            });
        }
        _ => {
            run_log!(
                Warn,
                tag,
                "the owner at {url} did not answer a decision in time"
            );
            return Err(ChatError::OutcomeUnknown);
        }
    };
    Ok(page_of(answer))
}

/// The request passing a link's (or a Slack press's) request on to
/// `owner`: with the cluster secret, and for a POST its content type, the
/// chat path's deadline and Slack's signature headers.
fn link_request(
    cluster: &Cluster,
    owner: &Peer,
    req: &HttpRequest,
    path: &str,
    post: bool,
    body: Bytes,
) -> reqwest::RequestBuilder {
    let url = format!("{}{path}", owner.url);
    let method = if post {
        reqwest::Method::POST
    } else {
        reqwest::Method::GET
    };
    let mut request = cluster
        .http()
        .request(method, url)
        .header(SECRET_HEADER, cluster.secret().expose_secret())
        .header(FROM_HEADER, cluster.replica_id())
        .body(body);
    if post {
        let deadline = crate::clock::ms(SystemTime::now() + FORWARD_BUDGET);
        let content_type = req
            .headers()
            .get("content-type")
            .map_or(&b"application/x-www-form-urlencoded"[..], |v| v.as_bytes());
        request = request
            .header(DEADLINE_HEADER, deadline.to_string())
            .header("content-type", content_type);
        for name in ["x-slack-signature", "x-slack-request-timestamp"] {
            if let Some(value) = req.headers().get(name) {
                request = request.header(name, value.as_bytes());
            }
        }
    }
    if let Some(client) = client_address(req, false) {
        request = request.header(CLIENT_HEADER, client);
    }
    request
}

/// A link page the owner answered, as it came: its status, its own
/// headers (the policies a page sets, what it did), its body streamed.
fn page_of(answer: reqwest::Response) -> HttpResponse {
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut response = HttpResponse::build(status);
    for name in [
        "content-type",
        "cache-control",
        "content-security-policy",
        "referrer-policy",
        "x-robots-tag",
        "x-chatgate-outcome",
    ] {
        if let Some(value) = answer.headers().get(name) {
            if let Ok(value) = HeaderValue::from_bytes(value.as_bytes()) {
                response.insert_header((HeaderName::from_static(name), value));
            }
        }
    }
    response.streaming(answer.bytes_stream())
}
