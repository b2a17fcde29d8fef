//! What lease-service and task-service share: the error type and its one mapping to HTTP
//! ([`error`]), the database pool and migrations ([`db`]), and the HTTP plumbing ([`http`]):
//! extractor configuration that turns every malformed request into a JSON 4xx, fallbacks for
//! unknown routes and methods, request metrics, and cursor paging.

pub mod auth;
pub mod db;
pub mod error;
pub mod http;

pub use error::ApiError;

/// SHA-256 of `text`: how bearer tokens and lease secrets are kept and compared, so that
/// neither sits in memory or in a table in a form that can be replayed.
pub fn sha256(text: &str) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut out = [0u8; 32];
    out.copy_from_slice(Sha256::digest(text.as_bytes()).as_slice());
    out
}

/// Names (resources, holders, processors, queues, keys): 1 to 512 bytes, no control characters
/// (PostgreSQL text cannot even hold NUL, and names with line breaks only confuse logs).
pub fn validate_name(field: &'static str, value: &str) -> Result<(), ApiError> {
    validate_name_within(field, value, crate::api::MAX_NAME_BYTES)
}

/// [`validate_name`] with another length limit.
pub fn validate_name_within(
    field: &'static str,
    value: &str,
    max_bytes: usize,
) -> Result<(), ApiError> {
    let problem = if value.is_empty() {
        Some("must not be empty".to_owned())
    } else if value.len() > max_bytes {
        Some(format!(
            "must be at most {max_bytes} bytes, got {}",
            value.len()
        ))
    } else if value.chars().any(char::is_control) {
        Some("must not contain control characters".to_owned())
    } else {
        None
    };
    match problem {
        Some(problem) => Err(ApiError::invalid(
            "invalid_field",
            field,
            format!("{field} {problem}"),
        )),
        None => Ok(()),
    }
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
