//! Acquiring leases: one resource ([`acquire`]) or a group of them in one statement
//! ([`take_each`]).

use std::collections::HashMap;

use diesel::result::Error as DieselError;
use diesel::sql_types::{Array, Binary, Bool, Integer, Jsonb, Nullable, Text};
use diesel::{OptionalExtension, QueryableByName};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use leasehold::server::db::{Cache, OneRow};
use tracing::Instrument;

use super::{LeaseRow, Op, find_by_resource, span};

#[derive(Debug, QueryableByName)]
struct AcquiredRow {
    #[diesel(embed)]
    lease: LeaseRow,
    /// True for a new acquisition, false for a reentrant one by the current holder.
    #[diesel(sql_type = Bool)]
    fresh: bool,
}

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
    metadata = CASE WHEN l.holder = EXCLUDED.holder AND l.released_at IS NULL AND l.expires_at > now()
                    THEN COALESCE(EXCLUDED.metadata, l.metadata) ELSE EXCLUDED.metadata END,
    ttl_seconds = EXCLUDED.ttl_seconds,
    expires_at = EXCLUDED.expires_at,
    timeline = EXCLUDED.timeline
"
    };
}

/// The columns an acquire returns: the lease, the database's clock, and whether it is new.
macro_rules! returning_acquired {
    () => {
        concat!(returning_lease!(), ", (renewed_at IS NULL) AS fresh")
    };
}

/// The sample's acquire statement, with a fence, a per-request TTL, reentrancy and a secret.
///
/// The row is taken over only if its lease expired (by `lease_takeover_at`: a lease set by an
/// earlier primary counts as expired only the clock-skew bound later; see migration 000008) or
/// was released, or if the requester already
/// holds it and proves it (`$5`, the digest of the secret it presents; with none, only when
/// `$6`, "a secret is required", is false). A takeover draws a new fence from the sequence
/// *inside* `DO UPDATE`, i.e. after the row lock is held, so it is greater than the fence of
/// whoever held the row before, and stores the digest of a new secret (`$4`). A reentrant
/// acquire keeps fence, secret and `created_at` and stamps `renewed_at`, which is how `fresh`
/// tells the two apart: only a new acquisition has `renewed_at IS NULL`. The holder's
/// metadata (`$7`) is stored by a new acquisition, and replaces the old by a reentrant one that
/// carries some ([`takeover!`]); the group statement carries none, so it keeps a reentrant
/// holder's and clears a new one's.
const ACQUIRE: &str = concat!(
    "INSERT INTO leases AS l (resource, holder, fence, ttl_seconds, created_at, expires_at, secret_hash,
                      metadata, timeline)
VALUES ($1, $2, nextval('leases_fence_seq'), $3, now(), now() + make_interval(secs => $3), $4,
        $7::jsonb, leasehold_timeline())
",
    takeover!(),
    "WHERE lease_takeover_at(l.expires_at, l.timeline) <= now() OR l.released_at IS NOT NULL
   OR (l.holder = EXCLUDED.holder
       AND CASE WHEN $5::bytea IS NULL THEN NOT $6::boolean
                ELSE COALESCE(l.secret_hash = $5::bytea, FALSE) END)
",
    returning_acquired!()
);

/// [`ACQUIRE`] for many resources, each with its holder, TTL and metadata (`NULL` for none, so a
/// reentrant want keeps the holder's own): one statement, one commit.
/// Rows are taken in resource order, byte by byte (`COLLATE "C"`, the order Rust sorts strings
/// in), so groups that share resources lock them in the same order and cannot deadlock. A
/// reentrant acquire here cannot present a secret, so it is allowed only when secrets are not
/// required (`$5`). A fence drawn by the `SELECT` for a row that then conflicts is simply
/// skipped: the sequence only rises.
const ACQUIRE_MANY: &str = concat!(
    "INSERT INTO leases AS l (resource, holder, fence, ttl_seconds, created_at, expires_at, secret_hash,
                      metadata, timeline)
SELECT r.resource, r.holder, nextval('leases_fence_seq'), r.ttl_seconds, now(),
       now() + make_interval(secs => r.ttl_seconds), r.secret_hash, r.metadata, leasehold_timeline()
FROM unnest($1::text[], $2::text[], $3::int[], $4::bytea[], $6::jsonb[])
     AS r(resource, holder, ttl_seconds, secret_hash, metadata)
ORDER BY r.resource COLLATE \"C\"
",
    takeover!(),
    "WHERE lease_takeover_at(l.expires_at, l.timeline) <= now() OR l.released_at IS NOT NULL
   OR (l.holder = EXCLUDED.holder AND NOT $5::boolean)
",
    returning_acquired!()
);

/// The test-only switch (`LEASEHOLD_TEST_BREAK_ACQUIRE`), compiled only into builds with the
/// `test-hooks` feature: the invariant checker's tests show it catches a broken acquire.
#[cfg(feature = "test-hooks")]
mod hooks {
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Set once at start by the switch: acquire skips its expiry check.
    static BREAK_ACQUIRE: AtomicBool = AtomicBool::new(false);

    /// Turns the switch on, for the rest of the process.
    pub fn break_acquire() {
        BREAK_ACQUIRE.store(true, Ordering::Relaxed);
    }

    /// Whether the switch is on: then every single acquire runs [`acquire`](super::acquire),
    /// the only statement it breaks.
    pub fn acquire_is_broken() -> bool {
        BREAK_ACQUIRE.load(Ordering::Relaxed)
    }

