//! The pause a run waits on, read for a face that answers it (the AG-UI
//! resume): one registry look-up and one read of its request, typed.

use std::collections::HashSet;

use super::Runs;
use crate::protocol::PauseData;
use crate::session::SessionKey;

/// A pause the run waits on, as its run asked it.
#[derive(Debug, Clone)]
pub struct WaitingPause {
    pub confirmation_id: String,
    pub data: PauseData,
    /// An approval's tasks still undecided (questions: none).
    pub pending: Vec<usize>,
    /// Its request's sequence on the run's stream.
    pub sequence: u64,
    /// Its request, as it was sent (without its data: that is `data`).
    pub request: crate::protocol::Chunk,
    /// Its run's id in a durable store, when a store keeps it.
    pub run: Option<std::sync::Arc<str>>,
}

impl Runs {
    /// The undecided pause of the run on `key`, when this process holds
    /// it, as its run asked it (typed), with the tasks it still waits on
    /// and its request's place on the run's stream: one look-up and one
    /// read of the request (the AG-UI face's resume), not the inbox's
    /// listing.
    pub fn waiting_pause(&self, key: &SessionKey) -> Option<WaitingPause> {
        let pause = self.manager.waiting_of(key)?;
        let frame = self.replays.find(key)?.last_frame(&pause.confirmation_id)?;
        let mut chunk: crate::protocol::Chunk =
            serde_json::from_slice(crate::sse::data_of(&frame)?).ok()?;
        let data = chunk.confirmation_data.take()?;
        let decided: HashSet<usize> = pause.decided.iter().map(|d| d.decision.index).collect();
        let pending = data
            .tasks_one_by_one()
            .iter()
            .map(|task| task.index)
            .filter(|index| !decided.contains(index))
            .collect();
        Some(WaitingPause {
            confirmation_id: pause.confirmation_id,
            data,
            pending,
            sequence: chunk.sequence,
            request: chunk,
            run: pause.run,
        })
    }

    /// Whether the run on `key` waits on a pause here.
    pub fn waits(&self, key: &SessionKey) -> bool {
        self.manager.waiting_of(key).is_some()
    }
}
