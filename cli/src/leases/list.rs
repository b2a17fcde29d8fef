//! `leases list`: a page of leases, or with --all every page.

use anyhow::Context;
use leasehold::lease_client::{LeaseListing, LeaseSet};

use crate::api::Api;
use crate::out::{Out, PageArgs, Shown, lease_table, more_hint, pages};

pub(super) async fn list(
    api: &Api,
    out: &Out,
    status: &str,
    prefix: Option<String>,
    page: &PageArgs,
) -> anyhow::Result<()> {
    let client = &api.leases;
    let set =
        LeaseSet::parse(status).with_context(|| format!("unknown lease status {status:?}"))?;
    let listing = LeaseListing {
        set,
        resource_prefix: prefix,
        limit: Some(page.limit),
        cursor: page.cursor.clone(),
        newest_first: page.sort.newest_first(),
    };
    let read = || async {
        let listed = pages(listing.cursor.clone(), page.all, |cursor| {
            let listing = LeaseListing {
                cursor,
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
        Ok(Shown::noted(text, hint))
    };
    out.watch(&page.watch, read).await
}
