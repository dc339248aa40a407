//! The notification services the flags ask for: webhooks (and Slack's
//! incoming webhook, sent by the same outbox), decision links, and the
//! keys that sign receipts; the webhook sender's start and stop.

use std::sync::Arc;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::http::access::AccessPolicy;
use crate::notify::links::Links;
use crate::notify::mail::Mailer;
use crate::receipt::ReceiptKeys;
use crate::run::Runs;
use crate::webhook::deliver::Sender;
use crate::webhook::Webhooks;

/// How long a stop waits for the webhook sender to write down what it
/// delivered (one write to the store).
const SENDER_STOP: Duration = Duration::from_secs(2);

/// The webhook sender, when there are webhooks: events are sent from the
/// start (a durable store's undelivered ones included) until
/// [`WebhookSender::stop`], or until it is dropped.
pub(super) struct WebhookSender {
    stop: CancellationToken,
    stopped: Option<oneshot::Receiver<()>>,
}

impl WebhookSender {
    pub(super) fn start(runs: &Runs) -> std::io::Result<WebhookSender> {
        let stop = CancellationToken::new();
        let stopped = match &runs.settings().webhooks {
            Some(hooks) => {
                let sender = Sender::new(
                    hooks.clone(),
                    runs.settings().store.clone(),
                    runs.metrics().clone(),
                );
                Some(sender.spawn(stop.clone())?)
            }
            None => None,
        };
        Ok(WebhookSender { stop, stopped })
    }

    /// Stops it, what it delivered written down before the process ends.
    pub(super) async fn stop(mut self) {
        self.stop.cancel();
        if let Some(stopped) = self.stopped.take() {
            if tokio::time::timeout(SENDER_STOP, stopped).await.is_err() {
                log::warn!("shutdown: webhook deliveries since the last write may be sent again");
            }
        }
    }
}

impl Drop for WebhookSender {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// `--webhook` (and `--slack-webhook`) and the flags they need.
pub(super) fn open_webhooks(settings: &Settings) -> Result<Option<Arc<Webhooks>>, String> {
    let slack = settings.notify.slack_webhook.clone();
    if settings.notify.webhooks.is_empty() && slack.is_none() && settings.notify.smtp.is_none() {
        return Ok(None);
    }
    let mailer = open_mailer(settings)?;
    if slack.is_some() && settings.notify.link_secret.is_none() {
        let why = "--slack-webhook needs --link-secret and --public-url (its buttons carry links)";
        return Err(why.to_owned());
    }
    let secret = match settings.notify.webhook_secret.clone() {
        Some(secret) => secret,
        // Slack or mail alone: no receiver checks a signature.
        None if settings.notify.webhooks.is_empty() => {
            SecretString::from(uuid::Uuid::new_v4().simple().to_string())
        }
        None => {
            let why = "--webhook needs --webhook-secret (at least 16 characters)";
            return Err(why.to_owned());
        }
    };
    Webhooks::new(
        settings.notify.webhooks.clone(),
        secret,
        settings.notify.public_url.clone(),
        settings.notify.webhook_retry_for,
        slack,
        mailer,
    )
    .map(Some)
}

/// `--link-secret` (with `--public-url`): decision links for the approvers.
pub(super) fn open_links(
    settings: &Settings,
    access: &AccessPolicy,
) -> Result<Option<Arc<Links>>, String> {
    let Some(secret) = settings.notify.link_secret.clone() else {
        return Ok(None);
    };
    let url = settings
        .notify
        .public_url
        .as_deref()
        .ok_or("--link-secret needs --public-url (where links point)")?;
    let people = access.people();
    let mailed = people.iter().filter(|p| p.email.is_some()).count();
    let slack = access.slack_people();
    log::info!(
        "approvers are sent: decision links ({} approver key(s)){}{}",
        people.len(),
        match (&settings.notify.smtp, mailed) {
            (None, _) => String::new(),
            (Some(_), 0) =>
                ", mail (but no approver key has an email=: nobody is mailed)".to_owned(),
            (Some(_), n) => format!(", mail ({n} address(es))"),
        },
        match &settings.notify.slack_webhook {
            None => String::new(),
            Some(_) => format!(", Slack ({slack} approver(s) with slack=)"),
        }
    );
    if settings.notify.smtp.is_some() && mailed == 0 {
        log::warn!(
            "--smtp is on, but no approver key in the keys file carries email=ADDR: no mail \
             will be sent"
        );
    }
    let links = Links::new(url, secret, people)?;
    Ok(Some(Arc::new(links)))
}

/// `--smtp` with `--mail-from` (and `--link-secret`: a mail carries links).
fn open_mailer(settings: &Settings) -> Result<Option<Arc<Mailer>>, String> {
    let Some(url) = &settings.notify.smtp else {
        return Ok(None);
    };
    let fail = |why: &str| Err(why.to_owned());
    if settings.notify.link_secret.is_none() {
        return fail("--smtp needs --link-secret and --public-url (each mail carries a link)");
    }
    let Some(from) = &settings.notify.mail_from else {
        return fail("--smtp needs --mail-from (the sender's address)");
    };
    Mailer::open(
        url.expose_secret(),
        settings.notify.smtp_password.clone(),
        from,
    )
    .map(|mailer| Some(Arc::new(mailer)))
}

/// The receipt keys of `--receipt-key`, or one made now; its `kid` is
/// logged (never the key).
pub(super) fn open_receipts(settings: &Settings) -> Result<ReceiptKeys, String> {
    let issuer = settings
        .notify
        .public_url
        .clone()
        .unwrap_or_else(|| "chatgate".to_owned());
    let keys = ReceiptKeys::new(&settings.tooling.receipt_keys, issuer)?;
    if settings.tooling.receipt_keys.is_empty() {
        log::info!(
            "receipts are signed with a key made at start (kid {}): they verify only against              this process's /.well-known/jwks.json; share one with --receipt-key",
            keys.kid()
        );
    } else {
        log::info!("receipts are signed with key {}", keys.kid());
    }
    Ok(keys)
}
