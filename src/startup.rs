//! Build then run: [`Application::build`] binds and wires everything and
//! reports the real port; [`Application::run_until_stopped`] serves until a
//! signal (or [`Application::shutdown_token`]) asks it to stop, then drains.
//! Tests and the binary start the server the same way.

mod notifications;

use self::notifications::{open_links, open_receipts, open_webhooks, WebhookSender};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use actix_http::{HttpService, KeepAlive};
use actix_service::{fn_service, map_config, ServiceFactoryExt};
use actix_web::dev::{AppConfig, Server};
use actix_web::middleware::from_fn;
use actix_web::{web, App};
use secrecy::{ExposeSecret, SecretString};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::audit::{AuditError, AuditLog};
use crate::cluster::{Cluster, ClusterConfig};
use crate::config::{EngineKind, RecordFormat, Settings};
use crate::confirmation::{ConfirmationManager, RunLimits};
#[cfg(feature = "openai")]
use crate::engine::llm::OpenAiConfig;
#[cfg(feature = "openai")]
use crate::engine::openai::OpenAiEngine;
use crate::engine::planner::PlannerEngine;
use crate::http::access::{read_keys_file, AccessPolicy, KeyAttrs};
use crate::http::access_log;
use crate::http::connection::{self, GuardedStream};
use crate::http::state::{AppState, SlackApp};
use crate::metrics::Metrics;
use crate::run::engine::Engine;
use crate::run::registry::ReplayRegistry;
use crate::run::replay::ReplayLimits;
use crate::run::settings::RunSettings;
use crate::run::stream::StreamSettings;
use crate::run::{Runs, RunsParts};
use crate::session::Namespaces;
use crate::store::memory::MemoryStore;
use crate::store::sqlite::SqliteStore;
use crate::store::Store;
use crate::tools::{Tools, ToolsFileError};

