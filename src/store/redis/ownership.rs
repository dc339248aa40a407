//! Who owns a session's run: claims, takeovers, the heartbeat and its
//! signature; what [`crate::cluster`] builds on.

use std::sync::atomic::Ordering;
use std::time::Duration;

use hmac::{Hmac, Mac};
use secrecy::ExposeSecret;
use sha2::Sha256;

use super::{RedisStore, STREAMING_TTL};
use crate::session::SessionKey;
use crate::store::{Fault, Resolution, StoreError, StoredDecision};

/// A live replica that owns a session (the one type for it from here to
/// the HTTP layer, through [`crate::cluster`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Its advertised URL, as its signed heartbeat names it.
    pub url: String,
    /// How long its heartbeat has left: if it cannot be reached, its runs
    /// can be taken over once this has passed.
    pub lease: Duration,
}

/// What a claim of a session found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The session is this process's, under this epoch.
    Claimed,
    /// A live replica owns the session.
    Owned(Peer),
    /// The paused run this claim was to supersede is not this process's to
    /// decide any more (another replica took it over, or it was decided).
    Moved,
}

/// Where a session's run is, as [`RedisStore::take_over`] found it (the
/// one "where is the run" type, up to [`crate::cluster::Cluster::locate`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Located {
    /// No run on the session.
    Nobody,
    /// This process owns it (if it is not here, it is to be restored).
    Mine(String),
    /// A live replica owns it.
    Elsewhere(Peer),
    /// Its owner was gone: it is this process's now.
    TakenOver(String),
    /// Its owner is gone, and this process may not take it over.
    Orphan,
}

/// What a heartbeat found in its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Beat {
    /// This process's previous beat.
    Kept,
    /// Nothing: the heartbeat had expired.
    Lapsed,
    /// Another process's beat (`INSTANCE URL SIGNATURE`): at start, this
    /// replica's previous process; later, another process with the same
    /// replica id.
    Replaced(String),
}

impl RedisStore {
    /// A new run `run` takes `key`, unless a live replica owns it; the
    /// paused run of this process it supersedes, if any, is decided so in
    /// the same step. `nonce` names the attempt (see [`Self::resolve_claim`]).
    pub async fn claim(
        &self,
        key: &SessionKey,
        run: &str,
        nonce: &str,
        superseded: Option<(&str, &StoredDecision)>,
        events: &[super::OutboxEvent],
    ) -> Result<Claim, StoreError> {
        let ttl = STREAMING_TTL.as_millis().to_string();
        let (old_run, old_epoch, decision) = match superseded {
            Some((old, decision)) => (
                old.to_owned(),
                self.epoch(old),
                serde_json::to_string(decision).unwrap_or_default(),
            ),
            None => Default::default(),
        };
        let mut args = vec![
            self.instance.as_ref(),
            run,
            &ttl,
            nonce,
            &old_run,
            &old_epoch,
            &decision,
        ];
        let events = super::scripts::event_args(events);
        args.extend(events.iter().map(String::as_str));
        let answer: Vec<String> = self
            .invoke(&self.scripts.claim, &[&self.session_key(key)], &args)
            .await?;
        match answer.as_slice() {
            [what, epoch] if what == "claimed" => {
                if !old_run.is_empty() {
                    self.let_go(&old_run);
                }
                self.hold(run, epoch);
                Ok(Claim::Claimed)
            }
            [what, beat, left @ ..] if what == "owned" => {
                Ok(Claim::Owned(self.peer(beat, left.first())?))
            }
            [what] if what == "void" => Err(self.refused(
                Fault::Unreachable,
                "this claim was given up on after an unknown outcome",
            )),
            _ => Ok(Claim::Moved),
        }
    }

