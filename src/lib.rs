//! chatgate: a chat-stream service whose engine pauses for in-band human
//! confirmation before it acts.
//!
//! One endpoint, `POST /api/v1/chat/stream`, streams Server-Sent Events. When
//! the engine has a plan, it sends a `confirmation_request` chunk and pauses;
//! a `CONFIRM_ACTION:<confirm|modify|cancel>` message on the same endpoint and
//! session decides, and the original stream resumes. See `docs/protocol.md`.
//!
//! # Layout
//! Imports flow one way, from the HTTP glue down to the wire types:
//! `startup` → `http` → `run` → `engine` → `run::{log, stop, stream}`,
//! `audit` → `confirmation` → `tools`, `metrics`, `sse` → `protocol`.
//! - [`protocol`]: wire types and names, the request's rules
//!   ([`protocol::ValidRequest`]), chunk constructors, the `CONFIRM_ACTION`
//!   parser (no I/O).
//! - [`confirmation`]: [`confirmation::ConfirmationManager`], the run registry
//!   and the pause/decide handshake (no HTTP).
//! - [`run`]: a run's home: start, re-attach, drive to one final chunk; its
//!   stop, its bounded log, its client streams (no HTTP).
//! - [`engine`]: the [`engine::Engine`] trait, the [`engine::RunContext`]
//!   engines drive, the built-in [`engine::planner`] and [`engine::openai`],
//!   a real model behind an OpenAI-compatible server (no HTTP serving).
//! - [`tools`]: the tools file (`--tools`), argument schemas, and the
//!   `command` and `http` executors (no HTTP serving).
//! - [`audit`]: the audit log (`--audit-log`), synced before acting, failing
//!   closed.
//! - [`sse`]: SSE framing.
//! - [`http`]: handlers, the error table, access (keys, origins, hosts),
//!   per-connection deadlines, the request log.
//! - [`metrics`]: the Prometheus metrics behind `GET /metrics`.
//! - [`config`] and [`startup`]: settings, binding, serving, shutdown.

pub mod audit;
pub mod cluster;
pub mod config;
pub mod confirmation;
pub mod engine;
pub mod http;
pub mod metrics;
pub mod protocol;
pub mod run;
pub mod session;
pub mod sse;
pub mod startup;
pub mod store;
pub mod tools;
