//! The inbox (`GET /api/v1/interactions`): every pending pause a caller may
//! decide, oldest expiry first, paged. A pause is listed with the request
//! its run sent (the last frame of its log, or of its stored record), so
//! the listing holds nothing per pause that the run did not hold already.
//! With `redis://` the store lists the whole cluster's stored pauses; this
//! replica's own pauses that are not stored are added.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::registry::ReplayRegistry;
use super::settings::RunSettings;
use crate::confirmation::ConfirmationManager;
use crate::decider::Decider;
use crate::pause::plan_check::{PlanCheck, Quorum, TaskWho};
use crate::protocol::{PauseData, PauseKind, TaskSpec};
use crate::session::SessionKey;
use crate::store::{DecidedTask, Escalated, PausedRecord, StoreError, TaskApprovals};

/// Default of `?limit=`.
pub const INBOX_LIMIT: usize = 50;
/// Most items one page may ask for.
pub const MAX_INBOX_LIMIT: usize = 500;

/// What a listing asks for.
#[derive(Debug, Clone)]
pub struct InboxQuery {
    /// 1 to [`MAX_INBOX_LIMIT`].
    pub limit: usize,
    /// Items after this pause in the listing's order; a pause no longer
    /// pending starts the listing over.
    pub after: Option<String>,
}

/// One pending pause, as the inbox lists it.
#[derive(Debug, Clone, Serialize)]
pub struct Interaction {
    pub session_id: String,
    pub confirmation_id: String,
    pub kind: PauseKind,
    /// The requester's key label (`key-N`, `anonymous`).
    pub key: String,
    /// RFC 3339, UTC.
    pub created_at: String,
    pub expires_at: String,
    /// A plan's risk (approvals only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub risk_level: Option<Value>,
    /// The questions' title (questions only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The plan's summary: its request's text (approvals only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// Whole seconds until it expires, when listed (0 once past).
    pub expires_in_seconds: u64,
    /// Approvals: each task in a line a person can scan (what it calls,
    /// its risk, a preview of what it runs), so that a dangerous plan does
    /// not read like a harmless one.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<TaskLine>,
    /// A quorum (more than one approval needed): the labels that approved
    /// so far, and how many it needs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approvals: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub required: Option<usize>,
    /// The group an unanswered pause was escalated to (its members may
    /// decide it too).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub escalated_to: Option<String>,
    /// The tasks its escalations were for (#42), when not every task.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub escalated_tasks: Vec<usize>,
    /// Its escalations, each group with its tasks.
    #[serde(skip)]
    pub escalations: Vec<Escalated>,
    /// The groups whose members alone decide it (its tools' and rules'
    /// `approvers`; an escalation admits its group's members too).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub approvers: Vec<String>,
    /// Whether the key that lists it may approve it (approvals only), and
    /// if not, why: it approved already, it is the requester where that
    /// may not approve, or it is not in the group that decides.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub may_approve: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why_not: Option<String>,
    /// Whether the requester's own key counts towards its approvals.
    #[serde(skip)]
    pub requester_may_approve: bool,
    /// The pending tasks the key that lists it may decide (approvals,
    /// #42): an approver in scope for some of a plan's tasks only decides
    /// those.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub may_decide_tasks: Option<Vec<usize>>,
    /// Who may decide each task, and which are still pending.
    #[serde(skip)]
    pub task_who: Vec<TaskWho>,
    #[serde(skip)]
    pub pending: Vec<usize>,
    pub confirmation_data: Value,
    /// For ordering: milliseconds since the Unix epoch of `expires_at`.
    #[serde(skip)]
    expires_ms: u64,
}

/// One task of an approval, as the inbox lists it.
#[derive(Debug, Clone, Serialize)]
pub struct TaskLine {
    pub index: u64,
    pub tool: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub risk_level: Option<Value>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub simulated: bool,
    /// The task's text and its arguments, each cut to
    /// [`PREVIEW_CHARS`] characters.
    pub description: String,
    pub args: String,
    /// Allowed without a person (a rule or a grant): it runs unless rejected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<Value>,
    /// What the call would do (#43), whole: the digest an approval names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preview: Option<crate::protocol::TaskPreview>,
}

