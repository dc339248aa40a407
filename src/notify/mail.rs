//! Approval mail (`--smtp`, `--mail-from`): on `interaction.requested`,
//! each approver with an `email=` whose scope takes the pause in gets one
//! mail (text and HTML: the summary, the tasks with their risk, the
//! expiry, their own decision link); on `interaction.escalated`, the
//! escalation group's members. Mails are queued in the webhook outbox with
//! the event (retries, at least once, never delaying a stream); each
//! carries a `Message-ID` made from the event's id and the recipient's
//! label, so a retry is recognizable as the same message.

use lettre::message::header::ContentType;
use lettre::message::{Mailbox, MultiPart, SinglePart};
use lettre::transport::smtp::authentication::Credentials;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::protocol::{PauseData, RiskLevel};

/// An outbox target that is a mail address, not a URL.
pub const MAILTO: &str = "mailto:";

/// Who gets a pause's mail, and their link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MailTo {
    pub address: String,
    pub label: String,
    pub url: String,
}

/// One mail as the outbox keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Letter {
    pub to: String,
    pub subject: String,
    pub text: String,
    pub html: String,
    pub message_id: String,
}

/// Why a pause is mailed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MailWhy {
    /// It was asked.
    Asked,
    /// Nobody answered it yet (`remind_after`).
    Reminded,
    /// Nobody answered it in time: escalated to this group.
    Escalated(String),
}

/// The mail of the pause `pause` (asked by `key`, summed up as `summary`;
/// none when its request is no longer at hand) for `to`, and why it is
/// sent.
/// Most bytes of a task's preview a letter shows; the rest is a link away.
pub const MAIL_PREVIEW_BYTES: usize = 2 * 1024;

