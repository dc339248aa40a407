//! Kept outcomes in Redis (`--keep-outcome`): one key per session,
//! `chatgate:outcome:NAMESPACE:SESSION`, that expires by itself.

use futures_util::future::BoxFuture;
use std::time::Duration;

use super::keys::outcome_key;
use super::RedisStore;
use crate::store::{Outcome, StoreError};

impl RedisStore {
    pub(super) async fn keep_outcome_now(
        &self,
        namespace: Option<&str>,
        outcome: &Outcome,
        keep: Duration,
    ) -> Result<(), StoreError> {
        let json = serde_json::to_string(outcome).unwrap_or_default();
        let mut connection = self.connection().await?;
        redis::cmd("SET")
            .arg(outcome_key(namespace, &outcome.session_id))
            .arg(json)
            .arg("PX")
            .arg(keep.as_millis().max(1) as u64)
            .query_async::<()>(&mut connection)
            .await
            .map_err(|err| self.failed(&err))
    }

    pub(super) async fn read_outcome(
        &self,
        namespace: Option<&str>,
        session_id: &str,
    ) -> Result<Option<Outcome>, StoreError> {
        let mut connection = self.connection().await?;
        let json: Option<String> = redis::cmd("GET")
            .arg(outcome_key(namespace, session_id))
            .query_async(&mut connection)
            .await
            .map_err(|err| self.failed(&err))?;
        Ok(json.and_then(|json| serde_json::from_str(&json).ok()))
    }
}

impl crate::store::OutcomeStore for RedisStore {
    fn keep_outcome<'a>(
        &'a self,
        namespace: Option<&'a str>,
        outcome: &'a Outcome,
        keep: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.keep_outcome_now(namespace, outcome, keep))
    }

    fn outcome<'a>(
        &'a self,
        namespace: Option<&'a str>,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Outcome>, StoreError>> {
        Box::pin(self.read_outcome(namespace, session_id))
    }
}
