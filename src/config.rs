//! Settings of the server: command-line flags, each also read from `CHATGATE_<NAME>`.
//!
//! Timing flags take durations (`300s`, `500ms`, `1h 30m`); a bare number is
//! read in the unit of the flag's old `*-secs` / `*-ms` spelling, which is
//! still accepted as an alias, as are the old environment variables (see
//! [`apply_legacy_env`]). Every flag's range is checked at start.

use std::fmt;
use std::time::Duration;

use clap::builder::TypedValueParser;
use clap::{Args, Parser, ValueEnum};
use secrecy::SecretString;

mod parse;

pub use self::parse::DurationArg;
use self::parse::{
    parse_advertise_url, parse_bind, parse_count, parse_public_url, parse_replica_id,
    parse_webhook_url, text, DAY, HOUR,
};

use crate::cluster::OWNER_TTL;
use crate::confirmation::MAX_RUNS;
use crate::engine::llm::{
    CONVERSATION_MEMORY, CONVERSATION_TTL, LLM_MAX_TIME, LLM_TIMEOUT, LLM_URL,
};
use crate::http::connection::REQUEST_TIMEOUT;
use crate::run::replay::{REPLAY_BUFFER, REPLAY_BUFFER_BYTES};
use crate::run::settings::{
    CONFIRM_TIMEOUT, KEEP_OUTCOME, MAX_CONFIRM_TIMEOUT, MAX_ROUNDS, STEP_DELAY,
};
use crate::run::stream::{DETACH_GRACE, KEEP_ALIVE, MAX_PARKED, PARK_AFTER};

/// Default of `--shutdown-timeout`: how long shutdown waits for streams to end.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// Old environment variables and the ones that replaced them. A bare number
/// means the same thing in both (seconds, or milliseconds for the step delay).
pub const LEGACY_ENV: &[(&str, &str)] = &[
    ("CHATGATE_CONFIRM_TIMEOUT_SECS", "CHATGATE_CONFIRM_TIMEOUT"),
    ("CHATGATE_KEEP_ALIVE_SECS", "CHATGATE_KEEP_ALIVE"),
    ("CHATGATE_STEP_DELAY_MS", "CHATGATE_STEP_DELAY"),
    ("CHATGATE_DETACH_GRACE_SECS", "CHATGATE_DETACH_GRACE"),
    ("CHATGATE_REQUEST_TIMEOUT_SECS", "CHATGATE_REQUEST_TIMEOUT"),
    (
        "CHATGATE_SHUTDOWN_TIMEOUT_SECS",
        "CHATGATE_SHUTDOWN_TIMEOUT",
    ),
    ("CHATGATE_LLM_TIMEOUT_SECS", "CHATGATE_LLM_TIMEOUT"),
    ("CHATGATE_LLM_MAX_SECS", "CHATGATE_LLM_MAX_TIME"),
    ("CHATGATE_OWNER_TTL_SECS", "CHATGATE_OWNER_TTL"),
];

/// Copies each old environment variable to its new name, unless the new one
/// is set. Call it first thing in `main`, while the process has one thread.
pub fn apply_legacy_env() {
    for (old, new) in LEGACY_ENV {
        if std::env::var_os(new).is_none() {
            if let Some(value) = std::env::var_os(old) {
                std::env::set_var(new, value);
            }
        }
    }
}

/// The engines `--engine` can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EngineKind {
    /// Built in and deterministic: splits a task into steps and asks before "running" them.
    Planner,
    /// A real model behind any OpenAI-compatible chat-completions server.
    Openai,
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self
            .to_possible_value()
            .map(|value| value.get_name().to_owned())
            .unwrap_or_default();
        f.write_str(&name)
    }
}

