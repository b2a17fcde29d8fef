//! The soak's own traffic and watching: its producer, its operator's calls, the drain after
//! the faults, and the acknowledged tasks the table lost. They speak through the shared typed
//! [`leasehold::TaskClient`], as the worker and the generator do.

use std::time::{Duration, Instant};

use leasehold::TaskClient;
use leasehold::generator::StartGenerator;
use leasehold::tasks::CreateTask;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use super::{client_with, tokens};

/// The queue the soak limits to [`LIMIT`] tasks running at once; a third of the producer's
/// tasks go to it.
pub const LIMITED_QUEUE: &str = "limited";
pub const LIMIT: i32 = 3;
/// And to [`RATE`] starts per second, in bursts of [`BURST`]: above the producer's pace for it,
/// so that it binds only on bursts of retries and re-claims.
pub const RATE: f64 = 5.0;
pub const BURST: i32 = 3;
/// And to [`KEY_LIMIT`] running tasks of one tenant: most of its tasks carry one of
/// [`TENANTS`] concurrency keys, the rest none.
pub const KEY_LIMIT: i32 = 2;
pub const TENANTS: usize = 3;

/// Adds tasks at `rate` per second until `stop`; some fail on purpose, some for good, a third go
/// to the limited queue. Returns the ids of the tasks whose creation was acknowledged, each with
/// when the acknowledgement came.
pub(super) async fn produce(
    task_url: String,
    rate: u32,
    seed: u64,
    stop: tokio_util::sync::CancellationToken,
) -> Vec<Created> {
    let tasks = client_with(&task_url, tokens::PRODUCER);
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let mut created = Vec::new();
    let period = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while !stop.is_cancelled() {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = ticker.tick() => {}
        }
        let fail: Value = match rng.random_range(0..10) {
            0 => json!(0.5),
            1 => json!("permanent"),
            _ => Value::Null,
        };
        let limited = created.len() % 3 == 0;
        let tenant = rng.random_range(0..=TENANTS);
        let nonce = Created::nonce("producer", created.len());
        let task = CreateTask {
            task_data: json!({
                "sleep_duration_seconds": rng.random_range(0.0..0.5),
                "fail": fail,
                "nonce": nonce,
            }),
            max_attempts: Some(5),
            queue: limited.then(|| LIMITED_QUEUE.to_owned()),
            concurrency_key: (limited && tenant < TENANTS).then(|| format!("tenant-{tenant}")),
            ..CreateTask::default()
        };
        if let Ok(answer) = tasks.create(&task).await {
            created.push(Created {
                id: answer.task().id,
                nonce,
                at: Instant::now(),
            });
        }
    }
    created
}

/// A create the service acknowledged, and the nonce its `task_data` carried.
#[derive(Debug, Clone)]
pub struct Created {
    pub id: i64,
    pub nonce: String,
    pub at: Instant,
}

impl Created {
    /// A text no other create of this run carries: `who` and a count of its own.
    pub fn nonce(who: &str, count: usize) -> String {
        format!("{who}-{count}")
    }
}

#[derive(diesel::QueryableByName)]
struct TaskNonce {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    id: i64,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    nonce: Option<String>,
}

/// The ids in `acknowledged` whose row the tasks table does not have. A row is known by its id
/// and its nonce together: a failover that loses writes sets the id sequence back, and the new
/// primary hands the lost ids out again to other tasks, so an id alone would still be found.
pub(super) async fn missing_tasks(task_db: &str, acknowledged: &[Created]) -> Vec<i64> {
    use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
    let mut conn = AsyncPgConnection::establish(task_db).await.unwrap();
    let present: std::collections::HashSet<(i64, String)> =
        diesel::sql_query("SELECT id, task_data->>'nonce' AS nonce FROM tasks")
            .load::<TaskNonce>(&mut conn)
            .await
            .unwrap()
            .into_iter()
            .filter_map(|row| Some((row.id, row.nonce?)))
            .collect();
    acknowledged
        .iter()
        .filter(|created| !present.contains(&(created.id, created.nonce.clone())))
        .map(|created| created.id)
        .collect()
}

