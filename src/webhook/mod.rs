//! Webhooks (`--webhook URL`): every pause's life, POSTed to the URLs as
//! signed JSON events, at least once.
//!
//! Events: `interaction.requested` (a pause registered, before its chunk is
//! sent), `interaction.decided` (a reply won, or a new message superseded
//! the pause), `interaction.expired` (its timeout decided) and `run.ended`
//! (for runs that paused at least once). Each is written to the store's
//! outbox *with* the write it announces (the paused record, the decision,
//! the end: one transaction with `sqlite:`), so a durable store loses none
//! to a `kill -9`; without a store write (`memory`, a pause no store keeps)
//! it is queued on its own. [`deliver`] sends them: per session and URL in
//! order, retried with backoff for `--webhook-retry-for`, never on the path
//! of a stream, a reply or a resume.
//!
//! The body and its signature are pinned (docs/operations.md shows how to
//! verify one): `X-Chatgate-Signature: t=<unix seconds>,v1=<hex
//! HMAC-SHA256 of "<t>.<body>">`, `X-Chatgate-Event`, `X-Chatgate-Delivery`
//! (the event's id, the same on every retry).

mod body;
pub mod deliver;

pub use body::DecisionData;

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::Sha256;
use tokio::sync::Notify;

use crate::protocol::{ChunkType, PauseData, PauseKind};
use crate::session::SessionKey;
use crate::store::OutboxEvent;

/// Default of `--webhook-retry-for`.
pub const RETRY_FOR: Duration = Duration::from_secs(3600);
/// A delivery that has no answer within this long failed.
pub const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);
/// The shortest secret `--webhook-secret` takes.
pub const MIN_SECRET_CHARS: usize = 16;

/// `--webhook`, `--webhook-secret`, `--public-url`, `--webhook-retry-for`.
#[derive(Debug)]
pub struct Webhooks {
    pub urls: Vec<String>,
    secret: SecretString,
    /// The page's address, for `decide_url` (no trailing `/`).
    pub public_url: Option<String>,
    pub retry_for: Duration,
    /// `--slack-webhook`: where approval pauses are posted as Block Kit
    /// messages with Approve and Reject buttons.
    pub slack: Option<String>,
    /// `--smtp`: approval mail to approvers' `email=`.
    pub mailer: Option<Arc<crate::notify::mail::Mailer>>,
    /// Woken when events are queued: the sender looks at once.
    wake: Notify,
    /// Backlogs of the server's own being worked off
    /// ([`deliver::GiveWay`]): the
    /// sender keeps few deliveries under way meanwhile.
    giving_way: AtomicUsize,
}

impl Webhooks {
    pub fn new(
        urls: Vec<String>,
        secret: SecretString,
        public_url: Option<String>,
        retry_for: Duration,
        slack: Option<String>,
        mailer: Option<Arc<crate::notify::mail::Mailer>>,
    ) -> Result<Arc<Webhooks>, String> {
        if secret.expose_secret().chars().count() < MIN_SECRET_CHARS {
            return Err(format!(
                "--webhook-secret must be at least {MIN_SECRET_CHARS} characters"
            ));
        }
        Ok(Arc::new(Webhooks {
            urls,
            secret,
            public_url: public_url.map(|url| url.trim_end_matches('/').to_owned()),
            retry_for,
            slack,
            mailer,
            wake: Notify::new(),
            giving_way: AtomicUsize::new(0),
        }))
    }

    /// Whether events go to `target` (a `--webhook`, `--slack-webhook`,
    /// or a mail address with `--smtp`).
    pub fn knows(&self, target: &str) -> bool {
        self.urls.iter().any(|url| url == target)
            || self.slack.as_deref() == Some(target)
            || self.mailer_for(target).is_some()
    }

    /// The mailer of a mail target (`mailto:ADDR`).
    pub fn mailer_for(&self, target: &str) -> Option<&crate::notify::mail::Mailer> {
        target.strip_prefix(crate::notify::mail::MAILTO)?;
        self.mailer.as_deref()
    }

