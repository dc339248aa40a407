//! Where a request about a session is answered: here, or at the live
//! replica that owns the session (`--store redis://`), taking over a run
//! whose owner is gone on the way. One place for "where does this
//! session's run live"; the HTTP layer only forwards to what it names.

use std::sync::Arc;

use super::Runs;
use crate::cluster::{Claimed, Located, Peer};
use crate::session::SessionKey;
use crate::store::StoreError;

/// Where a request about a session is to be answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// Here; for a new run, with its id in the store when it has one.
    Here(Option<Arc<str>>),
    /// At the live replica that owns the session.
    Owner(Peer),
    /// Nowhere while this replica shuts down: the run's owner is gone, and
    /// a replica that is stopping takes nothing over (retry elsewhere).
    Draining,
}

impl Runs {
    /// Where a new run on `key` starts: here (with replicas, once this one
    /// has claimed the session in the store), or at the live replica that
    /// owns the session (whose run a new message supersedes or is refused by).
    pub async fn claim(&self, key: &SessionKey) -> Result<Place, StoreError> {
        let Some(cluster) = &self.cluster else {
            return Ok(Place::Here(None));
        };
        match cluster.claim(key).await? {
            Claimed::Here(run) => Ok(Place::Here(Some(run))),
            Claimed::Elsewhere(owner) => Ok(Place::Owner(owner)),
        }
    }

    /// Where a reply or a re-attach on `key` is answered: here when the
    /// session's run is here (or nowhere), at its owner when a live replica
    /// holds it. A run whose owner is gone is taken over and restored here
    /// first, as after a restart.
    pub async fn place(&self, key: &SessionKey) -> Result<Place, StoreError> {
        let Some(cluster) = &self.cluster else {
            return Ok(Place::Here(None));
        };
        if self.holds(key) {
            return Ok(Place::Here(None));
        }
        // One takeover at a time per session: a second request waits, then
        // finds the run here.
        let _turn = cluster.stripe(key).lock().await;
        if self.holds(key) {
            return Ok(Place::Here(None));
        }
        match cluster.locate(key, !self.shutdown.is_cancelled()).await? {
            Located::Nobody | Located::Mine(_) => {}
            Located::Elsewhere(owner) => return Ok(Place::Owner(owner)),
            Located::Orphan => return Ok(Place::Draining),
            Located::TakenOver(run) => match cluster.record(&run).await? {
                Some(record) => {
                    ::log::info!("took over run {run} of a replica that is gone");
                    self.restore_one(record).await;
                }
                // It was working when its owner went, or it had ended.
                None => cluster.forget(key, &run).await?,
            },
        }
        Ok(Place::Here(None))
    }

    /// Whether this process has a run (or a run's end, re-attachable) on
    /// `key`. A run suspended here is not: with replicas it goes on elsewhere.
    pub(super) fn holds(&self, key: &SessionKey) -> bool {
        self.logs.find(key).is_some_and(|log| !log.is_suspended()) || self.manager.holds(key)
    }
}