/// Why the server cannot start: one line each, naming the flag at fault.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("cannot listen on {bind} (--bind): {source}")]
    Bind {
        bind: String,
        source: std::io::Error,
    },
    #[error("cannot read --api-keys-file {}: {source}", path.display())]
    KeysFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Tools(#[from] ToolsFileError),
    #[error("--audit-log: {0}")]
    Audit(#[from] AuditError),
    /// `--store`, or a replica flag it needs.
    #[error("{0}")]
    Store(String),
    /// `--engine` and the flags it needs.
    #[error("{0}")]
    Engine(String),
    /// `--webhook` and the flags it needs.
    #[error("{0}")]
    Webhook(String),
    /// `--receipt-key`.
    #[error("{0}")]
    Receipts(String),
}

pub struct Application {
    address: SocketAddr,
    server: Server,
    state: AppState,
    shutdown_timeout: Duration,
}

impl Application {
    /// Binds `settings.bind` and prepares the server; nothing is served until
    /// [`Application::run_until_stopped`].
    pub async fn build(settings: Settings) -> Result<Application, StartupError> {
        let engine = build_engine(&settings)?;
        Application::build_with_engine(settings, engine).await
    }

    /// Like [`Application::build`], with an engine supplied by the caller.
    pub async fn build_with_engine(
        settings: Settings,
        engine: Arc<dyn Engine>,
    ) -> Result<Application, StartupError> {
        let mut keys: Vec<SecretString> = settings.server.api_keys.clone();
        let mut approvers: Vec<SecretString> = settings.server.approver_keys.clone();
        // Keys given as flags have no attributes; the file's follow them.
        let mut key_attrs = vec![KeyAttrs::default(); keys.len()];
        let mut approver_attrs = vec![KeyAttrs::default(); approvers.len()];
        if let Some(path) = &settings.server.api_keys_file {
            let from_file = read_keys_file(path).map_err(|source| StartupError::KeysFile {
                path: path.clone(),
                source,
            })?;
            keys.extend(from_file.keys.into_iter().map(SecretString::from));
            approvers.extend(from_file.approvers.into_iter().map(SecretString::from));
            key_attrs.extend(from_file.key_attrs);
            approver_attrs.extend(from_file.approver_attrs);
        }
        // An empty key is no key (with its attributes).
        let (approvers, approver_attrs): (Vec<&str>, Vec<KeyAttrs>) = approvers
            .iter()
            .map(ExposeSecret::expose_secret)
            .zip(approver_attrs)
            .filter(|(key, _)| !key.is_empty())
            .unzip();
        // A key's place in this list is its owner, for access and stores alike.
        let (keys, key_attrs): (Vec<&str>, Vec<KeyAttrs>) = keys
            .iter()
            .map(ExposeSecret::expose_secret)
            .zip(key_attrs)
            .filter(|(key, _)| !key.is_empty())
            .unzip();
        let namespaces = Namespaces::of_keys(keys.iter().copied())
            .with_labels(key_attrs.iter().map(|a| a.label.clone()).collect());
        let access = AccessPolicy::new(&keys, settings.server.cors_origins.clone())
            .with_approvers(&approvers)
            .with_attributes(key_attrs, approver_attrs);
        let webhooks = open_webhooks(&settings).map_err(StartupError::Webhook)?;
        let cluster = open_cluster(&settings, &namespaces)?;
        let bind_error = |source| StartupError::Bind {
            bind: settings.server.bind.clone(),
            source,
        };
        let listener = TcpListener::bind(&settings.server.bind).map_err(bind_error)?;
        let address = listener.local_addr().map_err(bind_error)?;
        let mut allowed_hosts = settings.server.allowed_hosts.clone();
        // Forwarded requests name this replica's advertised address.
        allowed_hosts.extend(cluster.as_ref().and_then(|c| c.advertised_host()));
        let access = access.with_hosts(address, &allowed_hosts);
        if !access.requires_keys() && !address.ip().is_loopback() {
            log::warn!(
                "listening on {address} without API keys: anyone who can reach this address can \
                 start and decide runs; set --api-key or --api-keys-file, or bind 127.0.0.1"
            );
        }
        let metrics = Arc::new(Metrics::new());
        let replays = ReplayRegistry::default();
        let store = match &cluster {
            Some(cluster) => cluster.store().clone(),
            None => open_store(&settings.cluster.store, settings.pauses.detach_grace)?,
        };
        let stream = Arc::new(StreamSettings {
            keep_alive: settings.server.keep_alive,
            detach_grace: settings.pauses.detach_grace,
            // The memory store never parks: what it keeps is memory.
            park_after: store.is_durable().then_some(settings.pauses.park_after),
            max_parked: settings.limits.max_parked,
            metrics: metrics.clone(),
            registry: replays.clone(),
        });
        let run_settings = RunSettings {
            confirm_timeout: settings.pauses.confirm_timeout,
            max_rounds: settings.pauses.max_rounds,
            step_delay: settings.engines.step_delay,
            tools: Arc::new(load_tools(&settings).await?),
            audit: settings
                .tooling
                .audit_log
                .as_deref()
                .map(AuditLog::open)
                .transpose()?,
            store,
            engine_name: engine.name(),
            namespaces,
            webhooks,
            keep_outcome: settings.pauses.keep_outcome,
            explicit_decisions: settings.pauses.explicit_decisions,
            max_grant_ttl: settings.pauses.max_grant_ttl,
            links: open_links(&settings, &access).map_err(StartupError::Webhook)?,
            receipts: Arc::new(open_receipts(&settings).map_err(StartupError::Receipts)?),
        };
        let runs = Runs::new(RunsParts {
            replays,
            engine,
            settings: Arc::new(run_settings),
            replay_limits: ReplayLimits {
                frames: settings.limits.replay_buffer,
                bytes: settings.limits.replay_buffer_bytes,
            },
            limits: RunLimits::for_keys(
                settings.limits.max_runs,
                settings.limits.max_runs_per_key,
                access.requires_keys(),
            ),
            stream,
            metrics,
            cluster,
        });
        let state = AppState {
            runs,
            access,
            request_timeout: settings.server.request_timeout,
            slack: settings
                .notify
                .slack_signing_secret
                .clone()
                .map(|signing_secret| {
                    Arc::new(SlackApp {
                        signing_secret,
                        http: reqwest::Client::builder()
                            .timeout(Duration::from_secs(10))
                            .build()
                            .unwrap_or_default(),
                    })
                }),
            a2a: Arc::new(crate::run::a2a::A2aTasks::new(
                settings.notify.a2a_push_hosts.clone(),
            )),
            public_url: settings.notify.public_url.clone(),
        };
        let server = serve(listener, &settings, state.clone()).map_err(bind_error)?;
        Ok(Application {
            address,
            server,
            state,
            shutdown_timeout: settings.server.shutdown_timeout,
        })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    pub fn port(&self) -> u16 {
        self.address.port()
    }

    /// The run registry, for inspection (tests, metrics).
    pub fn manager(&self) -> ConfirmationManager {
        self.state.runs.manager().clone()
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        self.state.runs.metrics().clone()
    }

    /// The runs' replay buffers, for inspection (tests).
    pub fn replays(&self) -> ReplayRegistry {
        self.state.runs.replays().clone()
    }

    /// Cancelling this token shuts the server down exactly like SIGTERM.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.state.runs.shutdown_token().clone()
    }

    /// Serves until SIGINT, SIGTERM or the shutdown token; then every open
    /// stream gets its final `cancelled` chunk (reason `shutdown`), and the
    /// server stops once they are sent or `--shutdown-timeout-secs` passes.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let Application {
            mut server,
            state,
            shutdown_timeout,
            ..
        } = self;
        let handle = server.handle();
        let cluster = state.runs.cluster().cloned();
        if let Some(cluster) = &cluster {
            // Owns what it starts from the first request on.
            state.runs.start_heartbeat().await;
            state.runs.start_expiry_sweep();
            log::info!(
                "replica {} at {}, store {}",
                cluster.replica_id(),
                cluster.advertise_url(),
                cluster.store().name()
            );
        }
        // Webhook events are sent from the start (a durable store's
        // undelivered ones included) until the server has stopped.
        let sender = WebhookSender::start(&state.runs)?;
        // Paused runs a durable store kept go on before anything else.
        match state.runs.restore().await {
            Ok(0) => {}
            Ok(n) => log::info!("restored {n} paused run(s) from the store"),
            Err(why) => log::error!("cannot restore paused runs: {why}"),
        }
        // Parked pauses' expiries and timers, from the store's schedule.
        state.runs.start_park_sweep();
        tokio::select! {
            served = &mut server => return served,
            () = stop_requested(state.runs.shutdown_token()) => {}
        }
        log::info!(
            "shutting down: ending {} open run(s)",
            state.runs.manager().active_runs()
        );
        // One deadline for everything: runs send their final chunks, then
        // connections finish writing them; whatever is left then is cut.
        let deadline = tokio::time::Instant::now() + shutdown_timeout;
        state.runs.shutdown_token().cancel();
        if tokio::time::timeout_at(deadline, state.runs.manager().wait_until_empty())
            .await
            .is_err()
        {
            log::warn!(
                "shutdown timeout: {} run(s) still open",
                state.runs.manager().active_runs()
            );
        }
        // The stop only completes while the server future is polled: join them.
        let graceful = async { tokio::join!(handle.stop(true), &mut server).1 };
        let served = match tokio::time::timeout_at(deadline, graceful).await {
            Ok(served) => served,
            Err(_) => {
                log::warn!("shutdown timeout: closing the remaining connections");
                tokio::join!(handle.stop(false), server).1
            }
        };
        if let Some(cluster) = &cluster {
            cluster.leave().await;
        }
        sender.stop().await;
        log::info!("stopped");
        served
    }
}

