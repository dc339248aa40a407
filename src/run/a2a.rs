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
use serde_json::{json, Map, Value};
use tokio::sync::{broadcast, mpsc, watch};

use crate::protocol::a2a::{agent_message, PushConfig, TaskState, Update};
use crate::protocol::Chunk;
use crate::run::stream::Subscription;
use crate::session::{run_log, RunTag, SessionKey};

/// Most tasks the registry holds.
pub const MAX_A2A_TASKS: usize = 10_000;
/// Most artifacts one task holds (later outputs replace nothing: they are
/// dropped, and the task's metadata says so).
pub const MAX_ARTIFACTS: usize = 256;
/// Largest artifact text, in bytes (streamed content stops growing there).
pub const MAX_ARTIFACT_BYTES: usize = 64 * 1024;
/// Most messages a task's history keeps (the latest).
pub const MAX_HISTORY: usize = 32;
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
        A2aTasks::new()
    }
}

impl A2aTasks {
    pub fn new() -> A2aTasks {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(PUSH_TIMEOUT)
            .build()
            .unwrap_or_default();
        A2aTasks {
            inner: Mutex::new(Inner::default()),
            http,
        }
    }

    /// A new task for the run on `key`, whose stream is `subscription`:
    /// registered, then followed.
    pub fn open(
        &self,
        key: SessionKey,
        first: Value,
        subscription: Subscription,
    ) -> Result<Arc<A2aTask>, TasksFull> {
        let task = Arc::new(A2aTask::new(key, first));
        {
            let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            if inner.tasks.len() >= MAX_A2A_TASKS && !inner.evict_one() {
                return Err(TasksFull);
            }
            inner.tasks.insert(task.id.clone(), task.clone());
            inner.order.push_back(task.id.clone());
        }
        tokio::spawn(follow(task.clone(), subscription));
        Ok(task)
    }

    /// The task `id`.
    pub fn get(&self, id: &str) -> Option<Arc<A2aTask>> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.tasks.get(id).cloned()
    }

    /// Every task `visible` admits, most recently updated first.
    pub fn list(&self, visible: impl Fn(&A2aTask) -> bool) -> Vec<Arc<A2aTask>> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
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
            tokio::spawn(deliver(self.http.clone(), task.clone(), receive));
        }
        config
    }
}

