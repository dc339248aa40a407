//! Server-Sent-Events framing: the only place that writes `id:`/`data:`
//! lines. Bytes in, bytes out: no HTTP here (the responses that carry these
//! frames are [`crate::http::event_stream`]'s).

use std::cell::RefCell;
use std::io::Write;

use bytes::Bytes;

use crate::protocol::Chunk;

/// The SSE comment written while a stream is idle.
pub const KEEP_ALIVE_COMMENT: &[u8] = b": keep-alive\n\n";

/// What a suspended run's stream ends with: come back in a second (SSE's
/// `retry:` field); then the connection closes without a final chunk.
pub fn retry_trailer() -> Bytes {
    Bytes::from_static(b"retry: 1000\n\n")
}

/// Frames one chunk as `id: <sequence>\ndata: <json>\n\n`. serde_json escapes
/// every control character inside strings, so the JSON is always one line and
/// no message text can forge an extra event.
///
/// The frame is built in a per-thread scratch buffer and copied out at its
/// exact size: a run's replay buffer holds its frames for the whole pause, so a
/// frame must not carry the spare capacity of a growing `Vec`.
pub fn encode(chunk: &Chunk) -> Bytes {
    thread_local! {
        static SCRATCH: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(SCRATCH_CAPACITY));
    }
    SCRATCH.with_borrow_mut(|buf| {
        buf.clear();
        // Writing into a Vec cannot fail, and a Chunk (string keys, plain
        // values) always serializes.
        write!(buf, "id: {}\ndata: ", chunk.sequence).expect("write to Vec");
        serde_json::to_writer(&mut *buf, chunk).expect("Chunk serializes");
        buf.extend_from_slice(b"\n\n");
        let frame = Bytes::copy_from_slice(buf);
        // One huge chunk must not pin its capacity to this thread for good.
        if buf.capacity() > MAX_SCRATCH_CAPACITY {
            *buf = Vec::with_capacity(SCRATCH_CAPACITY);
        }
        frame
    })
}

/// The JSON of a frame [`encode`] wrote (its one `data:` line), for the
/// reader that needs the chunk back (the inbox lists a pause's request as
/// its run sent it).
pub fn data_of(frame: &[u8]) -> Option<&[u8]> {
    const DATA: &[u8] = b"\ndata: ";
    let start = memchr::memmem::find(frame, DATA)? + DATA.len();
    let end = frame.strip_suffix(b"\n\n")?.len();
    frame.get(start..end)
}

/// Scratch capacity a thread starts with, enough for most frames.
const SCRATCH_CAPACITY: usize = 4096;
/// Scratch capacity a thread keeps between frames.
const MAX_SCRATCH_CAPACITY: usize = 64 * 1024;

/// The frame with `"gap":true` put first into its `metadata` object.
pub fn with_gap(frame: &Bytes) -> Bytes {
    with_meta_first(frame, b"\"gap\":true")
}

/// The frame with `field` (`"key":value`, JSON) put first into its
/// `metadata` object (a key written twice: JSON readers take the last, so
/// the chunk's own value, if it has one, stands).
///
/// No re-parsing (which could fail, on deep nesting say, and lose it):
/// `metadata` is the first object-valued field of a chunk, and the text of
/// the string fields before it is JSON-escaped, so it has no bare `"` and
/// cannot contain the key; the first `"metadata":{` is always the real one.
pub fn with_meta_first(frame: &Bytes, field: &[u8]) -> Bytes {
    const KEY: &[u8] = b"\"metadata\":{";
    let Some(at) = memchr::memmem::find(frame, KEY) else {
        // Every frame is an encoded chunk; kept for the type's sake.
        return frame.clone();
    };
    let open = at + KEY.len();
    let comma: &[u8] = if frame.get(open) == Some(&b'}') {
        b""
    } else {
        b","
    };
    let mut out = Vec::with_capacity(frame.len() + field.len() + 1);
    out.extend_from_slice(&frame[..open]);
    out.extend_from_slice(field);
    out.extend_from_slice(comma);
    out.extend_from_slice(&frame[open..]);
    Bytes::from(out)
}

/// The frame as sequence `sequence`: its `id:` line and the chunk's
/// `sequence`, which ends the chunk's JSON (the struct's last field), both
/// rewritten; nothing else is touched.
pub fn renumber(frame: &Bytes, sequence: u64) -> Bytes {
    const FIELD: &[u8] = b"\"sequence\":";
    let (Some(line_end), Some(field)) = (
        memchr::memchr(b'\n', frame),
        memchr::memmem::rfind(frame, FIELD),
    ) else {
        // Every frame is an encoded chunk; kept for the type's sake.
        return frame.clone();
    };
    let digits = field + FIELD.len();
    let digits_end = digits
        + frame[digits..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
    let mut out = Vec::with_capacity(frame.len() + 8);
    write!(out, "id: {sequence}").expect("write to Vec");
    out.extend_from_slice(&frame[line_end..digits]);
    write!(out, "{sequence}").expect("write to Vec");
    out.extend_from_slice(&frame[digits_end..]);
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::ChunkType;

    #[test]
    fn a_renumbered_frame_changes_its_id_and_sequence_only() {
        let chunk = Chunk::new(ChunkType::Status, "\"sequence\":5 in the text", "s", 5);

        let frame = renumber(&encode(&chunk), 42);

        let text = std::str::from_utf8(&frame).unwrap();
        assert!(text.starts_with("id: 42\ndata: {"), "{text}");
        let json = text.trim_end().strip_prefix("id: 42\ndata: ").unwrap();
        let back: Chunk = serde_json::from_str(json).unwrap();
        assert_eq!(back.sequence, 42);
        assert_eq!(back.chunk, chunk.chunk);
    }

    #[test]
    fn a_frame_s_data_is_its_chunk() {
        let chunk = Chunk::new(ChunkType::Content, "\ndata: {} in the text", "s", 3);

        let frame = encode(&chunk);
        let back: Chunk = serde_json::from_slice(data_of(&frame).unwrap()).unwrap();

        assert_eq!(back, chunk);
        assert_eq!(data_of(b"id: 1\n\n"), None);
    }

    #[test]
    fn a_chunk_is_one_id_line_and_one_data_line() {
        let chunk = Chunk::new(ChunkType::Content, "a\n\ndata: {\"x\":1}\r\n", "s", 7);

        let framed = String::from_utf8(encode(&chunk).to_vec()).unwrap();

        assert!(framed.starts_with("id: 7\ndata: {"), "{framed}");
        assert!(framed.ends_with("}\n\n"));
        assert_eq!(framed.matches('\n').count(), 3, "{framed}");
        assert!(!framed.contains('\r'));
        let json = framed.trim_end().strip_prefix("id: 7\ndata: ").unwrap();
        let back: Chunk = serde_json::from_str(json).unwrap();
        assert_eq!(back, chunk);
    }
}
