//! Build then run: [`Application::build`] binds and wires everything and
//! reports the real port; [`Application::run_until_stopped`] serves until a
//! signal (or [`Application::shutdown_token`]) asks it to stop, then drains.
//! Tests and the binary start the server the same way.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use actix_http::{HttpService, KeepAlive};
use actix_service::{fn_service, map_config, ServiceFactoryExt};
use actix_web::dev::{AppConfig, Server};
use actix_web::middleware::from_fn;
use actix_web::{web, App};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::audit::AuditLog;
use crate::cluster::Cluster;
use crate::config::{Secret, Settings};
use crate::confirmation::{ConfirmationManager, RunLimits};
use crate::engine::Engine;
use crate::http::access::{read_keys_file, AccessPolicy};
use crate::http::connection::{self, GuardedStream};
use crate::http::{access_log, AppState};
use crate::metrics::Metrics;
use crate::run::log::{LogLimits, LogRegistry};
use crate::run::stream::StreamSettings;
use crate::run::Runs;
use crate::tools::Tools;

pub struct Application {
    address: SocketAddr,
    server: Server,
    state: AppState,
    shutdown_timeout: Duration,
}

impl Application {
    /// Binds `settings.bind` and prepares the server; nothing is served until
    /// [`Application::run_until_stopped`].
    pub fn build(settings: Settings) -> std::io::Result<Application> {
        let engine = settings
            .build_engine()
            .map_err(|why| std::io::Error::new(std::io::ErrorKind::InvalidInput, why))?;
        Application::build_with_engine(settings, engine)
    }

    /// Like [`Application::build`], with an engine supplied by the caller.
    pub fn build_with_engine(
        settings: Settings,
        engine: Arc<dyn Engine>,
    ) -> std::io::Result<Application> {
        let mut keys = settings.api_keys.clone();
        if let Some(path) = &settings.api_keys_file {
            let from_file = read_keys_file(path).map_err(|err| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("cannot read --api-keys-file {}: {err}", path.display()),
                )
            })?;
            keys.extend(from_file.into_iter().map(Secret::new));
        }
        let invalid = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, why);
        let access = AccessPolicy::new(&keys, settings.cors_origins.clone());
        let namespaces = access.namespaces();
        let cluster = if is_redis(&settings.store) {
            Some(Arc::new(
                Cluster::open(&settings, namespaces.clone()).map_err(invalid)?,
            ))
        } else {
            None
        };
        let listener = TcpListener::bind(&settings.bind)?;
        let address = listener.local_addr()?;
        let mut allowed_hosts = settings.allowed_hosts.clone();
        // Forwarded requests name this replica's advertised address.
        allowed_hosts.extend(cluster.as_ref().and_then(|c| c.advertised_host()));
        let access = access.with_hosts(address, &allowed_hosts);
        if !access.requires_keys() && !address.ip().is_loopback() {
            log::warn!(
                "listening on {address} without API keys: anyone who can reach this address can \
                 start and decide runs; set --api-key or --api-keys-file, or bind 127.0.0.1"
            );
        }
        let shutdown_timeout = settings.shutdown_timeout;
        let metrics = Arc::new(Metrics::new());
        let logs = LogRegistry::default();
        let stream = Arc::new(StreamSettings {
            keep_alive: settings.keep_alive,
            detach_grace: settings.detach_grace,
            metrics: metrics.clone(),
            registry: logs.clone(),
        });
        let mut run_settings = settings.run_settings();
        run_settings.namespaces = namespaces;
        if let Some(path) = &settings.tools {
            let tools = Tools::load(path).map_err(|err| {
                std::io::Error::new(std::io::ErrorKind::InvalidInput, err.to_string())
            })?;
            log::info!("{} tool(s) declared in {}", tools.len(), path.display());
            run_settings.tools = Arc::new(tools);
        }
        run_settings.store = match &cluster {
            Some(cluster) => cluster.store().clone(),
            None => crate::store::open(&settings.store).map_err(invalid)?,
        };
        run_settings.engine_name = engine.name();
        if let Some(path) = &settings.audit_log {
            let audit = AuditLog::open(path).map_err(|err| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("--audit-log: {err}"),
                )
            })?;
            run_settings.audit = Some(audit);
        }
        let runs = Runs {
            manager: ConfirmationManager::new(),
            logs,
            engine,
            settings: Arc::new(run_settings),
            log_limits: LogLimits {
                frames: settings.replay_buffer,
                bytes: settings.replay_buffer_bytes,
            },
            limits: RunLimits {
                max_runs: settings.max_runs,
                per_owner: settings.runs_per_key(access.requires_keys()),
            },
            stream,
            shutdown: CancellationToken::new(),
            metrics,
            cluster,
        };
        let state = AppState {
            runs,
            access,
            request_timeout: settings.request_timeout,
        };
        let server = serve(listener, &settings, state.clone())?;
        Ok(Application {
            address,
            server,
            state,
            shutdown_timeout,
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
        self.state.runs.manager.clone()
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        self.state.runs.metrics.clone()
    }

    /// The runs' replay logs, for inspection (tests).
    pub fn logs(&self) -> LogRegistry {
        self.state.runs.logs.clone()
    }

    /// Cancelling this token shuts the server down exactly like SIGTERM.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.state.runs.shutdown.clone()
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
        let cluster = state.runs.cluster.clone();
        if let Some(cluster) = &cluster {
            // Owns what it starts from the first request on.
            state.runs.start_heartbeat().await;
            log::info!(
                "replica {} at {}, store {}",
                cluster.replica_id(),
                cluster.advertise_url(),
                cluster.store().name()
            );
        }
        // Paused runs a durable store kept go on before anything else.
        match state.runs.restore().await {
            Ok(0) => {}
            Ok(n) => log::info!("restored {n} paused run(s) from the store"),
            Err(why) => log::error!("cannot restore paused runs: {why}"),
        }
        tokio::select! {
            served = &mut server => return served,
            () = stop_requested(&state.runs.shutdown) => {}
        }
        log::info!(
            "shutting down: ending {} open run(s)",
            state.runs.manager.active_runs()
        );
        // One deadline for everything: runs send their final chunks, then
        // connections finish writing them; whatever is left then is cut.
        let deadline = tokio::time::Instant::now() + shutdown_timeout;
        state.runs.shutdown.cancel();
        if tokio::time::timeout_at(deadline, state.runs.manager.wait_until_empty())
            .await
            .is_err()
        {
            log::warn!(
                "shutdown timeout: {} run(s) still open",
                state.runs.manager.active_runs()
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
    let request_timeout = settings.request_timeout;
    let data = web::Data::new(state);
    let mut builder = Server::build()
        // Signals are ours (see run_until_stopped): streams must get their
        // final chunk before actix stops the workers.
        .disable_signals()
        .shutdown_timeout(settings.shutdown_timeout.as_secs());
    if let Some(workers) = settings.workers {
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

/// Whether `--store` names Redis (the replicas' store).
fn is_redis(store: &str) -> bool {
    store.starts_with("redis://") || store.starts_with("rediss://")
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
