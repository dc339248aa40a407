//! HTTP integration tests: each starts a real server on a free port.

mod access;
mod barrage;
mod confirm;
mod errors;
mod helpers;
mod lifecycle;
mod openai;
mod operations;
mod races;
mod reattach;
mod stream;
