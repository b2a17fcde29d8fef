//! The task generator's control: its desired state lives here, in the tasks database, and its
//! leadership in lease-service. Status combines the two, so every task-service replica gives
//! the same answer, and start/stop take effect whichever replica receives them (the sample's
//! status depended on which replica answered, and stop had to reach the lease holder).

use shared::generator::{GeneratorLeader, GeneratorSettings, GeneratorStatus, StartGenerator};
use shared::server::ApiError;

use crate::repo::{self, Db, GeneratorRow};
use crate::tasks::Engine;

pub async fn settings(conn: &mut Db) -> Result<GeneratorSettings, ApiError> {
    Ok(to_api(repo::generator(conn).await?))
}

pub async fn status(conn: &mut Db, engine: &Engine) -> Result<GeneratorStatus, ApiError> {
    let settings = settings(conn).await?;
    let leader = engine
        .leases_retrying
        .current(&engine.generator_resource)
        .await
        .map_err(|err| ApiError::Unavailable(format!("cannot ask lease-service who leads: {err}")))?
        .map(|lease| GeneratorLeader {
            holder: lease.holder,
            fence: lease.fence,
            since: lease.created_at,
            expires_at: lease.expires_at,
            expires_in_ms: lease.expires_in_ms,
        });
    let message = match (settings.running, &leader) {
        (true, Some(leader)) => format!("Generator is running; {} produces.", leader.holder),
        (true, None) => "Generator is started; no replica leads yet.".to_owned(),
        (false, _) => "Generator is not running.".to_owned(),
    };
    Ok(GeneratorStatus {
        status: if settings.running {
            "STARTED"
        } else {
            "STOPPED"
        }
        .to_owned(),
        is_running: settings.running,
        message,
        producing: settings.running && leader.is_some(),
        produced: settings.produced,
        leader,
        settings,
    })
}

/// Starts the generator, changing any settings given.
pub async fn start(
    conn: &mut Db,
    engine: &Engine,
    change: StartGenerator,
) -> Result<GeneratorStatus, ApiError> {
    let current = repo::generator(conn).await?;
    let rate = change.rate_per_second.unwrap_or(current.rate_per_second);
    if !(rate.is_finite() && rate > 0.0 && rate <= 1000.0) {
        return Err(ApiError::invalid(
            "invalid_field",
            "rate_per_second",
            format!("rate_per_second must be above 0 and at most 1000, got {rate}"),
        ));
    }
    let min = change
        .min_sleep_seconds
        .unwrap_or(current.min_sleep_seconds);
    let max = change
        .max_sleep_seconds
        .unwrap_or(current.max_sleep_seconds);
    if !(min.is_finite() && max.is_finite() && 0.0 <= min && min <= max && max <= 3600.0) {
        return Err(ApiError::invalid(
            "invalid_field",
            "min_sleep_seconds",
            format!(
                "need 0 <= min_sleep_seconds <= max_sleep_seconds <= 3600, got {min} and {max}"
            ),
        ));
    }
    repo::set_generator(conn, true, Some(rate), Some(min), Some(max)).await?;
    status(conn, engine).await
}

pub async fn stop(conn: &mut Db, engine: &Engine) -> Result<GeneratorStatus, ApiError> {
    repo::set_generator(conn, false, None, None, None).await?;
    status(conn, engine).await
}

fn to_api(row: GeneratorRow) -> GeneratorSettings {
    GeneratorSettings {
        running: row.running,
        rate_per_second: row.rate_per_second,
        min_sleep_seconds: row.min_sleep_seconds,
        max_sleep_seconds: row.max_sleep_seconds,
        produced: row.produced,
        updated_at: row.updated_at,
    }
}