    /// [`ACQUIRE`](super::ACQUIRE) without its expiry check: it takes over live leases (tests
    /// of the checker only).
    pub(super) const ACQUIRE_BROKEN: &str = concat!(
        "\
INSERT INTO leases AS l (resource, holder, fence, ttl_seconds, created_at, expires_at, secret_hash)
VALUES ($1, $2, nextval('leases_fence_seq'), $3, now(), now() + make_interval(secs => $3), $4)
ON CONFLICT (resource) DO UPDATE SET
    fence = nextval('leases_fence_seq'), created_at = now(), renewed_at = NULL,
    holder = EXCLUDED.holder, released_at = NULL, ttl_seconds = EXCLUDED.ttl_seconds,
    expires_at = EXCLUDED.expires_at, secret_hash = EXCLUDED.secret_hash, revoked_at = NULL
WHERE $5::bytea IS NULL OR $6::boolean OR $7::jsonb IS NULL OR TRUE
",
        returning_acquired!()
    );
}

#[cfg(feature = "test-hooks")]
pub use hooks::{acquire_is_broken, break_acquire};

/// Whether the test-only switch is on: then every single acquire runs [`acquire`], the only
/// statement it breaks. Never, in a build without the `test-hooks` feature.
#[cfg(not(feature = "test-hooks"))]
pub const fn acquire_is_broken() -> bool {
    false
}

/// The statement a single acquire runs: [`ACQUIRE`], unless the test-only switch is on.
fn acquire_statement() -> &'static str {
    #[cfg(feature = "test-hooks")]
    if acquire_is_broken() {
        return hooks::ACQUIRE_BROKEN;
    }
    ACQUIRE
}

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

pub async fn acquire(
    conn: &mut AsyncPgConnection,
    resource: &str,
    holder: &str,
    ttl_seconds: i32,
    proof: AcquireProof<'_>,
    metadata: Option<&serde_json::Value>,
) -> Result<Acquired, DieselError> {
    async move {
        // If the holder's lease ends between the refused upsert and the read that reports it, the
        // upsert is simply tried again; twice more is plenty.
        for _ in 0..3 {
            let acquired: Option<AcquiredRow> = diesel::sql_query(acquire_statement())
                .bind::<Text, _>(resource)
                .bind::<Text, _>(holder)
                .bind::<Integer, _>(ttl_seconds)
                .bind::<Binary, _>(proof.new_secret_hash)
                .bind::<Nullable<Binary>, _>(proof.presented_hash)
                .bind::<Bool, _>(proof.require_secret)
                .bind::<Nullable<Jsonb>, _>(metadata)
                .cached()
                .get_one(conn)
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
                        && current.keeps_others_out()
                    {
                        return Ok(Acquired::Held(current));
                    }
                }
            }
        }
        Ok(Acquired::Contended)
    }
    .instrument(span(Op::Insert, None))
    .await
}

/// One acquire of a group: `resource` for `holder`, storing `new_secret_hash` if the acquisition
/// is new, and `metadata` as [`acquire`] stores it.
#[derive(Debug, Clone, Copy)]
pub struct Want<'a> {
    pub resource: &'a str,
    pub holder: &'a str,
    pub ttl_seconds: i32,
    pub new_secret_hash: &'a [u8],
    pub metadata: Option<&'a serde_json::Value>,
}

/// [`acquire`] for many distinct resources at once, in one statement: for each want, in order,
/// what it did (a new or a reentrant acquisition), or `None` where it took nothing (held by
/// someone else, or it changed hands: the caller finds out with
/// [`find_by_resources`](super::find_by_resources)). A
/// reentrant acquire is allowed only when `require_secret` is false: a want carries no secret
/// to prove it.
///
/// One want runs [`acquire`] itself, whose answer is always complete. The two statements decide
/// alike, but the single one is cheaper for one row: a request that arrives alone (light load)
/// pays nothing for grouping.
pub async fn take_each(
    conn: &mut AsyncPgConnection,
    wants: &[Want<'_>],
    require_secret: bool,
) -> Result<Vec<Option<Acquired>>, DieselError> {
    if let [want] = wants {
        let proof = AcquireProof {
            new_secret_hash: want.new_secret_hash,
            presented_hash: None,
            require_secret,
        };
        let acquired = acquire(
            conn,
            want.resource,
            want.holder,
            want.ttl_seconds,
            proof,
            want.metadata,
        )
        .instrument(span(Op::Insert, Some(1)))
        .await?;
        return Ok(vec![Some(acquired)]);
    }
    let rows: Vec<AcquiredRow> = diesel::sql_query(ACQUIRE_MANY)
        .bind::<Array<Text>, _>(wants.iter().map(|w| w.resource).collect::<Vec<_>>())
        .bind::<Array<Text>, _>(wants.iter().map(|w| w.holder).collect::<Vec<_>>())
        .bind::<Array<Integer>, _>(wants.iter().map(|w| w.ttl_seconds).collect::<Vec<_>>())
        .bind::<Array<Binary>, _>(wants.iter().map(|w| w.new_secret_hash).collect::<Vec<_>>())
        .bind::<Bool, _>(require_secret)
        .bind::<Array<Nullable<Jsonb>>, _>(wants.iter().map(|w| w.metadata).collect::<Vec<_>>())
        .cached()
        .load(conn)
        .instrument(span(Op::Insert, Some(wants.len())))
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
