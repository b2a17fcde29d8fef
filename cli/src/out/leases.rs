//! How leases print.

use leasehold::api::{Lease, LeaseStatus};

use super::{View, or_dash, table, time, wire_name};

/// Time left on a lease: only an active lease has any; an ended one shows `-`, not a zero
/// that reads like a lease about to run out.
pub(crate) fn time_left(lease: &Lease) -> String {
    if lease.status == LeaseStatus::Active {
        format!("{:.1}s", lease.expires_in_ms as f64 / 1000.0)
    } else {
        "-".to_owned()
    }
}

pub fn lease_table(leases: &[Lease], view: View) -> String {
    let wide = view.wide;
    let rows: Vec<Vec<String>> = leases
        .iter()
        .map(|l| {
            let mut row = vec![
                l.id.to_string(),
                l.resource.clone(),
                l.holder.clone(),
                l.fence.to_string(),
                view.status(&wire_name(&l.status)),
                time_left(l),
                time(&l.expires_at),
            ];
            if wide {
                row.extend([
                    l.ttl_seconds.to_string(),
                    time(&l.created_at),
                    or_dash(l.renewed_at.as_ref().map(time)),
                    or_dash(l.released_at.as_ref().map(time)),
                ]);
            }
            row
        })
        .collect();
    let mut headers = vec![
        "ID",
        "RESOURCE",
        "HOLDER",
        "FENCE",
        "STATUS",
        "LEFT",
        "EXPIRES AT",
    ];
    if wide {
        headers.extend(["TTL", "CREATED AT", "RENEWED AT", "RELEASED AT"]);
    }
    table(&headers, &rows)
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;

    #[test]
    fn only_an_active_lease_has_time_left() {
        let now = Utc::now();
        let lease = |status: LeaseStatus, expires_in_ms: i64| Lease {
            id: 1,
            resource: "r".to_owned(),
            holder: "h".to_owned(),
            fence: 1,
            ttl_seconds: 30,
            status,
            created_at: now,
            renewed_at: None,
            released_at: None,
            expires_at: now,
            expires_in_ms,
            secret: None,
            metadata: None,
        };
        assert_eq!(time_left(&lease(LeaseStatus::Active, 1500)), "1.5s");
        for ended in [
            LeaseStatus::Released,
            LeaseStatus::Revoked,
            LeaseStatus::Expired,
        ] {
            assert_eq!(time_left(&lease(ended, 0)), "-");
        }
    }
}
