//! What the probes and the metrics read of the runs: whether this process
//! is ready for new runs, and the run gauges.

use super::Runs;
use crate::metrics::RunGauges;

/// Why this process is not ready for new runs, first cause first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReady {
    /// The audit log (its path) cannot be written: nothing runs until it can.
    Audit(String),
    /// The store cannot be reached (its name and why).
    Store(String),
    /// The engine cannot answer (why).
    Engine(String),
    /// These MCP servers are not running (being restarted).
    Mcp(Vec<String>),
    /// Shutdown has started.
    ShuttingDown,
}

impl Runs {
    /// Ready for new runs, or the first reason not to be.
    pub fn readiness(&self) -> Result<(), NotReady> {
        if let Some(audit) = self.settings.audit.as_ref().filter(|a| !a.is_healthy()) {
            return Err(NotReady::Audit(audit.path().display().to_string()));
        }
        self.settings.store.health().map_err(NotReady::Store)?;
        self.engine.health().map_err(NotReady::Engine)?;
        let down = self.settings.tools.mcp_down();
        if !down.is_empty() {
            return Err(NotReady::Mcp(down));
        }
        if self.shutdown.is_cancelled() {
            return Err(NotReady::ShuttingDown);
        }
        Ok(())
    }

    /// The run gauges now: registered runs, paused ones, detached ones,
    /// and the pauses parked in the store (#46).
    pub async fn gauges(&self) -> RunGauges {
        let counts = self.manager.counts();
        let parked = match self.parks() {
            true => self
                .settings
                .store
                .parked_count()
                .await
                .unwrap_or_else(|err| {
                    ::log::debug!("parked pauses: {err}");
                    0
                }),
            false => 0,
        };
        RunGauges {
            active: counts.active,
            paused: counts.paused,
            detached: self.replays.detached(),
            parked: parked as usize,
        }
    }
}