    /// After a claim whose outcome was unknown: whether run `run` took the
    /// session; if it did not, the claim never will.
    pub async fn resolve_claim(
        &self,
        key: &SessionKey,
        run: &str,
        nonce: &str,
    ) -> Result<Resolution, StoreError> {
        let answer: Vec<String> = self
            .invoke(
                &self.scripts.resolve_claim,
                &[&self.session_key(key)],
                &[nonce, run, &self.instance],
            )
            .await?;
        Ok(match answer.as_slice() {
            [what, epoch] if what == "recorded" => {
                self.hold(run, epoch);
                Resolution::Recorded
            }
            // Not claimed, or claimed and taken over since: not ours.
            _ => Resolution::Void,
        })
    }

    /// Where the run of `key` is; one whose owner is gone becomes ours if
    /// `may_take` (not while this process shuts down).
    pub async fn take_over(&self, key: &SessionKey, may_take: bool) -> Result<Located, StoreError> {
        let may_take = if may_take { "1" } else { "0" };
        let answer: Vec<String> = self
            .invoke(
                &self.scripts.take_over,
                &[&self.session_key(key)],
                &[&self.instance, may_take],
            )
            .await?;
        Ok(match answer.as_slice() {
            [what, run, epoch] if what == "mine" => {
                self.hold(run, epoch);
                Located::Mine(run.clone())
            }
            [what, beat, left @ ..] if what == "owned" => {
                Located::Elsewhere(self.peer(beat, left.first())?)
            }
            [what, run, epoch] if what == "taken" => {
                self.hold(run, epoch);
                Located::TakenOver(run.clone())
            }
            [what, _] if what == "orphan" => Located::Orphan,
            _ => Located::Nobody,
        })
    }

    /// The instance that owns each of `keys` (`None`: nobody).
    pub async fn instances(&self, keys: &[SessionKey]) -> Result<Vec<Option<String>>, StoreError> {
        let mut connection = self.connection().await?;
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.cmd("HGET").arg(self.session_key(key)).arg("instance");
        }
        let owners: Vec<Option<String>> = pipe
            .query_async(&mut connection)
            .await
            .map_err(|err| self.failed(&err))?;
        self.healthy.store(true, Ordering::Relaxed);
        Ok(owners)
    }

    /// Lets `run` go (a suspend, a park): `script` with the session
    /// `session` (and `more` keys), the run, this instance and its epoch.
    pub(super) async fn let_go_with(
        &self,
        script: &redis::Script,
        run: String,
        session: String,
        more: &'static [&'static str],
    ) -> Result<(), StoreError> {
        let epoch = self.epoch(&run);
        self.let_go(&run);
        let keys: Vec<&str> = std::iter::once(session.as_str())
            .chain(more.iter().copied())
            .collect();
        self.invoke::<i64>(script, &keys, &[&run, &self.instance, &epoch])
            .await
            .map(drop)
    }

    /// A run taken over had no record: its session has no run any more.
    pub async fn forget(&self, key: &SessionKey, run: &str) -> Result<(), StoreError> {
        let epoch = self.epoch(run);
        self.let_go(run);
        self.invoke::<i64>(
            &self.scripts.forget,
            &[&self.session_key(key)],
            &[run, &self.instance, &epoch],
        )
        .await
        .map(drop)
    }

    /// Refreshes this replica's heartbeat for `ttl`. Returns what it
    /// replaced: this process's own beat, nothing (it had lapsed: another
    /// replica may have taken runs over), or another process's.
    pub async fn heartbeat(&self, ttl: Duration) -> Result<Beat, StoreError> {
        let mut connection = self.connection().await?;
        let value = self.heartbeat_value();
        let previous: Option<String> = redis::cmd("SET")
            .arg(self.heartbeat_key())
            .arg(&value)
            .arg("PX")
            .arg(ttl.as_millis() as u64)
            .arg("GET")
            .query_async(&mut connection)
            .await
            .map_err(|err| self.failed(&err))?;
        self.healthy.store(true, Ordering::Relaxed);
        Ok(match previous {
            None => Beat::Lapsed,
            Some(previous) if previous == value => Beat::Kept,
            Some(previous) => Beat::Replaced(previous),
        })
    }

    /// Deletes this process's heartbeat: its runs are anyone's at once.
    pub async fn leave(&self) -> Result<(), StoreError> {
        self.invoke::<i64>(
            &self.scripts.leave,
            &[&self.heartbeat_key()],
            &[&self.heartbeat_value()],
        )
        .await
        .map(drop)
    }

    fn heartbeat_key(&self) -> String {
        format!("chatgate:replica:{}", self.replica.replica_id)
    }

    /// `INSTANCE URL SIGNATURE`.
    fn heartbeat_value(&self) -> String {
        let signed = format!("{} {}", self.instance, self.replica.advertise_url);
        let signature = self.sign(&signed);
        format!("{signed} {signature}")
    }

    fn sign(&self, text: &str) -> String {
        // Any key length is accepted by HMAC.
        let mut mac =
            Hmac::<Sha256>::new_from_slice(self.replica.secret.expose_secret().as_bytes())
                .expect("HMAC takes keys of any length");
        mac.update(text.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }

    /// The owner a live heartbeat (`INSTANCE URL SIGNATURE`) names, once
    /// its signature is checked; `left_ms`: what the heartbeat has left. A
    /// beat the cluster secret did not sign names no owner: nothing is ever
    /// forwarded to its URL.
    fn peer(&self, beat: &str, left_ms: Option<&String>) -> Result<Peer, StoreError> {
        let forged = || {
            log::error!(
                "a replica heartbeat in Redis is not signed with this --cluster-secret; \
                 nothing is forwarded to it (is something else writing to this database?)"
            );
            self.refused(
                Fault::Unreachable,
                "a replica heartbeat with a bad signature",
            )
        };
        let (signed, signature) = beat.rsplit_once(' ').ok_or_else(forged)?;
        let mut mac =
            Hmac::<Sha256>::new_from_slice(self.replica.secret.expose_secret().as_bytes())
                .expect("HMAC takes keys of any length");
        mac.update(signed.as_bytes());
        let signature = hex::decode(signature).map_err(|_| forged())?;
        mac.verify_slice(&signature).map_err(|_| forged())?;
        let (_instance, url) = signed.split_once(' ').ok_or_else(forged)?;
        let left = left_ms.and_then(|ms| ms.parse::<u64>().ok()).unwrap_or(0);
        Ok(Peer {
            url: url.to_owned(),
            lease: Duration::from_millis(left),
        })
    }
}

