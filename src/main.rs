//! The `chatgate` binary: parse settings, build, serve until a signal.
//!
//! Every start-up error is one line on stderr, `chatgate: ...`, naming the
//! flag or environment variable, the value and what is expected; a bad flag
//! exits 2, anything else that stops the start exits 1.
//!
//! `chatgate audit verify FILE...` checks an audit log's hash chain instead
//! of serving (docs/operations.md).

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

use chatgate::config::{apply_legacy_env, Settings};
use chatgate::startup::Application;

/// jemalloc instead of the system's malloc: opening paused runs spent a
/// fifth of its time in glibc's malloc and free, and a held pause costs
/// less memory with jemalloc (docs/benchmarks.md, "The allocator").
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// One log line: `[time LEVEL target] ` as env_logger writes it, then the
/// record's key-values when it has any (who a line about a run is about:
/// `session="s" run=3 key=key-1 pause=c-1`, see `chatgate::run_log!`) and
/// `: `, then the message.
fn log_line(buf: &mut env_logger::fmt::Formatter, record: &log::Record<'_>) -> std::io::Result<()> {
    use std::io::Write;

    struct Pairs<'a> {
        buf: &'a mut env_logger::fmt::Formatter,
        written: usize,
    }
    impl<'kvs> log::kv::VisitSource<'kvs> for Pairs<'_> {
        fn visit_pair(
            &mut self,
            key: log::kv::Key<'kvs>,
            value: log::kv::Value<'kvs>,
        ) -> Result<(), log::kv::Error> {
            let space = if self.written == 0 { "" } else { " " };
            write!(self.buf, "{space}{key}={value}")?;
            self.written += 1;
            Ok(())
        }
    }

    let level = record.level();
    let style = buf.default_level_style(level);
    write!(
        buf,
        "[{} {style}{level:<5}{style:#} {}] ",
        buf.timestamp(),
        record.target()
    )?;
    let mut pairs = Pairs { buf, written: 0 };
    record
        .key_values()
        .visit(&mut pairs)
        .map_err(std::io::Error::other)?;
    if pairs.written > 0 {
        write!(buf, ": ")?;
    }
    writeln!(buf, "{}", record.args())
}

/// `chatgate audit ...`: tools for the audit log, run instead of the server.
#[derive(Debug, Parser)]
#[command(name = "chatgate audit", about = "Tools for chatgate's audit log")]
struct AuditCli {
    #[command(subcommand)]
    command: AuditCommand,
}

#[derive(Debug, Subcommand)]
enum AuditCommand {
    /// Checks the hash chain of audit log files, oldest first (a rotated
    /// log's files in order): prints `OK: N records` and exits 0, or names
    /// the first line that breaks it and exits 1.
    Verify {
        #[arg(required = true, value_name = "FILE")]
        files: Vec<std::path::PathBuf>,
    },
}

fn audit_main() -> ExitCode {
    let cli = match AuditCli::try_parse_from(std::env::args().skip(1)) {
        Ok(cli) => cli,
        Err(err) if !err.use_stderr() => {
            let _ = err.print();
            return ExitCode::SUCCESS;
        }
        Err(err) => {
            let _ = err.print();
            return ExitCode::from(2);
        }
    };
    match cli.command {
        AuditCommand::Verify { files } => match chatgate::audit::verify::verify(&files) {
            Ok(records) => {
                println!("OK: {records} records");
                ExitCode::SUCCESS
            }
            Err(broken) => {
                println!("FAIL: {broken}");
                ExitCode::FAILURE
            }
        },
    }
}

fn main() -> ExitCode {
    if std::env::args_os().nth(1).is_some_and(|arg| arg == "audit") {
        return audit_main();
    }
    // Before any thread exists: it may set environment variables.
    apply_legacy_env();
    // A file that reaches the process's size limit (RLIMIT_FSIZE) fails the
    // write that crosses it (the audit log and the store then fail closed)
    // rather than killing the server. Tools get the default back.
    // SAFETY: one thread yet; SIG_IGN has no handler to be unsafe in.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    env_logger::Builder::from_env(
        env_logger::Env::default().default_filter_or("info,rmcp=off,tracing::span=warn"),
    )
    .format(log_line)
    .init();
    let settings = match Settings::try_parse() {
        Ok(settings) => settings,
        Err(err) if !err.use_stderr() => {
            // --help, --version
            let _ = err.print();
            return ExitCode::SUCCESS;
        }
        Err(err) => {
            eprintln!("chatgate: {}", one_line(&err));
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("chatgate: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("chatgate: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(settings: Settings) -> Result<(), String> {
    let engine = settings.engines.engine;
    let app = Application::build(settings)
        .await
        .map_err(|err| err.to_string())?;
    log::info!(
        "chatgate listening on http://{} (engine: {engine})",
        app.address()
    );
    app.run_until_stopped()
        .await
        .map_err(|err| format!("the server stopped with an error: {err}"))
}

/// clap's message as one line, and under the environment variable's name
/// when the bad value came from one rather than from the command line.
fn one_line(err: &clap::Error) -> String {
    let rendered = err.render().to_string();
    let message = rendered
        .lines()
        .map(str::trim)
        .take_while(|line| !line.starts_with("Usage:"))
        // Blank lines go; clap's `tip:` (a flag nearly spelled so: "did
        // you mean") stays, after a `;`.
        .filter(|line| !line.is_empty())
        .map(|line| line.replace("tip: ", "; tip: "))
        .collect::<Vec<_>>()
        .join(" ")
        .replace(" ; tip: ", "; tip: ");
    let message = message
        .strip_prefix("error: ")
        .unwrap_or(&message)
        .to_owned();
    let given: Vec<String> = std::env::args().skip(1).collect();
    for arg in Settings::command().get_arguments() {
        let (Some(long), Some(env)) = (arg.get_long(), arg.get_env()) else {
            continue;
        };
        let flag = format!("--{long}");
        let mention = message.match_indices(&flag).find(|(at, _)| {
            let next = message[at + flag.len()..].chars().next();
            !next.is_some_and(|c| c.is_alphanumeric() || c == '-')
        });
        let names: Vec<String> = std::iter::once(long.to_owned())
            .chain(
                arg.get_all_aliases()
                    .unwrap_or_default()
                    .into_iter()
                    .map(str::to_owned),
            )
            .map(|name| format!("--{name}"))
            .collect();
        let on_command_line = given.iter().any(|g| {
            names
                .iter()
                .any(|n| g == n || g.starts_with(&format!("{n}=")))
        });
        let Some((at, _)) = mention else {
            continue;
        };
        if !on_command_line {
            if let Some(value) = std::env::var_os(env) {
                let env = env.to_string_lossy();
                // What follows the flag's name: clap's `<NAME>'` goes, the
                // reason after a `:` (or a `[possible values ...]`) stays.
                let reason = message[at + flag.len()..]
                    .trim_start_matches(|c| c != ':' && c != '[')
                    .trim_start_matches(':')
                    .trim();
                return format!(
                    "invalid value in {env}=`{}` (the variable of --{long}): {reason}",
                    value.to_string_lossy()
                );
            }
        }
    }
    message
}
