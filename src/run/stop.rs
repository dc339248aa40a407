//! A run's stop: a token that tells the run to end, and why.
//!
//! A run's stop is a child of the server's shutdown token, so a run waits on
//! one token for every reason to stop; a stop that comes from shutdown
//! carries no reason of its own and reads as `Shutdown`. Whoever stops a run
//! names the cause (a slow client, a detach grace that ended), and the first
//! cause given is the one the run reports.

use std::sync::{Arc, OnceLock};

use tokio_util::sync::CancellationToken;

use crate::protocol::CancelReason;

/// Tells a run to stop, and why. The first reason given wins.
///
/// A run's stop is a child of the server's shutdown token, so a run waits on
/// one token for every reason to stop; a stop that comes from shutdown
/// carries no reason of its own and reads as `Shutdown`.
#[derive(Clone, Default)]
pub struct RunStop {
    token: CancellationToken,
    reason: Arc<OnceLock<CancelReason>>,
}

impl RunStop {
    /// A stop that also fires when `shutdown` is cancelled.
    pub fn under(shutdown: &CancellationToken) -> RunStop {
        RunStop {
            token: shutdown.child_token(),
            reason: Arc::default(),
        }
    }

    pub fn stop(&self, reason: CancelReason) {
        // Once stopped (by shutdown, say) a later reason must not rename it.
        if !self.token.is_cancelled() {
            let _ = self.reason.set(reason);
        }
        self.token.cancel();
    }

    pub fn reason(&self) -> Option<CancelReason> {
        self.token.is_cancelled().then(|| self.reason_given())
    }

    /// The token that fires with this stop, for a pause to watch.
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// Resolves with the reason once the run is told to stop.
    pub async fn stopped(&self) -> CancelReason {
        self.token.cancelled().await;
        self.reason_given()
    }

    fn reason_given(&self) -> CancelReason {
        self.reason.get().copied().unwrap_or(CancelReason::Shutdown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn shutdown_stops_every_run_and_its_reason_is_not_renamed_later() {
        let shutdown = CancellationToken::new();
        let stop = RunStop::under(&shutdown);
        assert_eq!(stop.reason(), None);

        shutdown.cancel();
        stop.stop(CancelReason::ClientGone);

        assert_eq!(stop.stopped().await, CancelReason::Shutdown);
        assert_eq!(stop.reason(), Some(CancelReason::Shutdown));
    }

    #[tokio::test]
    async fn the_first_reason_given_wins() {
        let stop = RunStop::under(&CancellationToken::new());
        stop.stop(CancelReason::SlowConsumer);
        stop.stop(CancelReason::ClientGone);
        assert_eq!(stop.reason(), Some(CancelReason::SlowConsumer));
    }
}
