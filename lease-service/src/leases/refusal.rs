//! Refusals: why a statement asked to change a lease changed nothing, given the lease as it now
//! is. Each statement is one conditional `UPDATE`, which can say only that no row matched; the
//! reason (`not_holder`, `stale_fence`, `wrong_secret`, `lease_revoked`, `lease_released`,
//! `lease_expired`, or `lease_held` for an acquire) is judged here afterwards against one read, in
//! a fixed order so a caller learns first what matters most to it: someone else holds the lease
//! before its fence is stale, before its secret is wrong. Pure functions over a row, so the order
//! is tested without a database.

use leasehold::ErrorCode;

use crate::error::ApiError;
use crate::repo::LeaseRow;

pub(super) fn secret_required() -> ApiError {
    ApiError::invalid(
        ErrorCode::SecretRequired,
        "secret",
        "this lease-service requires proof of holding: send the `secret` your acquire answered with",
    )
}

/// Whether the presented secret's digest (if any) is the lease's.
pub(super) fn secret_matches(row: &LeaseRow, presented: Option<[u8; 32]>) -> bool {
    presented.is_none_or(|hash| row.secret_hash.as_deref() == Some(hash.as_slice()))
}

pub(super) fn wrong_secret(operation: &str) -> ApiError {
    ApiError::Conflict {
        code: ErrorCode::WrongSecret,
        message: format!("cannot {operation}: the secret is not this lease's"),
    }
}

/// Why a renew or release by `holder` (with `fence` and a secret's digest) changed nothing,
/// given the lease as it is.
pub(super) fn refusal(
    operation: &str,
    current: Option<LeaseRow>,
    holder: &str,
    fence: Option<i64>,
    presented: Option<[u8; 32]>,
) -> ApiError {
    let Some(row) = current else {
        return ApiError::NotFound {
            code: ErrorCode::LeaseNotFound,
            message: "no lease exists for that resource".to_owned(),
        };
    };
    let (code, message) = if row.holder != holder {
        (
            ErrorCode::NotHolder,
            format!("cannot {operation}: the lease is held by {:?}", row.holder),
        )
    } else if fence.is_some_and(|fence| fence != row.fence) {
        (
            ErrorCode::StaleFence,
            format!(
                "cannot {operation}: fence {} is not the current fence {}",
                fence.unwrap_or_default(),
                row.fence
            ),
        )
    } else if !secret_matches(&row, presented) {
        return wrong_secret(operation);
    } else if row.is_revoked() {
        (
            ErrorCode::LeaseRevoked,
            format!("cannot {operation}: an operator revoked the lease"),
        )
    } else if row.is_released() {
        (
            ErrorCode::LeaseReleased,
            format!("cannot {operation}: the lease was released"),
        )
    } else {
        (
            ErrorCode::LeaseExpired,
            format!("cannot {operation}: the lease expired"),
        )
    };
    ApiError::Conflict { code, message }
}

pub(super) fn held(current: LeaseRow) -> ApiError {
    let expires_in_ms = (current.expires_at - current.db_now)
        .num_milliseconds()
        .max(0);
    ApiError::Held {
        resource: current.resource,
        holder: current.holder,
        expires_at: current.expires_at,
        expires_in_ms,
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use leasehold::server::sha256;

    use super::*;
    use crate::leases::tests::row;

    #[test]
    fn refusals_name_the_first_reason_that_applies() {
        let code = |current: Option<LeaseRow>, holder: &str, fence: Option<i64>| {
            refusal("renew", current, holder, fence, Some(sha256("s"))).code()
        };
        assert_eq!(code(None, "h", None), ErrorCode::LeaseNotFound);
        assert_eq!(
            code(Some(row(false, 5)), "other", Some(9)),
            ErrorCode::NotHolder
        );
        assert_eq!(
            code(Some(row(false, 5)), "h", Some(8)),
            ErrorCode::StaleFence
        );
        assert_eq!(
            code(Some(row(true, 5)), "h", Some(9)),
            ErrorCode::LeaseReleased
        );
        let revoked = LeaseRow {
            revoked_at: Some(Utc::now()),
            ..row(true, 5)
        };
        assert_eq!(
            code(Some(revoked.clone()), "h", Some(9)),
            ErrorCode::LeaseRevoked
        );
        assert_eq!(code(Some(revoked), "other", Some(9)), ErrorCode::NotHolder);
        assert_eq!(
            code(Some(row(false, -1)), "h", None),
            ErrorCode::LeaseExpired
        );
        let wrong = refusal(
            "renew",
            Some(row(false, 5)),
            "h",
            Some(9),
            Some(sha256("x")),
        );
        assert_eq!(wrong.code(), ErrorCode::WrongSecret);
        let stale_first = refusal(
            "renew",
            Some(row(false, 5)),
            "h",
            Some(8),
            Some(sha256("x")),
        );
        assert_eq!(stale_first.code(), ErrorCode::StaleFence);
    }

    #[test]
    fn a_secret_matches_only_the_leases_own_and_absence_is_not_checked() {
        let lease = row(false, 5);
        assert!(secret_matches(&lease, None));
        assert!(secret_matches(&lease, Some(sha256("s"))));
        assert!(!secret_matches(&lease, Some(sha256("x"))));
        let without = LeaseRow {
            secret_hash: None,
            ..row(false, 5)
        };
        assert!(!secret_matches(&without, Some(sha256("s"))));
        assert!(secret_matches(&without, None));
    }

    #[test]
    fn held_tells_the_time_left_by_the_database_clock_never_negative() {
        let ApiError::Held {
            holder,
            expires_in_ms,
            ..
        } = held(row(false, 5))
        else {
            panic!("not lease_held");
        };
        assert_eq!((holder.as_str(), expires_in_ms), ("h", 5000));
        let ApiError::Held { expires_in_ms, .. } = held(row(false, -3)) else {
            panic!("not lease_held");
        };
        assert_eq!(expires_in_ms, 0);
    }
}