/// The HTTP server: actix-web's app on actix-http's HTTP/1 service, as
/// `HttpServer` would build it, except that every socket is a
/// [`GuardedStream`] (see [`crate::connection`]: every request on a
/// connection gets the head deadline, not only the first).
fn serve(listener: TcpListener, settings: &Settings, state: AppState) -> std::io::Result<Server> {
    let address = listener.local_addr()?;
    let request_timeout = settings.server.request_timeout;
    let data = web::Data::new(state);
    let mut builder = Server::build()
        // Signals are ours (see run_until_stopped): streams must get their
        // final chunk before actix stops the workers.
        .disable_signals()
        .shutdown_timeout(settings.server.shutdown_timeout.as_secs());
    if let Some(workers) = settings.server.workers {
        builder = builder.workers(workers);
    }
    // Idle kept-alive connections close at once when a graceful stop starts.
    let stopping = builder.graceful_shutdown_signal();
    let server = builder.listen("chatgate", listener, move || {
        let app = App::new()
            .wrap(from_fn(connection::mark_requests))
            .wrap(from_fn(access_log::log_request))
            .app_data(data.clone())
            .configure(crate::http::configure);
        let stopping = stopping.clone();
        let http = HttpService::build()
            // `graceful_shutdown_signal` is what actix-web's HttpServer
            // passes too; it is hidden from actix-http's docs.
            .graceful_shutdown_signal(move || {
                let stopping = stopping.clone();
                async move { stopping.notified().await }
            })
            .keep_alive(KeepAlive::Timeout(connection::KEEP_ALIVE_IDLE))
            // The first request's head; later ones are timed by GuardedStream.
            .client_request_timeout(request_timeout)
            .client_disconnect_timeout(Duration::from_secs(1))
            .local_addr(address)
            .h1(map_config(app, |_| AppConfig::default()));
        fn_service(move |io: TcpStream| async move {
            // Chunks are small writes that must leave at once: without
            // TCP_NODELAY, Nagle holds the first chunk behind the response
            // head until the client's delayed ACK (~40 ms on Linux).
            io.set_nodelay(true)?;
            let peer = io.peer_addr().ok();
            Ok::<_, actix_http::error::DispatchError>((
                GuardedStream::new(io, request_timeout),
                peer,
            ))
        })
        .and_then(http)
    })?;
    Ok(server.run())
}

