//! The answers a reply to questions carries (`answer:<text>` or
//! `answers`), checked against the pending questions before the pause is
//! decided.

use serde_json::{Map, Value};

use super::approval::check_decisions;
use super::plan_check::PlanCheck;
use super::reply::{Checked, Refused, Reply};
use crate::protocol::given::Given;
use crate::protocol::question::{normalize_answers, normalize_text, Question};
use crate::protocol::Action;

/// Checks `reply` against `questions`: no grant, no per-task decisions,
/// and its answers ([`check_answers`]). Anyone who may reach the pause
/// answers it; no approvals are counted.
pub fn check_reply(questions: &[Question], reply: &Reply<'_>) -> Result<Checked, Refused> {
    if reply.payload.grant.is_some() {
        return Err(Refused::InvalidGrant(
            "grant: a grant goes with a confirmation, not with questions".to_owned(),
        ));
    }
    check_decisions(reply.action, reply.payload.decisions, &PlanCheck::default())?;
    let answers = check_answers(reply.action, reply.text, reply.payload.answers, questions)
        .map_err(Refused::InvalidAnswer)?;
    Ok(Checked {
        given: answers.map(Given::Answers),
        ..Checked::default()
    })
}

/// A reply's answers to `questions`: normalized for `answer` (from its text
/// or its `answers`, not both), none for `skip` and `cancel` (which take
/// no `answers`).
pub fn check_answers(
    action: Action,
    text: Option<&str>,
    answers: Option<&Map<String, Value>>,
    questions: &[Question],
) -> Result<Option<Map<String, Value>>, String> {
    if action != Action::Answer {
        return match answers {
            Some(_) => Err(format!(
                "answers go with answer only, not with {}",
                action.as_str()
            )),
            None => Ok(None),
        };
    }
    let normalized = match (text, answers) {
        (Some(_), Some(_)) => {
            return Err(
                "give the answer as `CONFIRM_ACTION:answer:<text>` or as \"answers\", not both"
                    .to_owned(),
            )
        }
        (Some(text), None) => normalize_text(questions, text),
        (None, Some(answers)) => normalize_answers(questions, answers),
        (None, None) => {
            return Err(
                "an answer needs its text (`CONFIRM_ACTION:answer:<text>`) or \"answers\": \
                 {\"<question id>\": value}"
                    .to_owned(),
            )
        }
    };
    normalized.map(Some).map_err(|err| err.to_string())
}
