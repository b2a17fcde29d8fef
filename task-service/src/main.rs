//! The task-service binary: parses its configuration and hands it to the library.

use clap::Parser;
use task_service::config::{Cli, Command};

#[actix_web::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Flushes buffered spans when main returns.
    let _telemetry = leasehold::telemetry::init("task-service");
    match cli.command.unwrap_or(Command::Serve(Box::new(cli.serve))) {
        Command::Migrate(migrate) => task_service::db::migrate(&migrate.database_url).await,
        Command::Serve(config) => task_service::serve(*config).await,
    }
}