impl Interaction {
    /// What it asks of `decider`, for the one rule
    /// ([`crate::decider::may_decide`]).
    pub fn deciding(&self, decider: &Decider) -> crate::decider::Deciding<'_> {
        let risk_of = |task: &TaskLine| {
            task.risk_level
                .as_ref()
                .and_then(|risk| {
                    serde_json::from_value::<crate::protocol::RiskLevel>(risk.clone()).ok()
                })
                .unwrap_or(crate::protocol::RiskLevel::Low)
        };
        let riskiest = self.tasks.iter().max_by_key(|task| risk_of(task));
        crate::decider::Deciding {
            risk: riskiest.map_or(crate::protocol::RiskLevel::Low, risk_of),
            riskiest: riskiest.map(|task| task.index as usize),
            groups: &self.approvers,
            requester_may_approve: self.requester_may_approve,
            escalated_to: self.escalated_for(decider, |index| {
                self.tasks.iter().any(|t| t.index == index as u64)
            }),
        }
    }

    /// The group of its escalations that admits `decider` to every task
    /// `asked` takes in, if one does.
    fn escalated_for(&self, decider: &Decider, asked: impl Fn(usize) -> bool) -> Option<&str> {
        let tasks: Vec<usize> = self
            .task_who
            .iter()
            .map(|who| who.index)
            .filter(|&index| asked(index))
            .collect();
        let escalations =
            crate::confirmation::escalations_of(self.escalated_to.as_deref(), &self.escalations);
        crate::decider::admitting(decider, escalations, &tasks)
    }

    /// What its pending task `who` asks of `decider` deciding it alone.
    pub fn deciding_task<'a>(
        &'a self,
        who: &'a TaskWho,
        decider: &Decider,
    ) -> crate::decider::Deciding<'a> {
        crate::decider::Deciding {
            risk: who.risk,
            riskiest: Some(who.index),
            groups: &who.groups,
            requester_may_approve: who.requester_may_approve,
            escalated_to: self.escalated_for(decider, |index| index == who.index),
        }
    }

    /// Its pending tasks, each with who may decide it.
    pub fn pending_tasks(&self) -> impl Iterator<Item = &TaskWho> {
        self.task_who
            .iter()
            .filter(|who| self.pending.contains(&who.index))
    }
}

/// Characters of a task's text, and of its arguments as JSON, an inbox
/// line shows (the whole task is in `confirmation_data`).
pub const PREVIEW_CHARS: usize = 120;

/// `text` cut to [`PREVIEW_CHARS`] characters, `…` marking a cut.
fn preview(text: &str) -> String {
    let mut chars = text.chars();
    let cut: String = chars.by_ref().take(PREVIEW_CHARS).collect();
    if chars.next().is_some() {
        cut + "…"
    } else {
        cut
    }
}

/// The tasks of an approval as asked (all pending; [`Interaction::mark_decided`]
/// takes out those decided since); a pause decided whole has none.
fn tasks_pending(pause: &PauseData) -> Vec<usize> {
    pause
        .tasks_one_by_one()
        .iter()
        .map(|task| task.index)
        .collect()
}

/// The tasks `escalations` were for, each once, in order.
fn escalated_tasks(escalations: &[Escalated]) -> Vec<usize> {
    let mut tasks: Vec<usize> = escalations.iter().flat_map(|e| e.tasks.clone()).collect();
    tasks.sort_unstable();
    tasks.dedup();
    tasks
}

