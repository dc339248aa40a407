//! Replicas behind one load balancer (`--store redis://`).
//!
//! Each replica has an id (`--replica-id`, or one made at start) and an
//! address where the others reach it (`--advertise-url`). The owner of a
//! live run is the process that started it (or took it over); its owner
//! record in Redis holds while its heartbeat (`--owner-ttl`, refreshed every
//! second or a third of the TTL) names the same process. See
//! [`crate::store::redis`] for the keys.
//!
//! A reply, a supersede or a re-attach that lands on a replica that does not
//! own the session is forwarded to the owner over HTTP ([`crate::http::forward`]), with
//! `--cluster-secret`, and applied there exactly as a local one: first
//! decision wins, cluster-wide, because only the owner decides. HTTP rather
//! than Redis request/reply: the owner's answer (status, error chunk, a
//! re-attached stream) reaches the client as the owner wrote it, a re-attach
//! is a proxied stream, and nothing new waits in Redis.
//!
//! A run whose owner is gone (its heartbeat expired, or it handed its
//! suspended runs back at shutdown) is taken over by the replica that gets
//! the session's next request: one Lua script swaps the owner, so two
//! replicas never own one run, and the run is restored from its record as
//! after a restart.
//!
//! What lives where: this module holds the policy (the lease and its
//! heartbeat, when a replica may take a run over, where a request goes)
//! and names the ownership types ([`Located`], [`Peer`]) for everything
//! above it. The ownership *scripts* stay with the Redis store
//! (`store/redis/ownership.rs`, `scripts.rs`): every write the store
//! fences (a pause saved, a decision recorded, an end) checks the owner
//! and its epoch inside its own Lua script, in the one atomic `EVAL` that
//! writes it, so the owner check and the writes share their keys and
//! their script, and cannot be split across two modules without a second
//! round trip and a gap between the check and the write.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;

use crate::session::{Namespaces, SessionKey};
use crate::store::redis::ownership::{Beat, Claim};
pub use crate::store::redis::ownership::{Located, Peer};
use crate::store::redis::{RedisStore, ReplicaSettings};
use crate::store::{Fault, PausedRecord, Resolution, StoreError, StoredDecision};

/// How long a request waits for a claim whose outcome was unknown to be
/// settled before it answers `outcome_unknown`.
pub const SETTLE_PATIENCE: Duration = Duration::from_secs(4);
/// Time between two attempts to settle an unknown outcome.
pub const SETTLE_RETRY: Duration = Duration::from_millis(250);
/// Stripes of the takeover lock: requests for one session that is not here
/// take turns, so a run is restored once before the next request looks.
const STRIPES: usize = 64;
/// Default of `--owner-ttl`: how long a replica's ownership of its runs
/// outlives its last heartbeat (beats come every second). With epochs and
/// nonces fencing every write, a short lease is safe: a replica stalled
/// past it acts on nothing, and a kill -9's runs are taken over within it.
pub const OWNER_TTL: Duration = Duration::from_secs(4);
/// Shortest `--cluster-secret`.
pub const MIN_SECRET_LEN: usize = 16;

/// What a replica is told at start (`--store redis://` and the replica flags).
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// `redis://HOST:PORT/DB`.
    pub store_url: String,
    /// `--replica-id`; made at start when `None`.
    pub replica_id: Option<String>,
    /// `--advertise-url`: where the other replicas reach this one.
    pub advertise_url: String,
    /// `--cluster-secret`, shared by every replica.
    pub secret: SecretString,
    /// `--owner-ttl`.
    pub owner_ttl: Duration,
    /// `--redis-records compressed`: records are kept compressed.
    pub compress_records: bool,
    /// `--keep-alive`: an owner's stream is silent at most this long.
    pub keep_alive: Duration,
    /// `--detach-grace`: how long an ended run's session stays its owner's.
    pub detach_grace: Duration,
    /// The API keys' namespaces as Redis keys name them.
    pub namespaces: Namespaces,
}

