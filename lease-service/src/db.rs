//! The leases database: its embedded migrations, and the pool helpers shared with task-service.

use diesel_async::AsyncPgConnection;
use diesel_migrations::{EmbeddedMigrations, embed_migrations};
pub use leasehold::server::db::{DbConn, DbPool, connection, pool};

pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations");

/// Any constant will do, as long as the services do not share it: it serialises concurrent
/// migrations of replicas starting at once.
const MIGRATION_LOCK_KEY: i64 = 0x4c65_6173_6573; // "Leases"

/// Applies pending migrations to the leases database.
pub async fn migrate(database_url: &str) -> anyhow::Result<()> {
    leasehold::server::db::migrate(database_url, MIGRATIONS, MIGRATION_LOCK_KEY).await
}

/// What every lease-service session runs first.
///
/// Each of lease-service's statements finds its rows by key, and all are kept prepared per
/// connection, several over sets (`unnest` joins, one statement for a group of requests).
/// PostgreSQL would plan a group statement anew on every call, because its generic plan
/// assumes more rows than a small group has; planning costs more than running a group of a few.
/// So every statement runs on its generic plan, made once per session. Such a plan, made while
/// `leases` was nearly empty (a new deployment), would rightly scan the table, and would keep
/// scanning it once it had grown. With sequential scans priced out, the plans made then reach
/// rows through the index on `resource`, one probe per request (`tests/tests/suite/query_plans.rs`
/// grows the table under kept plans and bounds the rows they read); a table no index serves
/// (history pruning by age) is still scanned.
pub const SESSION: &str = "SET enable_seqscan = off; SET plan_cache_mode = force_generic_plan";

/// [`SESSION`] with the clock-skew bound the takeover of a lease set by an earlier primary
/// waits out (`lease_takeover_at`, migration 000008).
pub fn session(max_clock_skew_ms: u32) -> String {
    format!("{SESSION}; SET leasehold.max_clock_skew_ms = {max_clock_skew_ms}")
}

/// One connection set up as the pool's are (for tests and the benchmark's direct SQL).
pub async fn establish(database_url: &str) -> diesel::ConnectionResult<AsyncPgConnection> {
    leasehold::server::db::establish(database_url.to_owned(), SESSION).await
}
