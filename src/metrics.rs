//! Process metrics, exposed at `GET /metrics` in the Prometheus text format
//! (0.0.4) or OpenMetrics, as the scraper asks. No session id is ever a
//! label: label values come from small fixed sets (actions, outcomes, error
//! types).
//!
//! The registry is an instance, not a process global (prometheus-client,
//! rather than the `metrics` crate's global recorder): tests run many servers
//! in one process, and each must count only its own. Rendering takes the
//! run gauges it needs as numbers ([`RunGauges`]); this module knows nothing
//! of the registry of runs.

use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::protocol::{ErrorType, PauseKind};

type Labels = [(&'static str, &'static str); 2];

/// The run gauges, read fresh by whoever renders the metrics.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunGauges {
    pub active: usize,
    pub paused: usize,
    pub detached: usize,
    /// Pauses parked in the store (#46): in no process's memory.
    pub parked: usize,
}

/// Every metric of the process. Cheap to share behind an `Arc`.
pub struct Metrics {
    registry: Registry,
    /// SSE streams of live runs currently open (attached to a client).
    pub open_streams: Gauge,
    paused_runs: Gauge,
    active_runs: Gauge,
    detached_runs: Gauge,
    parked_runs: Gauge,
    decisions: Family<Labels, Counter>,
    pauses: Family<Labels, Counter>,
    errors: Family<[(&'static str, &'static str); 1], Counter>,
    confirmation_wait: Histogram,
    first_chunk: Histogram,
    forwarded: Counter,
    link_refusals: Counter,
    webhook_deliveries: Family<Labels, Counter>,
    webhook_queue_depth: Gauge,
    webhook_oldest: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// By rule name: names come from the server's tools file (at most 256).
    policy_decisions: Family<PolicyLabels, Counter>,
}