/// Whether a new run may take its session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// It is this replica's, under this run id.
    Here(Arc<str>),
    /// A live replica owns the session.
    Elsewhere(Peer),
    /// The paused run the claim was to supersede is no longer this
    /// replica's to decide (taken over, or decided meanwhile).
    Moved,
    /// Redis did not say, and still does not: settle it with
    /// [`Cluster::settle_claim`].
    Unknown(PendingClaim),
}

/// A claim whose outcome is not known yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingClaim {
    key: SessionKey,
    /// The run id it claimed the session for.
    pub run: Arc<str>,
    nonce: String,
}

/// This replica in the cluster.
pub struct Cluster {
    store: Arc<RedisStore>,
    replica_id: String,
    advertise_url: String,
    secret: SecretString,
    /// SHA-256 of the secret, compared in constant time.
    secret_digest: [u8; 32],
    owner_ttl: Duration,
    http: reqwest::Client,
    stripes: Box<[tokio::sync::Mutex<()>]>,
    /// Cancelled when the replica leaves (its heartbeat stops).
    leaving: CancellationToken,
    /// Another process was found beating under this replica's id (said once).
    contested: AtomicBool,
}

impl Cluster {
    /// Connects (lazily) to the cluster's Redis as the replica `config`
    /// describes. The error names the flag at fault.
    pub fn open(config: ClusterConfig) -> Result<Cluster, String> {
        if config.secret.expose_secret().len() < MIN_SECRET_LEN {
            return Err(format!(
                "--cluster-secret must be at least {MIN_SECRET_LEN} characters"
            ));
        }
        let replica_id = config.replica_id.clone().unwrap_or_else(|| {
            let nonce = uuid::Uuid::new_v4().simple().to_string();
            format!("replica-{}", &nonce[..8])
        });
        let store = RedisStore::open(
            &config.store_url,
            ReplicaSettings {
                replica_id: replica_id.clone(),
                secret: config.secret.clone(),
                advertise_url: config.advertise_url.clone(),
                grace: config.detach_grace,
                linger: config.detach_grace + config.owner_ttl,
                namespaces: config.namespaces.clone(),
                compress_records: config.compress_records,
            },
        )
        .map_err(|err| format!("--store {}: {err}", config.store_url))?;
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            // The owner writes at least a keep-alive comment this often.
            .read_timeout(config.keep_alive * 2 + Duration::from_secs(5))
            // Shorter than the owner's idle keep-alive, so a pooled
            // connection is never reused just as the owner closes it.
            .pool_idle_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .no_proxy()
            .build()
            .map_err(|err| format!("cannot set up the replica client: {err}"))?;
        Ok(Cluster {
            secret_digest: Sha256::digest(config.secret.expose_secret().as_bytes()).into(),
            store: Arc::new(store),
            replica_id,
            advertise_url: config.advertise_url,
            secret: config.secret,
            owner_ttl: config.owner_ttl,
            http,
            stripes: (0..STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
            leaving: CancellationToken::new(),
            contested: AtomicBool::new(false),
        })
    }

    /// A new run (named `run`, else a new id) takes `key`, unless a live replica owns it; `superseded`
    /// (this replica's paused run on the session, and its decision) is
    /// decided in the same step. A claim whose outcome is unknown (Redis did
    /// not answer in time) is settled before this returns, or within
    /// [`SETTLE_PATIENCE`]: then it answers [`Fault::Unknown`] and
    /// [`Cluster::settle_claim`] goes on with it.
    pub async fn claim(
        &self,
        key: &SessionKey,
        run: Option<Arc<str>>,
        superseded: Option<(&str, &StoredDecision)>,
        events: &[crate::store::OutboxEvent],
    ) -> Result<Claimed, StoreError> {
        let run = run.unwrap_or_else(|| Arc::from(uuid::Uuid::new_v4().to_string()));
        let nonce = match superseded {
            Some((_, decision)) => decision.nonce.clone(),
            None => uuid::Uuid::new_v4().simple().to_string(),
        };
        let claimed = self
            .store
            .claim(key, &run, &nonce, superseded, events)
            .await;
        let claimed = match claimed {
            Err(err) if err.fault == Fault::Unknown => {
                log::warn!("{err}; settling the claim");
                let pending = PendingClaim {
                    key: key.clone(),
                    run: run.clone(),
                    nonce,
                };
                return match self.settle_claim(&pending, SETTLE_PATIENCE).await {
                    Ok(Resolution::Recorded) => Ok(Claimed::Here(run)),
                    Ok(Resolution::Void) => Err(err.with_fault(Fault::Unreachable)),
                    Err(_) => Ok(Claimed::Unknown(pending)),
                };
            }
            claimed => claimed?,
        };
        Ok(match claimed {
            Claim::Claimed => Claimed::Here(run),
            Claim::Owned(peer) => Claimed::Elsewhere(peer),
            Claim::Moved => Claimed::Moved,
        })
    }

    /// Learns what became of a claim whose outcome was unknown, trying for
    /// `patience`: [`Resolution::Void`] means it never takes effect.
    pub async fn settle_claim(
        &self,
        claim: &PendingClaim,
        patience: Duration,
    ) -> Result<Resolution, StoreError> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            match self
                .store
                .resolve_claim(&claim.key, &claim.run, &claim.nonce)
                .await
            {
                Ok(resolution) => return Ok(resolution),
                Err(err) if tokio::time::Instant::now() >= deadline => return Err(err),
                Err(_) => tokio::time::sleep(SETTLE_RETRY).await,
            }
        }
    }

    /// Where the run of `key` is; one whose owner is gone becomes this
    /// replica's if `may_take` (not while it shuts down).
    pub async fn locate(&self, key: &SessionKey, may_take: bool) -> Result<Located, StoreError> {
        self.store.take_over(key, may_take).await
    }

    /// The stored record of `run`, with its decision if one was taken.
    pub async fn record(&self, run: &str) -> Result<Option<PausedRecord>, StoreError> {
        self.store.get(run).await
    }

    /// A run taken over had no record: its session has no run any more.
    pub async fn forget(&self, key: &SessionKey, run: &str) -> Result<(), StoreError> {
        self.store.forget(key, run).await
    }

    /// The process that owns each of `keys` (`None`: nobody).
    pub async fn owners(&self, keys: &[SessionKey]) -> Result<Vec<Option<String>>, StoreError> {
        self.store.instances(keys).await
    }

    /// This process, as owner records name it.
    pub fn instance(&self) -> &str {
        self.store.instance()
    }

    /// Whether `presented` is the cluster secret (in constant time).
    pub fn is_secret(&self, presented: &[u8]) -> bool {
        let digest: [u8; 32] = Sha256::digest(presented).into();
        bool::from(digest.ct_eq(&self.secret_digest))
    }

    /// The cluster secret, for the one place that sends it.
    pub fn secret(&self) -> &SecretString {
        &self.secret
    }

    /// The client that forwards requests to other replicas.
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    pub fn store(&self) -> &Arc<RedisStore> {
        &self.store
    }

    /// How long a replica's lease lasts without a heartbeat (`--owner-ttl`).
    pub fn owner_ttl(&self) -> Duration {
        self.owner_ttl
    }

    pub fn replica_id(&self) -> &str {
        &self.replica_id
    }

    pub fn advertise_url(&self) -> &str {
        &self.advertise_url
    }

    /// The host (and port) of `--advertise-url`: forwarded requests name it
    /// in `Host`, so it is an allowed host.
    pub fn advertised_host(&self) -> Option<String> {
        let url = reqwest::Url::parse(&self.advertise_url).ok()?;
        let host = url.host_str()?.to_owned();
        Some(match url.port() {
            Some(port) => format!("{host}:{port}"),
            None => host,
        })
    }

    /// The takeover lock of `key`'s stripe.
    pub fn stripe(&self, key: &SessionKey) -> &tokio::sync::Mutex<()> {
        use std::hash::{Hash, Hasher};
        // Fixed keys: one session always maps to one stripe.
        let mut hasher = std::hash::DefaultHasher::new();
        key.hash(&mut hasher);
        &self.stripes[(hasher.finish() as usize) % STRIPES]
    }

    /// Keeps this replica's heartbeat until it leaves. The first beat is
    /// written before this returns, so the replica owns what it starts.
    /// `lapsed` is called whenever a beat finds the previous one gone or
    /// replaced (Redis was out of reach, or the process stalled, for a whole
    /// TTL; or another process uses this replica id): other replicas may
    /// have taken over runs held here.
    pub async fn start_heartbeat(self: &Arc<Self>, lapsed: impl Fn() + Send + 'static) {
        let interval = (self.owner_ttl / 3).min(Duration::from_secs(1));
        // The first beat replaces this replica's previous process, if any.
        let sent = tokio::time::Instant::now();
        let first = self.beat(true, true).await;
        // Until when this replica's ownership surely holds, by its own
        // clock: a beat's TTL runs from when Redis set it, which is after
        // it was sent.
        let mut lease = first.as_ref().map(|_| sent + self.owner_ttl);
        let mut healthy = first.is_some();
        let cluster = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = tokio::time::sleep(interval) => {}
                    () = cluster.leaving.cancelled() => return,
                }
                let sent = tokio::time::Instant::now();
                let beat = cluster.beat(healthy, false).await;
                if let Some(beat) = &beat {
                    // A lapse is told by this clock as well as by what
                    // Redis answers: a late SET (a beat sent before a stall,
                    // run after it) brings an expired key back, and then
                    // the next beat finds it "kept".
                    let lapsed_here = lease.is_some_and(|until| sent > until);
                    if *beat != Beat::Kept || lapsed_here {
                        if lapsed_here && *beat == Beat::Kept {
                            log::warn!(
                                "this replica's heartbeat went unrenewed longer than \
                                 --owner-ttl: other replicas may have taken over runs paused \
                                 here; those are handed to them"
                            );
                        }
                        lapsed();
                    }
                    lease = Some(sent + cluster.owner_ttl);
                }
                healthy = beat.is_some();
            }
        });
    }

    /// One heartbeat; logs changes only. `Some(beat)` once written.
    async fn beat(&self, was_healthy: bool, first: bool) -> Option<Beat> {
        match self.store.heartbeat(self.owner_ttl).await {
            Ok(beat) => {
                if !was_healthy {
                    log::info!("the store ({}) is reachable again", self.store.name());
                }
                match &beat {
                    Beat::Lapsed if !first => log::warn!(
                        "this replica's heartbeat had lapsed: other replicas may have taken \
                         over runs paused here; those are handed to them"
                    ),
                    Beat::Replaced(other)
                        if !first && !self.contested.swap(true, Ordering::Relaxed) =>
                    {
                        log::error!(
                            "another process beats as replica {} ({other}): two replicas \
                             share --replica-id, and their runs pass from one to the other; \
                             give each replica its own id",
                            self.replica_id
                        );
                    }
                    _ => {}
                }
                Some(beat)
            }
            Err(err) => {
                if was_healthy {
                    log::error!("heartbeat: {err}");
                }
                None
            }
        }
    }

    /// Stops the heartbeat and deletes it: whatever this replica still
    /// owned is anyone's to take over at once.
    pub async fn leave(&self) {
        self.leaving.cancel();
        if let Err(err) = self.store.leave().await {
            log::warn!("could not remove this replica's heartbeat ({err}); it expires by itself");
        }
    }
}
