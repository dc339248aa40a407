//! chatgate: a chat-stream service whose engine pauses for in-band human
//! confirmation before it acts.
//!
//! One endpoint, `POST /api/v1/chat/stream`, streams Server-Sent Events. When
//! the engine has a plan, it sends a `confirmation_request` chunk and pauses;
//! a `CONFIRM_ACTION:<confirm|modify|cancel>` message on the same endpoint and
//! session decides, and the original stream resumes. See `docs/protocol.md`.
//!
//! # Layout
//! Imports flow one way, top to bottom; a module names only modules below
//! it (`tests/layout.rs` checks it, for files and for these modules):
//!
//! | module | owns |
//! |---|---|
//! | [`startup`] | build (engines, stores, tools, the cluster) and bind; serve; shut down |
//! | [`config`] | the settings (flags and environment), describing only |
//! | [`http`] | handlers: extract, check access, validate, one call into [`run`], respond; forwarding to a run's owner; the error table; the chat endpoint's SSE responses |
//! | [`engine`] | the engines ([`engine::planner`], [`engine::openai`]), each using only [`run::RunContext`] |
//! | [`run`] | a run's home: start, re-attach, decide ([`run::decide`]), what is written of each pause event ([`run::journal`]), where it lives ([`run::place`]), restore, its one final chunk; the engine seam ([`run::Engine`], [`run::RunContext`]); its stop, bounded log and client streams |
//! | [`cluster`] | replicas over Redis: identity, heartbeat, claim and takeover |
//! | [`store`] | paused runs' records: [`store::memory`], [`store::sqlite`], [`store::redis`] |
//! | [`confirmation`] | the run registry and the pause/decide handshake (no I/O) |
//! | [`decider`] | who may decide a pause: the one rule ([`decider::may_decide`]) every door and list asks |
//! | [`pause`] | the kinds of pause, one file each ([`pause::approval`], [`pause::questions`]): what each asks, how a reply to it is checked |
//! | [`audit`], [`metrics`], [`tools`] | the audit log (hash-chained); Prometheus metrics; declared tools and their executors |
//! | [`receipt`] | signed receipts of approved calls: their keys, payload and JWKS |
//! | [`webhook`] | signed webhook events: building them, the sender |
//! | [`notify`] | what a person acts on from elsewhere: signed decision links, approval mail, Slack messages |
//! | [`session`], [`sse`], [`redact`], [`clock`] | who a session belongs to; SSE framing (the only place that writes or reads SSE bytes; no HTTP); what of a URL may be written out; wall-clock conversions |
//! | [`protocol`] | wire types and names, the request's rules, chunk constructors (no I/O) |

pub mod audit;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod confirmation;
pub mod decider;
pub mod engine;
pub mod http;
pub mod metrics;
pub mod notify;
pub mod pause;
pub mod protocol;
pub mod receipt;
pub mod redact;
pub mod run;
pub mod session;
pub mod sse;
pub mod startup;
pub mod store;
pub mod tools;
pub mod webhook;
