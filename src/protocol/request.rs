//! The request of `POST /api/v1/chat/stream` and its rules:
//! [`ChatRequest::validate`] turns a decoded body into a [`ValidRequest`]
//! (a chat message, a `CONFIRM_ACTION` reply or a re-attach), checked in the
//! documented order, before any state is consulted.

use serde::Deserialize;
use serde_json::{Map, Value};

/// The chat endpoint's path.
pub const CHAT_PATH: &str = "/api/v1/chat/stream";
/// The inbox's path: the pending pauses a caller may decide.
pub const INBOX_PATH: &str = "/api/v1/interactions";
/// The offered tools, listed (`GET`).
pub const TOOLS_PATH: &str = "/api/v1/tools";
/// The tools file's rules in force.
pub const RULES_PATH: &str = "/api/v1/rules";
/// Live grants (`GET`), and one grant's revoke (`DELETE .../{id}`).
pub const GRANTS_PATH: &str = "/api/v1/grants";
/// A session's kept run outcome (`GET`, then `/{session_id}`).
pub const RUNS_PATH: &str = "/api/v1/runs";
/// Upper bound of a request body, in bytes (413 beyond it).
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Upper bound of `message`, in bytes of UTF-8 (400 beyond it).
pub const MAX_MESSAGE_BYTES: usize = 32 * 1024;
/// Upper bound of `session_id`, in characters.
pub const MAX_SESSION_ID_CHARS: usize = 128;
/// Prefix that turns a message into a confirmation reply, in any letter case.
pub const CONFIRM_PREFIX: &str = "CONFIRM_ACTION";
/// Longest text of `CONFIRM_ACTION:modify:<text>`, in bytes: how much one
/// modify may grow a plan (422 `invalid_confirm_action` beyond it).
pub const MAX_MODIFY_TEXT_BYTES: usize = 4 * 1024;

/// The JSON body of a request. Unknown fields are ignored.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ChatRequest {
    pub message: Option<String>,
    pub session_id: Option<String>,
    pub confirmation_id: Option<String>,
    /// A reply's decisions per task (see [`TaskDecisionRequest`]).
    pub decisions: Option<Vec<TaskDecisionRequest>>,
    /// An `answer` reply's answers to a question pause: `{"<question id>": value}`.
    pub answers: Option<Map<String, Value>>,
    /// A confirm's grant: later calls allowed without asking (checked
    /// against the pause by [`crate::confirmation`]).
    pub grant: Option<Value>,
}

/// One entry of a reply's `decisions`, as sent: checked against the pending
/// confirmation by [`crate::confirmation`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TaskDecisionRequest {
    /// The task's `index` (1-based), or its `task_id`: one of the two
    /// names the task (both: they must name the same one).
    #[serde(default)]
    pub index: Option<u64>,
    #[serde(default)]
    pub task_id: Option<String>,
    /// `approve`, `reject`, `edit` or `respond`.
    pub decision: String,
    pub reason: Option<String>,
    pub args: Option<Value>,
    pub result: Option<String>,
    /// The digest of the task's preview the decider was shown (#43): a
    /// reply whose digest is not the task's current one is refused (409
    /// `preview_stale`).
    #[serde(default)]
    pub preview_digest: Option<String>,
}

/// What a reply carries beside its action, as the request gave it: an
/// approval's per-task `decisions` and `grant`, or a question pause's
/// `answers`. Which of them fits is for the pause's kind to say
/// (each kind's `check_reply`, in `pause/`).
#[derive(Debug, Clone, Copy, Default)]
pub struct ReplyPayload<'a> {
    pub decisions: Option<&'a [TaskDecisionRequest]>,
    pub answers: Option<&'a Map<String, Value>>,
    pub grant: Option<&'a Value>,
}

/// What a request asks for, once every rule of the request is checked.
#[derive(Debug, Clone, PartialEq)]
pub enum ValidRequest {
    /// A chat message: starts a run. Without `session_id` the server makes one.
    Chat {
        session_id: Option<String>,
        message: String,
    },
    /// A `CONFIRM_ACTION` reply to the paused run of `session_id`.
    Reply {
        session_id: String,
        reply: ReplyMessage,
        confirmation_id: Option<String>,
        decisions: Option<Vec<TaskDecisionRequest>>,
        answers: Option<Map<String, Value>>,
        grant: Option<Value>,
    },
    /// `Last-Event-ID`: re-attach to the run of `session_id` after `last_seen`.
    Reattach {
        session_id: String,
        last_seen: u64,
        /// The pause an approver names the run by.
        confirmation_id: Option<String>,
    },
}