pub fn letter(
    event_id: &str,
    pause: Option<&PauseData>,
    key: &str,
    session_id: &str,
    summary: &str,
    why: &MailWhy,
    to: &MailTo,
) -> Letter {
    let card = super::Card::of(pause);
    let (expires, risk) = (card.expires_at, card.risk);
    let reason = why;
    let why = match reason {
        MailWhy::Escalated(group) => format!("Escalated to {group}: nobody decided in time.\n\n"),
        MailWhy::Reminded => "Reminder: nobody has decided this yet.\n\n".to_owned(),
        MailWhy::Asked => String::new(),
    };
    let who = &card.who_decides;
    let mut text = format!(
        "{why}{summary}\nfrom {key}, session {session_id}, {risk} risk, expires {expires}\n{who}\n\n"
    );
    let mut html = format!(
        "<p>{}</p><h2>{}</h2><p>from {}, session {}, {} risk, expires {}</p><p>{}</p><ol>",
        escape(why.trim()),
        escape(summary),
        escape(key),
        escape(session_id),
        escape(risk),
        escape(expires),
        escape(who)
    );
    for task in card.tasks {
        let args = task.args.as_ref().map(Value::to_string).unwrap_or_default();
        let args: String = args.chars().take(500).collect();
        let task_risk = task.risk_level.map_or("", RiskLevel::as_str);
        let line = format!(
            "{}. {} ({task_risk} risk): {}\n   {}\n",
            task.index, task.tool, task.description, args
        );
        text.push_str(&line);
        // What it would do (#43): cut at 2 KiB, the rest on the page.
        let preview = task.preview.as_ref().map(|p| {
            let (shown, cut) = crate::tools::preview::cut_to(&p.body, MAIL_PREVIEW_BYTES);
            let label = if p.ok {
                "Preview"
            } else {
                "The preview failed"
            };
            let more = (cut || p.truncated).then(|| format!("see the full preview: {}", to.url));
            text.push_str(&format!("   {label}:\n"));
            for line in shown.lines() {
                text.push_str(&format!("   | {line}\n"));
            }
            if let Some(more) = &more {
                text.push_str(&format!("   ... {more}\n"));
            }
            format!(
                "<div>{label}:</div><pre style=\"white-space:pre;overflow:auto;max-height:20em;\
                 background:#fffbe6\">{}</pre>{}",
                escape(shown),
                more.map(|_| format!(
                    "<p><a href=\"{}\">see the full preview</a></p>",
                    escape(&to.url)
                ))
                .unwrap_or_default()
            )
        });
        html.push_str(&format!(
            "<li><b>{}</b> ({} risk): {}<br><code>{}</code>{}</li>",
            escape(&task.tool),
            escape(task_risk),
            escape(&task.description),
            escape(&args),
            preview.unwrap_or_default()
        ));
    }
    text.push_str(&format!(
        "\nDecide as {}: {}\n(The link is yours: whoever opens it decides as you.)\n",
        to.label, to.url
    ));
    html.push_str(&format!(
        "</ol><p><a href=\"{}\">Decide as {}</a></p><p>The link is yours: whoever opens it \
         decides as you.</p>",
        escape(&to.url),
        escape(&to.label)
    ));
    // The tools it would run and the session, then the summary.
    let mut tools: Vec<String> = Vec::new();
    for task in card.tasks {
        let tool = task.tool.clone();
        if !tool.is_empty() && !tools.contains(&tool) {
            tools.push(tool);
        }
    }
    let what = match tools.as_slice() {
        [] => format!("session {session_id}"),
        _ => format!("{} in session {session_id}", tools.join(", ")),
    };
    let subject = match reason {
        MailWhy::Escalated(group) => format!("[chatgate] Escalated to {group}: {what}: {summary}"),
        MailWhy::Reminded => format!("[chatgate] Reminder, approval needed: {what}: {summary}"),
        MailWhy::Asked => format!("[chatgate] Approval needed: {what}: {summary}"),
    };
    Letter {
        to: to.address.clone(),
        // One line: nothing a summary holds can start another header.
        subject: subject
            .chars()
            .filter(|c| !c.is_control())
            .take(200)
            .collect(),
        text,
        html,
        message_id: format!("<{event_id}.{}@chatgate>", to.label),
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Sends letters through one SMTP server.
pub struct Mailer {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
}

impl std::fmt::Debug for Mailer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailer")
            .field("from", &self.from.to_string())
            .finish_non_exhaustive()
    }
}

impl Mailer {
    /// `--smtp URL`: `smtp://[user[:password]@]host[:port]` (STARTTLS when
    /// the server offers it; 25 by default) or `smtps://...` (TLS from the
    /// start; 465), the password from the URL or `password`
    /// (`CHATGATE_SMTP_PASSWORD`); `from` the sender's address.
    pub fn open(url: &str, password: Option<SecretString>, from: &str) -> Result<Mailer, String> {
        let parsed = reqwest::Url::parse(url).map_err(|err| format!("--smtp: {err}"))?;
        let host = parsed
            .host_str()
            .ok_or("--smtp: the URL names no host")?
            .to_owned();
        let builder = match parsed.scheme() {
            "smtp" => plain_or_starttls(&host)?.port(parsed.port().unwrap_or(25)),
            "smtps" => implicit_tls(&host)?.port(parsed.port().unwrap_or(465)),
            other => return Err(format!("--smtp: `{other}://` is not smtp:// or smtps://")),
        };
        let user = percent_decode(parsed.username());
        let password = match parsed.password() {
            Some(password) => Some(percent_decode(password)),
            None => password.map(|p| p.expose_secret().to_owned()),
        };
        let builder = match (user.is_empty(), password) {
            (false, Some(password)) => builder.credentials(Credentials::new(user, password)),
            (false, None) => {
                return Err(
                    "--smtp: a user needs a password (in the URL or CHATGATE_SMTP_PASSWORD)"
                        .to_owned(),
                )
            }
            (true, _) => builder,
        };
        let from = from
            .parse::<Mailbox>()
            .map_err(|err| format!("--mail-from `{from}`: {err}"))?;
        Ok(Mailer {
            transport: builder
                .timeout(Some(std::time::Duration::from_secs(10)))
                .build(),
            from,
        })
    }