#[derive(Debug, Clone, Parser)]
#[command(
    name = "chatgate",
    version,
    about = "A chat-stream service that pauses for in-band confirmation",
    after_help = "Durations: 300s, 500ms, 5m, 1h 30m; a bare number is read in the unit of \
                  the flag's old spelling (seconds; milliseconds for --step-delay). The old \
                  spellings (--confirm-timeout-secs, --step-delay-ms, ...) still work."
)]
pub struct Settings {
    #[command(flatten)]
    pub server: ServerFlags,
    #[command(flatten)]
    pub engines: EngineFlags,
    #[command(flatten)]
    pub pauses: PauseFlags,
    #[command(flatten)]
    pub cluster: StoreFlags,
    #[command(flatten)]
    pub tooling: ToolFlags,
    #[command(flatten)]
    pub notify: NotifyFlags,
    #[command(flatten)]
    pub limits: LimitFlags,
}

/// The HTTP server: where it listens, who may call it, how long requests and shutdown take.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Server")]
pub struct ServerFlags {
    /// Address to listen on, HOST:PORT (port 0 picks a free port).
    #[arg(long, env = "CHATGATE_BIND", default_value = "127.0.0.1:8080", value_parser = parse_bind)]
    pub bind: String,
    /// HTTP worker threads (default: one per CPU core). 1 to 1024.
    #[arg(long, env = "CHATGATE_WORKERS", value_parser = parse_count(1, 1024))]
    pub workers: Option<usize>,
    /// Silence before a `: keep-alive` comment is written; 10ms to 1h.
    #[arg(long, alias = "keep-alive-secs", env = "CHATGATE_KEEP_ALIVE",
          default_value = text(KEEP_ALIVE), value_parser = DurationArg::secs(Duration::from_millis(10), HOUR))]
    pub keep_alive: Duration,
    /// Time a client may take to send a request head, and again its body; 100ms to 1h.
    #[arg(long, alias = "request-timeout-secs", env = "CHATGATE_REQUEST_TIMEOUT",
          default_value = text(REQUEST_TIMEOUT), value_parser = DurationArg::secs(Duration::from_millis(100), HOUR))]
    pub request_timeout: Duration,
    /// How long shutdown waits for open streams to send their final chunk; up to 1h.
    #[arg(long, alias = "shutdown-timeout-secs", env = "CHATGATE_SHUTDOWN_TIMEOUT",
          default_value = text(SHUTDOWN_TIMEOUT), value_parser = DurationArg::secs(Duration::ZERO, HOUR))]
    pub shutdown_timeout: Duration,
    /// Browser origin allowed to call the API cross-site (repeatable; none by default).
    #[arg(
        long = "cors-origin",
        env = "CHATGATE_CORS_ORIGIN",
        value_delimiter = ','
    )]
    pub cors_origins: Vec<String>,
    /// Without API keys, a Host name accepted besides loopback names and the
    /// bound address (repeatable), e.g. the name a proxy forwards.
    #[arg(
        long = "allowed-host",
        env = "CHATGATE_ALLOWED_HOST",
        value_delimiter = ','
    )]
    pub allowed_hosts: Vec<String>,
    /// API key clients must send as `Authorization: Bearer KEY` (repeatable;
    /// in the env var, comma-separated). Without keys the chat endpoint is open.
    #[arg(
        long = "api-key",
        env = "CHATGATE_API_KEY",
        value_delimiter = ',',
        hide_env_values = true,
        value_parser = clap::builder::StringValueParser::new().map(SecretString::from)
    )]
    pub api_keys: Vec<SecretString>,
    /// File of API keys, one per line (`#` comments allowed); a line
    /// `approver KEY` is an approver key (see --approver-key). A key may be
    /// followed by attributes: `label=NAME` (what records name it by),
    /// `groups=A,B` (what tools' `approvers` name), `max_risk=low|medium|high`,
    /// `namespaces=LABEL,...` (the requester keys an approver decides for),
    /// `email=ADDR` (approval mail), `slack=USER_ID` (Slack buttons).
    #[arg(long, env = "CHATGATE_API_KEYS_FILE")]
    pub api_keys_file: Option<std::path::PathBuf>,
    /// An approver key (repeatable; in the env var, comma-separated): it may
    /// list and decide the pending pauses of every namespace, naming each by
    /// its confirmation_id, and re-attach to them; it may not start runs.
    #[arg(
        long = "approver-key",
        env = "CHATGATE_APPROVER_KEY",
        value_delimiter = ',',
        hide_env_values = true,
        value_parser = clap::builder::StringValueParser::new().map(SecretString::from)
    )]
    pub approver_keys: Vec<SecretString>,
}