impl Inner {
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

struct View {
    state: TaskState,
    message: Value,
    updated_ms: u64,
    artifacts: Vec<Value>,
    dropped_artifacts: usize,
    history: VecDeque<Value>,
    /// The pause it waits on (its `confirmation_id`).
    pause: Option<String>,
    /// Its run's stream is followed (else its end is read from the run's
    /// kept outcome).
    followed: bool,
}

impl A2aTask {
    fn new(key: SessionKey, first: Value) -> A2aTask {
        let id = uuid::Uuid::new_v4().to_string();
        let message = agent_message(&id, &key.session_id, "working", None);
        let mut history = VecDeque::new();
        history.push_back(first);
        A2aTask {
            view: Mutex::new(View {
                state: TaskState::Working,
                message,
                updated_ms: crate::clock::now_ms(),
                artifacts: Vec::new(),
                dropped_artifacts: 0,
                history,
                pause: None,
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

/// The task's status: its state, its message, when.
fn status(view: &View) -> Value {
    json!({
        "state": view.state.as_str(),
        "message": view.message,
        "timestamp": crate::clock::rfc3339_ms(view.updated_ms),
    })
}

fn push_history(history: &mut VecDeque<Value>, message: Value) {
    if history.len() >= MAX_HISTORY {
        history.pop_front();
    }
    history.push_back(message);
}

/// Adds (or appends to) the artifact `id`: what the update carries (the
/// whole artifact, or the appended part) and whether it appends; `None`
/// when the task holds its most artifacts, or the text its most bytes.
fn artifact(
    view: &mut View,
    id: String,
    name: String,
    text: String,
    metadata: Map<String, Value>,
    append: bool,
) -> Option<(Value, bool)> {
    let existing = view
        .artifacts
        .iter_mut()
        .find(|a| a["artifactId"] == id.as_str());
    if let (true, Some(existing)) = (append, existing) {
        let whole = existing["parts"][0]["text"].as_str().unwrap_or("");
        if whole.len() + text.len() > MAX_ARTIFACT_BYTES {
            return None;
        }
        let grown = format!("{whole}{text}");
        existing["parts"][0]["text"] = Value::from(grown);
        return Some((json!({"artifactId": id, "parts": [{"text": text}]}), true));
    }
    if view.artifacts.len() >= MAX_ARTIFACTS {
        view.dropped_artifacts += 1;
        return None;
    }
    let mut text = text;
    if text.len() > MAX_ARTIFACT_BYTES {
        let mut cut = MAX_ARTIFACT_BYTES;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    let mut artifact = json!({"artifactId": id, "name": name, "parts": [{"text": text}]});
    if !metadata.is_empty() {
        artifact["metadata"] = Value::Object(metadata);
    }
    view.artifacts.push(artifact.clone());
    Some((artifact, false))
}

/// Reads the run's stream into the task until the task ends (or the
/// stream does: another client took it over, or the server stops).
async fn follow(task: Arc<A2aTask>, mut subscription: Subscription) {
    while let Some(Ok(frame)) = subscription.next().await {
        let Some(data) = crate::sse::data_of(&frame) else {
            continue;
        };
        let Ok(chunk) = serde_json::from_slice::<Chunk>(data) else {
            continue;
        };
        task.apply(Update::of(&chunk, &task.id));
        if task.state().is_terminal() {
            break;
        }
    }
    task.unfollowed();
}

/// Delivers the task's updates to its push configs, in order: a POST of
/// each update (a `StreamResponse`) with the config's token
/// (`X-A2A-Notification-Token`) and authentication; no redirect is
/// followed, a failed delivery is logged by the URL's origin only.
async fn deliver(http: reqwest::Client, task: Arc<A2aTask>, mut queue: mpsc::Receiver<Value>) {
    while let Some(event) = queue.recv().await {
        for config in task.push_configs() {
            let mut request = http
                .post(&config.url)
                .header("content-type", "application/a2a+json")
                .body(event.to_string());
            if let Some(token) = &config.token {
                request = request.header("X-A2A-Notification-Token", token);
            }
            if let Some(auth) = &config.authentication {
                let value = match &auth.credentials {
                    Some(credentials) => format!("{} {credentials}", auth.scheme),
                    None => auth.scheme.clone(),
                };
                request = request.header("authorization", value);
            }
            let outcome = request.send().await;
            let failed = match &outcome {
                Ok(response) if response.status().is_success() => None,
                Ok(response) => Some(format!("answered {}", response.status())),
                Err(err) => Some(crate::redact::request_error(err)),
            };
            if let Some(why) = failed {
                let origin = crate::redact::origin(&config.url);
                run_log!(
                    Warn,
                    RunTag::session(&task.key),
                    "A2A push to {origin}: {why}"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> View {
        View {
            state: TaskState::Working,
            message: Value::Null,
            updated_ms: 0,
            artifacts: Vec::new(),
            dropped_artifacts: 0,
            history: VecDeque::new(),
            pause: None,
            followed: true,
        }
    }

    #[test]
    fn artifacts_are_bounded_in_number_and_size() {
        let mut view = view();
        for n in 0..MAX_ARTIFACTS + 3 {
            artifact(
                &mut view,
                format!("a{n}"),
                "t".into(),
                "x".into(),
                Map::new(),
                false,
            );
        }
        assert_eq!(view.artifacts.len(), MAX_ARTIFACTS);
        assert_eq!(view.dropped_artifacts, 3);

        let mut view = self::view();
        let big = "é".repeat(MAX_ARTIFACT_BYTES);
        artifact(&mut view, "big".into(), "t".into(), big, Map::new(), false);
        let kept = view.artifacts[0]["parts"][0]["text"]
            .as_str()
            .unwrap()
            .len();
        assert!(kept <= MAX_ARTIFACT_BYTES && kept > MAX_ARTIFACT_BYTES - 2);
        // Streamed content stops growing at the bound.
        let id = "answer".to_owned();
        artifact(
            &mut view,
            id.clone(),
            "a".into(),
            "y".repeat(10),
            Map::new(),
            true,
        );
        let grown = artifact(
            &mut view,
            id.clone(),
            "a".into(),
            "z".repeat(10),
            Map::new(),
            true,
        );
        assert!(grown.is_some_and(|(_, appended)| appended));
        let over = artifact(
            &mut view,
            id,
            "a".into(),
            "w".repeat(MAX_ARTIFACT_BYTES),
            Map::new(),
            true,
        );
        assert!(over.is_none());
    }

    #[test]
    fn history_keeps_the_latest_messages() {
        let mut history = VecDeque::new();
        for n in 0..MAX_HISTORY + 5 {
            push_history(&mut history, Value::from(n));
        }
        assert_eq!(history.len(), MAX_HISTORY);
        assert_eq!(history[0], Value::from(5));
    }

    #[tokio::test]
    async fn a_full_registry_makes_room_only_from_ended_tasks() {
        let mut inner = Inner::default();
        let key = SessionKey::new(None, "s");
        let working = Arc::new(A2aTask::new(key.clone(), Value::Null));
        let ended = Arc::new(A2aTask::new(key, Value::Null));
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
