//! The task-service binary: parses its configuration and hands it to the library.

use leasehold::server::command::{ServiceCli, ServiceCommand};
use task_service::config::ServeConfig;

const ABOUT: &str =
    "Leasehold's task service: a PostgreSQL task queue whose claims are leases from lease-service.";

#[actix_web::main]
async fn main() -> anyhow::Result<()> {
    let command = ServiceCli::<ServeConfig>::parse_as("task-service", ABOUT);
    // Flushes buffered spans when main returns.
    let _telemetry = leasehold::telemetry::init("task-service");
    match command {
        ServiceCommand::Migrate(migrate) => task_service::db::migrate(&migrate.database_url).await,
        ServiceCommand::Serve(config) => task_service::serve(*config).await,
    }
}