/// The engine behind the stream: the planner, or a model.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Engine")]
pub struct EngineFlags {
    /// Engine behind the stream.
    #[arg(long, env = "CHATGATE_ENGINE", value_enum, default_value_t = EngineKind::Planner)]
    pub engine: EngineKind,
    /// Time the planner spends on each step (0 for benchmarks); up to 1h.
    #[arg(long, alias = "step-delay-ms", env = "CHATGATE_STEP_DELAY",
          default_value = text(STEP_DELAY), value_parser = DurationArg::millis(Duration::ZERO, HOUR))]
    pub step_delay: Duration,
    /// `--engine openai`: base URL of an OpenAI-compatible API, up to `/v1`
    /// (Ollama: http://127.0.0.1:11434/v1).
    #[arg(long, env = "CHATGATE_LLM_URL", default_value = LLM_URL)]
    pub llm_url: String,
    /// `--engine openai`: the model to ask (required with that engine).
    #[arg(long, env = "CHATGATE_LLM_MODEL")]
    pub llm_model: Option<String>,
    /// `--engine openai`: bearer key for the model server, if it needs one.
    #[arg(long, env = "CHATGATE_LLM_API_KEY", hide_env_values = true,
          value_parser = clap::builder::StringValueParser::new().map(SecretString::from))]
    pub llm_api_key: Option<SecretString>,
    /// `--engine openai`: longest silence from the model server, connecting or streaming; 100ms to 1h.
    #[arg(long, alias = "llm-timeout-secs", env = "CHATGATE_LLM_TIMEOUT",
          default_value = text(LLM_TIMEOUT), value_parser = DurationArg::secs(Duration::from_millis(100), HOUR))]
    pub llm_timeout: Duration,
    /// `--engine openai`: longest one model call may take in all, however
    /// often the server sends something; 1s to 1 day.
    #[arg(long, alias = "llm-max-secs", env = "CHATGATE_LLM_MAX_TIME",
          default_value = text(LLM_MAX_TIME), value_parser = DurationArg::secs(Duration::from_secs(1), DAY))]
    pub llm_max_time: Duration,
    /// `--engine openai`: a conversation nobody used for this long is forgotten; 1s to 30 days.
    #[arg(long, env = "CHATGATE_CONVERSATION_TTL", default_value = text(CONVERSATION_TTL),
          value_parser = DurationArg::secs(Duration::from_secs(1), MAX_CONFIRM_TIMEOUT))]
    pub conversation_ttl: Duration,
    /// `--engine openai`: bytes of conversation history kept for all sessions
    /// together; the least recently used go first. 1 MiB to 16 GiB.
    #[arg(long, env = "CHATGATE_CONVERSATION_MEMORY", default_value_t = CONVERSATION_MEMORY,
          value_parser = parse_count(1 << 20, 16 << 30))]
    pub conversation_memory: usize,
    /// `--engine openai`: do not offer the model the built-in `ask_user`
    /// tool (its questions to the user, as an `input_request`).
    #[arg(long, env = "CHATGATE_NO_ASK_USER")]
    pub no_ask_user: bool,
}

