//! Settings of the server: command-line flags, each also read from `CHATGATE_<NAME>`.

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;

use crate::engine::openai::{OpenAiConfig, OpenAiEngine};
use crate::engine::planner::PlannerEngine;
use crate::engine::{Engine, RunSettings, ENGINE_NAMES};

/// Default of `--confirm-timeout-secs`: how long a pause waits for an answer.
pub const CONFIRM_TIMEOUT_SECS: u64 = 300;
/// Default of `--keep-alive-secs`: silence before a `: keep-alive` comment.
pub const KEEP_ALIVE_SECS: u64 = 15;
/// Default of `--step-delay-ms`: the planner's simulated work per step.
pub const STEP_DELAY_MS: u64 = 100;
/// Default of `--max-rounds`: confirmation rounds one run may use.
pub const MAX_ROUNDS: u32 = 5;
/// Default of `--shutdown-timeout-secs`: how long shutdown waits for streams to end.
pub const SHUTDOWN_TIMEOUT_SECS: u64 = 10;
/// Default of `--request-timeout-secs`: time allowed for request headers, and for the body.
pub const REQUEST_TIMEOUT_SECS: u64 = 5;
/// Default of `--detach-grace-secs`: how long a run outlives its vanished client.
pub const DETACH_GRACE_SECS: u64 = 60;
/// Default of `--replay-buffer`: chunks kept per run for re-attach.
pub const REPLAY_BUFFER: usize = 1024;
/// Default of `--max-runs`: runs held at once (the open-files limit is 20,000).
pub const MAX_RUNS: usize = 20_000;
/// Default of `--llm-url`: Ollama's OpenAI-compatible API on this machine.
pub const LLM_URL: &str = "http://127.0.0.1:11434/v1";
/// Default of `--llm-timeout-secs`.
pub const LLM_TIMEOUT_SECS: u64 = 60;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "chatgate",
    version,
    about = "A chat-stream service that pauses for in-band confirmation"
)]
pub struct Settings {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, env = "CHATGATE_BIND", default_value = "127.0.0.1:8080")]
    pub bind: String,
    /// Engine behind the stream.
    #[arg(long, env = "CHATGATE_ENGINE", default_value = "planner")]
    pub engine: String,
    /// Seconds a confirmation waits before the run is cancelled (reason `timeout`).
    #[arg(long, env = "CHATGATE_CONFIRM_TIMEOUT_SECS", default_value_t = CONFIRM_TIMEOUT_SECS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub confirm_timeout_secs: u64,
    /// Seconds of silence before a `: keep-alive` comment is written.
    #[arg(long, env = "CHATGATE_KEEP_ALIVE_SECS", default_value_t = KEEP_ALIVE_SECS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub keep_alive_secs: u64,
    /// Milliseconds the planner spends on each step (0 for benchmarks).
    #[arg(long, env = "CHATGATE_STEP_DELAY_MS", default_value_t = STEP_DELAY_MS)]
    pub step_delay_ms: u64,
    /// Confirmation rounds a run may use; one more modify cancels it (reason `max_rounds`).
    #[arg(long, env = "CHATGATE_MAX_ROUNDS", default_value_t = MAX_ROUNDS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_rounds: u32,
    /// HTTP worker threads (default: one per CPU core).
    #[arg(long, env = "CHATGATE_WORKERS")]
    pub workers: Option<usize>,
    /// Seconds a run whose client vanished stays re-attachable (and a paused one
    /// decidable) before it is cancelled with reason `client_gone`. 0: at once.
    #[arg(long, env = "CHATGATE_DETACH_GRACE_SECS", default_value_t = DETACH_GRACE_SECS)]
    pub detach_grace_secs: u64,
    /// Chunks kept per run for re-attach; an attached client that falls this far
    /// behind stops the run (reason `slow_consumer`).
    #[arg(long, env = "CHATGATE_REPLAY_BUFFER", default_value_t = REPLAY_BUFFER,
          value_parser = parse_positive)]
    pub replay_buffer: usize,
    /// Runs held at once; beyond it new runs get 503 `overloaded` with Retry-After.
    #[arg(long, env = "CHATGATE_MAX_RUNS", default_value_t = MAX_RUNS)]
    pub max_runs: usize,
    /// API key clients must send as `Authorization: Bearer KEY` (repeatable;
    /// in the env var, comma-separated). Without keys the chat endpoint is open.
    #[arg(
        long = "api-key",
        env = "CHATGATE_API_KEY",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub api_keys: Vec<String>,
    /// File of API keys, one per line (`#` comments allowed).
    #[arg(long, env = "CHATGATE_API_KEYS_FILE")]
    pub api_keys_file: Option<std::path::PathBuf>,
    /// Browser origin allowed to call the API cross-site (repeatable; none by default).
    #[arg(
        long = "cors-origin",
        env = "CHATGATE_CORS_ORIGIN",
        value_delimiter = ','
    )]
    pub cors_origins: Vec<String>,
    /// Seconds a client may take to send request headers, and again its body.
    #[arg(long, env = "CHATGATE_REQUEST_TIMEOUT_SECS", default_value_t = REQUEST_TIMEOUT_SECS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub request_timeout_secs: u64,
    /// Seconds shutdown waits for open streams to send their final chunk.
    #[arg(long, env = "CHATGATE_SHUTDOWN_TIMEOUT_SECS", default_value_t = SHUTDOWN_TIMEOUT_SECS)]
    pub shutdown_timeout_secs: u64,
    /// `--engine openai`: base URL of an OpenAI-compatible API, up to `/v1`
    /// (Ollama: http://127.0.0.1:11434/v1).
    #[arg(long, env = "CHATGATE_LLM_URL", default_value = LLM_URL)]
    pub llm_url: String,
    /// `--engine openai`: the model to ask (required with that engine).
    #[arg(long, env = "CHATGATE_LLM_MODEL")]
    pub llm_model: Option<String>,
    /// `--engine openai`: bearer key for the model server, if it needs one.
    #[arg(long, env = "CHATGATE_LLM_API_KEY", hide_env_values = true)]
    pub llm_api_key: Option<String>,
    /// `--engine openai`: longest silence from the model server, connecting or streaming.
    #[arg(long, env = "CHATGATE_LLM_TIMEOUT_SECS", default_value_t = LLM_TIMEOUT_SECS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub llm_timeout_secs: u64,
}

