//! Creating a task (`POST /api/tasks`). Creates that arrive together are stored together
//! ([`create_group`]: one statement and one commit, as a batch's), each answered as if alone. A
//! create may be repeated with the same idempotency key after a lost answer, so a taken key
//! answers with the task it names, but only when the repeat asks for the same task: otherwise its
//! creator would silently get one it did not ask for. The generator's creates carry its lease's
//! fence and are stored only while that fence holds the lease, with a deadline the database
//! enforces, so a generator replica that lost its lease (paused, partitioned) cannot add tasks
//! beside the one that took over.

use leasehold::ErrorCode;
use leasehold::api::LeaseStatus;
use leasehold::server::ApiError;
use leasehold::tasks::{CreateTask, MAX_CREATE_BATCH, Task};
use tracing::field::Empty;

use super::CreateGroups;
use super::to_api;
use super::validate::validate_new;
use crate::context::Context;
use crate::db::{self, DbPool};
use crate::repo::{self, Db, NewTask, TaskRow};

/// A created task answers 201; a repeat of an idempotent create answers 200 with the first.
#[derive(Debug)]
pub enum Created {
    New(Task),
    Existing(Task),
}

#[tracing::instrument(name = "create task", skip_all, fields(task.id = Empty, task.queue = Empty))]
pub async fn create(
    pool: &DbPool,
    creates: &CreateGroups,
    engine: &Context,
    request: CreateTask,
) -> Result<Created, ApiError> {
    let generator_fence = request.generator_fence;
    let task = validate_new(engine, request)?;
    let created = match generator_fence {
        Some(fence) => {
            let mut conn = db::connection(pool).await?;
            let stored = create_generated(&mut conn, engine, &task, fence).await?;
            answer(&mut conn, &task, stored).await?
        }
        None => creates
            .submit((), task)
            .await
            .unwrap_or_else(|| Err(ApiError::Internal("the create group failed".to_owned())))?,
    };
    if let Created::New(task) = &created {
        let span = tracing::Span::current();
        span.record("task.id", task.id);
        span.record("task.queue", task.queue.as_str());
    }
    count(engine, &created);
    Ok(created)
}

/// Counts a task a create stored (not one a repeated key found), whichever way it came: alone,
/// or as a batch's item.
pub(super) fn count(engine: &Context, created: &Created) {
    if let Created::New(task) = created {
        engine
            .metrics
            .created
            .with_label_values(&[task.queue.as_str()])
            .inc();
    }
}

/// Creates stored by one statement (and one commit): single creates that arrive together, or
/// a batch's valid items (in the batch's transaction). Each is answered as it would be alone: a
/// taken key, a repeat within the group too, answers as a repeated create does. Ids are drawn
/// in the order given.
pub async fn create_group(
    conn: &mut Db,
    tasks: &[&NewTask],
) -> Result<Vec<Result<Created, ApiError>>, ApiError> {
    if let [task] = tasks {
        // Alone (the common case under light load): the single insert, kept prepared, one
        // round trip where a statement over a set takes two.
        let stored = repo::insert(conn, task).await?;
        return Ok(vec![answer(conn, task, stored).await]);
    }
    let mut stored = vec![None; tasks.len()];
    for inserted in repo::insert_many(conn, tasks).await? {
        let place = usize::try_from(inserted.ord - 1).ok();
        if let Some(slot) = place.and_then(|place| stored.get_mut(place)) {
            *slot = Some(inserted.row);
        }
    }
    let mut answers = Vec::with_capacity(tasks.len());
    for (task, row) in tasks.iter().zip(stored) {
        answers.push(answer(conn, task, row).await);
    }
    Ok(answers)
}

/// How many of the waiting creates form the next group: as many as a batch may hold.
pub fn creates_per_group(waiting: &[NewTask]) -> usize {
    waiting.len().min(MAX_CREATE_BATCH)
}

/// The answer to a create whose insert stored `stored`: the new task, or, when nothing was stored
/// (its idempotency key is taken), the task the key names.
async fn answer(
    conn: &mut Db,
    task: &NewTask,
    stored: Option<TaskRow>,
) -> Result<Created, ApiError> {
    match stored {
        Some(row) => Ok(Created::New(to_api(row))),
        None => existing(conn, task).await,
    }
}

/// The key of `task` is taken: the task it names, if the create is the same request.
async fn existing(conn: &mut Db, task: &NewTask) -> Result<Created, ApiError> {
    let key = task.idempotency_key.as_deref().unwrap_or_default();
    let existing = repo::find_by_idempotency_key(conn, key, task.scheduled_at)
        .await?
        .ok_or_else(|| {
            ApiError::Unavailable(
                "the task for that idempotency key was just deleted; retry".to_owned(),
            )
        })?;
    let differing = differences(&existing, task);
    let existing = existing.task;
    if !differing.is_empty() {
        return Err(ApiError::Unprocessable {
            code: ErrorCode::IdempotencyKeyReused,
            message: format!(
                "idempotency_key {key:?} already names task {}, made by a request with a \
                 different {}",
                existing.id,
                differing.join(", ")
            ),
        });
    }
    Ok(Created::Existing(to_api(existing)))
}

