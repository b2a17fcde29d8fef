//! The task rules: creating, claiming, heartbeating, completing, failing and cancelling.
//!
//! Every transition locks the task's row, checks who may make it, and—where a worker is
//! involved—asks lease-service, which has the final word on ownership: a claim acquires the
//! task's lease (only a *new* acquisition counts), a heartbeat renews it with the claim's fence,
//! and a completion or failure releases it with that fence. Release doubles as the ownership
//! proof at the end of the work: it succeeds only for the current holder with the current fence,
//! and, retried after a lost answer, succeeds again, so a worker can safely retry `complete`.

use std::sync::PoisonError;
use std::time::Duration;

use diesel_async::AsyncConnection;
use rand::Rng;
use shared::api::{Lease, LeaseStatus, Proof};
use shared::server::{
    ApiError, check_batch_size, first_duplicate, validate_name, validate_name_within,
};
use shared::tasks::{
    ClaimTasks, CompleteItem, CompleteTask, CompleteTasks, CreateTask, FailTask, Heartbeat,
    ItemResult, Task, TaskStatus,
};
use shared::{LeaseClient, LeaseError};
use tracing::field::Empty;

use crate::metrics::Metrics;
use crate::repo::{self, Db, NewTask, TaskRow};

/// Largest `task_data` (and `task_output`), serialised.
pub const MAX_DATA_BYTES: usize = 64 * 1024;
/// Most tasks one claim may take.
pub const MAX_CLAIM: i64 = 100;
const MAX_QUEUE_BYTES: usize = 128;
const MAX_KEY_BYTES: usize = 255;
const MAX_ERROR_BYTES: usize = 4096;
const PRIORITY_RANGE: std::ops::RangeInclusive<i32> = -1000..=1000;

/// What the task rules need besides a connection.
#[derive(Debug, Clone)]
pub struct Engine {
    /// For calls made while task rows are locked: short timeout, no retries.
    pub leases: LeaseClient,
    /// For releases after commit: retried, nothing waits on them.
    pub leases_retrying: LeaseClient,
    pub lease_ttl: Duration,
    pub lease_prefix: String,
    /// The generator's lease resource: a create naming a `generator_fence` is checked against it.
    pub generator_resource: String,
    pub default_max_attempts: i32,
    pub retry_base_seconds: f64,
    pub retry_max_seconds: f64,
    pub metrics: Metrics,
    /// Whether lease-service accepts [`Engine::lease_ttl`].
    pub lease_ttl_verdict: TtlVerdict,
}

/// What lease-service last said of task-service's lease TTL: nothing yet, accepted, or refused
/// (with why). A refused TTL starves every claim, so it fails `/readyz` and claims answer 503
/// `task_lease_ttl_rejected` rather than "No tasks available".
#[derive(Debug, Clone, Default)]
pub struct TtlVerdict(std::sync::Arc<std::sync::Mutex<Option<Result<(), String>>>>);

impl TtlVerdict {
    fn get(&self) -> Option<Result<(), String>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn accept(&self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(Ok(()));
    }

    /// Records the refusal and answers the error that names it; logs it when it is news.
    fn reject(&self, ttl: Duration, refusal: &str) -> ApiError {
        let message = format!(
            "lease-service refuses task-service's lease TTL of {} s (TASK_LEASE_TTL_SECONDS), so \
             no task can be claimed: set it within lease-service's LEASE_MIN_TTL_SECONDS and \
             LEASE_MAX_TTL_SECONDS ({refusal})",
            ttl.as_secs()
        );
        let previous = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .replace(Err(message.clone()));
        if previous != Some(Err(message.clone())) {
            tracing::error!("{message}");
        }
        ApiError::Misconfigured {
            code: "task_lease_ttl_rejected",
            message,
        }
    }
}

/// Whether lease-service accepts task-service's lease TTL, for `/readyz`: once a claim or this
/// probe has seen it accepted, no call is made; otherwise a lease is taken with that TTL on a
/// resource of its own and released in the background (a refused TTL writes nothing in
/// lease-service).
/// When lease-service cannot be asked, this says nothing: its health check reports that.
pub async fn check_lease_ttl(engine: &Engine) -> Result<(), ApiError> {
    if engine.lease_ttl_verdict.get() == Some(Ok(())) {
        return Ok(());
    }
    let probe: u64 = rand::random();
    let resource = format!("leasehold:task-lease-ttl-probe:{probe:016x}");
    let holder = format!("task-service-probe-{probe:016x}");
    match engine
        .leases
        .acquire(&resource, &holder, Some(engine.lease_ttl))
        .await
    {
        Ok(lease) => {
            engine.lease_ttl_verdict.accept();
            // The verdict is in: the answer (a readiness probe's, on a short budget) does not
            // wait for the release, which nothing depends on.
            let leases = engine.leases.clone();
            tokio::spawn(async move {
                if let Err(err) = leases.release(&resource, &holder, lease.proof()).await {
                    tracing::debug!(error = %err, "TTL probe lease not released; it will expire");
                }
            });
            Ok(())
        }
        Err(LeaseError::Rejected { code, error, .. }) if code == "invalid_ttl" => {
            Err(engine.lease_ttl_verdict.reject(engine.lease_ttl, &error))
        }
        Err(err) => {
            tracing::debug!(error = %err, "could not probe the task lease TTL");
            Ok(())
        }
    }
}

impl Engine {
    fn resource(&self, id: i64) -> String {
        format!("{}{id}", self.lease_prefix)
    }

    /// Capped exponential backoff with jitter: the `attempts`-th failure waits between half and
    /// all of `min(max, base · 2^(attempts-1))`.
    pub fn retry_delay(&self, attempts: i32) -> f64 {
        let exponent = attempts.saturating_sub(1).clamp(0, 30);
        let ceiling = (self.retry_base_seconds * 2f64.powi(exponent)).min(self.retry_max_seconds);
        ceiling * rand::rng().random_range(0.5..=1.0)
    }

