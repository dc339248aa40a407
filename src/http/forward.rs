//! Forwarding a request to the replica that owns its session, and telling a
//! forwarded request from a client's.
//!
//! The forwarded request is the client's own: the same body, with its
//! `Authorization`, `Content-Type`, `Last-Event-ID` and `Origin`, plus the
//! cluster secret and the client's address. The owner applies it exactly as
//! a local one and never forwards it again. Its answer goes back as it
//! came: status, the headers a client reads, and the body streamed through
//! (a re-attach is a proxied stream), so nothing is buffered here.

use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};
use bytes::Bytes;
use secrecy::ExposeSecret;

use super::error::ChatError;
use crate::cluster::{Cluster, Peer};
use crate::protocol::CHAT_PATH;

/// Carries `--cluster-secret` on a forwarded request.
pub const SECRET_HEADER: &str = "x-chatgate-cluster-secret";
/// The client's address, on a forwarded request (for the audit log).
pub const CLIENT_HEADER: &str = "x-chatgate-client";
/// The replica that forwarded a request (for logs).
pub const FROM_HEADER: &str = "x-chatgate-forwarded-by";

/// Request headers the owner needs to answer as if the client had come.
const PASSED_ON: [&str; 4] = ["authorization", "content-type", "last-event-id", "origin"];
/// Response headers a client reads.
const PASSED_BACK: [&str; 6] = [
    "content-type",
    "cache-control",
    "retry-after",
    "www-authenticate",
    "x-accel-buffering",
    "allow",
];

/// Whether `headers` are a forwarded request's: `Ok(true)` with the right
/// cluster secret, `Ok(false)` without the header, and an error for a wrong
/// secret (or any secret when this server is not a replica): a client can
/// never pose as a replica.
pub fn is_forwarded(cluster: Option<&Cluster>, headers: &HeaderMap) -> Result<bool, ChatError> {
    let Some(presented) = headers.get(SECRET_HEADER) else {
        return Ok(false);
    };
    let cluster = cluster.ok_or(ChatError::ForbiddenReplica)?;
    if cluster.is_secret(presented.as_bytes()) {
        Ok(true)
    } else {
        Err(ChatError::ForbiddenReplica)
    }
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
/// `owner_unavailable` (503), with a Retry-After of what its heartbeat has
/// left: then another replica can take its runs over.
pub async fn forward(
    cluster: &Cluster,
    owner: &Peer,
    req: &HttpRequest,
    body: Bytes,
) -> Result<HttpResponse, ChatError> {
    let mut request = cluster
        .http()
        .post(format!("{}{CHAT_PATH}", owner.url))
        .header(SECRET_HEADER, cluster.secret().expose_secret())
        .header(FROM_HEADER, cluster.replica_id())
        .body(body);
    for name in PASSED_ON {
        if let Some(value) = req.headers().get(name) {
            request = request.header(name, value.as_bytes());
        }
    }
    if let Some(client) = client_address(req, false) {
        request = request.header(CLIENT_HEADER, client);
    }
    let answer = request.send().await.map_err(|err| {
        log::warn!("cannot reach the owner at {}: {err}", owner.url);
        ChatError::OwnerUnavailable {
            retry_after: owner.lease,
        }
    })?;
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