/// The engine `--engine` names, configured by the other flags.
pub fn build_engine(settings: &Settings) -> Result<Arc<dyn Engine>, StartupError> {
    match settings.engines.engine {
        EngineKind::Planner => Ok(Arc::new(PlannerEngine)),
        #[cfg(not(feature = "openai"))]
        EngineKind::Openai => Err(StartupError::Engine(
            "this chatgate was built without the `openai` feature; rebuild with \
             `cargo build --features openai`"
                .to_owned(),
        )),
        #[cfg(feature = "openai")]
        EngineKind::Openai => {
            let model = settings.engines.llm_model.clone().ok_or_else(|| {
                StartupError::Engine(
                    "--engine openai needs --llm-model (or CHATGATE_LLM_MODEL)".to_owned(),
                )
            })?;
            let config = OpenAiConfig {
                base_url: settings.engines.llm_url.clone(),
                model,
                api_key: settings.engines.llm_api_key.clone(),
                timeout: settings.engines.llm_timeout,
                max_time: settings.engines.llm_max_time,
                conversation_ttl: settings.engines.conversation_ttl,
                conversation_memory: settings.engines.conversation_memory,
                ask_user: !settings.engines.no_ask_user,
            };
            let engine = OpenAiEngine::new(config).map_err(|err| {
                StartupError::Engine(format!("cannot set up the model client: {err}"))
            })?;
            Ok(Arc::new(engine))
        }
    }
}

/// The tools of `--tools` (none without it).
async fn load_tools(settings: &Settings) -> Result<Tools, StartupError> {
    let Some(path) = &settings.tooling.tools else {
        return Ok(Tools::default());
    };
    let mut tools = Tools::load(path)?;
    tools.start_mcp().await?;
    // Their names, in file order (cut, for a file of hundreds).
    let mut names = String::new();
    for tool in tools.iter() {
        if names.len() > 2000 {
            names.push_str(", ...");
            break;
        }
        if !names.is_empty() {
            names.push_str(", ");
        }
        names.push_str(&tool.name);
    }
    log::info!(
        "{} tool(s) offered from {}: {names} (GET /api/v1/tools lists them)",
        tools.len(),
        path.display()
    );
    if !tools.rules().is_empty() {
        let (all, enforcing) = (tools.rules().len(), tools.rules().enforcing());
        log::info!(
            "{all} rule(s) read: {enforcing} decide calls first, {} in shadow mode (record what \
             they would decide, decide nothing); GET /api/v1/rules lists them",
            all - enforcing
        );
    }
    Ok(tools)
}

