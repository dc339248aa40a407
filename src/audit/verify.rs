//! `chatgate audit verify FILE...`: walks the hash chain of audit files,
//! in the order given (a rotated log: oldest first), and names the first
//! line that breaks it.

use std::fmt;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::chain::{self, sha256_hex};

/// The longest line `verify` reads: chatgate's own records are far
/// shorter (a plan is at most 128 KiB, its previews 256 KiB).
pub const MAX_LINE_BYTES: usize = 16 << 20;

/// The first line that breaks the chain: its file, its line number (from
/// 1), and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broken {
    pub file: PathBuf,
    pub line: usize,
    pub why: String,
}

impl fmt::Display for Broken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file.display(), self.why)
        } else {
            write!(
                f,
                "{} line {}: {}",
                self.file.display(),
                self.line,
                self.why
            )
        }
    }
}

/// Checks `files` as one chain, in order; the number of records.
///
/// Every line must be a JSON object whose `hash` matches its content and
/// whose `prev_hash` is the hash of the line before it (the previous
/// file's last line for a file's first). The very first line's
/// `prev_hash` is taken as given: 64 zeros for a log that started empty,
/// else the last line of a file rotated away and not given.
pub fn verify(files: &[PathBuf]) -> Result<usize, Broken> {
    let mut records = 0;
    let mut expected: Option<String> = None;
    for file in files {
        let broken = |line: usize, why: String| Broken {
            file: file.clone(),
            line,
            why,
        };
        let mut reader = open(file).map_err(|err| broken(0, format!("cannot be read: {err}")))?;
        let mut line = Vec::new();
        for number in 1.. {
            line.clear();
            // At most MAX_LINE_BYTES (and its newline) of one line are held.
            let read = std::io::Read::take(&mut reader, MAX_LINE_BYTES as u64 + 1)
                .read_until(b'\n', &mut line)
                .map_err(|err| broken(number, format!("cannot be read: {err}")))?;
            if read == 0 {
                break;
            }
            if line.last() == Some(&b'\n') {
                line.pop();
            } else if line.len() > MAX_LINE_BYTES {
                return Err(broken(
                    number,
                    format!("longer than {} MiB: not a record", MAX_LINE_BYTES >> 20),
                ));
            }
            let prev = check_line(&line).map_err(|why| broken(number, why.to_owned()))?;
            if let Some(expected) = &expected {
                if prev != *expected {
                    return Err(broken(
                        number,
                        "its prev_hash does not name the line before it (a record was removed, added or moved)"
                            .to_owned(),
                    ));
                }
            }
            expected = Some(sha256_hex(&line));
            records += 1;
        }
    }
    Ok(records)
}

fn open(file: &Path) -> std::io::Result<std::io::BufReader<std::fs::File>> {
    Ok(std::io::BufReader::with_capacity(
        64 * 1024,
        std::fs::File::open(file)?,
    ))
}

/// One line on its own: a record whose hash matches; its `prev_hash`.
fn check_line(line: &[u8]) -> Result<String, &'static str> {
    let Ok(Value::Object(record)) = serde_json::from_slice::<Value>(line) else {
        return Err("not a record (not one JSON object)");
    };
    let Some(Value::String(prev)) = record.get("prev_hash") else {
        return Err("not a chained record (no prev_hash)");
    };
    if !chain::hash_matches(line) {
        return Err("the record was changed (its hash does not match its content)");
    }
    Ok(prev.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_chain(path: &Path, first_prev: &str, n: usize) -> String {
        let mut prev = first_prev.to_owned();
        let mut text = String::new();
        for i in 0..n {
            let (line, hash) = chain::seal(
                format!("{{\"event\":\"ended\",\"run_id\":{i}}}").as_bytes(),
                &prev,
            );
            text.push_str(std::str::from_utf8(&line).unwrap());
            text.push('\n');
            prev = hash;
        }
        std::fs::write(path, text).unwrap();
        prev
    }

    #[test]
    fn a_chain_verifies_across_files_and_a_removed_line_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let (one, two) = (dir.path().join("1.jsonl"), dir.path().join("2.jsonl"));
        let last = write_chain(&one, chain::GENESIS, 3);
        write_chain(&two, &last, 2);

        assert_eq!(verify(&[one.clone(), two.clone()]), Ok(5));
        // Out of order: the second file's first line names another.
        let err = verify(&[two.clone(), one.clone()]).unwrap_err();
        assert_eq!((err.file.clone(), err.line), (one.clone(), 1), "{err}");

        let text = std::fs::read_to_string(&one).unwrap();
        let kept: Vec<&str> = text
            .lines()
            .enumerate()
            .filter(|(i, _)| *i != 1)
            .map(|(_, l)| l)
            .collect();
        std::fs::write(&one, kept.join("\n") + "\n").unwrap();
        let err = verify(std::slice::from_ref(&one)).unwrap_err();
        assert_eq!(err.line, 2, "{err}");
        assert!(
            err.to_string().contains("1.jsonl line 2: its prev_hash"),
            "{err}"
        );
    }

    #[test]
    fn a_line_past_the_bound_is_named_not_held() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.jsonl");
        write_chain(&path, chain::GENESIS, 1);
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(&"x".repeat(MAX_LINE_BYTES + 1));
        std::fs::write(&path, text).unwrap();
        let err = verify(&[path]).unwrap_err();
        assert_eq!(err.line, 2);
        assert!(err.why.contains("longer than 16 MiB"), "{err}");
    }

    #[test]
    fn a_line_that_is_not_a_record_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.jsonl");
        write_chain(&path, chain::GENESIS, 2);
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("not json\n");
        std::fs::write(&path, text).unwrap();
        let err = verify(&[path]).unwrap_err();
        assert_eq!(err.line, 3);
        assert!(err.why.starts_with("not a record"), "{err}");
    }
}
