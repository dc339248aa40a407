//! The execution journal (#44): what a durable store keeps of each call a
//! decided pause lets run, so that a run cut by a crash goes on where it
//! was instead of ending `interrupted`. A call's entry is kept `started`
//! before the call begins and `finished` (its `tool_output` chunk as it
//! was sent, bounded as every chunk is) before the run moves on; a restart
//! or a takeover reads the entries of the record's pause with the record
//! ([`PausedRecord::calls`](super::PausedRecord)). The memory store keeps
//! none: nothing of its runs outlives the process anyway.

use serde::{Deserialize, Serialize};

use serde_json::Value;

use crate::protocol::Chunk;

/// One call of a decided pause, as the journal keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallEntry {
    /// The pause whose task it is.
    pub confirmation_id: String,
    /// The task's index (1-based, as `tool_output` says it).
    pub index: usize,
    pub tool: String,
    /// Its idempotency key: the same on every attempt.
    pub key: String,
    /// 1 for the first call, one more for each call again.
    pub attempt: u32,
    /// When its latest attempt began (ms since the Unix epoch).
    pub started_at_ms: u64,
    /// Once it finished: its `tool_output` chunk as it was sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished: Option<Chunk>,
    /// Cut short and put to a person (a reconcile pause): until when it
    /// waits (ms since the Unix epoch), across restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asked_until_ms: Option<u64>,
}

impl CallEntry {
    /// An entry that could not be read back: started, never finished, its
    /// key unknown (its call may have run).
    pub fn unreadable(confirmation_id: &str, index: usize) -> CallEntry {
        CallEntry {
            confirmation_id: confirmation_id.to_owned(),
            index,
            tool: String::new(),
            key: String::new(),
            attempt: 1,
            started_at_ms: 0,
            finished: None,
            asked_until_ms: None,
        }
    }
}

/// One task's call, as an outcome keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RanNote {
    pub step: u64,
    pub tool: String,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skipped: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub simulated: bool,
}

impl RanNote {
    /// A `tool_output` chunk as an outcome keeps it.
    pub fn of(chunk: &Chunk) -> RanNote {
        use crate::protocol::meta;
        let flag = |key: &str| chunk.metadata.get(key).and_then(Value::as_bool);
        RanNote {
            step: chunk
                .metadata
                .get(meta::STEP)
                .and_then(Value::as_u64)
                .unwrap_or(0),
            tool: chunk
                .metadata
                .get(meta::TOOL)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            ok: flag(meta::OK).unwrap_or(false),
            skipped: flag(meta::SKIPPED).unwrap_or(false),
            simulated: flag(meta::SIMULATED).unwrap_or(false),
        }
    }
}
