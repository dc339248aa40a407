//! A2A tasks (#45): each A2A task is a run, followed. The registry holds
//! what A2A asks of a task and the run does not keep in that shape (its
//! id, its state, its artifacts, its push configs); a follower reads the
//! run's stream and turns each chunk into the task's updates
//! ([`crate::protocol::a2a::Update`]), which go to the task's subscribers
//! (streams) and push configs. Bounded: [`MAX_A2A_TASKS`] tasks (the
//! oldest ended one makes room), [`MAX_ARTIFACTS`] artifacts of at most
//! [`MAX_ARTIFACT_BYTES`] each, [`MAX_HISTORY`] messages per task.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc, watch};

mod push;
mod view;

use crate::protocol::a2a::{agent_message, PushConfig, TaskState, Update};
use crate::protocol::Chunk;
use crate::run::stream::Subscription;
use crate::session::{run_log, RunTag, SessionKey};
use view::{artifact, push_history, status, View};
pub use view::{MAX_ARTIFACTS, MAX_ARTIFACT_BYTES, MAX_HISTORY};

/// Most tasks the registry holds.
pub const MAX_A2A_TASKS: usize = 10_000;
/// Updates a subscriber may fall behind by before its stream ends (the
/// channel's ring is allocated whole per task: 64 slots keep 10,000
/// tasks' rings to a few MiB).
const SUBSCRIBER_LAG: usize = 64;
/// Push deliveries queued per task before new ones are dropped.
const PUSH_QUEUE: usize = 256;
/// How long one push delivery may take.
const PUSH_TIMEOUT: Duration = Duration::from_secs(10);

/// The A2A tasks of this process.
pub struct A2aTasks {
    inner: Mutex<Inner>,
    http: reqwest::Client,
    /// `--a2a-push-host`: the hosts a push URL may name (none: any).
    push_hosts: Vec<String>,
}

#[derive(Default)]
struct Inner {
    tasks: HashMap<String, Arc<A2aTask>>,
    order: VecDeque<String>,
}

/// Why a task cannot be made.
#[derive(Debug, thiserror::Error)]
#[error("this server holds {MAX_A2A_TASKS} A2A tasks that have not ended; retry later")]
pub struct TasksFull;

impl Default for A2aTasks {
    fn default() -> Self {
        A2aTasks::new(Vec::new())
    }
}

impl A2aTasks {
    /// The registry, push URLs limited to `push_hosts` (none: any host).
    pub fn new(push_hosts: Vec<String>) -> A2aTasks {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(PUSH_TIMEOUT)
            .build()
            .unwrap_or_default();
        let push_hosts = push_hosts
            .iter()
            .map(|host| host.trim().to_ascii_lowercase())
            .filter(|host| !host.is_empty())
            .collect();
        A2aTasks {
            inner: Mutex::new(Inner::default()),
            http,
            push_hosts,
        }
    }

    /// Whether a push URL may name `host` (`--a2a-push-host`).
    pub fn may_push_to(&self, host: &str) -> bool {
        push::host_allowed(&self.push_hosts, host)
    }

    /// A new task `id` for the run on `key` (`first`: the message that
    /// started it), whose stream is `subscription`: registered, then
    /// followed.
    pub fn open(
        &self,
        id: String,
        key: SessionKey,
        first: Value,
        subscription: Subscription,
    ) -> Result<Arc<A2aTask>, TasksFull> {
        let mut inner = self.lock();
        let task = Arc::new(A2aTask::new(id, key, Some(first)));
        inner.insert(task.clone())?;
        tokio::spawn(follow(task.clone(), subscription));
        Ok(task)
    }

