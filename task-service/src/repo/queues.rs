//! What operators set on queues (the `queues` table): pause and resume.

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{Bool, Text, Timestamptz};
use diesel_async::RunQueryDsl;
use leasehold::server::db::Cache;
use tracing::Instrument;

use super::{Db, Result};

/// A queue an operator has set something on.
#[derive(Debug, Clone, QueryableByName)]
pub struct QueueRow {
    #[diesel(sql_type = Text)]
    pub queue: String,
    #[diesel(sql_type = Bool)]
    pub paused: bool,
    /// When its settings last changed.
    #[diesel(sql_type = Timestamptz)]
    pub updated_at: DateTime<Utc>,
}

/// Pauses or resumes `queue`. Setting what is already set changes nothing, not even the time.
/// A resume wakes the waiting claims (the table's trigger notifies, on commit).
pub async fn set_paused(conn: &mut Db, queue: &str, paused: bool) -> Result<QueueRow> {
    let span = leasehold::db_span!("INSERT", "queues");
    async move {
        diesel::sql_query(
            "INSERT INTO queues (queue, paused) VALUES ($1, $2)
             ON CONFLICT (queue) DO UPDATE SET paused = EXCLUDED.paused,
                 updated_at = CASE WHEN queues.paused = EXCLUDED.paused THEN queues.updated_at
                                   ELSE now() END
             RETURNING queue, paused, updated_at",
        )
        .bind::<Text, _>(queue)
        .bind::<Bool, _>(paused)
        .cached()
        .get_result(conn)
        .await
    }
    .instrument(span)
    .await
}

/// Every queue an operator has set something on, by name.
pub async fn queue_rows(conn: &mut Db) -> Result<Vec<QueueRow>> {
    let span = leasehold::db_span!("SELECT", "queues");
    async move {
        diesel::sql_query("SELECT queue, paused, updated_at FROM queues ORDER BY queue")
            .cached()
            .load(conn)
            .await
    }
    .instrument(span)
    .await
}
