//! The lease-service binary: parses its configuration and hands it to the library.

use lease_service::config::ServeConfig;
use leasehold::server::command::{ServiceCli, ServiceCommand};

const ABOUT: &str = "Leasehold's lease service: time-bound, exclusive, renewable, fenced leases kept in PostgreSQL.";

#[actix_web::main]
async fn main() -> anyhow::Result<()> {
    let command = ServiceCli::<ServeConfig>::parse_as("lease-service", ABOUT);
    // Flushes buffered spans when main returns.
    let _telemetry = leasehold::telemetry::init("lease-service");
    match command {
        ServiceCommand::Migrate(migrate) => lease_service::db::migrate(&migrate.database_url).await,
        ServiceCommand::Serve(config) => lease_service::serve(*config).await,
    }
}
