//! With replicas: the pauses of a replica that died expire all the same.
//!
//! A pause's timer runs in the process that asked it. When that process is
//! gone, its stored pauses are restored only when a request for their
//! session arrives, so one that nobody asks about would never end and
//! never be announced (`interaction.expired`, `run.ended`). Every replica
//! therefore looks, once every [`EXPIRY_SWEEP`], for listed pauses past
//! their expiry, and puts each through [`Runs::place`]: a pause whose owner
//! lives is left to that owner's own timer; one whose owner is gone is
//! taken over (one Lua script: exactly one replica wins) and restored,
//! which ends it `timeout`, announced once, as its owner would have.
//!
//! Runs at work likewise (#44): a run whose decision was recorded lives in
//! its owner's memory while it works; the same look finds those at work
//! since before a lease could lapse, and a dead owner's run is taken over
//! and goes on where its execution journal says.
//!
//! Its timers likewise: the same look finds pauses whose next timer (a
//! reminder, an escalation) is due in the store's index of due timers,
//! and puts each through [`Runs::place`]: a live owner fires its own; a
//! dead owner's run is taken over and restored, which fires what came due
//! at once (before any decision), so that on-call is paged even when
//! nobody touches the session.

use std::time::Duration;

use super::Runs;
use crate::cluster::Cluster;
use crate::session::run_log;
use crate::session::{RunTag, SessionKey};

/// How often each replica looks for expired pauses of replicas that died.
pub const EXPIRY_SWEEP: Duration = Duration::from_secs(1);
/// Most expired pauses one look takes per namespace (the rest, next time).
const SWEEP_LIMIT: usize = 64;

impl Runs {
    /// With replicas: looks for dead owners' expired pauses until shutdown.
    pub fn start_expiry_sweep(&self) {
        let Some(cluster) = self.cluster.clone() else {
            return;
        };
        let runs = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = tokio::time::sleep(EXPIRY_SWEEP) => {}
                    () = runs.shutdown.cancelled() => return,
                }
                runs.sweep_expired(&cluster).await;
            }
        });
    }

    async fn sweep_expired(&self, cluster: &Cluster) {
        let now_ms = crate::clock::now_ms();
        for owner in self.settings.namespaces.owners() {
            let namespace = self.settings.namespaces.name(owner);
            let expired = cluster
                .store()
                .expired_pauses(namespace.as_deref(), now_ms, SWEEP_LIMIT)
                .await;
            let due = cluster
                .store()
                .due_timers(namespace.as_deref(), now_ms, SWEEP_LIMIT)
                .await;
            // Runs at work since before an owner's lease could lapse (#44).
            let lease = cluster.owner_ttl().as_millis() as u64;
            let working = cluster
                .store()
                .working_runs(
                    namespace.as_deref(),
                    now_ms.saturating_sub(lease),
                    SWEEP_LIMIT,
                )
                .await;
            let sessions = match (expired, due, working) {
                (Ok(mut sessions), Ok(due), Ok(working)) => {
                    for session in due.into_iter().chain(working) {
                        if !sessions.contains(&session) {
                            sessions.push(session);
                        }
                    }
                    sessions
                }
                // Redis is out of reach: the heartbeat says so; look again later.
                (Err(err), _, _) | (_, Err(err), _) | (_, _, Err(err)) => {
                    ::log::debug!("expired pauses and due timers: {err}");
                    return;
                }
            };
            for session_id in sessions {
                let key = SessionKey::new(owner, &session_id);
                if let Err(err) = self.place(&key).await {
                    run_log!(Debug, RunTag::session(&key), "{err}");
                }
            }
        }
    }
}
