//! HTTP integration tests: each starts a real server on a free port.

mod access;
mod barrage;
mod confirm;
mod errors;
mod hardening;
mod helpers;
mod hostile_model;
mod lifecycle;
mod model_server;
mod openai;
mod operations;
mod races;
mod reattach;
mod stream;
