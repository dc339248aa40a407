//! chatgate: a chat-stream service whose engine pauses for in-band human
//! confirmation before it acts.
//!
//! One endpoint, `POST /api/v1/chat/stream`, streams Server-Sent Events. When
//! the engine has a plan, it sends a `confirmation_request` chunk and pauses;
//! a `CONFIRM_ACTION:<confirm|modify|cancel>` message on the same endpoint and
//! session decides, and the original stream resumes. See `docs/protocol.md`.
//!
//! # Layout
//! - [`protocol`]: wire types, names and the `CONFIRM_ACTION` parser (no I/O).
//! - [`confirmation`]: [`confirmation::ConfirmationManager`], the run registry
//!   and the pause/decide handshake (no HTTP).
//! - [`engine`]: the [`engine::Engine`] trait, the [`engine::RunContext`]
//!   engines drive, the built-in [`engine::planner`] and [`engine::openai`],
//!   a real model behind an OpenAI-compatible server (no HTTP serving).
//! - [`sse`]: SSE framing.
//! - [`replay`]: a run's bounded replay log, client streams (keep-alive,
//!   detach, re-attach, slow clients).
//! - [`run`]: starts a run's task and ties it to its response.
//! - [`routes`] and [`error`]: the HTTP handlers and the error-to-wire mapping.
//! - [`access`]: API keys, run ownership and allowed browser origins.
//! - [`access_log`]: one log line per request.
//! - [`metrics`]: the Prometheus metrics behind `GET /metrics`.
//! - [`config`] and [`startup`]: settings, binding, serving, shutdown.

pub mod access;
pub mod access_log;
pub mod config;
pub mod confirmation;
pub mod connection;
pub mod engine;
pub mod error;
pub mod metrics;
pub mod protocol;
pub mod replay;
pub mod routes;
pub mod run;
pub mod sse;
pub mod startup;