/// The lines of an approval's tasks.
fn task_lines(tasks: &[TaskSpec]) -> Vec<TaskLine> {
    tasks
        .iter()
        .map(|task| TaskLine {
            index: task.index as u64,
            tool: task.tool.clone(),
            risk_level: task
                .risk_level
                .and_then(|risk| serde_json::to_value(risk).ok()),
            simulated: task.simulated,
            description: preview(&task.description),
            args: preview(&task.args.as_ref().map(Value::to_string).unwrap_or_default()),
            approved_by: task
                .approved_by
                .as_ref()
                .and_then(|by| serde_json::to_value(by).ok()),
            preview: task.preview.clone(),
        })
        .collect()
}

/// What the inbox reads of a pause's request chunk: its text, and its
/// `confirmation_data` as sent (an escalation adds `escalated_to` to it),
/// read typed as [`PauseData`] below.
#[derive(Deserialize)]
struct Request {
    chunk: String,
    confirmation_data: Value,
}

use crate::clock::{ms as unix_ms, rfc3339};

/// The listing item of the pause `confirmation_id` whose request is
/// `frame`; `None` when the frame is not that pause's request (a run that
/// moved on between the registry and its log).
fn interaction(
    key: &SessionKey,
    label: String,
    confirmation_id: &str,
    frame: &[u8],
    asked_at: SystemTime,
    expires_at: SystemTime,
) -> Option<Interaction> {
    let request: Request = serde_json::from_slice(crate::sse::data_of(frame)?).ok()?;
    let data = request.confirmation_data;
    let pause = PauseData::deserialize(&data).ok()?;
    if pause.confirmation_id() != confirmation_id {
        return None;
    }
    let risk_level = pause
        .risk_level()
        .and_then(|risk| serde_json::to_value(risk).ok());
    let title = pause.title().map(str::to_owned);
    let summary = pause.summary(&request.chunk).map(str::to_owned);
    let tasks = task_lines(pause.tasks());
    Some(Interaction {
        session_id: key.session_id.to_string(),
        confirmation_id: confirmation_id.to_owned(),
        kind: pause.kind(),
        key: label,
        created_at: rfc3339(asked_at),
        expires_at: rfc3339(expires_at),
        risk_level,
        title,
        summary,
        expires_in_seconds: expires_at
            .duration_since(SystemTime::now())
            .map_or(0, |left| left.as_secs()),
        tasks,
        approvals: None,
        required: None,
        escalated_to: None,
        escalated_tasks: Vec::new(),
        escalations: Vec::new(),
        approvers: Vec::new(),
        may_approve: None,
        why_not: None,
        requester_may_approve: true,
        may_decide_tasks: None,
        task_who: Vec::new(),
        pending: tasks_pending(&pause),
        confirmation_data: data,
        expires_ms: unix_ms(expires_at),
    })
}

/// The pending pauses as people find them, an owned part of [`super::Runs`]
/// (`runs.inbox()`): listed (this process's, and the store's where pauses
/// may live elsewhere: replicas, parked pauses), one looked up for a
/// decision link's page, and the session of one an approver names.
#[derive(Clone)]
pub struct Inbox {
    manager: ConfirmationManager,
    replays: ReplayRegistry,
    settings: Arc<RunSettings>,
    /// Whether a pause may be held elsewhere than this process's memory
    /// (replicas, or a durable store where pauses park): then the store
    /// is asked too.
    stored: bool,
}

impl Inbox {
    pub(super) fn new(
        manager: ConfirmationManager,
        replays: ReplayRegistry,
        settings: Arc<RunSettings>,
        stored: bool,
    ) -> Inbox {
        Inbox {
            manager,
            replays,
            settings,
            stored,
        }
    }