    /// Releases a lease after the transaction that ended its task committed. A failure only
    /// means the lease runs out by itself.
    async fn release_after_commit(&self, id: i64, processor: &str, proof: Proof<'_>) {
        if let Err(err) = self
            .leases_retrying
            .release(&self.resource(id), processor, proof)
            .await
        {
            tracing::debug!(task = id, error = %err, "lease release after commit failed; it will expire");
        }
    }
}

/// A created task answers 201; a repeat of an idempotent create answers 200 with the first.
#[derive(Debug)]
pub enum Created {
    New(Task),
    Existing(Task),
}

#[tracing::instrument(name = "create task", skip_all, fields(task.id = Empty, task.queue = Empty))]
pub async fn create(
    conn: &mut Db,
    engine: &Engine,
    request: CreateTask,
) -> Result<Created, ApiError> {
    let generator_fence = request.generator_fence;
    let task = validate_new(engine, request)?;
    let inserted = match generator_fence {
        Some(fence) => create_generated(conn, engine, &task, fence).await?,
        None => repo::insert(conn, &task).await?,
    };
    if let Some(row) = &inserted {
        let span = tracing::Span::current();
        span.record("task.id", row.id);
        span.record("task.queue", row.queue.as_str());
    }
    if let Some(row) = inserted {
        engine
            .metrics
            .created
            .with_label_values(&[row.queue.as_str()])
            .inc();
        return Ok(Created::New(to_api(row)));
    }
    // The key is taken: answer with the task it names, if it is the same request.
    let key = task.idempotency_key.as_deref().unwrap_or_default();
    let existing = repo::find_by_idempotency_key(conn, key, task.scheduled_at)
        .await?
        .ok_or_else(|| {
            ApiError::Unavailable(
                "the task for that idempotency key was just deleted; retry".to_owned(),
            )
        })?;
    let differing = differences(&existing, &task);
    let existing = existing.task;
    if !differing.is_empty() {
        return Err(ApiError::Unprocessable {
            code: "idempotency_key_reused",
            message: format!(
                "idempotency_key {key:?} already names task {}, made by a request with a \
                 different {}",
                existing.id,
                differing.join(", ")
            ),
        });
    }
    Ok(Created::Existing(to_api(existing)))
}

/// The fields in which `task` asks for something other than the stored task its idempotency key
/// names: a repeat must be the same request, or its creator would silently get a task it did
/// not ask for. `scheduled_at` is compared with the schedule the first request asked for (the
/// stored one moves with retries; naming none asks for the creation time), where that is known;
/// an omitted `max_attempts` is the default, as it was resolved for both.
fn differences(existing: &repo::KeyedTask, task: &NewTask) -> Vec<&'static str> {
    let row = &existing.task;
    [
        ("task_data", row.task_data == task.task_data),
        ("queue", row.queue == task.queue),
        ("priority", row.priority == task.priority),
        ("max_attempts", row.max_attempts == task.max_attempts),
        ("scheduled_at", existing.same_schedule),
    ]
    .into_iter()
    .filter(|(_, same)| !same)
    .map(|(field, _)| field)
    .collect()
}

/// Stores a generator's task, made under the generator lease's `fence`, if that fence still
/// holds the lease and the generator is started; `None` when its idempotency key is taken.
async fn create_generated(
    conn: &mut Db,
    engine: &Engine,
    task: &NewTask,
    fence: i64,
) -> Result<Option<TaskRow>, ApiError> {
    // The lease is good for at least `remaining` after the clock was read (it was measured
    // later), so an insert the database makes before `deadline` falls inside the term, however
    // long this process or the network stalls in between.
    let read_at = repo::clock(conn).await?;
    let remaining = check_generator_fence(engine, fence).await?;
    let deadline = read_at + remaining - GENERATOR_DEADLINE_MARGIN;
    if let Some(row) = repo::insert_generated(conn, task, deadline).await? {
        return Ok(Some(row));
    }
    if let Some(key) = task.idempotency_key.as_deref()
        && repo::find_by_idempotency_key(conn, key, task.scheduled_at)
            .await?
            .is_some()
    {
        return Ok(None);
    }
    if !repo::generator(conn).await?.running {
        return Err(ApiError::Conflict {
            code: "generator_stopped",
            message: "the generator is stopped: it may create no task until it is started"
                .to_owned(),
        });
    }
    Err(ApiError::Conflict {
        code: "stale_generator",
        message: format!("the generator lease of fence {fence} ran out before the task was stored"),
    })
}

/// Taken off a generator lease's remaining time, for the rate at which two databases' clocks
/// may drift apart over one lease term.
const GENERATOR_DEADLINE_MARGIN: chrono::TimeDelta = chrono::TimeDelta::milliseconds(50);

/// A generator replica may create tasks only under the generator lease's current fence: a
/// replica that lost the lease (paused, partitioned) and has not noticed yet is refused.
/// Returns how long the lease has left by lease-service's clock.
async fn check_generator_fence(engine: &Engine, fence: i64) -> Result<chrono::TimeDelta, ApiError> {
    let current = engine
        .leases_retrying
        .current(&engine.generator_resource)
        .await
        .map_err(|err| {
            ApiError::Unavailable(format!("cannot check the generator's lease: {err}"))
        })?;
    match current {
        Some(lease) if lease.fence == fence && lease.status == LeaseStatus::Active => {
            Ok(chrono::TimeDelta::milliseconds(lease.expires_in_ms))
        }
        other => Err(ApiError::Conflict {
            code: "stale_generator",
            message: format!(
                "fence {fence} does not hold the generator lease (current: {})",
                other.map_or("none".to_owned(), |lease| lease.fence.to_string())
            ),
        }),
    }
}

