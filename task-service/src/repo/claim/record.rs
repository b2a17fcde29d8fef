//! Recording claims: one more attempt and one more claim each, under the lease that covers it.

use chrono::{DateTime, Utc};
use diesel::sql_types::{Array, BigInt, Bool, Double, Nullable, Text, Timestamptz};
use diesel_async::RunQueryDsl;
use leasehold::api::Secret;
use leasehold::server::db::Cache;
use leasehold::tasks::TaskStatus;
use tracing::Instrument;

use crate::repo::{COLUMNS, Db, Result, TaskRow, history};

/// One claim to record: the task, its processor, and the lease that covers the claim: the
/// task's own new lease (its fence, secret and expiry), or a shared one (a worker process's,
/// named with its fence; the claim then records a hint of the expiry, [`mark_claimed`]'s
/// `hint`, since lease-service was not asked).
#[derive(Debug)]
pub struct Claim<'a> {
    pub id: i64,
    /// The status the task is claimed from (pending, or running with its lease run out), as
    /// the caller locked it in this transaction: for the history.
    pub from: TaskStatus,
    /// The task was never claimed before: its wait is a pickup, for the charts.
    pub first: bool,
    pub processor: &'a str,
    /// The shared lease that covers the claim; none: the task's own.
    pub lease_resource: Option<&'a str>,
    pub lease_fence: i64,
    pub lease_secret: Option<&'a Secret>,
    /// The task's own lease's expiry; none for a shared lease.
    pub lease_expiry: Option<DateTime<Utc>>,
    /// When the task is recorded to have started; none: the claim's `now()`.
    pub started_at: Option<DateTime<Utc>>,
}

/// Records claims, one statement for all: one more attempt each, and one more claim (the task's
/// fence), owned by its processor under its lease until the lease's expiry (for a shared lease,
/// `hint` from now: past it, a claim asks lease-service whether the lease still lives). Rows
/// come back in no particular order.
pub async fn mark_claimed(
    conn: &mut Db,
    claims: &[Claim<'_>],
    hint: std::time::Duration,
) -> Result<Vec<TaskRow>> {
    let span = leasehold::db_span!("UPDATE", "tasks");
    span.record("db.operation.batch.size", claims.len());
    async move {
        let ids: Vec<i64> = claims.iter().map(|c| c.id).collect();
        let processors: Vec<&str> = claims.iter().map(|c| c.processor).collect();
        let fences: Vec<i64> = claims.iter().map(|c| c.lease_fence).collect();
        let secrets: Vec<Option<&str>> = claims
            .iter()
            .map(|c| c.lease_secret.map(Secret::expose))
            .collect();
        let expiries: Vec<Option<DateTime<Utc>>> = claims.iter().map(|c| c.lease_expiry).collect();
        let resources: Vec<Option<&str>> = claims.iter().map(|c| c.lease_resource).collect();
        let starts: Vec<Option<DateTime<Utc>>> = claims.iter().map(|c| c.started_at).collect();
        let froms: Vec<&str> = claims.iter().map(|c| c.from.as_str()).collect();
        let firsts: Vec<bool> = claims.iter().map(|c| c.first).collect();
        // The claim is recorded at the task's start: the claim's `now()`, except for limited
        // queues, whose claims record a moment after they read what they were judged by (their
        // bucket, their running tasks: `Limits::start_of`), later than `now()`: the history then
        // shows starts the invariant checker can judge the limits by.
        diesel::sql_query(format!(
            "WITH moved AS (
             UPDATE tasks SET {set}
             FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[], $5::timestamptz[],
                         $6::timestamptz[], $7::text[], $8::bool[], $9::text[])
                  AS c(claim_id, claim_processor, claim_fence, claim_secret, claim_expiry,
                       claim_start, claim_from, claim_first, claim_resource)
             WHERE id = c.claim_id
             RETURNING {COLUMNS}, {claim}
         ), {history}
         SELECT * FROM moved",
            history = history("true"),
            set = claim_set(&ClaimFrom {
                processor: "c.claim_processor",
                fence: "c.claim_fence",
                secret: "c.claim_secret",
                resource: "c.claim_resource",
                start: "c.claim_start",
                expiry: "coalesce(c.claim_expiry, now() + make_interval(secs => $10))",
            }),
            claim = claim_event("c.claim_from", "c.claim_first"),
        ))
        .bind::<Array<BigInt>, _>(&ids)
        .bind::<Array<Text>, _>(&processors)
        .bind::<Array<BigInt>, _>(&fences)
        .bind::<Array<Nullable<Text>>, _>(&secrets)
        .bind::<Array<Nullable<Timestamptz>>, _>(&expiries)
        .bind::<Array<Nullable<Timestamptz>>, _>(&starts)
        .bind::<Array<Text>, _>(&froms)
        .bind::<Array<Bool>, _>(&firsts)
        .bind::<Array<Nullable<Text>>, _>(&resources)
        .bind::<Double, _>(hint.as_secs_f64())
        .cached()
        .load(conn)
        .await
    }
    .instrument(span)
    .await
}

/// Where a claim statement takes each field of a claim from (SQL expressions).
pub(super) struct ClaimFrom<'a> {
    pub(super) processor: &'a str,
    pub(super) fence: &'a str,
    pub(super) secret: &'a str,
    pub(super) resource: &'a str,
    /// The recorded start; NULL: the claim's `now()`.
    pub(super) start: &'a str,
    pub(super) expiry: &'a str,
}

/// What a claim writes on its task, for [`mark_claimed`] and [`take_lapsed`] alike: one more
/// attempt and one more claim (the task's own fence), its processor, its lease, its start.
pub(super) fn claim_set(from: &ClaimFrom<'_>) -> String {
    let ClaimFrom {
        processor,
        fence,
        secret,
        resource,
        start,
        expiry,
    } = from;
    format!(
        "status = 'running', processor = {processor},
         fence = coalesce(fence, 0) + 1, lease_fence = {fence},
         lease_secret = {secret}, lease_resource = {resource},
         attempts = attempts + 1, started_at = coalesce({start}, now()),
         last_heartbeat_at = now(), must_heartbeat_before = {expiry}, updated_at = now()"
    )
}

/// The history columns of a claim (see `history` in the parent module): the status it left,
/// its moment (the start), and for a first claim (`first`) the pickup wait the charts show.
pub(super) fn claim_event(from: &str, first: &str) -> String {
    format!(
        "{from} AS from_status, greatest(now(), started_at) AS event_at, true AS charged,
         CASE WHEN {first} THEN greatest(0, EXTRACT(EPOCH FROM
             greatest(now(), started_at)
             - greatest(created_at, coalesce(requested_scheduled_at, created_at)))
             * 1000)::float8 END AS pickup_ms"
    )
}
