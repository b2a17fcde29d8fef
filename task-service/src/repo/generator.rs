//! The generator's desired state (one row).

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Bool, Double, Nullable, Timestamptz};
use leasehold::server::db::{Cache, OneRow};

use super::{Db, Result};

/// The generator's desired state (one row).
#[derive(Debug, Clone, QueryableByName)]
pub struct GeneratorRow {
    #[diesel(sql_type = Bool)]
    pub running: bool,
    #[diesel(sql_type = Double)]
    pub rate_per_second: f64,
    #[diesel(sql_type = Double)]
    pub min_sleep_seconds: f64,
    #[diesel(sql_type = Double)]
    pub max_sleep_seconds: f64,
    #[diesel(sql_type = BigInt)]
    pub produced: i64,
    #[diesel(sql_type = Timestamptz)]
    pub updated_at: DateTime<Utc>,
}

const GENERATOR_COLUMNS: &str =
    "running, rate_per_second, min_sleep_seconds, max_sleep_seconds, produced, updated_at";
pub async fn generator(conn: &mut Db) -> Result<GeneratorRow> {
    diesel::sql_query(format!(
        "SELECT {GENERATOR_COLUMNS} FROM generator_settings WHERE id = 1"
    ))
    .cached()
    .get_one(conn)
    .await
}

/// Sets the desired state; `None` leaves a setting as it is.
pub async fn set_generator(
    conn: &mut Db,
    running: bool,
    rate_per_second: Option<f64>,
    min_sleep_seconds: Option<f64>,
    max_sleep_seconds: Option<f64>,
) -> Result<GeneratorRow> {
    diesel::sql_query(format!(
        "UPDATE generator_settings SET running = $1,
                rate_per_second = COALESCE($2, rate_per_second),
                min_sleep_seconds = COALESCE($3, min_sleep_seconds),
                max_sleep_seconds = COALESCE($4, max_sleep_seconds),
                updated_at = now()
         WHERE id = 1
         RETURNING {GENERATOR_COLUMNS}"
    ))
    .bind::<Bool, _>(running)
    .bind::<Nullable<Double>, _>(rate_per_second)
    .bind::<Nullable<Double>, _>(min_sleep_seconds)
    .bind::<Nullable<Double>, _>(max_sleep_seconds)
    .cached()
    .get_one(conn)
    .await
}