fn validate_new(engine: &Engine, request: CreateTask) -> Result<NewTask, ApiError> {
    if !request.task_data.is_object() {
        return Err(ApiError::invalid(
            "invalid_field",
            "task_data",
            "task_data must be a JSON object",
        ));
    }
    check_size("task_data", &request.task_data)?;
    let queue = request.queue.unwrap_or_else(|| "default".to_owned());
    validate_name_within("queue", &queue, MAX_QUEUE_BYTES)?;
    let priority = request.priority.unwrap_or(0);
    if !PRIORITY_RANGE.contains(&priority) {
        return Err(ApiError::invalid(
            "invalid_field",
            "priority",
            format!("priority must be between -1000 and 1000, got {priority}"),
        ));
    }
    let max_attempts = request.max_attempts.unwrap_or(engine.default_max_attempts);
    if !(1..=1000).contains(&max_attempts) {
        return Err(ApiError::invalid(
            "invalid_field",
            "max_attempts",
            format!("max_attempts must be between 1 and 1000, got {max_attempts}"),
        ));
    }
    if let Some(key) = &request.idempotency_key {
        validate_name_within("idempotency_key", key, MAX_KEY_BYTES)?;
    }
    if let Some(at) = &request.scheduled_at {
        shared::server::validate_timestamp("scheduled_at", at)?;
    }
    Ok(NewTask {
        task_data: request.task_data,
        scheduled_at: request.scheduled_at,
        queue,
        priority,
        max_attempts,
        idempotency_key: request.idempotency_key,
    })
}

/// A JSON document the tasks table can store: at most [`MAX_DATA_BYTES`], and no NUL character
/// in any string or key (valid JSON, but PostgreSQL's `jsonb` cannot hold it).
fn check_size(field: &'static str, value: &serde_json::Value) -> Result<(), ApiError> {
    let size = serde_json::to_vec(value)
        .map(|v| v.len())
        .unwrap_or(usize::MAX);
    if size > MAX_DATA_BYTES {
        return Err(ApiError::invalid(
            "too_large",
            field,
            format!("{field} is {size} bytes; at most {MAX_DATA_BYTES} are accepted"),
        ));
    }
    if contains_nul(value) {
        return Err(ApiError::invalid(
            "invalid_field",
            field,
            format!("{field} must not contain NUL characters (\\u0000)"),
        ));
    }
    Ok(())
}

fn contains_nul(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::String(s) => s.contains('\0'),
        serde_json::Value::Array(items) => items.iter().any(contains_nul),
        serde_json::Value::Object(map) => map
            .iter()
            .any(|(key, value)| key.contains('\0') || contains_nul(value)),
        _ => false,
    }
}

/// One claim request's part in a claim group: who claims, and at most how many tasks.
#[derive(Debug, Clone)]
pub struct Want {
    pub processor: String,
    pub limit: i64,
}

/// Checks a claim request; what it wants.
pub fn want(request: &ClaimTasks) -> Result<Want, ApiError> {
    validate_name("processor", &request.processor)?;
    if let Some(queue) = &request.queue {
        validate_name_within("queue", queue, MAX_QUEUE_BYTES)?;
    }
    let limit = request.limit.unwrap_or(1);
    if !(1..=MAX_CLAIM).contains(&limit) {
        return Err(ApiError::invalid(
            "invalid_limit",
            "limit",
            format!("limit must be between 1 and {MAX_CLAIM}, got {limit}"),
        ));
    }
    Ok(Want {
        processor: request.processor.clone(),
        limit,
    })
}

/// How many waiting claims, from the front, go in one group: their limits add up to at most
/// [`MAX_CLAIM`], one statement's and one lease batch's worth.
pub fn claims_per_group(wants: &[Want]) -> usize {
    let mut total = 0;
    wants
        .iter()
        .take_while(|want| {
            total += want.limit;
            total <= MAX_CLAIM
        })
        .count()
}

/// Claims due tasks of `queue` for a group of claim requests in one transaction: each gets up
/// to its `limit`, in the group's order, and the tasks of all of them take their leases in one
/// lease-service call (each under its own claimant's name).
///
/// Candidates are locked with `SKIP LOCKED`: running tasks whose lease ran out by the recorded
/// expiry first, then, for the room left, due pending tasks by priority and schedule. Each
/// candidate's lease is acquired from lease-service while its row is locked, and lease-service
/// has the final word:
/// * a refusal (another holder) skips the task, and a lapsed task's recorded expiry moves to the
///   holder's, so it stops crowding the claim;
/// * a *reentrant* acquire (this processor name already holds the task's lease) skips it too
///   when the lease's fence is the task's: another worker with the same name has it, and
///   handing it out again would give both one fence. A reentrant lease with any other fence was
///   granted to a claim that never committed (its answer timed out, or its transaction failed):
///   no worker knows that fence, so the task is claimed under it rather than blocked until the
///   stray lease runs out;
/// * a task that has used all its attempts is not handed out but marked dead, once its lease
///   proves the last attempt is over; no request's `limit` is spent on it, and it is read apart
///   from the lapsed tasks to claim (up to the lease batch's size), so it never takes the place
///   of one.
///
/// A lapsed task whose cancellation was asked for is never handed out: it ends as cancelled
/// (its worker stopped heartbeating, so nobody will end it otherwise) by the statement the
/// retention sweeper uses for queues nobody claims from, before any lapsed task is read, and its
/// lease is released after commit.
///
/// If the transaction fails after leases were granted, they are released at once.
#[tracing::instrument(name = "claim group", skip_all, fields(
    task.queue = queue.unwrap_or(""),
    task.group.size = wants.len(),
))]
pub async fn claim_group(
    conn: &mut Db,
    engine: &Engine,
    queue: Option<&str>,
    wants: &[Want],
) -> Result<Vec<Vec<TaskRow>>, ApiError> {
    let total: i64 = wants.iter().map(|want| want.limit).sum();
    // Leases granted inside the transaction, to release should it fail.
    let granted = std::sync::Mutex::new(Vec::new());
    let outcome = conn
        .transaction::<_, ApiError, _>(async |conn| {
            let mut round = Round::new(wants);
            repo::claim_by_index_order(conn).await?;
            // Lapsed tasks that are only to be ended are taken apart from those to claim, so
            // that they never fill the places of claimable ones (nor spend a request's room).
            round.cancelled = repo::cancel_lapsed(conn, queue, total).await?;
            let mut lapsed = repo::lock_lapsed(conn, queue, false, total).await?;
            // One lease-service batch holds both: the exhausted fill what the claimable left.
            let spare = MAX_CLAIM - i64::try_from(lapsed.len()).unwrap_or(MAX_CLAIM);
            if spare > 0 {
                lapsed.extend(repo::lock_lapsed(conn, queue, true, spare).await?);
            }
            round.grant(conn, engine, lapsed, &granted).await?;
            let room = total - round.taken();
            if room > 0 {
                let due = repo::lock_due(conn, queue, room).await?;
                round.grant(conn, engine, due, &granted).await?;
            }
            if round.taken() == 0
                && let Some(err) = round.misconfigured
            {
                return Err(err);
            }
            if round.taken() == 0
                && let Some(reason) = round.unavailable
            {
                return Err(ApiError::Unavailable(format!(
                    "lease-service unavailable: {reason}"
                )));
            }
            Ok((round.claimed, round.exhausted, round.cancelled))
        })
        .await;
    let (claimed, exhausted, cancelled) = match outcome {
        Ok(done) => done,
        Err(err) => {
            let granted =
                std::mem::take(&mut *granted.lock().unwrap_or_else(PoisonError::into_inner));
            for (id, holder, lease) in granted {
                engine
                    .release_after_commit(id, &holder, lease.proof())
                    .await;
            }
            return Err(err);
        }
    };
    for (want, rows) in wants.iter().zip(&claimed) {
        for row in rows {
            engine
                .metrics
                .claimed
                .with_label_values(&[row.queue.as_str()])
                .inc();
            tracing::debug!(
                task.id = row.id,
                task.fence = row.fence,
                task.attempts = row.attempts,
                task.processor = %want.processor,
                "task claimed"
            );
        }
    }
    for (row, holder, lease) in &exhausted {
        engine
            .metrics
            .dead
            .with_label_values(&[row.queue.as_str(), "attempts_exhausted"])
            .inc();
        engine
            .release_after_commit(row.id, holder, lease.proof())
            .await;
    }
    end_cancelled(engine, &cancelled).await;
    Ok(claimed)
}

