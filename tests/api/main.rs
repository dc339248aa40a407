//! HTTP integration tests: each starts a real server on a free port.

#[path = "../common/mod.rs"]
mod common;

mod a2a;
mod access;
mod agui;
mod approvers;
mod as_decided;
mod audit_chain;
mod barrage;
mod check_order;
mod confirm;
mod durable;
mod errors;
mod escalation;
mod exactly_once;
mod faults;
mod four_eyes;
mod golden;
mod grants;
mod hardening;
mod helpers;
#[cfg(feature = "openai")]
mod hostile_model;
mod inbox;
mod lifecycle;
mod links;
mod mail;
#[cfg(feature = "openai")]
mod model_server;
#[cfg(feature = "openai")]
mod openai;
#[cfg(feature = "openai")]
mod openai_questions;
#[cfg(feature = "openai")]
mod openai_rules;
#[cfg(feature = "openai")]
mod openai_tools;
mod operations;
mod operator;
mod parked;
mod previews;
mod questions;
mod races;
mod reattach;
mod receipts;
mod rules;
mod secrets;
mod slack;
mod stream;
mod task_expiry;
mod task_quorum;
mod tasks;
mod tools;
mod webhooks;
