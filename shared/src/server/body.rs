//! What the bounds on a request's body leave behind for its answer: the limit that refused it,
//! and the error of a body that came too slowly. Set and raised by [`super::http`], read by
//! [`super::front_door`] when it writes the refusal, so that neither imports the other.

/// The error inside the I/O error of a body that came too slowly; it carries the timeout.
#[derive(Debug, thiserror::Error)]
#[error("request body not received within {0:?}")]
pub(super) struct BodyTimedOut(pub(super) std::time::Duration);

/// The body limit [`super::http::extractors`] set, for the answer to a body past it.
#[derive(Debug, Clone, Copy)]
pub(super) struct BodyLimit(pub(super) usize);