/// After the commit that ended lapsed tasks as cancelled: counts them, and releases their
/// leases on their last workers' behalf, should any still be live.
pub async fn end_cancelled(engine: &Engine, cancelled: &[TaskRow]) {
    for row in cancelled {
        engine
            .metrics
            .cancelled
            .with_label_values(&[row.queue.as_str()])
            .inc();
        tracing::info!(
            task.id = row.id,
            "task cancelled: its worker stopped heartbeating after the cancellation was asked for"
        );
        if let Some(processor) = row.processor.as_deref() {
            engine
                .release_after_commit(row.id, processor, row.lease_proof())
                .await;
        }
    }
}

/// Claims due tasks for one request, in a group with the claims that arrive with it
/// ([`claim_group`]).
#[tracing::instrument(name = "claim tasks", skip_all, fields(
    task.processor = %request.processor,
    task.queue = request.queue.as_deref().unwrap_or(""),
    task.id = Empty,
    task.ids = Empty,
    task.fence = Empty,
))]
pub async fn claim(claims: &ClaimGroups, request: &ClaimTasks) -> Result<Vec<Task>, ApiError> {
    let want = want(request)?;
    let claimed = claims
        .submit(request.queue.clone(), want)
        .await
        .unwrap_or_else(|| Err(ApiError::Internal("the claim group failed".to_owned())))?;
    let span = tracing::Span::current();
    if let [row] = claimed.as_slice() {
        span.record("task.id", row.id);
        span.record("task.fence", row.fence.unwrap_or_default());
    }
    let ids: Vec<String> = claimed.iter().map(|row| row.id.to_string()).collect();
    span.record("task.ids", ids.join(","));
    Ok(claimed.into_iter().map(to_api).collect())
}

/// Claim requests gathered by queue into [`claim_group`]s.
pub type ClaimGroups =
    shared::server::coalesce::Coalescer<Option<String>, Want, Result<Vec<TaskRow>, ApiError>>;

/// What one claim group has taken so far, per request.
struct Round<'w> {
    wants: &'w [Want],
    claimed: Vec<Vec<TaskRow>>,
    /// Tasks each request has claimed.
    taken: Vec<i64>,
    /// Tasks marked dead, with their holder and the lease to release after commit.
    exhausted: Vec<(TaskRow, String, Lease)>,
    /// Lapsed tasks whose cancellation was asked for, ended as cancelled.
    cancelled: Vec<TaskRow>,
    unavailable: Option<String>,
    /// lease-service refused the lease TTL: no claim can succeed until it is fixed.
    misconfigured: Option<ApiError>,
}

impl<'w> Round<'w> {
    fn new(wants: &'w [Want]) -> Self {
        Round {
            wants,
            claimed: wants.iter().map(|_| Vec::new()).collect(),
            taken: wants.iter().map(|_| 0).collect(),
            exhausted: Vec::new(),
            cancelled: Vec::new(),
            unavailable: None,
            misconfigured: None,
        }
    }

    fn taken(&self) -> i64 {
        self.taken.iter().sum()
    }

