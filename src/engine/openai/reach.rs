//! Whether the model server can be reached, so that a server started with
//! `--engine openai` and no model server behind it says so: in its log at
//! start, and on `/readyz` (503 `engine_unavailable`) until it can.
//!
//! Looked at by a connection to the base URL's host and port, at start and
//! every [`PROBE_EVERY`] (a task that ends with the engine), and by every
//! model call: one that cannot connect marks it down, one that is answered
//! marks it up.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Time between two looks at the model server.
pub const PROBE_EVERY: Duration = Duration::from_secs(5);
/// How long a look waits for its connection.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The model server's reach, shared by the engine and its prober.
#[derive(Debug)]
pub struct Reach {
    /// `scheme://host:port`, for what is said (never the whole URL).
    origin: String,
    down: AtomicBool,
}

impl Reach {
    /// Starts looking at `base_url`'s server on `runtime`.
    pub fn watch(base_url: &str, runtime: &tokio::runtime::Handle) -> Arc<Reach> {
        let reach = Arc::new(Reach {
            origin: crate::redact::origin(base_url),
            down: AtomicBool::new(false),
        });
        let address = reqwest::Url::parse(base_url).ok().and_then(|url| {
            Some(format!(
                "{}:{}",
                url.host_str()?,
                url.port_or_known_default()?
            ))
        });
        if let Some(address) = address {
            runtime.spawn(probe_until_gone(Arc::downgrade(&reach), address));
        }
        reach
    }

    /// `Err` (what to say) while the model server cannot be reached.
    pub fn health(&self) -> Result<(), String> {
        if self.down.load(Ordering::Relaxed) {
            Err(format!(
                "the model server at {} cannot be reached",
                self.origin
            ))
        } else {
            Ok(())
        }
    }

    /// What a model call (or a look) found; a change is logged.
    pub fn set(&self, reached: bool) {
        let was_down = self.down.swap(!reached, Ordering::Relaxed);
        if was_down && reached {
            log::info!("the model server at {} is reachable again", self.origin);
        } else if !was_down && !reached {
            log::warn!(
                "the model server at {} cannot be reached: runs end engine_unavailable and \
                 /readyz answers 503 until it can",
                self.origin
            );
        }
    }
}

async fn probe_until_gone(reach: Weak<Reach>, address: String) {
    loop {
        let reached = matches!(
            tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(&address)).await,
            Ok(Ok(_))
        );
        match reach.upgrade() {
            Some(reach) => reach.set(reached),
            None => return,
        }
        tokio::time::sleep(PROBE_EVERY).await;
    }
}
