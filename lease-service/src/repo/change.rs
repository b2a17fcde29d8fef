//! Changing a held lease: its holder's renewal and release, one at a time or a group in one
//! statement, and an operator's revocation.

use diesel::OptionalExtension;
use diesel::result::Error as DieselError;
use diesel::sql_types::{Array, BigInt, Binary, Integer, Jsonb, Nullable, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use leasehold::server::db::{Cache, OneRow};
use tracing::Instrument;

use super::{LeaseRow, Op, span};

/// [`RENEW`] for many leases in one statement, each `(resource, holder, fence, secret digest,
/// TTL)` under the same conditions.
const RENEW_MANY: &str = concat!(
    "\
UPDATE leases SET
    renewed_at = now(),
    ttl_seconds = COALESCE(r.rn_ttl, ttl_seconds),
    expires_at = now() + make_interval(secs => COALESCE(r.rn_ttl, ttl_seconds)),
    timeline = leasehold_timeline(),
    metadata = COALESCE(r.rn_metadata, metadata)
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bytea[], $5::int[], $6::jsonb[])
     AS r(rn_resource, rn_holder, rn_fence, rn_hash, rn_ttl, rn_metadata)
WHERE resource = r.rn_resource AND holder = r.rn_holder
  AND (r.rn_fence IS NULL OR fence = r.rn_fence)
  AND (r.rn_hash IS NULL OR secret_hash = r.rn_hash)
  AND released_at IS NULL AND expires_at > now()
",
    returning_lease!()
);

/// [`RELEASE`] for many leases in one statement, each `(resource, holder, fence, secret digest,
/// id)` under the same conditions.
const RELEASE_MANY: &str = concat!(
    "\
UPDATE leases SET released_at = now()
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bytea[], $5::bigint[])
     AS r(rel_resource, rel_holder, rel_fence, rel_hash, rel_id)
WHERE resource = r.rel_resource AND holder = r.rel_holder
  AND (r.rel_fence IS NULL OR fence = r.rel_fence)
  AND (r.rel_id IS NULL OR id = r.rel_id)
  AND (r.rel_hash IS NULL OR secret_hash = r.rel_hash)
  AND released_at IS NULL AND expires_at > now()
",
    returning_lease!()
);

const RENEW: &str = concat!(
    "\
UPDATE leases SET
    renewed_at = now(),
    ttl_seconds = COALESCE($4, ttl_seconds),
    expires_at = now() + make_interval(secs => COALESCE($4, ttl_seconds)),
    timeline = leasehold_timeline(),
    metadata = COALESCE($6::jsonb, metadata)
WHERE resource = $1 AND holder = $2 AND ($3::bigint IS NULL OR fence = $3)
  AND ($5::bytea IS NULL OR secret_hash = $5)
  AND released_at IS NULL AND expires_at > now()
",
    returning_lease!()
);

const RELEASE: &str = concat!(
    "\
UPDATE leases SET released_at = now()
WHERE resource = $1 AND holder = $2 AND ($3::bigint IS NULL OR fence = $3)
  AND ($4::bigint IS NULL OR id = $4)
  AND ($5::bytea IS NULL OR secret_hash = $5)
  AND released_at IS NULL AND expires_at > now()
",
    returning_lease!()
);

/// An operator's release of whatever lease `id` is, whoever holds it: no secret, no holder.
/// The next acquisition still gets a greater fence, so the evicted holder's late writes are
/// refused wherever fences are checked; until then `revoked_at` tells its holder's renewals and
/// releases that the lease was taken from it, not handed back by it.
const REVOKE: &str = concat!(
    "\
UPDATE leases SET released_at = now(), revoked_at = now()
WHERE id = $1 AND released_at IS NULL AND expires_at > now()
",
    returning_lease!()
);