impl Settings {
    /// The defaults, with `bind` replaced (tests use `127.0.0.1:0`).
    pub fn for_bind(bind: &str) -> Settings {
        Settings::parse_from(["chatgate", "--bind", bind])
    }

    /// The engine named by `--engine`, configured by the other flags.
    pub fn build_engine(&self) -> Result<Arc<dyn Engine>, String> {
        match self.engine.as_str() {
            "planner" => Ok(Arc::new(PlannerEngine)),
            "openai" => {
                let model = self
                    .llm_model
                    .clone()
                    .ok_or("--engine openai needs --llm-model (or CHATGATE_LLM_MODEL)")?;
                let config = OpenAiConfig {
                    base_url: self.llm_url.clone(),
                    model,
                    api_key: self.llm_api_key.clone(),
                    timeout: Duration::from_secs(self.llm_timeout_secs),
                };
                let engine = OpenAiEngine::new(config)
                    .map_err(|err| format!("cannot set up the model client: {err}"))?;
                Ok(Arc::new(engine))
            }
            other => Err(format!(
                "unknown engine `{other}`; known: {}",
                ENGINE_NAMES.join(", ")
            )),
        }
    }

    pub fn run_settings(&self) -> RunSettings {
        RunSettings {
            confirm_timeout: Duration::from_secs(self.confirm_timeout_secs),
            max_rounds: self.max_rounds,
            step_delay: Duration::from_millis(self.step_delay_ms),
        }
    }
}

/// A whole number of at least 1.
fn parse_positive(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("`{text}` is not a whole number of at least 1")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(args: &[&str]) -> Settings {
        Settings::parse_from(std::iter::once("chatgate").chain(args.iter().copied()))
    }

    #[test]
    fn engines_are_built_by_name_and_openai_needs_a_model() {
        assert!(settings(&[]).build_engine().is_ok(), "planner by default");
        let without_model = settings(&["--engine", "openai"]).build_engine();
        assert!(without_model.err().unwrap().contains("--llm-model"));
        assert!(settings(&["--engine", "openai", "--llm-model", "m"])
            .build_engine()
            .is_ok());
        let unknown = settings(&["--engine", "gpt"]).build_engine();
        assert!(unknown.err().unwrap().contains("planner, openai"));
    }
}