    /// Events were queued: the sender looks now rather than at its next tick.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// `X-Chatgate-Signature`'s value for `body` at `t` (unix seconds).
    pub fn signature(&self, t: u64, body: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(self.secret.expose_secret().as_bytes())
            .expect("HMAC takes a key of any length");
        mac.update(t.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
    }

    /// The outbox rows of `event`: one per URL, in order per session.
    pub fn rows(&self, event: &Event) -> Vec<OutboxEvent> {
        let mut event = event.clone();
        let about_a_pause = !matches!(
            event.event_type,
            EventType::GrantCreated | EventType::GrantRevoked
        );
        if let (Some(public), true) = (&self.public_url, about_a_pause) {
            let session = encode_component(&event.session_id);
            event.decide_url = Some(format!("{public}/#session={session}"));
        }
        let body = serde_json::to_string(&event).unwrap_or_default();
        let mut rows: Vec<OutboxEvent> = self
            .urls
            .iter()
            .map(|url| OutboxEvent {
                id: event.id.clone(),
                event_type: event.event_type.as_str().to_owned(),
                target: url.clone(),
                order: event.order.clone(),
                body: body.clone(),
            })
            .collect();
        // An approval or reconcile pause, with its buttons' token: a Slack
        // message too.
        let asked = event.event_type == EventType::Requested
            && (event.kind.asks_a_yes() || event.kind.asks_run_again());
        if let (Some(slack), Some(token), true) = (&self.slack, &event.slack, asked) {
            let summary = event.summary.as_deref().unwrap_or_default();
            let page = event.decide_url.as_deref();
            if let Ok(pause) = PauseData::deserialize(&event.data) {
                let message =
                    crate::notify::slack::message(&pause, &event.key, summary, token, page);
                rows.push(OutboxEvent {
                    id: event.id.clone(),
                    event_type: event.event_type.as_str().to_owned(),
                    target: slack.clone(),
                    order: event.order.clone(),
                    body: message.to_string(),
                });
            }
        }
        // Approvers with a mail address: one mail each.
        if self.mailer.is_some() {
            let why = match (event.event_type, event.data.get("escalated_to")) {
                (_, Some(group)) => crate::notify::mail::MailWhy::Escalated(
                    group.as_str().unwrap_or_default().to_owned(),
                ),
                (EventType::Reminder, None) => crate::notify::mail::MailWhy::Reminded,
                _ => crate::notify::mail::MailWhy::Asked,
            };
            let pause = PauseData::deserialize(event.mail_data.as_ref().unwrap_or(&event.data));
            for to in &event.mail_to {
                let summary = event.summary.as_deref().unwrap_or("a pause waits");
                let letter = crate::notify::mail::letter(
                    &event.id,
                    pause.as_ref().ok(),
                    &event.key,
                    &event.session_id,
                    summary,
                    &why,
                    to,
                );
                rows.push(OutboxEvent {
                    id: event.id.clone(),
                    event_type: event.event_type.as_str().to_owned(),
                    target: format!("{}{}", crate::notify::mail::MAILTO, to.address),
                    // Each address's mail in its own order: one slow
                    // mailbox holds up no one else's.
                    order: format!("{}/{}", event.order, to.address),
                    body: serde_json::to_string(&letter).unwrap_or_default(),
                });
            }
        }
        rows
    }
}

/// An event's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum EventType {
    #[serde(rename = "interaction.requested")]
    Requested,
    #[serde(rename = "interaction.decided")]
    Decided,
    #[serde(rename = "interaction.expired")]
    Expired,
    #[serde(rename = "run.ended")]
    Ended,
    #[serde(rename = "grant.created")]
    GrantCreated,
    #[serde(rename = "grant.revoked")]
    GrantRevoked,
    #[serde(rename = "interaction.progress")]
    Progress,
    #[serde(rename = "interaction.reminder")]
    Reminder,
    #[serde(rename = "interaction.escalated")]
    Escalated,
    #[serde(rename = "run.resumed")]
    Resumed,
}

impl EventType {
    pub const ALL: [EventType; 10] = [
        EventType::Progress,
        EventType::Reminder,
        EventType::Escalated,
        EventType::Requested,
        EventType::Decided,
        EventType::Expired,
        EventType::Ended,
        EventType::GrantCreated,
        EventType::GrantRevoked,
        EventType::Resumed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Requested => "interaction.requested",
            EventType::Decided => "interaction.decided",
            EventType::Expired => "interaction.expired",
            EventType::Ended => "run.ended",
            EventType::GrantCreated => "grant.created",
            EventType::GrantRevoked => "grant.revoked",
            EventType::Progress => "interaction.progress",
            EventType::Reminder => "interaction.reminder",
            EventType::Escalated => "interaction.escalated",
            EventType::Resumed => "run.resumed",
        }
    }

    /// The metric label of a stored event type.
    pub fn label(stored: &str) -> &'static str {
        EventType::ALL
            .into_iter()
            .find(|t| t.as_str() == stored)
            .map_or("unknown", EventType::as_str)
    }
}

