//! A [`PausedRecord`] from the fields it is read as
//! ([`RecordFields`], see there: why not `#[serde(flatten)]`).

use super::{PausedRecord, RunEnd};
use crate::protocol::record::RecordFields;

impl From<RecordFields<RunEnd>> for PausedRecord {
    fn from(mut read: RecordFields<RunEnd>) -> PausedRecord {
        let asked = read.take_asked();
        PausedRecord {
            run: read.run,
            namespace: read.namespace,
            session_id: read.session_id,
            engine: read.engine,
            state: read.state,
            message: read.message,
            confirmation_id: read.confirmation_id,
            round: read.round,
            options: read.options,
            asked,
            expires_at_ms: read.expires_at_ms,
            asked_at_ms: read.asked_at_ms,
            frames: read.frames,
            next_seq: read.next_seq,
            decision: read.decision,
            ended: read.ended,
            in_memory: read.in_memory,
            timer_due_ms: read.timer_due_ms,
            request_seq: read.request_seq,
            progress: None,
            calls: Vec::new(),
        }
    }
}
