//! Logging set-up shared by every binary.
//!
//! `RUST_LOG` filters (default `info`); `LOG_FORMAT=json` switches from human-readable lines to
//! one JSON object per line.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Installs the global subscriber. Safe to call more than once (later calls do nothing), so
/// tests that start apps in-process can call it freely.
pub fn init(service_name: &'static str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = std::env::var("LOG_FORMAT").is_ok_and(|v| v.eq_ignore_ascii_case("json"));
    let registry = tracing_subscriber::registry().with(filter);
    let result = if json {
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_current_span(true)
                    .with_writer(std::io::stderr),
            )
            .try_init()
    } else {
        registry
            .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
            .try_init()
    };
    if result.is_ok() {
        tracing::debug!(service = service_name, "logging initialised");
    }
}
