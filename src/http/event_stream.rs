//! The chat endpoint's responses: every one, success or error, goes
//! through [`stream_response`] (a live run) or [`single_chunk`] (a
//! one-chunk answer), so both carry the same headers and the framing of
//! [`crate::sse`].

use std::convert::Infallible;

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, HttpResponseBuilder};
use bytes::Bytes;
use futures_util::Stream;

use crate::protocol::Chunk;
use crate::sse::encode;

fn builder(status: StatusCode) -> HttpResponseBuilder {
    let mut builder = HttpResponse::build(status);
    builder
        .insert_header((header::CONTENT_TYPE, "text/event-stream; charset=utf-8"))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header(("X-Accel-Buffering", "no"));
    builder
}

/// A complete stream of exactly one chunk, number 1 (errors and reply
/// acknowledgements).
pub fn single_chunk(status: StatusCode, mut chunk: Chunk) -> HttpResponse {
    chunk.sequence = 1;
    builder(status).body(encode(&chunk))
}

/// A live stream: the body is a run's [`crate::run::stream::Subscription`].
pub fn stream_response<S>(body: S) -> HttpResponse
where
    S: Stream<Item = Result<Bytes, Infallible>> + 'static,
{
    builder(StatusCode::OK).streaming(body)
}

/// A complete stream of frames written before (the AG-UI face's answers
/// that need no run: a refusal, an interrupt again).
pub fn frames(status: StatusCode, body: Bytes) -> HttpResponse {
    builder(status).body(body)
}
