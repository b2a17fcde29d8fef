//! What a holder does with a lease: `leases acquire`, `renew` and `release`.

use std::time::Duration;

use anyhow::bail;
use leasehold::api::Proof;

use super::ProofArgs;
use crate::api::Api;
use crate::out::{Out, lease_table};

pub(super) async fn acquire(
    api: &Api,
    out: &Out,
    resource: &str,
    holder: &str,
    ttl: Option<i64>,
) -> anyhow::Result<()> {
    let lease = api
        .leases
        .acquire(resource, holder, seconds(ttl)?)
        .await
        .map_err(api.leases_failed("POST", "/api/leases"))?;
    out.value(&lease, |lease| {
        let mut text = lease_table(std::slice::from_ref(lease), out.view());
        if let Some(secret) = &lease.secret {
            text.push_str(&format!("\nsecret: {}", secret.expose()));
        }
        Ok(text)
    })
}

pub(super) async fn renew(
    api: &Api,
    out: &Out,
    resource: &str,
    proof: &ProofArgs,
    ttl: Option<i64>,
) -> anyhow::Result<()> {
    let lease = api
        .leases
        .renew(resource, &proof.holder, proof.proof(), seconds(ttl)?)
        .await
        .map_err(api.leases_failed("PUT", "/api/leases/renew"))?;
    super::print(out, &lease)
}

pub(super) async fn release(
    api: &Api,
    out: &Out,
    resource: &str,
    proof: &ProofArgs,
) -> anyhow::Result<()> {
    let lease = api
        .leases
        .release(resource, &proof.holder, proof.proof())
        .await
        .map_err(api.leases_failed("DELETE", "/api/leases/release"))?;
    super::print(out, &lease)
}

impl ProofArgs {
    fn proof(&self) -> Proof<'_> {
        Proof {
            fence: self.fence,
            secret: self.secret.as_deref(),
        }
    }
}

/// `--ttl` as the client takes it. The client counts whole seconds of at least one, so a TTL
/// below that is refused here, as lease-service would refuse it, rather than rounded up.
fn seconds(ttl: Option<i64>) -> anyhow::Result<Option<Duration>> {
    ttl.map(|ttl| match u64::try_from(ttl) {
        Ok(seconds) if seconds >= 1 => Ok(Duration::from_secs(seconds)),
        _ => bail!("--ttl must be at least 1 second, got {ttl}"),
    })
    .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ttl_below_a_second_is_refused_not_rounded_up() {
        assert_eq!(seconds(None).unwrap_or_default(), None);
        assert_eq!(
            seconds(Some(60)).unwrap_or_default(),
            Some(Duration::from_secs(60))
        );
        assert!(seconds(Some(0)).is_err());
        assert!(seconds(Some(-5)).is_err());
    }
}
