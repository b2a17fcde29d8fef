//! Every SQL statement of lease-service, and nothing else.
//!
//! Each state change is one statement, so it is atomic and judged by the database's clock
//! (`now()`); no host clock enters any expiry decision. Every statement is kept prepared
//! (`.cached()`), sets included, on plans made once per session ([`crate::db::SESSION`]).

use diesel::result::Error as DieselError;
use diesel::sql_types::{BigInt, Binary, Bool, Integer, Nullable, Text, Timestamptz};
use diesel::{OptionalExtension, QueryableByName};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use leasehold::server::db::Cache;
use leasehold::server::http::Page;

use std::collections::HashMap;

use chrono::{DateTime, Utc};

/// The lease's columns plus the database's `now()` at the time of the statement.
#[derive(Debug, Clone, QueryableByName)]
pub struct LeaseRow {
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    #[diesel(sql_type = Text)]
    pub resource: String,
    #[diesel(sql_type = Text)]
    pub holder: String,
    #[diesel(sql_type = BigInt)]
    pub fence: i64,
    #[diesel(sql_type = Integer)]
    pub ttl_seconds: i32,
    #[diesel(sql_type = Timestamptz)]
    pub created_at: DateTime<Utc>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub renewed_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub released_at: Option<DateTime<Utc>>,
    /// Set (to `released_at`) when an operator revoked the lease rather than its holder
    /// releasing it.
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub revoked_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Timestamptz)]
    pub expires_at: DateTime<Utc>,
    #[diesel(sql_type = Timestamptz)]
    pub db_now: DateTime<Utc>,
    /// SHA-256 of the acquisition's secret (never the secret itself); `None` for leases from
    /// before secrets existed.
    #[diesel(sql_type = Nullable<Binary>)]
    pub secret_hash: Option<Vec<u8>>,
}

impl LeaseRow {
    pub fn is_released(&self) -> bool {
        self.released_at.is_some()
    }

    pub fn is_revoked(&self) -> bool {
        self.revoked_at.is_some()
    }

    pub fn is_expired(&self) -> bool {
        self.expires_at <= self.db_now
    }

    pub fn is_active(&self) -> bool {
        !self.is_released() && !self.is_expired()
    }
}

#[derive(Debug, QueryableByName)]
struct AcquiredRow {
    #[diesel(embed)]
    lease: LeaseRow,
    /// True for a new acquisition, false for a reentrant one by the current holder.
    #[diesel(sql_type = Bool)]
    fresh: bool,
}

#[derive(Debug, QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    count: i64,
}

/// The columns of a [`LeaseRow`], for every statement that reads or returns one.
macro_rules! lease_columns {
    () => {
        "id, resource, holder, fence, ttl_seconds, created_at, renewed_at, released_at, revoked_at,
          expires_at, now() AS db_now, secret_hash"
    };
}

const COLUMNS: &str = lease_columns!();

/// What an acquire does to a row it may take (one text for [`ACQUIRE`] and [`ACQUIRE_MANY`], so
/// their rules cannot drift apart). A row still held by the same holder is reentrant: fence,
/// secret and `created_at` are kept, `renewed_at` is stamped. Any other row it may take gets a
/// new fence, drawn here, after the row lock is held, and `created_at` is that moment
/// (`clock_timestamp()`), never the statement's start: a takeover that waited for a release to
/// commit begins after it.
macro_rules! takeover {
    () => {
        "ON CONFLICT (resource) DO UPDATE SET
    fence = CASE WHEN l.holder = EXCLUDED.holder AND l.released_at IS NULL AND l.expires_at > now()
                 THEN l.fence ELSE nextval('leases_fence_seq') END,
    created_at = CASE WHEN l.holder = EXCLUDED.holder AND l.released_at IS NULL AND l.expires_at > now()
                      THEN l.created_at ELSE clock_timestamp() END,
    renewed_at = CASE WHEN l.holder = EXCLUDED.holder AND l.released_at IS NULL AND l.expires_at > now()
                      THEN now() ELSE NULL END,
    secret_hash = CASE WHEN l.holder = EXCLUDED.holder AND l.released_at IS NULL AND l.expires_at > now()
                       THEN l.secret_hash ELSE EXCLUDED.secret_hash END,
    holder = EXCLUDED.holder,
    released_at = NULL,
    revoked_at = NULL,
    ttl_seconds = EXCLUDED.ttl_seconds,
    expires_at = EXCLUDED.expires_at
"
    };
}

