//! What lease-service and task-service share: the error type and its one mapping to HTTP
//! ([`error`]), the database pool and migrations ([`db`]), and the HTTP plumbing ([`http`]):
//! extractor configuration that turns every malformed request into a JSON 4xx, fallbacks for
//! unknown routes and methods, request metrics, and cursor paging.

pub mod db;
pub mod error;
pub mod http;

pub use error::ApiError;