    /// The session of the pause `confirmation_id`, in whatever namespace:
    /// this process's registry first, then its finished runs kept for
    /// their grace, then (replicas) the cluster's store.
    pub async fn locate(&self, confirmation_id: &str) -> Result<Option<SessionKey>, StoreError> {
        if let Some(key) = self.manager.find_pause(confirmation_id) {
            return Ok(Some(key));
        }
        if let Some(key) = self.replays.find_pause(confirmation_id) {
            return Ok(Some(key));
        }
        if !self.stored {
            return Ok(None);
        }
        let found = self.settings.store.locate(confirmation_id).await?;
        Ok(found.and_then(|(namespace, session_id)| {
            let owner = self.settings.namespaces.owner(namespace.as_deref())?;
            Some(SessionKey::new(owner, &session_id))
        }))
    }

    /// Every namespace's pending pauses (an approver's inbox), as
    /// [`Inbox::list`] lists one namespace's. With replicas each
    /// namespace's first [`MAX_INBOX_LIMIT`] stored pauses are merged.
    pub async fn list_all(
        &self,
        query: &InboxQuery,
        in_scope: impl Fn(Option<u32>, &Interaction) -> bool,
    ) -> Result<Vec<Interaction>, StoreError> {
        let mut items = Vec::new();
        for owner in self.settings.namespaces.owners() {
            let everything = InboxQuery {
                limit: MAX_INBOX_LIMIT,
                after: None,
            };
            let listed = self.list(owner, &everything).await?;
            items.extend(listed.into_iter().filter(|item| in_scope(owner, item)));
        }
        Ok(page(items, query))
    }

    /// The pending pauses of `owner`'s namespace, oldest expiry first (then
    /// by confirmation id), the page `query` asks for.
    pub async fn list(
        &self,
        owner: Option<u32>,
        query: &InboxQuery,
    ) -> Result<Vec<Interaction>, StoreError> {
        let mut items = self.local_interactions(owner);
        if self.stored {
            // The cluster's stored pauses, paged by the store; this
            // replica's pauses that are not stored join them.
            let namespace = self.settings.namespaces.name(owner);
            let stored = self
                .settings
                .store
                .pending(namespace.as_deref(), query.after.as_deref(), query.limit)
                .await?;
            let listed: HashSet<String> =
                stored.iter().map(|r| r.confirmation_id.clone()).collect();
            items.retain(|item| !listed.contains(&item.confirmation_id));
            items.extend(
                stored
                    .iter()
                    .filter_map(|record| self.stored_interaction(record, owner)),
            );
        }
        let now = unix_ms(SystemTime::now());
        items.retain(|item| item.expires_ms > now);
        Ok(page(items, query))
    }

    /// The undecided pause `confirmation_id` of the run on `key`, when this
    /// process holds it (a decision link's page).
    pub fn pending_here(&self, key: &SessionKey, confirmation_id: &str) -> Option<Interaction> {
        self.interactions_where(|k| k == key)
            .into_iter()
            .find(|item| item.confirmation_id == confirmation_id)
    }

    /// This process's undecided pauses of `owner`'s namespace.
    fn local_interactions(&self, owner: Option<u32>) -> Vec<Interaction> {
        self.interactions_where(|key| key.owner == owner)
    }

    /// This process's undecided pauses of the sessions `mine` accepts.
    fn interactions_where(&self, mine: impl Fn(&SessionKey) -> bool) -> Vec<Interaction> {
        let waiting = self.manager.waiting(mine);
        waiting
            .into_iter()
            .filter_map(|pause| self.interaction_of(pause))
            .collect()
    }

    /// `pause` as the inbox lists it: the request its run sent, and where
    /// it stands.
    fn interaction_of(&self, pause: crate::confirmation::waiting::Waiting) -> Option<Interaction> {
        let log = self.replays.find(&pause.key)?;
        let frame = log.last_frame(&pause.confirmation_id)?;
        let mut item = interaction(
            &pause.key,
            self.settings.namespaces.label(pause.key.owner),
            &pause.confirmation_id,
            &frame,
            pause.asked_at,
            pause.expires_at,
        )?;
        if pause.required > 1 {
            item.approvals = Some(pause.approvals);
            item.required = Some(pause.required);
        }
        item.escalated_to = pause.escalated_to;
        item.escalated_tasks = escalated_tasks(&pause.escalations);
        item.escalations = pause.escalations;
        item.mark_decided(&pause.decided, &pause.task_approvals);
        item.approvers = pause.groups;
        item.requester_may_approve = pause.requester_may_approve;
        item.task_who = pause.task_who;
        Some(item)
    }
}

