//! The journal: what is written of each event of a pause's life (and of a
//! grant's, and of a tool call's). An event is turned here, and only here,
//! into its audit record, its webhook outbox rows (typed bodies:
//! `webhook/body.rs`) and, for an event that decides a pause, the decision
//! the store keeps. Nothing else under `run/` builds an audit record or a
//! webhook event.
//!
//! What is written *when* stays with the step that owns the guarantee,
//! since each orders it differently: a decision's store write (its outbox
//! rows in the same transaction) before its audit record before the run
//! acts on it (`decide.rs`); a plan's audit record before it is asked, its
//! `interaction.requested` with the paused record (`context/pause.rs`); an
//! end's rows with the ended record, its audit record last (`end.rs`).
//! [`Journal::audit`] writes a record where the server has an audit log.
//!
//! Longer than 600 lines because every event's records are built here and
//! nowhere else (a layout test holds it): splitting it would split that.

use std::time::Duration;

use serde_json::Value;

use super::settings::RunSettings;
use crate::audit::{AuditError, AuditRecord, PolicyFirst, RunFields};
use crate::notify::links::Link;
use crate::notify::mail::MailTo;
use crate::protocol::question::Question;
use crate::protocol::{
    Action, ApprovedBy, CancelReason, ChunkType, Decisions, Given, PauseKind, RiskLevel, TaskSpec,
};
use crate::session::SessionKey;
use crate::store::{Grant, OutboxEvent, StoredDecision};
use crate::tools::RuleDecision;
use crate::webhook::{About, DecisionData, Event, EventType};

/// The run an event is about.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    pub key: &'a SessionKey,
    /// The run's number in this process.
    pub run_id: u64,
    /// The run's id in a durable store, once it has one.
    pub stored: Option<&'a str>,
}

impl Subject<'_> {
    fn fields(&self) -> RunFields {
        RunFields::new(self.run_id, &self.key.session_id, self.stored)
    }
}

/// The pause an event is about.
#[derive(Debug, Clone, Copy)]
pub struct Pause<'a> {
    pub confirmation_id: &'a str,
    pub kind: PauseKind,
}

/// An event of a pause's life.
#[derive(Debug)]
pub enum PauseEvent<'a> {
    /// A plan about to be put to the user: audited before it is asked.
    Proposed {
        confirmation_id: &'a str,
        round: u32,
        risk_level: RiskLevel,
        tasks: &'a [TaskSpec],
    },
    /// Questions about to be put to the user: audited before they are asked.
    Asked {
        confirmation_id: &'a str,
        title: &'a str,
        questions: &'a [Question],
    },
    /// A call a crash cut short about to be put to a person (#44):
    /// audited before it is asked.
    Reconciling {
        confirmation_id: &'a str,
        task: &'a TaskSpec,
        idempotency_key: &'a str,
        started_at: &'a str,
        attempt: u32,
    },
    /// A pause registered, its request about to be sent:
    /// `interaction.requested` with its `confirmation_data`, its decision
    /// links, a Slack message's token and the mails it sends.
    Requested {
        pause: Pause<'a>,
        data: Value,
        summary: &'a str,
        links: Vec<Link>,
        slack: Option<String>,
        mail_to: Vec<MailTo>,
    },
    /// A reply won: `decided` (or `answered`), `interaction.decided`, and
    /// the decision the store keeps.
    Decided {
        pause: Pause<'a>,
        round: u32,
        decision: DecisionData<'a>,
    },
    /// A new message of the same key superseded the pause.
    Superseded { pause: Pause<'a> },
    /// One approval of several the pause needs (a quorum).
    Approved {
        pause: Pause<'a>,
        round: u32,
        by: &'a str,
        client: Option<&'a str>,
        approvals: &'a [String],
        required: usize,
        /// The door it came through.
        via: crate::protocol::Via,
    },
    /// Nobody answered for `waited` (`remind_after`).
    /// (who is mailed, `mail_to`, and what waits, `request`).
    Reminded {
        pause: Pause<'a>,
        waited: Duration,
        /// The tasks it is for (still pending).
        tasks: &'a [usize],
        mail_to: Vec<MailTo>,
        request: Option<(Value, String)>,
    },
    /// Nobody answered for `waited`: escalated to `group`, whose members
    /// get `links` and `mail_to`.
    Escalated {
        pause: Pause<'a>,
        waited: Duration,
        group: &'a str,
        /// The tasks it is for (still pending): the group may decide those.
        tasks: &'a [usize],
        links: Vec<Link>,
        mail_to: Vec<MailTo>,
        /// The pause's request as it was sent (its `confirmation_data` and
        /// summary), for the mail: what waits, as the first mail said.
        request: Option<(Value, String)>,
    },
    /// The run itself cancelled the pause for `reason` (its timeout of
    /// `timeout`: `interaction.expired`): the decision the store keeps.
    Withdrawn {
        pause: Pause<'a>,
        reason: CancelReason,
        timeout: Duration,
    },
    /// Nobody answered for `timeout` and its tasks say `on_timeout =
    /// "reject"`: `rejected` (every task) is its decision, the store keeps
    /// it, the audit log's `timeout_rejected` says so, and
    /// `interaction.expired` carries it.
    TimedOut {
        pause: Pause<'a>,
        round: u32,
        rejected: &'a Decisions,
        timeout: Duration,
    },
    /// A restore found the pause's timeout passed: `interaction.expired`.
    Expired { pause: Pause<'a>, timeout: Duration },
    /// The run ended with a final chunk of type `outcome` (`why`: a
    /// cancel's reason or an error's type); `run.ended` when it paused
    /// (`last`: its last pause).
    Ended {
        last: Option<Pause<'a>>,
        outcome: ChunkType,
        why: Option<&'a str>,
    },
}

/// An event of a grant's life.
#[derive(Debug)]
pub enum GrantEvent<'a> {
    /// Kept (before any call uses it), given on the pause `confirmation_id`.
    Created {
        run: Subject<'a>,
        grant: &'a Grant,
        confirmation_id: &'a str,
    },
    /// Revoked by `by` (a key's label) from `client`.
    Revoked {
        grant: &'a Grant,
        by: &'a str,
        client: Option<&'a str>,
    },
}

