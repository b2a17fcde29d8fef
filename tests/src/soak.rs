//! The soak: the whole stack as real processes on a private PostgreSQL, under load, with faults
//! injected on a seeded random schedule, then the invariant checker over the recorded history.
//!
//! The stack: two replicas each of lease-service and task-service behind round-robin proxies
//! ([`crate::proxy`]), three task-generator replicas, four or more workers, and a producer that
//! adds tasks of its own (some failing on purpose) next to the generator's. Every lease and
//! task change is recorded by the services' own triggers in the same transaction, so the
//! checker ([`crate::checker`]) judges what the databases committed, not what clients saw.
//!
//! The seed fixes the sequence of choices (which fault, which target, how long); the
//! processes' timing still differs between runs, so a replay reproduces the schedule, not
//! every interleaving.
//!
//! Run it long with `cargo run -p tests --bin soak -- --help` (after
//! `cargo build --workspace --bins`); `tests/tests/soak.rs` runs the short CI mode.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use leasehold_local::postgres::{PrivatePostgres, ShutdownMode};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::sync::{Mutex, OwnedMutexGuard, RwLock};
use tokio::task::JoinSet;

use crate::Service;
use crate::checker::{self, Report};
use crate::proxy::Proxy;

/// Lease length of every lease in the soak (tasks, generator): short, so that pauses longer
/// than it are cheap to inject.
const TTL_SECONDS: f64 = 2.0;

/// The soak runs with the front door locked, as production would: every write carries a
/// bearer token with its role, and lease-service requires proof of holding (the lease's
/// secret) for renew and release.
mod tokens {
    /// task-service's token at lease-service.
    pub const SERVICE: &str = "soak-task-service-token-0001";
    /// The generators' one token: leaseholder at lease-service, producer at task-service.
    pub const GENERATOR: &str = "soak-generator-token-0001";
    pub const PRODUCER: &str = "soak-producer-token-0001";
    pub const WORKER: &str = "soak-worker-token-0001";
    pub const OPERATOR: &str = "soak-operator-token-0001";
}

/// An HTTP client that sends `token` with every request.
fn client_with(token: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .default_headers(leasehold::api::Secret::bearer_headers(Some(
            &leasehold::api::Secret::new(token),
        )))
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

/// What to run, and for how long.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    /// How long faults are injected; the drain and the check come after.
    pub duration: Duration,
    pub seed: u64,
    /// Mean time between two faults (exponentially distributed).
    pub mean_fault_interval: Duration,
    pub workers: usize,
    pub generators: usize,
    /// The generator's rate, in tasks per second.
    pub generator_rate: u32,
    /// Tasks per second the soak's own producer adds.
    pub producer_rate: u32,
    /// How long the stack may take, after the faults stop, to bring every task to an end.
    pub drain_timeout: Duration,
    /// Runs lease-service with acquire's expiry check removed (`LEASEHOLD_TEST_BREAK_ACQUIRE`),
    /// to show that the checker catches a broken build.
    pub break_acquire: bool,
}

impl SoakOptions {
    /// The CI mode: two minutes of faults, one every 0.25 s on average.
    pub fn ci(seed: u64) -> SoakOptions {
        SoakOptions {
            duration: Duration::from_secs(120),
            seed,
            mean_fault_interval: Duration::from_millis(250),
            workers: 4,
            generators: 3,
            generator_rate: 10,
            producer_rate: 10,
            drain_timeout: Duration::from_secs(120),
            break_acquire: false,
        }
    }
}

/// The kinds of fault the schedule draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// kill -9 of a worker, started again after a moment.
    WorkerKill,
    /// SIGSTOP of a worker for up to twice the TTL, then SIGCONT.
    WorkerPause,
    /// SIGTERM of a worker (it hands its tasks back), started again.
    WorkerTerminate,
    GeneratorKill,
    GeneratorPause,
    /// kill -9 of one lease-service replica, started again after a moment.
    LeaseReplicaKill,
    LeaseReplicaPause,
    /// SIGTERM of one lease-service replica and a start: a rolling restart.
    LeaseServiceRestart,
    TaskReplicaKill,
    TaskReplicaPause,
    TaskServiceRestart,
    /// Every lease-service replica paused for longer than the TTL: every lease lapses unseen.
    LeaseServicePauseBeyondTtl,
    /// `pg_ctl restart -m fast`: connections dropped, transactions rolled back.
    PostgresFastRestart,
    /// `pg_ctl restart -m immediate`: a crash, then recovery.
    PostgresImmediateRestart,
}

