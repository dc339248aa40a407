//! One log line per request, written when the response head is ready.
//!
//! actix-web's `Logger` writes its line when the response *body* ends, and
//! keeps a copy of its format and a body wrapper alive until then: for a
//! paused stream that is the whole pause, about 0.9 KiB per run for a line
//! nobody sees until the run ends. A stream's end is the run's business
//! (`run ended with ...` at debug level). The body, and so the message text,
//! is never logged.

use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::Error;
use futures_util::future::LocalBoxFuture;

/// Logs `<peer> "<method> <path> <version>" <status> <ms>ms` at info level.
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
        let line = format!("{} {} {:?}", req.method(), req.path(), req.version());
        let response = next.call(req).await;
        let status = match &response {
            Ok(response) => response.status().as_u16(),
            Err(err) => err.as_response_error().status_code().as_u16(),
        };
        let peer = peer.map_or_else(|| "-".to_owned(), |peer| peer.ip().to_string());
        log::info!(
            "{peer} \"{line}\" {status} {:.3}ms",
            started.elapsed().as_secs_f64() * 1e3
        );
        response
    })
}
