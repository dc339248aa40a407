//! A pause's reminder and escalation (its tasks' `remind_after`,
//! `escalate_after` with `escalate_to`): each fires once, for its own pause
//! and round, in the process that holds the run, while the pause waits;
//! the pause's end stops them. Both count from the moment the pause was
//! asked (wall clock), so that a pause restored by the next process or
//! taken over by another replica fires what came due meanwhile, at once,
//! and nothing twice: each step is kept with the pause's record (see
//! [`PauseProgress`]) before it is announced, and a restored pause skips
//! what its record says fired. A reminder is the webhook event
//! `interaction.reminder`; an escalation widens who may decide the pause
//! to the group's members (the inbox and the re-sent request show
//! `escalated_to`), moves its expiry by `escalate_extends` if given,
//! announces `interaction.escalated` and says so on the run's stream.

use std::time::{Duration, SystemTime};

use tokio::task::JoinHandle;

use super::asked::Timers;
use super::RunContext;
use crate::pause::approval::PlanCheck;
use crate::pause::Scope;
use crate::protocol::{ChunkType, PauseKind};
use crate::run::journal::{Pause, PauseEvent, Subject};
use crate::session::run_log;
use crate::store::{Fault, PauseProgress};
use crate::tools::gate::Escalation;

impl RunContext {
    /// The earliest reminder and escalation the tasks of `checks` ask for,
    /// counted from `asked_at`, less what `fired` says happened already.
    pub(super) fn timers_of(
        &self,
        checks: &PlanCheck,
        asked_at: SystemTime,
        fired: Option<&PauseProgress>,
    ) -> Option<Box<Timers>> {
        let gates = checks.tasks.iter().map(|task| &task.gate);
        let reminded = fired.is_some_and(|f| f.reminded);
        let escalated = fired.is_some_and(|f| f.escalated_to.is_some());
        let remind_after = gates
            .clone()
            .filter_map(|gate| gate.remind_after)
            .min()
            .filter(|_| !reminded);
        let escalate = gates
            .filter_map(|gate| gate.escalate.clone())
            .min_by_key(|escalation| escalation.after)
            .filter(|_| !escalated);
        let remind_tasks = checks
            .tasks
            .iter()
            .filter(|task| remind_after.is_some() && task.gate.remind_after == remind_after)
            .map(|task| task.index)
            .collect();
        let escalate_tasks = checks
            .tasks
            .iter()
            .filter(|task| escalate.is_some() && task.gate.escalate == escalate)
            .map(|task| task.index)
            .collect();
        (remind_after.is_some() || escalate.is_some()).then(|| {
            Box::new(Timers {
                remind_after,
                escalate,
                remind_tasks,
                escalate_tasks,
                asked_at,
                scope: Scope::of(checks),
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
        let stored = self.stored_id.clone();
        let id = confirmation_id.to_owned();
        let timers = timers.clone();
        let tag = self.tag().pause(confirmation_id);
        let namespace = self.key_label();
        let run_id = self.run_id();
        tokio::spawn(async move {
            let mut due: Vec<(Duration, Option<Escalation>)> = Vec::new();
            if let Some(after) = timers.remind_after {
                due.push((after, None));
            }
            if let Some(escalation) = timers.escalate {
                due.push((escalation.after, Some(escalation)));
            }
            due.sort_by_key(|(after, _)| *after);
            let dues: Vec<Duration> = due.iter().map(|(after, _)| *after).collect();
            for (n, (after, escalation)) in due.into_iter().enumerate() {
                // When the timer after this one is due (the index of due
                // timers a store replicas share moves to it).
                let next_timer_ms = dues
                    .get(n + 1)
                    .map(|next| crate::clock::ms(timers.asked_at + *next));
                let at = timers.asked_at + after;
                if let Ok(left) = at.duration_since(SystemTime::now()) {
                    tokio::time::sleep(left).await;
                }
                // Only for its own tasks, while one of them is pending
                // (#42); it names those.
                let own = match &escalation {
                    Some(_) => &timers.escalate_tasks,
                    None => &timers.remind_tasks,
                };
                let tasks = manager.pending_among(&key, &id, own);
                if tasks.is_empty() {
                    continue;
                }
                let run = Subject {
                    key: &key,
                    run_id,
                    stored: stored.as_deref(),
                };
                let pause = Pause {
                    confirmation_id: &id,
                    kind: PauseKind::Approval,
                };
                let journal = settings.journal();
                // The pause's request as the run's log keeps it (its data
                // and summary): what a mail says waits.
                let request_of = || {
                    let frame = log.last_frame(&id)?;
                    let json = crate::sse::data_of(&frame)?;
                    let chunk: crate::protocol::Chunk = serde_json::from_slice(json).ok()?;
                    let data = serde_json::to_value(chunk.confirmation_data?).ok()?;
                    Some((data, chunk.chunk))
                };
                // Who is mailed (`--smtp`): the approvers who may decide it
                // (of `group` alone, for an escalation), each with a link.
                let mailed = |group: Option<&str>, expires_at_ms: u64| {
                    let (Some(links), Some(hooks)) = (&settings.links, &settings.webhooks) else {
                        return Vec::new();
                    };
                    if hooks.mailer.is_none() {
                        return Vec::new();
                    }
                    let scope = &timers.scope;
                    links
                        .eligible(&namespace, scope.risk, &scope.groups, group)
                        .filter(|p| group.is_none_or(|g| p.decider().is_member(g)))
                        .filter_map(|p| {
                            Some(crate::notify::mail::MailTo {
                                address: p.email.clone()?,
                                label: p.label.clone(),
                                url: links.url(&crate::notify::links::Token {
                                    confirmation_id: id.clone(),
                                    label: p.label.clone(),
                                    expires_at_ms,
                                }),
                            })
                        })
                        .collect::<Vec<_>>()
                };
                let (step, rows) = match &escalation {
                    None => {
                        // A reminder mails the approvers too, not only a webhook.
                        let request = request_of();
                        let expires_at_ms = request
                            .as_ref()
                            .and_then(|(data, _)| {
                                data.get("expires_at")?.as_str().map(str::to_owned)
                            })
                            .and_then(|at| humantime::parse_rfc3339(&at).ok())
                            .map_or(0, crate::clock::ms);
                        let mail_to = mailed(None, expires_at_ms);
                        let reminded = PauseEvent::Reminded {
                            pause,
                            waited: after,
                            tasks: &tasks,
                            mail_to,
                            request,
                        };
                        (
                            PauseProgress::reminded(&id),
                            journal.pause(run, reminded).events,
                        )
                    }
                    Some(escalation) => {
                        let group = escalation.to.as_str();
                        let Some(expires_at) =
                            manager.escalate(&key, &id, group, escalation.extends, &tasks)
                        else {
                            return;
                        };
                        run_log!(Info, tag, "escalated to {group}");
                        let field = format!("\"escalated_to\":{}", serde_json::json!(group));
                        log.amend_request(&id, field.as_bytes());
                        let mut text = format!("Escalated to {group}: nobody decided in time");
                        if escalation.extends.is_some() {
                            let until = crate::clock::rfc3339(expires_at);
                            text.push_str(&format!(" (it now expires at {until})"));
                        }
                        let chunk = crate::protocol::Chunk::new(
                            ChunkType::Status,
                            text,
                            &key.session_id,
                            0,
                        )
                        .with_meta("escalated_to", group)
                        .with_meta("tasks", tasks.clone())
                        .with_meta("expires_at", crate::clock::rfc3339(expires_at));
                        log.push(chunk);
                        let step = PauseProgress::escalated(
                            &id,
                            group,
                            &tasks,
                            crate::clock::ms(expires_at),
                        );
                        let links = settings.links.as_ref().map(|links| {
                            let scope = &timers.scope;
                            let people =
                                links.eligible(&namespace, scope.risk, &scope.groups, Some(group));
                            links.of_pause(&id, step.expires_at_ms.unwrap_or(0), None, people)
                        });
                        // The escalation group's members with an address: a
                        // mail each, saying what waits as the first one did.
                        let expires_at_ms = step.expires_at_ms.unwrap_or(0);
                        let mail_to = mailed(Some(group), expires_at_ms);
                        let request = (!mail_to.is_empty()).then(request_of).flatten();
                        let escalated = PauseEvent::Escalated {
                            pause,
                            waited: after,
                            group,
                            tasks: &tasks,
                            links: links.unwrap_or_default(),
                            mail_to,
                            request,
                        };
                        let rows = journal.pause(run, escalated).events;
                        (step, rows)
                    }
                };
                let mut step = step;
                step.next_timer_ms = next_timer_ms;
                // Kept first: a restart or takeover must not fire it again.
                if let Some(run) = stored.as_deref() {
                    if let Err(err) = settings.store.record_progress(run, &key, &step).await {
                        run_log!(Warn, tag, "its timer's step was not kept: {err}");
                        if matches!(err.fault, Fault::Moved | Fault::Lost) {
                            // The pause is another's now (or gone): not ours to announce.
                            return;
                        }
                    }
                }
                settings.announce(&rows).await;
            }
        })
    }
}
