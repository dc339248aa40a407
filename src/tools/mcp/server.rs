//! One MCP server: its process, its connection, its restarts, its calls.

use crate::session::{run_log, RunTag};
use std::collections::HashSet;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, CallToolResult, PaginatedRequestParams};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::ServiceExt;

use crate::tools::stamp::Stamp;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, ReadBuf};
use tokio::process::{Child, ChildStdout};
use tokio::sync::{mpsc, Notify};

use super::client::{Asker, Elicitation, Handler};
#[cfg(feature = "openai")]
use super::http;
use crate::protocol::RiskLevel;
use crate::tools::keeper;
use crate::tools::outcome::{CappedOutput, ToolOutcome};

/// Most bytes of one message from a server (one line on stdio): a longer
/// one is dropped unread, and the call in flight fails saying so.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
/// Most tools one server may offer (its list is refused past it).
pub const MAX_TOOLS: usize = 128;
/// Most bytes of one tool's input schema, as JSON.
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;
/// Characters of a tool's description kept (the rest is cut).
pub const MAX_DESCRIPTION_CHARS: usize = 4 * 1024;
/// Pages of a tool list read at most.
pub const MAX_LIST_PAGES: usize = 16;
/// How long spawning, initializing and listing a server may take.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
/// First wait before restarting a server that exited.
pub const RESTART_BACKOFF: Duration = Duration::from_secs(1);
/// Longest wait between restarts.
pub const MAX_RESTART_BACKOFF: Duration = Duration::from_secs(60);

/// The outcome of a call that ran past its `timeout_secs`.
pub fn timed_out(started: Instant, timeout: Duration) -> ToolOutcome {
    ToolOutcome::failed(
        started,
        format!("timed out after {}", humantime::format_duration(timeout)),
    )
}

/// The outcome of a call its run stopped.
pub fn stopped(started: Instant) -> ToolOutcome {
    ToolOutcome::failed(started, "stopped: the run was stopped".to_owned())
}

type Service = RunningService<RoleClient, Handler>;

/// Most bytes of one stderr line of a server that go to chatgate's log.
const MAX_STDERR_LINE: usize = 1024;

/// A tool as a server lists it.
#[derive(Debug, Clone)]
pub struct Listed {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
    /// From its annotations: `readOnlyHint` low, `destructiveHint` high.
    pub risk: Option<RiskLevel>,
}

/// How a server is reached.
#[derive(Debug, Clone)]
pub enum Reach {
    /// A process chatgate spawns, spoken to on its stdio.
    Stdio {
        argv: Vec<String>,
        env: Vec<String>,
        cwd: Option<PathBuf>,
    },
    /// Streamable HTTP at `url`, with these headers on every request.
    #[cfg(feature = "openai")]
    Http {
        url: String,
        headers: Vec<(reqwest::header::HeaderName, secrecy::SecretString)>,
    },
}

/// One running (or restarting) MCP server.
pub struct McpServer {
    pub name: String,
    reach: Reach,
    /// The connection; `None` while the server is down.
    link: RwLock<Option<Arc<Service>>>,
    /// One call at a time (see the module docs of `mcp`).
    calls: tokio::sync::Mutex<()>,
    /// Woken when a call on the current connection was abandoned: the
    /// supervisor kills the process (stdio), so that what the server still
    /// does for that call reaches no later one.
    abandoned: Notify,
    /// The names the server lists now (re-read when it says they changed).
    listed: RwLock<HashSet<String>>,
    /// Woken when a message over [`MAX_MESSAGE_BYTES`] arrives.
    oversized: Arc<Notify>,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.name)
            .field("reach", &self.reach)
            .finish_non_exhaustive()
    }
}

/// A server's tool as a declared tool's executor.
#[derive(Debug, Clone)]
pub struct McpTool {
    pub server: Arc<McpServer>,
    /// The tool's name on the server.
    pub tool: String,
}

impl McpServer {
    /// Spawns, initializes and lists the server; then keeps it running (a
    /// task restarts it when it exits). The error is one line.
    pub async fn start(
        name: String,
        reach: Reach,
    ) -> Result<(Arc<McpServer>, Vec<Listed>), String> {
        let server = Arc::new(McpServer {
            name,
            reach,
            link: RwLock::new(None),
            calls: tokio::sync::Mutex::new(()),
            abandoned: Notify::new(),
            listed: RwLock::new(HashSet::new()),
            oversized: Arc::new(Notify::new()),
        });
        let started = tokio::time::timeout(START_TIMEOUT, async {
            let (service, child) = server.connect().await?;
            let tools = list(&service).await?;
            Ok::<_, String>((service, child, tools))
        })
        .await
        .map_err(|_| {
            format!(
                "it did not start, initialize and list its tools within {}",
                humantime::format_duration(START_TIMEOUT)
            )
        })?;
        let (service, child, tools) = started?;
        server.keep(service, &tools);
        tokio::spawn(server.clone().supervise(child));
        Ok((server, tools))
    }