/// Gives each request the row a group statement returned for it: the first request, in order,
/// without a row yet, that the row satisfies (`serves`: same resource and holder, and fence,
/// secret digest and id where the request gives them). A request left without one changed
/// nothing, or repeated another request of the same statement (a batch may name a lease twice).
fn match_rows<T>(
    requests: &[T],
    serves: impl Fn(&T, &LeaseRow) -> bool,
    rows: Vec<LeaseRow>,
) -> Vec<Option<LeaseRow>> {
    let mut matched: Vec<Option<LeaseRow>> = requests.iter().map(|_| None).collect();
    for row in rows {
        let slot = requests
            .iter()
            .zip(matched.iter())
            .position(|(request, slot)| slot.is_none() && serves(request, &row));
        if let Some(index) = slot {
            matched[index] = Some(row);
        }
    }
    matched
}

/// Whether `row` meets a renewal's or release's conditions on who asks: its resource, holder,
/// fence (if given) and secret digest (if given).
fn asked_by(
    row: &LeaseRow,
    resource: &str,
    holder: &str,
    fence: Option<i64>,
    secret_hash: Option<&[u8; 32]>,
) -> bool {
    row.resource == resource
        && row.holder == holder
        && fence.is_none_or(|fence| fence == row.fence)
        && secret_hash.is_none_or(|hash| row.secret_hash.as_deref() == Some(hash.as_slice()))
}

/// `requests` in resource order, byte by byte: the order a group acquire takes
/// rows in (`COLLATE "C"`), whatever the database's collation. Renewal and release groups are
/// fed in it, and their plan (a nested loop from the `unnest`, one index probe per request:
/// `tests/tests/suite/query_plans.rs` checks that no plan reads more) locks rows in that order, so no
/// two groups wait on each other's rows in opposite orders.
fn in_resource_order<T>(requests: &[T], resource: impl Fn(&T) -> &str) -> Vec<&T> {
    let mut sorted: Vec<&T> = requests.iter().collect();
    sorted.sort_by(|a, b| resource(a).cmp(resource(b)));
    sorted
}

/// What a renewal and a release both prove about the lease they change, as the bind arrays of
/// their group statements (in the order of the requests given).
struct Proofs<'a> {
    resources: Vec<&'a str>,
    holders: Vec<&'a str>,
    fences: Vec<Option<i64>>,
    hashes: Vec<Option<&'a [u8]>>,
}

type Proof<'a> = (&'a String, &'a String, Option<i64>, Option<&'a [u8; 32]>);

impl<'a> Proofs<'a> {
    fn of<T>(requests: &[&'a T], proof: impl Fn(&'a T) -> Proof<'a>) -> Self {
        let mut proofs = Proofs {
            resources: Vec::with_capacity(requests.len()),
            holders: Vec::with_capacity(requests.len()),
            fences: Vec::with_capacity(requests.len()),
            hashes: Vec::with_capacity(requests.len()),
        };
        for request in requests {
            let (resource, holder, fence, hash) = proof(request);
            proofs.resources.push(resource);
            proofs.holders.push(holder);
            proofs.fences.push(fence);
            proofs.hashes.push(hash.map(<[u8; 32]>::as_slice));
        }
        proofs
    }
}

/// One renewal of a group: the conditions of [`renew`].
#[derive(Debug, Clone)]
pub struct Renewal {
    pub resource: String,
    pub holder: String,
    pub fence: Option<i64>,
    pub secret_hash: Option<[u8; 32]>,
    pub ttl_seconds: Option<i32>,
    /// Replaces the lease's metadata when given.
    pub metadata: Option<serde_json::Value>,
}

