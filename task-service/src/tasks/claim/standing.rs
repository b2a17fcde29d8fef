//! Where the worker processes' leases a claim group's requests name stand, read once for the
//! whole group.

use leasehold::server::ApiError;

use super::Want;
use crate::context::Context;
use crate::tasks::cover;
use crate::tasks::refusal::lease_refusal;

/// Where the worker processes' leases a claim group's requests name stand, by lease-service's
/// word, read in one call (`cover::check` asks once per distinct lease). A request's
/// completions are judged under the lease its claim names, so this serves both.
pub(super) struct Standing {
    /// The leases lease-service says are held.
    pub(super) held: Vec<(String, i64)>,
    /// Why each other lease is not, when lease-service answered.
    lost: Vec<((String, i64), leasehold::LeaseError)>,
    /// Why lease-service gave no answer, if it did not.
    unanswered: Option<leasehold::LeaseError>,
}

impl Standing {
    pub(super) async fn read(engine: &Context, wants: &[Want]) -> Standing {
        let mut named: Vec<&(String, i64)> =
            wants.iter().filter_map(|w| w.lease.as_ref()).collect();
        named.sort_unstable();
        named.dedup();
        let mut standing = Standing {
            held: Vec::new(),
            lost: Vec::new(),
            unanswered: None,
        };
        if named.is_empty() {
            return standing;
        }
        let leases: Vec<(&str, i64)> = named.iter().map(|(r, f)| (r.as_str(), *f)).collect();
        match cover::check(engine, &leases).await {
            Ok(checks) => {
                for (lease, check) in named.into_iter().zip(checks) {
                    match cover::verdict(&check) {
                        Ok(()) => standing.held.push(lease.clone()),
                        Err(err) => standing.lost.push((lease.clone(), err)),
                    }
                }
            }
            Err(err) => standing.unanswered = Some(err),
        }
        standing
    }

    /// Whether `want` may claim: it names no lease, or one that is held. A claim under a lease
    /// that is not (lapsed, superseded, revoked, or never granted) is refused as a heartbeat
    /// under it would be, rather than handed tasks its worker could never complete.
    /// (A completion under such a lease is judged the slow way instead, which asks again and
    /// answers the refusal.)
    pub(super) fn verdict(&self, engine: &Context, want: &Want) -> Result<(), ApiError> {
        let Some(lease) = want.lease.as_ref() else {
            return Ok(());
        };
        if self.held.contains(lease) {
            return Ok(());
        }
        let err = self
            .lost
            .iter()
            .find(|(lost, _)| lost == lease)
            .map(|(_, err)| err.clone())
            .or_else(|| self.unanswered.clone())
            .unwrap_or_else(|| leasehold::LeaseError::Unavailable("no answer".to_owned()));
        Err(lease_refusal(engine, "claim", err))
    }
}