    /// The task `id`, held here or, when `found` finds its run (a restart
    /// or a takeover left this process without it), made again from it:
    /// `found` gives the chunk the run waits on (its pause's request) and
    /// the run's stream after it, when no other client holds it. Found
    /// under the registry's lock: one task per id, one follower.
    pub fn get_or_find(
        &self,
        id: &str,
        key: &SessionKey,
        found: impl FnOnce() -> Option<(Chunk, Option<Subscription>)>,
    ) -> Result<Option<Arc<A2aTask>>, TasksFull> {
        let mut inner = self.lock();
        if let Some(task) = inner.tasks.get(id) {
            return Ok(Some(task.clone()));
        }
        let Some((request, subscription)) = found() else {
            return Ok(None);
        };
        let task = Arc::new(A2aTask::new(id.to_owned(), key.clone(), None));
        task.apply(Update::of(&request, id));
        inner.insert(task.clone())?;
        match subscription {
            Some(subscription) => {
                tokio::spawn(follow(task.clone(), subscription));
            }
            None => task.unfollowed(),
        }
        Ok(Some(task))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The task `id`.
    pub fn get(&self, id: &str) -> Option<Arc<A2aTask>> {
        let inner = self.lock();
        inner.tasks.get(id).cloned()
    }

    /// Every task `visible` admits, most recently updated first.
    pub fn list(&self, visible: impl Fn(&A2aTask) -> bool) -> Vec<Arc<A2aTask>> {
        let inner = self.lock();
        let mut tasks: Vec<Arc<A2aTask>> = inner
            .tasks
            .values()
            .filter(|task| visible(task))
            .cloned()
            .collect();
        drop(inner);
        tasks.sort_by_key(|task| (std::cmp::Reverse(task.updated_ms()), task.id.clone()));
        tasks
    }

    /// Adds a push config to `task` (its id given, or made), and starts
    /// its deliveries.
    pub fn add_push(&self, task: &Arc<A2aTask>, mut config: PushConfig) -> PushConfig {
        if config.id.is_empty() {
            config.id = uuid::Uuid::new_v4().to_string();
        }
        config.task_id = task.id.clone();
        let mut push = task.push.lock().unwrap_or_else(|e| e.into_inner());
        push.configs.retain(|c| c.id != config.id);
        push.configs.push(config.clone());
        if push.queue.is_none() {
            let (send, receive) = mpsc::channel(PUSH_QUEUE);
            push.queue = Some(send);
            // Held weakly: a task dropped from the registry (and ended)
            // drops its queue, and its deliveries end.
            let held = Arc::downgrade(task);
            let configs = move || held.upgrade().map(|t| t.push_configs()).unwrap_or_default();
            let http = self.http.clone();
            tokio::spawn(push::deliver(http, task.key.clone(), configs, receive));
        }
        config
    }
}

impl Inner {
    /// Registers `task`, making room from an ended task when full.
    fn insert(&mut self, task: Arc<A2aTask>) -> Result<(), TasksFull> {
        if self.tasks.len() >= MAX_A2A_TASKS && !self.evict_one() {
            return Err(TasksFull);
        }
        self.order.push_back(task.id.clone());
        self.tasks.insert(task.id.clone(), task);
        Ok(())
    }

    /// Drops the oldest ended task; false when none has ended.
    fn evict_one(&mut self) -> bool {
        let Some(at) = self.order.iter().position(|id| {
            self.tasks
                .get(id)
                .is_none_or(|task| task.state().is_terminal())
        }) else {
            return false;
        };
        if let Some(id) = self.order.remove(at) {
            self.tasks.remove(&id);
        }
        true
    }
}

/// One A2A task: its run's session, what it looks like to A2A, and who
/// hears of its updates.
pub struct A2aTask {
    pub id: String,
    pub key: SessionKey,
    view: Mutex<View>,
    /// The view's version: bumped on every update.
    changed: watch::Sender<u64>,
    events: broadcast::Sender<Value>,
    push: Mutex<Push>,
}

#[derive(Default)]
struct Push {
    configs: Vec<PushConfig>,
    queue: Option<mpsc::Sender<Value>>,
}

impl A2aTask {
    fn new(id: String, key: SessionKey, first: Option<Value>) -> A2aTask {
        let message = agent_message(&id, &key.session_id, "working", None);
        let history: VecDeque<Value> = first.into_iter().collect();
        A2aTask {
            view: Mutex::new(View {
                state: TaskState::Working,
                message,
                updated_ms: crate::clock::now_ms(),
                artifacts: Vec::new(),
                dropped_artifacts: 0,
                history,
                pause: None,
                last_pause: None,
                began_ms: crate::clock::now_ms(),
                followed: true,
            }),
            changed: watch::channel(0).0,
            events: broadcast::channel(SUBSCRIBER_LAG).0,
            push: Mutex::new(Push::default()),
            id,
            key,
        }
    }

