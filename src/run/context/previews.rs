//! The previews of a plan's calls (#43), run before it is put to the
//! person: each task whose tool declares a preview shows what it would do,
//! and its digest is what an approval of it names.

use futures_util::stream::{self, StreamExt};
use serde_json::Value;

use super::cleared::{Cleared, Previewed};
use super::RunContext;
use crate::protocol::{TaskPreview, TaskSpec};
use crate::receipt::preview_digest;
use crate::tools::outcome::Changed;
use crate::tools::preview::{cut_to, Shown, MAX_PREVIEW_BYTES};
use crate::tools::Tool;

/// Most previews of one pause that run at once.
pub const MAX_PREVIEWS_IN_FLIGHT: usize = 4;
/// Most bytes of one pause's previews together: a later task's body is cut
/// to what is left (`truncated`).
pub const MAX_PREVIEW_BYTES_PER_PAUSE: usize = 256 * 1024;

impl RunContext {
    /// Notes what the plan about to be asked (or restored) shows of each
    /// task's preview: its digest, by index.
    pub(super) fn note_previews(&mut self, tasks: &[TaskSpec]) {
        self.previewed = tasks
            .iter()
            .filter_map(|task| {
                let preview = task.preview.as_ref()?;
                Some(Previewed {
                    index: task.index,
                    digest: preview.digest.clone(),
                    cut_at: if preview.truncated {
                        preview.body.len()
                    } else {
                        MAX_PREVIEW_BYTES
                    },
                })
            })
            .collect();
    }

    /// The digest of task `index`'s preview in the latest plan asked.
    pub(super) fn previewed(&self, index: usize) -> Option<&str> {
        self.previewed
            .iter()
            .find(|shown| shown.index == index)
            .map(|shown| shown.digest.as_str())
    }

    /// With `recheck`, just before a call a person approved runs: its
    /// preview runs again, and a digest other than the one approved is the
    /// change that stops the call.
    pub(super) async fn rechecked(
        &self,
        index: usize,
        tool: &Tool,
        args: &Value,
        cleared: &Cleared,
    ) -> Option<Changed> {
        if !tool.recheck || *cleared != Cleared::Person {
            return None;
        }
        let approved = self.previewed.iter().find(|shown| shown.index == index)?;
        let preview = tool.preview.as_ref()?;
        let stop = self.stop.clone();
        let stopped = async move {
            stop.stopped().await;
        };
        let shown = preview.run(args, stopped, Some(&self.tag())).await;
        let (body, _) = cut_to(&shown.body, approved.cut_at);
        let current = preview_digest(&tool.name, args, body);
        (current != approved.digest).then(|| Changed {
            approved_digest: approved.digest.clone(),
            current_digest: current,
        })
    }

    /// Whether a task of `tasks` calls a tool with a preview (a plan
    /// without any costs no more than before previews).
    pub(super) fn previews_asked(&self, tasks: &[TaskSpec]) -> bool {
        let tools = self.tools();
        tasks
            .iter()
            .any(|task| tools.get(&task.tool).is_some_and(|t| t.preview.is_some()))
    }

    /// Runs the previews of `tasks` whose tool has one, at most
    /// [`MAX_PREVIEWS_IN_FLIGHT`] at a time, each within its
    /// `preview_timeout` (a stop of the run stops them), and puts each on
    /// its task.
    pub(super) async fn preview_tasks(&self, tasks: &mut [TaskSpec]) {
        let tools = self.tools().clone();
        let tag = self.tag();
        let wanted: Vec<(usize, String, Value)> = tasks
            .iter()
            .enumerate()
            .filter(|(_, task)| tools.get(&task.tool).is_some_and(|t| t.preview.is_some()))
            .map(|(at, task)| {
                (
                    at,
                    task.tool.clone(),
                    task.args.clone().unwrap_or(Value::Null),
                )
            })
            .collect();
        if wanted.is_empty() {
            return;
        }
        let shown: Vec<(usize, Shown)> = stream::iter(wanted)
            .map(|(at, tool, args)| {
                let (tools, stop, tag) = (tools.clone(), self.stop.clone(), tag.clone());
                async move {
                    let Some(preview) = tools.get(&tool).and_then(|t| t.preview.as_ref()) else {
                        return (
                            at,
                            Shown {
                                ok: false,
                                body: String::new(),
                                truncated: false,
                            },
                        );
                    };
                    let stopped = async move {
                        stop.stopped().await;
                    };
                    (at, preview.run(&args, stopped, Some(&tag)).await)
                }
            })
            .buffered(MAX_PREVIEWS_IN_FLIGHT)
            .collect()
            .await;
        let mut left = MAX_PREVIEW_BYTES_PER_PAUSE;
        for (at, shown) in shown {
            let task = &mut tasks[at];
            let (body, cut) = cut_to(&shown.body, left);
            left -= body.len();
            let args = task.args.clone().unwrap_or(Value::Null);
            task.preview = Some(TaskPreview {
                ok: shown.ok,
                digest: preview_digest(&task.tool, &args, body),
                body: body.to_owned(),
                truncated: shown.truncated || cut,
            });
        }
    }
}
