//! The `openai` engine's settings (`--llm-*`, `--conversation-*`) and their
//! defaults. Compiled without the `openai` feature too, so that the flags
//! mean the same in every build (`--engine openai` then says what is missing).

use std::time::Duration;

use secrecy::SecretString;

/// Default of `--llm-url`: Ollama's OpenAI-compatible API on this machine.
pub const LLM_URL: &str = "http://127.0.0.1:11434/v1";
/// Default of `--llm-timeout`: longest silence from the model server.
pub const LLM_TIMEOUT: Duration = Duration::from_secs(60);
/// Default of `--llm-max-time`: longest a single model call may take in all.
pub const LLM_MAX_TIME: Duration = Duration::from_secs(300);
/// Default of `--conversation-ttl`: an idle conversation is forgotten after it.
pub const CONVERSATION_TTL: Duration = Duration::from_secs(3600);
/// Default of `--conversation-memory`: bytes of history kept for all sessions.
pub const CONVERSATION_MEMORY: usize = 64 * 1024 * 1024;

/// Where the model is and how to reach it (`--llm-*` and `--conversation-*` flags).
#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    /// Base URL of the API, up to and including `/v1`.
    pub base_url: String,
    pub model: String,
    pub api_key: Option<SecretString>,
    /// Longest silence allowed while connecting or streaming.
    pub timeout: Duration,
    /// Longest one model call may take in all.
    pub max_time: Duration,
    pub conversation_ttl: Duration,
    pub conversation_memory: usize,
    /// Offer the model `ask_user` (off with `--no-ask-user`).
    pub ask_user: bool,
}

impl OpenAiConfig {
    /// A config with the flags' defaults for everything but where the model is.
    pub fn new(base_url: &str, model: &str) -> OpenAiConfig {
        OpenAiConfig {
            base_url: base_url.to_owned(),
            model: model.to_owned(),
            api_key: None,
            timeout: LLM_TIMEOUT,
            max_time: LLM_MAX_TIME,
            conversation_ttl: CONVERSATION_TTL,
            conversation_memory: CONVERSATION_MEMORY,
            ask_user: true,
        }
    }
}
