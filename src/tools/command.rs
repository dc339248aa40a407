//! The `command` executor: one child process per call, no shell.
//!
//! - `argv` is fixed in the tools file; the call's arguments go to stdin as
//!   one JSON object, then end of input. Nothing from the model or the user
//!   ever becomes part of the command line.
//! - The process gets only `PATH` plus the variables named in `env = [...]`,
//!   runs in `cwd` if given, and in its own process group.
//! - stdout is the result, kept up to [`MAX_OUTPUT_BYTES`](super::outcome::MAX_OUTPUT_BYTES) (the rest is
//!   read and dropped, so the child never blocks on a full pipe); a non-zero
//!   exit fails the call with the tail of stderr.
//! - Between chatgate and the tool runs a keeper ([`super::keeper`]): when
//!   the tool exits, every process it started is killed, `setsid` daemons
//!   included, and the exit status decides `ok`; the output is read until
//!   then (and [`DRAIN_GRACE`] more). On timeout, or when the run is
//!   stopped, the tool gets SIGTERM, then everything SIGKILL
//!   [`KILL_GRACE`] later. A tool dies with chatgate, `kill -9` included.

use crate::session::{run_log, RunTag};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::keeper::{self, KILL_GRACE};
use super::outcome::{CappedOutput, ToolOutcome, MAX_STDERR_TAIL};
use super::stamp::Stamp;

/// How long a call's output is still read after the call ended (its keeper
/// exited): what a descendant that escaped the keeper writes later is not
/// waited for.
pub const DRAIN_GRACE: Duration = Duration::from_millis(500);

/// A command tool's executor, as checked at start.
#[derive(Debug, Clone)]
pub struct CommandSpec {
    pub argv: Vec<String>,
    pub cwd: Option<PathBuf>,
    /// Names of the variables passed on besides `PATH`.
    pub env: Vec<String>,
}

impl CommandSpec {
    /// Checks the program exists (on `PATH`, or as a path) and `cwd` is a
    /// directory; the error names the key.
    pub fn new(
        argv: Vec<String>,
        cwd: Option<PathBuf>,
        env: Vec<String>,
    ) -> Result<CommandSpec, String> {
        let program = argv.first().ok_or("key `command`: the list is empty")?;
        if find_program(program).is_none() {
            return Err(format!(
                "key `command`: program `{program}` not found (not on PATH, or not executable)"
            ));
        }
        if let Some(dir) = &cwd {
            if !dir.is_dir() {
                return Err(format!("key `cwd`: `{}` is not a directory", dir.display()));
            }
        }
        if let Some(bad) = env
            .iter()
            .find(|name| name.is_empty() || name.contains('='))
        {
            return Err(format!("key `env`: `{bad}` is not a variable name"));
        }
        Ok(CommandSpec { argv, cwd, env })
    }

    /// `tag`: the run whose call it is (its log lines are about it);
    /// `stamp`: its approval's signed receipt and its idempotency key, in
    /// `CHATGATE_RECEIPT` and `CHATGATE_IDEMPOTENCY_KEY`.
    pub async fn run(
        &self,
        args: &Value,
        timeout: Duration,
        stop: impl std::future::Future<Output = ()>,
        tag: Option<&RunTag>,
        stamp: Stamp<'_>,
    ) -> ToolOutcome {
        let started = Instant::now();
        let mut command = keeper::command(&self.argv, &self.env, self.cwd.as_deref());
        // Its approval's proof and its key (docs/tools.md): never secrets.
        for (name, value) in stamp.env() {
            command.env(name, value);
        }
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(err) => {
                return ToolOutcome::failed(
                    started,
                    format!("cannot start `{}`: {err}", self.argv[0]),
                )
            }
        };
        let keeper = child.id().map(|id| Pid::from_raw(id as i32));
        let input = serde_json::to_vec(args).unwrap_or_default();
        let mut stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();

        let mut out = CappedOutput::default();
        let mut err = CappedOutput::default();
        let (ended, why_stopped) = {
            let feed = async move {
                if let Some(stdin) = stdin.as_mut() {
                    // A tool that does not read its input may close it: fine.
                    let _ = stdin.write_all(&input).await;
                    let _ = stdin.shutdown().await;
                }
                drop(stdin);
            };
            let io = async {
                tokio::join!(
                    feed,
                    drain(stdout, &mut out, usize::MAX),
                    drain(stderr, &mut err, MAX_STDERR_TAIL)
                )
            };
            tokio::pin!(io);
            tokio::pin!(stop);
            let deadline = tokio::time::sleep(timeout);
            tokio::pin!(deadline);
            let mut io_done = false;
            let mut why_stopped = None;
            // The call ends when its keeper exits (the tool's end, every
            // descendant killed): its output is read meanwhile, never
            // waited for past that.
            let ended = loop {
                tokio::select! {
                    _ = &mut io, if !io_done => io_done = true,
                    ended = child.wait() => break ended,
                    () = &mut deadline, if why_stopped.is_none() => {
                        why_stopped = Some(format!(
                            "timed out after {}",
                            humantime::format_duration(timeout)
                        ));
                        terminate(keeper, &mut child, tag).await;
                    }
                    () = &mut stop, if why_stopped.is_none() => {
                        why_stopped = Some("stopped: the run was stopped".to_owned());
                        terminate(keeper, &mut child, tag).await;
                    }
                }
            };
            if !io_done {
                // What is left in the pipes, briefly: a descendant that
                // escaped the keeper may hold them open forever.
                let _ = tokio::time::timeout(DRAIN_GRACE, &mut io).await;
            }
            (ended, why_stopped)
        };
        match why_stopped {
            None => outcome(started, out, err, ended),
            Some(why_stopped) => ToolOutcome {
                ok: false,
                skipped: false,
                truncated: out.truncated(),
                result: None,
                error: Some(why_stopped),
                duration_ms: started.elapsed().as_millis() as u64,
                exit_status: ended.ok().and_then(|s| s.code()),
                http_status: None,
                output_bytes: out.total,
                changed: None,
            },
        }
    }
}

