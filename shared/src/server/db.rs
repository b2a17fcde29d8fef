//! The connection pool and embedded migrations.

use std::time::Duration;

use anyhow::Context;
use diesel::Connection;
use diesel_async::AsyncPgConnection;
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::deadpool::{Object, Pool};
use diesel_migrations::{EmbeddedMigrations, MigrationHarness};

use super::error::ApiError;

pub type DbPool = Pool<AsyncPgConnection>;
pub type DbConn = Object<AsyncPgConnection>;

/// How long a request waits for a pooled connection before answering 503.
const CHECKOUT_TIMEOUT: Duration = Duration::from_secs(5);

pub fn pool(database_url: &str, size: usize) -> anyhow::Result<DbPool> {
    let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new(database_url);
    Pool::builder(manager)
        .max_size(size)
        .build()
        .context("building the database pool")
}

/// A pooled connection, or 503 if none comes within [`CHECKOUT_TIMEOUT`].
pub async fn connection(pool: &DbPool) -> Result<DbConn, ApiError> {
    match tokio::time::timeout(CHECKOUT_TIMEOUT, pool.get()).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(err)) => Err(ApiError::Unavailable(format!(
            "no database connection: {err}"
        ))),
        Err(_) => Err(ApiError::Unavailable(
            "timed out waiting for a database connection".to_owned(),
        )),
    }
}

/// Applies pending `migrations`, holding the advisory lock `lock_key` so that replicas starting
/// together take turns.
///
/// diesel's migration harness is synchronous and diesel-async's wrapper blocks on a runtime of
/// its own, which must not be the (current-thread) runtime actix-web runs on: so the work
/// happens on a plain thread, and this future waits for it.
pub async fn migrate(
    database_url: &str,
    migrations: EmbeddedMigrations,
    lock_key: i64,
) -> anyhow::Result<()> {
    let url = database_url.to_owned();
    let (done, result) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("migrations".to_owned())
        .spawn(move || {
            // The receiver only goes away if the caller stopped waiting; nothing to report then.
            let _ = done.send(migrate_blocking(&url, migrations, lock_key));
        })
        .context("starting the migration thread")?;
    result.await.context("the migration thread died")?
}

fn migrate_blocking(
    url: &str,
    migrations: EmbeddedMigrations,
    lock_key: i64,
) -> anyhow::Result<()> {
    use diesel::RunQueryDsl;
    let mut conn = AsyncConnectionWrapper::<AsyncPgConnection>::establish(url)
        .context("connecting to the database")?;
    diesel::sql_query("SELECT pg_advisory_lock($1)")
        .bind::<diesel::sql_types::BigInt, _>(lock_key)
        .execute(&mut conn)
        .context("taking the migration lock")?;
    let applied: Vec<String> = conn
        .run_pending_migrations(migrations)
        .map_err(|err| anyhow::anyhow!("applying migrations: {err}"))?
        .iter()
        .map(ToString::to_string)
        .collect();
    diesel::sql_query("SELECT pg_advisory_unlock($1)")
        .bind::<diesel::sql_types::BigInt, _>(lock_key)
        .execute(&mut conn)
        .context("releasing the migration lock")?;
    for version in &applied {
        tracing::info!(%version, "migration applied");
    }
    tracing::info!(count = applied.len(), "database schema is up to date");
    Ok(())
}