/// What the soak's operator asks: the generator started or stopped, the limited queue limited.
pub(super) enum OperatorCall {
    /// Start the generator.
    Start(StartGenerator),
    /// Stop the generator.
    Stop,
    /// Limit [`LIMITED_QUEUE`] to [`LIMIT`] tasks running at once, [`KEY_LIMIT`] of one key, and
    /// [`RATE`] starts a second.
    Limit,
}

/// Makes `call` through `base`, as an operator, until it is answered with success, or
/// `timeout` passes.
pub(super) async fn operator_until_ok(base: &str, call: &OperatorCall, timeout: Duration) -> bool {
    let tasks = client_with(base, tokens::OPERATOR);
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let answer = match call {
            OperatorCall::Start(settings) => tasks.start_generator(settings).await.map(drop),
            OperatorCall::Stop => tasks.stop_generator().await.map(drop),
            OperatorCall::Limit => tasks
                .set_queue_limits(
                    LIMITED_QUEUE,
                    &leasehold::queues::QueueSettings {
                        concurrency_limit: Some(LIMIT),
                        key_concurrency_limit: Some(KEY_LIMIT),
                        rate_limit: Some(leasehold::queues::RateLimit {
                            per_second: RATE,
                            burst: BURST,
                        }),
                    },
                )
                .await
                .map(drop),
        };
        if answer.is_ok() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

/// Waits until no task is pending or running, and says how long that took. A drain that still
/// finishes tasks is slow, not stuck: it fails once no task has reached an end for `stall`, or
/// once it has lasted `cap` in all, whichever comes first. (A fixed deadline failed 30-minute
/// runs whose limited queue, three slots under a rate limit, held a backlog of its own making:
/// every worker fault holds its slots until the task's lease runs out.)
pub(super) async fn drain(task_url: &str, stall: Duration, cap: Duration) -> Option<Duration> {
    let tasks = TaskClient::new([task_url]).with_timeout(Duration::from_secs(2));
    let start = Instant::now();
    let mut last_progress = Instant::now();
    let mut ended = 0;
    while start.elapsed() < cap && last_progress.elapsed() < stall {
        if let Ok(counts) = tasks.counts().await {
            let now = |status: &str| counts.total.get(status).copied().unwrap_or(0);
            if now("pending") == 0 && now("running") == 0 {
                return Some(start.elapsed());
            }
            let finished = now("succeeded") + now("dead") + now("cancelled");
            if finished > ended {
                ended = finished;
                last_progress = Instant::now();
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    None
}

/// What the tasks table holds that is not finished: pending tasks due now and later (with the
/// latest due time and how many were tried before), and running ones.
pub(super) async fn left_over(task_db: &str) -> String {
    let rows = crate::query(
        task_db,
        "SELECT count(*) FILTER (WHERE status = 'pending' AND scheduled_at <= now()) AS due,
                count(*) FILTER (WHERE status = 'pending' AND scheduled_at > now()) AS later,
                count(*) FILTER (WHERE status = 'pending' AND attempts > 0) AS retried,
                count(*) FILTER (WHERE status = 'running') AS running,
                COALESCE(EXTRACT(EPOCH FROM max(scheduled_at) FILTER (WHERE status = 'pending')
                                           - now()), 0)::float8 AS last_due_in_seconds
         FROM tasks WHERE status IN ('pending', 'running')",
    )
    .await;
    match rows.first() {
        Some(row) => format!(
            "{} pending due, {} pending due later (the last in {:.0} s), {} of them tried before, \
             {} running",
            row["due"],
            row["later"],
            row["last_due_in_seconds"].as_f64().unwrap_or(0.0),
            row["retried"],
            row["running"]
        ),
        None => "the tasks table could not be read".to_owned(),
    }
}
