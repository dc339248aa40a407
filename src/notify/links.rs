//! Decision links (`--public-url` with `--link-secret`): one per pause and
//! per person who may decide it, `URL/d/<token>`. The token carries the
//! pause's id, the label it decides as (empty: whoever presents it must be
//! named otherwise, a Slack user), the pause's expiry, and an HMAC-SHA256
//! over them with the secret: a token cannot be forged or altered, dies
//! with its pause's expiry, and changing the secret voids every token.
//!
//! Format: `<confirmation id>.<label>.<expiry ms>.<32 hex digits>` (the
//! MAC's first 128 bits), every part URL-safe.

use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use sha2::Sha256;

use crate::decider::{may_decide, Decider, Deciding};
use crate::protocol::{Action, RiskLevel};

/// Shortest `--link-secret`, in characters.
pub const MIN_SECRET_CHARS: usize = 32;
/// Longest token accepted (a UUID, a label of 64, an expiry, the MAC).
pub const MAX_TOKEN_CHARS: usize = 160;
/// Hex digits of the MAC a token carries.
const MAC_HEX: usize = 32;

/// What a token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub confirmation_id: String,
    /// The label it decides as; empty: none (the presenter is named
    /// otherwise).
    pub label: String,
    pub expires_at_ms: u64,
}

/// A person who may decide through a link: an approver key's attributes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Person {
    pub label: String,
    pub groups: Vec<String>,
    pub max_risk: Option<RiskLevel>,
    /// The requester labels whose pauses it may decide (`None`: all).
    pub namespaces: Option<Vec<String>>,
    /// Its mail address (`email=`), if any.
    pub email: Option<String>,
}

impl Person {
    /// The approver key it is, as the one rule sees it.
    pub fn decider(&self) -> Decider {
        Decider::approver(&self.label, &self.groups, self.max_risk)
    }
}

/// One link, as a webhook body lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Link {
    pub label: String,
    pub url: String,
}

/// Makes and checks decision links.
pub struct Links {
    public_url: String,
    secret: SecretString,
    people: Vec<Person>,
}

impl std::fmt::Debug for Links {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Links")
            .field("public_url", &self.public_url)
            .field("people", &self.people.len())
            .finish_non_exhaustive()
    }
}

impl Links {
    /// Links under `public_url` (no trailing `/`), signed with `secret`
    /// (at least [`MIN_SECRET_CHARS`]), for `people` (the approvers).
    pub fn new(
        public_url: &str,
        secret: SecretString,
        people: Vec<Person>,
    ) -> Result<Links, String> {
        if secret.expose_secret().chars().count() < MIN_SECRET_CHARS {
            return Err(format!(
                "--link-secret must be at least {MIN_SECRET_CHARS} characters"
            ));
        }
        Ok(Links {
            public_url: public_url.trim_end_matches('/').to_owned(),
            secret,
            people,
        })
    }