impl Fault {
    pub const ALL: [Fault; 14] = [
        Fault::WorkerKill,
        Fault::WorkerPause,
        Fault::WorkerTerminate,
        Fault::GeneratorKill,
        Fault::GeneratorPause,
        Fault::LeaseReplicaKill,
        Fault::LeaseReplicaPause,
        Fault::LeaseServiceRestart,
        Fault::TaskReplicaKill,
        Fault::TaskReplicaPause,
        Fault::TaskServiceRestart,
        Fault::LeaseServicePauseBeyondTtl,
        Fault::PostgresFastRestart,
        Fault::PostgresImmediateRestart,
    ];

    /// Relative frequency in the schedule.
    fn weight(self) -> u32 {
        match self {
            Self::WorkerKill | Self::WorkerPause => 10,
            Self::GeneratorKill | Self::GeneratorPause => 5,
            Self::LeaseReplicaKill
            | Self::LeaseReplicaPause
            | Self::TaskReplicaKill
            | Self::TaskReplicaPause => 4,
            Self::WorkerTerminate | Self::LeaseServiceRestart | Self::TaskServiceRestart => 2,
            Self::LeaseServicePauseBeyondTtl
            | Self::PostgresFastRestart
            | Self::PostgresImmediateRestart => 1,
        }
    }
}

/// What a soak did and found.
#[derive(Debug)]
pub struct Summary {
    pub seed: u64,
    pub options: SoakOptions,
    /// Faults injected, by kind.
    pub faults: BTreeMap<Fault, usize>,
    /// Faults the stack did not recover from (a process that would not come back, ...).
    pub fault_errors: Vec<String>,
    /// Tasks the producer's requests created (the generator's are in the report).
    pub produced: usize,
    /// Tasks whose creation was acknowledged but that are not in the table: lost.
    pub lost: Vec<i64>,
    /// How long the stack took to finish every task once the faults stopped, if it did.
    pub drained_in: Option<Duration>,
    pub report: Report,
    /// Where the services' logs are.
    pub log_dir: String,
}

impl Summary {
    pub fn faults_total(&self) -> usize {
        self.faults.values().sum()
    }

    /// No violation, every task finished, every fault recovered from.
    pub fn passed(&self) -> bool {
        self.report.violations.is_empty()
            && self.lost.is_empty()
            && self.fault_errors.is_empty()
            && self.drained_in.is_some()
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.passed() { "PASSED" } else { "FAILED" };
        writeln!(
            f,
            "soak {verdict}: seed {} ({:?} of faults; replay with --seed {} or SOAK_SEED={})",
            self.seed, self.options.duration, self.seed, self.seed
        )?;
        writeln!(f, "faults injected: {}", self.faults_total())?;
        for (fault, count) in &self.faults {
            writeln!(f, "  {:<28} {count:>5}", format!("{fault:?}"))?;
        }
        for error in &self.fault_errors {
            writeln!(f, "  not recovered: {error}")?;
        }
        let statuses: Vec<String> = self
            .report
            .tasks_by_status
            .iter()
            .map(|(status, count)| format!("{status} {count}"))
            .collect();
        writeln!(
            f,
            "tasks: {} ({} generated, {} from the producer); {}",
            self.report.tasks,
            self.report.generated_tasks,
            self.produced,
            statuses.join(", ")
        )?;
        if self.lost.is_empty() {
            writeln!(f, "every acknowledged create is in the table")?;
        } else {
            writeln!(
                f,
                "LOST: {} acknowledged tasks are missing: {:?}",
                self.lost.len(),
                self.lost
            )?;
        }
        match self.drained_in {
            Some(took) => writeln!(f, "drained {took:.1?} after the faults stopped")?,
            None => writeln!(
                f,
                "NOT drained within {:?} after the faults stopped",
                self.options.drain_timeout
            )?,
        }
        writeln!(f, "invariants:")?;
        write!(f, "{}", self.report)?;
        writeln!(f, "service logs: {}", self.log_dir)
    }
}

