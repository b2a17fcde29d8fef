//! Every SQL statement of lease-service, and nothing else, one module per operation:
//! `acquire.rs` (single and grouped), `change.rs` (renew, release and revoke, single and
//! grouped), `read.rs` (lookups and listings) and `retention.rs` (the sweeper's deletes). The
//! modules are private; their items are re-exported here, where the rules find them.
//!
//! Each state change is one statement, so it is atomic and judged by the database's clock
//! (`now()`); no host clock enters any expiry decision. Every statement is kept prepared
//! (`.cached()`), sets included, on plans made once per session ([`crate::db::SESSION`]).

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Binary, Integer, Jsonb, Nullable, Text, Timestamptz};

/// The columns of a [`LeaseRow`], for every statement that reads or returns one.
macro_rules! lease_columns {
    () => {
        "id, resource, holder, fence, ttl_seconds, created_at, renewed_at, released_at, revoked_at,
          expires_at, now() AS db_now, secret_hash, metadata,
          lease_takeover_at(expires_at, timeline) AS takeover_at"
    };
}

/// The clause of every statement that changes a lease and answers with its [`LeaseRow`]: one
/// text, so no statement can return a row the others do not.
macro_rules! returning_lease {
    () => {
        concat!("RETURNING ", lease_columns!())
    };
}

/// [`lease_columns!`] as a constant, for the listings' statements assembled at run time.
const COLUMNS: &str = lease_columns!();

mod acquire;
mod change;
mod read;
mod retention;

#[cfg(feature = "test-hooks")]
pub use acquire::break_acquire;
pub use acquire::{AcquireProof, Acquired, Want, acquire, acquire_is_broken, take_each};
pub use change::{Release, Renewal, release, release_each, renew, renew_each, revoke};
pub use read::{Listing, ResourceFilter, find_by_id, find_by_resource, find_by_resources, list};
pub use retention::{prune_history, sweep};

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
    /// What the holder says about itself (a JSON object), if it said anything.
    #[diesel(sql_type = Nullable<Jsonb>)]
    pub metadata: Option<serde_json::Value>,
    /// When another holder may take it: its expiry, or for a lease an earlier primary set, the
    /// clock-skew bound after that (migration 000008).
    #[diesel(sql_type = Timestamptz)]
    pub takeover_at: DateTime<Utc>,
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

    /// No one else may take it yet: active, or expired within the clock-skew bound of a
    /// failover. An acquire refused by this is answered as held.
    pub fn keeps_others_out(&self) -> bool {
        !self.is_released() && self.takeover_at > self.db_now
    }
}

/// The kinds of statement on `leases`, each a span name of its own.
#[derive(Debug, Clone, Copy)]
enum Op {
    Select,
    Insert,
    Update,
    Delete,
}

/// The client span of a statement of kind `op` on `leases`, named and attributed as
/// OpenTelemetry's database conventions say; `batch`: how many requests a group statement
/// serves. The one definition of these attributes, for every statement of the service.
fn span(op: Op, batch: Option<usize>) -> tracing::Span {
    let span = match op {
        Op::Select => leasehold::db_span!("SELECT", "leases"),
        Op::Insert => leasehold::db_span!("INSERT", "leases"),
        Op::Update => leasehold::db_span!("UPDATE", "leases"),
        Op::Delete => leasehold::db_span!("DELETE", "leases"),
    };
    if let Some(size) = batch {
        span.record("db.operation.batch.size", size);
    }
    span
}
