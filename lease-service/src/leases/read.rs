//! Reads: one lease by id, in any state, as the API shows it (revoke answers with it too, and
//! both must say "not found" the same way), a page of a listing, and whether the database
//! answers.

use chrono::{DateTime, Utc};
use diesel_async::AsyncPgConnection;
use leasehold::ErrorCode;
use leasehold::api::{Lease, MAX_NAME_CHARS};
use leasehold::server::http::Page;

use super::to_api;
use crate::error::ApiError;
use crate::repo::{self, Listing, ResourceFilter};

pub async fn get(conn: &mut AsyncPgConnection, id: i64) -> Result<Lease, ApiError> {
    repo::find_by_id(conn, id)
        .await?
        .map(to_api)
        .ok_or_else(|| ApiError::NotFound {
            code: ErrorCode::LeaseNotFound,
            message: format!("no lease with id {id}"),
        })
}

/// Checks a listing's resource filter: one resource by name, a prefix, or both (the resource,
/// if it has the prefix), neither longer than a name may be.
pub fn check_filter(filter: ResourceFilter<'_>) -> Result<(), ApiError> {
    for (name, value) in [
        ("resource", filter.exact),
        ("resource_prefix", filter.prefix),
    ] {
        if let Some(value) = value
            && value.chars().count() > MAX_NAME_CHARS
        {
            return Err(ApiError::invalid(
                ErrorCode::InvalidField,
                name,
                format!("{name} must be at most {MAX_NAME_CHARS} characters"),
            ));
        }
    }
    Ok(())
}

/// One page of a listing, and the database's clock its leases were judged by (none for an
/// empty page): one statement's `now()`, the same for every row.
pub async fn list(
    conn: &mut AsyncPgConnection,
    listing: Listing,
    filter: ResourceFilter<'_>,
    page: Page,
) -> Result<(Vec<Lease>, Option<DateTime<Utc>>), ApiError> {
    // Both filters narrow alike: the named resource, if it has the prefix.
    if let (Some(exact), Some(prefix)) = (filter.exact, filter.prefix)
        && !exact.starts_with(prefix)
    {
        return Ok((Vec::new(), None));
    }
    let rows = repo::list(conn, listing, filter, page).await?;
    let now = rows.first().map(|row| row.db_now);
    Ok((rows.into_iter().map(to_api).collect(), now))
}

/// Whether the database answers.
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_filter_names_one_resource_a_prefix_or_both_within_the_name_limit() {
        let filter = |exact, prefix| ResourceFilter { exact, prefix };
        assert!(check_filter(filter(None, None)).is_ok());
        assert!(check_filter(filter(Some("r"), None)).is_ok());
        assert!(check_filter(filter(None, Some("task:"))).is_ok());
        assert!(check_filter(filter(Some("r"), Some("r"))).is_ok());
        let long = "x".repeat(MAX_NAME_CHARS + 1);
        let too_long = check_filter(filter(None, Some(&long))).unwrap_err();
        assert_eq!(too_long.code(), ErrorCode::InvalidField);
    }
}
