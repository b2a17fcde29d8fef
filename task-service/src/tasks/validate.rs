//! The limits, and the checks of what a request asks to store. They run before any row is
//! locked or lease asked for, so bad input is refused with 400 and never writes anything; and
//! they hold what PostgreSQL cannot (NUL in `jsonb` or `text`) to a clear refusal instead of a
//! database error.

use leasehold::ErrorCode;
use leasehold::server::{ApiError, validate_name_within};
use leasehold::tasks::{CreateTask, MAX_QUEUE_CHARS};

use crate::context::Context;
use crate::repo::NewTask;

pub use leasehold::tasks::MAX_DATA_BYTES;
pub(crate) use leasehold::tasks::MAX_KEY_CHARS;
const PRIORITY_RANGE: std::ops::RangeInclusive<i32> = -1000..=1000;

/// What a create asks to store, checked, with its defaults filled in. A schedule's definition
/// goes through it too, so that none of its ticks' tasks can be refused later.
pub fn validate_new(engine: &Context, request: CreateTask) -> Result<NewTask, ApiError> {
    if !request.task_data.is_object() {
        return Err(ApiError::invalid(
            ErrorCode::InvalidField,
            "task_data",
            "task_data must be a JSON object",
        ));
    }
    check_size("task_data", &request.task_data)?;
    let queue = request.queue.unwrap_or_else(|| "default".to_owned());
    validate_name_within("queue", &queue, MAX_QUEUE_CHARS)?;
    let priority = request.priority.unwrap_or(0);
    if !PRIORITY_RANGE.contains(&priority) {
        return Err(ApiError::invalid(
            ErrorCode::InvalidField,
            "priority",
            format!("priority must be between -1000 and 1000, got {priority}"),
        ));
    }
    let max_attempts = request.max_attempts.unwrap_or(engine.default_max_attempts);
    if !(1..=1000).contains(&max_attempts) {
        return Err(ApiError::invalid(
            ErrorCode::InvalidField,
            "max_attempts",
            format!("max_attempts must be between 1 and 1000, got {max_attempts}"),
        ));
    }
    if let Some(key) = &request.idempotency_key {
        validate_name_within("idempotency_key", key, MAX_KEY_CHARS)?;
    }
    if let Some(key) = &request.concurrency_key {
        validate_name_within("concurrency_key", key, MAX_KEY_CHARS)?;
    }
    if let Some(at) = &request.scheduled_at {
        leasehold::server::validate_timestamp("scheduled_at", at)?;
    }
    Ok(NewTask {
        task_data: request.task_data,
        scheduled_at: request.scheduled_at,
        queue,
        priority,
        max_attempts,
        idempotency_key: request.idempotency_key,
        concurrency_key: request.concurrency_key,
    })
}

/// A JSON document the tasks table can store: at most [`MAX_DATA_BYTES`], and no NUL character
/// in any string or key (valid JSON, but PostgreSQL's `jsonb` cannot hold it).
pub(super) fn check_size(field: &'static str, value: &serde_json::Value) -> Result<(), ApiError> {
    let size = serde_json::to_vec(value)
        .map(|v| v.len())
        .unwrap_or(usize::MAX);
    if size > MAX_DATA_BYTES {
        return Err(ApiError::invalid(
            ErrorCode::TooLarge,
            field,
            format!("{field} is {size} bytes; at most {MAX_DATA_BYTES} are accepted"),
        ));
    }
    if leasehold::server::contains_nul(value) {
        return Err(ApiError::invalid(
            ErrorCode::InvalidField,
            field,
            format!("{field} must not contain NUL characters (\\u0000)"),
        ));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::tasks::fixtures;

    fn request(body: serde_json::Value) -> CreateTask {
        serde_json::from_value(body).unwrap()
    }

    fn refusal(body: serde_json::Value) -> Result<(), ErrorCode> {
        validate_new(&fixtures::engine(), request(body))
            .map(drop)
            .map_err(|err| err.code())
    }

    #[test]
    fn omitted_fields_take_their_defaults() {
        let task = validate_new(&fixtures::engine(), request(json!({"task_data": {}}))).unwrap();
        assert_eq!(task.queue, "default");
        assert_eq!(task.priority, 0);
        assert_eq!(task.max_attempts, 7, "the engine's default");
    }

    #[test]
    fn task_data_must_be_an_object() {
        assert_eq!(
            refusal(json!({"task_data": [1]})),
            Err(ErrorCode::InvalidField)
        );
        assert_eq!(
            refusal(json!({"task_data": "x"})),
            Err(ErrorCode::InvalidField)
        );
    }

    #[test]
    fn priority_is_held_to_its_range() {
        for ok in [-1000, 0, 1000] {
            assert_eq!(refusal(json!({"task_data": {}, "priority": ok})), Ok(()));
        }
        for bad in [-1001, 1001] {
            assert_eq!(
                refusal(json!({"task_data": {}, "priority": bad})),
                Err(ErrorCode::InvalidField)
            );
        }
    }

    #[test]
    fn max_attempts_is_held_to_its_range() {
        assert_eq!(refusal(json!({"task_data": {}, "max_attempts": 1})), Ok(()));
        assert_eq!(
            refusal(json!({"task_data": {}, "max_attempts": 1000})),
            Ok(())
        );
        assert_eq!(
            refusal(json!({"task_data": {}, "max_attempts": 0})),
            Err(ErrorCode::InvalidField)
        );
        assert_eq!(
            refusal(json!({"task_data": {}, "max_attempts": 1001})),
            Err(ErrorCode::InvalidField)
        );
    }

    #[test]
    fn queue_and_key_are_held_to_their_byte_limits() {
        let queue = |n: usize| json!({"task_data": {}, "queue": "q".repeat(n)});
        assert_eq!(refusal(queue(MAX_QUEUE_CHARS)), Ok(()));
        assert_ne!(refusal(queue(MAX_QUEUE_CHARS + 1)), Ok(()));
        let key = |n: usize| json!({"task_data": {}, "idempotency_key": "k".repeat(n)});
        assert_eq!(refusal(key(MAX_KEY_CHARS)), Ok(()));
        assert_ne!(refusal(key(MAX_KEY_CHARS + 1)), Ok(()));
    }

    #[test]
    fn data_is_held_to_its_size_once_serialised() {
        // `{"a":""}` is 8 bytes: the string fills the rest exactly.
        let sized = |n: usize| json!({"a": "x".repeat(n - 8)});
        assert!(check_size("task_data", &sized(MAX_DATA_BYTES)).is_ok());
        let err = check_size("task_data", &sized(MAX_DATA_BYTES + 1)).unwrap_err();
        assert_eq!(err.code(), ErrorCode::TooLarge);
    }

    #[test]
    fn nul_is_refused_wherever_it_hides() {
        for value in [
            json!({"a": "x\u{0}y"}),
            json!({"a\u{0}": 1}),
            json!({"a": [1, {"b": ["\u{0}"]}]}),
        ] {
            let err = check_size("task_data", &value).unwrap_err();
            assert_eq!(err.code(), ErrorCode::InvalidField, "{value}");
        }
        assert!(check_size("task_data", &json!({"a": ["x", {"b": "0"}]})).is_ok());
    }
}