    /// Sends `letter`; the error says why (never with the password).
    pub async fn send(&self, letter: &Letter) -> Result<(), String> {
        let to = letter
            .to
            .parse::<Mailbox>()
            .map_err(|err| format!("bad address: {err}"))?;
        let message = Message::builder()
            .from(self.from.clone())
            .to(to)
            .subject(letter.subject.clone())
            .message_id(Some(letter.message_id.clone()))
            .multipart(
                MultiPart::alternative()
                    .singlepart(
                        SinglePart::builder()
                            .header(ContentType::TEXT_PLAIN)
                            .body(letter.text.clone()),
                    )
                    .singlepart(
                        SinglePart::builder()
                            .header(ContentType::TEXT_HTML)
                            .body(letter.html.clone()),
                    ),
            )
            .map_err(|err| format!("the mail could not be built: {err}"))?;
        self.transport
            .send(message)
            .await
            .map(drop)
            .map_err(|err| format!("SMTP: {err}"))
    }
}

type Builder = lettre::transport::smtp::AsyncSmtpTransportBuilder;

#[cfg(feature = "openai")]
fn plain_or_starttls(host: &str) -> Result<Builder, String> {
    use lettre::transport::smtp::client::{Tls, TlsParameters};
    let tls = TlsParameters::new(host.to_owned()).map_err(|err| format!("--smtp: {err}"))?;
    Ok(AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(host).tls(Tls::Opportunistic(tls)))
}

#[cfg(not(feature = "openai"))]
fn plain_or_starttls(host: &str) -> Result<Builder, String> {
    Ok(AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(
        host,
    ))
}

#[cfg(feature = "openai")]
fn implicit_tls(host: &str) -> Result<Builder, String> {
    AsyncSmtpTransport::<Tokio1Executor>::relay(host).map_err(|err| format!("--smtp: {err}"))
}

#[cfg(not(feature = "openai"))]
fn implicit_tls(_host: &str) -> Result<Builder, String> {
    Err(
        "--smtp: smtps:// needs TLS, which this chatgate was built without (the openai feature)"
            .to_owned(),
    )
}

