//! What a group's work needs, and a member's answer when its group failed as a whole: shared by
//! [`super::groups`], which builds the groups, and the operation modules, whose work they run.

use super::{SecretPolicy, TtlPolicy};
use crate::db::DbPool;
use crate::error::ApiError;
use crate::metrics::Metrics;

/// What a group's work needs.
#[derive(Clone)]
pub(crate) struct GroupContext {
    pub(crate) pool: DbPool,
    pub(crate) ttl: TtlPolicy,
    pub(crate) secrets: SecretPolicy,
    pub(crate) metrics: Metrics,
}

/// What a member gets when its group's work panicked.
pub(crate) fn group_failed<T>() -> Result<T, ApiError> {
    Err(ApiError::Internal(
        "the group this request was served in failed".to_owned(),
    ))
}