/// Asks the keeper to stop the call: it passes `SIGTERM` to the tool and
/// kills everything [`KILL_GRACE`] later. If it has not exited a second
/// after that (it always has), it is killed itself.
async fn terminate(keeper: Option<Pid>, child: &mut tokio::process::Child, tag: Option<&RunTag>) {
    let Some(keeper) = keeper else {
        return;
    };
    // It may be gone already; nothing to do then.
    let _ = kill(keeper, Signal::SIGTERM);
    let bound = KILL_GRACE + Duration::from_secs(1);
    if tokio::time::timeout(bound, child.wait()).await.is_err() {
        run_log!(
            Error,
            tag,
            "a tool's keeper did not exit {bound:?} after SIGTERM; killing it"
        );
        let _ = kill(keeper, Signal::SIGKILL);
    }
}

/// Reads `pipe` to its end into `out`, keeping the first
/// [`MAX_OUTPUT_BYTES`](super::outcome::MAX_OUTPUT_BYTES) (`tail ==
/// usize::MAX`) or the last `tail` bytes.
async fn drain(pipe: Option<impl AsyncRead + Unpin>, out: &mut CappedOutput, tail: usize) {
    let Some(mut pipe) = pipe else {
        return;
    };
    let mut buf = vec![0u8; 8192];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) if tail == usize::MAX => out.push(&buf[..n]),
            Ok(n) => {
                out.total += n;
                out.kept.extend_from_slice(&buf[..n]);
                if out.kept.len() > tail {
                    out.kept.drain(..out.kept.len() - tail);
                }
            }
        }
    }
}

fn outcome(
    started: Instant,
    out: CappedOutput,
    err: CappedOutput,
    status: std::io::Result<std::process::ExitStatus>,
) -> ToolOutcome {
    let duration_ms = started.elapsed().as_millis() as u64;
    let status = match status {
        Ok(status) => status,
        Err(err) => {
            return ToolOutcome::failed(started, format!("cannot wait for the command: {err}"))
        }
    };
    let ok = status.success();
    let error = (!ok).then(|| {
        let what = match status.code() {
            Some(code) => format!("exit status {code}"),
            None => "killed by a signal".to_owned(),
        };
        let tail = err.text();
        let tail = tail.trim();
        if tail.is_empty() {
            what
        } else {
            format!("{what}: {tail}")
        }
    });
    ToolOutcome {
        ok,
        skipped: false,
        truncated: out.truncated(),
        result: ok.then(|| out.text()),
        error,
        duration_ms,
        exit_status: status.code(),
        http_status: None,
        output_bytes: out.total,
        changed: None,
    }
}

