//! A run's chunks as AG-UI events, for one AG-UI run: it starts with
//! `RUN_STARTED` and ends at the run's end (`RUN_FINISHED` success or
//! cancelled, `RUN_ERROR`) or at its next pause (`RUN_FINISHED` with the
//! pause's interrupts). Content is a text message, a planner's `status`
//! steps are steps, a task that runs is a tool call with its result.

use std::collections::HashSet;

use serde_json::{json, Map, Value};

use super::interrupts::interrupts;
use super::task_interrupt_id;
use super::{Event, Outcome};
use crate::protocol::{meta, Chunk, ChunkType, PauseData};

/// One AG-UI run's view of a chatgate run.
#[derive(Debug)]
pub struct Translator {
    thread_id: String,
    run_id: String,
    /// The text message being streamed, and how many were opened.
    message: Option<String>,
    messages: u32,
    /// The open step's name.
    step: Option<String>,
    /// The tasks of the pause being resumed (their tool calls were sent
    /// with the interrupt, so only their results are sent now), and its id.
    announced: HashSet<String>,
    pause: Option<(String, Vec<usize>)>,
    ended: bool,
}

impl Translator {
    pub fn new(thread_id: &str, run_id: &str) -> Translator {
        Translator {
            thread_id: thread_id.to_owned(),
            run_id: run_id.to_owned(),
            message: None,
            messages: 0,
            step: None,
            announced: HashSet::new(),
            pause: None,
            ended: false,
        }
    }

    /// A run that resumes the pause `confirmation_id` of `tasks`: its
    /// tasks' tool calls were announced by the run it ended.
    pub fn resuming(mut self, confirmation_id: &str, tasks: &[usize]) -> Translator {
        for index in tasks {
            self.announced.insert(format!("{confirmation_id}-t{index}"));
        }
        self.pause = Some((confirmation_id.to_owned(), tasks.to_vec()));
        self
    }

    /// `RUN_STARTED`.
    pub fn started(&self) -> Event {
        Event::RunStarted {
            thread_id: self.thread_id.clone(),
            run_id: self.run_id.clone(),
        }
    }

    /// Its thread and run ids.
    pub fn ids(&self) -> (String, String) {
        (self.thread_id.clone(), self.run_id.clone())
    }

    /// Whether the AG-UI run has ended (its last event was written).
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// The events `chunk` makes.
    pub fn chunk(&mut self, chunk: &Chunk) -> Vec<Event> {
        let mut out = Vec::new();
        if self.ended {
            return out;
        }
        match chunk.chunk_type {
            ChunkType::Content => self.content(&chunk.chunk, &mut out),
            ChunkType::Status => {
                if chunk.metadata.get(meta::STEP).is_some() {
                    self.close_text(&mut out);
                    self.close_step(&mut out);
                    self.step = Some(chunk.chunk.clone());
                    out.push(Event::StepStarted {
                        step_name: chunk.chunk.clone(),
                    });
                }
            }
            ChunkType::ToolOutput => self.tool_output(chunk, &mut out),
            ChunkType::ConfirmationRequest | ChunkType::InputRequest => {
                if let Some(pause) = &chunk.confirmation_data {
                    let open = open_tasks(pause);
                    out.extend(self.interrupted(pause, &open));
                }
            }
            ChunkType::Completion => {
                let mut result = chunk.metadata.clone();
                result.insert("summary".into(), json!(chunk.chunk));
                self.finish(
                    Outcome::Success,
                    Some(Value::Object(result)),
                    None,
                    &mut out,
                );
            }
            ChunkType::Cancelled => {
                let why = chunk.metadata.clone();
                self.finish(Outcome::Cancelled, None, Some(why), &mut out);
            }
            ChunkType::Error => {
                self.close_all(&mut out);
                let code = chunk
                    .metadata
                    .get(meta::ERROR_TYPE)
                    .and_then(Value::as_str)
                    .unwrap_or("internal");
                out.push(Event::error(code, chunk.chunk.clone()));
                self.ended = true;
            }
            ChunkType::TaskInit
            | ChunkType::ConfirmationReceived
            | ChunkType::ApprovalRecorded
            | ChunkType::DecisionRecorded => {}
        }
        out
    }

