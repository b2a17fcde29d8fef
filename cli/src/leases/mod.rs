//! `leasehold leases`: list, show, acquire, renew, release and revoke.
//!
//! This file holds the subcommands and sends each to its module: `list`, `show`, `hold`
//! (what a holder does: acquire, renew, release) and `revoke` (what an operator does).

mod hold;
mod list;
mod revoke;
mod show;

use clap::{Args, Subcommand};
use leasehold::api::Lease;

use crate::api::Api;
use crate::out::{Out, PageArgs, lease_table};

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
    match command {
        LeaseCommand::List {
            status,
            prefix,
            page,
        } => list::list(api, out, &status, prefix, &page).await,
        LeaseCommand::Show { id } => show::show(api, out, id).await,
        LeaseCommand::Acquire {
            resource,
            holder,
            ttl,
        } => hold::acquire(api, out, &resource, &holder, ttl).await,
        LeaseCommand::Renew {
            resource,
            proof,
            ttl,
        } => hold::renew(api, out, &resource, &proof, ttl).await,
        LeaseCommand::Release { resource, proof } => {
            hold::release(api, out, &resource, &proof).await
        }
        LeaseCommand::Revoke { id } => revoke::revoke(api, out, id).await,
    }
}

/// A lease a write answered with, as a one-row table. Only `acquire` prints the secret as
/// well: only an acquisition's answer carries it.
fn print(out: &Out, lease: &Lease) -> anyhow::Result<()> {
    out.value(lease, |lease| {
        Ok(lease_table(std::slice::from_ref(lease), out.view()))
    })
}
