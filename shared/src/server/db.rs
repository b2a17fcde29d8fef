//! The connection pool and embedded migrations.

use std::time::Duration;

use anyhow::Context;
use diesel::pg::Pg;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel_async::AsyncPgConnection;
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_async::pooled_connection::deadpool::{Object, Pool};
use diesel_async::pooled_connection::{
    AsyncDieselConnectionManager, ManagerConfig, RecyclingMethod,
};
use diesel_migrations::{EmbeddedMigrations, MigrationHarness};

use super::database::{Database, Timeouts};
use super::error::ApiError;

pub type DbPool = Pool<AsyncPgConnection>;
pub type DbConn = Object<AsyncPgConnection>;

/// How long one migration statement may run: an index built over a grown table takes a while.
const MIGRATION_STATEMENT_TIMEOUT: Duration = Duration::from_secs(600);

/// How long a request waits for a pooled connection before answering 503.
const CHECKOUT_TIMEOUT: Duration = Duration::from_secs(5);

/// The pool of a service's database connections, each made by [`Database::connect`].
///
/// A connection coming back from the pool is checked with [`RecyclingMethod::Fast`]: dropped if
/// its socket has closed (a database restart closes every session, and [`Database`] closes a
/// connection whose server stopped answering) or a transaction was left open, but not pinged.
/// The default, `Verified`, costs a `SELECT 1` round trip before every request's first query,
/// one in three of the statements a lease acquire sends; a connection that broke unnoticed
/// fails its request once and is then dropped, as a ping's failure would.
pub fn pool(database: &Database, size: usize) -> anyhow::Result<DbPool> {
    let mut config = ManagerConfig::default();
    config.recycling_method = RecyclingMethod::Fast;
    let connector = database.clone();
    config.custom_setup = Box::new(move |_url| {
        let connector = connector.clone();
        Box::pin(async move { connector.connect().await })
    });
    let manager =
        AsyncDieselConnectionManager::<AsyncPgConnection>::new_with_config(database.url(), config);
    Pool::builder(manager)
        .max_size(size)
        .build()
        .context("building the database pool")
}

/// One connection to `url` set up as a service's pooled ones are, with `session` and the
/// default [`Timeouts`] (for tests and the benchmark's direct SQL).
pub async fn establish(
    url: String,
    session: &'static str,
) -> diesel::ConnectionResult<AsyncPgConnection> {
    Database::new(&url, Timeouts::default(), session)
        .map_err(|err| diesel::ConnectionError::InvalidConnectionUrl(format!("{err:#}")))?
        .connect()
        .await
}

/// A pooled connection, or 503 if none comes within `CHECKOUT_TIMEOUT`.
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

/// How a transaction that lost to contention is run again: a few tries, soon, spread apart so
/// that the transactions that deadlocked do not meet again. PostgreSQL aborts one side of a
/// lock cycle after `deadlock_timeout` (1 s by default), so a retry is cheap beside that wait.
pub const CONTENTION_RETRY: crate::retry::RetryPolicy = crate::retry::RetryPolicy {
    max_attempts: 8,
    backoff: crate::retry::Backoff::new(Duration::from_millis(2), Duration::from_millis(100)),
};

/// The tries of one transaction that may lose to contention (a deadlock or serialization
/// failure, [`ApiError::Contention`]: rolled back, nothing kept), at most [`CONTENTION_RETRY`]'s.
/// Only a transaction that loses every time answers with the contention (503), never with a
/// 500. The loop is the caller's:
///
/// ```ignore
/// let mut retry = Contended::default();
/// let outcome = loop {
///     let outcome = transaction(conn).await;
///     if !retry.again(&outcome).await {
///         break outcome;
///     }
/// };
/// ```
///
/// A transaction must be safe to run again after such an abort: every statement before its
/// last wait for a lock writes nothing outside it (the task-service groups lock all their rows,
/// in one order, before any call to lease-service that changes a lease).
#[derive(Debug, Default)]
pub struct Contended {
    tries: u32,
}