/// Why a request breaks a rule of its own (before any state is consulted).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error(
        "session_id must be 1-{MAX_SESSION_ID_CHARS} characters of UTF-8 without control characters"
    )]
    BadSessionId,
    #[error("Last-Event-ID must be a chunk sequence number")]
    BadLastEventId,
    #[error("a re-attach (Last-Event-ID) needs the session_id of the run")]
    ReattachWithoutSession,
    #[error("message is required")]
    MissingMessage,
    #[error("message must not be empty")]
    EmptyMessage,
    #[error("message is longer than {MAX_MESSAGE_BYTES} bytes")]
    MessageTooLong,
    #[error("a reply needs session_id: the session of the paused run it answers")]
    ReplyWithoutSession,
    #[error("{0}")]
    MalformedReply(#[from] ReplySyntaxError),
}

impl ChatRequest {
    /// Checks the request's rules, in the documented order: the session id,
    /// then `Last-Event-ID` (a re-attach ignores `message`), then the
    /// message, then a reply's syntax.
    pub fn validate(self, last_event_id: Option<&[u8]>) -> Result<ValidRequest, RequestError> {
        if let Some(id) = &self.session_id {
            if !is_valid_session_id(id) {
                return Err(RequestError::BadSessionId);
            }
        }
        if let Some(value) = last_event_id {
            let last_seen = std::str::from_utf8(value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or(RequestError::BadLastEventId)?;
            let session_id = self
                .session_id
                .ok_or(RequestError::ReattachWithoutSession)?;
            return Ok(ValidRequest::Reattach {
                session_id,
                last_seen,
                confirmation_id: self.confirmation_id,
            });
        }
        let message = self.message.ok_or(RequestError::MissingMessage)?;
        if message.trim().is_empty() {
            return Err(RequestError::EmptyMessage);
        }
        if message.len() > MAX_MESSAGE_BYTES {
            return Err(RequestError::MessageTooLong);
        }
        match parse_reply(&message) {
            None => Ok(ValidRequest::Chat {
                session_id: self.session_id,
                message,
            }),
            Some(reply) => {
                let reply = reply?;
                let session_id = self.session_id.ok_or(RequestError::ReplyWithoutSession)?;
                Ok(ValidRequest::Reply {
                    session_id,
                    reply,
                    confirmation_id: self.confirmation_id,
                    decisions: self.decisions,
                    answers: self.answers,
                    grant: self.grant,
                })
            }
        }
    }
}

/// True when `text` is 1 to `longest` characters of A-Z a-z 0-9 _ -: what
/// tool, server, group and label names, and question ids, are made of.
pub fn is_plain_name(text: &str, longest: usize) -> bool {
    !text.is_empty()
        && text.len() <= longest
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// True when `id` is 1-128 characters (of UTF-8, as every JSON string is)
/// and none is a control character. Any such id is safe on the wire: it
/// only ever leaves JSON-escaped.
pub fn is_valid_session_id(id: &str) -> bool {
    !id.is_empty()
        && id.chars().count() <= MAX_SESSION_ID_CHARS
        && !id.chars().any(char::is_control)
}

/// A syntactically valid `CONFIRM_ACTION` message. Whether the action is
/// offered, and whether `modify` has text, is judged against the pending
/// request (see [`crate::confirmation`]), because the order of checks puts
/// "nothing pending" (404) before "action not offered" (422).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyMessage {
    /// Trimmed and lower-cased; not necessarily a known action.
    pub action: String,
    /// Everything after the second colon, verbatim; `None` without one.
    pub text: Option<String>,
}

/// Why a `CONFIRM_ACTION` message could not be read at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplySyntaxError {
    #[error("expected `CONFIRM_ACTION:<action>[:<text>]`: the prefix must be followed by a colon")]
    MissingColon,
    #[error("expected `CONFIRM_ACTION:<action>[:<text>]`: the action is empty")]
    EmptyAction,
}