/// How long a pause waits, how many rounds a run has, what a decision may carry.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Pauses and decisions")]
pub struct PauseFlags {
    /// How long a confirmation waits before the run is cancelled (reason `timeout`); 1s to 30 days.
    #[arg(long, alias = "confirm-timeout-secs", env = "CHATGATE_CONFIRM_TIMEOUT",
          default_value = text(CONFIRM_TIMEOUT), value_parser = DurationArg::secs(Duration::from_secs(1), MAX_CONFIRM_TIMEOUT))]
    pub confirm_timeout: Duration,
    /// Confirmation rounds a run may use; one more modify cancels it (reason
    /// `max_rounds`). 1 to 100.
    #[arg(long, env = "CHATGATE_MAX_ROUNDS", default_value_t = MAX_ROUNDS,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub max_rounds: u32,
    /// How long a working run whose client vanished stays re-attachable
    /// before it is cancelled with reason `client_gone` (a paused run waits
    /// for its decision instead; its grace starts once it is decided), and
    /// how long an ended run's end can still be read. 0 (at once) to 1 day.
    #[arg(long, alias = "detach-grace-secs", env = "CHATGATE_DETACH_GRACE",
          default_value = text(DETACH_GRACE), value_parser = DurationArg::secs(Duration::ZERO, DAY))]
    pub detach_grace: Duration,
    /// With a durable store (`sqlite:`, `redis://`): how long a paused run
    /// that no client holds stays in memory before it is parked (its pause
    /// then costs its stored record; a decision, a re-attach or its timers
    /// wake it). 0s (at once) to 1 day. The memory store never parks.
    #[arg(long, env = "CHATGATE_PARK_AFTER",
          default_value = text(PARK_AFTER), value_parser = DurationArg::secs(Duration::ZERO, DAY))]
    pub park_after: Duration,
    /// How long a run's outcome (its final chunk, what ran, who decided) can
    /// be read after its end, by re-attach or `GET /api/v1/runs/SESSION`:
    /// kept in the store (memory: at most 20,000 runs; sqlite: at most
    /// 1,000,000; redis: by time). 0 (not kept past the grace) to 30 days.
    #[arg(long, env = "CHATGATE_KEEP_OUTCOME",
          default_value = text(KEEP_OUTCOME), value_parser = DurationArg::secs(Duration::ZERO, 30 * DAY))]
    pub keep_outcome: Duration,
    /// A `decisions` reply must name every task of the pause (else 422
    /// `undecided_tasks`); without it, tasks a reply does not name are
    /// approved.
    #[arg(long, env = "CHATGATE_EXPLICIT_DECISIONS")]
    pub explicit_decisions: bool,
    /// The longest a grant given with a confirm may last (its `ttl`; a
    /// grant that names none lasts this long). 1s to 7 days.
    #[arg(long, env = "CHATGATE_MAX_GRANT_TTL",
          default_value = text(crate::pause::grant::MAX_GRANT_TTL),
          value_parser = DurationArg::secs(Duration::from_secs(1), crate::pause::grant::MAX_GRANT_TTL_LIMIT))]
    pub max_grant_ttl: Duration,
}

/// Where paused runs are kept, and the replicas sharing them.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Store and cluster")]
pub struct StoreFlags {
    /// Where paused runs are kept: `memory` (they end with the process),
    /// `sqlite:PATH` (one node: they survive a restart or a crash) or
    /// `redis://HOST:PORT/DB` (replicas: a reply may land on any of them).
    #[arg(long, env = "CHATGATE_STORE", default_value = "memory")]
    pub store: String,
    /// With `redis://`: this replica's name (letters, digits, `.`, `_`, `-`;
    /// generated at start when not given).
    #[arg(long, env = "CHATGATE_REPLICA_ID", value_parser = parse_replica_id)]
    pub replica_id: Option<String>,
    /// With `redis://` (required): the URL where the other replicas reach
    /// this one, e.g. http://10.0.0.5:8080.
    #[arg(long, env = "CHATGATE_ADVERTISE_URL", value_parser = parse_advertise_url)]
    pub advertise_url: Option<String>,
    /// With `redis://` (required): a secret all replicas share, at least 16
    /// characters; forwarded requests carry it, so no client can pose as a replica.
    #[arg(long, env = "CHATGATE_CLUSTER_SECRET", hide_env_values = true,
          value_parser = clap::builder::StringValueParser::new().map(SecretString::from))]
    pub cluster_secret: Option<SecretString>,
    /// With `redis://`: how long a replica's ownership of its runs outlives
    /// its last heartbeat; then another replica may take them over. 1s to 1h.
    #[arg(long, alias = "owner-ttl-secs", env = "CHATGATE_OWNER_TTL",
          default_value = text(OWNER_TTL), value_parser = DurationArg::secs(Duration::from_secs(1), HOUR))]
    pub owner_ttl: Duration,
    /// With `redis://`: how a paused run's record is kept in Redis:
    /// `compressed` (zstd, about a fifth of its JSON) or `json`, which
    /// replicas of versions before compressed records can read: roll an
    /// upgrade from one of those with `json`, then again without it.
    #[arg(long, env = "CHATGATE_REDIS_RECORDS", value_enum, default_value_t = RecordFormat::Compressed)]
    pub redis_records: RecordFormat,
}