/// The columns an acquire returns: the lease, the database's clock, and whether it is new.
macro_rules! returning_acquired {
    () => {
        concat!(
            "RETURNING ",
            lease_columns!(),
            ", (renewed_at IS NULL) AS fresh"
        )
    };
}

/// The sample's acquire statement, with a fence, a per-request TTL, reentrancy and a secret.
///
/// The row is taken over only if its lease expired or was released, or if the requester already
/// holds it and proves it (`$5`, the digest of the secret it presents; with none, only when
/// `$6`, "a secret is required", is false). A takeover draws a new fence from the sequence
/// *inside* `DO UPDATE`, i.e. after the row lock is held, so it is greater than the fence of
/// whoever held the row before, and stores the digest of a new secret (`$4`). A reentrant
/// acquire keeps fence, secret and `created_at` and stamps `renewed_at`, which is how `fresh`
/// tells the two apart: only a new acquisition has `renewed_at IS NULL`.
const ACQUIRE: &str = concat!(
    "INSERT INTO leases AS l (resource, holder, fence, ttl_seconds, created_at, expires_at, secret_hash)
VALUES ($1, $2, nextval('leases_fence_seq'), $3, now(), now() + make_interval(secs => $3), $4)
",
    takeover!(),
    "WHERE l.expires_at <= now() OR l.released_at IS NOT NULL
   OR (l.holder = EXCLUDED.holder
       AND CASE WHEN $5::bytea IS NULL THEN NOT $6::boolean
                ELSE COALESCE(l.secret_hash = $5::bytea, FALSE) END)
",
    returning_acquired!()
);

/// [`ACQUIRE`] for many resources, each with its holder and TTL: one statement, one commit.
/// Rows are taken in resource order, byte by byte (`COLLATE "C"`, the order Rust sorts strings
/// in), so groups that share resources lock them in the same order and cannot deadlock. A
/// reentrant acquire here cannot present a secret, so it is allowed only when secrets are not
/// required (`$5`). A fence drawn by the `SELECT` for a row that then conflicts is simply
/// skipped: the sequence only rises.
const ACQUIRE_MANY: &str = concat!(
    "INSERT INTO leases AS l (resource, holder, fence, ttl_seconds, created_at, expires_at, secret_hash)
SELECT r.resource, r.holder, nextval('leases_fence_seq'), r.ttl_seconds, now(),
       now() + make_interval(secs => r.ttl_seconds), r.secret_hash
FROM unnest($1::text[], $2::text[], $3::int[], $4::bytea[])
     AS r(resource, holder, ttl_seconds, secret_hash)
ORDER BY r.resource COLLATE \"C\"
",
    takeover!(),
    "WHERE l.expires_at <= now() OR l.released_at IS NOT NULL
   OR (l.holder = EXCLUDED.holder AND NOT $5::boolean)
",
    returning_acquired!()
);

/// [`RENEW`] for many leases in one statement, each `(resource, holder, fence, secret digest,
/// TTL)` under the same conditions.
const RENEW_MANY: &str = concat!(
    "\
UPDATE leases SET
    renewed_at = now(),
    ttl_seconds = COALESCE(r.rn_ttl, ttl_seconds),
    expires_at = now() + make_interval(secs => COALESCE(r.rn_ttl, ttl_seconds))
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bytea[], $5::int[])
     AS r(rn_resource, rn_holder, rn_fence, rn_hash, rn_ttl)
WHERE resource = r.rn_resource AND holder = r.rn_holder
  AND (r.rn_fence IS NULL OR fence = r.rn_fence)
  AND (r.rn_hash IS NULL OR secret_hash = r.rn_hash)
  AND released_at IS NULL AND expires_at > now()
RETURNING ",
    lease_columns!()
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
RETURNING ",
    lease_columns!()
);

const RENEW: &str = concat!(
    "\
UPDATE leases SET
    renewed_at = now(),
    ttl_seconds = COALESCE($4, ttl_seconds),
    expires_at = now() + make_interval(secs => COALESCE($4, ttl_seconds))
WHERE resource = $1 AND holder = $2 AND ($3::bigint IS NULL OR fence = $3)
  AND ($5::bytea IS NULL OR secret_hash = $5)
  AND released_at IS NULL AND expires_at > now()
RETURNING ",
    lease_columns!()
);