/// Parked (#46) is handed back: the session is owned by nobody, its lease
/// costs nothing, and the replica that gets the next request for it (or
/// finds its expiry or timer due) takes it over under a new epoch. Its
/// record keeps the frames of its pause's request: chunks sent while it
/// waited are replayed as a gap, as after a takeover.
impl crate::store::ParkStore for RedisStore {
    fn park<'a>(
        &'a self,
        run: &'a str,
        key: &'a SessionKey,
        _log: &'a crate::store::ParkedLog,
    ) -> futures_util::future::BoxFuture<'a, Result<(), StoreError>> {
        let (run, session) = (run.to_owned(), self.session_key(key));
        let parked = &[super::keys::PARKED_KEY];
        Box::pin(self.let_go_with(&self.scripts.park, run, session, parked))
    }

    /// The sessions parked and not taken over since, whose data lives:
    /// the same count on every replica. Those whose data expired (and that
    /// nobody took over) are dropped from the set as they are counted.
    fn parked_count(&self) -> futures_util::future::BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            let now = crate::clock::now_ms_i64();
            let mut connection = self.connection().await?;
            let (_, count): (i64, u64) = redis::pipe()
                .cmd("ZREMRANGEBYSCORE")
                .arg(super::keys::PARKED_KEY)
                .arg("-inf")
                .arg(format!("({now}"))
                .cmd("ZCARD")
                .arg(super::keys::PARKED_KEY)
                .query_async(&mut connection)
                .await
                .map_err(|err| self.failed(&err))?;
            Ok(count)
        })
    }

    fn load_unparked(
        &self,
    ) -> futures_util::future::BoxFuture<'_, Result<Vec<crate::store::PausedRecord>, StoreError>>
    {
        crate::store::Store::load(self)
    }
}