/// One event, as its body is sent (pinned: docs/operations.md).
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    pub id: String,
    #[serde(rename = "type")]
    pub event_type: EventType,
    pub at: String,
    pub session_id: String,
    pub confirmation_id: String,
    pub kind: PauseKind,
    /// The requester's key label.
    pub key: String,
    pub data: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decide_url: Option<String>,
    /// Decision links (`--link-secret`): one per person who may decide
    /// (requested and escalated events).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<crate::notify::links::Link>,
    /// A decision token naming no one: what a Slack message's buttons
    /// carry (`--slack-webhook`).
    #[serde(skip)]
    pub slack: Option<String>,
    /// Who gets this event as a mail, with their link (`--smtp`).
    #[serde(skip)]
    pub mail_to: Vec<crate::notify::mail::MailTo>,
    /// The pause's summary (its request's text), for Slack and mail.
    #[serde(skip)]
    pub summary: Option<String>,
    /// The pause's `confirmation_data`, for a mail of an event whose `data`
    /// is not it (an escalation's): its tasks, risk and expiry.
    #[serde(skip)]
    pub mail_data: Option<Value>,
    /// Events of one session (in its namespace) are delivered in order.
    #[serde(skip)]
    order: String,
    /// The requester's namespace, when `key` is still to be written as
    /// the keys file labels it (`label=`); `None` when `key` is final.
    #[serde(skip)]
    pub owner: Option<Option<u32>>,
}

/// The pause an event is about.
#[derive(Debug, Clone)]
pub struct About<'a> {
    pub key: &'a SessionKey,
    pub confirmation_id: &'a str,
    pub kind: PauseKind,
}

impl Event {
    fn new(event_type: EventType, about: &About<'_>, data: Value) -> Event {
        Event {
            id: uuid::Uuid::new_v4().to_string(),
            event_type,
            at: crate::clock::rfc3339_ms(crate::clock::now_ms()),
            session_id: about.key.session_id.to_string(),
            confirmation_id: about.confirmation_id.to_owned(),
            kind: about.kind,
            key: crate::session::owner_label(about.key.owner),
            data,
            decide_url: None,
            links: Vec::new(),
            slack: None,
            mail_to: Vec::new(),
            summary: None,
            mail_data: None,
            owner: Some(about.key.owner),
            order: format!(
                "{}/{}",
                crate::session::owner_label(about.key.owner),
                about.key.session_id
            ),
        }
    }

    /// With `links` (decision links of the pause).
    pub fn with_links(mut self, links: Vec<crate::notify::links::Link>) -> Event {
        self.links = links;
        self
    }

    /// A pause registered: `data` is its `confirmation_data`.
    pub fn requested(about: &About<'_>, confirmation_data: Value) -> Event {
        Event::new(EventType::Requested, about, confirmation_data)
    }

    /// A reply won: what it decided, and who (the deciding key's label and
    /// the client's address).
    pub fn decided(about: &About<'_>, decision: &DecisionData<'_>) -> Event {
        let data = body::data(body::Decided::of(decision));
        Event::new(EventType::Decided, about, data)
    }

    /// One approval of several a pause needs: who so far, and how many.
    pub fn progress(
        about: &About<'_>,
        approvals: &[String],
        required: usize,
        (by, via): (&str, crate::protocol::Via),
    ) -> Event {
        let data = body::data(body::Progress {
            approvals,
            required,
            approved_by: by,
            via,
        });
        Event::new(EventType::Progress, about, data)
    }

    /// Some tasks of a pause decided on their own (`decide`), by `by`;
    /// `pending` are still pending.
    pub fn tasks_decided(
        about: &About<'_>,
        decisions: &crate::protocol::Decisions,
        pending: &[usize],
        task_approvals: &[crate::store::TaskApprovals],
        (by, via): (&str, Option<crate::protocol::Via>),
    ) -> Event {
        let data = body::data(body::TasksDecided {
            decisions,
            decided_by: by,
            pending,
            task_approvals,
            via,
        });
        Event::new(EventType::Progress, about, data)
    }

    /// A pause nobody has answered for `waited` (its tools' `remind_after`).
    pub fn reminder(about: &About<'_>, waited: Duration, tasks: &[usize]) -> Event {
        let data = body::data(body::Waited::new(waited, None, tasks));
        Event::new(EventType::Reminder, about, data)
    }

    /// A pause nobody answered for `waited`, escalated to `group`.
    pub fn escalated(about: &About<'_>, waited: Duration, group: &str, tasks: &[usize]) -> Event {
        let data = body::data(body::Waited::new(waited, Some(group), tasks));
        Event::new(EventType::Escalated, about, data)
    }

    /// The pause's timeout decided: the run is cancelled.
    pub fn expired(about: &About<'_>, timeout: Duration) -> Event {
        let data = body::data(body::Expired::after(timeout));
        Event::new(EventType::Expired, about, data)
    }