    /// The run ends at `pause`: its open tasks' tool calls (not sent
    /// before), then `RUN_FINISHED` with its interrupts (`open`: the
    /// tasks still waiting).
    pub fn interrupted(&mut self, pause: &PauseData, open: &[usize]) -> Vec<Event> {
        let mut out = Vec::new();
        self.close_all(&mut out);
        let tasks = pause.tasks_one_by_one();
        for task in tasks.iter().filter(|t| open.contains(&t.index)) {
            let id = task_interrupt_id(pause.confirmation_id(), task);
            if !self.announced.insert(id.clone()) {
                continue;
            }
            let args = task.args.clone().unwrap_or(json!({}));
            out.push(Event::ToolCallStart {
                tool_call_id: id.clone(),
                tool_call_name: task.tool.clone(),
            });
            out.push(Event::ToolCallArgs {
                tool_call_id: id.clone(),
                delta: args.to_string(),
            });
            out.push(Event::ToolCallEnd { tool_call_id: id });
        }
        let interrupts = interrupts(pause, open);
        self.finish(Outcome::Interrupt { interrupts }, None, None, &mut out);
        out
    }

    /// The stream ended without the run's end (the server is restarting,
    /// another client took the run's stream over): `RUN_ERROR`.
    pub fn cut_short(&mut self) -> Vec<Event> {
        let mut out = Vec::new();
        if self.ended {
            return out;
        }
        self.close_all(&mut out);
        out.push(Event::error(
            "shutting_down",
            "the run's stream ended before the run did (the server is restarting, or another \
             client took the run's stream over); the run goes on: GET /api/v1/runs/<threadId> \
             has its outcome once it ends",
        ));
        self.ended = true;
        out
    }

    fn content(&mut self, text: &str, out: &mut Vec<Event>) {
        if text.is_empty() {
            return;
        }
        self.close_step(out);
        let id = match &self.message {
            Some(id) => id.clone(),
            None => {
                self.messages += 1;
                let id = format!("{}-m{}", self.run_id, self.messages);
                out.push(Event::TextMessageStart {
                    message_id: id.clone(),
                    role: "assistant",
                });
                self.message = Some(id.clone());
                id
            }
        };
        out.push(Event::TextMessageContent {
            message_id: id,
            delta: text.to_owned(),
        });
    }

    fn tool_output(&mut self, chunk: &Chunk, out: &mut Vec<Event>) {
        self.close_text(out);
        let step = chunk.metadata.get(meta::STEP).and_then(Value::as_u64);
        let tool = chunk
            .metadata
            .get(meta::TOOL)
            .and_then(Value::as_str)
            .unwrap_or("task");
        let id = match (&self.pause, step) {
            (Some((cid, tasks)), Some(step)) if tasks.contains(&(step as usize)) => {
                format!("{cid}-t{step}")
            }
            (_, Some(step)) => format!("{}-s{step}", self.run_id),
            (_, None) => format!("{}-c{}", self.run_id, chunk.sequence),
        };
        if self.announced.insert(id.clone()) {
            out.push(Event::ToolCallStart {
                tool_call_id: id.clone(),
                tool_call_name: tool.to_owned(),
            });
            out.push(Event::ToolCallEnd {
                tool_call_id: id.clone(),
            });
        }
        let content = ["result", "error"]
            .iter()
            .find_map(|key| chunk.metadata.get(*key).and_then(Value::as_str))
            .unwrap_or(&chunk.chunk);
        out.push(Event::ToolCallResult {
            message_id: format!("{id}-result"),
            tool_call_id: id,
            content: content.to_owned(),
            role: "tool",
        });
        self.close_step(out);
    }

    fn finish(
        &mut self,
        outcome: Outcome,
        result: Option<Value>,
        metadata: Option<Map<String, Value>>,
        out: &mut Vec<Event>,
    ) {
        self.close_all(out);
        out.push(Event::RunFinished {
            thread_id: self.thread_id.clone(),
            run_id: self.run_id.clone(),
            result,
            outcome,
            metadata,
        });
        self.ended = true;
    }

    fn close_text(&mut self, out: &mut Vec<Event>) {
        if let Some(message_id) = self.message.take() {
            out.push(Event::TextMessageEnd { message_id });
        }
    }

    fn close_step(&mut self, out: &mut Vec<Event>) {
        if let Some(step_name) = self.step.take() {
            out.push(Event::StepFinished { step_name });
        }
    }

    fn close_all(&mut self, out: &mut Vec<Event>) {
        self.close_text(out);
        self.close_step(out);
    }
}

/// The tasks a pause asks when it is sent: every one is pending
/// (questions and a reconcile pause have no task list).
pub fn open_tasks(pause: &PauseData) -> Vec<usize> {
    pause
        .tasks_one_by_one()
        .iter()
        .map(|task| task.index)
        .collect()
}
