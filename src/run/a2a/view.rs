//! What an A2A task looks like to A2A ([`View`]): its state and status
//! message, its artifacts (bounded in number and size) and its history
//! (the latest messages), kept by [`super::A2aTask`].

use std::collections::VecDeque;

use serde_json::{json, Map, Value};

use crate::protocol::a2a::TaskState;

/// Most artifacts one task holds (later outputs replace nothing: they are
/// dropped, and the task's metadata says so).
pub const MAX_ARTIFACTS: usize = 256;
/// Largest artifact text, in bytes (streamed content stops growing there).
pub const MAX_ARTIFACT_BYTES: usize = 64 * 1024;
/// Most messages a task's history keeps (the latest).
pub const MAX_HISTORY: usize = 32;

/// A task as A2A sees it.
pub(super) struct View {
    pub(super) state: TaskState,
    pub(super) message: Value,
    pub(super) updated_ms: u64,
    pub(super) artifacts: Vec<Value>,
    pub(super) dropped_artifacts: usize,
    pub(super) history: VecDeque<Value>,
    /// The pause it waits on (its `confirmation_id`).
    pub(super) pause: Option<String>,
    /// The last pause it waited on (kept after it was decided), and when
    /// the task began (ms since the Unix epoch): what tells its run's kept
    /// outcome from another run's.
    pub(super) last_pause: Option<String>,
    pub(super) began_ms: u64,
    /// Its run's stream is followed (else its end is read from the run's
    /// kept outcome).
    pub(super) followed: bool,
}

/// The task's status: its state, its message, when.
pub(super) fn status(view: &View) -> Value {
    json!({
        "state": view.state.as_str(),
        "message": view.message,
        "timestamp": crate::clock::rfc3339_ms(view.updated_ms),
    })
}

pub(super) fn push_history(history: &mut VecDeque<Value>, message: Value) {
    if history.len() >= MAX_HISTORY {
        history.pop_front();
    }
    history.push_back(message);
}

/// Adds (or appends to) the artifact `id`: what the update carries (the
/// whole artifact, or the appended part) and whether it appends; `None`
/// when the task holds its most artifacts, or the text its most bytes.
pub(super) fn artifact(
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
            last_pause: None,
            began_ms: 0,
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
}
