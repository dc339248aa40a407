//! Fuzzes request decoding and validation as the handler does them, and
//! chunk framing: any body either becomes a `ValidRequest` or is refused
//! without panicking, and whatever text ends up in a chunk is framed as
//! exactly one SSE event.
#![no_main]

use chatgate::protocol::{ChatRequest, Chunk, ChunkType, ValidRequest};
use chatgate::sse::encode;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte says how many of the next bytes are a Last-Event-ID
    // header value (0: none), as the handler would pass it.
    let (header, body) = match data.split_first() {
        Some((&n, rest)) if n > 0 && usize::from(n % 24) <= rest.len() => {
            let (header, body) = rest.split_at(usize::from(n % 24));
            (Some(header), body)
        }
        Some((_, rest)) => (None, rest),
        None => return,
    };
    let Ok(request) = serde_json::from_slice::<ChatRequest>(body) else {
        return;
    };
    let Ok(valid) = request.validate(header) else {
        return;
    };
    let (session, text) = match valid {
        ValidRequest::Chat {
            session_id,
            message,
        } => (session_id.unwrap_or_default(), message),
        ValidRequest::Reply {
            session_id, reply, ..
        } => (session_id, reply.text.unwrap_or_default()),
        ValidRequest::Reattach { session_id, .. } => (session_id, String::new()),
    };
    let chunk = Chunk::new(ChunkType::Content, text, &session, 1).with_meta("echo", session.as_str());
    let framed = encode(&chunk);
    assert!(framed.starts_with(b"id: 1\ndata: {"));
    assert!(framed.ends_with(b"}\n\n"));
    assert_eq!(framed.iter().filter(|&&b| b == b'\n').count(), 3);
    assert!(!framed.contains(&b'\r'));
});
