//! The `chatgate` binary: parse settings, build, serve until a signal.

use clap::Parser;

use chatgate::config::Settings;
use chatgate::startup::Application;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let settings = Settings::parse();
    let app = Application::build(settings.clone())?;
    log::info!(
        "chatgate listening on http://{} (engine: {})",
        app.address(),
        settings.engine
    );
    app.run_until_stopped().await
}