impl Contended {
    /// Whether `outcome` lost to contention with tries left: then the pause before the next try
    /// has passed when this returns `true`. (The future holds nothing of `outcome`, so that a
    /// group's answers need not be shared between threads to be awaited over.)
    pub fn again<T>(
        &mut self,
        outcome: &Result<T, ApiError>,
    ) -> impl std::future::Future<Output = bool> + Send + use<T> {
        let pause = match outcome {
            Err(ApiError::Contention(detail)) if self.tries + 1 < CONTENTION_RETRY.max_attempts => {
                self.tries += 1;
                tracing::info!(%detail, tries = self.tries, "transaction lost to contention; trying again");
                Some(CONTENTION_RETRY.delay(self.tries))
            }
            _ => None,
        };
        async move {
            match pause {
                Some(pause) => {
                    tokio::time::sleep(pause).await;
                    true
                }
                None => false,
            }
        }
    }
}

/// The node a connection is on, as `/readyz` reports it: after a failover, which one is
/// primary now.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    diesel::QueryableByName,
    serde::Serialize,
    serde::Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseNode {
    /// The address and port the node answers on, as it sees itself.
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub server: String,
    /// Whether it is a standby (never, for the services' own connections, which take writes).
    #[diesel(sql_type = diesel::sql_types::Bool)]
    pub in_recovery: bool,
    /// Its WAL timeline: one more at every promotion, so a failover shows as a new number.
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    pub timeline: Option<i64>,
}

/// diesel-async's `get_result` for a statement that must be over before its row counts.
///
/// `get_result` returns at the first row, without reading the rest of the reply. An autocommit
/// statement (the services' writes are single statements) commits only after PostgreSQL has
/// queued its rows and its CommandComplete, and a commit waits there for the synchronous
/// standby. If the session is ended during that wait (the fast shutdown of a primary being
/// demoted, in every failover), PostgreSQL flushes the queued rows with its warning and closes
/// the connection: `get_result` then reports done a write that no standby has, and that the
/// new primary will not have. The failover soak lost acknowledged writes that way. `get_one`
/// reads the reply to its end (ReadyForQuery, sent after the commit), so such a write is an
/// error, answered 503. Its cost is nothing: the end of the reply comes in the same packet.
///
/// `get_result` and `first` are refused by clippy (`clippy.toml`) in favour of this.
pub trait OneRow<Conn>: diesel_async::RunQueryDsl<Conn> {
    /// The statement's first row once its whole reply is in; `NotFound` when it had none,
    /// so that diesel's `.optional()` applies as it does to `get_result`.
    #[allow(clippy::type_complexity)]
    fn get_one<'query, 'conn, U>(
        self,
        conn: &'conn mut Conn,
    ) -> futures_util::future::Map<
        diesel_async::return_futures::LoadFuture<'conn, 'query, Self, Conn, U>,
        fn(diesel::QueryResult<Vec<U>>) -> diesel::QueryResult<U>,
    >
    where
        U: Send,
        Conn: diesel_async::AsyncConnectionCore,
        Self: diesel_async::methods::LoadQuery<'query, Conn, U> + 'query,
    {
        use futures_util::FutureExt as _;
        self.load(conn).map(first_row::<U>)
    }
}

impl<T: diesel_async::RunQueryDsl<Conn>, Conn> OneRow<Conn> for T {}

fn first_row<U>(rows: diesel::QueryResult<Vec<U>>) -> diesel::QueryResult<U> {
    rows?
        .into_iter()
        .next()
        .ok_or(diesel::result::Error::NotFound)
}

/// Which node `conn` is on; the readiness probe's one query.
pub async fn node(conn: &mut AsyncPgConnection) -> diesel::QueryResult<DatabaseNode> {
    diesel::sql_query(concat!(
        "SELECT coalesce(host(inet_server_addr()), 'local') || ':' \
                || coalesce(inet_server_port(), 0) AS server, \
            pg_is_in_recovery() AS in_recovery, ",
        super::database::timeline_sql!(),
        " AS timeline"
    ))
    .get_one(conn)
    .await
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
    // Connected as the services are, across a formation's hosts, but with room for a long
    // index build.
    let database = Database::new(
        database_url,
        Timeouts {
            statement: MIGRATION_STATEMENT_TIMEOUT,
            ..Timeouts::default()
        },
        "",
    )?;
    let (done, result) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("migrations".to_owned())
        .spawn(move || {
            // The receiver only goes away if the caller stopped waiting; nothing to report then.
            let _ = done.send(migrate_blocking(&database, migrations, lock_key));
        })
        .context("starting the migration thread")?;
    result.await.context("the migration thread died")?
}

