//! The leases database: its embedded migrations, and the pool helpers shared with task-service.

use diesel_migrations::{EmbeddedMigrations, embed_migrations};
pub use shared::server::db::{DbConn, DbPool, connection, pool};

pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations");

/// Any constant will do, as long as the services do not share it: it serialises concurrent
/// migrations of replicas starting at once.
const MIGRATION_LOCK_KEY: i64 = 0x4c65_6173_6573; // "Leases"

/// Applies pending migrations to the leases database.
pub async fn migrate(database_url: &str) -> anyhow::Result<()> {
    shared::server::db::migrate(database_url, MIGRATIONS, MIGRATION_LOCK_KEY).await
}