const RELEASE: &str = concat!(
    "\
UPDATE leases SET released_at = now()
WHERE resource = $1 AND holder = $2 AND ($3::bigint IS NULL OR fence = $3)
  AND ($4::bigint IS NULL OR id = $4)
  AND ($5::bytea IS NULL OR secret_hash = $5)
  AND released_at IS NULL AND expires_at > now()
RETURNING ",
    lease_columns!()
);

/// An operator's release of whatever lease `id` is, whoever holds it: no secret, no holder.
/// The next acquisition still gets a greater fence, so the evicted holder's late writes are
/// refused wherever fences are checked; until then `revoked_at` tells its holder's renewals and
/// releases that the lease was taken from it, not handed back by it.
const REVOKE: &str = concat!(
    "\
UPDATE leases SET released_at = now(), revoked_at = now()
WHERE id = $1 AND released_at IS NULL AND expires_at > now()
RETURNING ",
    lease_columns!()
);

/// Deletes a batch of leases that ended more than `$1` seconds ago. The age test is repeated on
/// the target rows (not only in the subquery) so that a row re-acquired while the statement
/// waits for its lock is rechecked on its new version and kept.
const SWEEP: &str = "\
DELETE FROM leases
WHERE id IN (SELECT id FROM leases
             WHERE COALESCE(released_at, expires_at) < now() - make_interval(secs => $1)
             LIMIT $2)
  AND COALESCE(released_at, expires_at) < now() - make_interval(secs => $1)";

/// Set once at start by the hidden test-only switch: acquire skips its expiry check.
pub static BREAK_ACQUIRE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the test-only switch is on: then every single acquire runs [`acquire`], the only
/// statement it breaks.
pub fn acquire_is_broken() -> bool {
    std::sync::atomic::AtomicBool::load(&BREAK_ACQUIRE, std::sync::atomic::Ordering::Relaxed)
}

/// [`ACQUIRE`] without its expiry check: it takes over live leases (tests of the checker only).
const ACQUIRE_BROKEN: &str = concat!(
    "\
INSERT INTO leases AS l (resource, holder, fence, ttl_seconds, created_at, expires_at, secret_hash)
VALUES ($1, $2, nextval('leases_fence_seq'), $3, now(), now() + make_interval(secs => $3), $4)
ON CONFLICT (resource) DO UPDATE SET
    fence = nextval('leases_fence_seq'), created_at = now(), renewed_at = NULL,
    holder = EXCLUDED.holder, released_at = NULL, ttl_seconds = EXCLUDED.ttl_seconds,
    expires_at = EXCLUDED.expires_at, secret_hash = EXCLUDED.secret_hash, revoked_at = NULL
WHERE $5::bytea IS NULL OR $6::boolean OR TRUE
",
    returning_acquired!()
);

/// What an acquire proves and stores about secrets.
#[derive(Debug, Clone, Copy)]
pub struct AcquireProof<'a> {
    /// Stored when the acquisition is new.
    pub new_secret_hash: &'a [u8],
    /// The digest of the secret the requester presented, for a reentrant acquire.
    pub presented_hash: Option<&'a [u8]>,
    /// A reentrant acquire without a secret is refused.
    pub require_secret: bool,
}

#[derive(Debug)]
pub enum Acquired {
    New(LeaseRow),
    Reentrant(LeaseRow),
    /// Someone else holds it: here is their lease.
    Held(LeaseRow),
    /// The lease changed hands under us three times in a row; the caller may try again.
    Contended,
}

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

