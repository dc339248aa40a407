//! One log line per request, written when the response head is ready.
//!
//! actix-web's `Logger` writes its line when the response *body* ends, and
//! keeps a copy of its format and a body wrapper alive until then: for a
//! paused stream that is the whole pause, about 0.9 KiB per run for a line
//! nobody sees until the run ends. A stream's end is the run's business
//! (`run ended with ...` at debug level). The body, and so the message text,
//! is never logged; the session id is (quoted, as the audit log has it), so
//! that a request can be matched to its run.

use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{Error, HttpMessage, HttpRequest};
use futures_util::future::LocalBoxFuture;

/// The session a request is about, once the handler has read it.
struct Session(String);

/// Names the session of `req` in its log line.
pub fn note_session(req: &HttpRequest, session_id: &str) {
    if log::log_enabled!(log::Level::Info) {
        req.extensions_mut().insert(Session(session_id.to_owned()));
    }
}

/// Logs `<peer> "<method> <path> <version>" <status> <ms>ms session=<id>`
/// at info level (`session=-` when the request named none, or was refused
/// before it was read).
///
/// The future is boxed: actix keeps a middleware's future inline in every
/// connection's task, so an unboxed one would enlarge each held stream for
/// good, while the box is freed as soon as the response head is ready.
pub fn log_request<B: MessageBody + 'static>(
    req: ServiceRequest,
    next: Next<B>,
) -> LocalBoxFuture<'static, Result<ServiceResponse<B>, Error>> {
    Box::pin(async move {
        if !log::log_enabled!(log::Level::Info) {
            return next.call(req).await;
        }
        let started = Instant::now();
        let peer = req.peer_addr();
        // A decision link's token never reaches a log.
        let path = super::links::logged_path(req.path());
        let line = format!("{} {path} {:?}", req.method(), req.version());
        let response = next.call(req).await;
        let (status, session) = match &response {
            Ok(response) => (
                response.status().as_u16(),
                response
                    .request()
                    .extensions()
                    .get::<Session>()
                    .map(|s| format!("{:?}", s.0)),
            ),
            Err(err) => (err.as_response_error().status_code().as_u16(), None),
        };
        let peer = peer.map_or_else(|| "-".to_owned(), |peer| peer.ip().to_string());
        log::info!(
            "{peer} \"{line}\" {status} {:.3}ms session={}",
            started.elapsed().as_secs_f64() * 1e3,
            session.as_deref().unwrap_or("-")
        );
        response
    })
}