/// [`renew`] for many leases in one statement: the renewed row of each renewal, in order, or
/// `None` where it renewed nothing. One renewal runs [`renew`] (see [`take_each`](super::take_each) for why).
pub async fn renew_each(
    conn: &mut AsyncPgConnection,
    renewals: &[Renewal],
) -> Result<Vec<Option<LeaseRow>>, DieselError> {
    if let [one] = renewals {
        let hash = one.secret_hash.as_ref().map(<[u8; 32]>::as_slice);
        let renewed = renew(
            conn,
            &one.resource,
            &one.holder,
            one.fence,
            hash,
            one.ttl_seconds,
            one.metadata.as_ref(),
        );
        return Ok(vec![renewed.instrument(span(Op::Update, Some(1))).await?]);
    }
    let sorted = in_resource_order(renewals, |r| &r.resource);
    let proofs = Proofs::of(&sorted, |r| {
        (&r.resource, &r.holder, r.fence, r.secret_hash.as_ref())
    });
    let ttls: Vec<Option<i32>> = sorted.iter().map(|r| r.ttl_seconds).collect();
    let metadata: Vec<Option<&serde_json::Value>> =
        sorted.iter().map(|r| r.metadata.as_ref()).collect();
    let rows: Vec<LeaseRow> = diesel::sql_query(RENEW_MANY)
        .bind::<Array<Text>, _>(proofs.resources)
        .bind::<Array<Text>, _>(proofs.holders)
        .bind::<Array<Nullable<BigInt>>, _>(proofs.fences)
        .bind::<Array<Nullable<Binary>>, _>(proofs.hashes)
        .bind::<Array<Nullable<Integer>>, _>(ttls)
        .bind::<Array<Nullable<Jsonb>>, _>(metadata)
        .cached()
        .load(conn)
        .instrument(span(Op::Update, Some(renewals.len())))
        .await?;
    Ok(match_rows(
        renewals,
        |r, row| asked_by(row, &r.resource, &r.holder, r.fence, r.secret_hash.as_ref()),
        rows,
    ))
}

pub async fn renew(
    conn: &mut AsyncPgConnection,
    resource: &str,
    holder: &str,
    fence: Option<i64>,
    secret_hash: Option<&[u8]>,
    ttl_seconds: Option<i32>,
    metadata: Option<&serde_json::Value>,
) -> Result<Option<LeaseRow>, DieselError> {
    diesel::sql_query(RENEW)
        .bind::<Text, _>(resource)
        .bind::<Text, _>(holder)
        .bind::<Nullable<BigInt>, _>(fence)
        .bind::<Nullable<Integer>, _>(ttl_seconds)
        .bind::<Nullable<Binary>, _>(secret_hash)
        .bind::<Nullable<Jsonb>, _>(metadata)
        .cached()
        .get_one(conn)
        .instrument(span(Op::Update, None))
        .await
        .optional()
}

pub async fn release(
    conn: &mut AsyncPgConnection,
    resource: &str,
    holder: &str,
    fence: Option<i64>,
    secret_hash: Option<&[u8]>,
    id: Option<i64>,
) -> Result<Option<LeaseRow>, DieselError> {
    diesel::sql_query(RELEASE)
        .bind::<Text, _>(resource)
        .bind::<Text, _>(holder)
        .bind::<Nullable<BigInt>, _>(fence)
        .bind::<Nullable<BigInt>, _>(id)
        .bind::<Nullable<Binary>, _>(secret_hash)
        .cached()
        .get_one(conn)
        .instrument(span(Op::Update, None))
        .await
        .optional()
}

/// One release of a group: the conditions of [`release`].
#[derive(Debug, Clone)]
pub struct Release {
    pub resource: String,
    pub holder: String,
    pub fence: Option<i64>,
    pub secret_hash: Option<[u8; 32]>,
    pub id: Option<i64>,
}