    /// `interaction.expired` of a pause whose tasks silence rejected.
    pub fn expired_rejecting(
        about: &About<'_>,
        timeout: Duration,
        rejected: &crate::protocol::Decisions,
    ) -> Event {
        let data = body::data(body::Expired::rejecting(timeout, rejected));
        Event::new(EventType::Expired, about, data)
    }

    /// A grant kept (`created`, with the pause it was given on) or revoked
    /// (with who revoked it): `data` is the grant as the API lists it.
    pub fn grant(
        event_type: EventType,
        grant: &crate::store::Grant,
        confirmation_id: &str,
        revoked_by: Option<&str>,
    ) -> Event {
        let data = body::data(body::Grant {
            grant: grant.view(),
            revoked_by,
        });
        Event {
            id: uuid::Uuid::new_v4().to_string(),
            event_type,
            at: crate::clock::rfc3339_ms(crate::clock::now_ms()),
            session_id: grant.session_id.clone(),
            confirmation_id: confirmation_id.to_owned(),
            kind: PauseKind::Approval,
            key: grant.key.clone(),
            data,
            decide_url: None,
            links: Vec::new(),
            slack: None,
            mail_to: Vec::new(),
            summary: None,
            mail_data: None,
            owner: None,
            order: format!("{}/{}", grant.key, grant.session_id),
        }
    }

    /// A run that paused ended: its final chunk's type, and a cancel's
    /// reason or an error's type. `about` is its last pause.
    /// `run.resumed`: a task of a decided pause continued after a crash.
    pub fn resumed(
        about: &About<'_>,
        task: usize,
        tool: &str,
        idempotency_key: &str,
        how: crate::protocol::ResumedHow,
    ) -> Event {
        let data = body::data(body::Resumed {
            task,
            tool,
            idempotency_key,
            how,
        });
        Event::new(EventType::Resumed, about, data)
    }

    pub fn ended(about: &About<'_>, outcome: ChunkType, why: Option<&str>) -> Event {
        let data = body::data(body::Ended::new(outcome, why));
        Event::new(EventType::Ended, about, data)
    }
}

/// `text` as JavaScript's `encodeURIComponent` writes it (the page reads
/// `#session=` with `decodeURIComponent`).
fn encode_component(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.!~*'()".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Unix seconds now.
pub fn unix_now() -> u64 {
    crate::clock::now_secs()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hooks(public: Option<&str>) -> Arc<Webhooks> {
        Webhooks::new(
            vec!["http://127.0.0.1:1/a".into(), "http://127.0.0.1:1/b".into()],
            SecretString::from("0123456789abcdef".to_owned()),
            public.map(str::to_owned),
            RETRY_FOR,
            None,
            None,
        )
        .unwrap()
    }

    #[test]
    fn a_short_secret_is_refused() {
        let err = Webhooks::new(
            vec![],
            SecretString::from("short".to_owned()),
            None,
            RETRY_FOR,
            None,
            None,
        )
        .unwrap_err();
        assert!(err.contains("16"), "{err}");
    }

    #[test]
    fn the_signature_is_the_hmac_of_t_dot_body() {
        // Computed independently: printf '%s' '1700000000.{"a":1}' |
        // openssl dgst -sha256 -hmac 0123456789abcdef
        let sig = hooks(None).signature(1_700_000_000, br#"{"a":1}"#);
        let mut mac = Hmac::<Sha256>::new_from_slice(b"0123456789abcdef").unwrap();
        mac.update(br#"1700000000.{"a":1}"#);
        let expected = hex::encode(mac.finalize().into_bytes());
        assert_eq!(sig, format!("t=1700000000,v1={expected}"));
    }

    #[test]
    fn rows_go_to_every_url_with_one_id_and_the_decide_url() {
        let key = SessionKey::new(Some(0), "a b/ü");
        let about = About {
            key: &key,
            confirmation_id: "c-1",
            kind: PauseKind::Question,
        };
        let event = Event::requested(&about, serde_json::json!({"kind": "question"}));
        let rows = hooks(Some("https://gate.example/")).rows(&event);

        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].id, rows[1].id);
        assert_ne!(rows[0].target, rows[1].target);
        let body: Value = serde_json::from_str(&rows[0].body).unwrap();
        assert_eq!(body["type"], "interaction.requested");
        assert_eq!(body["key"], "key-1");
        assert_eq!(body["kind"], "question");
        assert_eq!(body["confirmation_id"], "c-1");
        assert_eq!(
            body["decide_url"],
            "https://gate.example/#session=a%20b%2F%C3%BC"
        );
        assert!(body.get("order").is_none());
    }
}
