//! Check (`POST /api/leases/batch/check`): where each of several acquisitions stands, read in one
//! statement and written nowhere. A caller whose one lease covers many pieces of work (task-service,
//! for the tasks of a worker process it hands out under that process's lease) proves the lease
//! once per group of completions with it, instead of taking and releasing a lease per piece.

use std::collections::HashMap;

use diesel_async::AsyncPgConnection;
use leasehold::api::{LeaseCheck, LeaseRef, LeaseStanding, MAX_BATCH_RESOURCES};
use leasehold::server::{check_batch_size, validate_name};

use crate::error::ApiError;
use crate::repo::{self, LeaseRow};

/// Judges each acquisition against its resource's lease as one statement reads them.
pub async fn check_many(
    conn: &mut AsyncPgConnection,
    leases: &[LeaseRef],
) -> Result<Vec<LeaseCheck>, ApiError> {
    check_batch_size("leases", "checks", leases.len(), MAX_BATCH_RESOURCES)?;
    for lease in leases {
        validate_name("resource", &lease.resource)?;
    }
    let resources: Vec<&str> = leases.iter().map(|l| l.resource.as_str()).collect();
    let rows: HashMap<String, LeaseRow> = repo::find_by_resources(conn, &resources)
        .await?
        .into_iter()
        .map(|row| (row.resource.clone(), row))
        .collect();
    Ok(leases
        .iter()
        .map(|lease| judge(lease, rows.get(&lease.resource)))
        .collect())
}

/// Where the acquisition `lease` stands, given its resource's lease row as it is now.
fn judge(lease: &LeaseRef, row: Option<&LeaseRow>) -> LeaseCheck {
    let standing = match row {
        None => LeaseStanding::Missing,
        Some(row) if row.fence > lease.fence => LeaseStanding::Superseded,
        Some(row) if row.fence < lease.fence => LeaseStanding::Missing,
        Some(row) if row.is_revoked() => LeaseStanding::Revoked,
        Some(row) if row.is_released() => LeaseStanding::Released,
        Some(row) if !row.is_expired() => LeaseStanding::Held,
        Some(row) if row.takeover_at > row.db_now => LeaseStanding::Lapsed,
        Some(_) => LeaseStanding::Expired,
    };
    let current = row.filter(|row| row.fence == lease.fence);
    LeaseCheck {
        resource: lease.resource.clone(),
        fence: lease.fence,
        standing,
        expires_at: current
            .filter(|row| !row.is_released())
            .map(|row| row.expires_at),
        takeover_at: current
            .filter(|_| standing.keeps_others_off())
            .map(|row| row.takeover_at),
        expires_in_ms: current
            .filter(|_| standing.held())
            .map(|row| (row.expires_at - row.db_now).num_milliseconds()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use chrono::{Duration, Utc};

    use super::*;

    fn row(fence: i64, expires_in: i64, takeover_in: i64) -> LeaseRow {
        let now = Utc::now();
        LeaseRow {
            id: 1,
            resource: "worker:a".to_owned(),
            holder: "run".to_owned(),
            fence,
            ttl_seconds: 10,
            created_at: now,
            renewed_at: None,
            released_at: None,
            revoked_at: None,
            expires_at: now + Duration::seconds(expires_in),
            db_now: now,
            secret_hash: None,
            metadata: None,
            takeover_at: now + Duration::seconds(takeover_in),
        }
    }

    fn standing(fence: i64, row: Option<&LeaseRow>) -> LeaseStanding {
        let lease = LeaseRef {
            resource: "worker:a".to_owned(),
            fence,
        };
        judge(&lease, row).standing
    }

    #[test]
    fn an_acquisition_stands_as_its_row_says_and_only_its_own_row_counts() {
        let live = row(7, 5, 5);
        assert_eq!(standing(7, Some(&live)), LeaseStanding::Held);
        assert_eq!(standing(6, Some(&live)), LeaseStanding::Superseded);
        assert_eq!(standing(8, Some(&live)), LeaseStanding::Missing);
        assert_eq!(standing(7, None), LeaseStanding::Missing);
        assert_eq!(standing(7, Some(&row(7, -1, 1))), LeaseStanding::Lapsed);
        assert_eq!(standing(7, Some(&row(7, -1, -1))), LeaseStanding::Expired);
        let mut released = row(7, 5, 5);
        released.released_at = Some(released.db_now);
        assert_eq!(standing(7, Some(&released)), LeaseStanding::Released);
        released.revoked_at = released.released_at;
        assert_eq!(standing(7, Some(&released)), LeaseStanding::Revoked);
    }

    #[test]
    fn only_a_held_or_lapsed_acquisition_names_when_others_may_take_over() {
        let lease = LeaseRef {
            resource: "worker:a".to_owned(),
            fence: 7,
        };
        let lapsed = row(7, -1, 1);
        let check = judge(&lease, Some(&lapsed));
        assert_eq!(check.takeover_at, Some(lapsed.takeover_at));
        assert_eq!(check.expires_at, Some(lapsed.expires_at));
        let newer = row(8, 5, 5);
        let check = judge(&lease, Some(&newer));
        assert_eq!((check.expires_at, check.takeover_at), (None, None));
    }
}