/// The fields in which `task` asks for something other than the stored task its idempotency key
/// names: a repeat must be the same request, or its creator would silently get a task it did
/// not ask for. `scheduled_at` is compared with the schedule the first request asked for (the
/// stored one moves with retries; naming none asks for the creation time), where that is known;
/// an omitted `max_attempts` is the default, as it was resolved for both.
fn differences(existing: &repo::KeyedTask, task: &NewTask) -> Vec<&'static str> {
    let row = &existing.task;
    [
        ("task_data", row.task_data == task.task_data),
        ("queue", row.queue == task.queue),
        ("priority", row.priority == task.priority),
        ("max_attempts", row.max_attempts == task.max_attempts),
        (
            "concurrency_key",
            row.concurrency_key == task.concurrency_key,
        ),
        ("scheduled_at", existing.same_schedule),
    ]
    .into_iter()
    .filter(|(_, same)| !same)
    .map(|(field, _)| field)
    .collect()
}

/// Stores a generator's task, made under the generator lease's `fence`, if that fence still
/// holds the lease and the generator is started; `None` when its idempotency key is taken.
async fn create_generated(
    conn: &mut Db,
    engine: &Context,
    task: &NewTask,
    fence: i64,
) -> Result<Option<TaskRow>, ApiError> {
    // The lease is good for at least `remaining` after the clock was read (it was measured
    // later), so an insert the database makes before `deadline` falls inside the term, however
    // long this process or the network stalls in between.
    let read_at = repo::clock(conn).await?;
    let remaining = check_generator_fence(engine, fence).await?;
    let deadline = read_at + remaining - GENERATOR_DEADLINE_MARGIN;
    if let Some(row) = repo::insert_generated(conn, task, deadline).await? {
        return Ok(Some(row));
    }
    if let Some(key) = task.idempotency_key.as_deref()
        && repo::find_by_idempotency_key(conn, key, task.scheduled_at)
            .await?
            .is_some()
    {
        return Ok(None);
    }
    if !repo::generator(conn).await?.running {
        return Err(ApiError::Conflict {
            code: ErrorCode::GeneratorStopped,
            message: "the generator is stopped: it may create no task until it is started"
                .to_owned(),
        });
    }
    Err(ApiError::Conflict {
        code: ErrorCode::StaleGenerator,
        message: format!("the generator lease of fence {fence} ran out before the task was stored"),
    })
}

/// Taken off a generator lease's remaining time, for the rate at which two databases' clocks
/// may drift apart over one lease term.
const GENERATOR_DEADLINE_MARGIN: chrono::TimeDelta = chrono::TimeDelta::milliseconds(50);

/// A generator replica may create tasks only under the generator lease's current fence: a
/// replica that lost the lease (paused, partitioned) and has not noticed yet is refused.
/// Returns how long the lease has left by lease-service's clock.
async fn check_generator_fence(
    engine: &Context,
    fence: i64,
) -> Result<chrono::TimeDelta, ApiError> {
    let current = engine
        .leases_retrying()
        .current(&engine.generator_resource)
        .await
        .map_err(|err| {
            ApiError::Unavailable(format!("cannot check the generator's lease: {err}"))
        })?;
    match current {
        Some(lease) if lease.fence == fence && lease.status == LeaseStatus::Active => {
            Ok(chrono::TimeDelta::milliseconds(lease.expires_in_ms))
        }
        other => Err(ApiError::Conflict {
            code: ErrorCode::StaleGenerator,
            message: format!(
                "fence {fence} does not hold the generator lease (current: {})",
                other.map_or("none".to_owned(), |lease| lease.fence.to_string())
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use leasehold::tasks::TaskStatus;

    use super::*;
    use crate::tasks::fixtures;

    fn same_as(row: &TaskRow) -> NewTask {
        NewTask {
            task_data: row.task_data.clone(),
            scheduled_at: None,
            queue: row.queue.clone(),
            priority: row.priority,
            max_attempts: row.max_attempts,
            idempotency_key: Some("k".to_owned()),
            concurrency_key: row.concurrency_key.clone(),
        }
    }

    #[test]
    fn a_repeat_of_the_same_request_differs_in_nothing() {
        let existing = repo::KeyedTask {
            task: fixtures::row(TaskStatus::Pending, None, None),
            same_schedule: true,
        };
        assert!(differences(&existing, &same_as(&existing.task)).is_empty());
    }

    #[test]
    fn every_differing_field_is_named() {
        let existing = repo::KeyedTask {
            task: fixtures::row(TaskStatus::Pending, None, None),
            same_schedule: false,
        };
        let mut task = same_as(&existing.task);
        task.task_data = serde_json::json!({"n": 2});
        task.priority += 1;
        task.max_attempts += 1;
        task.concurrency_key = Some("tenant".to_owned());
        assert_eq!(
            differences(&existing, &task),
            [
                "task_data",
                "priority",
                "max_attempts",
                "concurrency_key",
                "scheduled_at"
            ]
        );
        let mut task = same_as(&existing.task);
        task.queue = "other".to_owned();
        assert_eq!(differences(&existing, &task), ["queue", "scheduled_at"]);
    }
}
