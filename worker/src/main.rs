//! The worker binary: parses its configuration and runs the library with the built-in sleep
//! handler until SIGTERM or SIGINT (then exits 0 after the graceful shutdown).

use clap::Parser;
use leasehold_worker::{Cli, SleepHandler};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Flushes buffered spans when main returns.
    let _telemetry = leasehold::telemetry::init("worker");
    leasehold_worker::run(
        cli.config,
        SleepHandler::default(),
        leasehold::shutdown::signal(),
    )
    .await
}
