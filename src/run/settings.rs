//! The knobs and services every run shares, from the server's settings.

use crate::receipt::ReceiptKeys;
use std::sync::Arc;
use std::time::Duration;

use crate::audit::AuditLog;
use crate::notify::links::Links;
use crate::session::Namespaces;
use crate::store::memory::MemoryStore;
use crate::store::{OutboxEvent, Store};
use crate::tools::Tools;
use crate::webhook::Webhooks;

/// Default of `--confirm-timeout`: how long a pause waits for an answer.
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(300);
/// Longest `--confirm-timeout`: 30 days (an expiry must stay a valid date).
pub const MAX_CONFIRM_TIMEOUT: Duration = Duration::from_secs(30 * 24 * 3600);
/// Default of `--max-rounds`: confirmation rounds one run may use.
pub const MAX_ROUNDS: u32 = 5;
/// Default of `--step-delay`: the planner's simulated work per step.
pub const STEP_DELAY: Duration = Duration::from_millis(100);
/// Default of `--keep-outcome`: how long a run's outcome can be read
/// after its end.
pub const KEEP_OUTCOME: Duration = Duration::from_secs(24 * 3600);

/// Per-run knobs and services, from the server's settings; shared by every run.
#[derive(Debug, Clone)]
pub struct RunSettings {
    pub confirm_timeout: Duration,
    pub max_rounds: u32,
    pub step_delay: Duration,
    /// The tools of `--tools` (empty without).
    pub tools: Arc<Tools>,
    /// The audit log of `--audit-log`, if any.
    pub audit: Option<Arc<AuditLog>>,
    /// Where paused runs are kept (`--store`).
    pub store: Arc<dyn Store>,
    /// The engine's name, for stored records.
    pub engine_name: &'static str,
    /// The API keys' namespaces as stored records name them.
    pub namespaces: Namespaces,
    /// `--webhook`: where every pause's life is announced, if anywhere.
    pub webhooks: Option<Arc<Webhooks>>,
    /// `--keep-outcome` (zero: not kept).
    pub keep_outcome: Duration,
    /// `--explicit-decisions`: a `decisions` reply names every task.
    pub explicit_decisions: bool,
    /// `--max-grant-ttl`: the longest a grant may last.
    pub max_grant_ttl: Duration,
    /// `--link-secret` with `--public-url`: decision links, if made.
    pub links: Option<Arc<Links>>,
    /// What signs the receipt every approved call gets (`--receipt-key`).
    pub receipts: Arc<ReceiptKeys>,
}

impl Default for RunSettings {
    fn default() -> RunSettings {
        RunSettings {
            confirm_timeout: CONFIRM_TIMEOUT,
            max_rounds: MAX_ROUNDS,
            step_delay: Duration::ZERO,
            tools: Arc::default(),
            audit: None,
            store: Arc::new(MemoryStore::default()),
            engine_name: "custom",
            namespaces: Namespaces::default(),
            webhooks: None,
            keep_outcome: KEEP_OUTCOME,
            explicit_decisions: false,
            max_grant_ttl: crate::pause::grant::MAX_GRANT_TTL,
            links: None,
            receipts: Arc::new(
                ReceiptKeys::new(&[], "chatgate".to_owned()).expect("a key made now encodes"),
            ),
        }
    }
}

impl RunSettings {
    /// Queues `rows` that no record write carries; the sender is woken.
    pub async fn announce(&self, rows: &[OutboxEvent]) {
        if rows.is_empty() {
            return;
        }
        match self.store.announce(rows).await {
            Ok(()) => self.wake_sender(rows),
            Err(err) => log::error!(
                "{err}: {} webhook event(s) of {} lost",
                rows.len(),
                rows[0].order
            ),
        }
    }

    /// Events were queued with a record write: the sender looks at once.
    pub fn wake_sender(&self, rows: &[OutboxEvent]) {
        if let (Some(hooks), false) = (&self.webhooks, rows.is_empty()) {
            hooks.wake();
        }
    }
}
