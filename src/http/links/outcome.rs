//! What a decision link's (or a Slack button's) decision did, typed: the
//! link page and the Slack reply are both worded from it.

use crate::run::decide::Decided;
use crate::store::PauseNote;

/// What a decision link's (or a Slack button's) decision did, typed: the
/// page and the Slack reply are worded from it, never from each other.
#[derive(Debug)]
pub enum Outcome {
    /// A forged, altered, expired or other-secret token.
    NotFound,
    /// Nothing is waiting on it any more (decided, expired, the run ended).
    Gone,
    /// Refused as it stands (scope, quorum rules, a bad form): why.
    Refused(String),
    /// This person approved the pause already (a quorum counts them
    /// once): 409, as the chat endpoint answers.
    AlreadyApproved(String),
    /// Not taken, and nothing was: try again (a store or an owner out of
    /// reach, a forwarded decision past its deadline, an approval being kept).
    Unavailable,
    /// Taken or not is not known yet (a store or an owner that did not
    /// answer in time): the page (reloaded) says which.
    Unknown,
    /// Decided (or one approval recorded) as `label`.
    Decided { label: String, decided: Decided },
    /// Decided before, by a reply: what and who.
    AlreadyDecided(PauseNote),
}
