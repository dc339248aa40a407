//! The inbox with replicas: the pending pauses of a namespace, across the
//! cluster, from the per-namespace sorted set and `conf:ID` that the save,
//! decide and end scripts keep (see [`super::scripts::SAVE`]).

use super::{pending_key, run_key, RedisStore};
use crate::store::{Located, PausedRecord, StoreError};

impl RedisStore {
    /// A page of `namespace`'s undecided pauses (see [`crate::store::Store::pending`]).
    pub(super) async fn pending_page(
        &self,
        namespace: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<PausedRecord>, StoreError> {
        {
            let set = pending_key(namespace);
            let now_ms = crate::clock::now_ms();
            let mut connection = self.connection().await?;
            let failed = |err: redis::RedisError| self.failed(&err);
            // Pauses past their expiry are not pending; they stay in the
            // set until their end is written (by their owner, or by the
            // replica that takes a dead owner's over: see `expired_pauses`).
            // Where `after` is: `SET SCORE MEMBER` while it is pending.
            let from: Option<(u64, String)> = match after {
                Some(conf) => {
                    let found: Option<String> = redis::cmd("GET")
                        .arg(format!("chatgate:conf:{conf}"))
                        .query_async(&mut connection)
                        .await
                        .map_err(failed)?;
                    found.and_then(|text| {
                        let mut parts = text.splitn(3, ' ');
                        let (in_set, score, member) = (parts.next()?, parts.next()?, parts.next()?);
                        (in_set == set).then(|| Some((score.parse().ok()?, member.to_owned())))?
                    })
                }
                None => None,
            };
            let min = from
                .as_ref()
                .map_or(format!("({now_ms}"), |(score, _)| score.to_string());
            // Ties at the same millisecond past `after` are few; read a few more.
            let members: Vec<(String, u64)> = redis::cmd("ZRANGEBYSCORE")
                .arg(&set)
                .arg(min)
                .arg("+inf")
                .arg("WITHSCORES")
                .arg("LIMIT")
                .arg(0)
                .arg(limit + 64)
                .query_async(&mut connection)
                .await
                .map_err(failed)?;
            let page: Vec<String> = members
                .into_iter()
                .filter(|(member, score)| {
                    from.as_ref()
                        .is_none_or(|(at, after)| (*score, member) > (*at, after))
                })
                .take(limit)
                .map(|(member, _)| member)
                .collect();
            let mut records = Vec::with_capacity(page.len());
            for member in page {
                let Some((_, run)) = member.split_once('|') else {
                    continue;
                };
                match self.get(run).await? {
                    Some(record) if record.decision.is_none() && record.ended.is_none() => {
                        records.push(record);
                    }
                    // Its record went (it expired, or Redis lost it): unlisted.
                    _ => self.unlist(&mut connection, &set, &member).await?,
                }
            }
            Ok(records)
        }
    }

    /// Takes `member` out of the pending set `set`: a pause whose records
    /// are gone.
    pub(super) async fn unlist(
        &self,
        connection: &mut redis::aio::ConnectionManager,
        set: &str,
        member: &str,
    ) -> Result<(), StoreError> {
        redis::cmd("ZREM")
            .arg(set)
            .arg(member)
            .query_async::<i64>(connection)
            .await
            .map(drop)
            .map_err(|err| self.failed(&err))
    }

    /// At most `limit` members of the sorted set `set` scored `now_ms` or
    /// less, the earliest first.
    pub(super) async fn due_in(
        &self,
        connection: &mut redis::aio::ConnectionManager,
        set: &str,
        now_ms: u64,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        redis::cmd("ZRANGEBYSCORE")
            .arg(set)
            .arg("-inf")
            .arg(now_ms)
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .query_async(connection)
            .await
            .map_err(|err| self.failed(&err))
    }

    /// The sessions of at most `limit` pauses of `namespace` past their
    /// expiry at `now_ms` that are still listed: their owner has not ended
    /// them (it is gone, or about to). A pause whose records are gone
    /// leaves the set here.
    pub async fn expired_pauses(
        &self,
        namespace: Option<&str>,
        now_ms: u64,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let set = pending_key(namespace);
        let mut connection = self.connection().await?;
        let failed = |err: redis::RedisError| self.failed(&err);
        let members = self.due_in(&mut connection, &set, now_ms, limit).await?;
        let prefix = format!("chatgate:session:{}:", namespace.unwrap_or("-"));
        let mut sessions = Vec::new();
        for member in members {
            let run = member.split_once('|').map_or("", |(_, run)| run);
            let session: Option<String> = redis::cmd("HGET")
                .arg(run_key(run))
                .arg("session")
                .query_async(&mut connection)
                .await
                .map_err(failed)?;
            match session.as_deref().and_then(|s| s.strip_prefix(&prefix)) {
                Some(session_id) => sessions.push(session_id.to_owned()),
                None => self.unlist(&mut connection, &set, &member).await?,
            }
        }
        Ok(sessions)
    }

    /// Where the pause `confirmation_id` is, undecided or decided while its
    /// run's record lasts and its session is still that run's (see
    /// [`crate::store::Store::locate`]).
    pub(super) async fn locate_pause(
        &self,
        confirmation_id: &str,
    ) -> Result<Option<Located>, StoreError> {
        {
            let mut connection = self.connection().await?;
            let found: Option<String> = redis::cmd("GET")
                .arg(format!("chatgate:conf:{confirmation_id}"))
                .query_async(&mut connection)
                .await
                .map_err(|err| self.failed(&err))?;
            let Some(found) = found else {
                return Ok(None);
            };
            // `chatgate:pending:NAMESPACE SCORE CONFIRMATION_ID|RUN`
            let mut parts = found.splitn(3, ' ');
            let (set, _, member) = (parts.next(), parts.next(), parts.next());
            let namespace = set.and_then(|set| set.strip_prefix("chatgate:pending:"));
            let run = member.and_then(|m| m.split_once('|')).map(|(_, run)| run);
            let (Some(namespace), Some(run)) = (namespace, run) else {
                return Ok(None);
            };
            let session: Option<String> = redis::cmd("HGET")
                .arg(run_key(run))
                .arg("session")
                .query_async(&mut connection)
                .await
                .map_err(|err| self.failed(&err))?;
            // The session's run now, so that an old pause's id does not lead
            // to a later run of its session.
            let current: Option<String> = match &session {
                Some(session) => redis::cmd("HGET")
                    .arg(session)
                    .arg("run")
                    .query_async(&mut connection)
                    .await
                    .map_err(|err| self.failed(&err))?,
                None => None,
            };
            // An aside pause (`aside.rs`) is its run's.
            if current.as_deref() != Some(super::aside::run_of(run)) {
                return Ok(None);
            }
            let prefix = format!("chatgate:session:{namespace}:");
            let session_id = session.and_then(|s| s.strip_prefix(&prefix).map(str::to_owned));
            let namespace = (namespace != "-").then(|| namespace.to_owned());
            Ok(session_id.map(|session_id| (namespace, session_id)))
        }
    }
}
