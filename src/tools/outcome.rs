//! What one tool call did ([`ToolOutcome`]), and the bound on what a call's
//! output may make chatgate hold (`CappedOutput`).

use serde::Serialize;

/// Most bytes of a call's output kept as its result (the rest is dropped and
/// the outcome says `truncated`).
pub const MAX_OUTPUT_BYTES: usize = 64 * 1024;
/// Most bytes of a failed command's stderr reported (its tail).
pub const MAX_STDERR_TAIL: usize = 2 * 1024;

/// What one call did. `result` is the output (capped, see [`MAX_OUTPUT_BYTES`])
/// when `ok`, else `error` says why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolOutcome {
    pub ok: bool,
    /// The call did not run (rejected, answered by the user, or stopped first).
    pub skipped: bool,
    pub truncated: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub duration_ms: u64,
    /// A command's exit code (`None` when killed by a signal or not a command).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<i32>,
    /// An http tool's response status.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    /// Bytes of output the tool produced (before the cap).
    pub output_bytes: usize,
    /// Not run: its preview, run again (`recheck`), no longer shows what
    /// was approved (#43).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changed: Option<Box<Changed>>,
}

/// A call's preview when it was approved, and now (`precondition_changed`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Changed {
    pub approved_digest: String,
    pub current_digest: String,
}

impl ToolOutcome {
    /// A call that did not run: rejected, or answered with `result` instead.
    pub fn skipped(ok: bool, result: Option<String>, error: Option<String>) -> ToolOutcome {
        ToolOutcome {
            ok,
            skipped: true,
            truncated: false,
            result,
            error,
            duration_ms: 0,
            exit_status: None,
            http_status: None,
            output_bytes: 0,
            changed: None,
        }
    }

    /// A call that ran (from `started`) and failed, for `error`.
    pub fn failed(started: std::time::Instant, error: String) -> ToolOutcome {
        ToolOutcome {
            ok: false,
            skipped: false,
            truncated: false,
            result: None,
            error: Some(error),
            duration_ms: started.elapsed().as_millis() as u64,
            exit_status: None,
            http_status: None,
            output_bytes: 0,
            changed: None,
        }
    }

    /// One line for the `tool_output` chunk's text.
    pub fn summary(&self, tool: &str) -> String {
        let first_line = |text: &str| {
            let line = text.lines().next().unwrap_or("").trim();
            let mut short: String = line.chars().take(120).collect();
            if short.len() < line.len() || text.lines().nth(1).is_some() {
                short.push('…');
            }
            short
        };
        match (self.ok, self.skipped) {
            (true, false) => format!(
                "{tool} done in {} ms: {}",
                self.duration_ms,
                first_line(self.result.as_deref().unwrap_or(""))
            ),
            (false, true) => format!(
                "{tool} skipped: {}",
                first_line(self.error.as_deref().unwrap_or("rejected"))
            ),
            (true, true) => format!(
                "{tool} answered by the user: {}",
                first_line(self.result.as_deref().unwrap_or(""))
            ),
            (false, false) => format!(
                "{tool} failed: {}",
                first_line(self.error.as_deref().unwrap_or("failed"))
            ),
        }
    }
}

/// Keeps at most [`MAX_OUTPUT_BYTES`] of output, counting the rest.
#[derive(Debug, Default)]
pub(crate) struct CappedOutput {
    pub(crate) kept: Vec<u8>,
    pub(crate) total: usize,
}

impl CappedOutput {
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        self.total += bytes.len();
        let room = MAX_OUTPUT_BYTES.saturating_sub(self.kept.len());
        self.kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    pub(crate) fn truncated(&self) -> bool {
        self.total > self.kept.len()
    }

    /// The kept bytes as text (invalid UTF-8 replaced).
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.kept).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_capped_and_counted() {
        let mut out = CappedOutput::default();
        out.push(&vec![b'a'; MAX_OUTPUT_BYTES - 1]);
        out.push(b"bcd");
        assert_eq!(out.kept.len(), MAX_OUTPUT_BYTES);
        assert_eq!(out.total, MAX_OUTPUT_BYTES + 2);
        assert!(out.truncated());
    }
}