    /// Hands each candidate, in order, to the first request with room left, asks lease-service
    /// for every candidate's lease at once, and records the answers.
    async fn grant(
        &mut self,
        conn: &mut Db,
        engine: &Engine,
        candidates: Vec<TaskRow>,
        granted: &std::sync::Mutex<Vec<(i64, String, Lease)>>,
    ) -> Result<(), ApiError> {
        if candidates.is_empty() {
            return Ok(());
        }
        let mut room: Vec<i64> = self
            .wants
            .iter()
            .zip(&self.taken)
            .map(|(want, taken)| want.limit - taken)
            .collect();
        let mut owners: Vec<usize> = Vec::with_capacity(candidates.len());
        let mut kept: Vec<TaskRow> = Vec::with_capacity(candidates.len());
        for task in candidates {
            let owner = if exhausted(&task) {
                // Its lease is taken only to prove that its last attempt is over, then it is
                // marked dead: no request's room is spent on it.
                room.iter().position(|left| *left > 0).unwrap_or(0)
            } else {
                let Some(owner) = room.iter().position(|left| *left > 0) else {
                    continue;
                };
                room[owner] -= 1;
                owner
            };
            owners.push(owner);
            kept.push(task);
        }
        let candidates = kept;
        if candidates.is_empty() {
            return Ok(());
        }
        // One call and one commit in lease-service for the whole group.
        let resources: Vec<String> = candidates.iter().map(|t| engine.resource(t.id)).collect();
        let holders: Vec<String> = owners
            .iter()
            .map(|owner| self.wants[*owner].processor.clone())
            .collect();
        let mut answer = match engine
            .leases
            .acquire_each(&resources, &holders, Some(engine.lease_ttl))
            .await
        {
            Ok(answer) => {
                engine.lease_ttl_verdict.accept();
                answer
            }
            Err(LeaseError::Rejected { code, error, .. }) if code == "invalid_ttl" => {
                self.misconfigured =
                    Some(engine.lease_ttl_verdict.reject(engine.lease_ttl, &error));
                return Ok(());
            }
            Err(LeaseError::Unavailable(reason)) => {
                self.unavailable = Some(reason);
                return Ok(());
            }
            Err(
                err @ LeaseError::Rejected {
                    status: 401 | 403, ..
                },
            ) => {
                self.unavailable = Some(credentials_refused(&err));
                return Ok(());
            }
            Err(other) => {
                tracing::warn!(error = %other, "lease-service refused a batch of task leases");
                return Ok(());
            }
        };
        let mut to_claim: Vec<(usize, i64, Lease)> = Vec::new();
        for ((task, resource), owner) in candidates.into_iter().zip(resources).zip(owners) {
            let take = |leases: &mut Vec<Lease>| {
                let at = leases.iter().position(|l| l.resource == resource)?;
                Some(leases.swap_remove(at))
            };
            let lease = if let Some(lease) = take(&mut answer.acquired) {
                lease
            } else if let Some(lease) = take(&mut answer.extended) {
                // The same name already works on it under this fence: not handed out twice.
                if task.fence == Some(lease.fence) {
                    continue;
                }
                lease
            } else {
                if task.status == "running"
                    && let Some(held) = answer.held.iter().find(|h| h.resource == resource)
                {
                    repo::postpone_lapse(conn, task.id, held.expires_at).await?;
                }
                continue;
            };
            let holder = &self.wants[owner].processor;
            granted
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((task.id, holder.clone(), lease.clone()));
            if exhausted(&task) {
                let reason = format!(
                    "attempts exhausted: the lease of attempt {} of {} ran out (processor {:?} stopped heartbeating)",
                    task.attempts,
                    task.max_attempts,
                    task.processor.as_deref().unwrap_or("?")
                );
                let row = repo::mark_final(conn, task.id, "dead", Some(&reason)).await?;
                self.exhausted.push((row, holder.clone(), lease));
            } else {
                self.taken[owner] += 1;
                to_claim.push((owner, task.id, lease));
            }
        }
        if !to_claim.is_empty() {
            let claims: Vec<repo::Claim<'_>> = to_claim
                .iter()
                .map(|(owner, id, lease)| repo::Claim {
                    id: *id,
                    processor: &self.wants[*owner].processor,
                    fence: lease.fence,
                    lease_secret: lease.secret.as_ref(),
                    lease_expiry: lease.expires_at,
                })
                .collect();
            let mut rows: std::collections::HashMap<i64, TaskRow> =
                repo::mark_claimed(conn, &claims)
                    .await?
                    .into_iter()
                    .map(|row| (row.id, row))
                    .collect();
            // Each request's tasks in the order the candidates came: priority, then schedule.
            for (owner, id, _) in &to_claim {
                if let Some(row) = rows.remove(id) {
                    self.claimed[*owner].push(row);
                }
            }
        }
        Ok(())
    }
}

/// A task that has used all its attempts: it is never handed out again.
fn exhausted(task: &TaskRow) -> bool {
    task.attempts >= task.max_attempts
}

/// How a locked transition ended: a task to answer with, or a refusal that still committed a
/// change (a cancellation noticed on the way), whose lease must then be released.
#[derive(Debug)]
pub enum Transition {
    Done(TaskRow),
    Cancelled(TaskRow),
}

/// Locks the task for a transition by its worker: refused unless `processor` (with `fence`)
/// owns it; `Ok(Err(..))` when a cancellation asked for meanwhile ends it instead (recording
/// `error`, if given); `Ok(Ok(task))` to go on.
async fn owned(
    conn: &mut Db,
    id: i64,
    processor: &str,
    fence: Option<i64>,
    error: Option<&str>,
) -> Result<Result<TaskRow, Transition>, ApiError> {
    let task = locked(conn, id).await?;
    check_owner(&task, processor, fence)?;
    if task.cancel_requested {
        let row = repo::mark_final(conn, id, "cancelled", error).await?;
        return Ok(Err(Transition::Cancelled(row)));
    }
    Ok(Ok(task))
}

#[tracing::instrument(name = "heartbeat task", skip_all, fields(
    task.id = id,
    task.processor = %request.processor,
    task.fence = request.fence.unwrap_or_default(),
    task.queue = Empty,
    task.status = Empty,
))]
pub async fn heartbeat(
    conn: &mut Db,
    engine: &Engine,
    id: i64,
    request: &Heartbeat,
) -> Result<Task, ApiError> {
    validate_name("processor", &request.processor)?;
    let processor = request.processor.as_str();
    let outcome = conn
        .transaction::<_, ApiError, _>(async |conn| {
            let task = match owned(conn, id, processor, request.fence, None).await? {
                Ok(task) => task,
                Err(cancelled) => return Ok(cancelled),
            };
            let lease = engine
                .leases
                .renew(&engine.resource(id), processor, task.lease_proof(), None)
                .await
                .map_err(|err| lease_refusal(engine, "heartbeat", err))?;
            Ok(Transition::Done(
                repo::record_heartbeat(conn, id, lease.expires_at).await?,
            ))
        })
        .await?;
    finish(engine, outcome, processor).await
}

