//! What lease-service and task-service share: the error type and its one mapping to HTTP
//! ([`error`]), the database pool and migrations ([`db`]), and the HTTP plumbing ([`http`]):
//! extractor configuration that turns every malformed request into a JSON 4xx, fallbacks for
//! unknown routes and methods, request metrics, and cursor paging; and the start-up both services
//! run, with the flags they have in common ([`startup`]).

pub mod auth;
mod body;
pub mod coalesce;
pub mod command;
pub mod database;
pub mod db;
pub mod error;
pub mod front_door;
pub mod http;
pub mod json;
pub mod memory;
pub mod paging;
pub mod peer;
pub mod routes;
pub mod startup;
pub mod wakeups;

pub use error::ApiError;
pub use json::Json;

use crate::api::ErrorCode;

/// A batch request lists 1 to `max` items: `field` with `len` of them (`what` names them in the
/// message), else 400 `invalid_batch`.
pub fn check_batch_size(
    field: &'static str,
    what: &str,
    len: usize,
    max: usize,
) -> Result<(), ApiError> {
    if (1..=max).contains(&len) {
        return Ok(());
    }
    Err(ApiError::invalid(
        ErrorCode::InvalidBatch,
        field,
        format!("{field} must list 1 to {max} {what}, got {len}"),
    ))
}

/// The first item of `items` seen before: a batch that names one thing twice is refused.
pub fn first_duplicate<T: std::hash::Hash + Eq>(items: impl IntoIterator<Item = T>) -> Option<T> {
    let mut seen = std::collections::HashSet::new();
    items.into_iter().find_map(|item| {
        if seen.contains(&item) {
            Some(item)
        } else {
            seen.insert(item);
            None
        }
    })
}

/// SHA-256 of `text`: how bearer tokens and lease secrets are kept and compared, so that
/// neither sits in memory or in a table in a form that can be replayed.
pub fn sha256(text: &str) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut out = [0u8; 32];
    out.copy_from_slice(Sha256::digest(text.as_bytes()).as_slice());
    out
}

/// Names (resources, holders, processors, queues, keys): 1 to 512 characters (Unicode scalar
/// values, as JSON Schema's `maxLength` counts them, so that the API's documents can state the
/// bound exactly), no control characters
/// (PostgreSQL text cannot even hold NUL, and names with line breaks only confuse logs).
pub fn validate_name(field: &'static str, value: &str) -> Result<(), ApiError> {
    validate_name_within(field, value, crate::api::MAX_NAME_CHARS)
}

/// [`validate_name`] with another length limit.
pub fn validate_name_within(
    field: &'static str,
    value: &str,
    max_chars: usize,
) -> Result<(), ApiError> {
    let problem = crate::schema::name_problem(value, max_chars);
    match problem {
        Some(problem) => Err(ApiError::invalid(
            ErrorCode::InvalidField,
            field,
            format!("{field} {problem}"),
        )),
        None => Ok(()),
    }
}

/// Whether a JSON value holds a NUL character anywhere (a key or a string): PostgreSQL's
/// `jsonb` cannot store one, so such a value must be refused as bad input before it reaches a
/// statement, which would fail with a server error.
pub fn contains_nul(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::String(s) => s.contains('\0'),
        serde_json::Value::Array(items) => items.iter().any(contains_nul),
        serde_json::Value::Object(map) => map
            .iter()
            .any(|(key, value)| key.contains('\0') || contains_nul(value)),
        _ => false,
    }
}

/// The instants a request may name: years 1 to 9999. That is what RFC 3339 can write, so every
/// time the API stores it can also answer and its clients read back, and it lies well inside
/// PostgreSQL's `timestamptz` (4713 BC to 294276 AD), whose bounds would otherwise fail the
/// statement.
pub fn validate_timestamp(
    field: &'static str,
    at: &chrono::DateTime<chrono::Utc>,
) -> Result<(), ApiError> {
    use chrono::Datelike;
    if (1..=9999).contains(&at.year()) {
        return Ok(());
    }
    Err(ApiError::invalid(
        ErrorCode::InvalidField,
        field,
        format!("{field} must lie within the years 1 to 9999, got {at}"),
    ))
}

/// A lease secret read from a column (task-service keeps its task leases' secrets).
impl diesel::deserialize::FromSql<diesel::sql_types::Text, diesel::pg::Pg> for crate::api::Secret {
    fn from_sql(value: diesel::pg::PgValue<'_>) -> diesel::deserialize::Result<Self> {
        <String as diesel::deserialize::FromSql<diesel::sql_types::Text, diesel::pg::Pg>>::from_sql(
            value,
        )
        .map(crate::api::Secret::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_hold_one_to_max_distinct_items() {
        assert!(check_batch_size("tasks", "completions", 1, 3).is_ok());
        assert!(check_batch_size("tasks", "completions", 3, 3).is_ok());
        for len in [0, 4] {
            let err = check_batch_size("tasks", "completions", len, 3).err();
            assert_eq!(
                err.as_ref().map(ApiError::code),
                Some(ErrorCode::InvalidBatch),
                "{len}"
            );
        }
        assert_eq!(first_duplicate([1, 2, 3]), None);
        assert_eq!(first_duplicate([1, 2, 1, 2]), Some(1));
        assert_eq!(first_duplicate(["a", "b", "b"]), Some("b"));
    }

    #[test]
    fn timestamps_lie_within_the_years_one_to_9999() {
        use chrono::{TimeZone, Utc};
        for (year, ok) in [
            (-4714, false),
            (0, false),
            (1, true),
            (2030, true),
            (9999, true),
        ] {
            let at = Utc.with_ymd_and_hms(year, 1, 1, 0, 0, 0).single();
            let verdict = at.map(|at| validate_timestamp("scheduled_at", &at).is_ok());
            assert_eq!(verdict, Some(ok), "{year}");
        }
        let late = Utc.with_ymd_and_hms(10_000, 1, 1, 0, 0, 0).single();
        assert_eq!(
            late.map(|at| validate_timestamp("at", &at).is_ok()),
            Some(false)
        );
    }
}
