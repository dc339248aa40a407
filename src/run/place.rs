//! Where a request about a session is answered: here, or at the live
//! replica that owns the session (`--store redis://`), taking over a run
//! whose owner is gone on the way. One place for "where does this
//! session's run live"; the HTTP layer only forwards to what it names.

use super::Runs;
use crate::cluster::{Located, Peer};
use crate::session::run_log;
use crate::session::{RunTag, SessionKey};
use crate::store::StoreError;

/// Where a request about a session is to be answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// Here.
    Here,
    /// At the live replica that owns the session.
    Replica(Peer),
    /// Nowhere while this replica shuts down: the run's owner is gone, and
    /// a replica that is stopping takes nothing over (retry elsewhere).
    Draining,
}

impl Runs {
    /// Where a reply or a re-attach on `key` is answered: here when the
    /// session's run is here (or nowhere), at its owner when a live replica
    /// holds it. A run whose owner is gone is taken over and restored here
    /// first, as after a restart.
    pub async fn place(&self, key: &SessionKey) -> Result<Place, StoreError> {
        let Some(cluster) = &self.cluster else {
            // A parked run is woken first (#46).
            self.wake(key).await?;
            return Ok(Place::Here);
        };
        if self.held(key).await {
            return Ok(Place::Here);
        }
        // One takeover at a time per session: a second request waits, then
        // finds the run here.
        let _turn = cluster.stripe(key).lock().await;
        if self.held(key).await {
            return Ok(Place::Here);
        }
        let located = cluster.locate(key, !self.shutdown.is_cancelled()).await?;
        run_log!(Debug, RunTag::session(key), "{located:?}");
        match located {
            Located::Nobody => {}
            Located::Elsewhere(peer) => return Ok(Place::Replica(peer)),
            Located::Orphan => return Ok(Place::Draining),
            // Ours but not here: taken over by a script of this replica's
            // that ran late (its request was answered already), or handed
            // over by this process and now back: restored like any other.
            Located::Mine(run) | Located::TakenOver(run) => match cluster.record(&run).await? {
                Some(record) => {
                    run_log!(
                        Info,
                        RunTag::session(key),
                        "took over run {run} of a replica that is gone"
                    );
                    self.restore_one(record).await;
                }
                // It was working when its owner went, or it had ended.
                None => {
                    run_log!(Debug, RunTag::session(key), "run {run} has no record");
                    cluster.forget(key, &run).await?
                }
            },
        }
        Ok(Place::Here)
    }
}