/// How `--redis-records` keeps a paused run's record in Redis (every
/// version of this one reads both).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RecordFormat {
    /// zstd against the record dictionary (`store::compact`).
    Compressed,
    /// JSON text, as versions before compressed records wrote and read.
    Json,
}

/// Declared tools and the audit log of what they did.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Tools")]
pub struct ToolFlags {
    /// TOML file of tools a confirmed plan may run: `[[tool]]` commands and
    /// http calls, `[[mcp]]` MCP servers (docs/tools.md).
    #[arg(long, env = "CHATGATE_TOOLS")]
    pub tools: Option<std::path::PathBuf>,
    /// JSON Lines file recording every proposal, decision, tool call and end,
    /// synced before chatgate acts on it; if it cannot be written nothing runs.
    #[arg(long, env = "CHATGATE_AUDIT_LOG")]
    pub audit_log: Option<std::path::PathBuf>,
    /// Ed25519 private key (PKCS#8 PEM) receipts are signed with; replicas
    /// share the file. Repeat for older keys (private or public PEM), still
    /// published in /.well-known/jwks.json. Without it, a key is made at
    /// start and its receipts verify only against this process.
    #[arg(
        long = "receipt-key",
        env = "CHATGATE_RECEIPT_KEY",
        value_delimiter = ','
    )]
    pub receipt_keys: Vec<std::path::PathBuf>,
}

/// Webhooks, decision links, Slack and mail.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Notifications")]
pub struct NotifyFlags {
    /// POST every pause's events (requested, decided, expired, run ended),
    /// signed, to this http(s) URL (repeatable; in the env var,
    /// comma-separated). Needs --webhook-secret.
    #[arg(long = "webhook", env = "CHATGATE_WEBHOOK", value_delimiter = ',',
          value_parser = parse_webhook_url)]
    pub webhooks: Vec<String>,
    /// The key webhook bodies are signed with (HMAC-SHA256), at least 16 characters.
    #[arg(long, env = "CHATGATE_WEBHOOK_SECRET", hide_env_values = true,
          value_parser = clap::builder::StringValueParser::new().map(SecretString::from))]
    pub webhook_secret: Option<SecretString>,
    /// How long an undelivered webhook event is tried again before it is
    /// dropped; 1s to 7 days.
    #[arg(long, env = "CHATGATE_WEBHOOK_RETRY_FOR",
          default_value = text(crate::webhook::RETRY_FOR),
          value_parser = DurationArg::secs(Duration::from_secs(1), 7 * DAY))]
    pub webhook_retry_for: Duration,
    /// The hosts an A2A push config may name (repeatable; in the env var,
    /// comma-separated): a name matches itself, `*.example.com` its
    /// subdomains, an address only itself written the same. Without any,
    /// a push URL may name any host (restrict egress instead).
    #[arg(
        long = "a2a-push-host",
        env = "CHATGATE_A2A_PUSH_HOST",
        value_delimiter = ','
    )]
    pub a2a_push_hosts: Vec<String>,
    /// Where people open the page (e.g. `https://gate.example.com`): webhook
    /// events then carry a `decide_url`, the page opened on their session.
    #[arg(long, env = "CHATGATE_PUBLIC_URL", value_parser = parse_public_url)]
    pub public_url: Option<String>,
    /// With --public-url: sign decision links (`URL/d/<token>`, one per
    /// pause and person who may decide it) with this key, at least 32
    /// characters. Changing it voids every link.
    #[arg(long, env = "CHATGATE_LINK_SECRET", hide_env_values = true,
          value_parser = clap::builder::StringValueParser::new().map(SecretString::from))]
    pub link_secret: Option<SecretString>,
    /// A Slack incoming-webhook URL: every approval pause is posted there
    /// as a message with Approve and Reject buttons. Needs --link-secret.
    #[arg(long, env = "CHATGATE_SLACK_WEBHOOK", value_parser = parse_webhook_url)]
    pub slack_webhook: Option<String>,
    /// The Slack app's signing secret: enables `POST /api/v1/slack/actions`,
    /// the app's interactivity request URL (requests it does not sign are 401).
    #[arg(long, env = "CHATGATE_SLACK_SIGNING_SECRET", hide_env_values = true,
          value_parser = clap::builder::StringValueParser::new().map(SecretString::from))]
    pub slack_signing_secret: Option<SecretString>,
    /// Mail each approver with an `email=` a pause's decision link:
    /// `smtp://[user[:password]@]host[:port]` (STARTTLS when offered) or
    /// `smtps://...`. Needs --mail-from and --link-secret.
    #[arg(long, env = "CHATGATE_SMTP", hide_env_values = true,
          value_parser = clap::builder::StringValueParser::new().map(SecretString::from))]
    pub smtp: Option<SecretString>,
    /// The SMTP password, when the --smtp URL has a user and no password.
    #[arg(long, env = "CHATGATE_SMTP_PASSWORD", hide_env_values = true,
          value_parser = clap::builder::StringValueParser::new().map(SecretString::from))]
    pub smtp_password: Option<SecretString>,
    /// The sender of approval mail (`gate@example.com`, or
    /// `chatgate <gate@example.com>`).
    #[arg(long, env = "CHATGATE_MAIL_FROM")]
    pub mail_from: Option<String>,
}