/// Classifies a chat message: `None` for ordinary chat, `Some(..)` for
/// anything that starts with [`CONFIRM_PREFIX`] in any letter case (a reply,
/// well-formed or not: `confirm_action:confirm` must not become a new plan).
pub fn parse_reply(message: &str) -> Option<Result<ReplyMessage, ReplySyntaxError>> {
    let prefix = message.get(..CONFIRM_PREFIX.len())?;
    if !prefix.eq_ignore_ascii_case(CONFIRM_PREFIX) {
        return None;
    }
    let rest = &message[CONFIRM_PREFIX.len()..];
    let Some(rest) = rest.strip_prefix(':') else {
        return Some(Err(ReplySyntaxError::MissingColon));
    };
    let (action, text) = match rest.split_once(':') {
        Some((action, text)) => (action, Some(text.to_owned())),
        None => (rest, None),
    };
    let action = action.trim().to_lowercase();
    if action.is_empty() {
        return Some(Err(ReplySyntaxError::EmptyAction));
    }
    Some(Ok(ReplyMessage { action, text }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(message: &str) -> ReplyMessage {
        parse_reply(message)
            .expect("is a reply")
            .expect("is well formed")
    }

    #[test]
    fn plain_chat_is_not_a_reply() {
        for message in ["hello", " CONFIRM_ACTION:confirm", "", "CONFIRM", "é"] {
            assert_eq!(parse_reply(message), None, "{message:?}");
        }
    }

    #[test]
    fn the_prefix_is_recognised_in_any_letter_case() {
        assert_eq!(ok("confirm_action:confirm").action, "confirm");
        assert_eq!(ok("Confirm_Action:Cancel").action, "cancel");
        assert_eq!(
            parse_reply("confirm_actionconfirm"),
            Some(Err(ReplySyntaxError::MissingColon))
        );
    }

    #[test]
    fn bare_actions_parse_case_insensitively_and_trimmed() {
        assert_eq!(ok("CONFIRM_ACTION:confirm").action, "confirm");
        assert_eq!(ok("CONFIRM_ACTION: Cancel ").action, "cancel");
        assert_eq!(ok("CONFIRM_ACTION:MODIFY:x").action, "modify");
        assert_eq!(ok("CONFIRM_ACTION:confirm").text, None);
    }

    #[test]
    fn text_is_everything_after_the_second_colon() {
        let reply = ok("CONFIRM_ACTION:modify:use a: b\nthen c:");
        assert_eq!(reply.action, "modify");
        assert_eq!(reply.text.as_deref(), Some("use a: b\nthen c:"));
        assert_eq!(ok("CONFIRM_ACTION:modify:").text.as_deref(), Some(""));
    }

    #[test]
    fn unknown_actions_still_parse_so_the_manager_can_reject_them_in_order() {
        assert_eq!(ok("CONFIRM_ACTION:launch").action, "launch");
    }

    #[test]
    fn malformed_replies_are_errors_not_chat() {
        let cases = [
            ("CONFIRM_ACTION", ReplySyntaxError::MissingColon),
            ("CONFIRM_ACTIONconfirm", ReplySyntaxError::MissingColon),
            ("CONFIRM_ACTION confirm", ReplySyntaxError::MissingColon),
            ("CONFIRM_ACTION:", ReplySyntaxError::EmptyAction),
            ("CONFIRM_ACTION:  ", ReplySyntaxError::EmptyAction),
            ("CONFIRM_ACTION::text", ReplySyntaxError::EmptyAction),
        ];
        for (message, expected) in cases {
            assert_eq!(parse_reply(message), Some(Err(expected)), "{message:?}");
        }
    }

    #[test]
    fn session_ids_are_any_text_of_1_to_128_characters_without_controls() {
        for good in [
            "abc-DEF_1.2:3",
            "user@example.com",
            "会话1",
            "my session",
            "a/b\"c",
        ] {
            assert!(is_valid_session_id(good), "{good:?}");
        }
        assert!(
            is_valid_session_id(&"é".repeat(128)),
            "characters, not bytes"
        );
        for bad in ["", "a\nb", "a\u{7f}", "tab\there", "\u{85}"] {
            assert!(!is_valid_session_id(bad), "{bad:?}");
        }
        assert!(!is_valid_session_id(&"a".repeat(129)));
    }

    fn request(message: Option<&str>, session: Option<&str>) -> ChatRequest {
        ChatRequest {
            message: message.map(str::to_owned),
            session_id: session.map(str::to_owned),
            confirmation_id: None,
            decisions: None,
            answers: None,
            grant: None,
        }
    }

    #[test]
    fn a_request_is_a_chat_a_reply_or_a_re_attach() {
        assert!(matches!(
            request(Some("hi"), None).validate(None),
            Ok(ValidRequest::Chat {
                session_id: None,
                ..
            })
        ));
        assert!(matches!(
            request(Some("CONFIRM_ACTION:confirm"), Some("s")).validate(None),
            Ok(ValidRequest::Reply { .. })
        ));
        assert_eq!(
            request(None, Some("s")).validate(Some(b" 7 ")),
            Ok(ValidRequest::Reattach {
                session_id: "s".into(),
                last_seen: 7,
                confirmation_id: None,
            })
        );
    }

    #[test]
    fn broken_rules_are_reported_in_order() {
        let long = "x".repeat(MAX_MESSAGE_BYTES + 1);
        let cases: [(ChatRequest, Option<&[u8]>, RequestError); 8] = [
            (
                request(Some("hi"), Some("")),
                None,
                RequestError::BadSessionId,
            ),
            (
                request(None, Some("a\u{0}")),
                Some(b"1"),
                RequestError::BadSessionId,
            ),
            (
                request(None, Some("s")),
                Some(b"x"),
                RequestError::BadLastEventId,
            ),
            (
                request(None, None),
                Some(b"1"),
                RequestError::ReattachWithoutSession,
            ),
            (request(None, Some("s")), None, RequestError::MissingMessage),
            (
                request(Some(" \n"), Some("s")),
                None,
                RequestError::EmptyMessage,
            ),
            (
                request(Some(&long), Some("s")),
                None,
                RequestError::MessageTooLong,
            ),
            (
                request(Some("CONFIRM_ACTION:confirm"), None),
                None,
                RequestError::ReplyWithoutSession,
            ),
        ];
        for (request, last_event_id, expected) in cases {
            assert_eq!(request.validate(last_event_id), Err(expected));
        }
    }
}
