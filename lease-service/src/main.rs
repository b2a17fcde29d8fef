//! The lease-service binary: parses its configuration and hands it to the library.

use clap::Parser;
use lease_service::config::{Cli, Command};

#[actix_web::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Flushes buffered spans when main returns.
    let _telemetry = leasehold::telemetry::init("lease-service");
    match cli.command.unwrap_or(Command::Serve(Box::new(cli.serve))) {
        Command::Migrate(migrate) => lease_service::db::migrate(&migrate.database_url).await,
        Command::Serve(config) => lease_service::serve(*config).await,
    }
}
