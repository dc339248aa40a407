//! The engines: [`planner`] (deterministic, built in, the default) and
//! [`openai`] (a real model behind any OpenAI-compatible server). Each
//! implements [`crate::run::engine::Engine`] and uses only its
//! [`crate::run::context::RunContext`].

pub mod llm;
#[cfg(feature = "openai")]
pub mod openai;
pub mod planner;