type Shared = Arc<Mutex<Service>>;

/// The running stack and what faults act on.
struct Stack {
    postgres: Arc<StdMutex<PrivatePostgres>>,
    /// Held for writing while PostgreSQL restarts, for reading while a service starts: a
    /// service that starts while the database is down fails its migrations and exits, which is
    /// right for it but not a fault the soak means to inject.
    restart_gate: Arc<RwLock<()>>,
    lease_db: String,
    task_db: String,
    lease_replicas: Vec<Shared>,
    task_replicas: Vec<Shared>,
    generators: Vec<Shared>,
    workers: Vec<Shared>,
    /// Held only to keep it running: a proxy stops when dropped.
    _lease_proxy: Proxy,
    task_proxy: Proxy,
}

fn secs(seconds: f64) -> String {
    format!("{seconds}")
}

impl Stack {
    async fn start(options: &SoakOptions) -> Stack {
        // Crash-safe commits: the soak crashes PostgreSQL and then counts what survived.
        let postgres = tokio::task::spawn_blocking(PrivatePostgres::start_ephemeral_crash_safe)
            .await
            .unwrap()
            .unwrap_or_else(|err| panic!("cannot start the soak's PostgreSQL: {err}"));
        postgres.create_database("leases").await.unwrap();
        postgres.create_database("tasks").await.unwrap();
        let lease_db = postgres.url("leases");
        let task_db = postgres.url("tasks");
        let ttl = secs(TTL_SECONDS);

        let lease_tokens = format!(
            "leaseholder:{},leaseholder:{}",
            tokens::SERVICE,
            tokens::GENERATOR
        );
        let mut lease_env = vec![
            ("AUTH_TOKENS", lease_tokens.as_str()),
            ("LEASE_REQUIRE_SECRET", "true"),
            ("LEASE_SWEEP_INTERVAL_SECONDS", "5"),
            ("LEASE_RETENTION_SECONDS", "604800"),
            ("SHUTDOWN_GRACE_SECONDS", "2"),
        ];
        if options.break_acquire {
            lease_env.push(("LEASEHOLD_TEST_BREAK_ACQUIRE", "true"));
        }
        let mut lease_replicas = Vec::new();
        for _ in 0..2 {
            let replica = Service::lease_service(&lease_db, &lease_env).await;
            lease_replicas.push(replica);
        }
        let lease_proxy = Proxy::start(lease_replicas.iter().map(|s| s.port).collect()).await;

        let task_tokens = format!(
            "producer:{},worker:{},operator:{},producer:{}",
            tokens::PRODUCER,
            tokens::WORKER,
            tokens::OPERATOR,
            tokens::GENERATOR
        );
        let task_env = [
            ("AUTH_TOKENS", task_tokens.as_str()),
            ("LEASE_SERVICE_TOKEN", tokens::SERVICE),
            ("TASK_LEASE_TTL_SECONDS", ttl.as_str()),
            ("LEASE_CALL_TIMEOUT_MS", "1000"),
            ("TASK_SWEEP_INTERVAL_SECONDS", "5"),
            ("TASK_RETENTION_SECONDS", "604800"),
            ("TASK_RETRY_BASE_SECONDS", "0.2"),
            ("TASK_RETRY_MAX_SECONDS", "2"),
            ("SHUTDOWN_GRACE_SECONDS", "2"),
        ];
        let mut task_replicas = Vec::new();
        for _ in 0..2 {
            let replica = Service::task_service(&task_db, &lease_proxy.base_url(), &task_env).await;
            task_replicas.push(replica);
        }
        let task_proxy = Proxy::start(task_replicas.iter().map(|s| s.port).collect()).await;

        let worker_env = [
            ("AUTH_TOKEN", tokens::WORKER),
            ("LEASE_TTL_SECONDS", ttl.as_str()),
            ("HEARTBEAT_INTERVAL_SECONDS", "0.5"),
            ("POLL_MAX_MS", "200"),
            ("WORKER_CONCURRENCY", "3"),
            ("SHUTDOWN_GRACE_SECONDS", "3"),
        ];
        let mut workers = Vec::new();
        for _ in 0..options.workers {
            workers.push(Service::worker(&task_proxy.base_url(), &worker_env).await);
        }
        let generator_env = [
            ("AUTH_TOKEN", tokens::GENERATOR),
            ("GENERATOR_LEASE_TTL_SECONDS", ttl.as_str()),
            ("GENERATOR_RETRY_INTERVAL_SECONDS", "0.5"),
            ("GENERATOR_SETTINGS_POLL_MS", "200"),
        ];
        let mut generators = Vec::new();
        for i in 0..options.generators {
            generators.push(
                Service::generator(
                    &task_proxy.base_url(),
                    &lease_proxy.base_url(),
                    &format!("soak-generator-{i}"),
                    &generator_env,
                )
                .await,
            );
        }
        let shared = |list: Vec<Service>| -> Vec<Shared> {
            list.into_iter().map(|s| Arc::new(Mutex::new(s))).collect()
        };
        Stack {
            postgres: Arc::new(StdMutex::new(postgres)),
            restart_gate: Arc::new(RwLock::new(())),
            lease_db,
            task_db,
            lease_replicas: shared(lease_replicas),
            task_replicas: shared(task_replicas),
            generators: shared(generators),
            workers: shared(workers),
            _lease_proxy: lease_proxy,
            task_proxy,
        }
    }

