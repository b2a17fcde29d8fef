//! Reading leases: by resource, by id, and the paged listings.

use diesel::OptionalExtension;
use diesel::result::Error as DieselError;
use diesel::sql_types::{Array, BigInt, Nullable, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use leasehold::server::db::{Cache, OneRow};
use leasehold::server::http::Page;
use tracing::Instrument;

use super::{COLUMNS, LeaseRow, Op, span};

const FIND_BY_RESOURCES: &str = concat!(
    "SELECT ",
    lease_columns!(),
    " FROM leases WHERE resource = ANY($1)"
);
const FIND_BY_RESOURCE: &str = concat!(
    "SELECT ",
    lease_columns!(),
    " FROM leases WHERE resource = $1"
);
const FIND_BY_ID: &str = concat!("SELECT ", lease_columns!(), " FROM leases WHERE id = $1");

/// The lease listings of the HTTP API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listing {
    All,
    Active,
    Expired,
    Renewed,
    Released,
}

impl Listing {
    fn condition(self) -> &'static str {
        match self {
            Listing::All => "TRUE",
            Listing::Active => "released_at IS NULL AND expires_at > now()",
            Listing::Expired => "released_at IS NULL AND expires_at <= now()",
            Listing::Renewed => "renewed_at IS NOT NULL",
            Listing::Released => "released_at IS NOT NULL",
        }
    }
}

/// The leases on `resources`, whatever their state.
pub async fn find_by_resources(
    conn: &mut AsyncPgConnection,
    resources: &[&str],
) -> Result<Vec<LeaseRow>, DieselError> {
    diesel::sql_query(FIND_BY_RESOURCES)
        .bind::<Array<Text>, _>(resources)
        .cached()
        .load(conn)
        .instrument(span(Op::Select, None))
        .await
}

pub async fn find_by_resource(
    conn: &mut AsyncPgConnection,
    resource: &str,
) -> Result<Option<LeaseRow>, DieselError> {
    diesel::sql_query(FIND_BY_RESOURCE)
        .bind::<Text, _>(resource)
        .cached()
        .get_one(conn)
        .instrument(span(Op::Select, None))
        .await
        .optional()
}

pub async fn find_by_id(
    conn: &mut AsyncPgConnection,
    id: i64,
) -> Result<Option<LeaseRow>, DieselError> {
    diesel::sql_query(FIND_BY_ID)
        .bind::<BigInt, _>(id)
        .cached()
        .get_one(conn)
        .instrument(span(Op::Select, None))
        .await
        .optional()
}

/// One page of a listing, in id order, starting after `after`. `limit` rows at most.
pub async fn list(
    conn: &mut AsyncPgConnection,
    listing: Listing,
    resources: ResourceFilter<'_>,
    page: Page,
) -> Result<Vec<LeaseRow>, DieselError> {
    let (order, past) = page.order.sql();
    // One text per filter, so that each kept plan uses its own index: the exact name its unique
    // index, whatever number of resources share a prefix.
    let (resource, name) = match (resources.exact, resources.prefix) {
        // The handler refuses both at once.
        (Some(exact), _) => ("resource = $2", Some(exact)),
        (None, Some(prefix)) => ("starts_with(resource, $2)", Some(prefix)),
        (None, None) => ("$2::text IS NULL", None),
    };
    let sql = format!(
        "SELECT {COLUMNS} FROM leases WHERE {} AND id {past} $1 AND {resource} {order} LIMIT $3",
        listing.condition()
    );
    diesel::sql_query(sql)
        .bind::<BigInt, _>(page.past_id())
        .bind::<Nullable<Text>, _>(name)
        .bind::<BigInt, _>(page.fetch())
        .cached()
        .load(conn)
        .instrument(span(Op::Select, None))
        .await
}

/// Which resources a listing covers: one by its exact name, those starting with a prefix, or all.
#[derive(Debug, Clone, Copy, Default)]
pub struct ResourceFilter<'a> {
    pub exact: Option<&'a str>,
    pub prefix: Option<&'a str>,
}

#[cfg(test)]
mod tests {
    use super::{FIND_BY_ID, FIND_BY_RESOURCE, FIND_BY_RESOURCES};

    #[test]
    fn every_lookup_reads_the_columns_of_a_lease_row() {
        for statement in [FIND_BY_ID, FIND_BY_RESOURCE, FIND_BY_RESOURCES] {
            assert!(statement.starts_with(concat!("SELECT ", lease_columns!(), " FROM leases")));
        }
    }
}
