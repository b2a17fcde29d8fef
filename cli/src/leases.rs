//! `leasehold leases`: list, show, acquire, renew, release and revoke.

use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use leasehold::api::Proof;
use leasehold::lease_client::{LeaseListing, LeaseSet};
use serde_json::json;

use crate::api::Api;
use crate::out::{Out, PageArgs, lease_table, more_hint, pages};

#[derive(Debug, Subcommand)]
pub enum LeaseCommand {
    /// List leases, newest first.
    List {
        /// Which leases.
        #[arg(long, default_value = "all",
              value_parser = ["all", "active", "expired", "renewed", "released"])]
        status: String,
        /// Only leases whose resource starts with this.
        #[arg(long)]
        prefix: Option<String>,
        #[command(flatten)]
        page: PageArgs,
    },
    /// One lease by id.
    Show {
        /// The lease's id (the ID column of `leases list`).
        id: i64,
    },
    /// Acquire RESOURCE for --holder (prints the lease, with its secret).
    Acquire {
        /// The name of what is leased, e.g. `printer` or `task:42`.
        resource: String,
        /// Who holds the lease: the name renew and release must give.
        #[arg(long)]
        holder: String,
        /// Lease length in seconds (the service's default when absent).
        #[arg(long)]
        ttl: Option<i64>,
    },
    /// Renew RESOURCE for --holder.
    Renew {
        /// The leased resource.
        resource: String,
        #[command(flatten)]
        proof: ProofArgs,
        /// A new lease length in seconds (the lease's own when absent).
        #[arg(long)]
        ttl: Option<i64>,
    },
    /// Release RESOURCE for --holder.
    Release {
        /// The leased resource.
        resource: String,
        #[command(flatten)]
        proof: ProofArgs,
    },
    /// End lease ID whoever holds it (operator role); its holder is refused from then on.
    Revoke {
        /// The lease's id (the ID column of `leases list`).
        id: i64,
    },
}

#[derive(Debug, Args)]
pub struct ProofArgs {
    /// The holder named when the lease was acquired.
    #[arg(long)]
    holder: String,
    /// The lease's fence, refused unless current.
    #[arg(long)]
    fence: Option<i64>,
    /// The secret the acquire answered with.
    #[arg(long)]
    secret: Option<String>,
}

pub(crate) async fn leases(api: &Api, out: &Out, command: LeaseCommand) -> anyhow::Result<()> {
    let client = &api.leases;
    match command {
        LeaseCommand::List {
            status,
            prefix,
            page,
        } => {
            let set = LeaseSet::parse(&status)
                .with_context(|| format!("unknown lease status {status:?}"))?;
            let listing = LeaseListing {
                set,
                resource_prefix: prefix,
                limit: Some(page.limit),
                cursor: page.cursor.clone(),
                newest_first: page.sort.newest_first(),
            };
            let read = || async {
                let first = client
                    .list(&listing)
                    .await
                    .map_err(api.leases_failed("GET", &set.path()))?;
                let listed = pages(first, page.all, |cursor| {
                    let listing = LeaseListing {
                        cursor: Some(cursor),
                        ..listing.clone()
                    };
                    async move {
                        client
                            .list(&listing)
                            .await
                            .map_err(api.leases_failed("GET", &set.path()))
                    }
                })
                .await?;
                let text = out.render(&listed, |listed| {
                    Ok(lease_table(&listed.leases, out.view()))
                })?;
                let hint = more_hint(
                    listed.leases.len(),
                    None,
                    "leases",
                    page.sort,
                    listed.next_cursor.as_deref(),
                )
                .filter(|_| !out.machine());
                Ok((text, hint))
            };
            out.watch(&page.watch, read).await
        }
        LeaseCommand::Show { id } => {
            let lease = client
                .lease(id)
                .await
                .map_err(api.leases_failed("GET", &format!("/api/leases/{id}")))?;
            // The service's answer, which names the lease.
            out.value(&json!({ "lease": lease }), |_| {
                Ok(lease_table(std::slice::from_ref(&lease), out.view()))
            })
        }
        LeaseCommand::Acquire {
            resource,
            holder,
            ttl,
        } => {
            let lease = client
                .acquire(&resource, &holder, seconds(ttl)?)
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
        LeaseCommand::Renew {
            resource,
            proof,
            ttl,
        } => {
            let lease = client
                .renew(&resource, &proof.holder, proof.proof(), seconds(ttl)?)
                .await
                .map_err(api.leases_failed("PUT", "/api/leases/renew"))?;
            out.value(&lease, |lease| {
                Ok(lease_table(std::slice::from_ref(lease), out.view()))
            })
        }
        LeaseCommand::Release { resource, proof } => {
            let lease = client
                .release(&resource, &proof.holder, proof.proof())
                .await
                .map_err(api.leases_failed("DELETE", "/api/leases/release"))?;
            out.value(&lease, |lease| {
                Ok(lease_table(std::slice::from_ref(lease), out.view()))
            })
        }
        LeaseCommand::Revoke { id } => {
            let lease = client
                .revoke(id)
                .await
                .map_err(api.leases_failed("POST", &format!("/api/leases/{id}/revoke")))?;
            out.value(&lease, |lease| {
                Ok(lease_table(std::slice::from_ref(lease), out.view()))
            })
        }
    }
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