/// One completion in a group: who completes which task, with what output.
#[derive(Debug)]
pub struct Completion {
    pub processor: String,
    pub item: CompleteItem,
}

/// Single completions gathered into groups of [`complete_group`].
pub type CompletionGroups =
    shared::server::coalesce::Coalescer<(), Completion, Result<Transition, ApiError>>;

/// How many waiting completions, from the front, go in one group: at most [`MAX_CLAIM`], and
/// never one task twice (a repeat waits for the next group, and is judged after the first).
pub fn completions_per_group(waiting: &[Completion]) -> usize {
    shared::server::coalesce::distinct_prefix(
        waiting.iter().map(|completion| completion.item.id),
        usize::try_from(MAX_CLAIM).unwrap_or(100),
    )
}

/// A worker's completion of one task (`PUT /{id}/complete`), judged in a group with the
/// completions that arrive with it ([`complete_group`]), exactly as it would be alone.
#[tracing::instrument(name = "complete task", skip_all, fields(
    task.id = id,
    task.processor = %request.processor,
    task.fence = request.fence.unwrap_or_default(),
    task.queue = Empty,
    task.status = Empty,
))]
pub async fn complete(
    groups: &CompletionGroups,
    engine: &Engine,
    id: i64,
    request: CompleteTask,
) -> Result<Task, ApiError> {
    validate_name("processor", &request.processor)?;
    check_size("task_output", &request.task_output)?;
    let completion = Completion {
        processor: request.processor,
        item: CompleteItem {
            id,
            task_output: request.task_output,
            fence: request.fence,
        },
    };
    let processor = completion.processor.clone();
    let outcome = groups
        .submit((), completion)
        .await
        .unwrap_or_else(|| Err(ApiError::Internal("the completion group failed".to_owned())));
    answer(engine, outcome, &processor).await
}

/// A worker's completions of several tasks (`PUT /api/tasks/complete`): one group. Each item is
/// answered with its own status; only a request that is wrong as a whole, or a database
/// failure, fails the request.
#[tracing::instrument(name = "complete tasks", skip_all, fields(task.processor = %request.processor))]
pub async fn complete_many(
    conn: &mut Db,
    engine: &Engine,
    request: &CompleteTasks,
) -> Result<Vec<ItemResult>, ApiError> {
    validate_name("processor", &request.processor)?;
    let max = usize::try_from(MAX_CLAIM).unwrap_or(100);
    check_batch_size("tasks", "completions", request.tasks.len(), max)?;
    if let Some(id) = first_duplicate(request.tasks.iter().map(|item| item.id)) {
        return Err(ApiError::invalid(
            "duplicate_task",
            "tasks",
            format!("task {id} is listed twice"),
        ));
    }
    let completions: Vec<Completion> = request
        .tasks
        .iter()
        .map(|item| Completion {
            processor: request.processor.clone(),
            item: item.clone(),
        })
        .collect();
    let outcomes = complete_group(conn, engine, &completions).await?;
    let mut results = Vec::with_capacity(completions.len());
    for (completion, outcome) in completions.iter().zip(outcomes) {
        let id = completion.item.id;
        results.push(match answer(engine, outcome, &completion.processor).await {
            Ok(task) => ItemResult {
                id,
                status: 202,
                task: Some(task),
                error: None,
            },
            Err(err) => ItemResult {
                id,
                status: actix_web::ResponseError::status_code(&err).as_u16(),
                task: None,
                error: Some(err.body()),
            },
        });
    }
    Ok(results)
}

/// What a completion's transition answers: the task, or the refusal; counts completions.
async fn answer(
    engine: &Engine,
    outcome: Result<Transition, ApiError>,
    processor: &str,
) -> Result<Task, ApiError> {
    let transition = outcome?;
    if let Transition::Done(row) = &transition {
        engine
            .metrics
            .completed
            .with_label_values(&[row.queue.as_str()])
            .inc();
    }
    finish(engine, transition, processor).await
}

