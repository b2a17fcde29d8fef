//! Periodic tasks: schedules that make one task per tick of a cron expression.
//!
//! A schedule's state is its row (`repo::schedules`), never a replica's memory, so ticks survive
//! restarts and replica changes; every replica runs the
//! [`schedule ticker`](crate::maintenance::schedule_ticker), and the row lock decides
//! which one makes each tick. The tick's instant is in its task's idempotency key
//! ([`leasehold::schedules::tick_key`]), so even two tickers could not make one tick twice.
//! [`cadence`] says when a schedule ticks and what a late round makes.
//!
//! The rules here (create, replace, read, delete, pause, resume) validate a definition with the
//! same checks as a task create, and compute the next tick from the database's clock.

pub mod cadence;

use chrono::{DateTime, Utc};
use leasehold::ErrorCode;
use leasehold::schedules::{
    CreateSchedule, MAX_SCHEDULE_NAME_CHARS, ReplaceSchedule, Schedule, ScheduleSpec, Schedules,
};
use leasehold::server::{ApiError, validate_name_within};
use leasehold::tasks::CreateTask;

use crate::context::Context;
use crate::repo::{self, Db, NewSchedule, ScheduleRow};
use crate::tasks::validate_new;
use cadence::Cadence;

/// The grace a schedule gets when its definition names none, in seconds.
pub const DEFAULT_MISFIRE_GRACE_SECONDS: i32 = 60;
/// The longest grace accepted: a day.
const MAX_MISFIRE_GRACE_SECONDS: i32 = 86_400;

/// `POST /api/schedules`: the new schedule, or 409 `schedule_exists`.
pub async fn create(
    conn: &mut Db,
    engine: &Context,
    request: CreateSchedule,
) -> Result<Schedule, ApiError> {
    let (schedule, cadence) = validate(engine, request.name, request.spec)?;
    let first = first_tick(conn, &cadence).await?;
    let row = repo::insert_schedule(conn, &schedule, first)
        .await?
        .ok_or_else(|| ApiError::Conflict {
            code: ErrorCode::ScheduleExists,
            message: format!(
                "a schedule named {:?} exists; PUT /api/schedules/{{name}} replaces it",
                schedule.name
            ),
        })?;
    tracing::info!(schedule = %row.name, cron = %row.cron, next_tick_at = ?row.next_tick_at, "schedule created");
    engine.schedules_changed.notify_one();
    to_api(row)
}

/// `PUT /api/schedules/{name}`: the schedule after, and whether it was created. A body that
/// names a schedule names the path's, or is refused.
pub async fn replace(
    conn: &mut Db,
    engine: &Context,
    name: &str,
    request: ReplaceSchedule,
) -> Result<(Schedule, bool), ApiError> {
    if let Some(named) = request.name.as_deref()
        && named != name
    {
        return Err(ApiError::invalid(
            ErrorCode::NameMismatch,
            "name",
            format!("the body names the schedule {named:?}, the path {name:?}"),
        ));
    }
    let (schedule, cadence) = validate(engine, name.to_owned(), request.spec)?;
    let first = first_tick(conn, &cadence).await?;
    let replaced = repo::replace_schedule(conn, &schedule, first).await?;
    tracing::info!(schedule = %name, cron = %schedule.cron, created = replaced.created, "schedule replaced");
    engine.schedules_changed.notify_one();
    Ok((to_api(replaced.schedule)?, replaced.created))
}

/// `GET /api/schedules/{name}`.
pub async fn get(conn: &mut Db, name: &str) -> Result<Schedule, ApiError> {
    validate_name(name)?;
    to_api(
        repo::schedule(conn, name)
            .await?
            .ok_or_else(|| not_found(name))?,
    )
}

/// `GET /api/schedules`.
pub async fn list(conn: &mut Db) -> Result<Schedules, ApiError> {
    let schedules = repo::schedules(conn)
        .await?
        .into_iter()
        .map(to_api)
        .collect::<Result<_, _>>()?;
    Ok(Schedules { schedules })
}

/// `DELETE /api/schedules/{name}`: the schedule as it was. The tasks it made stay.
pub async fn delete(conn: &mut Db, name: &str) -> Result<Schedule, ApiError> {
    validate_name(name)?;
    let row = repo::delete_schedule(conn, name)
        .await?
        .ok_or_else(|| not_found(name))?;
    tracing::info!(schedule = %name, "schedule deleted");
    to_api(row)
}

