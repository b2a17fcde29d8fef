//! The lease that covers a claim. A task claimed by a worker process that announced itself is
//! covered by that process's liveness lease (`worker:<id>`, shared by all its tasks); any other
//! claim by a lease of the task's own (`task:<id>`). Every rule that must know whether the
//! claimant may still act asks here: a task's own lease is renewed by a heartbeat and released
//! by the end of the work, as before; a shared lease is only checked (one read in lease-service
//! for every task of a group), since its process keeps it alive and ends it itself. A shared
//! lease that lapsed, was taken anew under another fence, or was revoked fails the check for
//! every task it covers.

use std::collections::HashMap;

use leasehold::ErrorCode;
use leasehold::LeaseError;
use leasehold::api::{LeaseCheck, LeaseStanding, MAX_BATCH_RESOURCES};

use crate::context::Context;

/// What a check means to the claimant: it may act only while the lease is held.
pub(crate) fn verdict(check: &LeaseCheck) -> Result<(), LeaseError> {
    let code = match check.standing {
        LeaseStanding::Held => return Ok(()),
        LeaseStanding::Revoked => ErrorCode::LeaseRevoked,
        _ => ErrorCode::LeaseLost,
    };
    Err(LeaseError::Lost {
        code,
        reason: format!(
            "the lease {:?} of fence {} that covers the task is {:?}",
            check.resource, check.fence, check.standing
        ),
    })
}

/// Where each of `leases` stands, in order, asking lease-service once per distinct lease (in
/// calls of at most [`MAX_BATCH_RESOURCES`]).
pub(crate) async fn check(
    engine: &Context,
    leases: &[(&str, i64)],
) -> Result<Vec<LeaseCheck>, LeaseError> {
    let mut distinct: Vec<(&str, i64)> = leases.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    let mut standing: HashMap<(String, i64), LeaseCheck> = HashMap::new();
    for chunk in distinct.chunks(MAX_BATCH_RESOURCES) {
        for check in engine.leases.check_many(chunk).await? {
            standing.insert((check.resource.clone(), check.fence), check);
        }
    }
    leases
        .iter()
        .map(|(resource, fence)| {
            standing
                .get(&((*resource).to_owned(), *fence))
                .cloned()
                .ok_or_else(|| {
                    LeaseError::Unavailable(format!(
                        "lease-service did not answer for {resource:?} of fence {fence}"
                    ))
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(standing: LeaseStanding) -> LeaseCheck {
        LeaseCheck {
            resource: "worker:a".to_owned(),
            fence: 3,
            standing,
            expires_at: None,
            takeover_at: None,
            expires_in_ms: None,
        }
    }

    #[test]
    fn only_a_held_lease_lets_its_claimant_act_and_a_revoke_is_named() {
        assert!(verdict(&check(LeaseStanding::Held)).is_ok());
        for (standing, code) in [
            (LeaseStanding::Lapsed, ErrorCode::LeaseLost),
            (LeaseStanding::Expired, ErrorCode::LeaseLost),
            (LeaseStanding::Released, ErrorCode::LeaseLost),
            (LeaseStanding::Superseded, ErrorCode::LeaseLost),
            (LeaseStanding::Missing, ErrorCode::LeaseLost),
            (LeaseStanding::Revoked, ErrorCode::LeaseRevoked),
        ] {
            match verdict(&check(standing)) {
                Err(LeaseError::Lost { code: got, .. }) => assert_eq!(got, code, "{standing:?}"),
                other => panic!("{standing:?}: {other:?}"),
            }
        }
    }
}