    /// Whether the server is up (its tools can be called).
    pub fn is_running(&self) -> bool {
        self.service().is_some()
    }

    fn service(&self) -> Option<Arc<Service>> {
        self.link.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn keep(&self, service: Arc<Service>, tools: &[Listed]) {
        *self.listed.write().unwrap_or_else(|p| p.into_inner()) =
            tools.iter().map(|t| t.name.clone()).collect();
        *self.link.write().unwrap_or_else(|p| p.into_inner()) = Some(service);
    }

    /// Connects and initializes: spawns the process (through the keeper, in
    /// a group of its own, with `PATH` and the named variables only) for
    /// stdio, or opens a streamable HTTP session. Each connection has an
    /// asker of its own: a question on an old one reaches no call of a new one.
    async fn connect(&self) -> Result<(Arc<Service>, Option<Child>), String> {
        let handler = Handler {
            server: self.name.clone(),
            asker: Arc::new(Asker::default()),
        };
        let (argv, env, cwd) = match &self.reach {
            Reach::Stdio { argv, env, cwd } => (argv, env, cwd),
            #[cfg(feature = "openai")]
            Reach::Http { url, headers } => {
                let service = http::connect(handler, url, headers, MAX_MESSAGE_BYTES).await?;
                return Ok((Arc::new(service), None));
            }
        };
        let program = &argv[0];
        let mut child = keeper::command(argv, env, cwd.as_deref())
            .spawn()
            .map_err(|err| format!("cannot start `{program}`: {err}"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("its stdio could not be set up".to_owned());
        };
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(log_stderr(self.name.clone(), stderr));
        }
        let watched = Watched {
            inner: stdout,
            line: 0,
            oversized: self.oversized.clone(),
        };
        let transport = AsyncRwTransport::<RoleClient, _, _>::new(watched, stdin)
            .with_max_line_length(MAX_MESSAGE_BYTES);
        let service = handler
            .serve(transport)
            .await
            .map_err(|err| format!("it did not initialize: {err}"))?;
        Ok((Arc::new(service), Some(child)))
    }

    /// Until the connection ends: the process exits (stdio), or the session
    /// closes (HTTP; looked at once a second).
    async fn until_gone(&self, child: &mut Option<Child>) -> String {
        if let Some(child) = child {
            let how = tokio::select! {
                exited = child.wait() => exited,
                () = self.abandoned.notified() => {
                    // The keeper: killed, it takes the server with it.
                    let _ = child.start_kill();
                    child.wait().await
                }
            };
            return match how {
                Ok(status) => status.to_string(),
                Err(err) => err.to_string(),
            };
        }
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            match self.service() {
                Some(service) if !service.is_closed() => {}
                _ => return "its session closed".to_owned(),
            }
        }
    }

