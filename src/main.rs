//! The `chatgate` binary: parse settings, build, serve until a signal.

use clap::Parser;

use chatgate::config::{apply_legacy_env, Settings};
use chatgate::startup::Application;

fn main() -> std::io::Result<()> {
    // Before any thread exists: it may set environment variables.
    apply_legacy_env();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let settings = Settings::parse();
    tokio::runtime::Runtime::new()?.block_on(serve(settings))
}

async fn serve(settings: Settings) -> std::io::Result<()> {
    let app = Application::build(settings.clone())?;
    log::info!(
        "chatgate listening on http://{} (engine: {})",
        app.address(),
        settings.engine
    );
    app.run_until_stopped().await
}