    /// The group of processes a fault acts on, if it acts on one.
    fn targets(&self, fault: Fault) -> &[Shared] {
        match fault {
            Fault::WorkerKill | Fault::WorkerPause | Fault::WorkerTerminate => &self.workers,
            Fault::GeneratorKill | Fault::GeneratorPause => &self.generators,
            Fault::LeaseReplicaKill
            | Fault::LeaseReplicaPause
            | Fault::LeaseServiceRestart
            | Fault::LeaseServicePauseBeyondTtl => &self.lease_replicas,
            Fault::TaskReplicaKill | Fault::TaskReplicaPause | Fault::TaskServiceRestart => {
                &self.task_replicas
            }
            Fault::PostgresFastRestart | Fault::PostgresImmediateRestart => &[],
        }
    }

    /// Locks what `fault` needs without waiting: one idle process of its group (chosen by
    /// `pick`), or the whole group for the lease-service-wide pause. `None` if it is busy.
    fn claim(&self, fault: Fault, pick: usize) -> Option<Vec<OwnedMutexGuard<Service>>> {
        let group = self.targets(fault);
        if fault == Fault::LeaseServicePauseBeyondTtl {
            return group
                .iter()
                .map(|s| Arc::clone(s).try_lock_owned().ok())
                .collect();
        }
        if group.is_empty() {
            return Some(Vec::new());
        }
        (0..group.len())
            .map(|i| &group[(pick + i) % group.len()])
            .find_map(|s| Arc::clone(s).try_lock_owned().ok())
            .map(|guard| vec![guard])
    }
}

/// One scheduled fault with everything random about it already drawn.
struct Injection {
    fault: Fault,
    targets: Vec<OwnedMutexGuard<Service>>,
    /// How long the process stays down or paused.
    hold: Duration,
}

async fn inject(
    injection: Injection,
    postgres: Arc<StdMutex<PrivatePostgres>>,
    gate: Arc<RwLock<()>>,
) -> Result<(), String> {
    let Injection {
        fault,
        mut targets,
        hold,
    } = injection;
    match fault {
        Fault::WorkerPause
        | Fault::GeneratorPause
        | Fault::LeaseReplicaPause
        | Fault::TaskReplicaPause
        | Fault::LeaseServicePauseBeyondTtl => {
            for target in &targets {
                target.pause();
            }
            tokio::time::sleep(hold).await;
            for target in &targets {
                target.resume();
            }
        }
        Fault::WorkerKill
        | Fault::GeneratorKill
        | Fault::LeaseReplicaKill
        | Fault::TaskReplicaKill => {
            let target = &mut targets[0];
            target.kill();
            tokio::time::sleep(hold).await;
            start_again(target, &gate).await?;
        }
        Fault::WorkerTerminate | Fault::LeaseServiceRestart | Fault::TaskServiceRestart => {
            let target = &mut targets[0];
            let code = target.terminate(Duration::from_secs(20)).await;
            if code != Some(0) {
                return Err(format!(
                    "{} on port {} exited with {code:?} on SIGTERM",
                    target.name, target.port
                ));
            }
            tokio::time::sleep(hold).await;
            start_again(target, &gate).await?;
        }
        Fault::PostgresFastRestart | Fault::PostgresImmediateRestart => {
            let mode = if fault == Fault::PostgresFastRestart {
                ShutdownMode::Fast
            } else {
                ShutdownMode::Immediate
            };
            let _exclusive = gate.write().await;
            tokio::task::spawn_blocking(move || {
                postgres
                    .lock()
                    .map_err(|_| "the PostgreSQL handle is poisoned".to_owned())?
                    .restart(mode)
                    .map_err(|err| format!("PostgreSQL did not restart ({mode:?}): {err}"))
            })
            .await
            .map_err(|err| err.to_string())??;
        }
    }
    Ok(())
}

