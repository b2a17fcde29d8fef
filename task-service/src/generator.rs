//! The task generator's control: its desired state lives here, in the tasks database, and its
//! leadership in lease-service. Status combines the two, so every task-service replica gives
//! the same answer, and start/stop take effect whichever replica receives them (the sample's
//! status depended on which replica answered, and stop had to reach the lease holder).

use leasehold::ErrorCode;
use leasehold::generator::{
    GeneratorLeader, GeneratorSettings, GeneratorStatus, MAX_RATE_PER_SECOND, MAX_SLEEP_SECONDS,
    MIN_RATE_PER_SECOND, StartGenerator,
};
use leasehold::server::ApiError;

use crate::context::Context;
use crate::repo::{self, Db, GeneratorRow};

pub async fn settings(conn: &mut Db) -> Result<GeneratorSettings, ApiError> {
    Ok(to_api(repo::generator(conn).await?))
}

pub async fn status(conn: &mut Db, engine: &Context) -> Result<GeneratorStatus, ApiError> {
    let settings = settings(conn).await?;
    Ok(compose(settings, leader(engine).await?))
}

/// The replica holding the generator's lease, as lease-service tells it.
async fn leader(engine: &Context) -> Result<Option<GeneratorLeader>, ApiError> {
    ask_leader(&engine.leases_retrying(), engine)
        .await
        .map_err(|err| ApiError::Unavailable(format!("cannot ask lease-service who leads: {err}")))
}

async fn ask_leader(
    leases: &leasehold::LeaseClient,
    engine: &Context,
) -> Result<Option<GeneratorLeader>, leasehold::LeaseError> {
    Ok(leases
        .current(&engine.generator_resource)
        .await?
        .map(|lease| GeneratorLeader {
            holder: lease.holder,
            fence: lease.fence,
            since: lease.created_at,
            expires_at: lease.expires_at,
            expires_in_ms: lease.expires_in_ms,
        }))
}

fn compose(settings: GeneratorSettings, leader: Option<GeneratorLeader>) -> GeneratorStatus {
    let message = match (settings.running, &leader) {
        (true, Some(leader)) => format!("Generator is running; {} produces.", leader.holder),
        (true, None) => "Generator is started; no replica leads yet.".to_owned(),
        (false, _) => "Generator is not running.".to_owned(),
    };
    GeneratorStatus {
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
    }
}

/// Starts the generator, changing any settings given. Every setting must lie within the bounds
/// of [`leasehold::generator`], which the generator also keeps to whatever it reads.
///
/// lease-service is asked who leads before anything is stored: a 503 then means that nothing
/// changed, never that the change was made and only its answer failed.
pub async fn start(
    conn: &mut Db,
    engine: &Context,
    change: StartGenerator,
) -> Result<GeneratorStatus, ApiError> {
    let current = repo::generator(conn).await?;
    let rate = change.rate_per_second.unwrap_or(current.rate_per_second);
    if !(MIN_RATE_PER_SECOND..=MAX_RATE_PER_SECOND).contains(&rate) {
        return Err(ApiError::invalid(
            ErrorCode::InvalidField,
            "rate_per_second",
            format!(
                "rate_per_second must be between {MIN_RATE_PER_SECOND} and \
                 {MAX_RATE_PER_SECOND}, got {rate}"
            ),
        ));
    }
    let min = change
        .min_sleep_seconds
        .unwrap_or(current.min_sleep_seconds);
    let max = change
        .max_sleep_seconds
        .unwrap_or(current.max_sleep_seconds);
    if !((0.0..=MAX_SLEEP_SECONDS).contains(&min) && (min..=MAX_SLEEP_SECONDS).contains(&max)) {
        return Err(ApiError::invalid(
            ErrorCode::InvalidField,
            "min_sleep_seconds",
            format!(
                "need 0 <= min_sleep_seconds <= max_sleep_seconds <= {MAX_SLEEP_SECONDS}, got \
                 {min} and {max}"
            ),
        ));
    }
    let leader = leader(engine).await?;
    let row = repo::set_generator(conn, true, Some(rate), Some(min), Some(max)).await?;
    Ok(compose(to_api(row), leader))
}

/// Stops the generator: once this answers, no generator task is stored (see
/// [`crate::repo::insert_generated`]). The stop needs only this database, whose settings row
/// gates every generator create, so it is stored first: an operator can stop the generator
/// while lease-service is down. Who leads is then asked once, without retries, only for the
/// answer; if lease-service cannot tell, the answer says the leader is unknown.
pub async fn stop(conn: &mut Db, engine: &Context) -> Result<GeneratorStatus, ApiError> {
    let settings = to_api(repo::set_generator(conn, false, None, None, None).await?);
    Ok(match ask_leader(&engine.leases, engine).await {
        Ok(leader) => compose(settings, leader),
        Err(err) => {
            let mut status = compose(settings, None);
            status.message = format!(
                "Generator is not running. Its leader is unknown: lease-service could not be \
                 asked ({err})."
            );
            status
        }
    })
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
