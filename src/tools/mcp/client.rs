//! chatgate's side of one MCP connection: what it declares (elicitation,
//! nothing else) and how it answers what a server asks.
//!
//! - `elicitation/create` (and the elicitations of an `input_required`
//!   result, which rmcp's `call_tool` routes here too) go to the call in
//!   flight on that server ([`Asker`]), whose run asks the person and
//!   replies through a oneshot. No call in flight, or a question already
//!   pending (one at a time per server): declined. A URL elicitation is declined (not declared).
//! - `sampling/createMessage` and `roots/list` are refused with a JSON-RPC
//!   error (rmcp's default for sampling: method not found): chatgate lends a
//!   server neither its model nor its filesystem.
//! - `notifications/tools/list_changed` is counted ([`Asker::take_list_changed`]):
//!   the server's tools are read again before its next call. Log messages
//!   go to chatgate's log (cut to 1 KiB); progress of the call in flight
//!   goes to its run, which shows it as `status` chunks.

use crate::session::{run_log, RunTag};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

#[allow(deprecated)]
use rmcp::model::ListRootsResult;
#[allow(deprecated)] // Logging: still what servers of 2025-11-25 send.
use rmcp::model::LoggingMessageNotificationParam;
use rmcp::model::{
    ClientCapabilities, ClientConfig, ElicitRequestParams, ElicitResult, ElicitationAction,
    ElicitationCapability, FormElicitationCapability, Implementation, ProgressNotificationParam,
    ProtocolVersion,
};
use rmcp::service::{NotificationContext, RequestContext, RoleClient};
use rmcp::{ClientHandler, ErrorData};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

/// Characters of a server's log message that go to chatgate's log.
const MAX_LOGGED_CHARS: usize = 1024;
/// Characters of a progress message shown on the stream.
const MAX_PROGRESS_CHARS: usize = 200;

/// A server's question, on its way to the run whose call it is about.
#[derive(Debug)]
pub struct Elicitation {
    pub message: String,
    /// The `requestedSchema`, as JSON.
    pub schema: Value,
    /// Its property names in the order the server wrote them.
    pub order: Vec<String>,
    pub reply: oneshot::Sender<ElicitResult>,
}

impl Elicitation {
    /// Answers the server (a reply to a call that ended meanwhile is dropped).
    pub fn answer(self, action: ElicitationAction, content: Option<Value>) {
        let result = ElicitResult::new(action);
        let result = match content {
            Some(content) => result.with_content(content),
            None => result,
        };
        let _ = self.reply.send(result);
    }
}

/// Where a server's questions go: the call in flight, if any.
#[derive(Debug, Default)]
pub struct Asker {
    call: Mutex<Option<mpsc::Sender<Elicitation>>>,
    /// Where the call in flight shows the server's progress.
    progress: Mutex<Option<mpsc::Sender<String>>>,
    list_changed: AtomicBool,
    /// A question is on its way to a person, or being asked.
    pending: AtomicBool,
    /// Who the call in flight's log lines are about (none: no call, or
    /// one outside a run).
    tag: Mutex<Option<RunTag>>,
}

/// Clears [`Asker::pending`] when a question is settled, however it ends.
struct Pending<'a>(&'a Asker);

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.0.pending.store(false, Ordering::SeqCst);
    }
}

impl Asker {
    /// From now until [`Asker::clear`], questions go to `to`, progress to
    /// `progress`.
    /// `tag`: the run the server's log lines during the call are about.
    pub fn set(
        &self,
        to: mpsc::Sender<Elicitation>,
        progress: mpsc::Sender<String>,
        tag: Option<&RunTag>,
    ) {
        *self.call.lock().unwrap_or_else(|p| p.into_inner()) = Some(to);
        *self.progress.lock().unwrap_or_else(|p| p.into_inner()) = Some(progress);
        *self.tag.lock().unwrap_or_else(|p| p.into_inner()) = tag.cloned();
    }