#[tracing::instrument(name = "INSERT leases", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "INSERT", db.collection.name = "leases"))]
pub async fn acquire(
    conn: &mut AsyncPgConnection,
    resource: &str,
    holder: &str,
    ttl_seconds: i32,
    proof: AcquireProof<'_>,
) -> Result<Acquired, DieselError> {
    // If the holder's lease ends between the refused upsert and the read that reports it, the
    // upsert is simply tried again; twice more is plenty.
    for _ in 0..3 {
        let statement = if acquire_is_broken() {
            ACQUIRE_BROKEN
        } else {
            ACQUIRE
        };
        let acquired: Option<AcquiredRow> = diesel::sql_query(statement)
            .bind::<Text, _>(resource)
            .bind::<Text, _>(holder)
            .bind::<Integer, _>(ttl_seconds)
            .bind::<Binary, _>(proof.new_secret_hash)
            .bind::<Nullable<Binary>, _>(proof.presented_hash)
            .bind::<Bool, _>(proof.require_secret)
            .cached()
            .get_result(conn)
            .await
            .optional()?;
        match acquired {
            Some(AcquiredRow { lease, fresh: true }) => return Ok(Acquired::New(lease)),
            Some(AcquiredRow {
                lease,
                fresh: false,
            }) => return Ok(Acquired::Reentrant(lease)),
            None => {
                if let Some(current) = find_by_resource(conn, resource).await?
                    && current.is_active()
                {
                    return Ok(Acquired::Held(current));
                }
            }
        }
    }
    Ok(Acquired::Contended)
}

/// One acquire of a group: `resource` for `holder`, storing `new_secret_hash` if the acquisition
/// is new.
#[derive(Debug, Clone, Copy)]
pub struct Want<'a> {
    pub resource: &'a str,
    pub holder: &'a str,
    pub ttl_seconds: i32,
    pub new_secret_hash: &'a [u8],
}

