//! Runs the Python and JavaScript client suites against a real server, so
//! `cargo test` proves the sample clients. Missing interpreters fail loudly.

use std::process::Command;

use chatgate::config::Settings;
use chatgate::startup::Application;

/// The tool the suites edit per task: a step `echo_args ...` calls it, and
/// its output is its arguments (`echo_args forbidden ...` a rule denies);
/// `two_eyes` needs two people (an inbox shows its progress).
const TOOLS: &str = r#"
[[tool]]
name = "echo_args"
description = "Prints its arguments"
risk = "low"
command = ["cat"]
parameters = { type = "object", properties = { step = { type = "string" } }, required = ["step"] }

[[tool]]
name = "two_eyes"
description = "Needs two people's approvals"
risk = "low"
approvals = 2
command = ["cat"]
parameters = { type = "object", properties = { step = { type = "string" } }, required = ["step"] }

[[tool]]
name = "peek"
description = "Shows what it would do before it runs"
risk = "low"
command = ["cat"]
preview = ["sh", "-c", "echo would change 3 files"]
parameters = { type = "object", properties = { step = { type = "string" } }, required = ["step"] }

[[rule]]
name = "no forbidden echoes"
tool = "echo_args"
args = { "/step" = "echo_args forbidden*" }
decision = "deny"
"#;

/// Starts a server for the suites: no step delay, a 10 s confirmation
/// timeout (the suites' timeout cases wait for it; long enough that a CLI
/// under a pseudo-terminal on a loaded machine answers well before it),
/// the `echo_args` tool.
async fn start_server(tools: &std::path::Path) -> String {
    let mut settings = Settings::for_bind("127.0.0.1:0");
    settings.engines.step_delay = std::time::Duration::from_millis(0);
    settings.pauses.confirm_timeout = std::time::Duration::from_secs(10);
    settings.server.workers = Some(2);
    settings.tooling.tools = Some(tools.to_owned());
    let app = Application::build(settings).await.expect("server builds");
    let url = format!("http://{}", app.address());
    tokio::spawn(app.run_until_stopped());
    url
}

async fn run_suite(program: &'static str, args: &'static [&'static str]) {
    let dir = tempfile::tempdir().unwrap();
    let tools = dir.path().join("tools.toml");
    std::fs::write(&tools, TOOLS).unwrap();
    let url = start_server(&tools).await;
    let output = tokio::task::spawn_blocking(move || {
        Command::new(program)
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("CHATGATE_URL", url)
            .output()
            .unwrap_or_else(|err| {
                panic!("`{program}` is required to test the sample clients and could not be run: {err}")
            })
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{program} suite failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    println!("{stdout}\n{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_suite_passes() {
    run_suite(
        "python3",
        &[
            "-m",
            "unittest",
            "discover",
            "-s",
            "clients/python/tests",
            "-v",
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_client_suite_passes() {
    run_suite("node", &["--test", "clients/js/test/"]).await;
}