/// Bounds on what clients can make the server hold.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Limits")]
pub struct LimitFlags {
    /// Chunks kept per run for re-attach; an attached client that falls this far
    /// behind stops the run (reason `slow_consumer`). 1 to 1,048,576.
    #[arg(long, env = "CHATGATE_REPLAY_BUFFER", default_value_t = REPLAY_BUFFER,
          value_parser = parse_count(1, 1 << 20))]
    pub replay_buffer: usize,
    /// Bytes of chunks kept per run for re-attach (the newest chunk is always
    /// kept); the same slow-client rule applies. 4 KiB to 1 GiB.
    #[arg(long, env = "CHATGATE_REPLAY_BUFFER_BYTES", default_value_t = REPLAY_BUFFER_BYTES,
          value_parser = parse_count(4096, 1 << 30))]
    pub replay_buffer_bytes: usize,
    /// Runs held at once; beyond it new runs get 503 `overloaded` with
    /// Retry-After. 1 to 10,000,000.
    #[arg(long, env = "CHATGATE_MAX_RUNS", default_value_t = MAX_RUNS,
          value_parser = parse_count(1, 10_000_000))]
    pub max_runs: usize,
    /// Runs one API key may hold at once (default with keys: a quarter of
    /// --max-runs; without keys the one anonymous namespace may use all of
    /// it). 1 to 10,000,000.
    #[arg(long, env = "CHATGATE_MAX_RUNS_PER_KEY", value_parser = parse_count(1, 10_000_000))]
    pub max_runs_per_key: Option<usize>,
    /// Paused runs parked at once (`--park-after`, a durable store): each
    /// costs its record on disk and 8 bytes of memory; beyond it a paused
    /// run stays in memory, held against --max-runs. 0 (none parks) to
    /// 100,000,000.
    #[arg(long, env = "CHATGATE_MAX_PARKED", default_value_t = MAX_PARKED,
          value_parser = parse_count(0, 100_000_000))]
    pub max_parked: usize,
}

