//! A pause's decision links (`--link-secret`): the requester's, and one
//! for each approver whose scope takes the pause in (its namespace, its
//! riskiest task, the groups that decide it, or the group it escalated
//! to), carried by the `interaction.requested` and `interaction.escalated`
//! events.

use super::asked::Request;
use super::RunContext;
use crate::notify::links::{Link, Token};
use crate::notify::mail::MailTo;
use crate::pause::Scope;

impl RunContext {
    /// The links of the pause `request` asks.
    pub(super) fn links_of(&self, request: &Request) -> Vec<Link> {
        let scope = request.asking.scope();
        let expires_at_ms = crate::clock::ms(request.expires_at);
        self.pause_links(&request.confirmation_id, expires_at_ms, &scope, None)
    }

    /// What the Slack message of the pause `request` asks carries
    /// (`--slack-webhook`): a decision token naming no one (the button's
    /// presser is named by their Slack user id).
    pub(super) fn slack_of(&self, request: &Request) -> Option<String> {
        let links = self.settings.links.as_ref()?;
        self.settings.webhooks.as_ref()?.slack.as_ref()?;
        let token = links.token(&Token {
            confirmation_id: request.confirmation_id.clone(),
            label: String::new(),
            expires_at_ms: crate::clock::ms(request.expires_at),
        });
        Some(token)
    }

    /// Who gets the mail of the pause `request` asks (`--smtp`): every
    /// approver with an `email=` whose scope takes it in, with their link.
    pub(super) fn mails_of(&self, request: &Request) -> Vec<MailTo> {
        let (Some(links), Some(_)) = (
            &self.settings.links,
            self.settings
                .webhooks
                .as_ref()
                .and_then(|w| w.mailer.as_ref()),
        ) else {
            return Vec::new();
        };
        let scope = request.asking.scope();
        let namespace = self.key_label();
        let expires_at_ms = crate::clock::ms(request.expires_at);
        links
            .eligible(&namespace, scope.risk, &scope.groups, None)
            .filter_map(|person| {
                Some(MailTo {
                    address: person.email.clone()?,
                    label: person.label.clone(),
                    url: links.url(&Token {
                        confirmation_id: request.confirmation_id.clone(),
                        label: person.label.clone(),
                        expires_at_ms,
                    }),
                })
            })
            .collect()
    }

    /// The links of the pause `confirmation_id` (escalated to
    /// `escalated_to`, if it was).
    pub(super) fn pause_links(
        &self,
        confirmation_id: &str,
        expires_at_ms: u64,
        scope: &Scope,
        escalated_to: Option<&str>,
    ) -> Vec<Link> {
        let Some(links) = &self.settings.links else {
            return Vec::new();
        };
        let namespace = self.key_label();
        let people = links.eligible(&namespace, scope.risk, &scope.groups, escalated_to);
        links.of_pause(confirmation_id, expires_at_ms, Some(&namespace), people)
    }
}
