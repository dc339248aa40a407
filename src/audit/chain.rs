//! The audit log's hash chain (#43): every line names the line before it.
//!
//! A line is the record's JSON with two fields added at its end:
//! `prev_hash`, the lower-case hex SHA-256 of the previous line's bytes (its
//! JSON without the newline), and `hash`, the SHA-256 of the line's own bytes
//! up to `prev_hash` (the line with `,"hash":"…"` cut off), so that a changed
//! last line shows too. The first line of a new file names the last line
//! written before it, in the file rotated away, or [`GENESIS`] (64 zeros)
//! when the log starts empty.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// The `prev_hash` of a log's first line.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// What a line ends with after its content: `,"hash":"` + 64 hex + `"}`.
const HASH_OPEN: &[u8] = b",\"hash\":\"";
const HASH_SUFFIX_LEN: usize = HASH_OPEN.len() + 64 + 2;

/// Where the chain stands: the file the last line went to, the length it
/// left, and that line's hash.
#[derive(Debug, Clone)]
pub(super) struct Tail {
    pub dev: u64,
    pub ino: u64,
    pub len: u64,
    pub hash: String,
}

impl Tail {
    /// The `prev_hash` of a line written now to `file` (this `dev`, `ino`,
    /// `len`): the last line this writer wrote when the file is as it left
    /// it, or it is a new file (the log was rotated away); else the file's
    /// own last line (another writer appended, or the file was replaced).
    pub fn prev_hash(
        tail: Option<&Tail>,
        file: &File,
        dev: u64,
        ino: u64,
        len: u64,
    ) -> std::io::Result<String> {
        match tail {
            Some(t) if t.dev == dev && t.ino == ino && t.len == len => Ok(t.hash.clone()),
            Some(t) if len == 0 => Ok(t.hash.clone()),
            _ => Ok(last_line_hash(file, len)?.unwrap_or_else(|| GENESIS.to_owned())),
        }
    }
}

/// `record` (a JSON object's bytes) as a chained line, without its newline,
/// and the line's hash (the next line's `prev_hash`).
pub fn seal(record: &[u8], prev_hash: &str) -> (Vec<u8>, String) {
    let open = record.strip_suffix(b"}").unwrap_or(record);
    let comma = if open.len() > 1 { "," } else { "" };
    let mut line = Vec::with_capacity(record.len() + 32 + 64 + HASH_SUFFIX_LEN);
    line.extend_from_slice(open);
    line.extend_from_slice(format!("{comma}\"prev_hash\":\"{prev_hash}\"}}").as_bytes());
    let own = sha256_hex(&line);
    line.pop();
    line.extend_from_slice(HASH_OPEN);
    line.extend_from_slice(own.as_bytes());
    line.extend_from_slice(b"\"}");
    let hash = sha256_hex(&line);
    (line, hash)
}

/// Whether `line`'s `hash` matches its content (see the module's docs).
pub fn hash_matches(line: &[u8]) -> bool {
    let Some(cut) = line.len().checked_sub(HASH_SUFFIX_LEN) else {
        return false;
    };
    let (content, suffix) = line.split_at(cut);
    let Some(own) = suffix
        .strip_prefix(HASH_OPEN)
        .and_then(|rest| rest.strip_suffix(b"\"}"))
    else {
        return false;
    };
    let mut sealed = content.to_vec();
    sealed.push(b'}');
    own == sha256_hex(&sealed).as_bytes()
}

/// The hash of `file`'s last line (of its first `len` bytes), read from
/// the end; `None` for an empty file.
pub(super) fn last_line_hash(file: &File, len: u64) -> std::io::Result<Option<String>> {
    // The last line ends before the final newline.
    let end = if len > 0 && read_byte(file, len - 1)? == b'\n' {
        len - 1
    } else {
        len
    };
    if end == 0 {
        return Ok(None);
    }
    let mut start = end;
    let mut chunk = vec![0u8; 8192];
    'back: while start > 0 {
        let take = (start as usize).min(chunk.len());
        let from = start - take as u64;
        file.read_exact_at(&mut chunk[..take], from)?;
        for i in (0..take).rev() {
            if chunk[i] == b'\n' {
                start = from + i as u64 + 1;
                break 'back;
            }
        }
        start = from;
    }
    // Hashed as it is read, 8 KiB at a time: a line of any length costs
    // no more memory than that.
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    let mut at = start;
    while at < end {
        let take = ((end - at) as usize).min(chunk.len());
        file.read_exact_at(&mut chunk[..take], at)?;
        hasher.update(&chunk[..take]);
        at += take as u64;
    }
    Ok(Some(hex::encode(hasher.finalize())))
}

fn read_byte(file: &File, at: u64) -> std::io::Result<u8> {
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, at)?;
    Ok(byte[0])
}

/// The SHA-256 of `bytes`, in lower-case hex: how a record names an output
/// (and a store a key) without holding it.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_line_checks_and_any_changed_byte_does_not() {
        let (line, hash) = seal(br#"{"event":"ended","run_id":1}"#, GENESIS);
        let text = String::from_utf8(line.clone()).unwrap();
        assert!(
            text.starts_with(r#"{"event":"ended","run_id":1,"prev_hash":"000"#),
            "{text}"
        );
        assert!(hash_matches(&line));
        assert_eq!(hash, sha256_hex(&line));
        let value: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(value["prev_hash"], GENESIS);
        for at in 0..line.len() {
            let mut changed = line.clone();
            changed[at] ^= 0x01;
            assert!(!hash_matches(&changed), "byte {at} changed unseen");
        }
    }

    #[test]
    fn the_last_line_of_a_file_is_read_from_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.jsonl");
        let long = "x".repeat(20_000);
        std::fs::write(&path, format!("first\n{long}\n")).unwrap();
        let file = File::open(&path).unwrap();
        let len = file.metadata().unwrap().len();
        assert_eq!(
            last_line_hash(&file, len).unwrap(),
            Some(sha256_hex(long.as_bytes()))
        );
        std::fs::write(&path, "").unwrap();
        assert_eq!(
            last_line_hash(&File::open(&path).unwrap(), 0).unwrap(),
            None
        );
        // No newline at its end, and longer than a chunk.
        std::fs::write(&path, format!("a\n{long}")).unwrap();
        let file = File::open(&path).unwrap();
        let len = file.metadata().unwrap().len();
        assert_eq!(
            last_line_hash(&file, len).unwrap(),
            Some(sha256_hex(long.as_bytes()))
        );
    }
}
