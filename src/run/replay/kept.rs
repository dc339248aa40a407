//! What a store keeps of a run's log: its end (the final chunk, the
//! sequence past it, its pauses) and its outcome (`--keep-outcome`).

use super::Replay;
use crate::protocol::Chunk;
use crate::store::{Outcome, RunEnd, MAX_OUTCOME_TEXT};

impl Replay {
    /// The log as a store keeps an ended run's end: its final chunk (the
    /// last frame), the sequence number past it and its pauses' ids, not
    /// the whole log, so that what an ended run costs a store (and a
    /// restart that reads it back) is bounded by a small constant. A
    /// re-attach after a restart is sent the final chunk, with `gap: true`
    /// when it had not read what came before.
    pub fn end(&self) -> RunEnd {
        let inner = self.lock();
        RunEnd {
            frames: inner
                .frames
                .back()
                .map(|frame| String::from_utf8_lossy(frame).into_owned())
                .into_iter()
                .collect(),
            next_seq: inner.next_seq,
            pauses: inner.pauses.iter().cloned().collect(),
        }
    }

    /// The outcome of the run whose final chunk is `last` (as pushed), as
    /// `--keep-outcome` keeps it.
    pub fn outcome(&self, mut last: Chunk) -> Outcome {
        if last.chunk.len() > MAX_OUTCOME_TEXT {
            let mut cut = MAX_OUTCOME_TEXT;
            while !last.chunk.is_char_boundary(cut) {
                cut -= 1;
            }
            last.chunk.truncate(cut);
        }
        let inner = self.lock();
        Outcome {
            session_id: last.session_id.clone(),
            final_chunk: last,
            ended_at_ms: crate::clock::now_ms(),
            pauses: inner.pauses.iter().cloned().collect(),
            ran: inner.ran.iter().cloned().collect(),
        }
    }
}