/// [`acquire`] for many distinct resources at once, in one statement: for each want, in order,
/// what it did (a new or a reentrant acquisition), or `None` where it took nothing (held by
/// someone else, or it changed hands: the caller finds out with [`find_by_resources`]). A
/// reentrant acquire is allowed only when `require_secret` is false: a want carries no secret
/// to prove it.
///
/// One want runs [`acquire`] itself, whose answer is always complete. The two statements decide
/// alike, but the single one is cheaper for one row: a request that arrives alone (light load)
/// pays nothing for grouping.
#[tracing::instrument(name = "INSERT leases", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "INSERT", db.collection.name = "leases", db.operation.batch.size = wants.len()))]
pub async fn take_each(
    conn: &mut AsyncPgConnection,
    wants: &[Want<'_>],
    require_secret: bool,
) -> Result<Vec<Option<Acquired>>, DieselError> {
    use diesel::sql_types::Array;
    if let [want] = wants {
        let proof = AcquireProof {
            new_secret_hash: want.new_secret_hash,
            presented_hash: None,
            require_secret,
        };
        let acquired = acquire(conn, want.resource, want.holder, want.ttl_seconds, proof).await?;
        return Ok(vec![Some(acquired)]);
    }
    let rows: Vec<AcquiredRow> = diesel::sql_query(ACQUIRE_MANY)
        .bind::<Array<Text>, _>(wants.iter().map(|w| w.resource).collect::<Vec<_>>())
        .bind::<Array<Text>, _>(wants.iter().map(|w| w.holder).collect::<Vec<_>>())
        .bind::<Array<Integer>, _>(wants.iter().map(|w| w.ttl_seconds).collect::<Vec<_>>())
        .bind::<Array<Binary>, _>(wants.iter().map(|w| w.new_secret_hash).collect::<Vec<_>>())
        .bind::<Bool, _>(require_secret)
        .cached()
        .load(conn)
        .await?;
    let mut taken: HashMap<String, AcquiredRow> = rows
        .into_iter()
        .map(|row| (row.lease.resource.clone(), row))
        .collect();
    Ok(wants
        .iter()
        .map(|want| {
            taken.remove(want.resource).map(|row| {
                if row.fresh {
                    Acquired::New(row.lease)
                } else {
                    Acquired::Reentrant(row.lease)
                }
            })
        })
        .collect())
}

/// The leases on `resources`, whatever their state.
#[tracing::instrument(name = "SELECT leases", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "SELECT", db.collection.name = "leases"))]
pub async fn find_by_resources(
    conn: &mut AsyncPgConnection,
    resources: &[&str],
) -> Result<Vec<LeaseRow>, DieselError> {
    diesel::sql_query(format!(
        "SELECT {COLUMNS} FROM leases WHERE resource = ANY($1)"
    ))
    .bind::<diesel::sql_types::Array<Text>, _>(resources)
    .cached()
    .load(conn)
    .await
}

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

/// `requests` in resource order, byte by byte: the order [`ACQUIRE_MANY`] takes
/// rows in (`COLLATE "C"`), whatever the database's collation. Renewal and release groups are
/// fed in it, and their plan (a nested loop from the `unnest`, one index probe per request:
/// `tests/tests/query_plans.rs` checks that no plan reads more) locks rows in that order, so no
/// two groups wait on each other's rows in opposite orders.
fn in_resource_order<T>(requests: &[T], resource: impl Fn(&T) -> &str) -> Vec<&T> {
    let mut sorted: Vec<&T> = requests.iter().collect();
    sorted.sort_by(|a, b| resource(a).cmp(resource(b)));
    sorted
}

/// One renewal of a group: the conditions of [`renew`].
#[derive(Debug, Clone)]
pub struct Renewal {
    pub resource: String,
    pub holder: String,
    pub fence: Option<i64>,
    pub secret_hash: Option<[u8; 32]>,
    pub ttl_seconds: Option<i32>,
}

/// [`renew`] for many leases in one statement: the renewed row of each renewal, in order, or
/// `None` where it renewed nothing. One renewal runs [`renew`] (see [`take_each`] for why).
#[tracing::instrument(name = "UPDATE leases", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "UPDATE", db.collection.name = "leases", db.operation.batch.size = renewals.len()))]
pub async fn renew_each(
    conn: &mut AsyncPgConnection,
    renewals: &[Renewal],
) -> Result<Vec<Option<LeaseRow>>, DieselError> {
    use diesel::sql_types::Array;
    if let [one] = renewals {
        let hash = one.secret_hash.as_ref().map(<[u8; 32]>::as_slice);
        let renewed = renew(
            conn,
            &one.resource,
            &one.holder,
            one.fence,
            hash,
            one.ttl_seconds,
        );
        return Ok(vec![renewed.await?]);
    }
    let sorted = in_resource_order(renewals, |r| &r.resource);
    let resources: Vec<&str> = sorted.iter().map(|r| r.resource.as_str()).collect();
    let holders: Vec<&str> = sorted.iter().map(|r| r.holder.as_str()).collect();
    let fences: Vec<Option<i64>> = sorted.iter().map(|r| r.fence).collect();
    let hashes: Vec<Option<&[u8]>> = sorted
        .iter()
        .map(|r| r.secret_hash.as_ref().map(<[u8; 32]>::as_slice))
        .collect();
    let ttls: Vec<Option<i32>> = sorted.iter().map(|r| r.ttl_seconds).collect();
    let rows: Vec<LeaseRow> = diesel::sql_query(RENEW_MANY)
        .bind::<Array<Text>, _>(resources)
        .bind::<Array<Text>, _>(holders)
        .bind::<Array<Nullable<BigInt>>, _>(fences)
        .bind::<Array<Nullable<Binary>>, _>(hashes)
        .bind::<Array<Nullable<Integer>>, _>(ttls)
        .cached()
        .load(conn)
        .await?;
    Ok(match_rows(
        renewals,
        |r, row| asked_by(row, &r.resource, &r.holder, r.fence, r.secret_hash.as_ref()),
        rows,
    ))
}

#[tracing::instrument(name = "UPDATE leases", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "UPDATE", db.collection.name = "leases"))]
pub async fn renew(
    conn: &mut AsyncPgConnection,
    resource: &str,
    holder: &str,
    fence: Option<i64>,
    secret_hash: Option<&[u8]>,
    ttl_seconds: Option<i32>,
) -> Result<Option<LeaseRow>, DieselError> {
    diesel::sql_query(RENEW)
        .bind::<Text, _>(resource)
        .bind::<Text, _>(holder)
        .bind::<Nullable<BigInt>, _>(fence)
        .bind::<Nullable<Integer>, _>(ttl_seconds)
        .bind::<Nullable<Binary>, _>(secret_hash)
        .cached()
        .get_result(conn)
        .await
        .optional()
}

#[tracing::instrument(name = "UPDATE leases", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "UPDATE", db.collection.name = "leases"))]
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
        .get_result(conn)
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
/// `None` where it released nothing. One release runs [`release`] (see [`take_each`] for why).
#[tracing::instrument(name = "UPDATE leases", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "UPDATE", db.collection.name = "leases", db.operation.batch.size = releases.len()))]
pub async fn release_each(
    conn: &mut AsyncPgConnection,
    releases: &[Release],
) -> Result<Vec<Option<LeaseRow>>, DieselError> {
    use diesel::sql_types::Array;
    if let [one] = releases {
        let hash = one.secret_hash.as_ref().map(<[u8; 32]>::as_slice);
        let released = release(conn, &one.resource, &one.holder, one.fence, hash, one.id);
        return Ok(vec![released.await?]);
    }
    let sorted = in_resource_order(releases, |r| &r.resource);
    let resources: Vec<&str> = sorted.iter().map(|r| r.resource.as_str()).collect();
    let holders: Vec<&str> = sorted.iter().map(|r| r.holder.as_str()).collect();
    let fences: Vec<Option<i64>> = sorted.iter().map(|r| r.fence).collect();
    let hashes: Vec<Option<&[u8]>> = sorted
        .iter()
        .map(|r| r.secret_hash.as_ref().map(<[u8; 32]>::as_slice))
        .collect();
    let ids: Vec<Option<i64>> = sorted.iter().map(|r| r.id).collect();
    let rows: Vec<LeaseRow> = diesel::sql_query(RELEASE_MANY)
        .bind::<Array<Text>, _>(resources)
        .bind::<Array<Text>, _>(holders)
        .bind::<Array<Nullable<BigInt>>, _>(fences)
        .bind::<Array<Nullable<Binary>>, _>(hashes)
        .bind::<Array<Nullable<BigInt>>, _>(ids)
        .cached()
        .load(conn)
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

#[tracing::instrument(name = "UPDATE leases", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "UPDATE", db.collection.name = "leases"))]
pub async fn revoke(
    conn: &mut AsyncPgConnection,
    id: i64,
) -> Result<Option<LeaseRow>, DieselError> {
    diesel::sql_query(REVOKE)
        .bind::<BigInt, _>(id)
        .cached()
        .get_result(conn)
        .await
        .optional()
}

#[tracing::instrument(name = "SELECT leases", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "SELECT", db.collection.name = "leases"))]
pub async fn find_by_resource(
    conn: &mut AsyncPgConnection,
    resource: &str,
) -> Result<Option<LeaseRow>, DieselError> {
    diesel::sql_query(format!("SELECT {COLUMNS} FROM leases WHERE resource = $1"))
        .bind::<Text, _>(resource)
        .cached()
        .get_result(conn)
        .await
        .optional()
}

#[tracing::instrument(name = "SELECT leases", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "SELECT", db.collection.name = "leases"))]
pub async fn find_by_id(
    conn: &mut AsyncPgConnection,
    id: i64,
) -> Result<Option<LeaseRow>, DieselError> {
    diesel::sql_query(format!("SELECT {COLUMNS} FROM leases WHERE id = $1"))
        .bind::<BigInt, _>(id)
        .cached()
        .get_result(conn)
        .await
        .optional()
}

/// One page of a listing, in id order, starting after `after`. `limit` rows at most.
#[tracing::instrument(name = "SELECT leases", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "SELECT", db.collection.name = "leases"))]
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
        .await
}

/// Which resources a listing covers: one by its exact name, those starting with a prefix, or all.
#[derive(Debug, Clone, Copy, Default)]
pub struct ResourceFilter<'a> {
    pub exact: Option<&'a str>,
    pub prefix: Option<&'a str>,
}

/// Deletes up to `batch` leases that ended more than `retention_seconds` ago.
#[tracing::instrument(name = "DELETE leases", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "DELETE", db.collection.name = "leases"))]
pub async fn sweep(
    conn: &mut AsyncPgConnection,
    retention_seconds: i64,
    batch: i64,
) -> Result<usize, DieselError> {
    diesel::sql_query(SWEEP)
        .bind::<BigInt, _>(retention_seconds)
        .bind::<BigInt, _>(batch)
        .cached()
        .execute(conn)
        .await
}

/// Deletes history older than the retention age, as the rows it describes are.
pub async fn prune_history(
    conn: &mut AsyncPgConnection,
    retention_seconds: i64,
) -> Result<usize, DieselError> {
    diesel::sql_query("DELETE FROM lease_events WHERE at < now() - make_interval(secs => $1)")
        .bind::<diesel::sql_types::Double, _>(retention_seconds as f64)
        .cached()
        .execute(conn)
        .await
}

pub async fn ping(conn: &mut AsyncPgConnection) -> Result<(), DieselError> {
    let row: Count = diesel::sql_query("SELECT 1::bigint AS count")
        .cached()
        .get_result(conn)
        .await?;
    debug_assert_eq!(row.count, 1);
    Ok(())
}
