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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Ask;

    /// A record of every field, as an older version wrote it: no `kind`
    /// (an approval), no `asked_at_ms`.
    fn older() -> serde_json::Value {
        serde_json::json!({"run": "r", "namespace": null, "session_id": "s",
            "engine": "planner", "state": {}, "message": "m", "confirmation_id": "c",
            "round": 1, "options": [], "tasks": [{"index": 1, "description": "d",
            "tool": "t", "response_schema": {"b": 1, "a": [true]}}],
            "expires_at_ms": 5, "frames": [], "next_seq": 2, "decision": null})
    }

    #[test]
    fn an_older_record_reads_as_an_approval_and_writes_back_the_same_schema() {
        let record: PausedRecord = serde_json::from_value(older()).unwrap();
        assert_eq!(record.asked_at_ms, 0);
        let text = serde_json::to_string(&record).unwrap();
        assert!(
            text.contains(r#""response_schema":{"a":[true],"b":1}"#),
            "{text}"
        );
        let again: PausedRecord = serde_json::from_str(&text).unwrap();
        assert_eq!(again, record);
    }

    #[test]
    fn a_question_record_reads_back_as_it_was_written() {
        let mut record: PausedRecord = serde_json::from_value(older()).unwrap();
        record.asked = Ask::Question(crate::protocol::kinds::question_data::Asked {
            title: "where".into(),
            questions: Vec::new(),
        });
        let again: PausedRecord =
            serde_json::from_str(&serde_json::to_string(&record).unwrap()).unwrap();
        assert_eq!(again, record);
    }
}
