//! Sessions' conversations with the model, bounded in every dimension.
//!
//! A conversation is a list of *turns*, one per run, each the messages that
//! run added (the user's message, the model's answers, tool calls and their
//! results). Turns are kept in run order, whatever order runs end in: a run
//! that was superseded and ends after its successor still lands before it.
//!
//! Bounds:
//! - per conversation: at most [`MAX_HISTORY`] messages and
//!   [`MAX_CONVERSATION_BYTES`] bytes of JSON; the oldest whole turns go
//!   first, and a single turn larger than that is not kept;
//! - in all: `--conversation-memory` bytes of JSON; the least recently used
//!   conversations go first;
//! - in time: a conversation not used for `--conversation-ttl` is forgotten.

use std::collections::VecDeque;
use std::time::Duration;

use lru::LruCache;
use serde_json::Value;
use tokio::time::Instant;

use crate::protocol::json_len;
use crate::session::SessionKey;

/// Messages kept per conversation (older ones are dropped, whole turns at a time).
pub const MAX_HISTORY: usize = 40;
/// Bytes of JSON kept per conversation (older turns are dropped first).
pub const MAX_CONVERSATION_BYTES: usize = 256 * 1024;

/// How much all conversations together may keep, and for how long.
#[derive(Debug, Clone, Copy)]
pub struct ConversationLimits {
    pub ttl: Duration,
    pub total_bytes: usize,
}

pub struct Conversations {
    by_session: LruCache<SessionKey, Conversation>,
    /// Bytes of JSON of every kept message.
    bytes: usize,
    limits: ConversationLimits,
}

#[derive(Default)]
struct Conversation {
    turns: VecDeque<Turn>,
    bytes: usize,
    messages: usize,
    used: Option<Instant>,
}

struct Turn {
    run_id: u64,
    messages: Vec<Value>,
    bytes: usize,
}

impl Conversations {
    pub fn new(limits: ConversationLimits) -> Conversations {
        Conversations {
            // Bounded by bytes and time below, not by count.
            by_session: LruCache::unbounded(),
            bytes: 0,
            limits,
        }
    }

    /// The session's messages, oldest first (empty for a new or expired one).
    pub fn history(&mut self, key: &SessionKey) -> Vec<Value> {
        let now = Instant::now();
        self.forget_expired(now);
        match self.by_session.get_mut(key) {
            Some(conversation) => {
                conversation.used = Some(now);
                conversation
                    .turns
                    .iter()
                    .flat_map(|turn| turn.messages.iter().cloned())
                    .collect()
            }
            None => Vec::new(),
        }
    }

    /// Adds run `run_id`'s turn to the session's conversation, in run order.
    pub fn save(&mut self, key: SessionKey, run_id: u64, messages: Vec<Value>) {
        let now = Instant::now();
        self.forget_expired(now);
        let bytes = messages.iter().map(json_len).sum();
        if messages.is_empty() || messages.len() > MAX_HISTORY || bytes > MAX_CONVERSATION_BYTES {
            log::debug!(
                "a turn of {bytes} bytes in {} messages is not kept",
                messages.len()
            );
            return;
        }
        let turn = Turn {
            run_id,
            messages,
            bytes,
        };
        let conversation = self
            .by_session
            .get_or_insert_mut(key, Conversation::default);
        conversation.used = Some(now);
        let at = conversation
            .turns
            .iter()
            .position(|t| t.run_id > run_id)
            .unwrap_or(conversation.turns.len());
        conversation.bytes += turn.bytes;
        conversation.messages += turn.messages.len();
        conversation.turns.insert(at, turn);
        self.bytes += bytes;
        while conversation.messages > MAX_HISTORY || conversation.bytes > MAX_CONVERSATION_BYTES {
            let Some(oldest) = conversation.turns.pop_front() else {
                break;
            };
            conversation.bytes -= oldest.bytes;
            conversation.messages -= oldest.messages.len();
            self.bytes -= oldest.bytes;
        }
        while self.bytes > self.limits.total_bytes {
            let Some((_, evicted)) = self.by_session.pop_lru() else {
                break;
            };
            self.bytes -= evicted.bytes;
        }
    }

