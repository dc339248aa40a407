//! One call of an MCP server's tool, as a run makes it: the call runs until
//! its result, its `timeout_secs` (not counting the time a person takes to
//! answer the server's questions) or a stop; each question the server asks
//! meanwhile is put to a person through the [`CallHost`] (the run, which
//! asks on its stream), and the answer goes back to the server; the call's
//! progress is shown through it too. rmcp stays in this module's tree.

use crate::session::RunTag;
use std::future::Future;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use rmcp::model::ElicitationAction;
use serde_json::{Map, Value};
use tokio::sync::mpsc;

use super::client::Elicitation;
use super::{elicit, stopped, timed_out, McpTool};
use crate::protocol::question::Question;
use crate::tools::keeper::KILL_GRACE;
use crate::tools::outcome::ToolOutcome;
use crate::tools::stamp::Stamp;

/// Most often a call's progress is passed on.
pub const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// What a person made of a server's question.
pub enum Answered {
    /// The answers, by question id (normalized).
    Given(Map<String, Value>),
    Skipped,
}

/// Who a call's questions and progress go to (a run). `Error` ends the
/// call: the server is told `cancel`, and the call gets [`KILL_GRACE`]
/// to end.
pub trait CallHost: Send {
    type Error: Send;

    /// Puts `questions` (titled `title`) to a person.
    fn ask(
        &mut self,
        title: String,
        questions: Vec<Question>,
    ) -> BoxFuture<'_, Result<Answered, Self::Error>>;

    /// A question that cannot be put to a person (`why`): declined.
    fn cannot_ask(&mut self, why: &str);

    /// The call's progress (at most one per [`PROGRESS_EVERY`]).
    fn progress(&mut self, text: &str);

    /// Who the call's log lines are about: its run (none outside a run).
    fn tag(&self) -> Option<RunTag>;
}

/// Makes the call of `call` with `args`, within `timeout` (the person's
/// time not counted) or until `stop`. Returns its outcome, and the host's
/// error when asking ended the call.
pub async fn run<H: CallHost>(
    call: &McpTool,
    args: &Value,
    stamp: Stamp<'_>,
    timeout: Duration,
    stop: impl Future<Output = ()>,
    host: &mut H,
) -> (ToolOutcome, Option<H::Error>) {
    let started = Instant::now();
    let (asks, mut questions) = mpsc::channel(1);
    let (progress, mut progressed) = mpsc::channel(1);
    let tag = host.tag();
    let mut running =
        Box::pin(
            call.server
                .call(&call.tool, args, stamp, asks, progress, tag.as_ref()),
        );
    let mut last_shown: Option<Instant> = None;
    let mut deadline = tokio::time::Instant::now() + timeout;
    tokio::pin!(stop);
    let outcome = loop {
        tokio::select! {
            outcome = &mut running => break (outcome, None),
            Some(question) = questions.recv() => {
                let asked = tokio::time::Instant::now();
                let answered = put(&call.server.name, question, host).await;
                deadline += asked.elapsed();
                if let Err(err) = answered {
                    // Told `cancel`: the server may still end the call.
                    let outcome = tokio::time::timeout(KILL_GRACE, &mut running)
                        .await
                        .unwrap_or_else(|_| stopped(started));
                    break (outcome, Some(err));
                }
            }
            Some(text) = progressed.recv() => {
                // A chatty server does not fill the run's log.
                if last_shown.is_none_or(|at| at.elapsed() >= PROGRESS_EVERY) {
                    last_shown = Some(Instant::now());
                    host.progress(&text);
                }
            }
            () = tokio::time::sleep_until(deadline) => break (timed_out(started, timeout), None),
            () = &mut stop => break (stopped(started), None),
        }
    };
    // Dropping the call gives it up (see `McpServer::call`).
    drop(running);
    outcome
}

/// Puts a server's question through `host` and answers the server:
/// answers -> `accept` with the content, a skip -> `decline`; the host's
/// error -> `cancel`, and the error comes back. A question that cannot be
/// asked is declined.
async fn put<H: CallHost>(
    server: &str,
    question: Elicitation,
    host: &mut H,
) -> Result<(), H::Error> {
    let mapped = match elicit::questions(&question.schema, &question.order) {
        Ok(mapped) => mapped,
        Err(why) => {
            host.cannot_ask(&why);
            question.answer(ElicitationAction::Decline, None);
            return Ok(());
        }
    };
    let title = match question.message.trim() {
        "" => format!("MCP server {server} asks"),
        message => message.to_owned(),
    };
    match host.ask(title, mapped.questions.clone()).await {
        Ok(Answered::Given(answers)) => {
            question.answer(ElicitationAction::Accept, Some(mapped.content(&answers)));
            Ok(())
        }
        Ok(Answered::Skipped) => {
            question.answer(ElicitationAction::Decline, None);
            Ok(())
        }
        Err(err) => {
            question.answer(ElicitationAction::Cancel, None);
            Err(err)
        }
    }
}

/// A host with nobody to ask (a call outside a run): questions are
/// declined, progress is dropped.
pub struct Unattended;

impl CallHost for Unattended {
    type Error = std::convert::Infallible;

    fn ask(
        &mut self,
        _title: String,
        _questions: Vec<Question>,
    ) -> BoxFuture<'_, Result<Answered, Self::Error>> {
        Box::pin(async { Ok(Answered::Skipped) })
    }

    fn cannot_ask(&mut self, _why: &str) {}

    fn progress(&mut self, _text: &str) {}

    fn tag(&self) -> Option<RunTag> {
        None
    }
}