    fn view(&self) -> std::sync::MutexGuard<'_, View> {
        self.view.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn context_id(&self) -> &str {
        &self.key.session_id
    }

    pub fn state(&self) -> TaskState {
        self.view().state
    }

    /// The pause it waits on, when it waits on one.
    pub fn pause(&self) -> Option<String> {
        self.view().pause.clone()
    }

    pub fn updated_ms(&self) -> u64 {
        self.view().updated_ms
    }

    /// Whether `outcome` (its session's kept outcome) is its run's: it
    /// names the last pause the task waited on, or, for a task that never
    /// waited, came after the task began.
    pub fn ended_by(&self, outcome: &crate::store::Outcome) -> bool {
        let view = self.view();
        let waited: Vec<&String> = view.pause.iter().chain(&view.last_pause).collect();
        match waited.is_empty() {
            true => outcome.ended_at_ms >= view.began_ms,
            false => outcome
                .pauses
                .iter()
                .any(|p| waited.contains(&&p.confirmation_id)),
        }
    }

    /// Whether its run's stream is still followed.
    pub fn followed(&self) -> bool {
        self.view().followed
    }

    /// The task as A2A writes it: `history` its last `history` messages
    /// (all: `None`), artifacts when `artifacts`.
    pub fn to_json(&self, history: Option<usize>, artifacts: bool) -> Value {
        self.json_of(&self.view(), history, artifacts)
    }

    /// The task as it is, and its updates from then on: taken together,
    /// so that no update is missed or told twice.
    pub fn snapshot_and_subscribe(&self) -> (Value, broadcast::Receiver<Value>) {
        let view = self.view();
        let updates = self.events.subscribe();
        (self.json_of(&view, None, true), updates)
    }

    fn json_of(&self, view: &View, history: Option<usize>, artifacts: bool) -> Value {
        let mut task = json!({
            "id": self.id,
            "contextId": self.context_id(),
            "status": status(view),
        });
        if artifacts {
            task["artifacts"] = Value::from(view.artifacts.clone());
        }
        let keep = history.unwrap_or(usize::MAX).min(view.history.len());
        if keep > 0 {
            let skip = view.history.len() - keep;
            task["history"] = view.history.iter().skip(skip).cloned().collect();
        }
        if view.dropped_artifacts > 0 {
            task["metadata"] = json!({"dropped_artifacts": view.dropped_artifacts});
        }
        task
    }

    /// A message the client sent to the task (its answer), kept in its
    /// history.
    pub fn heard(&self, message: Value) {
        let mut view = self.view();
        push_history(&mut view.history, message);
    }

    /// Updates as they come (the task's own events, in order).
    pub fn subscribe(&self) -> broadcast::Receiver<Value> {
        self.events.subscribe()
    }

    /// Resolves when the view changes after `seen` (a version), or never
    /// for a task that cannot change any more.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Its push configs.
    pub fn push_configs(&self) -> Vec<PushConfig> {
        let push = self.push.lock().unwrap_or_else(|e| e.into_inner());
        push.configs.clone()
    }

    /// How many push configs it has.
    pub fn push_count(&self) -> usize {
        self.push_configs().len()
    }

