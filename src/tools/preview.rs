//! A tool's preview (#43): what a call would do, run before anyone is
//! asked, without asking (the operator declares it has no side effect).
//! It runs as the tool itself would: a command tool's `preview` with the
//! tool's `cwd`, `env` and keeper, the arguments on stdin; an http tool's
//! `preview_http` POSTed with the tool's headers; an MCP tool's
//! `preview_tool`, another tool of its server, with the same arguments (a
//! question it asks is declined: nobody is asked for a preview).

use futures_util::future::BoxFuture;
use serde_json::Value;
use std::future::Future;

use super::mcp::call::{Answered, CallHost};
use super::stamp::Stamp;
use super::tool::{Executor, Preview};
use crate::protocol::question::Question;
use crate::session::RunTag;

pub use super::gate::{DEFAULT_PREVIEW_TIMEOUT, MAX_PREVIEW_TIMEOUT};
/// Most bytes of a preview's body (UTF-8, cut at a character).
pub const MAX_PREVIEW_BYTES: usize = 64 * 1024;

/// What a preview showed: its output (a failed one's error), cut to
/// [`MAX_PREVIEW_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shown {
    pub ok: bool,
    pub body: String,
    pub truncated: bool,
}

impl Preview {
    /// Runs the preview of a call with `args`, at most its `timeout` (then
    /// it is killed and shown as failed), or until `stop`.
    pub async fn run(
        &self,
        args: &Value,
        stop: impl Future<Output = ()>,
        tag: Option<&RunTag>,
    ) -> Shown {
        let outcome = match &self.executor {
            Executor::Command(spec) => spec.run(args, self.timeout, stop, tag, Stamp::NONE).await,
            #[cfg(feature = "openai")]
            Executor::Http(spec) => spec.run(args, self.timeout, stop, Stamp::NONE).await,
            Executor::Mcp(call) => {
                let mut host = NobodyAsked { tag: tag.cloned() };
                let (outcome, _) =
                    super::mcp::call::run(call, args, Stamp::NONE, self.timeout, stop, &mut host)
                        .await;
                outcome
            }
        };
        let (body, cut_before) = match (&outcome.result, &outcome.error) {
            (Some(result), _) if outcome.ok => (result.as_str(), outcome.truncated),
            (_, Some(error)) => (error.as_str(), false),
            (Some(result), None) => (result.as_str(), outcome.truncated),
            (None, None) => ("", false),
        };
        let (body, cut) = cut_to(body, MAX_PREVIEW_BYTES);
        Shown {
            ok: outcome.ok,
            body: body.to_owned(),
            truncated: cut || cut_before,
        }
    }
}

/// `text` cut to at most `max` bytes at a character boundary, and whether
/// it was cut.
pub fn cut_to(text: &str, max: usize) -> (&str, bool) {
    if text.len() <= max {
        return (text, false);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (&text[..end], true)
}

/// An MCP preview's host: nobody is asked anything for a preview.
struct NobodyAsked {
    tag: Option<RunTag>,
}

impl CallHost for NobodyAsked {
    type Error = ();

    fn ask(
        &mut self,
        _title: String,
        _questions: Vec<Question>,
    ) -> BoxFuture<'_, Result<Answered, ()>> {
        Box::pin(async { Ok(Answered::Skipped) })
    }

    fn cannot_ask(&mut self, _why: &str) {}

    fn progress(&mut self, _text: &str) {}

    fn tag(&self) -> Option<RunTag> {
        self.tag.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::command::CommandSpec;
    use std::time::Duration;

    fn preview(argv: &[&str], timeout: Duration) -> Preview {
        let argv = argv.iter().map(|a| a.to_string()).collect();
        Preview {
            executor: Executor::Command(CommandSpec::new(argv, None, Vec::new()).unwrap()),
            timeout,
        }
    }

    #[tokio::test]
    async fn a_preview_shows_its_output_and_a_failure_its_error() {
        let never = std::future::pending::<()>;
        let shown = preview(&["cat"], Duration::from_secs(10))
            .run(&serde_json::json!({"a": 1}), never(), None)
            .await;
        assert_eq!(
            shown,
            Shown {
                ok: true,
                body: r#"{"a":1}"#.to_owned(),
                truncated: false
            }
        );

        let failed = preview(
            &["sh", "-c", "echo nope >&2; exit 3"],
            Duration::from_secs(10),
        )
        .run(&serde_json::json!({}), never(), None)
        .await;
        assert!(!failed.ok);
        assert!(failed.body.contains("nope"), "{failed:?}");

        let slow = preview(&["sleep", "30"], Duration::from_millis(300))
            .run(&serde_json::json!({}), never(), None)
            .await;
        assert!(!slow.ok);
        assert!(slow.body.contains("timed out"), "{slow:?}");
    }

    #[test]
    fn a_body_is_cut_at_a_character() {
        assert_eq!(cut_to("héllo", 2), ("h", true));
        assert_eq!(cut_to("héllo", 3), ("hé", true));
        assert_eq!(cut_to("hé", 3), ("hé", false));
    }
}