    fn mac(&self, confirmation_id: &str, label: &str, expires_at_ms: u64) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(self.secret.expose_secret().as_bytes())
            .expect("HMAC takes any key length");
        mac.update(
            format!("chatgate-link-v1:{confirmation_id}.{label}.{expires_at_ms}").as_bytes(),
        );
        mac
    }

    /// The token of `token`.
    pub fn token(&self, token: &Token) -> String {
        let mac = self
            .mac(&token.confirmation_id, &token.label, token.expires_at_ms)
            .finalize()
            .into_bytes();
        let mac = hex::encode(mac);
        format!(
            "{}.{}.{}.{}",
            token.confirmation_id,
            token.label,
            token.expires_at_ms,
            &mac[..MAC_HEX]
        )
    }

    /// The link of `token`.
    pub fn url(&self, token: &Token) -> String {
        format!("{}/d/{}", self.public_url, self.token(token))
    }

    /// What `text` says, if this secret signed it and it has not expired
    /// at `now_ms` (the MAC compared in constant time).
    pub fn verify(&self, text: &str, now_ms: u64) -> Option<Token> {
        if text.len() > MAX_TOKEN_CHARS {
            return None;
        }
        let mut parts = text.split('.');
        let (Some(id), Some(label), Some(expiry), Some(mac), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return None;
        };
        let expires_at_ms: u64 = expiry.parse().ok()?;
        let mac = hex::decode(mac).ok().filter(|m| m.len() * 2 == MAC_HEX)?;
        self.mac(id, label, expires_at_ms)
            .verify_truncated_left(&mac)
            .ok()?;
        (expires_at_ms > now_ms).then(|| Token {
            confirmation_id: id.to_owned(),
            label: label.to_owned(),
            expires_at_ms,
        })
    }

    /// The approvers who may decide a pause of the requester labelled
    /// `namespace` whose riskiest task is `risk` and that the members of
    /// `groups` alone decide (each of them), or (escalated) `escalated_to`'s.
    pub fn eligible<'a>(
        &'a self,
        namespace: &'a str,
        risk: RiskLevel,
        groups: &'a [String],
        escalated_to: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Person> + 'a {
        self.people.iter().filter(move |person| {
            let sees = person
                .namespaces
                .as_ref()
                .is_none_or(|names| names.iter().any(|n| n == namespace));
            // Who may decide it: the one rule, as the decide path asks it.
            let decider = person.decider();
            let deciding = Deciding {
                risk,
                riskiest: None,
                groups,
                // Approvers only: whether the requester counts is moot.
                requester_may_approve: true,
                escalated_to,
            };
            sees && may_decide(&decider, &deciding, Action::Confirm).is_ok()
        })
    }

    /// The links of the pause `confirmation_id` expiring at `expires_at_ms`:
    /// the requester's (`requester`, its label: it may always cancel), then
    /// each of `people`'s.
    pub fn of_pause<'a>(
        &self,
        confirmation_id: &str,
        expires_at_ms: u64,
        requester: Option<&str>,
        people: impl Iterator<Item = &'a Person>,
    ) -> Vec<Link> {
        let labels = requester
            .into_iter()
            .map(str::to_owned)
            .chain(people.map(|p| p.label.clone()));
        labels
            .map(|label| Link {
                url: self.url(&Token {
                    confirmation_id: confirmation_id.to_owned(),
                    label: label.clone(),
                    expires_at_ms,
                }),
                label,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links(secret: &str) -> Links {
        Links::new(
            "https://gate.example/",
            SecretString::from(secret.to_owned()),
            vec![],
        )
        .unwrap()
    }

    const SECRET: &str = "a-link-secret-of-at-least-32-characters";

    fn token() -> Token {
        Token {
            confirmation_id: "5d0c0000-0000-4000-8000-000000000001".into(),
            label: "lead-1".into(),
            expires_at_ms: 2_000,
        }
    }

    #[test]
    fn a_token_verifies_until_its_expiry_and_only_with_its_secret() {
        let links = links(SECRET);
        let text = links.token(&token());
        assert_eq!(links.verify(&text, 1_999), Some(token()));
        assert_eq!(links.verify(&text, 2_000), None, "expired");
        let other = self::links("another-secret-of-at-least-32-characters!");
        assert_eq!(other.verify(&text, 1_000), None, "another secret");
        assert!(links
            .url(&token())
            .starts_with("https://gate.example/d/5d0c"));
    }

    #[test]
    fn an_altered_token_is_refused() {
        let links = links(SECRET);
        let text = links.token(&token());
        for altered in [
            text.replace("lead-1", "lead-2"),
            text.replace(".2000.", ".9999999999999."),
            text.replace("5d0c", "5d0d"),
            format!("{text}0"),
            text[..text.len() - 1].to_owned(),
            format!("{text}.x"),
            "x".repeat(200),
            String::new(),
        ] {
            assert_eq!(links.verify(&altered, 1_000), None, "{altered}");
        }
    }

    #[test]
    fn a_short_secret_is_refused() {
        let err = Links::new("https://g", SecretString::from("short".to_owned()), vec![]);
        assert!(err.unwrap_err().contains("at least 32"));
    }

    #[test]
    fn eligibility_follows_scope_groups_and_risk() {
        let person = |label: &str, groups: &[&str], max_risk, namespaces: Option<&[&str]>| Person {
            label: label.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            max_risk,
            namespaces: namespaces.map(|n| n.iter().map(|s| s.to_string()).collect()),
            email: None,
        };
        let links = Links {
            people: vec![
                person("lead-1", &["leads"], None, None),
                person("junior", &[], Some(RiskLevel::Low), None),
                person("ci-watch", &["leads"], None, Some(&["ci-bot"])),
                person("oncall-1", &["oncall"], None, None),
            ],
            ..links(SECRET)
        };
        let names = |risk, groups: &[String], escalated| -> Vec<String> {
            links
                .eligible("web-app", risk, groups, escalated)
                .map(|p| p.label.clone())
                .collect()
        };
        assert_eq!(
            names(RiskLevel::Low, &[], None),
            ["lead-1", "junior", "oncall-1"]
        );
        assert_eq!(names(RiskLevel::High, &[], None), ["lead-1", "oncall-1"]);
        let leads = ["leads".to_owned()];
        assert_eq!(names(RiskLevel::High, &leads, None), ["lead-1"]);
        assert_eq!(
            names(RiskLevel::High, &leads, Some("oncall")),
            ["lead-1", "oncall-1"]
        );
    }
}
