//! Creating many tasks at once (`POST /api/tasks/batch`): one statement and one commit for up to
//! [`MAX_CREATE_BATCH`] tasks, each judged as it would be alone. A refused item (bad input, a key
//! named twice in the batch) is that item's answer and writes nothing; a taken idempotency key
//! answers as a repeated single create does. Only a database failure fails the whole batch, and
//! then nothing was stored.

use std::collections::HashSet;

use actix_web::ResponseError;
use diesel_async::AsyncConnection;
use leasehold::ErrorCode;
use leasehold::server::http::invalid_body;
use leasehold::server::{ApiError, check_batch_size};
use leasehold::tasks::{CreateResult, CreateTask, MAX_CREATE_BATCH};

use super::create::{Created, create_group};
use super::validate::validate_new;
use crate::context::Context;
use crate::repo::{Db, NewTask};

#[tracing::instrument(name = "create tasks", skip_all, fields(tasks = request.tasks.len()))]
pub async fn create_many(
    conn: &mut Db,
    engine: &Context,
    request: Batch,
) -> Result<Vec<CreateResult>, ApiError> {
    check_batch_size("tasks", "tasks", request.tasks.len(), MAX_CREATE_BATCH)?;
    let checked = check(engine, request.tasks);
    let valid: Vec<&NewTask> = checked.iter().filter_map(|c| c.as_ref().ok()).collect();
    // Two batches inserting the same idempotency keys in crossed orders wait for each other.
    let mut retry = leasehold::server::db::Contended::default();
    let answers = loop {
        let outcome = conn
            .transaction::<_, ApiError, _>(async |conn| create_group(conn, &valid).await)
            .await;
        if !retry.again(&outcome).await {
            break outcome?;
        }
    };
    let mut answers = answers.into_iter();
    Ok(checked
        .into_iter()
        .map(|checked| {
            let outcome = match checked {
                Ok(_) => answers.next().unwrap_or_else(|| {
                    Err(ApiError::Internal("a create was not judged".to_owned()))
                }),
                Err(err) => Err(err),
            };
            result(engine, outcome)
        })
        .collect())
}

/// `POST /api/tasks/batch` as read: a [`leasehold::tasks::CreateTasks`] whose items are each
/// read apart, so that an item that is not a create (no `task_data`, a date past year 9999, a
/// float priority) is that item's refusal, as it would be alone, and not the whole batch's.
#[derive(Debug, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Batch {
    /// 1 to 1,000 creates, each a `POST /api/tasks` body judged as if alone.
    #[schema(min_items = 1, max_items = 1000)]
    pub tasks: Vec<serde_json::Value>,
}

/// Each create read and validated as if alone; a generator's fenced create, and a repeat of a
/// key named earlier in the batch, are refused.
fn check(engine: &Context, tasks: Vec<serde_json::Value>) -> Vec<Result<NewTask, ApiError>> {
    let mut keys = HashSet::new();
    tasks
        .into_iter()
        .map(|task| {
            let task: CreateTask =
                leasehold::strict::from_value(task).map_err(|err| invalid_body(&err))?;
            if task.generator_fence.is_some() {
                return Err(ApiError::invalid(
                    ErrorCode::InvalidField,
                    "generator_fence",
                    "a batch cannot carry a generator's create; send it alone",
                ));
            }
            let task = validate_new(engine, task)?;
            if let Some(key) = &task.idempotency_key
                && !keys.insert(key.clone())
            {
                return Err(ApiError::invalid(
                    ErrorCode::DuplicateIdempotencyKey,
                    "idempotency_key",
                    format!("idempotency_key {key:?} is named twice in this batch"),
                ));
            }
            Ok(task)
        })
        .collect()
}

fn result(engine: &Context, outcome: Result<Created, ApiError>) -> CreateResult {
    if let Ok(created) = &outcome {
        super::create::count(engine, created);
    }
    match outcome {
        Ok(Created::New(task)) => CreateResult {
            status: 201,
            task: Some(task),
            error: None,
        },
        Ok(Created::Existing(task)) => CreateResult {
            status: 200,
            task: Some(task),
            error: None,
        },
        Err(err) => CreateResult {
            status: err.status_code().as_u16(),
            task: None,
            error: Some(err.body()),
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::tasks::fixtures;

    fn create(key: Option<&str>) -> serde_json::Value {
        serde_json::to_value(CreateTask {
            task_data: serde_json::json!({"n": 1}),
            idempotency_key: key.map(str::to_owned),
            ..CreateTask::default()
        })
        .unwrap()
    }

    #[test]
    fn each_item_is_checked_alone_and_a_key_may_be_named_once() {
        let engine = fixtures::engine();
        let bad = serde_json::json!({"task_data": [1]});
        let mut fenced = create(None);
        fenced["generator_fence"] = serde_json::json!(3);
        // Items that are no create at all are refused alone too.
        let unreadable = [
            serde_json::json!({"queue": "q"}),
            serde_json::json!({"task_data": {}, "scheduled_at": "+10000-01-01T00:00:00Z"}),
            serde_json::json!({"task_data": {}, "priority": 1000.5}),
        ];
        let mut items = vec![create(Some("a")), bad, create(Some("a")), fenced];
        items.extend(unreadable);
        items.push(create(None));
        let checked = check(&engine, items);
        let codes: Vec<Option<ErrorCode>> = checked
            .iter()
            .map(|c| c.as_ref().err().map(ApiError::code))
            .collect();
        assert_eq!(
            codes,
            [
                None,
                Some(ErrorCode::InvalidField),
                Some(ErrorCode::DuplicateIdempotencyKey),
                Some(ErrorCode::InvalidField),
                Some(ErrorCode::MissingField),
                Some(ErrorCode::InvalidField),
                Some(ErrorCode::InvalidField),
                None
            ]
        );
    }
}