/// Starts a stopped process again (not while PostgreSQL restarts); an error if it will not
/// come up.
async fn start_again(target: &mut Service, gate: &RwLock<()>) -> Result<(), String> {
    let _shared = gate.read().await;
    let name = format!("{} on port {}", target.name, target.port);
    // `start_again` panics with the log's tail when the process will not come up; keep that
    // message as the error.
    let outcome =
        futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(target.start_again()))
            .await;
    outcome.map_err(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default();
        format!("{name} did not come back: {message}")
    })
}

/// Picks a fault kind by weight.
fn draw_fault(rng: &mut StdRng) -> Fault {
    let total: u32 = Fault::ALL.iter().map(|f| f.weight()).sum();
    let mut ticket = rng.random_range(0..total);
    for fault in Fault::ALL {
        if ticket < fault.weight() {
            return fault;
        }
        ticket -= fault.weight();
    }
    Fault::WorkerKill
}

/// How long a fault holds its target down or paused.
fn draw_hold(fault: Fault, rng: &mut StdRng) -> Duration {
    let seconds = match fault {
        // Up to twice the TTL: some pauses end within the lease, some well after it.
        Fault::WorkerPause | Fault::GeneratorPause => rng.random_range(0.2..2.0 * TTL_SECONDS),
        Fault::LeaseReplicaPause | Fault::TaskReplicaPause => rng.random_range(0.2..TTL_SECONDS),
        Fault::LeaseServicePauseBeyondTtl => TTL_SECONDS + rng.random_range(0.5..1.5),
        Fault::PostgresFastRestart | Fault::PostgresImmediateRestart => 0.0,
        _ => rng.random_range(0.1..1.5),
    };
    Duration::from_secs_f64(seconds)
}

/// Adds tasks at `rate` per second until `stop`; some fail on purpose, some for good. Returns
/// the ids of the tasks whose creation was acknowledged.
async fn produce(
    task_url: String,
    rate: u32,
    seed: u64,
    stop: tokio_util::sync::CancellationToken,
) -> Vec<i64> {
    let http = client_with(tokens::PRODUCER);
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
        let body = json!({
            "task_name": "soak",
            "task_data": {"sleep_duration_seconds": rng.random_range(0.0..0.5), "fail": fail},
            "max_attempts": 5,
        });
        if let Ok(response) = http
            .post(format!("{task_url}/api/tasks"))
            .json(&body)
            .send()
            .await
            && response.status().is_success()
            && let Ok(task) = response.json::<Value>().await
            && let Some(id) = task["id"].as_i64()
        {
            created.push(id);
        }
    }
    created
}

#[derive(diesel::QueryableByName)]
struct TaskId {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    id: i64,
}

/// The ids in `acknowledged` that the tasks table does not have.
async fn missing_tasks(task_db: &str, acknowledged: &[i64]) -> Vec<i64> {
    use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
    let mut conn = AsyncPgConnection::establish(task_db).await.unwrap();
    let present: std::collections::HashSet<i64> = diesel::sql_query("SELECT id FROM tasks")
        .load::<TaskId>(&mut conn)
        .await
        .unwrap()
        .into_iter()
        .map(|row| row.id)
        .collect();
    acknowledged
        .iter()
        .copied()
        .filter(|id| !present.contains(id))
        .collect()
}