/// `items` in the inbox's order (expiry, then confirmation id), the page
/// `query` asks for: after its `after` when listed, else from the start.
fn page(mut items: Vec<Interaction>, query: &InboxQuery) -> Vec<Interaction> {
    items.sort_by(|a, b| {
        (a.expires_ms, &a.confirmation_id).cmp(&(b.expires_ms, &b.confirmation_id))
    });
    let start = query
        .after
        .as_deref()
        .and_then(|after| items.iter().position(|i| i.confirmation_id == after))
        .map_or(0, |at| at + 1);
    items.into_iter().skip(start).take(query.limit).collect()
}

impl Interaction {
    /// Shows the tasks decided on their own (`decide`) as decided: each
    /// one's `state` in the listed `confirmation_data`; and the approvals
    /// of tasks that need several, so far.
    fn mark_decided(&mut self, decided: &[DecidedTask], approvals: &[TaskApprovals]) {
        let tasks = self
            .confirmation_data
            .get_mut("tasks")
            .and_then(Value::as_array_mut);
        for task in tasks.into_iter().flatten() {
            let index = task.get("index").and_then(Value::as_u64);
            let done = decided
                .iter()
                .find(|done| Some(done.decision.index as u64) == index);
            let approved = approvals
                .iter()
                .find(|task| Some(task.index as u64) == index);
            let Some(task) = task.as_object_mut() else {
                continue;
            };
            if let Some(approved) = approved {
                task.insert(
                    "approvals".to_owned(),
                    Value::from(approved.approvals.clone()),
                );
            }
            if let Some(done) = done {
                self.pending.retain(|&index| index != done.decision.index);
                let state = match done.expired {
                    true => crate::protocol::TaskState::Expired,
                    false => done.decision.verdict.state(),
                };
                let state = serde_json::to_value(state);
                task.insert("state".to_owned(), state.unwrap_or_default());
                task.insert("decided_by".to_owned(), Value::from(done.by.as_str()));
            }
        }
    }
}

impl Inbox {
    /// The listing item of a stored pause (another replica's, with
    /// replicas), with its progress as its record keeps it and who decides
    /// it as the tools file says.
    fn stored_interaction(&self, record: &PausedRecord, owner: Option<u32>) -> Option<Interaction> {
        let frame = record.request_frame()?;
        let at = crate::clock::at;
        let key = SessionKey::new(owner, &record.session_id);
        let label = self.settings.namespaces.label(owner);
        let progress = record.progress.clone().unwrap_or_default();
        let expires_at_ms = progress.expires_at_ms.unwrap_or(record.expires_at_ms);
        let mut item = interaction(
            &key,
            label.clone(),
            &record.confirmation_id,
            frame.as_bytes(),
            at(record.asked_at_ms),
            at(expires_at_ms),
        )?;
        // None: one reply from anyone who may decide the session.
        if let Some(tasks) = record.asked.deciding_tasks() {
            let tools = &self.settings.tools;
            let checks = PlanCheck::of(tasks, tools).with_rules(tasks, tools, label);
            let quorum = Quorum::of(&checks);
            if quorum.required > 1 {
                item.approvals = Some(progress.approvals);
                item.required = Some(quorum.required);
            }
            item.approvers = quorum.groups;
            item.requester_may_approve = quorum.requester_may_approve;
            item.task_who = TaskWho::of(&checks);
        }
        item.escalated_to = progress.escalated_to;
        item.escalated_tasks = escalated_tasks(&progress.escalations);
        item.escalations = progress.escalations.clone();
        item.mark_decided(&progress.decided, &progress.task_approvals);
        Some(item)
    }
}
