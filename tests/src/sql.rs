//! Direct SQL on a test's database: a table's rows as JSON, to prove that nothing was written,
//! and single statements, to age or corrupt state on purpose.

use diesel::QueryableByName;
use diesel::sql_types::Text;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

#[derive(QueryableByName)]
struct JsonRow {
    #[diesel(sql_type = Text)]
    json: String,
}

/// Every row of `table` as JSON text, in the text's order (any table, whatever its key):
/// compare before and after to prove that a refused request wrote nothing.
pub async fn snapshot(database_url: &str, table: &str) -> Vec<String> {
    let mut conn = AsyncPgConnection::establish(database_url).await.unwrap();
    let rows: Vec<JsonRow> = diesel::sql_query(format!(
        "SELECT row_to_json(t)::text AS json FROM {table} t ORDER BY json"
    ))
    .load(&mut conn)
    .await
    .unwrap();
    rows.into_iter().map(|r| r.json).collect()
}

/// Runs one SQL statement on the database (to age rows, corrupt state on purpose, ...).
pub async fn execute(database_url: &str, sql: &str) -> usize {
    try_execute(database_url, sql).await.unwrap()
}

/// Runs one SQL statement that the database may refuse (a constraint a test proves): the rows
/// it touched, or the database's error.
pub async fn try_execute(database_url: &str, sql: &str) -> Result<usize, String> {
    let mut conn = AsyncPgConnection::establish(database_url).await.unwrap();
    diesel::sql_query(sql)
        .execute(&mut conn)
        .await
        .map_err(|err| err.to_string())
}

/// The rows of a query as JSON objects (each column by its name).
pub async fn query(database_url: &str, sql: &str) -> Vec<serde_json::Value> {
    let mut conn = AsyncPgConnection::establish(database_url).await.unwrap();
    let rows: Vec<JsonRow> = diesel::sql_query(format!(
        "SELECT row_to_json(q)::text AS json FROM ({sql}) q"
    ))
    .load(&mut conn)
    .await
    .unwrap();
    rows.into_iter()
        .map(|r| serde_json::from_str(&r.json).unwrap())
        .collect()
}

/// Takes a migrated tasks database back to the schema of the release before the migration
/// `first` (its directory's name): runs the `down.sql` of it and of every later migration,
/// newest first, and forgets that they ran, so that the next `migrate` upgrades it again as it
/// would upgrade a database that release left. Tests of upgrades start here.
pub async fn revert_tasks_schema(database_url: &str, first: &str) {
    use diesel_async::SimpleAsyncConnection;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../task-service/migrations");
    let mut names: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.as_str() >= first)
        .collect();
    assert!(
        names.iter().any(|name| name == first),
        "no migration {first}"
    );
    names.sort();
    let mut conn = AsyncPgConnection::establish(database_url).await.unwrap();
    for name in names.iter().rev() {
        let down = std::fs::read_to_string(root.join(name).join("down.sql")).unwrap();
        let version: String = name
            .split('_')
            .next()
            .unwrap()
            .chars()
            .filter(char::is_ascii_digit)
            .collect();
        conn.batch_execute(&format!(
            "{down}
             DELETE FROM __diesel_schema_migrations WHERE version = '{version}';"
        ))
        .await
        .unwrap_or_else(|err| panic!("reverting {name}: {err}"));
    }
}

/// Waits until `sessions` sessions on `database_url`'s database wait for a lock: the requests a
/// test holds up behind rows it locked, before it lets them go.
pub async fn until_waiting_for_locks(database_url: &str, sessions: i64) {
    crate::eventually(
        std::time::Duration::from_secs(30),
        "requests waiting for the test's locks",
        || async {
            let waiting = query(
                database_url,
                "SELECT count(*) AS n FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .await;
            waiting[0]["n"].as_i64() == Some(sessions)
        },
    )
    .await;
}
