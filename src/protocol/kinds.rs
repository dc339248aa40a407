//! The kinds of pause, listed once (#39). The table below names each kind
//! (its [`PauseKind`] word), its wire type and
//! the file that holds it, and generates what every kind has on the wire
//! from it:
//!
//! - [`PauseData`], a chunk's `confirmation_data`, read back by its `kind`
//!   in one pass (`protocol/chunk.rs`) and asked what the faces read of it
//!   ([`contract::KindData`], `protocol/pause_view.rs`);
//! - [`Ask`], what a stored paused record keeps of it
//!   ([`contract::KindAsked`]), written as the fields every version wrote
//!   (`protocol/ask.rs`);
//! - its AG-UI face ([`PauseData::agui`]): its interrupts, and the reply a
//!   `resume` of them makes (`protocol/agui/`).
//!
//! A kind's file holds its wire type and its answers to the contract
//! ([`contract`]); nothing else on the wire side matches on the kinds, so a
//! new kind is a row here, its file, and its `PauseKind` word.

pub mod confirmation_data;
pub mod contract;
pub mod question_data;
pub mod reconcile_data;

use self::confirmation_data::ConfirmationData;
use self::question_data::QuestionData;
use self::reconcile_data::ReconcileData;
use crate::protocol::names::PauseKind;

contract::pause_kinds! {
    /// A plan put to the user (`confirmation_request`); a record without a
    /// `kind` (an older version's) is one.
    Approval(ConfirmationData),
    /// Questions put to the user (`input_request`, #16).
    Question(QuestionData),
    /// A call cut short by a crash whose effect nobody can know (#44).
    Reconcile(Box<ReconcileData> as ReconcileData),
}
