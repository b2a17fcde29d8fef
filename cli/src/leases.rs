//! `leasehold leases`: list, show, acquire, renew, release and revoke.

use clap::{Args, Subcommand};
use leasehold::api::{Lease, LeasePage};
use serde_json::json;

use crate::api::{Api, listing_url};
use crate::out::{Out, lease_table, more_hint, typed};

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
        /// At most this many (a page is at most 1000).
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Continue from an earlier page: the cursor its last line (or its `nextCursor`) gave.
        #[arg(long)]
        cursor: Option<String>,
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
    let base = format!("{}/api/leases", api.leases);
    match command {
        LeaseCommand::List {
            status,
            prefix,
            limit,
            cursor,
        } => {
            let path = if status == "all" {
                String::new()
            } else {
                format!("/{status}")
            };
            let url = listing_url(
                &format!("{base}{path}"),
                limit,
                cursor.as_deref(),
                &[("resource_prefix", prefix.as_deref())],
            )?;
            let answer = api.get(url).await?;
            let page: LeasePage = typed(&answer)?;
            out.value(&answer, |_| Ok(lease_table(&page.leases)))?;
            if !out.json
                && let Some(hint) = more_hint(
                    page.leases.len(),
                    None,
                    "leases",
                    page.next_cursor.as_deref(),
                )
            {
                out.note(&hint);
            }
            Ok(())
        }
        LeaseCommand::Show { id } => {
            let answer = api.get(format!("{base}/{id}")).await?;
            out.value(&answer, |a| Ok(lease_table(&[typed(&a["lease"])?])))
        }
        LeaseCommand::Acquire {
            resource,
            holder,
            ttl,
        } => {
            let body = json!({"resource": resource, "holder": holder, "ttl_seconds": ttl});
            let lease = api.call(reqwest::Method::POST, base, Some(&body)).await?;
            out.value(&lease, |l| {
                let lease: Lease = typed(l)?;
                let mut text = lease_table(std::slice::from_ref(&lease));
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
            let body = json!({"resource": resource, "holder": proof.holder, "fence": proof.fence,
                              "secret": proof.secret, "ttl_seconds": ttl});
            let lease = api
                .call(reqwest::Method::PUT, format!("{base}/renew"), Some(&body))
                .await?;
            out.value(&lease, |l| Ok(lease_table(&[typed(l)?])))
        }
        LeaseCommand::Release { resource, proof } => {
            let body = json!({"resource": resource, "holder": proof.holder, "fence": proof.fence,
                              "secret": proof.secret});
            let lease = api
                .call(
                    reqwest::Method::DELETE,
                    format!("{base}/release"),
                    Some(&body),
                )
                .await?;
            out.value(&lease, |l| Ok(lease_table(&[typed(l)?])))
        }
        LeaseCommand::Revoke { id } => {
            let lease = api
                .call(reqwest::Method::POST, format!("{base}/{id}/revoke"), None)
                .await?;
            out.value(&lease, |l| Ok(lease_table(&[typed(l)?])))
        }
    }
}