/// Where `program` is: itself when it has a `/`, else the first executable
/// of that name on `PATH`.
fn find_program(program: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |path: &std::path::Path| {
        path.metadata()
            .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let path = PathBuf::from(program);
        return executable(&path).then_some(path);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|path| executable(path))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(argv: &[&str]) -> CommandSpec {
        CommandSpec::new(argv.iter().map(|s| s.to_string()).collect(), None, vec![]).unwrap()
    }

    fn never() -> std::future::Pending<()> {
        std::future::pending()
    }

    #[tokio::test]
    async fn the_arguments_arrive_on_stdin_and_stdout_is_the_result() {
        let outcome = spec(&["cat"])
            .run(
                &json!({"step": "a \"quoted\" $(rm -rf /)"}),
                Duration::from_secs(10),
                never(),
                None,
                Stamp::NONE,
            )
            .await;
        assert!(outcome.ok, "{outcome:?}");
        assert_eq!(
            outcome.result.unwrap(),
            r#"{"step":"a \"quoted\" $(rm -rf /)"}"#
        );
        assert_eq!(outcome.exit_status, Some(0));
    }

    #[tokio::test]
    async fn only_path_and_the_listed_variables_reach_the_process() {
        // Variables cargo sets for every test process (no set_var: other
        // test threads read the environment).
        assert!(std::env::var_os("CARGO_PKG_NAME").is_some());
        let mut listed = spec(&["sh", "-c", "env"]);
        listed.env = vec!["CARGO_PKG_NAME".into()];
        let outcome = listed
            .run(
                &json!({}),
                Duration::from_secs(10),
                never(),
                None,
                Stamp::NONE,
            )
            .await;
        let env = outcome.result.unwrap();
        assert!(env.contains("CARGO_PKG_NAME=chatgate"), "{env}");
        assert!(!env.contains("CARGO_MANIFEST_DIR"), "{env}");
        assert!(env.contains("PATH="));
    }

    #[tokio::test]
    async fn a_non_zero_exit_fails_with_the_tail_of_stderr() {
        let outcome = spec(&["sh", "-c", "echo nope >&2; exit 3"])
            .run(
                &json!({}),
                Duration::from_secs(10),
                never(),
                None,
                Stamp::NONE,
            )
            .await;
        assert!(!outcome.ok);
        assert_eq!(outcome.exit_status, Some(3));
        assert_eq!(outcome.error.unwrap(), "exit status 3: nope");
    }

    #[tokio::test]
    async fn a_large_output_is_capped_and_marked_truncated() {
        let outcome = spec(&["sh", "-c", "head -c 200000 /dev/zero | tr '\\\\0' x"])
            .run(
                &json!({}),
                Duration::from_secs(10),
                never(),
                None,
                Stamp::NONE,
            )
            .await;
        assert!(outcome.ok);
        assert!(outcome.truncated);
        assert_eq!(
            outcome.result.unwrap().len(),
            crate::tools::outcome::MAX_OUTPUT_BYTES
        );
        assert_eq!(outcome.output_bytes, 200_000);
    }

    #[tokio::test]
    async fn a_timeout_kills_the_process_and_its_children() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("child");
        let script = format!("(sleep 3; touch {}) & sleep 30", marker.display());
        let started = Instant::now();
        let outcome = spec(&["sh", "-c", &script])
            .run(
                &json!({}),
                Duration::from_millis(300),
                never(),
                None,
                Stamp::NONE,
            )
            .await;
        assert!(!outcome.ok);
        assert!(outcome.error.unwrap().starts_with("timed out after 300ms"));
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(3500)).await;
        assert!(!marker.exists(), "the child was killed with the group");
    }

    /// Whether a process whose command line contains `needle` is alive.
    fn alive(needle: &str) -> bool {
        std::process::Command::new("pgrep")
            .args(["-f", needle])
            .output()
            .map(|out| out.status.success())
            .unwrap_or(false)
    }

    #[tokio::test]
    async fn a_tool_that_exits_at_once_is_done_though_its_daemon_holds_stdout() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("daemon");
        // The daemon leaves the tool's session (setsid) and keeps stdout.
        let script = format!(
            "setsid sh -c 'sleep 2; touch {}' & echo started",
            marker.display()
        );
        let started = Instant::now();
        let outcome = spec(&["sh", "-c", &script])
            .run(
                &json!({}),
                Duration::from_secs(30),
                never(),
                None,
                Stamp::NONE,
            )
            .await;

        assert!(outcome.ok, "the exit status decides: {outcome:?}");
        assert_eq!(outcome.result.as_deref(), Some("started\n"));
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "not held by the daemon: {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert!(!marker.exists(), "the daemon ended with the call");
    }

    #[tokio::test]
    async fn a_daemon_holding_stdout_cannot_hold_a_call_past_its_timeout() {
        let needle = "sleep 1000.4321";
        let script = format!("setsid {needle} & {needle}");
        let started = Instant::now();
        let outcome = spec(&["sh", "-c", &script])
            .run(
                &json!({}),
                Duration::from_millis(500),
                never(),
                None,
                Stamp::NONE,
            )
            .await;

        assert!(outcome.error.unwrap().starts_with("timed out after 500ms"));
        assert!(
            started.elapsed() < Duration::from_millis(500) + KILL_GRACE + Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert!(!alive(needle), "every process of the call is gone");
    }

    #[tokio::test]
    async fn a_stop_terminates_the_command_and_reports_it() {
        let outcome = spec(&["sleep", "30"])
            .run(
                &json!({}),
                Duration::from_secs(60),
                tokio::time::sleep(Duration::from_millis(200)),
                None,
                Stamp::NONE,
            )
            .await;
        assert!(!outcome.ok);
        assert!(outcome.error.unwrap().contains("stopped"));
    }

    #[test]
    fn a_missing_program_or_cwd_is_refused() {
        assert!(
            CommandSpec::new(vec!["no-such-program-xyz".into()], None, vec![])
                .unwrap_err()
                .contains("`command`")
        );
        assert!(
            CommandSpec::new(vec!["cat".into()], Some("/no/such/dir".into()), vec![])
                .unwrap_err()
                .contains("`cwd`")
        );
        assert!(CommandSpec::new(vec![], None, vec![]).is_err());
    }
}