impl Settings {
    /// The defaults, with `bind` replaced (tests use `127.0.0.1:0`).
    pub fn for_bind(bind: &str) -> Settings {
        Settings::parse_from(["chatgate", "--bind", bind])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use secrecy::ExposeSecret;

    fn settings(args: &[&str]) -> Result<Settings, clap::Error> {
        Settings::try_parse_from(std::iter::once("chatgate").chain(args.iter().copied()))
    }

    #[test]
    fn a_grant_may_last_at_most_its_documented_limit() {
        let s = settings(&["--max-grant-ttl", "7d"]).unwrap();
        assert_eq!(
            s.pauses.max_grant_ttl,
            crate::pause::grant::MAX_GRANT_TTL_LIMIT
        );
        assert_eq!(
            settings(&[]).unwrap().pauses.max_grant_ttl,
            crate::pause::grant::MAX_GRANT_TTL
        );
        for refused in ["7d 1s", "8d", "0s"] {
            assert!(
                settings(&["--max-grant-ttl", refused]).is_err(),
                "--max-grant-ttl {refused}"
            );
        }
    }

    #[test]
    fn durations_take_units_and_bare_numbers_keep_the_old_unit() {
        let s = settings(&["--confirm-timeout", "2m", "--keep-alive", "500ms"]).unwrap();
        assert_eq!(s.pauses.confirm_timeout, Duration::from_secs(120));
        assert_eq!(s.server.keep_alive, Duration::from_millis(500));
        let old = settings(&["--confirm-timeout-secs", "7", "--step-delay-ms", "40"]).unwrap();
        assert_eq!(old.pauses.confirm_timeout, Duration::from_secs(7));
        assert_eq!(old.engines.step_delay, Duration::from_millis(40));
        let defaults = settings(&[]).unwrap();
        assert_eq!(defaults.pauses.confirm_timeout, CONFIRM_TIMEOUT);
        assert_eq!(defaults.server.keep_alive, KEEP_ALIVE);
        assert_eq!(defaults.engines.step_delay, STEP_DELAY);
        assert_eq!(defaults.pauses.detach_grace, DETACH_GRACE);
        assert_eq!(defaults.server.request_timeout, REQUEST_TIMEOUT);
        assert_eq!(defaults.server.shutdown_timeout, SHUTDOWN_TIMEOUT);
        assert_eq!(defaults.engines.llm_timeout, LLM_TIMEOUT);
        assert_eq!(defaults.engines.llm_max_time, LLM_MAX_TIME);
        assert_eq!(defaults.engines.conversation_ttl, CONVERSATION_TTL);
        assert_eq!(defaults.cluster.owner_ttl, OWNER_TTL);
        assert_eq!(defaults.pauses.max_rounds, MAX_ROUNDS);
        assert_eq!(defaults.limits.max_runs, MAX_RUNS);
        assert_eq!(defaults.limits.replay_buffer, REPLAY_BUFFER);
        assert_eq!(defaults.limits.replay_buffer_bytes, REPLAY_BUFFER_BYTES);
        assert_eq!(defaults.engines.conversation_memory, CONVERSATION_MEMORY);
        assert_eq!(defaults.engines.llm_url, LLM_URL);
    }

    #[test]
    fn out_of_range_values_are_refused_at_start_with_the_flag_named() {
        for args in [
            &["--confirm-timeout-secs", "253402300800"][..],
            &["--confirm-timeout-secs", "18446744073709551615"][..],
            &["--confirm-timeout", "31days"][..],
            &["--confirm-timeout", "0"][..],
            &["--keep-alive", "0"][..],
            &["--request-timeout", "10years"][..],
            &["--max-runs", "0"][..],
            &["--replay-buffer", "0"][..],
            &["--max-rounds", "0"][..],
            &["--confirm-timeout", "soon"][..],
            &["--bind", "127.0.0.1"][..],
            &["--bind", "127.0.0.1:99999"][..],
        ] {
            let err = settings(args).expect_err("refused").to_string();
            let flag = args[0].trim_end_matches("-secs");
            assert!(err.contains(flag), "{args:?}: {err}");
        }
    }

    #[test]
    fn secrets_never_show_in_debug_output() {
        let s = settings(&["--api-key", "sk-top", "--llm-api-key", "sk-model"]).unwrap();
        let printed = format!("{s:?}");
        assert!(!printed.contains("sk-top") && !printed.contains("sk-model"));
        assert_eq!(s.server.api_keys[0].expose_secret(), "sk-top");
    }
}