    /// Restarts the server each time it exits, with a doubling backoff (reset
    /// after a minute up). Runs as long as chatgate.
    async fn supervise(self: Arc<Self>, mut child: Option<Child>) {
        let mut backoff = RESTART_BACKOFF;
        let mut up_since = Instant::now();
        loop {
            let how = self.until_gone(&mut child).await;
            let old = self.link.write().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(old) = old {
                old.cancellation_token().cancel();
            }
            if up_since.elapsed() > MAX_RESTART_BACKOFF {
                backoff = RESTART_BACKOFF;
            }
            log::warn!(
                "MCP server {} is gone ({how}); its tools fail until it is back",
                self.name
            );
            loop {
                log::info!(
                    "MCP server {}: restarting in {}",
                    self.name,
                    humantime::format_duration(backoff)
                );
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_RESTART_BACKOFF);
                let restarted = tokio::time::timeout(START_TIMEOUT, async {
                    let (service, child) = self.connect().await?;
                    let tools = list(&service).await?;
                    Ok::<_, String>((service, child, tools))
                })
                .await
                .unwrap_or_else(|_| Err("it did not start in time".to_owned()));
                match restarted {
                    Ok((service, new_child, tools)) => {
                        self.keep(service, &tools);
                        child = new_child;
                        up_since = Instant::now();
                        log::info!("MCP server {} is back", self.name);
                        break;
                    }
                    Err(err) => log::warn!("MCP server {}: restart failed: {err}", self.name),
                }
            }
        }
    }

    /// Calls `tool` with `args` (already checked and confirmed). Questions the
    /// server asks meanwhile go to `asks`, its progress to `progress`. No
    /// timeout here: the run's loop keeps it (and stops counting while a
    /// person is asked); dropping this future cancels the call
    /// (`notifications/cancelled`).
    pub async fn call(
        &self,
        tool: &str,
        args: &Value,
        stamp: Stamp<'_>,
        asks: mpsc::Sender<Elicitation>,
        progress: mpsc::Sender<String>,
        tag: Option<&RunTag>,
    ) -> ToolOutcome {
        let started = Instant::now();
        let _turn = self.calls.lock().await;
        let Some(service) = self.service() else {
            return ToolOutcome::failed(
                started,
                format!("MCP server {} is not running", self.name),
            );
        };
        let asker = service.service().asker.clone();
        if asker.take_list_changed() {
            match list(&service).await {
                Ok(tools) => self.keep(service.clone(), &tools),
                Err(err) => log::warn!("MCP server {}: {err}", self.name),
            }
        }
        let listed = self
            .listed
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(tool);
        if !listed {
            return ToolOutcome::failed(
                started,
                format!("MCP server {} no longer offers `{tool}`", self.name),
            );
        }
        asker.set(asks, progress, tag);
        let mut in_flight = InFlight {
            server: self,
            service: &service,
            asker: &asker,
            answered: false,
            tag,
        };
        let oversized = self.oversized.notified();
        let mut params = CallToolRequestParams::new(tool.to_owned())
            .with_arguments(args.as_object().cloned().unwrap_or_default());
        let mut meta = rmcp::model::MetaObject::new();
        for (name, value) in stamp.meta() {
            meta.0.insert(name.to_owned(), Value::from(value));
        }
        if !meta.0.is_empty() {
            params.meta = Some(rmcp::model::RequestMetaObject(meta));
        }
        let result = tokio::select! {
            result = service.call_tool(params) => result,
            () = oversized => {
                // It answered, too much: nothing of the call is left to come.
                in_flight.answered = true;
                return ToolOutcome::failed(started, format!(
                    "the server's reply was over {} MiB and was dropped",
                    MAX_MESSAGE_BYTES / (1024 * 1024)
                ));
            }
        };
        in_flight.answered = true;
        match result {
            Ok(result) => outcome(started, &result),
            Err(ServiceError::McpError(err)) => ToolOutcome::failed(
                started,
                format!("MCP error {}: {}", err.code.0, err.message),
            ),
            Err(ServiceError::TransportClosed | ServiceError::TransportSend(_)) => {
                // Down from now on (readiness, the next calls), not only
                // once the supervisor has reaped the process.
                self.unlink(&service);
                let how = match self.reach {
                    Reach::Stdio { .. } => "exited during the call",
                    #[cfg(feature = "openai")]
                    Reach::Http { .. } => "could not be reached during the call",
                };
                ToolOutcome::failed(started, format!("MCP server {} {how}", self.name))
            }
            Err(err) => ToolOutcome::failed(started, format!("MCP call failed: {err}")),
        }
    }
}

impl McpServer {
    /// Takes `service` out of use if it is the current connection; whether
    /// it was.
    fn unlink(&self, service: &Arc<Service>) -> bool {
        let mut link = self.link.write().unwrap_or_else(|p| p.into_inner());
        let current = link.as_ref().is_some_and(|now| Arc::ptr_eq(now, service));
        if current {
            *link = None;
        }
        current
    }
}

/// A call on the wire. When it ends, however it ends, its asker is cleared
/// (a question or progress that comes later belongs to no call: declined,
/// dropped). When it ends before the server answered (its timeout, a stop,
/// a question cancelled past the grace), the server may still be working on
/// it and ask a question later, which must not reach the next call, another
/// run of perhaps another key: the connection is retired (closed, a stdio
/// server killed) and the supervisor starts a fresh one.
struct InFlight<'a> {
    server: &'a McpServer,
    service: &'a Arc<Service>,
    asker: &'a Asker,
    answered: bool,
    /// Who its log lines are about.
    tag: Option<&'a RunTag>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.asker.clear();
        if self.answered {
            return;
        }
        run_log!(
            Warn,
            self.tag,
            "MCP server {}: a call was given up before the server answered; \
                 restarting it, so that nothing it still does for that call reaches another",
            self.server.name
        );
        if self.server.unlink(self.service) {
            self.service.cancellation_token().cancel();
            self.server.abandoned.notify_one();
        }
    }
}