/// A tool call's event (audited only).
#[derive(Debug)]
pub enum CallEvent<'a> {
    /// A call that ran: the arguments it ran with, how it went, the size
    /// and SHA-256 of its output, and what let it run without a person.
    Executed {
        tool: &'a str,
        args: Value,
        outcome: &'a crate::tools::ToolOutcome,
        output: &'a str,
        approved_by: Option<ApprovedBy>,
        /// Its idempotency key, and which attempt it was (#44).
        idempotency_key: Option<&'a str>,
        attempt: u32,
    },
    /// A task of a decided pause continued after a crash (#44).
    Resumed {
        pause: &'a str,
        task: usize,
        tool: &'a str,
        idempotency_key: &'a str,
        how: crate::protocol::ResumedHow,
    },
    /// A rule matched a call (`actual`: what happened to it).
    Policy {
        tool: &'a str,
        args: &'a Value,
        rule: &'a crate::tools::rules::Rule,
        actual: RuleDecision,
        /// The first rule of the file that matched the call, shadow or not:
        /// what the rule set as a whole would decide were every rule
        /// enforced.
        first: &'a crate::tools::rules::Rule,
    },
    /// A call not run: its preview, run again, shows another effect than
    /// the one approved (`recheck`).
    PreconditionChanged {
        tool: &'a str,
        args: &'a Value,
        task: usize,
        changed: &'a crate::tools::outcome::Changed,
    },
}

/// Some tasks of a pause decided on their own (`decide`): what this reply
/// decided (`now`), by whom, and the tasks still pending.
pub struct TasksDecided<'a> {
    pub pause: Pause<'a>,
    pub round: u32,
    pub by: &'a str,
    pub client: Option<&'a str>,
    pub now: &'a crate::protocol::Decisions,
    pub pending: &'a [usize],
    /// The tasks approved towards a quorum they do not have yet.
    pub approving: &'a [crate::store::TaskApprovals],
    /// The door it came through (none: a timeout decided).
    pub via: Option<crate::protocol::Via>,
}

/// What is written of one event: each part empty where the server does
/// not write it (no audit log, no webhooks, a pause no store keeps).
#[derive(Debug, Default)]
#[must_use]
pub struct Entry {
    pub audit: Option<AuditRecord>,
    pub events: Vec<OutboxEvent>,
    pub decision: Option<StoredDecision>,
}

impl Entry {
    fn and(mut self, other: Entry) -> Entry {
        self.audit = self.audit.or(other.audit);
        self.events.extend(other.events);
        self.decision = self.decision.or(other.decision);
        self
    }
}

/// The run settings' journal: see the module's docs.
pub struct Journal<'a> {
    settings: &'a RunSettings,
}

impl RunSettings {
    pub fn journal(&self) -> Journal<'_> {
        Journal { settings: self }
    }
}

