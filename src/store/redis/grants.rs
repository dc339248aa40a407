//! Grants in Redis, for the whole cluster: a hash per grant
//! (`chatgate:grant:ID`: the grant's JSON and its calls left) that expires
//! with the grant, and a sorted set per namespace
//! (`chatgate:grants:NAMESPACE`, scored by expiry) that lists them. A call
//! is spent by one script (`HINCRBY` only while calls are left), so a
//! budget is never exceeded however many replicas spend from it at once;
//! a revoke deletes the hash, and every replica's next use finds nothing.

use futures_util::future::BoxFuture;
use std::sync::LazyLock;

use redis::Script;

use super::RedisStore;
use crate::clock::now_ms;
use crate::store::grant::{newest_first, Grant, MAX_GRANTS_PER_NAMESPACE};
use crate::store::StoreError;

/// KEYS: the grant's hash, its namespace's set. ARGV: id, expiry (ms),
/// calls, JSON, now (ms), the most live grants. Returns 1 when added, 0
/// when the namespace is full.
static ADD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[5])
local members = redis.call('ZRANGE', KEYS[2], 0, -1)
local live = 0
for _, id in ipairs(members) do
  if redis.call('EXISTS', 'chatgate:grant:' .. id) == 1 then
    live = live + 1
  else
    redis.call('ZREM', KEYS[2], id)
  end
end
if live >= tonumber(ARGV[6]) then return 0 end
redis.call('HSET', KEYS[1], 'json', ARGV[4], 'calls_left', ARGV[3])
redis.call('PEXPIREAT', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
return 1
",
    )
});

/// KEYS: the grant's hash. Returns the calls left after one is used, or
/// -1 when the grant is gone or spent.
static TAKE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local left = tonumber(redis.call('HGET', KEYS[1], 'calls_left'))
if not left or left <= 0 then return -1 end
return redis.call('HINCRBY', KEYS[1], 'calls_left', -1)
",
    )
});

/// KEYS: the grant's hash. ARGV: the namespace sets' prefix. Returns the
/// grant's JSON, or false when it was not there.
static REVOKE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local json = redis.call('HGET', KEYS[1], 'json')
if not json then return false end
redis.call('DEL', KEYS[1])
local grant = cjson.decode(json)
redis.call('ZREM', ARGV[1] .. grant['namespace'], grant['id'])
return json
",
    )
});

const SETS: &str = "chatgate:grants:";
const ALL_SETS: &str = "chatgate:grants:*";

fn grant_key(id: &str) -> String {
    format!("chatgate:grant:{id}")
}

impl RedisStore {
    pub(super) async fn add_grant_now(&self, grant: &Grant) -> Result<bool, StoreError> {
        let json = serde_json::to_string(grant).unwrap_or_default();
        let set = format!("{SETS}{}", grant.namespace);
        let args = [
            grant.id.clone(),
            grant.expires_at_ms.to_string(),
            grant.calls_left.to_string(),
            json,
            now_ms().to_string(),
            MAX_GRANTS_PER_NAMESPACE.to_string(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let added: i64 = self
            .invoke(&ADD, &[&grant_key(&grant.id), &set], &args)
            .await?;
        Ok(added == 1)
    }

    pub(super) async fn list_grants(
        &self,
        namespace: Option<&str>,
    ) -> Result<Vec<Grant>, StoreError> {
        let mut connection = self.connection().await?;
        let now = now_ms();
        let sets: Vec<String> = match namespace {
            Some(namespace) => vec![format!("{SETS}{namespace}")],
            None => redis::cmd("KEYS")
                .arg(ALL_SETS)
                .query_async(&mut connection)
                .await
                .map_err(|err| self.failed(&err))?,
        };
        let mut grants = Vec::new();
        for set in sets {
            let ids: Vec<String> = redis::cmd("ZRANGEBYSCORE")
                .arg(&set)
                .arg(now.to_string())
                .arg("+inf")
                .query_async(&mut connection)
                .await
                .map_err(|err| self.failed(&err))?;
            for id in ids {
                let fields: (Option<String>, Option<u32>) = redis::cmd("HMGET")
                    .arg(grant_key(&id))
                    .arg("json")
                    .arg("calls_left")
                    .query_async(&mut connection)
                    .await
                    .map_err(|err| self.failed(&err))?;
                let (Some(json), Some(left)) = fields else {
                    continue;
                };
                if let Ok(mut grant) = serde_json::from_str::<Grant>(&json) {
                    grant.calls_left = left;
                    if grant.is_live(now) {
                        grants.push(grant);
                    }
                }
            }
        }
        newest_first(&mut grants);
        Ok(grants)
    }

    pub(super) async fn take_grant(&self, id: &str) -> Result<Option<u32>, StoreError> {
        let left: i64 = self.invoke(&TAKE, &[&grant_key(id)], &[]).await?;
        Ok(u32::try_from(left).ok())
    }

    pub(super) async fn revoke_grant_now(&self, id: &str) -> Result<Option<Grant>, StoreError> {
        let json: Option<String> = self.invoke(&REVOKE, &[&grant_key(id)], &[SETS]).await?;
        Ok(json.and_then(|json| serde_json::from_str(&json).ok()))
    }
}

impl crate::store::GrantStore for RedisStore {
    fn add_grant<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(self.add_grant_now(grant))
    }

    fn grants<'a>(
        &'a self,
        namespace: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Grant>, StoreError>> {
        Box::pin(self.list_grants(namespace))
    }

    fn take_grant_call<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<u32>, StoreError>> {
        Box::pin(self.take_grant(id))
    }

    fn revoke_grant<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Grant>, StoreError>> {
        Box::pin(self.revoke_grant_now(id))
    }
}
