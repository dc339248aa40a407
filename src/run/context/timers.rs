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

use super::asked::{Due, Timers};
use super::RunContext;
use crate::pause::plan_check::PlanCheck;
use crate::pause::Scope;
use crate::protocol::{ChunkType, PauseKind};
use crate::run::journal::{Pause, PauseEvent, Subject};
use crate::run::replay::park::Visit;
use crate::session::run_log;
use crate::store::{Escalated, Fault, PauseProgress};
use crate::tools::gate::Escalation;

impl RunContext {
    /// The reminders and escalations the tasks of `checks` ask for (one
    /// per distinct `remind_after`, one per distinct escalation, each for
    /// the tasks that ask for it), counted from `asked_at`, less what
    /// `fired` says happened already.
    pub(super) fn timers_of(
        &self,
        checks: &PlanCheck,
        asked_at: SystemTime,
        fired: Option<&PauseProgress>,
    ) -> Option<Box<Timers>> {
        let reminded: Vec<usize> = fired.map(|f| f.reminded_tasks.clone()).unwrap_or_default();
        // An older record says only that the first reminder went.
        let first_went = fired.is_some_and(|f| f.reminded && f.reminded_tasks.is_empty());
        let escalations: Vec<Escalated> = match fired {
            Some(f) if f.escalations.is_empty() => f
                .escalated_to
                .iter()
                .map(|group| Escalated {
                    group: group.clone(),
                    tasks: Vec::new(),
                })
                .collect(),
            Some(f) => f.escalations.clone(),
            None => Vec::new(),
        };
        let tasks_where = |asks: &dyn Fn(&crate::tools::gate::Gate) -> bool| -> Vec<usize> {
            checks
                .tasks
                .iter()
                .filter(|task| asks(&task.gate))
                .map(|task| task.index)
                .collect()
        };
        let mut dues = Vec::new();
        let mut afters: Vec<Duration> = checks
            .tasks
            .iter()
            .filter_map(|task| task.gate.remind_after)
            .collect();
        afters.sort();
        afters.dedup();
        for (n, after) in afters.into_iter().enumerate() {
            let tasks = tasks_where(&|gate| gate.remind_after == Some(after));
            if (n == 0 && first_went) || tasks.iter().all(|t| reminded.contains(t)) {
                continue;
            }
            dues.push(Due {
                after,
                escalation: None,
                tasks,
            });
        }
        let mut asked: Vec<Escalation> = Vec::new();
        for escalation in checks.tasks.iter().filter_map(|t| t.gate.escalate.clone()) {
            if !asked.contains(&escalation) {
                asked.push(escalation);
            }
        }
        for escalation in asked {
            let tasks = tasks_where(&|gate| gate.escalate.as_ref() == Some(&escalation));
            let went = escalations.iter().any(|e| {
                e.group == escalation.to
                    && (e.tasks.is_empty() || tasks.iter().all(|t| e.tasks.contains(t)))
            });
            if went {
                continue;
            }
            dues.push(Due {
                after: escalation.after,
                escalation: Some(escalation),
                tasks,
            });
        }
        dues.sort_by_key(|due| due.after);
        (!dues.is_empty()).then(|| {
            Box::new(Timers {
                dues,
                reminded,
                escalations,
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
        let log = self.replay.clone();
        let stored = self.stored_id.clone();
        let id = confirmation_id.to_owned();
        let timers = timers.clone();
        let tag = self.tag().pause(confirmation_id);
        let namespace = self.key_label();
        let run_id = self.run_id();
        tokio::spawn(async move {
            let mut reminded = timers.reminded.clone();
            let mut escalations = timers.escalations.clone();
            let dues = &timers.dues;
            for (n, due) in dues.iter().enumerate() {
                let (after, escalation) = (due.after, due.escalation.clone());
                // When the timer after this one is due (the index of due
                // timers a store replicas share moves to it).
                let next_timer_ms = dues
                    .get(n + 1)
                    .map(|next| crate::clock::ms(timers.asked_at + next.after));
                let at = timers.asked_at + after;
                if let Ok(left) = at.duration_since(SystemTime::now()) {
                    tokio::time::sleep(left).await;
                }
                // A pause being parked fires nothing here: the store's
                // schedule wakes it for this timer. One that is not waits
                // to park until this step is done (#46).
                if log.visit() == Visit::Parking {
                    return;
                }
                // Only for its own tasks, while one of them is pending
                // (#42); it names those.
                let tasks = manager.pending_among(&key, &id, &due.tasks);
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
                        let reminded_event = PauseEvent::Reminded {
                            pause,
                            waited: after,
                            tasks: &tasks,
                            mail_to,
                            request,
                        };
                        let events = journal.pause(run, reminded_event).events;
                        reminded.extend(&tasks);
                        (PauseProgress::reminded(&id, &reminded), events)
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
                        escalations.push(Escalated {
                            group: group.to_owned(),
                            tasks: tasks.clone(),
                        });
                        let step = PauseProgress::escalated(
                            &id,
                            group,
                            &escalations,
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
