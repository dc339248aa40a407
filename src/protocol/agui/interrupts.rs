//! A pause as AG-UI interrupts, and a `resume` as the reply the decision
//! path takes. An interrupt's id begins with its pause's
//! `confirmation_id`:
//!
//! - an approval's task: its `task_id` (`<confirmation_id>-t<index>`),
//!   reason `tool_approval`, payload a decision object per the task's
//!   `response_schema` (or AG-UI's `{approved, editedArgs, reason}`);
//! - a question: `<confirmation_id>-q-<question id>`, reason `question`,
//!   payload the answer;
//! - a reconcile pause: its `confirmation_id`, reason `reconcile`, payload
//!   `{"action": "run_again" | "skip"}`.
//!
//! `cancelled` rejects a task (every open task cancelled: the run is
//! cancelled), leaves a question unanswered (every one: `skip`), and
//! cancels a reconcile pause's run.
//!
//! Each kind's interrupts and how its `resume` reads live in its own file
//! under `protocol/kinds/` (its [`super::AguiFace`]), beside its other wire
//! forms; here they are asked through the kinds' table, with no arm per
//! kind.

use super::{Interrupt, ResumeEntry, ResumeError, ResumeReply};
use crate::protocol::PauseData;

/// Length of a `confirmation_id` (a UUID's text).
const CONFIRMATION_ID_LEN: usize = 36;

/// The pause an interrupt id names: its leading `confirmation_id`.
pub fn confirmation_id_of(interrupt_id: &str) -> &str {
    interrupt_id
        .get(..CONFIRMATION_ID_LEN)
        .unwrap_or(interrupt_id)
}

/// The interrupts of `pause`: for an approval, one per task still open
/// (`open`: the indexes the pause still waits on).
pub fn interrupts(pause: &PauseData, open: &[usize]) -> Vec<Interrupt> {
    pause.agui().interrupts(open)
}

/// The reply `resume` makes to `pause`, whose open tasks are `open`.
pub fn reply_of(
    pause: &PauseData,
    open: &[usize],
    resume: &[ResumeEntry],
) -> Result<ResumeReply, ResumeError> {
    pause.agui().reply_of(open, resume)
}
