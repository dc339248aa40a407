//! Helpers shared by the test crates: the real binary on a free port, and
//! a process's resident memory.
#![allow(dead_code)] // Each test crate uses a part.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

/// The `chatgate` binary, running on a free loopback port; killed on drop.
pub struct Binary {
    pub child: Child,
    /// `http://127.0.0.1:PORT`
    pub url: String,
    /// What it logged after its address, line by line.
    pub logs: Arc<Mutex<Vec<String>>>,
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the binary with `args` (after `--bind 127.0.0.1:0`) and waits for
/// the address it logs.
pub fn start_binary(args: &[&str]) -> Binary {
    start_binary_on("127.0.0.1:0", args)
}

/// Starts the binary bound to `bind` with `args`.
pub fn start_binary_on(bind: &str, args: &[&str]) -> Binary {
    start(&[], bind, args)
}

/// Starts the binary with `args` through `prefix` (a program that execs the
/// rest of its command line, such as `prlimit ... --`).
pub fn start_binary_with_prefix(prefix: &[&str], args: &[&str]) -> Binary {
    start(prefix, "127.0.0.1:0", args)
}

fn start(prefix: &[&str], bind: &str, args: &[&str]) -> Binary {
    let binary = env!("CARGO_BIN_EXE_chatgate");
    let mut command = match prefix.split_first() {
        Some((program, rest)) => {
            let mut command = Command::new(program);
            command.args(rest).arg(binary);
            command
        }
        None => Command::new(binary),
    };
    let mut child = command
        .args(["--bind", bind])
        .args(args)
        .env("RUST_LOG", "warn,chatgate=info")
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary starts");
    let mut lines = BufReader::new(child.stderr.take().expect("piped")).lines();
    let url = loop {
        let line = lines
            .next()
            .expect("the binary logs its address")
            .expect("UTF-8 log");
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest
                .split_whitespace()
                .next()
                .expect("an address")
                .to_owned();
        }
    };
    let logs = Arc::new(Mutex::new(Vec::new()));
    let kept = logs.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            kept.lock().unwrap().push(line);
        }
    });
    Binary { child, url, logs }
}

/// Resident memory of process `pid` (`"self"` for this one), in KiB.
pub fn rss_kib(pid: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("procfs");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS in /proc/<pid>/status")
}
