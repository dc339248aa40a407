//! A paused run's record in Redis: written as `--redis-records` says
//! (compressed, or JSON for replicas of versions that read only that),
//! read back whichever way it was written, with its decision, its end,
//! its pause's progress and its calls.

use std::sync::atomic::Ordering;

use super::keys::{run_key, PROGRESS_FIELDS};
use super::RedisStore;
use crate::store::{compact, PauseProgress, PausedRecord, StoreError};

impl RedisStore {
    /// `record` as Redis keeps it (`--redis-records`).
    pub(super) fn encode(&self, record: &PausedRecord) -> Vec<u8> {
        match self.replica.compress_records {
            true => compact::encode(record),
            false => serde_json::to_vec(record).unwrap_or_default(),
        }
    }

    /// The stored record of `run`, with its decision if one was taken and
    /// its end if it ended.
    pub async fn get(&self, run: &str) -> Result<Option<PausedRecord>, StoreError> {
        let mut connection = self.connection().await?;
        let fields: Vec<Option<Vec<u8>>> = redis::cmd("HMGET")
            .arg(run_key(run))
            .arg("record")
            .arg("decision")
            .arg("ended")
            .arg(&PROGRESS_FIELDS[..])
            .query_async(&mut connection)
            .await
            .map_err(|err| self.failed(&err))?;
        self.healthy.store(true, Ordering::Relaxed);
        let mut fields = fields.into_iter();
        let (Some(Some(record)), Some(decision), Some(ended)) =
            (fields.next(), fields.next(), fields.next())
        else {
            return Ok(None);
        };
        let Some(record) = compact::json_of(&record) else {
            log::warn!("skipping a stored run {run} this version cannot read");
            return Ok(None);
        };
        match serde_json::from_slice::<PausedRecord>(&record) {
            Ok(mut record) => {
                record.decision = decision.and_then(|d| serde_json::from_slice(&d).ok());
                record.ended = ended.and_then(|e| serde_json::from_slice(&e).ok());
                let steps: Vec<Option<String>> = fields
                    .map(|step| step.and_then(|step| String::from_utf8(step).ok()))
                    .collect();
                record.progress = PauseProgress::join(
                    &record.confirmation_id,
                    steps.iter().map(Option::as_deref),
                );
                if record.may_have_calls() {
                    record.calls = self.calls_of(run, &record.confirmation_id).await?;
                }
                Ok(Some(record))
            }
            Err(err) => {
                log::warn!("skipping an unreadable stored run {run}: {err}");
                Ok(None)
            }
        }
    }
}
