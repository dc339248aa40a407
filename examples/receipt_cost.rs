//! What #43 adds to a call, measured in-process (docs/benchmarks.md,
//! "Receipts and the audit chain"): signing one receipt, and chaining one
//! audit line (its `prev_hash` and `hash`).
//!
//!     cargo run --release --example receipt_cost [N]

use std::time::Instant;

use chatgate::audit::chain::{seal, GENESIS};
use chatgate::receipt::{call_digest, Receipt, ReceiptKeys, TaskClaim, Via};
use serde_json::json;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(20_000);
    let keys = ReceiptKeys::new(&[], "https://gate.example".to_owned()).unwrap();
    let args = json!({"step": "deploy web to prod", "replicas": 3, "region": "eu-west"});
    let receipt = |i: usize| Receipt {
        iss: keys.issuer().to_owned(),
        confirmation_id: Some("5f0f1c2e-8d3b-4a57-9c1e-0b6a7d2e4f10".to_owned()),
        session_id: format!("session-{i}"),
        round: 1,
        task: TaskClaim {
            index: 1,
            tool: "deploy".to_owned(),
            args_digest: call_digest("deploy", &args),
            preview_digest: None,
        },
        approved_by: vec!["lead-1".to_owned(), "lead-2".to_owned()],
        via: Via::Chat,
        decided_at: "2026-11-29T06:00:00.000Z".to_owned(),
        idempotency_key: None,
    };
    // Warm up, then time building and signing, as a call does.
    for i in 0..1000 {
        std::hint::black_box(keys.sign(&receipt(i)));
    }
    let started = Instant::now();
    let mut bytes = 0;
    for i in 0..n {
        bytes += std::hint::black_box(keys.sign(&receipt(i))).len();
    }
    let per_receipt = started.elapsed().as_secs_f64() * 1e6 / n as f64;
    println!(
        "receipt: {per_receipt:.1} µs per call (digest, payload, Ed25519 signature), {} bytes each",
        bytes / n
    );

    let line = br#"{"action":"confirm","at":"2026-11-22T22:05:17.075Z","client":"127.0.0.1","confirmation_id":"5f0f1c2e-8d3b-4a57-9c1e-0b6a7d2e4f10","decisions":[{"decision":"approve","index":1}],"event":"decided","key":"anonymous","round":1,"run_id":0,"session_id":"24d1"}"#;
    let started = Instant::now();
    let mut prev = GENESIS.to_owned();
    for _ in 0..n {
        let (sealed, hash) = seal(std::hint::black_box(line), &prev);
        std::hint::black_box(sealed);
        prev = hash;
    }
    let per_line = started.elapsed().as_secs_f64() * 1e6 / n as f64;
    println!(
        "audit chain: {per_line:.2} µs per line of {} bytes (prev_hash and hash)",
        line.len()
    );
}