type PolicyLabels = [(&'static str, String); 3];

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("chatgate");
        let open_streams = Gauge::default();
        let paused_runs = Gauge::default();
        let active_runs = Gauge::default();
        let detached_runs = Gauge::default();
        let parked_runs = Gauge::default();
        let decisions = Family::<Labels, Counter>::default();
        let pauses = Family::<Labels, Counter>::default();
        let errors = Family::<[(&'static str, &'static str); 1], Counter>::default();
        // 10 ms .. ~1.4 h: a pause lasts from a scripted instant to a human's hour.
        let confirmation_wait = Histogram::new(exponential_buckets(0.01, 4.0, 10));
        // 50 µs .. ~13 s.
        let first_chunk = Histogram::new(exponential_buckets(0.000_05, 4.0, 10));
        registry.register(
            "open_streams",
            "Open SSE streams of live runs",
            open_streams.clone(),
        );
        registry.register(
            "active_runs",
            "Runs registered (streaming, paused or detached)",
            active_runs.clone(),
        );
        registry.register(
            "paused_runs",
            "Runs paused on an undecided confirmation",
            paused_runs.clone(),
        );
        registry.register(
            "confirmation_decisions",
            "Decisions on confirmations by action (confirm, modify, cancel, timeout, superseded, client_gone, shutdown) and outcome (accepted, refused)",
            decisions.clone(),
        );
        registry.register(
            "pauses",
            "Pauses ended, by kind (approval, question) and outcome (confirm, modify, answer, skip, cancel, timeout, superseded, client_gone, shutdown)",
            pauses.clone(),
        );
        registry.register(
            "detached_runs",
            "Runs whose client went away, kept for re-attach during the grace",
            detached_runs.clone(),
        );
        registry.register(
            "parked_runs",
            "Paused runs parked in the store: waiting on a decision in no process's memory",
            parked_runs.clone(),
        );
        registry.register("errors", "Error chunks sent, by error_type", errors.clone());
        registry.register(
            "confirmation_wait_seconds",
            "Time from a confirmation request to its decision",
            confirmation_wait.clone(),
        );
        let forwarded = Counter::default();
        registry.register(
            "forwarded_requests",
            "Requests forwarded to the replica that owns their session",
            forwarded.clone(),
        );
        let link_refusals = Counter::default();
        registry.register(
            "link_refusals",
            "Decision links refused: forged, altered, expired or signed with another secret",
            link_refusals.clone(),
        );
        registry.register(
            "time_to_first_chunk_seconds",
            "Time from accepting a run to writing its first chunk",
            first_chunk.clone(),
        );
        let webhook_deliveries = Family::<Labels, Counter>::default();
        registry.register(
            "webhook_deliveries",
            "Webhook delivery attempts by event type and outcome (delivered, failed: tried again later, dropped: given up, overflow: the memory outbox was full)",
            webhook_deliveries.clone(),
        );
        let webhook_queue_depth = Gauge::default();
        registry.register(
            "webhook_queue_depth",
            "Webhook events not delivered yet (one per event and URL)",
            webhook_queue_depth.clone(),
        );
        let webhook_oldest = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "webhook_oldest_undelivered_seconds",
            "Age of the oldest webhook event not delivered yet (0 when none)",
            webhook_oldest.clone(),
        );
        let policy_decisions = Family::<PolicyLabels, Counter>::default();
        registry.register(
            "policy_decisions",
            "Calls a rule of the tools file matched, by rule, decision (allow, ask, deny) and mode (enforce: it decided; shadow: it would have)",
            policy_decisions.clone(),
        );
        Metrics {
            registry,
            policy_decisions,
            webhook_deliveries,
            webhook_queue_depth,
            webhook_oldest,
            open_streams,
            paused_runs,
            active_runs,
            detached_runs,
            parked_runs,
            decisions,
            pauses,
            errors,
            confirmation_wait,
            first_chunk,
            forwarded,
            link_refusals,
        }
    }

    /// A decision link's token was refused.
    pub fn link_refused(&self) {
        self.link_refusals.inc();
    }

    /// A request was forwarded to its session's owner.
    pub fn forwarded(&self) {
        self.forwarded.inc();
    }

    /// A webhook delivery attempt of an event of type `event` ended with `outcome`.
    pub fn webhook_delivery(&self, event: &'static str, outcome: &'static str) {
        self.webhook_deliveries
            .get_or_create(&[("type", event), ("outcome", outcome)])
            .inc();
    }

    /// The webhook outbox: `depth` events, the oldest queued at `oldest_ms`.
    pub fn webhook_queue(&self, depth: u64, oldest_ms: Option<u64>) {
        self.webhook_queue_depth.set(depth as i64);
        let age = oldest_ms.map_or(0.0, |at| {
            crate::clock::now_ms().saturating_sub(at) as f64 / 1000.0
        });
        self.webhook_oldest.set(age);
    }

    /// A rule matched a call (`mode`: it decided, or only would have).
    pub fn policy_decision(&self, rule: &str, decision: &'static str, mode: &'static str) {
        self.policy_decisions
            .get_or_create(&[
                ("rule", rule.to_owned()),
                ("decision", decision.to_owned()),
                ("mode", mode.to_owned()),
            ])
            .inc();
    }

    pub fn decision(&self, action: &'static str, outcome: &'static str) {
        self.decisions
            .get_or_create(&[("action", action), ("outcome", outcome)])
            .inc();
    }

    /// A pause of `kind` ended with `outcome` (an action or a cancel reason).
    pub fn pause_ended(&self, kind: PauseKind, outcome: &'static str) {
        self.pauses
            .get_or_create(&[("kind", kind.as_str()), ("outcome", outcome)])
            .inc();
    }

    pub fn error(&self, error_type: ErrorType) {
        self.errors
            .get_or_create(&[("error_type", error_type.as_str())])
            .inc();
    }

    pub fn confirmation_waited(&self, waited: Duration) {
        self.confirmation_wait.observe(waited.as_secs_f64());
    }

    pub fn first_chunk_after(&self, elapsed: Duration) {
        self.first_chunk.observe(elapsed.as_secs_f64());
    }

    /// The OpenMetrics exposition, with the run gauges set to `gauges`.
    pub fn render_openmetrics(&self, gauges: RunGauges) -> String {
        self.active_runs.set(gauges.active as i64);
        self.paused_runs.set(gauges.paused as i64);
        self.detached_runs.set(gauges.detached as i64);
        self.parked_runs.set(gauges.parked as i64);
        let mut out = String::with_capacity(4096);
        // Writing into a String cannot fail.
        encode(&mut out, &self.registry).expect("encode metrics into a String");
        out
    }

    /// The Prometheus text format 0.0.4 (what `promtool check metrics` and
    /// scrapers that do not ask for OpenMetrics read): the same samples, with
    /// a counter's HELP and TYPE under its sample name (`x_total`), no
    /// `# UNIT` and no `# EOF`.
    pub fn render_text(&self, gauges: RunGauges) -> String {
        to_text_format(&self.render_openmetrics(gauges))
    }
}

fn to_text_format(openmetrics: &str) -> String {
    let counters: Vec<&str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(&name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        match renamed {
            Some(line) => out.push_str(&line),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_format_names_counters_by_their_samples_and_has_no_eof() {
        let metrics = Metrics::new();
        metrics.decision("confirm", "accepted");
        metrics.error(ErrorType::Overloaded);

        let text = metrics.render_text(RunGauges::default());

        for family in [
            "chatgate_confirmation_decisions_total",
            "chatgate_errors_total",
        ] {
            assert!(text.contains(&format!("# HELP {family} ")), "{text}");
            assert!(text.contains(&format!("# TYPE {family} counter")), "{text}");
            assert!(text.contains(&format!("{family}{{")), "{text}");
        }
        assert!(!text.contains("# EOF"));
        assert!(metrics
            .render_openmetrics(RunGauges::default())
            .ends_with("# EOF\n"));
    }
}