fn migrate_blocking(
    database: &Database,
    migrations: EmbeddedMigrations,
    lock_key: i64,
) -> anyhow::Result<()> {
    use diesel::RunQueryDsl;
    // The connection's driver and its reply timer run on this runtime's worker; the wrapper
    // blocks on a runtime of its own to send each statement.
    let driver = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting the migration's runtime")?;
    let conn = driver
        .block_on(database.connect())
        .context("connecting to the database")?;
    let mut conn = AsyncConnectionWrapper::<AsyncPgConnection>::from(conn);
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

/// A raw SQL statement that each connection prepares once and then reuses: see [`Cache`].
#[derive(Debug, Clone)]
pub struct Cached<Q>(Q);

/// Marks a `diesel::sql_query` statement (with its binds) as safe to keep prepared.
///
/// `sql_query` marks its statements unsafe to cache, so diesel-async parses, plans and describes
/// them anew on every call: an extra round trip and a planning pass per statement. The
/// repositories' SQL is a fixed set of texts, never built from input (values are always bound),
/// so each text is prepared once per connection and found again in diesel-async's statement
/// cache, which keys statements without a static query id by their SQL text.
///
/// Which statements to keep is each repository's choice, because a kept statement may keep its
/// plan: after five runs PostgreSQL may use a generic plan for the rest of the session, made for
/// the table as it was then. Planned while a table is tiny, even a key lookup is a sequential
/// scan, and the end-to-end benchmark caught a batch release whose kept plan, made while
/// `leases` was nearly empty, scanned all 13,000 rows of it on every call. lease-service's
/// sessions price sequential scans out, so it keeps every statement; task-service keeps key
/// lookups (a tiny table's scan lasts until autovacuum next analyzes it, which replans) and the
/// statements of its claim groups, whose transactions price sequential scans out too, and plans
/// its other statements over sets (`unnest`, `ANY`, a `LIMIT` scan) afresh on every call.
pub trait Cache: Sized {
    fn cached(self) -> Cached<Self> {
        Cached(self)
    }
}

impl<Q: QueryFragment<Pg>> Cache for Q {}

impl<Q: QueryFragment<Pg>> QueryFragment<Pg> for Cached<Q> {
    fn walk_ast<'b>(&'b self, pass: AstPass<'_, 'b, Pg>) -> diesel::QueryResult<()> {
        self.0.walk_ast(pass)
    }

    // What `sql_query` gets wrong for fixed texts. (diesel hides this method from its docs
    // unless a backend-implementer feature is on; it is a plain trait method all the same.)
    fn is_safe_to_cache_prepared(&self, _backend: &Pg) -> diesel::QueryResult<bool> {
        Ok(true)
    }
}

impl<Q> QueryId for Cached<Q> {
    type QueryId = ();
    // Not one id per Rust type: the cache keys these statements by their SQL text.
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<Q: Query> Query for Cached<Q> {
    type SqlType = Q::SqlType;
}

/// The client span of one SQL statement, named and attributed as OpenTelemetry's database
/// conventions say, the one definition of those attributes for both services:
/// `db_span!("UPDATE", "tasks")`. A group statement records how many requests it serves in
/// `db.operation.batch.size`. (A span's name must be known where it is declared, hence a macro.)
#[macro_export]
macro_rules! db_span {
    ($operation:literal, $collection:literal) => {
        ::tracing::info_span!(
            concat!($operation, " ", $collection),
            otel.kind = "client",
            db.system.name = "postgresql",
            db.operation.name = $operation,
            db.collection.name = $collection,
            db.operation.batch.size = ::tracing::field::Empty,
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn only_contention_is_tried_again_and_only_so_often() {
        let mut retry = Contended::default();
        let lost: Result<(), ApiError> = Err(ApiError::Contention("deadlock detected".into()));
        let mut tries = 1;
        while retry.again(&lost).await {
            tries += 1;
        }
        assert_eq!(tries, CONTENTION_RETRY.max_attempts);
        for outcome in [Ok(()), Err(ApiError::Internal("boom".into()))] {
            assert!(!Contended::default().again(&outcome).await);
        }
    }
}
