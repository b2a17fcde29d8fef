//! The task-generator binary: parses its configuration and hands it to the library.

use clap::Parser;
use task_generator::GeneratorConfig;
use tokio_util::sync::CancellationToken;

/// Leasehold's task generator: run several replicas; the one holding the `task-generator` lease
/// creates fake sleep tasks through task-service, the others stand by to take over.
#[derive(Debug, Parser)]
#[command(name = "task-generator", version)]
struct Cli {
    #[command(flatten)]
    config: GeneratorConfig,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli: Cli = leasehold::flags::parse();
    // Flushes buffered spans when main returns.
    let _telemetry = leasehold::telemetry::init("task-generator");
    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        leasehold::shutdown::signal().await;
        on_signal.cancel();
    });
    task_generator::run(cli.config, shutdown).await
}