/// Completions of distinct tasks, each by its own processor: one transaction, one lease-service
/// call (a batch release), one commit. Each is judged as if it came alone: refused unless its
/// processor owns the task (with the fence, if given); ended as cancelled if a cancellation was
/// asked for; else its lease is released, which is the final proof of ownership, and only then
/// is the task marked succeeded.
#[tracing::instrument(name = "complete group", skip_all, fields(
    task.group.size = completions.len(),
    task.ids = Empty,
))]
pub async fn complete_group(
    conn: &mut Db,
    engine: &Engine,
    completions: &[Completion],
) -> Result<Vec<Result<Transition, ApiError>>, ApiError> {
    let ids: Vec<i64> = completions.iter().map(|c| c.item.id).collect();
    tracing::Span::current().record(
        "task.ids",
        ids.iter().map(i64::to_string).collect::<Vec<_>>().join(","),
    );
    let outcomes = conn
        .transaction::<_, ApiError, _>(async |conn| {
            let mut locked: std::collections::HashMap<i64, TaskRow> = repo::lock_many(conn, &ids)
                .await?
                .into_iter()
                .map(|row| (row.id, row))
                .collect();
            let mut outcomes: Vec<Option<Result<Transition, ApiError>>> =
                completions.iter().map(|_| None).collect();
            let mut releasing: Vec<(usize, TaskRow)> = Vec::new();
            for (index, completion) in completions.iter().enumerate() {
                let item = &completion.item;
                let verdict = match check_size("task_output", &item.task_output) {
                    Err(err) => Err(err),
                    Ok(()) => match locked.remove(&item.id) {
                        None => Err(task_not_found(item.id)),
                        Some(task) => match check_owner(&task, &completion.processor, item.fence) {
                            Err(err) => Err(err),
                            Ok(()) if task.cancel_requested => Ok(Transition::Cancelled(
                                repo::mark_final(conn, task.id, "cancelled", None).await?,
                            )),
                            Ok(()) => {
                                releasing.push((index, task));
                                continue;
                            }
                        },
                    },
                };
                outcomes[index] = Some(verdict);
            }
            if releasing.is_empty() {
                return Ok(outcomes);
            }
            let leases: Vec<(String, String, Proof<'_>)> = releasing
                .iter()
                .map(|(index, task)| {
                    (
                        engine.resource(task.id),
                        completions[*index].processor.clone(),
                        task.lease_proof(),
                    )
                })
                .collect();
            match engine.leases.release_many(&leases).await {
                Err(err) => {
                    let refusal = lease_refusal(engine, "complete", err);
                    for (index, _) in &releasing {
                        outcomes[*index] = Some(Err(refusal.clone()));
                    }
                }
                Ok(answers) => {
                    let mut succeeded: Vec<(usize, i64)> = Vec::new();
                    for ((index, task), answer) in releasing.iter().zip(answers) {
                        match answer {
                            Err(err) => {
                                outcomes[*index] =
                                    Some(Err(lease_refusal(engine, "complete", err)));
                            }
                            Ok(_) => succeeded.push((*index, task.id)),
                        }
                    }
                    let done: Vec<(i64, &serde_json::Value)> = succeeded
                        .iter()
                        .map(|(index, id)| (*id, &completions[*index].item.task_output))
                        .collect();
                    let rows = if done.is_empty() {
                        Vec::new()
                    } else {
                        repo::mark_succeeded_many(conn, &done).await?
                    };
                    for (row, took) in rows {
                        engine
                            .metrics
                            .claim_to_complete
                            .with_label_values(&[row.queue.as_str()])
                            .observe(took);
                        if let Some((index, _)) = succeeded.iter().find(|(_, id)| *id == row.id) {
                            outcomes[*index] = Some(Ok(Transition::Done(row)));
                        }
                    }
                }
            }
            Ok(outcomes)
        })
        .await?;
    Ok(completions
        .iter()
        .zip(outcomes)
        .map(|(completion, outcome)| {
            outcome.unwrap_or_else(|| {
                Err(ApiError::Internal(format!(
                    "task {} was not judged",
                    completion.item.id
                )))
            })
        })
        .collect())
}

#[tracing::instrument(name = "fail task", skip_all, fields(
    task.id = id,
    task.processor = %request.processor,
    task.fence = request.fence.unwrap_or_default(),
    task.queue = Empty,
    task.status = Empty,
))]
pub async fn fail(
    conn: &mut Db,
    engine: &Engine,
    id: i64,
    request: &FailTask,
) -> Result<Task, ApiError> {
    validate_name("processor", &request.processor)?;
    // PostgreSQL text cannot hold NUL; the error is for people, so it is cleaned, not refused.
    let error: String = request
        .error
        .chars()
        .filter(|c| *c != '\0')
        .take(MAX_ERROR_BYTES / 4)
        .collect();
    let processor = request.processor.as_str();
    let outcome = conn
        .transaction::<_, ApiError, _>(async |conn| {
            let task = match owned(conn, id, processor, request.fence, Some(&error)).await? {
                Ok(task) => task,
                Err(cancelled) => return Ok(cancelled),
            };
            engine
                .leases
                .release(&engine.resource(id), processor, task.lease_proof())
                .await
                .map_err(|err| lease_refusal(engine, "fail", err))?;
            let queue = task.queue.as_str();
            let row = if request.requeue {
                engine
                    .metrics
                    .failed
                    .with_label_values(&[queue, "requeued"])
                    .inc();
                repo::mark_retry(conn, id, &error, 0.0, true).await?
            } else if !request.retryable || task.attempts >= task.max_attempts {
                engine
                    .metrics
                    .failed
                    .with_label_values(&[queue, "dead"])
                    .inc();
                engine
                    .metrics
                    .dead
                    .with_label_values(&[queue, "failed"])
                    .inc();
                let reason = if request.retryable {
                    format!(
                        "attempt {} of {} failed: {error}",
                        task.attempts, task.max_attempts
                    )
                } else {
                    format!("failed, not retryable: {error}")
                };
                repo::mark_final(conn, id, "dead", Some(&reason)).await?
            } else {
                engine
                    .metrics
                    .failed
                    .with_label_values(&[queue, "retry"])
                    .inc();
                repo::mark_retry(conn, id, &error, engine.retry_delay(task.attempts), false).await?
            };
            Ok(Transition::Done(row))
        })
        .await?;
    finish(engine, outcome, processor).await
}

/// An operator's retry of a dead task (`POST /{id}/retry`): pending again, due now, with its
/// attempts renewed; any other status is 409 `not_dead`.
pub async fn retry(conn: &mut Db, engine: &Engine, id: i64) -> Result<Task, ApiError> {
    let row = conn
        .transaction::<_, ApiError, _>(async |conn| {
            let task = locked(conn, id).await?;
            match parse_status(&task.status) {
                TaskStatus::Dead => Ok(repo::requeue_dead(conn, id).await?),
                other => Err(ApiError::Conflict {
                    code: "not_dead",
                    message: format!(
                        "task {id} is {}: only a dead task can be retried",
                        other.as_str()
                    ),
                }),
            }
        })
        .await?;
    engine
        .metrics
        .retried
        .with_label_values(&[row.queue.as_str()])
        .inc();
    tracing::info!(
        task.id = id,
        "dead task put back in its queue by an operator"
    );
    Ok(to_api(row))
}