/// The store `--store` names: `memory` or `sqlite:PATH` (`redis://` is the
/// cluster's, see [`open_cluster`]).
fn open_store(url: &str, grace: Duration) -> Result<Arc<dyn Store>, StartupError> {
    if url == "memory" {
        return Ok(Arc::new(MemoryStore::default()));
    }
    if let Some(path) = url.strip_prefix("sqlite:") {
        let path = path.strip_prefix("//").unwrap_or(path);
        if path.is_empty() {
            return Err(StartupError::Store(
                "--store sqlite:PATH needs a path".to_owned(),
            ));
        }
        return SqliteStore::open(std::path::Path::new(path), grace)
            .map(|store| Arc::new(store) as Arc<dyn Store>)
            .map_err(|err| StartupError::Store(format!("--store {url}: {err}")));
    }
    Err(StartupError::Store(format!(
        "--store `{url}` is not a store: write memory, sqlite:PATH or redis://HOST:PORT/DB"
    )))
}

/// With `--store redis://`, this replica in its cluster; the replica flags
/// it needs are checked here.
fn open_cluster(
    settings: &Settings,
    namespaces: &Namespaces,
) -> Result<Option<Arc<Cluster>>, StartupError> {
    let url = &settings.cluster.store;
    if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
        return Ok(None);
    }
    let missing = |what: &str| StartupError::Store(format!("--store redis:// needs {what}"));
    let config =
        ClusterConfig {
            store_url: url.clone(),
            replica_id: settings.cluster.replica_id.clone(),
            advertise_url: settings.cluster.advertise_url.clone().ok_or_else(|| {
                missing("--advertise-url (where the other replicas reach this one)")
            })?,
            secret: settings
                .cluster
                .cluster_secret
                .clone()
                .ok_or_else(|| missing("--cluster-secret (the same on every replica)"))?,
            owner_ttl: settings.cluster.owner_ttl,
            compress_records: settings.cluster.redis_records == RecordFormat::Compressed,
            keep_alive: settings.server.keep_alive,
            detach_grace: settings.pauses.detach_grace,
            namespaces: namespaces.clone(),
        };
    Cluster::open(config)
        .map(|cluster| Some(Arc::new(cluster)))
        .map_err(StartupError::Store)
}

/// Resolves on SIGINT, SIGTERM, or when `token` is cancelled.
async fn stop_requested(token: &CancellationToken) {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(err) => {
                log::error!("cannot listen for SIGTERM: {err}");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = interrupt => log::info!("SIGINT received"),
        () = terminate => log::info!("SIGTERM received"),
        () = token.cancelled() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "openai")]
    fn settings(args: &[&str]) -> Settings {
        <Settings as clap::Parser>::try_parse_from(
            std::iter::once("chatgate").chain(args.iter().copied()),
        )
        .unwrap()
    }

    #[cfg(feature = "openai")]
    #[tokio::test]
    async fn engines_are_built_by_name_and_openai_needs_a_model() {
        assert!(build_engine(&settings(&[])).is_ok(), "planner");
        let without_model = build_engine(&settings(&["--engine", "openai"]));
        assert!(without_model
            .err()
            .unwrap()
            .to_string()
            .contains("--llm-model"));
        let with_model = settings(&["--engine", "openai", "--llm-model", "m"]);
        assert!(build_engine(&with_model).is_ok());
        let unknown = <Settings as clap::Parser>::try_parse_from(["chatgate", "--engine", "gpt"])
            .unwrap_err()
            .to_string();
        assert!(
            unknown.contains("planner") && unknown.contains("openai"),
            "{unknown}"
        );
    }

    #[test]
    fn a_store_that_is_none_is_named_at_start() {
        let err = open_store("postgres://x", Duration::ZERO)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("--store `postgres://x`"), "{err}");
        let err = open_store("sqlite:", Duration::ZERO)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("needs a path"), "{err}");
    }
}