    /// Drops the push config `id`; whether it had one.
    pub fn remove_push(&self, id: &str) -> bool {
        let mut push = self.push.lock().unwrap_or_else(|e| e.into_inner());
        let before = push.configs.len();
        push.configs.retain(|c| c.id != id);
        before != push.configs.len()
    }

    /// Applies `update`: the view changes, and the update goes to the
    /// subscribers and push configs.
    pub fn apply(&self, update: Update) {
        let event = {
            let mut view = self.view();
            let event = match update {
                Update::Nothing => return,
                Update::Status {
                    state,
                    text,
                    card,
                    metadata,
                } => {
                    view.pause = card.as_ref().and_then(|card| {
                        card.get("confirmation_id")
                            .and_then(Value::as_str)
                            .map(str::to_owned)
                    });
                    if view.pause.is_some() {
                        view.last_pause = view.pause.clone();
                    }
                    view.state = state;
                    view.message = agent_message(&self.id, self.context_id(), &text, card.as_ref());
                    if !metadata.is_empty() {
                        view.message["metadata"] = Value::Object(metadata);
                    }
                    let message = view.message.clone();
                    push_history(&mut view.history, message);
                    view.updated_ms = crate::clock::now_ms();
                    json!({"statusUpdate": {
                        "taskId": self.id,
                        "contextId": self.context_id(),
                        "status": status(&view),
                    }})
                }
                Update::Artifact {
                    id,
                    name,
                    text,
                    metadata,
                    append,
                } => match artifact(&mut view, id, name, text, metadata, append) {
                    Some((artifact, appended)) => {
                        view.updated_ms = crate::clock::now_ms();
                        json!({"artifactUpdate": {
                            "taskId": self.id,
                            "contextId": self.context_id(),
                            "artifact": artifact,
                            "append": appended,
                        }})
                    }
                    None => return,
                },
            };
            // Sent while the view is held: a snapshot taken with a
            // subscription sees each update once.
            let _ = self.events.send(event.clone());
            drop(view);
            event
        };
        self.changed.send_modify(|version| *version += 1);
        let push = self.push.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(queue) = &push.queue {
            if queue.try_send(event).is_err() {
                run_log!(
                    Warn,
                    RunTag::session(&self.key),
                    "A2A push queue full: an update was not pushed"
                );
            }
        }
    }

    /// The follower stopped: the run's stream ended (or another client
    /// took it over).
    fn unfollowed(&self) {
        self.view().followed = false;
        self.changed.send_modify(|version| *version += 1);
    }
}

/// Reads the run's stream into the task until the task ends (or the
/// stream does: another client took it over, or the server stops).
async fn follow(task: Arc<A2aTask>, subscription: Subscription) {
    let mut subscription = subscription.typed();
    while let Some(Ok(frame)) = subscription.next().await {
        let typed = subscription.chunk();
        let chunk = typed.or_else(|| {
            let data = crate::sse::data_of(&frame)?;
            serde_json::from_slice::<Chunk>(data).ok().map(Box::new)
        });
        let Some(chunk) = chunk else {
            continue;
        };
        task.apply(Update::of(&chunk, &task.id));
        if task.state().is_terminal() {
            break;
        }
    }
    task.unfollowed();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_registry_makes_room_only_from_ended_tasks() {
        let mut inner = Inner::default();
        let key = SessionKey::new(None, "s");
        let working = Arc::new(A2aTask::new("w".into(), key.clone(), None));
        let ended = Arc::new(A2aTask::new("e".into(), key, None));
        ended.view().state = TaskState::Completed;
        for task in [&working, &ended] {
            inner.tasks.insert(task.id.clone(), task.clone());
            inner.order.push_back(task.id.clone());
        }
        assert!(inner.evict_one());
        assert!(inner.tasks.contains_key(&working.id));
        assert!(!inner.tasks.contains_key(&ended.id));
        assert!(!inner.evict_one(), "a task at work is never dropped");
    }
}
