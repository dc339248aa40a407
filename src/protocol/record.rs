//! A stored paused record's fields as they are read
//! (`crate::store::PausedRecord`): what it asked as the fields they are on
//! the wire (`tasks`, `kind`, `title`, `questions`, see [`Ask`]) beside the
//! rest.
//!
//! `PausedRecord` writes its `asked` flattened into the record; read back
//! through `#[serde(flatten)]`, serde would first copy every field it did
//! not name (the tasks with their response schemas, the questions) into a
//! buffer of its own and read them again from it: about half the time of
//! reading a record, which a mass expiry does 100,000 times (#46). Naming
//! the fields reads each once; what is written is unchanged.
//!
//! The fields mirror `PausedRecord`'s: `store::record_read` builds every
//! one of its fields from these, so a field added there is named by the
//! compiler until it is read here too.

use serde::Deserialize;
use serde_json::Value;

use super::kinds::contract::Fields;
use super::kinds::Ask;
use super::names::{Action, PauseKind};
use super::question::Question;
use super::task_spec::TaskSpec;

/// See the module's doc; the defaults are `PausedRecord`'s own. `E`: how
/// a run's end is kept (the store's).
#[derive(Deserialize)]
pub struct RecordFields<E> {
    pub run: String,
    pub namespace: Option<String>,
    pub session_id: String,
    pub engine: String,
    pub state: Value,
    pub message: String,
    pub confirmation_id: String,
    pub round: u32,
    pub options: Vec<Action>,
    #[serde(default)]
    tasks: Vec<TaskSpec>,
    #[serde(default)]
    kind: PauseKind,
    #[serde(default)]
    title: String,
    #[serde(default)]
    questions: Vec<Question>,
    pub expires_at_ms: u64,
    #[serde(default)]
    pub asked_at_ms: u64,
    pub frames: Vec<String>,
    pub next_seq: u64,
    pub decision: Option<Value>,
    #[serde(default = "none")]
    pub ended: Option<E>,
    #[serde(default)]
    pub in_memory: bool,
    #[serde(default)]
    pub timer_due_ms: Option<u64>,
    #[serde(default)]
    pub request_seq: Option<u64>,
}

fn none<E>() -> Option<E> {
    None
}

impl<E> RecordFields<E> {
    /// What the pause asked, as one value (taken: its fields are left empty).
    pub fn take_asked(&mut self) -> Ask {
        Ask::from(Fields {
            tasks: std::mem::take(&mut self.tasks),
            kind: self.kind,
            title: std::mem::take(&mut self.title),
            questions: std::mem::take(&mut self.questions),
        })
    }
}