/// The server's tools, bounded: [`MAX_TOOLS`], [`MAX_LIST_PAGES`],
/// [`MAX_SCHEMA_BYTES`] per schema; descriptions cut to
/// [`MAX_DESCRIPTION_CHARS`].
async fn list(service: &Service) -> Result<Vec<Listed>, String> {
    let mut tools = Vec::new();
    let mut cursor = None;
    for _ in 0..MAX_LIST_PAGES {
        let page = service
            .list_tools(Some(PaginatedRequestParams::default().with_cursor(cursor)))
            .await
            .map_err(|err| format!("it did not list its tools: {err}"))?;
        for tool in page.tools {
            if tools.len() == MAX_TOOLS {
                return Err(format!("it offers more than {MAX_TOOLS} tools"));
            }
            let input_schema = Value::Object((*tool.input_schema).clone());
            let bytes = serde_json::to_vec(&input_schema).map_or(usize::MAX, |v| v.len());
            if bytes > MAX_SCHEMA_BYTES {
                return Err(format!(
                    "tool `{}`: its input schema is {bytes} bytes; at most {MAX_SCHEMA_BYTES}",
                    tool.name
                ));
            }
            let hints = tool.annotations.as_ref();
            let risk = if hints.and_then(|a| a.destructive_hint) == Some(true) {
                Some(RiskLevel::High)
            } else if hints.and_then(|a| a.read_only_hint) == Some(true) {
                Some(RiskLevel::Low)
            } else {
                None
            };
            tools.push(Listed {
                name: tool.name.to_string(),
                description: tool
                    .description
                    .as_deref()
                    .unwrap_or("")
                    .chars()
                    .take(MAX_DESCRIPTION_CHARS)
                    .collect(),
                input_schema,
                risk,
            });
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(tools),
        }
    }
    Err(format!(
        "its tool list has more than {MAX_LIST_PAGES} pages"
    ))
}

/// A call's result as an outcome: its text content (capped like a command's
/// output), `ok: false` for `isError`.
fn outcome(started: Instant, result: &CallToolResult) -> ToolOutcome {
    let mut out = CappedOutput::default();
    let mut first = true;
    for block in &result.content {
        let block = serde_json::to_value(block).unwrap_or_default();
        let text = match block.get("type").and_then(Value::as_str) {
            Some("text") => block
                .get("text")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            Some(other) => {
                let mime = block.get("mimeType").and_then(Value::as_str).unwrap_or("");
                format!("[{other} {mime}]")
            }
            None => continue,
        };
        if !first {
            out.push(b"\n");
        }
        first = false;
        out.push(text.as_bytes());
    }
    if first {
        if let Some(structured) = &result.structured_content {
            out.push(structured.to_string().as_bytes());
        }
    }
    let ok = result.is_error != Some(true);
    let text = out.text();
    ToolOutcome {
        ok,
        skipped: false,
        truncated: out.truncated(),
        result: ok.then(|| text.clone()),
        error: (!ok).then_some(text),
        duration_ms: started.elapsed().as_millis() as u64,
        exit_status: None,
        http_status: None,
        output_bytes: out.total,
        changed: None,
    }
}

/// Logs a server's stderr, line by line, each cut to [`MAX_STDERR_LINE`].
async fn log_stderr(server: String, stderr: tokio::process::ChildStderr) {
    let mut lines = tokio::io::BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        line.clear();
        // `take` bounds one read; the rest of a long line is the next one.
        let mut limited = (&mut lines).take(MAX_STDERR_LINE as u64);
        match limited.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let text = String::from_utf8_lossy(&line);
                log::info!("MCP server {server}: {}", text.trim_end());
            }
        }
    }
}

/// The server's stdout, watched for a line over [`MAX_MESSAGE_BYTES`] (rmcp
/// drops such a line; this tells the call in flight).
struct Watched {
    inner: ChildStdout,
    /// Bytes of the current line so far.
    line: usize,
    oversized: Arc<Notify>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let new = &buf.filled()[before..];
            let (longest, line) = match (memchr::memchr(b'\n', new), memchr::memrchr(b'\n', new)) {
                // A line ended here: it was `self.line + first` long. (A
                // whole line inside one read is shorter than the read.)
                (Some(first), Some(last)) => (self.line + first, new.len() - last - 1),
                _ => (self.line + new.len(), self.line + new.len()),
            };
            // Once per line: when it crosses the bound.
            if self.line <= MAX_MESSAGE_BYTES && longest > MAX_MESSAGE_BYTES {
                self.oversized.notify_waiters();
            }
            self.line = line;
        }
        polled
    }
}