/// [`release`] for many leases in one statement: the released row of each release, in order, or
/// `None` where it released nothing. One release runs [`release`] (see [`take_each`](super::take_each) for why).
pub async fn release_each(
    conn: &mut AsyncPgConnection,
    releases: &[Release],
) -> Result<Vec<Option<LeaseRow>>, DieselError> {
    if let [one] = releases {
        let hash = one.secret_hash.as_ref().map(<[u8; 32]>::as_slice);
        let released = release(conn, &one.resource, &one.holder, one.fence, hash, one.id);
        return Ok(vec![released.instrument(span(Op::Update, Some(1))).await?]);
    }
    let sorted = in_resource_order(releases, |r| &r.resource);
    let proofs = Proofs::of(&sorted, |r| {
        (&r.resource, &r.holder, r.fence, r.secret_hash.as_ref())
    });
    let ids: Vec<Option<i64>> = sorted.iter().map(|r| r.id).collect();
    let rows: Vec<LeaseRow> = diesel::sql_query(RELEASE_MANY)
        .bind::<Array<Text>, _>(proofs.resources)
        .bind::<Array<Text>, _>(proofs.holders)
        .bind::<Array<Nullable<BigInt>>, _>(proofs.fences)
        .bind::<Array<Nullable<Binary>>, _>(proofs.hashes)
        .bind::<Array<Nullable<BigInt>>, _>(ids)
        .cached()
        .load(conn)
        .instrument(span(Op::Update, Some(releases.len())))
        .await?;
    Ok(match_rows(
        releases,
        |r, row| {
            asked_by(row, &r.resource, &r.holder, r.fence, r.secret_hash.as_ref())
                && r.id.is_none_or(|id| id == row.id)
        },
        rows,
    ))
}

pub async fn revoke(
    conn: &mut AsyncPgConnection,
    id: i64,
) -> Result<Option<LeaseRow>, DieselError> {
    diesel::sql_query(REVOKE)
        .bind::<BigInt, _>(id)
        .cached()
        .get_one(conn)
        .instrument(span(Op::Update, None))
        .await
        .optional()
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::{LeaseRow, asked_by, in_resource_order, match_rows};

    fn row(id: i64, resource: &str, holder: &str, fence: i64) -> LeaseRow {
        let now = Utc::now();
        LeaseRow {
            id,
            resource: resource.to_owned(),
            holder: holder.to_owned(),
            fence,
            ttl_seconds: 30,
            created_at: now,
            renewed_at: None,
            released_at: None,
            revoked_at: None,
            expires_at: now,
            db_now: now,
            secret_hash: Some(vec![7; 32]),
            metadata: None,
            takeover_at: now,
        }
    }

    #[test]
    fn a_row_serves_only_requests_of_its_resource_holder_fence_and_secret() {
        let lease = row(1, "r", "h", 5);
        assert!(asked_by(&lease, "r", "h", None, None));
        assert!(asked_by(&lease, "r", "h", Some(5), Some(&[7; 32])));
        assert!(!asked_by(&lease, "r", "other", None, None));
        assert!(!asked_by(&lease, "other", "h", None, None));
        assert!(!asked_by(&lease, "r", "h", Some(4), None));
        assert!(!asked_by(&lease, "r", "h", None, Some(&[8; 32])));
    }

    #[test]
    fn each_row_goes_to_the_first_unserved_request_it_satisfies() {
        let requests = ["b", "a", "b", "c"];
        let rows = vec![
            row(1, "b", "h", 1),
            row(2, "a", "h", 1),
            row(3, "b", "h", 2),
        ];
        let matched = match_rows(&requests, |r, row| row.resource == *r, rows);
        let ids: Vec<Option<i64>> = matched.iter().map(|m| m.as_ref().map(|r| r.id)).collect();
        assert_eq!(ids, [Some(1), Some(2), Some(3), None]);
    }

    #[test]
    fn groups_are_fed_in_byte_order_whatever_the_arrival_order() {
        let requests = ["b", "B", "a", "é", "A"];
        let sorted: Vec<&str> = in_resource_order(&requests, |r| r)
            .into_iter()
            .copied()
            .collect();
        assert_eq!(sorted, ["A", "B", "a", "b", "é"]);
    }
}