/// `%XX` escapes of a URL's user or password decoded.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(byte) = u8::from_str_radix(&text[i + 1..i + 3], 16) {
                out.push(byte);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    use serde_json::json;

    fn plan(risk: &str, tasks: Value) -> PauseData {
        serde_json::from_value(json!({"confirmation_id": "c-1", "confirmation_round": 1,
            "options": ["confirm", "cancel"], "timeout_seconds": 60,
            "expires_at": "2026-11-27T18:00:00Z", "risk_level": risk, "tasks": tasks}))
        .unwrap()
    }

    #[test]
    fn a_reconcile_letter_names_the_task_and_who_decides_it() {
        let data: PauseData = serde_json::from_value(json!({"kind": "reconcile",
            "confirmation_id": "c-2", "title": "Did task 1 (mark) take effect?",
            "message": "The server stopped while task 1 (mark) was running",
            "task": {"index": 1, "tool": "mark", "description": "mark it", "args": {},
                     "risk_level": "high"},
            "idempotency_key": "k", "started_at": "2026-11-27T17:00:00Z", "attempt": 1,
            "options": ["run_again", "skip", "cancel"], "risk_level": "high",
            "required": 2, "approvers": ["leads"],
            "timeout_seconds": 60, "expires_at": "2026-11-27T18:00:00Z"}))
        .unwrap();
        let to = MailTo {
            address: "lead@example.com".into(),
            label: "lead-1".into(),
            url: "https://gate.example/d/t".into(),
        };
        let letter = letter(
            "ev-3",
            Some(&data),
            "ci-bot",
            "s1",
            "Did task 1 (mark) take effect?",
            &MailWhy::Asked,
            &to,
        );
        assert!(
            letter.text.contains("1. mark (high risk): mark it"),
            "{}",
            letter.text
        );
        assert!(
            letter.text.contains("Needs 2 approvals of leads"),
            "{}",
            letter.text
        );
        assert!(
            letter.text.contains("https://gate.example/d/t"),
            "{}",
            letter.text
        );
    }

    #[test]
    fn a_letter_has_the_tasks_the_link_and_an_id_from_the_event() {
        let data = plan(
            "high",
            json!([{"index": 1, "tool": "deploy", "risk_level": "high",
                    "description": "deploy <web>", "args": {"step": "deploy web"}}]),
        );
        let to = MailTo {
            address: "lead@example.com".into(),
            label: "lead-1".into(),
            url: "https://gate.example/d/t".into(),
        };
        let letter = letter(
            "ev-1",
            Some(&data),
            "ci-bot",
            "s1",
            "Confirm?",
            &MailWhy::Asked,
            &to,
        );
        assert_eq!(letter.message_id, "<ev-1.lead-1@chatgate>");
        assert_eq!(
            letter.subject,
            "[chatgate] Approval needed: deploy in session s1: Confirm?"
        );
        let sneaky = super::letter(
            "ev-2",
            Some(&data),
            "ci-bot",
            "s1",
            "a\r\nBcc: x@y",
            &MailWhy::Asked,
            &to,
        );
        assert_eq!(
            sneaky.subject,
            "[chatgate] Approval needed: deploy in session s1: aBcc: x@y"
        );
        assert!(
            letter
                .text
                .contains("Needs one approval. If nobody answers by"),
            "{}",
            letter.text
        );
        assert!(
            letter.text.contains("1. deploy (high risk): deploy <web>"),
            "{}",
            letter.text
        );
        assert!(letter
            .text
            .contains("Decide as lead-1: https://gate.example/d/t"));
        assert!(letter.html.contains("deploy &lt;web&gt;"));
        assert!(letter
            .html
            .contains("<a href=\"https://gate.example/d/t\">"));
    }

    #[test]
    fn a_letter_shows_a_preview_cut_at_2_kib_with_a_link_to_all_of_it() {
        let body = "line\n".repeat(1000);
        let data = plan(
            "low",
            json!([{"index": 1, "tool": "put", "risk_level": "low", "description": "put x",
                    "args": {}, "preview": {"ok": true, "body": body, "truncated": false, "digest": "d"}}]),
        );
        let to = MailTo {
            address: "lead@example.com".into(),
            label: "lead-1".into(),
            url: "https://gate.example/d/t".into(),
        };
        let letter = letter(
            "ev",
            Some(&data),
            "k",
            "s",
            "Confirm?",
            &MailWhy::Asked,
            &to,
        );
        assert!(
            letter.text.contains("   Preview:\n   | line\n"),
            "{}",
            letter.text
        );
        assert_eq!(
            letter.text.matches("   | line").count(),
            MAIL_PREVIEW_BYTES / 5
        );
        assert!(letter
            .text
            .contains("see the full preview: https://gate.example/d/t"));
        assert!(letter
            .html
            .contains("<a href=\"https://gate.example/d/t\">see the full preview</a>"));
    }

    #[test]
    fn smtp_urls_are_checked() {
        let open = |url: &str| Mailer::open(url, None, "gate@example.com").map(drop);
        assert!(open("smtp://127.0.0.1:2525").is_ok());
        assert!(open("smtp://user:p%40ss@127.0.0.1:2525").is_ok());
        assert!(open("smtp://user@127.0.0.1")
            .unwrap_err()
            .contains("password"));
        assert!(open("http://127.0.0.1").unwrap_err().contains("smtps://"));
        assert_eq!(percent_decode("p%40ss%"), "p@ss%");
        let bad_from = Mailer::open("smtp://127.0.0.1", None, "not an address");
        assert!(bad_from.unwrap_err().contains("--mail-from"));
    }
}
