//! `--webhook-receiver`: a webhook receiver on loopback for the server the
//! bench starts. It answers every POST 200 at once and counts them, so a
//! scenario shows what webhooks cost the server (run it with and without)
//! and how many events per second a receiver gets.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The secret the bench's server signs with (the receiver does not check).
pub const SECRET: &str = "chatgate-bench-webhook-secret";

#[derive(Default)]
struct Counts {
    events: AtomicU64,
    first: Mutex<Option<Instant>>,
    last: Mutex<Option<Instant>>,
}

pub struct Receiver {
    pub url: String,
    counts: Arc<Counts>,
}

impl Receiver {
    pub fn start() -> io::Result<Receiver> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let url = format!("http://{}/hook", listener.local_addr()?);
        let counts = Arc::new(Counts::default());
        let shared = counts.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let counts = shared.clone();
                std::thread::spawn(move || serve(stream, &counts));
            }
        });
        Ok(Receiver { url, counts })
    }

    /// The server arguments that send every event here.
    pub fn server_args(&self) -> Vec<String> {
        vec![
            "--webhook".into(),
            self.url.clone(),
            "--webhook-secret".into(),
            SECRET.into(),
        ]
    }

    pub fn events(&self) -> u64 {
        self.counts.events.load(Ordering::Relaxed)
    }

    /// Waits until no event has come for 1 s (at most 30 s); prints how
    /// many came, over how long, and how long after `ended` the last did.
    pub fn report(&self, ended: Instant) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut seen = self.events();
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_secs(1));
            let now = self.events();
            if now == seen {
                break;
            }
            seen = now;
        }
        let first = *self.counts.first.lock().unwrap();
        let last = *self.counts.last.lock().unwrap();
        let (Some(first), Some(last)) = (first, last) else {
            println!("webhooks    no event arrived");
            return;
        };
        let span = last.duration_since(first).as_secs_f64().max(1e-3);
        let lag = last.saturating_duration_since(ended).as_millis();
        println!(
            "webhooks    {seen} events in {span:.1}s: {:.0} events/s; the last {lag} ms after the scenario ended",
            seen as f64 / span
        );
    }
}

/// Reads requests off one kept-alive connection and answers each 200.
fn serve(stream: TcpStream, counts: &Counts) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        let mut length = 0usize;
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if line == "\r\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let now = Instant::now();
        counts.first.lock().unwrap().get_or_insert(now);
        *counts.last.lock().unwrap() = Some(now);
        counts.events.fetch_add(1, Ordering::Relaxed);
        if writer
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            .is_err()
        {
            return;
        }
    }
}
