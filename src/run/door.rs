//! The door a decision from outside the chat stream comes through (a
//! decision link's form, a Slack button, anything added later): the pause
//! is located by its id, the reply decided on the one decision path
//! ([`Runs::decide`]), and what happened comes back typed ([`Outcome`]),
//! for each face to word as it shows things (the link page, Slack's
//! message), never from each other's text. The chat reply takes the same
//! path and words its errors as the chat endpoint's statuses.

use super::decide::{Decided, Reply, ReplyError};
use super::Runs;
use crate::confirmation::DecideError;
use crate::session::SessionKey;
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

impl Runs {
    /// The session holding the pause `confirmation_id`, for a decider
    /// whose scope reaches the namespaces `may_see` admits: the pause an
    /// approver's link or button names.
    pub async fn pause_for(
        &self,
        confirmation_id: &str,
        may_see: impl Fn(Option<u32>) -> bool,
    ) -> Result<SessionKey, Outcome> {
        match self.inbox.locate(confirmation_id).await {
            Ok(Some(key)) if may_see(key.owner) => Ok(key),
            // Its key may no longer see that namespace (or was removed).
            Ok(Some(_)) => Err(Outcome::Refused(
                "this link's key may no longer decide this pause".to_owned(),
            )),
            Ok(None) => Err(Outcome::Gone),
            Err(_) => Err(Outcome::Unavailable),
        }
    }

    /// Decides `key`'s pause with `reply` on the decision path, as a door
    /// outside the chat stream words it: a pause no longer pending is
    /// told by what became of it.
    pub async fn decide_pause(&self, key: &SessionKey, reply: Reply<'_>) -> Outcome {
        let label = reply.decider.label.clone();
        match self.decide(key, reply).await {
            Ok(decided) => Outcome::Decided { label, decided },
            Err(ReplyError::Decided(note)) => Outcome::AlreadyDecided(note),
            Err(ReplyError::Refused(DecideError::NoPending)) => {
                let decided = match reply.confirmation_id {
                    Some(id) => self.kept.decided_note(key, id).await,
                    None => None,
                };
                decided.map_or(Outcome::Gone, Outcome::AlreadyDecided)
            }
            Err(ReplyError::OutcomeUnknown) => Outcome::Unknown,
            Err(ReplyError::Refused(DecideError::AlreadyApproved(label))) => {
                Outcome::AlreadyApproved(label)
            }
            Err(
                ReplyError::StoreUnavailable
                | ReplyError::Late
                | ReplyError::Refused(DecideError::Settling | DecideError::Counting),
            ) => Outcome::Unavailable,
            Err(err) => Outcome::Refused(err.to_string()),
        }
    }
}