/// Sends `body` to `path` through `base`, as an operator, until it is answered 200, or
/// `timeout` passes.
async fn post_until_ok(base: &str, path: &str, body: &Value, timeout: Duration) -> bool {
    let http = client_with(tokens::OPERATOR);
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(response) = http.post(format!("{base}{path}")).json(body).send().await
            && response.status().is_success()
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

/// Waits until no task is pending or running; how long that took, or `None` on timeout.
async fn drain(task_url: &str, timeout: Duration) -> Option<Duration> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let start = Instant::now();
    while start.elapsed() < timeout {
        if let Ok(response) = http
            .get(format!("{task_url}/api/tasks/counts"))
            .send()
            .await
            && let Ok(counts) = response.json::<Value>().await
        {
            let total = &counts["total"];
            if total["pending"] == 0 && total["running"] == 0 {
                return Some(start.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    None
}

/// Runs a soak and returns its summary; it does not assert anything itself.
pub async fn run(options: SoakOptions) -> Summary {
    let stack = Stack::start(&options).await;
    let mut rng = StdRng::seed_from_u64(options.seed);
    let task_url = stack.task_proxy.base_url();

    let settings = json!({"rate_per_second": options.generator_rate, "min_sleep_seconds": 0, "max_sleep_seconds": 1});
    assert!(
        post_until_ok(
            &task_url,
            "/api/generator/start",
            &settings,
            Duration::from_secs(30)
        )
        .await,
        "the generator would not start"
    );
    let stop_producing = tokio_util::sync::CancellationToken::new();
    let producer = tokio::spawn(produce(
        task_url.clone(),
        options.producer_rate,
        options.seed,
        stop_producing.clone(),
    ));

    let mut faults: BTreeMap<Fault, usize> = BTreeMap::new();
    let mut fault_errors = Vec::new();
    let mut running = JoinSet::new();
    let start = Instant::now();
    let mean = options.mean_fault_interval.as_secs_f64();
    while start.elapsed() < options.duration {
        // Exponential gaps: faults come in bursts and lulls, as they do.
        let gap = -mean * (1.0 - rng.random::<f64>()).ln();
        tokio::time::sleep(Duration::from_secs_f64(gap.min(mean * 10.0))).await;
        let fault = draw_fault(&mut rng);
        let pick = rng.random_range(0..16);
        let hold = draw_hold(fault, &mut rng);
        let Some(targets) = stack.claim(fault, pick) else {
            continue; // its targets are all in a fault already
        };
        *faults.entry(fault).or_default() += 1;
        running.spawn(inject(
            Injection {
                fault,
                targets,
                hold,
            },
            Arc::clone(&stack.postgres),
            Arc::clone(&stack.restart_gate),
        ));
        while let Some(done) = running.try_join_next() {
            record(done, &mut fault_errors);
        }
    }
    while let Some(done) = running.join_next().await {
        record(done, &mut fault_errors);
    }

    stop_producing.cancel();
    let produced = producer.await.unwrap_or_default();
    if !post_until_ok(
        &task_url,
        "/api/generator/stop",
        &json!({}),
        Duration::from_secs(30),
    )
    .await
    {
        fault_errors.push("the generator could not be stopped after the faults".to_owned());
    }
    let drained_in = drain(&task_url, options.drain_timeout).await;
    // Every replica's pool works again, whether or not it was restarted after PostgreSQL was.
    for replica in stack.lease_replicas.iter().chain(&stack.task_replicas) {
        let replica = replica.lock().await;
        let ready = replica.get("/readyz").await;
        if ready.status != 200 {
            fault_errors.push(format!(
                "{} on port {} is not ready after the faults: {} {}",
                replica.name, replica.port, ready.status, ready.body
            ));
        }
    }
    let report = checker::check(&stack.lease_db, Some(&stack.task_db), true).await;
    let lost = missing_tasks(&stack.task_db, &produced).await;
    let log_dir = crate::log_dir().display().to_string();
    drop(stack);
    Summary {
        seed: options.seed,
        options,
        faults,
        fault_errors,
        produced: produced.len(),
        lost,
        drained_in,
        report,
        log_dir,
    }
}

fn record(done: Result<Result<(), String>, tokio::task::JoinError>, errors: &mut Vec<String>) {
    match done {
        Ok(Ok(())) => {}
        Ok(Err(error)) => errors.push(error),
        Err(join) => errors.push(format!("a fault task failed: {join}")),
    }
}