impl Journal<'_> {
    /// What is written of `event` of `run`'s pause.
    pub fn pause(&self, run: Subject<'_>, event: PauseEvent<'_>) -> Entry {
        let about = |pause| about(run, pause);
        match event {
            PauseEvent::Proposed {
                confirmation_id,
                round,
                risk_level,
                tasks,
            } => self.audited(|| AuditRecord::Proposed {
                run: run.fields(),
                key: self.settings.namespaces.label(run.key.owner),
                confirmation_id: confirmation_id.to_owned(),
                round,
                risk_level,
                tasks: tasks.to_vec(),
            }),
            PauseEvent::Asked {
                confirmation_id,
                title,
                questions,
            } => self.audited(|| AuditRecord::Asked {
                run: run.fields(),
                key: self.settings.namespaces.label(run.key.owner),
                confirmation_id: confirmation_id.to_owned(),
                title: title.to_owned(),
                questions: questions.to_vec(),
            }),
            PauseEvent::Reconciling {
                confirmation_id,
                task,
                idempotency_key,
                started_at,
                attempt,
            } => self.audited(|| AuditRecord::ReconcileAsked {
                run: run.fields(),
                key: self.settings.namespaces.label(run.key.owner),
                confirmation_id: confirmation_id.to_owned(),
                task: Box::new(task.clone()),
                idempotency_key: idempotency_key.to_owned(),
                started_at: started_at.to_owned(),
                attempt,
            }),
            PauseEvent::Requested {
                pause,
                data,
                summary,
                links,
                slack,
                mail_to,
            } => self.announced(|| {
                let mut event = Event::requested(&about(pause), data).with_links(links);
                event.slack = slack;
                event.mail_to = mail_to;
                event.summary = Some(summary.to_owned());
                event
            }),
            PauseEvent::Decided {
                pause,
                round,
                decision,
            } => self.decided(run, pause, round, &decision),
            PauseEvent::Superseded { pause } => {
                let decider = crate::session::owner_label(run.key.owner);
                let decision = DecisionData::superseded(&decider);
                Entry {
                    events: self.rows(|| Event::decided(&about(pause), &decision)),
                    decision: Some(cancelled(pause, CancelReason::Superseded)),
                    audit: None,
                }
            }
            PauseEvent::Approved {
                pause,
                round,
                by,
                client,
                approvals,
                required,
                via,
            } => Entry {
                audit: self.record(|| AuditRecord::Approved {
                    run: run.fields(),
                    confirmation_id: pause.confirmation_id.to_owned(),
                    round,
                    key: by.to_owned(),
                    client: client.map(str::to_owned),
                    approvals: approvals.to_vec(),
                    required,
                    task: None,
                }),
                events: self
                    .rows(|| Event::progress(&about(pause), approvals, required, (by, via))),
                decision: None,
            },
            PauseEvent::Reminded {
                pause,
                waited,
                tasks,
                mail_to,
                request,
            } => self.announced(|| {
                let mut event = Event::reminder(&about(pause), waited, tasks);
                event.mail_to = mail_to;
                if let Some((data, summary)) = request {
                    event.mail_data = Some(data);
                    event.summary = Some(summary);
                }
                event
            }),
            PauseEvent::Escalated {
                pause,
                waited,
                group,
                tasks,
                links,
                mail_to,
                request,
            } => self.announced(|| {
                let mut event =
                    Event::escalated(&about(pause), waited, group, tasks).with_links(links);
                event.mail_to = mail_to;
                if let Some((data, summary)) = request {
                    event.mail_data = Some(data);
                    event.summary = Some(summary);
                }
                event
            }),
            PauseEvent::Withdrawn {
                pause,
                reason,
                timeout,
            } => Entry {
                events: match reason {
                    CancelReason::Timeout => self.rows(|| Event::expired(&about(pause), timeout)),
                    _ => Vec::new(),
                },
                decision: Some(cancelled(pause, reason)),
                audit: None,
            },
            PauseEvent::TimedOut {
                pause,
                round,
                rejected,
                timeout,
            } => Entry {
                audit: self.record(|| AuditRecord::TimeoutRejected {
                    run: run.fields(),
                    confirmation_id: pause.confirmation_id.to_owned(),
                    round,
                    decisions: rejected.clone(),
                    timeout_seconds: timeout.as_secs(),
                }),
                events: self.rows(|| Event::expired_rejecting(&about(pause), timeout, rejected)),
                decision: Some(StoredDecision::new(
                    Action::TimeoutReject,
                    pause.confirmation_id,
                    Some(Given::Decisions(rejected.clone())),
                    Some(CancelReason::Timeout),
                )),
            },
            PauseEvent::Expired { pause, timeout } => {
                self.announced(|| Event::expired(&about(pause), timeout))
            }
            PauseEvent::Ended { last, outcome, why } => {
                let events = match last {
                    Some(pause) => self.rows(|| Event::ended(&about(pause), outcome, why)),
                    None => Vec::new(),
                };
                let audited = self.audited(|| AuditRecord::Ended {
                    run: run.fields(),
                    outcome,
                    reason: why.map(str::to_owned),
                });
                audited.and(Entry {
                    events,
                    ..Entry::default()
                })
            }
        }
    }

    /// A reply's decision: audited as `decided` (a plan) or `answered`
    /// (questions), announced, and kept.
    fn decided(
        &self,
        run: Subject<'_>,
        pause: Pause<'_>,
        round: u32,
        decision: &DecisionData<'_>,
    ) -> Entry {
        let audit = self.record(|| {
            let (confirmation_id, action) = (pause.confirmation_id.to_owned(), decision.action);
            let (key, client) = (
                decision.decider.to_owned(),
                decision.client.map(str::to_owned),
            );
            // A reply that carries answers is audited as `answered`; every
            // other kind's, as `decided`.
            if pause.kind.asks_answers() {
                AuditRecord::Answered {
                    run: run.fields(),
                    confirmation_id,
                    action,
                    answers: decision.given.and_then(Given::answers).cloned(),
                    key,
                    client,
                }
            } else {
                AuditRecord::Decided {
                    run: run.fields(),
                    confirmation_id,
                    round,
                    action,
                    decisions: decision.given.and_then(Given::decisions).cloned(),
                    key,
                    client,
                    approved_by: match decision.approved_by {
                        several if several.len() > 1 => several.to_vec(),
                        _ => Vec::new(),
                    },
                }
            }
        });
        let about = about(run, pause);
        let mut kept = StoredDecision::new(
            decision.action,
            pause.confirmation_id,
            decision.given.cloned(),
            decision.reason,
        );
        kept.text = decision.text.map(str::to_owned);
        Entry {
            audit,
            events: self.rows(|| Event::decided(&about, decision)),
            decision: Some(kept),
        }
    }

    /// What is written of a grant's `event`.
    pub fn grant(&self, event: GrantEvent<'_>) -> Entry {
        match event {
            GrantEvent::Created {
                run,
                grant,
                confirmation_id,
            } => Entry {
                audit: self.record(|| AuditRecord::Granted {
                    run: run.fields(),
                    confirmation_id: confirmation_id.to_owned(),
                    grant: grant.view(),
                }),
                events: self
                    .rows(|| Event::grant(EventType::GrantCreated, grant, confirmation_id, None)),
                decision: None,
            },
            GrantEvent::Revoked { grant, by, client } => Entry {
                audit: self.record(|| AuditRecord::GrantRevoked {
                    session_id: grant.session_id.clone(),
                    grant_id: grant.id.clone(),
                    key: by.to_owned(),
                    client: client.map(str::to_owned),
                }),
                events: self.rows(|| Event::grant(EventType::GrantRevoked, grant, "", Some(by))),
                decision: None,
            },
        }
    }

    /// The audit record of a tool call's `event` (`None` without a log).
    pub fn call(&self, run: Subject<'_>, event: CallEvent<'_>) -> Option<AuditRecord> {
        self.record(|| match event {
            CallEvent::Executed {
                tool,
                args,
                outcome,
                output,
                approved_by,
                idempotency_key,
                attempt,
            } => AuditRecord::Executed {
                run: run.fields(),
                tool: tool.to_owned(),
                args,
                ok: outcome.ok,
                exit_status: outcome.exit_status,
                http_status: outcome.http_status,
                duration_ms: outcome.duration_ms,
                output_bytes: outcome.output_bytes,
                output_sha256: crate::audit::sha256_hex(output.as_bytes()),
                approved_by,
                idempotency_key: idempotency_key.map(str::to_owned),
                attempt: (attempt > 1).then_some(attempt),
            },
            CallEvent::Resumed {
                pause,
                task,
                tool,
                idempotency_key,
                how,
            } => AuditRecord::Resumed {
                run: run.fields(),
                confirmation_id: pause.to_owned(),
                task,
                tool: tool.to_owned(),
                idempotency_key: idempotency_key.to_owned(),
                how,
            },
            CallEvent::Policy {
                tool,
                args,
                rule,
                actual,
                first,
            } => AuditRecord::Policy {
                run: run.fields(),
                key: self.settings.namespaces.label(run.key.owner),
                tool: tool.to_owned(),
                args: args.clone(),
                rule: rule.name.clone(),
                mode: rule.mode,
                decision: rule.decision,
                actual,
                reason: rule.reason.clone(),
                if_enforced: PolicyFirst {
                    rule: first.name.clone(),
                    decision: first.decision,
                },
            },
            CallEvent::PreconditionChanged {
                tool,
                args,
                task,
                changed,
            } => AuditRecord::PreconditionChanged {
                run: run.fields(),
                tool: tool.to_owned(),
                args: args.clone(),
                task,
                approved_digest: changed.approved_digest.clone(),
                current_digest: changed.current_digest.clone(),
            },
        })
    }

    /// `run.resumed` of a task continued after a crash (#44), where the
    /// server has webhooks.
    pub fn resumed_events(&self, run: Subject<'_>, event: &CallEvent<'_>) -> Vec<OutboxEvent> {
        let CallEvent::Resumed {
            pause,
            task,
            tool,
            idempotency_key,
            how,
        } = *event
        else {
            return Vec::new();
        };
        let about = About {
            key: run.key,
            confirmation_id: pause,
            kind: PauseKind::Approval,
        };
        self.rows(|| Event::resumed(&about, task, tool, idempotency_key, how))
    }

    /// Writes `record` (flushed to disk) where the server has an audit
    /// log; `Ok` where it has none.
    pub async fn audit(&self, record: Option<&AuditRecord>) -> Result<(), AuditError> {
        match (&self.settings.audit, record) {
            (Some(log), Some(record)) => log.write(record).await,
            _ => Ok(()),
        }
    }

    /// Some tasks of a pause decided on their own (`decide`): a
    /// `decided_task` record each, and `interaction.progress` naming them.
    pub fn tasks_decided(
        &self,
        run: Subject<'_>,
        decided: TasksDecided<'_>,
    ) -> (Vec<AuditRecord>, Vec<OutboxEvent>) {
        let TasksDecided {
            pause,
            round,
            by,
            client,
            now,
            pending,
            approving,
            via,
        } = decided;
        let audits = match &self.settings.audit {
            Some(_) => {
                let decided = now.0.iter().map(|decision| AuditRecord::DecidedTask {
                    run: run.fields(),
                    confirmation_id: pause.confirmation_id.to_owned(),
                    round,
                    key: by.to_owned(),
                    client: client.map(str::to_owned),
                    decision: decision.clone(),
                });
                let approved = approving.iter().map(|task| AuditRecord::Approved {
                    run: run.fields(),
                    confirmation_id: pause.confirmation_id.to_owned(),
                    round,
                    key: by.to_owned(),
                    client: client.map(str::to_owned),
                    approvals: task.approvals.clone(),
                    required: task.required,
                    task: Some(task.index),
                });
                decided.chain(approved).collect()
            }
            None => Vec::new(),
        };
        let events = self
            .rows(|| Event::tasks_decided(&about(run, pause), now, pending, approving, (by, via)));
        (audits, events)
    }

    /// The record `make` builds, where there is an audit log.
    fn record(&self, make: impl FnOnce() -> AuditRecord) -> Option<AuditRecord> {
        self.settings.audit.as_ref().map(|_| make())
    }

    fn audited(&self, make: impl FnOnce() -> AuditRecord) -> Entry {
        Entry {
            audit: self.record(make),
            ..Entry::default()
        }
    }

    fn announced(&self, make: impl FnOnce() -> Event) -> Entry {
        Entry {
            events: self.rows(make),
            ..Entry::default()
        }
    }

    /// The outbox rows of the event `make` builds (none without webhooks).
    fn rows(&self, make: impl FnOnce() -> Event) -> Vec<OutboxEvent> {
        self.settings
            .webhooks
            .as_ref()
            .map(|hooks| {
                let mut event = make();
                // The key as the keys file labels it (`label=`).
                if let Some(owner) = event.owner {
                    event.key = self.settings.namespaces.label(owner);
                }
                hooks.rows(&event)
            })
            .unwrap_or_default()
    }
}

/// The pause `pause` of `run`, as webhook events name it.
fn about<'a>(run: Subject<'a>, pause: Pause<'a>) -> About<'a> {
    About {
        key: run.key,
        confirmation_id: pause.confirmation_id,
        kind: pause.kind,
    }
}

/// The decision kept for a pause the server cancelled for `reason`.
fn cancelled(pause: Pause<'_>, reason: CancelReason) -> StoredDecision {
    StoredDecision::new(Action::Cancel, pause.confirmation_id, None, Some(reason))
}
