//! Logging set-up.

use tracing_subscriber::EnvFilter;

/// Installs the global `tracing` subscriber with the given filter directive.
/// Fails with a clear message when the directive does not parse.
pub fn init(filter: &str) -> Result<(), String> {
    let filter = EnvFilter::try_new(filter).map_err(|e| format!("--log-level {filter:?}: {e}"))?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(true)
        .try_init()
        .map_err(|e| e.to_string())
}
