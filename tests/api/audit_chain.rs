//! The tamper-evident audit log (#43): every line names the line before it,
//! across a restart and a rotation, and `chatgate audit verify` names the
//! first line that breaks the chain.

use std::path::Path;

use chatgate::protocol::ChunkType;
use sha2::{Digest, Sha256};

use crate::tools::{app_with_tools, Workdir};

/// Runs `chatgate audit verify FILES...`: exit code and stdout.
fn verify(files: &[&Path]) -> (i32, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_chatgate"))
        .arg("audit")
        .arg("verify")
        .args(files)
        .output()
        .unwrap();
    (
        output.status.code().unwrap(),
        String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr),
    )
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn prev_hash(line: &str) -> String {
    let record: serde_json::Value = serde_json::from_str(line).unwrap();
    record["prev_hash"].as_str().unwrap().to_owned()
}

async fn one_flow(app: &crate::helpers::TestApp, audit: &Path, session: &str) {
    let (mut stream, _) = app.open_paused(session, "note buy milk; then rest").await;
    let (status, _) = app.reply(session, "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200);
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    crate::durable::ended_trail(audit, session).await;
}

#[tokio::test]
async fn the_chain_holds_across_a_restart_and_a_rotation_and_verifies() {
    let dir = Workdir::new();
    let audit = dir.path("audit.jsonl");
    let first = app_with_tools(&dir, "", |_| {}).await;
    one_flow(&first, &audit, "chain-1").await;
    drop(first);
    // Started again on the same file: the chain goes on from its last line.
    let app = app_with_tools(&dir, "", |_| {}).await;
    one_flow(&app, &audit, "chain-2").await;
    let before = lines(&audit);
    assert_eq!(
        prev_hash(&before[0]),
        "0".repeat(64),
        "a new log starts at 64 zeros"
    );
    for pair in before.windows(2) {
        assert_eq!(
            prev_hash(&pair[1]),
            hex::encode(Sha256::digest(pair[0].as_bytes()))
        );
    }

    // Rotated away while the server runs: the new file's first line names
    // the old file's last.
    let rotated = dir.path("audit.jsonl.1");
    std::fs::rename(&audit, &rotated).unwrap();
    one_flow(&app, &audit, "chain-3").await;
    let after = lines(&audit);
    assert_eq!(
        prev_hash(&after[0]),
        hex::encode(Sha256::digest(before.last().unwrap().as_bytes()))
    );

    let (code, out) = verify(&[&rotated, &audit]);
    assert_eq!(
        (code, out.trim()),
        (
            0,
            format!("OK: {} records", before.len() + after.len()).as_str()
        )
    );
    // The files out of order break the chain at the old file's first line.
    let (code, out) = verify(&[&audit, &rotated]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("audit.jsonl.1 line 1"), "{out}");
}

#[tokio::test]
async fn one_changed_byte_fails_verify_naming_its_line() {
    let dir = Workdir::new();
    let audit = dir.path("audit.jsonl");
    let app = app_with_tools(&dir, "", |_| {}).await;
    one_flow(&app, &audit, "tamper").await;
    let original = std::fs::read(&audit).unwrap();
    let count = lines(&audit).len();
    assert!(count >= 4, "proposed, decided, executed, ended");
    assert_eq!(verify(&[&audit]), (0, format!("OK: {count} records\n")));

    // One byte of each line in turn, the last line's included: each is
    // named by its own line number.
    let starts: Vec<usize> = std::iter::once(0)
        .chain(
            original
                .iter()
                .enumerate()
                .filter(|(_, b)| **b == b'\n')
                .map(|(i, _)| i + 1),
        )
        .take(count)
        .collect();
    for (number, start) in starts.iter().enumerate() {
        let text = String::from_utf8(original.clone()).unwrap();
        let line = &text[*start..text[*start..].find('\n').unwrap() + start];
        // A digit of the run's id or a letter of the event: still JSON.
        let at = start + line.find("\"event\":\"").unwrap() + 9;
        let mut changed = original.clone();
        changed[at] = if changed[at] == b'x' { b'y' } else { b'x' };
        std::fs::write(&audit, &changed).unwrap();
        let (code, out) = verify(&[&audit]);
        assert_eq!(code, 1, "{out}");
        assert!(
            out.contains(&format!(
                "audit.jsonl line {}: the record was changed",
                number + 1
            )),
            "{out}"
        );
    }

    // A line taken out: the next one is named.
    let text = String::from_utf8(original).unwrap();
    let kept: Vec<&str> = text
        .lines()
        .enumerate()
        .filter(|(i, _)| *i != 1)
        .map(|(_, l)| l)
        .collect();
    std::fs::write(&audit, kept.join("\n") + "\n").unwrap();
    let (code, out) = verify(&[&audit]);
    assert_eq!(code, 1);
    assert!(
        out.contains("audit.jsonl line 2: its prev_hash does not name the line before it"),
        "{out}"
    );

    // No file at all, or none given.
    let (code, out) = verify(&[&dir.path("missing.jsonl")]);
    assert_eq!(code, 1);
    assert!(out.contains("missing.jsonl: cannot be read"), "{out}");
    assert_eq!(verify(&[]).0, 2);
}
