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
//! own the session is forwarded to the owner over HTTP ([`forward`]), with
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

pub mod forward;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::config::{Secret, Settings};
use crate::confirmation::SessionKey;
use crate::store::redis::{Beat, RedisStore, ReplicaSettings};
use crate::store::Namespaces;

/// Stripes of the takeover lock: requests for one session that is not here
/// take turns, so a run is restored once before the next request looks.
const STRIPES: usize = 64;
/// Shortest `--cluster-secret`.
pub const MIN_SECRET_LEN: usize = 16;

/// This replica in the cluster.
pub struct Cluster {
    store: Arc<RedisStore>,
    replica_id: String,
    advertise_url: String,
    secret: Secret,
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
    /// The cluster `settings` describe, with `--store redis://...`: the
    /// replica flags are checked here (a start-up error names what is missing).
    pub fn open(settings: &Settings, namespaces: Namespaces) -> Result<Cluster, String> {
        let advertise_url = settings.advertise_url.clone().ok_or(
            "--store redis:// needs --advertise-url (where the other replicas reach this one)",
        )?;
        let secret = settings
            .cluster_secret
            .clone()
            .ok_or("--store redis:// needs --cluster-secret (the same on every replica)")?;
        if secret.expose().len() < MIN_SECRET_LEN {
            return Err(format!(
                "--cluster-secret must be at least {MIN_SECRET_LEN} characters"
            ));
        }
        let replica_id = settings.replica_id.clone().unwrap_or_else(|| {
            let nonce = uuid::Uuid::new_v4().simple().to_string();
            format!("replica-{}", &nonce[..8])
        });
        let store = RedisStore::open(
            &settings.store,
            ReplicaSettings {
                replica_id: replica_id.clone(),
                advertise_url: advertise_url.clone(),
                grace: settings.detach_grace,
                linger: settings.detach_grace + settings.owner_ttl,
                namespaces,
            },
        )
        .map_err(|err| format!("--store {}: {err}", settings.store))?;
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            // The owner writes at least a keep-alive comment this often.
            .read_timeout(settings.keep_alive * 2 + Duration::from_secs(5))
            // Shorter than the owner's idle keep-alive, so a pooled
            // connection is never reused just as the owner closes it.
            .pool_idle_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .no_proxy()
            .build()
            .map_err(|err| format!("cannot set up the replica client: {err}"))?;
        Ok(Cluster {
            secret_digest: Sha256::digest(secret.expose().as_bytes()).into(),
            store: Arc::new(store),
            replica_id,
            advertise_url,
            secret,
            owner_ttl: settings.owner_ttl,
            http,
            stripes: (0..STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
            leaving: CancellationToken::new(),
            contested: AtomicBool::new(false),
        })
    }

    pub fn store(&self) -> &Arc<RedisStore> {
        &self.store
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
        let mut healthy = self.beat(true, true).await.is_some();
        let cluster = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = tokio::time::sleep(interval) => {}
                    () = cluster.leaving.cancelled() => return,
                }
                let beat = cluster.beat(healthy, false).await;
                if beat.as_ref().is_some_and(|beat| *beat != Beat::Kept) {
                    lapsed();
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