/// A pending task is cancelled at once (200, `Ok(true)`); a running one is marked, and its
/// worker's next heartbeat or completion ends it (202, `Ok(false)`).
pub async fn cancel(conn: &mut Db, engine: &Engine, id: i64) -> Result<(Task, bool), ApiError> {
    let (row, immediate) = conn
        .transaction::<_, ApiError, _>(async |conn| {
            let task = locked(conn, id).await?;
            match parse_status(&task.status) {
                TaskStatus::Pending => {
                    Ok((repo::mark_final(conn, id, "cancelled", None).await?, true))
                }
                TaskStatus::Running => Ok((repo::request_cancel(conn, id).await?, false)),
                done => Err(finished(id, done)),
            }
        })
        .await?;
    if immediate {
        engine
            .metrics
            .cancelled
            .with_label_values(&[row.queue.as_str()])
            .inc();
    }
    Ok((to_api(row), immediate))
}

pub async fn get(conn: &mut Db, id: i64) -> Result<Task, ApiError> {
    Ok(to_api(locked_or_missing(repo::find(conn, id).await?, id)?))
}

async fn locked(conn: &mut Db, id: i64) -> Result<TaskRow, ApiError> {
    locked_or_missing(repo::lock(conn, id).await?, id)
}

fn locked_or_missing(row: Option<TaskRow>, id: i64) -> Result<TaskRow, ApiError> {
    row.ok_or_else(|| task_not_found(id))
}

fn task_not_found(id: i64) -> ApiError {
    ApiError::NotFound {
        code: "task_not_found",
        message: format!("no task with id {id}"),
    }
}

/// After the transition's commit: release the lease of a task that a cancellation ended, and
/// answer.
async fn finish(engine: &Engine, outcome: Transition, processor: &str) -> Result<Task, ApiError> {
    let row = match &outcome {
        Transition::Done(row) | Transition::Cancelled(row) => row,
    };
    let span = tracing::Span::current();
    span.record("task.queue", row.queue.as_str());
    span.record("task.status", row.status.as_str());
    // One line per request would drown the log (RUST_LOG=task_service=debug shows them).
    tracing::debug!(task.id = row.id, task.status = %row.status, "task updated");
    match outcome {
        Transition::Done(row) => Ok(to_api(row)),
        Transition::Cancelled(row) => {
            engine
                .metrics
                .cancelled
                .with_label_values(&[row.queue.as_str()])
                .inc();
            engine
                .release_after_commit(row.id, processor, row.lease_proof())
                .await;
            Err(ApiError::Conflict {
                code: "cancelled",
                message: format!("task {} was cancelled; stop working on it", row.id),
            })
        }
    }
}

/// Whether `processor` (with `fence`, if given) may act on the task as its current worker.
fn check_owner(task: &TaskRow, processor: &str, fence: Option<i64>) -> Result<(), ApiError> {
    let status = parse_status(&task.status);
    if status.is_final() {
        return Err(finished(task.id, status));
    }
    if let Some(fence) = fence
        && task.fence != Some(fence)
    {
        return Err(ApiError::Conflict {
            code: "lease_lost",
            message: format!(
                "fence {fence} is not the task's current fence {}: another claim superseded yours",
                task.fence.map_or("(none)".to_owned(), |f| f.to_string())
            ),
        });
    }
    if task.processor.as_deref() != Some(processor) {
        return Err(ApiError::Conflict {
            code: "not_owner",
            message: format!("task {} is not claimed by {processor:?}", task.id),
        });
    }
    if status != TaskStatus::Running {
        return Err(ApiError::Conflict {
            code: "lease_lost",
            message: format!("task {} is no longer running", task.id),
        });
    }
    Ok(())
}

fn finished(id: i64, status: TaskStatus) -> ApiError {
    ApiError::Conflict {
        code: "task_finished",
        message: format!("task {id} is already {}", status.as_str()),
    }
}

/// lease-service said no (or could not be asked) about a worker's lease.
fn lease_refusal(engine: &Engine, operation: &str, err: LeaseError) -> ApiError {
    match err {
        LeaseError::Unavailable(reason) => {
            ApiError::Unavailable(format!("lease-service unavailable: {reason}"))
        }
        LeaseError::Held { .. } | LeaseError::Lost { .. } => {
            engine
                .metrics
                .lease_lost
                .with_label_values(&[operation])
                .inc();
            // An operator's revoke is named as such: the worker was evicted, not late.
            let code = match &err {
                LeaseError::Lost { code, .. } if code == "lease_revoked" => "lease_revoked",
                _ => "lease_lost",
            };
            ApiError::Conflict {
                code,
                message: format!("the task's lease was lost: {err}"),
            }
        }
        LeaseError::Rejected {
            status: 401 | 403, ..
        } => ApiError::Unavailable(credentials_refused(&err)),
        other => ApiError::Internal(format!("lease-service refused: {other}")),
    }
}

/// lease-service does not accept task-service's token: every task lease call will fail until
/// an operator fixes the configuration, so it is reported as unavailability, loudly.
fn credentials_refused(err: &LeaseError) -> String {
    let message = format!(
        "lease-service refused task-service's credentials (check LEASE_SERVICE_TOKEN): {err}"
    );
    tracing::error!("{message}");
    message
}

fn parse_status(status: &str) -> TaskStatus {
    // The table's CHECK constraint admits only these five.
    TaskStatus::parse(status).unwrap_or(TaskStatus::Dead)
}

pub fn to_api(row: TaskRow) -> Task {
    Task {
        id: row.id,
        task_data: row.task_data,
        scheduled_at: row.scheduled_at,
        processor: row.processor,
        last_heart_beat_at: row.last_heartbeat_at,
        must_heart_beat_before: row.must_heartbeat_before,
        started_at: row.started_at,
        processed_at: row.processed_at,
        task_output: row.task_output,
        status: parse_status(&row.status),
        queue: row.queue,
        priority: row.priority,
        attempts: row.attempts,
        max_attempts: row.max_attempts,
        fence: row.fence,
        idempotency_key: row.idempotency_key,
        last_error: row.last_error,
        cancel_requested: row.cancel_requested,
        created_at: row.created_at,
        updated_at: row.updated_at,
    }
}