    pub fn clear(&self) {
        *self.call.lock().unwrap_or_else(|p| p.into_inner()) = None;
        *self.progress.lock().unwrap_or_else(|p| p.into_inner()) = None;
        *self.tag.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Who a log line about the call in flight is about (its run, if any).
    fn tag(&self) -> Option<RunTag> {
        self.tag.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether the server said its tools changed since the last call of
    /// this (which resets it).
    pub fn take_list_changed(&self) -> bool {
        self.list_changed.swap(false, Ordering::SeqCst)
    }

    fn current(&self) -> Option<mpsc::Sender<Elicitation>> {
        self.call.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The `ClientHandler` of one server.
#[derive(Debug, Clone)]
pub struct Handler {
    pub server: String,
    pub asker: Arc<Asker>,
}

fn declined() -> ElicitResult {
    ElicitResult::new(ElicitationAction::Decline)
}

impl ClientHandler for Handler {
    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let ElicitRequestParams::FormElicitationParams {
            message,
            requested_schema,
            ..
        } = request
        else {
            run_log!(
                Info,
                self.asker.tag().as_ref(),
                "MCP server {}: a URL elicitation, declined",
                self.server
            );
            return Ok(declined());
        };
        let Some(call) = self.asker.current() else {
            log::info!(
                "MCP server {}: a question with no call in flight, declined",
                self.server
            );
            return Ok(declined());
        };
        // One question at a time per server (and so per call): a second one
        // while the first is pending is declined, so a server cannot queue
        // up questions.
        if self.asker.pending.swap(true, Ordering::SeqCst) {
            run_log!(
                Info,
                self.asker.tag().as_ref(),
                "MCP server {}: a question while another is pending, declined",
                self.server
            );
            return Ok(declined());
        }
        let _pending = Pending(&self.asker);
        let (reply, answer) = oneshot::channel();
        let order = requested_schema
            .property_order
            .clone()
            .unwrap_or_else(|| requested_schema.properties.keys().cloned().collect());
        let elicitation = Elicitation {
            message,
            schema: serde_json::to_value(&requested_schema).unwrap_or_default(),
            order,
            reply,
        };
        if call.try_send(elicitation).is_err() {
            // The call ended meanwhile (its receiver is gone).
            return Ok(declined());
        }
        // The call ended without answering: the operation is cancelled.
        Ok(answer
            .await
            .unwrap_or_else(|_| ElicitResult::new(ElicitationAction::Cancel)))
    }

    // Sampling: rmcp's default refuses it (method not found).

    #[allow(deprecated)]
    async fn list_roots(
        &self,
        _context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        Err(ErrorData::invalid_request(
            "chatgate does not offer roots to MCP servers",
            None,
        ))
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let progress = self
            .asker
            .progress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let Some(progress) = progress else {
            return;
        };
        let mut text = match params.total {
            Some(total) => format!("{}/{}", params.progress, total),
            None => params.progress.to_string(),
        };
        if let Some(message) = params.message.as_deref().map(str::trim) {
            if !message.is_empty() {
                text.push_str(": ");
                text.extend(message.chars().take(MAX_PROGRESS_CHARS));
            }
        }
        // Full: the run is busy (asking, or showing the last one); this
        // one is dropped, the next one will say where the call is.
        let _ = progress.try_send(text);
    }

    #[allow(deprecated)]
    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let data = match &params.data {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        let data: String = data.chars().take(MAX_LOGGED_CHARS).collect();
        run_log!(
            Info,
            self.asker.tag().as_ref(),
            "MCP server {} ({:?}): {data}",
            self.server,
            params.level
        );
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.asker.list_changed.store(true, Ordering::SeqCst);
    }

    fn get_info(&self) -> ClientConfig {
        let mut elicitation = ElicitationCapability::new();
        elicitation.form = Some(FormElicitationCapability::default());
        let mut capabilities = ClientCapabilities::default();
        capabilities.elicitation = Some(elicitation);
        // Offered: 2025-11-25 (rmcp's default would be its newest, 2026-07-28,
        // whose `input_required` rounds docs/tools.md does not promise).
        ClientConfig::new(
            capabilities,
            Implementation::new("chatgate", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::V_2025_11_25)
    }
}
