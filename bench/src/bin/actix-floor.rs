//! actix-floor: the least an actix-web server can spend on a held stream.
//!
//! Not chatgate: a reference server for `chatgate-bench paused --hold-only`.
//! Every `POST /api/v1/chat/stream` gets one SSE frame shaped like a
//! `confirmation_request` and then a body that never ends, with no state of
//! its own behind it. The server RSS per held stream it shows is what
//! actix-web itself costs (its HTTP/1 dispatcher keeps an 8 KiB read and an
//! 8 KiB write buffer per connection); chatgate's figure minus this one is
//! what chatgate adds. See docs/benchmarks.md.

use std::convert::Infallible;

use actix_web::{web, App, HttpResponse, HttpServer};
use clap::Parser;
use futures_util::{stream, StreamExt};

/// A bare actix-web server that holds every chat stream forever.
#[derive(Parser)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:18195")]
    bind: String,
}

const FRAME: &[u8] = b"id: 1\ndata: {\"chunk_type\":\"confirmation_request\",\
\"confirmation_data\":{\"confirmation_id\":\"00000000-0000-4000-8000-000000000000\"}}\n\n";

async fn hold() -> HttpResponse {
    let first = stream::once(async { Ok::<_, Infallible>(web::Bytes::from_static(FRAME)) });
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .streaming(first.chain(stream::pending()))
}

#[actix_web::main]
async fn main() -> std::io::Result<()> {
    let Args { bind } = Args::parse();
    HttpServer::new(|| {
        App::new()
            .route("/api/v1/chat/stream", web::post().to(hold))
            .route("/healthz", web::get().to(HttpResponse::Ok))
    })
    .tcp_nodelay(true)
    .bind(&bind)?
    .run()
    .await
}
