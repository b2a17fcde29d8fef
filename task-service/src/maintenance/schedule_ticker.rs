//! The ticker: every replica runs one, and whichever locks a due schedule first makes its ticks.
//!
//! A round locks the due schedules (`FOR UPDATE SKIP LOCKED`, so tickers never wait on each
//! other), makes each due tick's task and moves the schedule to its next tick, all in one
//! transaction: a tick is made exactly once, by whichever replica commits it, and a replica
//! killed mid-round leaves its schedules due for another. The times are the transaction's
//! `now()`, never this host's clock. A replica frozen mid-round (SIGSTOP, a stalled VM) would
//! hold its schedules' locks for as long as it is frozen, and no other replica could make their
//! ticks; so the round's transaction asks PostgreSQL to end it once it has waited on its client
//! for [`repo::IDLE_IN_ROUND`], which rolls it back and frees the schedules for the others.
//!
//! Between rounds the ticker sleeps until the earliest next tick (asked of the database, so a
//! host clock that drifts does not matter), or until this replica changes a schedule, and at
//! most [`RECHECK`], which bounds how long a schedule created on another replica waits for its
//! first tick if that replica dies at once: well within the default misfire grace.

use std::time::Duration;

use chrono::TimeDelta;
use diesel_async::AsyncConnection;
use leasehold::Backoff;
use leasehold::schedules::tick_key;
use leasehold::server::ApiError;
use leasehold::server::db::{self, DbPool};
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::repo::{self, Db, DueSchedule, NewTask};
use crate::schedules::cadence::{Cadence, Plan};

/// The longest sleep between rounds.
pub const RECHECK: Duration = Duration::from_secs(5);
/// Schedules one transaction makes ticks for; more due are taken by the next, at once.
const SCHEDULES_PER_ROUND: i64 = 50;

/// Runs rounds until `stop`; a round under way when `stop` comes is finished first.
pub async fn run(pool: DbPool, engine: Context, stop: CancellationToken) {
    let backoff = Backoff::new(Duration::from_millis(200), RECHECK);
    let mut failures = 0u32;
    while !stop.is_cancelled() {
        let wait = match round(&pool, &engine).await {
            Ok(wait) => {
                failures = 0;
                wait
            }
            Err(err) => {
                tracing::warn!(error = %err, "schedule ticker round failed; retrying");
                failures = failures.saturating_add(1);
                backoff.delay(failures)
            }
        };
        if wait.is_zero() {
            continue;
        }
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(wait) => {}
            () = engine.schedules_changed.notified() => {}
        }
    }
}

/// Makes every due tick; how long until the next one (at most [`RECHECK`]).
async fn round(pool: &DbPool, engine: &Context) -> Result<Duration, ApiError> {
    let mut conn = db::connection(pool).await?;
    loop {
        let (locked, made) = tick_due(&mut conn, engine).await?;
        for (queue, tasks) in made {
            engine
                .metrics
                .created
                .with_label_values(&[&queue])
                .inc_by(tasks);
        }
        if locked < SCHEDULES_PER_ROUND {
            break;
        }
    }
    let wait = repo::next_tick_in(&mut conn).await?;
    Ok(wait.map_or(RECHECK, |seconds| {
        Duration::try_from_secs_f64(seconds.max(0.0))
            .unwrap_or(RECHECK)
            .min(RECHECK)
    }))
}

/// One transaction: up to [`SCHEDULES_PER_ROUND`] due schedules locked, their ticks' tasks
/// made, and each moved to its next tick. How many were locked, and the tasks made per queue.
async fn tick_due(conn: &mut Db, engine: &Context) -> Result<(i64, Vec<(String, u64)>), ApiError> {
    let mut counted: Vec<(String, &'static str, u64)> = Vec::new();
    let (locked, made) = conn
        .transaction::<_, ApiError, _>(async |conn| {
            repo::bound_idle_in_transaction(conn).await?;
            let due = repo::lock_due_schedules(conn, SCHEDULES_PER_ROUND).await?;
            let mut made = Vec::new();
            for schedule in &due {
                let (plan, tasks) = tick(conn, schedule).await?;
                let name = &schedule.schedule.name;
                counted.push((name.clone(), "created", plan.on_time.len() as u64));
                counted.push((
                    name.clone(),
                    "caught_up",
                    u64::from(plan.caught_up.is_some()),
                ));
                counted.push((name.clone(), "skipped", plan.skipped));
                counted.push((
                    name.clone(),
                    "duplicate",
                    plan.ticks().count() as u64 - tasks,
                ));
                made.push((schedule.schedule.queue.clone(), tasks));
            }
            Ok((i64::try_from(due.len()).unwrap_or(i64::MAX), made))
        })
        .await?;
    for (schedule, outcome, ticks) in counted.into_iter().filter(|c| c.2 > 0) {
        engine
            .metrics
            .schedule_ticks
            .with_label_values(&[&schedule, outcome])
            .inc_by(ticks);
    }
    Ok((locked, made))
}

/// Makes the ticks one locked schedule owes and moves it on: its plan and the tasks stored (a
/// tick whose task exists already stores none).
async fn tick(conn: &mut Db, due: &DueSchedule) -> Result<(Plan, u64), ApiError> {
    let schedule = &due.schedule;
    let Some(next_tick) = schedule.next_tick_at else {
        return Err(ApiError::Internal(format!(
            "schedule {:?} is due without a next tick",
            schedule.name
        )));
    };
    let catch_up = schedule.catch_up;
    let plan = match Cadence::parse(&schedule.cron, &schedule.timezone) {
        Ok(cadence) => cadence.plan(
            next_tick,
            due.now,
            TimeDelta::seconds(i64::from(schedule.misfire_grace_seconds)),
            catch_up,
        ),
        Err(err) => {
            // Stored definitions were checked when stored; one this build cannot read is paused
            // (no next tick) rather than retried every round.
            tracing::error!(schedule = %schedule.name, error = %err, "cannot read a stored schedule; pausing it");
            repo::advance_schedule(conn, schedule.id, None, None).await?;
            return Ok((empty_plan(), 0));
        }
    };
    let tasks: Vec<NewTask> = plan
        .ticks()
        .map(|tick| NewTask {
            task_data: schedule.task_data.clone(),
            scheduled_at: Some(tick),
            queue: schedule.queue.clone(),
            priority: schedule.priority,
            max_attempts: schedule.max_attempts,
            idempotency_key: Some(tick_key(&schedule.name, tick)),
            concurrency_key: schedule.concurrency_key.clone(),
        })
        .collect();
    let inserted = if tasks.is_empty() {
        Vec::new()
    } else {
        repo::insert_many(conn, &tasks.iter().collect::<Vec<_>>()).await?
    };
    let last = inserted
        .iter()
        .max_by_key(|row| row.ord)
        .map(|row| (row.row.scheduled_at, row.row.id));
    repo::advance_schedule(conn, schedule.id, plan.next, last).await?;
    if plan.next.is_none() {
        tracing::warn!(schedule = %schedule.name, "schedule never fires again; paused");
    }
    if plan.skipped > 0 || plan.caught_up.is_some() {
        tracing::info!(
            schedule = %schedule.name,
            skipped = plan.skipped,
            caught_up = ?plan.caught_up,
            catch_up = catch_up.as_str(),
            "schedule missed ticks while no replica could make them"
        );
    }
    Ok((plan, inserted.len() as u64))
}

fn empty_plan() -> Plan {
    Plan {
        on_time: Vec::new(),
        caught_up: None,
        skipped: 0,
        next: None,
    }
}