/// `POST /api/schedules/{name}/pause` (`paused`) and `/resume`. A resumed schedule is next due
/// at its first tick after the resume: ticks while paused were not wanted, so they are not
/// missed ticks to catch up.
pub async fn set_paused(
    conn: &mut Db,
    engine: &Context,
    name: &str,
    paused: bool,
) -> Result<Schedule, ApiError> {
    validate_name(name)?;
    let current = repo::schedule(conn, name)
        .await?
        .ok_or_else(|| not_found(name))?;
    let resume_at = if paused {
        None
    } else {
        let cadence = Cadence::parse(&current.cron, &current.timezone)?;
        Some(first_tick(conn, &cadence).await?)
    };
    let row = repo::set_schedule_paused(conn, name, paused, resume_at)
        .await?
        .ok_or_else(|| not_found(name))?;
    tracing::info!(schedule = %name, paused, "schedule {}", if paused { "paused" } else { "resumed" });
    engine.schedules_changed.notify_one();
    to_api(row)
}

fn validate(
    engine: &Context,
    name: String,
    spec: ScheduleSpec,
) -> Result<(NewSchedule, Cadence), ApiError> {
    validate_name(&name)?;
    let timezone = spec.timezone.unwrap_or_else(|| "UTC".to_owned());
    let cadence = Cadence::parse(&spec.cron, &timezone)?;
    let grace = spec
        .misfire_grace_seconds
        .unwrap_or(DEFAULT_MISFIRE_GRACE_SECONDS);
    if !(1..=MAX_MISFIRE_GRACE_SECONDS).contains(&grace) {
        return Err(ApiError::invalid(
            ErrorCode::InvalidField,
            "misfire_grace_seconds",
            format!(
                "misfire_grace_seconds must be between 1 and {MAX_MISFIRE_GRACE_SECONDS}, got {grace}"
            ),
        ));
    }
    // The task every tick makes is checked now, as a create would check it, so that no tick
    // can fail on it later.
    let task = validate_new(
        engine,
        CreateTask {
            task_data: spec.task_data,
            queue: spec.queue,
            priority: spec.priority,
            max_attempts: spec.max_attempts,
            concurrency_key: spec.concurrency_key,
            ..CreateTask::default()
        },
    )?;
    let schedule = NewSchedule {
        name,
        cron: spec.cron,
        timezone,
        task_data: task.task_data,
        queue: task.queue,
        priority: task.priority,
        max_attempts: task.max_attempts,
        catch_up: spec.catch_up.unwrap_or_default(),
        misfire_grace_seconds: grace,
        concurrency_key: task.concurrency_key,
    };
    Ok((schedule, cadence))
}

fn validate_name(name: &str) -> Result<(), ApiError> {
    validate_name_within("name", name, MAX_SCHEDULE_NAME_CHARS)
}

/// The first tick after the database's clock now.
async fn first_tick(conn: &mut Db, cadence: &Cadence) -> Result<DateTime<Utc>, ApiError> {
    let now = repo::clock(conn).await?;
    cadence.after(now).ok_or_else(|| {
        ApiError::invalid(
            ErrorCode::InvalidCron,
            "cron",
            "the cron expression never fires again",
        )
    })
}

fn not_found(name: &str) -> ApiError {
    ApiError::NotFound {
        code: ErrorCode::ScheduleNotFound,
        message: format!("no schedule named {name:?}"),
    }
}

fn to_api(row: ScheduleRow) -> Result<Schedule, ApiError> {
    Ok(Schedule {
        name: row.name,
        cron: row.cron,
        timezone: row.timezone,
        task_data: row.task_data,
        queue: row.queue,
        priority: row.priority,
        max_attempts: row.max_attempts,
        concurrency_key: row.concurrency_key,
        catch_up: row.catch_up,
        misfire_grace_seconds: row.misfire_grace_seconds,
        paused: row.paused,
        next_tick_at: row.next_tick_at,
        last_tick_at: row.last_tick_at,
        last_task_id: row.last_task_id,
        created_at: row.created_at,
        updated_at: row.updated_at,
    })
}
