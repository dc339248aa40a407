//! Fuzzes request decoding and chunk framing: any body either decodes or is
//! refused without panicking, and whatever text ends up in a chunk is framed
//! as exactly one SSE event.
#![no_main]

use chatgate::protocol::{is_valid_session_id, parse_reply, ChatRequest, Chunk, ChunkType};
use chatgate::sse::encode;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    let Ok(request) = serde_json::from_slice::<ChatRequest>(body) else {
        return;
    };
    let session = request
        .session_id
        .as_deref()
        .filter(|id| is_valid_session_id(id))
        .unwrap_or("s");
    let message = request.message.unwrap_or_default();
    let _ = parse_reply(&message);
    let chunk = Chunk::new(ChunkType::Content, message, session, 1).with_meta("echo", session);
    let framed = encode(&chunk);
    assert!(framed.starts_with(b"id: 1\ndata: {"));
    assert!(framed.ends_with(b"}\n\n"));
    assert_eq!(framed.iter().filter(|&&b| b == b'\n').count(), 3);
    assert!(!framed.contains(&b'\r'));
});
