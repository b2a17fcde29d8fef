//! The tasks database: its embedded migrations, and the pool helpers shared with lease-service.

use diesel_migrations::{EmbeddedMigrations, embed_migrations};
pub use leasehold::server::db::{DbConn, DbPool, connection, pool};

pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations");

/// Serialises concurrent migrations of replicas starting at once (distinct from lease-service's).
const MIGRATION_LOCK_KEY: i64 = 0x0054_6173_6b73; // "Tasks"

/// Applies pending migrations to the tasks database.
pub async fn migrate(database_url: &str) -> anyhow::Result<()> {
    leasehold::server::db::migrate(database_url, MIGRATIONS, MIGRATION_LOCK_KEY).await
}
