//! Notifications that a person can act on: signed decision links
//! ([`links`]), approval mail ([`mail`]) and Slack messages with buttons
//! ([`slack`]). A link is just another way to reply: it decides through the
//! same path, scopes, quorum and journal as a reply on the chat endpoint.

pub mod links;
pub mod mail;
pub mod slack;
