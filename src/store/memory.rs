//! `--store memory`, the default: nothing outlives the process.

use futures_util::future::BoxFuture;

use super::{PausedRecord, Resolution, RunEnd, Store, StoreError, StoredDecision};
use crate::session::SessionKey;

/// `--store memory`: nothing is kept; a paused run lives as long as its
/// process (and is cancelled at shutdown, reason `shutdown`).
#[derive(Debug, Default)]
pub struct MemoryStore;

impl Store for MemoryStore {
    fn is_durable(&self) -> bool {
        false
    }

    fn save(&self, _record: PausedRecord) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }

    fn record_decision<'a>(
        &'a self,
        _run: &'a str,
        _key: &'a SessionKey,
        _decision: &'a StoredDecision,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }

    fn resolve<'a>(
        &'a self,
        _run: &'a str,
        _key: &'a SessionKey,
        _nonce: &'a str,
    ) -> BoxFuture<'a, Result<Resolution, StoreError>> {
        // Nothing is ever unknown here: every decision was recorded.
        Box::pin(async { Ok(Resolution::Recorded) })
    }

    fn end<'a>(
        &'a self,
        _run: &'a str,
        _key: &'a SessionKey,
        _end: &'a RunEnd,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }

    fn remove(&self, _run: &str, _key: &SessionKey) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }

    fn load(&self) -> BoxFuture<'_, Result<Vec<PausedRecord>, StoreError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
}