    /// Conversations kept, and their bytes of JSON.
    pub fn usage(&self) -> (usize, usize) {
        (self.by_session.len(), self.bytes)
    }

    /// Forgets conversations unused for the TTL; they sit at the LRU end.
    fn forget_expired(&mut self, now: Instant) {
        while let Some((_, oldest)) = self.by_session.peek_lru() {
            let expired = oldest
                .used
                .is_none_or(|used| now.duration_since(used) >= self.limits.ttl);
            if !expired {
                break;
            }
            if let Some((_, gone)) = self.by_session.pop_lru() {
                self.bytes -= gone.bytes;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn limits() -> ConversationLimits {
        ConversationLimits {
            ttl: Duration::from_secs(3600),
            total_bytes: 1 << 20,
        }
    }

    fn key(session: &str) -> SessionKey {
        SessionKey::new(None, session)
    }

    fn turn(text: &str) -> Vec<Value> {
        vec![
            json!({ "role": "user", "content": text }),
            json!({ "role": "assistant", "content": text }),
        ]
    }

    #[tokio::test]
    async fn turns_keep_run_order_whatever_order_runs_end_in() {
        let mut conversations = Conversations::new(limits());
        conversations.save(key("s"), 2, turn("second"));
        conversations.save(key("s"), 1, turn("first (superseded, ended later)"));

        let history = conversations.history(&key("s"));

        assert_eq!(history.len(), 4);
        assert_eq!(history[0]["content"], "first (superseded, ended later)");
        assert_eq!(history[2]["content"], "second");
    }

    #[tokio::test]
    async fn a_conversation_keeps_its_last_turns_within_its_bounds() {
        let mut conversations = Conversations::new(limits());
        for i in 0..30 {
            conversations.save(key("s"), i, turn(&"x".repeat(20_000)));
        }

        let history = conversations.history(&key("s"));
        let bytes: usize = history.iter().map(json_len).sum();

        assert!(history.len() <= MAX_HISTORY);
        assert!(bytes <= MAX_CONVERSATION_BYTES, "{bytes}");
        assert_eq!(history[0]["role"], "user");
        assert!(history.len() >= 2, "the newest turns stay");
        conversations.save(key("s"), 99, turn(&"y".repeat(MAX_CONVERSATION_BYTES)));
        assert_ne!(
            conversations.history(&key("s")).last().unwrap()["content"],
            "y".repeat(MAX_CONVERSATION_BYTES),
            "a turn over the bound is not kept"
        );
    }

    #[tokio::test]
    async fn all_conversations_together_stay_within_their_bytes_least_recent_first() {
        let mut conversations = Conversations::new(ConversationLimits {
            ttl: Duration::from_secs(3600),
            total_bytes: 1 << 20,
        });
        for i in 0..100 {
            conversations.save(key(&i.to_string()), i, turn(&"x".repeat(30_000)));
        }

        let (kept, bytes) = conversations.usage();

        assert!(bytes <= 1 << 20, "{bytes}");
        assert!(kept < 100 && kept > 10, "{kept}");
        assert!(conversations.history(&key("0")).is_empty(), "oldest gone");
        assert!(!conversations.history(&key("99")).is_empty(), "newest kept");
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_conversation_expires() {
        let mut conversations = Conversations::new(ConversationLimits {
            ttl: Duration::from_secs(60),
            total_bytes: 1 << 20,
        });
        conversations.save(key("idle"), 1, turn("a"));
        conversations.save(key("busy"), 2, turn("b"));
        tokio::time::advance(Duration::from_secs(40)).await;
        assert!(!conversations.history(&key("busy")).is_empty());
        tokio::time::advance(Duration::from_secs(30)).await;

        assert!(conversations.history(&key("idle")).is_empty());
        assert!(!conversations.history(&key("busy")).is_empty());
        assert_eq!(conversations.usage().0, 1);
    }
}
