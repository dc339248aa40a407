//! A pause's reminder and escalation (its tools' `remind_after`,
//! `escalate_after` with `escalate_to`): each fires once, for its own pause
//! and round, in the process that holds the run, while the pause waits;
//! the pause's end stops them. A reminder is the webhook event
//! `interaction.reminder`; an escalation widens who may decide the pause
//! to the group's members (the inbox shows `escalated_to`), announces
//! `interaction.escalated` and says so on the run's stream.

use std::time::Duration;

use tokio::task::JoinHandle;

use super::RunContext;
use crate::confirmation::decisions::PlanCheck;
use crate::protocol::{ChunkType, PauseKind};
use crate::webhook::{About, Event};

/// What a pause's tools ask of it while it waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Timers {
    remind_after: Option<Duration>,
    escalate: Option<(Duration, String)>,
}

impl RunContext {
    /// The earliest reminder and escalation the tools of `checks` ask for.
    pub(super) fn timers_of(&self, checks: &PlanCheck) -> Option<Box<Timers>> {
        let tools = checks.tasks.iter().filter_map(|task| task.tool.as_ref());
        let remind_after = tools.clone().filter_map(|tool| tool.remind_after).min();
        let escalate = tools
            .filter_map(|tool| tool.escalate.clone())
            .min_by_key(|(after, _)| *after);
        (remind_after.is_some() || escalate.is_some()).then(|| {
            Box::new(Timers {
                remind_after,
                escalate,
            })
        })
    }

    /// Starts `timers` for the pause `confirmation_id`: abort the handle
    /// when the pause ends.
    pub(super) fn start_timers(&self, timers: &Timers, confirmation_id: &str) -> JoinHandle<()> {
        let settings = self.settings.clone();
        let manager = self.slot.manager().clone();
        let key = self.session_key().clone();
        let log = self.log.clone();
        let id = confirmation_id.to_owned();
        let timers = timers.clone();
        let tag = self.tag().to_string();
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let mut due: Vec<(Duration, Option<String>)> = Vec::new();
            if let Some(after) = timers.remind_after {
                due.push((after, None));
            }
            if let Some((after, group)) = timers.escalate {
                due.push((after, Some(group)));
            }
            due.sort_by_key(|(after, _)| *after);
            for (after, escalate_to) in due {
                tokio::time::sleep_until(started + after).await;
                let about = About {
                    key: &key,
                    confirmation_id: &id,
                    kind: PauseKind::Approval,
                };
                let rows = match &escalate_to {
                    None => settings.event_rows(|| Event::reminder(&about, after)),
                    Some(group) => {
                        if !manager.escalate(&key, &id, group) {
                            return;
                        }
                        log::info!("{tag} pause {id} escalated to {group}");
                        let text = format!("Escalated to {group}: nobody decided in time");
                        let chunk = crate::protocol::Chunk::new(
                            ChunkType::Status,
                            text,
                            &key.session_id,
                            0,
                        )
                        .with_meta("escalated_to", group.as_str());
                        log.push(chunk);
                        settings.event_rows(|| Event::escalated(&about, after, group))
                    }
                };
                settings.announce(&rows).await;
            }
        })
    }
}
