//! The benchmark harness: Leasehold side by side with the physical limit (the same SQL run
//! directly), with the sample's claim algorithm, and with itself as its tables grow, all in one
//! run on one machine, so that the ratios hold even where the absolute figures are noisy.
//!
//! It starts a private PostgreSQL with PostgreSQL's default, durable settings (every commit
//! waits for its WAL to reach the disk), lease-service and task-service as real processes, and
//! worker processes for the end-to-end figures. Nothing here asserts a time: the CI test runs the
//! quick mode only to keep the harness working; `cargo run --release -p tests --bin bench` is
//! for a person (see `--help`).
//!
//! What each section measures:
//! - **leases**: acquire, renew and release through lease-service's HTTP API with 1 to 128
//!   concurrent clients (closed loop, each client on its own resources), then the very same
//!   repository functions (the same SQL statements) called directly over as many database
//!   connections: the physical limit, and the ratio HTTP / SQL.
//! - **tasks end to end**: a backlog created over HTTP, drained by worker processes that do
//!   nothing: single claims (32 one-slot workers, so every claim and every completion is a
//!   request for one task) or batched claims (8 workers of 32 slots, each claim asking for the
//!   free slots at once, completions ready together sent together); throughput and
//!   claim-to-complete latency from the database's own timestamps.
//! - **sample's claim**: the sample's algorithm (`ORDER BY scheduled_at OFFSET n LIMIT 1 FOR
//!   UPDATE` on its unindexed table, the lease call made while the row is locked), against
//!   Leasehold's claim over HTTP, claim-and-complete cycles on the same backlog sizes.
//! - **contention**: clients racing for a few shared resources (1 is leader election), each
//!   acquiring one at random and releasing it at once when it wins: cycles and refusals per
//!   second, through HTTP and as direct SQL.
//! - **growth**: the lease and claim figures again with more and more finished tasks and ended
//!   leases present.
//! - **latency under half load**: claims at a fixed rate of half the measured maximum.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::sql_types::{BigInt, Text};
use diesel::{OptionalExtension, QueryableByName};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use leasehold::{Lease, LeaseClient, RetryPolicy};
use leasehold_local::postgres::PrivatePostgres;
use serde::Serialize;
use serde_json::{Value, json};

use crate::Service;

/// What to measure, and how long.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Concurrent clients of the lease benchmarks.
    pub lease_concurrency: Vec<usize>,
    /// How long each closed-loop measurement runs.
    pub phase: Duration,
    /// Tasks in each end-to-end backlog.
    pub e2e_tasks: u64,
    /// Worker processes of the single-claim run, each with one slot: every claim and every
    /// completion is a request for one task.
    pub single_workers: usize,
    /// Worker processes of the batched run, and slots per worker (each claim asks for as many
    /// tasks as there are free slots; completions ready together go in one request).
    pub workers: usize,
    pub batch_concurrency: usize,
    /// Pending tasks in the claim comparison's backlogs (the sample's table and Leasehold's).
    pub backlog_sizes: Vec<u64>,
    /// Finished tasks and ended leases present, for the growth figures.
    pub growth_sizes: Vec<u64>,
    /// Shared resources the contention figures race for.
    pub contended_resources: Vec<u64>,
    /// Concurrent claim-and-complete clients.
    pub claim_clients: usize,
    /// Large tasks stored, and concurrent readers paging through them, for the memory figure.
    pub memory_tasks: u64,
    pub memory_readers: usize,
    /// The sections to run (all when empty): `leases`, `contention`, `e2e`, `sample`, `growth`,
    /// `memory`.
    pub sections: Vec<String>,
}

impl BenchOptions {
    /// The full run, for a person: several minutes.
    pub fn full() -> BenchOptions {
        BenchOptions {
            lease_concurrency: vec![1, 8, 32, 128],
            phase: Duration::from_secs(5),
            e2e_tasks: 20_000,
            single_workers: 32,
            workers: 8,
            batch_concurrency: 32,
            backlog_sizes: vec![10_000, 1_000_000],
            growth_sizes: vec![10_000, 100_000, 1_000_000],
            contended_resources: vec![1, 100],
            claim_clients: 8,
            memory_tasks: 1_000,
            memory_readers: 8,
            sections: Vec::new(),
        }
    }

    /// The quick run CI makes to keep the harness working: well under a minute, figures
    /// meaningless.
    pub fn quick() -> BenchOptions {
        BenchOptions {
            lease_concurrency: vec![1, 8],
            phase: Duration::from_millis(400),
            e2e_tasks: 200,
            single_workers: 2,
            workers: 2,
            batch_concurrency: 8,
            backlog_sizes: vec![300, 1_000],
            growth_sizes: vec![1_000, 3_000],
            contended_resources: vec![1, 2],
            claim_clients: 4,
            memory_tasks: 40,
            memory_readers: 8,
            sections: Vec::new(),
        }
    }
}

/// One measured figure.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    pub section: String,
    pub name: String,
    /// Concurrent clients (or worker slots).
    pub concurrency: usize,
    /// Rows present in the table the figure depends on, where that is the point.
    pub rows: Option<u64>,
    pub ops: u64,
    pub errors: u64,
    pub seconds: f64,
    pub per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// A ratio between two figures of the same run.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    pub name: String,
    pub value: f64,
}

/// task-service's resident memory while readers page through large tasks at once.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryFigure {
    pub tasks: u64,
    pub task_kib: u64,
    pub readers: usize,
    /// Pages read (all readers together) and the bytes they carried.
    pub pages: u64,
    pub mib_read: f64,
    pub rss_before_mib: f64,
    pub rss_peak_mib: f64,
    pub rss_after_mib: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub figures: Vec<Figure>,
    pub ratios: Vec<Ratio>,
    pub memory: Vec<MemoryFigure>,
}

impl Report {
    pub fn find(&self, section: &str, name: &str, concurrency: usize) -> Option<&Figure> {
        self.figures
            .iter()
            .find(|f| f.section == section && f.name == name && f.concurrency == concurrency)
    }

    fn ratio(&mut self, name: impl Into<String>, numerator: f64, denominator: f64) {
        let value = if denominator > 0.0 {
            numerator / denominator
        } else {
            0.0
        };
        self.ratios.push(Ratio {
            name: name.into(),
            value,
        });
    }

    /// The report as markdown tables, one per section, then the ratios.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let mut sections: Vec<&str> = Vec::new();
        for figure in &self.figures {
            if !sections.contains(&figure.section.as_str()) {
                sections.push(&figure.section);
            }
        }
        for section in sections {
            let _ = writeln!(out, "\n### {section}\n");
            let _ = writeln!(
                out,
                "| what | clients | rows present | ops | errors | per second | p50 ms | p99 ms |"
            );
            let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|");
            for f in self.figures.iter().filter(|f| f.section == section) {
                let rows = f.rows.map_or(String::new(), |r| r.to_string());
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {:.0} | {:.2} | {:.2} |",
                    f.name, f.concurrency, rows, f.ops, f.errors, f.per_second, f.p50_ms, f.p99_ms
                );
            }
        }
        if !self.memory.is_empty() {
            let _ = writeln!(out, "\n### memory: open reads of large tasks\n");
            let _ = writeln!(
                out,
                "| tasks | KiB each | readers | pages read | MiB read | RSS before MiB | RSS peak MiB | RSS after MiB |"
            );
            let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|");
            for m in &self.memory {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} |",
                    m.tasks,
                    m.task_kib,
                    m.readers,
                    m.pages,
                    m.mib_read,
                    m.rss_before_mib,
                    m.rss_peak_mib,
                    m.rss_after_mib
                );
            }
        }
        let _ = writeln!(out, "\n### ratios (same run)\n");
        let _ = writeln!(out, "| ratio | value |");
        let _ = writeln!(out, "|---|---:|");
        for ratio in &self.ratios {
            let _ = writeln!(out, "| {} | {:.2} |", ratio.name, ratio.value);
        }
        out
    }
}

/// Latencies of the successful operations of a measurement, and its failures.
#[derive(Debug, Default)]
struct Samples {
    latencies: Vec<Duration>,
    errors: u64,
}

impl Samples {
    fn merge(&mut self, other: Samples) {
        self.latencies.extend(other.latencies);
        self.errors += other.errors;
    }

    fn figure(
        mut self,
        section: &str,
        name: &str,
        concurrency: usize,
        rows: Option<u64>,
        elapsed: Duration,
    ) -> Figure {
        self.latencies.sort_unstable();
        let ops = self.latencies.len() as u64;
        let seconds = elapsed.as_secs_f64().max(1e-9);
        Figure {
            section: section.to_owned(),
            name: name.to_owned(),
            concurrency,
            rows,
            ops,
            errors: self.errors,
            seconds,
            per_second: ops as f64 / seconds,
            p50_ms: percentile(&self.latencies, 0.50),
            p99_ms: percentile(&self.latencies, 0.99),
        }
    }
}

fn percentile(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[index.min(sorted.len() - 1)].as_secs_f64() * 1000.0
}

/// Runs `clients` copies of `client` at once; each gets its index and returns its samples.
/// Returns the merged samples and the wall time from start to the last client's end.
async fn run_clients<F, Fut>(clients: usize, client: F) -> (Samples, Duration)
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = Samples> + Send + 'static,
{
    let started = Instant::now();
    let handles: Vec<_> = (0..clients).map(|k| tokio::spawn(client(k))).collect();
    let mut all = Samples::default();
    for handle in handles {
        if let Ok(samples) = handle.await {
            all.merge(samples);
        }
    }
    (all, started.elapsed())
}

/// The machine under test: a durable private PostgreSQL and the two services.
pub struct Bench {
    _postgres: PrivatePostgres,
    pub lease_db: String,
    pub task_db: String,
    pub leases: Service,
    pub tasks: Service,
    http: reqwest::Client,
}

impl std::fmt::Debug for Bench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bench")
            .field("lease_db", &self.lease_db)
            .finish_non_exhaustive()
    }
}

impl Bench {
    pub async fn start() -> Bench {
        let postgres = tokio::task::spawn_blocking(PrivatePostgres::start_ephemeral_durable)
            .await
            .unwrap_or_else(|err| panic!("{err}"))
            .unwrap_or_else(|err| panic!("cannot start the benchmark's PostgreSQL: {err}"));
        postgres.create_database("leases").await.unwrap();
        postgres.create_database("tasks").await.unwrap();
        let lease_db = postgres.url("leases");
        let task_db = postgres.url("tasks");
        let quiet = [
            ("RUST_LOG", "warn"),
            ("HTTP_WORKERS", "2"),
            ("DATABASE_POOL_SIZE", "32"),
        ];
        let leases = Service::lease_service(&lease_db, &quiet).await;
        let tasks = Service::task_service(&task_db, &leases.base_url(), &quiet).await;
        Bench {
            _postgres: postgres,
            lease_db,
            task_db,
            leases,
            tasks,
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(256)
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap(),
        }
    }

    fn lease_client(&self) -> LeaseClient {
        LeaseClient::from_parts(self.http.clone(), self.leases.base_url())
            .with_retry(RetryPolicy::none())
    }
}

/// Runs every section and returns the report.
pub async fn run(options: &BenchOptions) -> Report {
    let bench = Bench::start().await;
    let mut report = Report::default();
    let wanted = |section: &str| {
        options.sections.is_empty() || options.sections.iter().any(|s| s == section)
    };
    if wanted("leases") {
        leases(&bench, options, &mut report).await;
    }
    if wanted("contention") {
        contention(&bench, options, &mut report).await;
    }
    if wanted("e2e") {
        end_to_end(&bench, options, &mut report).await;
    }
    if wanted("sample") {
        sample_comparison(&bench, options, &mut report).await;
    }
    if wanted("growth") {
        growth(&bench, options, &mut report).await;
    }
    if wanted("memory") {
        memory(&bench, options, &mut report).await;
    }
    report
}

/// A process's resident set (`VmRSS`) or its peak (`VmHWM`), in MiB, from `/proc`.
fn resident_mib(pid: nix::unistd::Pid, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// The issue this answers: eight concurrent `GET /api/tasks?limit=1000` over 63 KiB tasks took
/// task-service from 42 MB to 1 GB. Stores `memory_tasks` tasks of 63 KiB in a queue of their
/// own, then `memory_readers` readers page through them all at once, twice; reports
/// task-service's resident memory before, at its peak (`VmHWM`, reset first through
/// `clear_refs`) and after.
async fn memory(bench: &Bench, options: &BenchOptions, report: &mut Report) {
    const TASK_KIB: u64 = 63;
    const QUEUE: &str = "bench-memory";
    let pad = "m".repeat(usize::try_from(TASK_KIB * 1024 - 64).unwrap_or(0));
    let create = bench.tasks.url("/api/tasks");
    for n in 0..options.memory_tasks {
        let body = json!({"task_data": {"n": n, "pad": pad}, "queue": QUEUE,
                          "scheduled_at": "2999-01-01T00:00:00Z"});
        let answer = bench.http.post(&create).json(&body).send().await;
        assert!(answer.is_ok_and(|a| a.status().as_u16() == 201));
    }
    let pid = bench.tasks.pid();
    let before = resident_mib(pid, "VmRSS");
    // Resets the peak to the current size: what follows is this section's own peak.
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
    let readers: Vec<_> = (0..options.memory_readers)
        .map(|_| {
            let http = bench.http.clone();
            let list = bench.tasks.url("/api/tasks");
            tokio::spawn(async move {
                let (mut pages, mut bytes) = (0u64, 0u64);
                for _ in 0..2 {
                    let mut cursor = String::new();
                    loop {
                        let url = format!("{list}?queue={QUEUE}&limit=1000&cursor={cursor}");
                        let Ok(answer) = http.get(&url).send().await else {
                            break;
                        };
                        let Ok(body) = answer.bytes().await else {
                            break;
                        };
                        pages += 1;
                        bytes += body.len() as u64;
                        let page: Value = serde_json::from_slice(&body).unwrap_or_default();
                        match page["nextCursor"].as_str() {
                            Some(next) => cursor = next.to_owned(),
                            None => break,
                        }
                    }
                }
                (pages, bytes)
            })
        })
        .collect();
    let (mut pages, mut bytes) = (0, 0);
    for reader in readers {
        if let Ok((p, b)) = reader.await {
            pages += p;
            bytes += b;
        }
    }
    let peak = resident_mib(pid, "VmHWM");
    report.memory.push(MemoryFigure {
        tasks: options.memory_tasks,
        task_kib: TASK_KIB,
        readers: options.memory_readers,
        pages,
        mib_read: bytes as f64 / (1024.0 * 1024.0),
        rss_before_mib: before,
        rss_peak_mib: peak,
        rss_after_mib: resident_mib(pid, "VmRSS"),
    });
}

async fn connect(url: &str) -> AsyncPgConnection {
    AsyncPgConnection::establish(url)
        .await
        .unwrap_or_else(|err| panic!("connecting to {url}: {err}"))
}

async fn execute(url: &str, sql: &str) {
    let mut conn = connect(url).await;
    diesel::sql_query(sql)
        .execute(&mut conn)
        .await
        .unwrap_or_else(|err| panic!("{sql}: {err}"));
}

// ---------------------------------------------------------------------------------------------
// Leases: HTTP against the same statements run directly.

async fn leases(bench: &Bench, options: &BenchOptions, report: &mut Report) {
    for &clients in &options.lease_concurrency {
        let held = lease_http(bench, options, clients, false, report).await;
        let raw = lease_sql(bench, options, clients, report).await;
        for (operation, http_rate, sql_rate) in [
            ("acquire", held[0], raw[0]),
            ("renew", held[1], raw[1]),
            ("release", held[2], raw[2]),
        ] {
            report.ratio(
                format!("lease {operation} HTTP / SQL, {clients} clients"),
                http_rate,
                sql_rate,
            );
        }
    }
}

/// Acquire (each client its own fresh resources), renew and release them, through HTTP.
/// Returns the three rates.
async fn lease_http(
    bench: &Bench,
    options: &BenchOptions,
    clients: usize,
    growth: bool,
    report: &mut Report,
) -> [f64; 3] {
    let run = rand::random::<u32>();
    let phase = options.phase;
    let section = if growth {
        "growth: leases through HTTP".to_owned()
    } else {
        "leases through HTTP".to_owned()
    };
    let acquired: Arc<std::sync::Mutex<Vec<Vec<Lease>>>> =
        Arc::new(std::sync::Mutex::new(vec![Vec::new(); clients]));
    let client = bench.lease_client();
    let store = acquired.clone();
    let (samples, elapsed) = run_clients(clients, |k| {
        let client = client.clone();
        let store = store.clone();
        async move {
            let mut samples = Samples::default();
            let mut mine = Vec::new();
            let deadline = Instant::now() + phase;
            let mut i = 0u64;
            while Instant::now() < deadline {
                let resource = format!("http-{run}-{k}-{i}");
                i += 1;
                let started = Instant::now();
                match client
                    .acquire(
                        &resource,
                        &format!("client-{k}"),
                        Some(Duration::from_secs(3600)),
                    )
                    .await
                {
                    Ok(lease) => {
                        samples.latencies.push(started.elapsed());
                        mine.push(lease);
                    }
                    Err(_) => samples.errors += 1,
                }
            }
            store.lock().unwrap()[k] = mine;
            samples
        }
    })
    .await;
    let acquire = samples.figure(&section, "acquire", clients, None, elapsed);
    let rates_acquire = acquire.per_second;
    report.figures.push(acquire);

    let held: Arc<Vec<Vec<Lease>>> = Arc::new(std::mem::take(&mut *acquired.lock().unwrap()));
    let leases = held.clone();
    let (samples, elapsed) = run_clients(clients, |k| {
        let client = client.clone();
        let leases = leases.clone();
        async move {
            let mut samples = Samples::default();
            let mine = &leases[k];
            let deadline = Instant::now() + phase;
            let mut i = 0usize;
            while Instant::now() < deadline && !mine.is_empty() {
                let lease = &mine[i % mine.len()];
                i += 1;
                let started = Instant::now();
                match client
                    .renew(&lease.resource, &lease.holder, lease.proof(), None)
                    .await
                {
                    Ok(_) => samples.latencies.push(started.elapsed()),
                    Err(_) => samples.errors += 1,
                }
            }
            samples
        }
    })
    .await;
    let renew = samples.figure(&section, "renew", clients, None, elapsed);
    let rates_renew = renew.per_second;
    report.figures.push(renew);

    let leases = held.clone();
    let (samples, elapsed) = run_clients(clients, |k| {
        let client = client.clone();
        let leases = leases.clone();
        async move {
            let mut samples = Samples::default();
            let deadline = Instant::now() + phase;
            for lease in &leases[k] {
                if Instant::now() >= deadline {
                    break;
                }
                let started = Instant::now();
                match client
                    .release(&lease.resource, &lease.holder, lease.proof())
                    .await
                {
                    Ok(_) => samples.latencies.push(started.elapsed()),
                    Err(_) => samples.errors += 1,
                }
            }
            samples
        }
    })
    .await;
    let release = samples.figure(&section, "release", clients, None, elapsed);
    let rates_release = release.per_second;
    report.figures.push(release);
    [rates_acquire, rates_renew, rates_release]
}

/// One connection to the leases database per client, set up as lease-service's own sessions are,
/// made before a measurement starts so that connecting is not timed.
async fn lease_connections(
    bench: &Bench,
    clients: usize,
) -> Arc<Vec<Arc<tokio::sync::Mutex<AsyncPgConnection>>>> {
    let mut connections = Vec::new();
    for _ in 0..clients {
        let conn = lease_service::db::establish(&bench.lease_db)
            .await
            .unwrap_or_else(|err| panic!("connecting to the leases database: {err}"));
        connections.push(Arc::new(tokio::sync::Mutex::new(conn)));
    }
    Arc::new(connections)
}

/// A lease the direct-SQL benchmark holds: resource, holder, fence, secret digest.
type SqlLease = (String, String, i64, [u8; 32]);

/// The same three operations through lease-service's own repository functions (the same SQL
/// statements, the same digest work), one database connection per client.
async fn lease_sql(
    bench: &Bench,
    options: &BenchOptions,
    clients: usize,
    report: &mut Report,
) -> [f64; 3] {
    use lease_service::repo::{self, AcquireProof, Acquired};
    let run = rand::random::<u32>();
    let phase = options.phase;
    let section = "leases as direct SQL (the physical limit)";
    let connections = lease_connections(bench, clients).await;
    let acquired: Arc<std::sync::Mutex<Vec<Vec<SqlLease>>>> =
        Arc::new(std::sync::Mutex::new(vec![Vec::new(); clients]));
    let store = acquired.clone();
    let conns = connections.clone();
    let (samples, elapsed) = run_clients(clients, |k| {
        let conns = conns.clone();
        let store = store.clone();
        async move {
            let mut conn = conns[k].lock().await;
            let mut samples = Samples::default();
            let mut mine = Vec::new();
            let deadline = Instant::now() + phase;
            let mut i = 0u64;
            while Instant::now() < deadline {
                let resource = format!("sql-{run}-{k}-{i}");
                let holder = format!("client-{k}");
                i += 1;
                let started = Instant::now();
                let secret = format!("{:064x}", rand::random::<u128>());
                let hash = leasehold::server::sha256(&secret);
                let proof = AcquireProof {
                    new_secret_hash: &hash,
                    presented_hash: None,
                    require_secret: false,
                };
                match repo::acquire(&mut conn, &resource, &holder, 3600, proof).await {
                    Ok(Acquired::New(row)) => {
                        samples.latencies.push(started.elapsed());
                        mine.push((resource, holder, row.fence, hash));
                    }
                    _ => samples.errors += 1,
                }
            }
            store.lock().unwrap()[k] = mine;
            samples
        }
    })
    .await;
    let acquire = samples.figure(section, "acquire", clients, None, elapsed);
    let rates_acquire = acquire.per_second;
    report.figures.push(acquire);

    let held = Arc::new(std::mem::take(&mut *acquired.lock().unwrap()));
    let leases = held.clone();
    let conns = connections.clone();
    let (samples, elapsed) = run_clients(clients, |k| {
        let conns = conns.clone();
        let leases = leases.clone();
        async move {
            let mut conn = conns[k].lock().await;
            let mut samples = Samples::default();
            let mine = &leases[k];
            let deadline = Instant::now() + phase;
            let mut i = 0usize;
            while Instant::now() < deadline && !mine.is_empty() {
                let (resource, holder, fence, hash) = &mine[i % mine.len()];
                i += 1;
                let started = Instant::now();
                match repo::renew(&mut conn, resource, holder, Some(*fence), Some(hash), None).await
                {
                    Ok(Some(_)) => samples.latencies.push(started.elapsed()),
                    _ => samples.errors += 1,
                }
            }
            samples
        }
    })
    .await;
    let renew = samples.figure(section, "renew", clients, None, elapsed);
    let rates_renew = renew.per_second;
    report.figures.push(renew);

    let leases = held.clone();
    let conns = connections.clone();
    let (samples, elapsed) = run_clients(clients, |k| {
        let conns = conns.clone();
        let leases = leases.clone();
        async move {
            let mut conn = conns[k].lock().await;
            let mut samples = Samples::default();
            let deadline = Instant::now() + phase;
            for (resource, holder, fence, hash) in &leases[k] {
                if Instant::now() >= deadline {
                    break;
                }
                let started = Instant::now();
                match repo::release(&mut conn, resource, holder, Some(*fence), Some(hash), None)
                    .await
                {
                    Ok(Some(_)) => samples.latencies.push(started.elapsed()),
                    _ => samples.errors += 1,
                }
            }
            samples
        }
    })
    .await;
    let release = samples.figure(section, "release", clients, None, elapsed);
    let rates_release = release.per_second;
    report.figures.push(release);
    [rates_acquire, rates_renew, rates_release]
}

// ---------------------------------------------------------------------------------------------
// Contention: clients racing for a few shared resources.

/// For each number of shared resources and each client count above one: HTTP against direct
/// SQL, and their ratio.
async fn contention(bench: &Bench, options: &BenchOptions, report: &mut Report) {
    for &resources in &options.contended_resources {
        for &clients in options.lease_concurrency.iter().filter(|c| **c > 1) {
            let http = contended(bench, options, clients, resources, Path::Http, report).await;
            let sql = contended(bench, options, clients, resources, Path::Sql, report).await;
            report.ratio(
                format!("contended cycles HTTP / SQL, {clients} clients, {resources} resources"),
                http,
                sql,
            );
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Http,
    Sql,
}

/// What one attempt on a shared resource came to.
enum Attempt {
    /// Acquired, then released.
    Cycle,
    /// Someone else held it.
    Refused,
    Failed,
}

/// `clients` racing for `resources` shared resources: each picks one at random, acquires it and,
/// if it won, releases it at once. Returns the cycles per second.
async fn contended(
    bench: &Bench,
    options: &BenchOptions,
    clients: usize,
    resources: u64,
    path: Path,
    report: &mut Report,
) -> f64 {
    use lease_service::repo::{self, AcquireProof, Acquired};
    let run = rand::random::<u32>();
    let phase = options.phase;
    let section = match path {
        Path::Http => "contention through HTTP",
        Path::Sql => "contention as direct SQL",
    };
    let client = bench.lease_client();
    let connections = match path {
        Path::Sql => lease_connections(bench, clients).await,
        Path::Http => Arc::new(Vec::new()),
    };
    let refusals = Arc::new(std::sync::Mutex::new(Samples::default()));
    let refused_store = refusals.clone();
    let (samples, elapsed) = run_clients(clients, |k| {
        let client = client.clone();
        let connections = connections.clone();
        let refused_store = refused_store.clone();
        async move {
            let mut conn = match connections.get(k) {
                Some(conn) => Some(conn.lock().await),
                None => None,
            };
            let holder = format!("client-{k}");
            let mut cycles = Samples::default();
            let mut refused = Samples::default();
            let deadline = Instant::now() + phase;
            while Instant::now() < deadline {
                let resource = format!("shared-{run}-{}", rand::random::<u64>() % resources.max(1));
                let started = Instant::now();
                let attempt = match conn.as_deref_mut() {
                    None => {
                        match client
                            .acquire(&resource, &holder, Some(Duration::from_secs(30)))
                            .await
                        {
                            Ok(lease) => {
                                match client.release(&resource, &holder, lease.proof()).await {
                                    Ok(_) => Attempt::Cycle,
                                    Err(_) => Attempt::Failed,
                                }
                            }
                            Err(leasehold::LeaseError::Held { .. }) => Attempt::Refused,
                            Err(_) => Attempt::Failed,
                        }
                    }
                    Some(conn) => {
                        let hash =
                            leasehold::server::sha256(&format!("{:064x}", rand::random::<u128>()));
                        let proof = AcquireProof {
                            new_secret_hash: &hash,
                            presented_hash: None,
                            require_secret: false,
                        };
                        match repo::acquire(conn, &resource, &holder, 30, proof).await {
                            Ok(Acquired::New(row)) => {
                                match repo::release(
                                    conn,
                                    &resource,
                                    &holder,
                                    Some(row.fence),
                                    Some(&hash),
                                    None,
                                )
                                .await
                                {
                                    Ok(Some(_)) => Attempt::Cycle,
                                    _ => Attempt::Failed,
                                }
                            }
                            Ok(Acquired::Held(_)) => Attempt::Refused,
                            _ => Attempt::Failed,
                        }
                    }
                };
                match attempt {
                    Attempt::Cycle => cycles.latencies.push(started.elapsed()),
                    Attempt::Refused => refused.latencies.push(started.elapsed()),
                    Attempt::Failed => cycles.errors += 1,
                }
            }
            refused_store.lock().unwrap().merge(refused);
            cycles
        }
    })
    .await;
    let plural = if resources == 1 { "" } else { "s" };
    let cycles = samples.figure(
        section,
        &format!("acquire + release, {resources} shared resource{plural}"),
        clients,
        None,
        elapsed,
    );
    let rate = cycles.per_second;
    report.figures.push(cycles);
    let refused = std::mem::take(&mut *refusals.lock().unwrap());
    report.figures.push(refused.figure(
        section,
        &format!("refused (held), {resources} shared resource{plural}"),
        clients,
        None,
        elapsed,
    ));
    rate
}

// ---------------------------------------------------------------------------------------------
// Tasks end to end, with worker processes.

#[derive(QueryableByName)]
struct Drain {
    #[diesel(sql_type = BigInt)]
    done: i64,
    #[diesel(sql_type = diesel::sql_types::Double)]
    seconds: f64,
    #[diesel(sql_type = diesel::sql_types::Double)]
    p50_ms: f64,
    #[diesel(sql_type = diesel::sql_types::Double)]
    p99_ms: f64,
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    count: i64,
}

async fn drained(task_db: &str, queue: &str) -> Drain {
    let mut conn = connect(task_db).await;
    diesel::sql_query(
        "SELECT count(*) AS done,
                COALESCE(EXTRACT(EPOCH FROM max(processed_at) - min(started_at)), 0)::float8 AS seconds,
                COALESCE(percentile_cont(0.5) WITHIN GROUP
                    (ORDER BY EXTRACT(EPOCH FROM processed_at - started_at)) * 1000, 0)::float8 AS p50_ms,
                COALESCE(percentile_cont(0.99) WITHIN GROUP
                    (ORDER BY EXTRACT(EPOCH FROM processed_at - started_at)) * 1000, 0)::float8 AS p99_ms
         FROM tasks WHERE queue = $1 AND status = 'succeeded'",
    )
    .bind::<Text, _>(queue)
    .get_result(&mut conn)
    .await
    .unwrap()
}

async fn end_to_end(bench: &Bench, options: &BenchOptions, report: &mut Report) {
    let section = "tasks end to end (worker processes, no-op work)";
    for (name, workers, slots) in [
        ("single claims", options.single_workers, 1),
        ("batched claims", options.workers, options.batch_concurrency),
    ] {
        let queue = format!("e2e-{}", name.replace(' ', "-"));
        // The backlog, created over HTTP by 32 producers.
        let total = options.e2e_tasks;
        let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let http = bench.http.clone();
        let url = bench.tasks.url("/api/tasks");
        let (samples, elapsed) = run_clients(32, |_| {
            let http = http.clone();
            let url = url.clone();
            let next = next.clone();
            let queue = queue.clone();
            async move {
                let mut samples = Samples::default();
                while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < total {
                    let started = Instant::now();
                    let body = json!({"task_data": {"sleep_duration_seconds": 0}, "queue": queue});
                    match http.post(&url).json(&body).send().await {
                        Ok(r) if r.status().as_u16() == 201 => {
                            samples.latencies.push(started.elapsed());
                        }
                        _ => samples.errors += 1,
                    }
                }
                samples
            }
        })
        .await;
        report.figures.push(samples.figure(
            section,
            &format!("create (HTTP) for {name}"),
            32,
            None,
            elapsed,
        ));

        let concurrency = slots.to_string();
        let mut running = Vec::new();
        for w in 0..workers {
            let id = format!("bench-{}-{w}", queue);
            let env = [
                ("WORKER_ID", id.as_str()),
                ("WORKER_QUEUE", queue.as_str()),
                ("WORKER_CONCURRENCY", concurrency.as_str()),
                ("POLL_MIN_MS", "5"),
                ("POLL_MAX_MS", "50"),
                ("RUST_LOG", "warn"),
            ];
            running.push(Service::worker(&bench.tasks.base_url(), &env).await);
        }
        // Watched with a count the index answers; the figures come from the rows at the end
        // (the database's own timestamps), so the watching costs the run little.
        let deadline = Instant::now() + Duration::from_secs(600);
        let mut conn = connect(&bench.task_db).await;
        loop {
            let done: Count = diesel::sql_query(
                "SELECT count(*) AS count FROM tasks WHERE queue = $1 AND status = 'succeeded'",
            )
            .bind::<Text, _>(&queue)
            .get_result(&mut conn)
            .await
            .unwrap();
            if done.count as u64 >= total || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        drop(running);
        let drain = drained(&bench.task_db, &queue).await;
        let seconds = drain.seconds.max(1e-9);
        report.figures.push(Figure {
            section: section.to_owned(),
            name: format!("{name}: claim → complete (claim-to-complete latency)"),
            concurrency: workers * slots,
            rows: None,
            ops: drain.done as u64,
            errors: total.saturating_sub(drain.done as u64),
            seconds,
            per_second: drain.done as f64 / seconds,
            p50_ms: drain.p50_ms,
            p99_ms: drain.p99_ms,
        });
    }
}

// ---------------------------------------------------------------------------------------------
// The sample's claim against Leasehold's, on the same backlog sizes.

#[derive(QueryableByName)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// The sample's `tasks` table (`processed_at IS NULL` means pending; no index but the key).
const SAMPLE_TABLE: &str = "
CREATE TABLE IF NOT EXISTS sample_tasks (
    id BIGSERIAL PRIMARY KEY,
    task_data JSONB NOT NULL,
    scheduled_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    processor TEXT,
    last_heartbeat_at TIMESTAMP(3),
    must_heartbeat_before TIMESTAMP(3),
    started_at TIMESTAMP(3),
    processed_at TIMESTAMP(3),
    task_output JSONB
)";

/// Makes both backlogs `pending` tasks long: the sample's table and a Leasehold queue.
async fn fill_backlogs(bench: &Bench, queue: &str, pending: u64) {
    execute(&bench.task_db, SAMPLE_TABLE).await;
    execute(&bench.task_db, "TRUNCATE sample_tasks").await;
    execute(
        &bench.task_db,
        &format!(
            "INSERT INTO sample_tasks (task_data, scheduled_at)
             SELECT '{{\"sleep_duration_seconds\": 0}}', now() - random() * interval '1 day'
             FROM generate_series(1, {pending})"
        ),
    )
    .await;
    execute(
        &bench.task_db,
        &format!(
            "INSERT INTO tasks (task_data, queue, max_attempts, scheduled_at)
             SELECT '{{\"sleep_duration_seconds\": 0}}', '{queue}', 3,
                    now() - random() * interval '1 day'
             FROM generate_series(1, {pending})"
        ),
    )
    .await;
    execute(&bench.task_db, "VACUUM ANALYZE sample_tasks").await;
    execute(&bench.task_db, "VACUUM ANALYZE tasks").await;
    execute(&bench.task_db, "CHECKPOINT").await;
}

/// One claim-and-complete by the sample's algorithm: lock the earliest unprocessed row (after
/// skipping `skip`), ask lease-service for its lease while the row is locked, skip on refusal.
async fn sample_cycle(
    conn: &mut AsyncPgConnection,
    leases: &LeaseClient,
    processor: &str,
) -> Result<(), String> {
    let mut skip = 0i64;
    loop {
        diesel::sql_query("BEGIN")
            .execute(conn)
            .await
            .map_err(|e| e.to_string())?;
        let row: Option<Id> = diesel::sql_query(
            "SELECT id FROM sample_tasks WHERE processed_at IS NULL
             ORDER BY scheduled_at ASC LIMIT 1 OFFSET $1 FOR UPDATE",
        )
        .bind::<BigInt, _>(skip)
        .get_result(conn)
        .await
        .optional()
        .map_err(|e| e.to_string())?;
        let Some(Id { id }) = row else {
            let _ = diesel::sql_query("ROLLBACK").execute(conn).await;
            return Err("no task".to_owned());
        };
        let resource = format!("sample-task:{id}");
        match leases
            .acquire(&resource, processor, Some(Duration::from_secs(30)))
            .await
        {
            Ok(lease) => {
                diesel::sql_query(
                    "UPDATE sample_tasks SET processor = $2, started_at = now(),
                         last_heartbeat_at = now(), must_heartbeat_before = now() + interval '30 s'
                     WHERE id = $1",
                )
                .bind::<BigInt, _>(id)
                .bind::<Text, _>(processor)
                .execute(conn)
                .await
                .map_err(|e| e.to_string())?;
                diesel::sql_query("COMMIT")
                    .execute(conn)
                    .await
                    .map_err(|e| e.to_string())?;
                // Complete: record the output, release the lease.
                diesel::sql_query(
                    "UPDATE sample_tasks SET processed_at = now(), task_output = '{}' WHERE id = $1",
                )
                .bind::<BigInt, _>(id)
                .execute(conn)
                .await
                .map_err(|e| e.to_string())?;
                let _ = leases.release(&resource, processor, lease.proof()).await;
                return Ok(());
            }
            Err(_) => {
                let _ = diesel::sql_query("ROLLBACK").execute(conn).await;
                skip += 1;
            }
        }
    }
}

/// One claim-and-complete through task-service's HTTP API. Returns the claim's latency.
async fn leasehold_cycle(
    http: &reqwest::Client,
    base: &str,
    processor: &str,
    queue: &str,
) -> Result<Duration, String> {
    let started = Instant::now();
    let claim = http
        .post(format!("{base}/api/tasks/next"))
        .json(&json!({"processor": processor, "queue": queue}))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let claimed = started.elapsed();
    if claim.status().as_u16() != 202 {
        return Err(format!("claim answered {}", claim.status()));
    }
    let task: Value = claim.json().await.map_err(|e| e.to_string())?;
    let id = task["id"].as_i64().ok_or("no id")?;
    let done = http
        .put(format!("{base}/api/tasks/{id}/complete"))
        .json(&json!({"processor": processor, "task_output": {}}))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if done.status().as_u16() != 202 {
        return Err(format!("complete answered {}", done.status()));
    }
    Ok(claimed)
}

/// Closed-loop Leasehold claim-and-complete cycles on `queue` for one phase.
async fn leasehold_cycles(
    bench: &Bench,
    options: &BenchOptions,
    queue: &str,
) -> (Samples, Duration) {
    let http = bench.http.clone();
    let base = bench.tasks.base_url();
    let phase = options.phase;
    run_clients(options.claim_clients, |k| {
        let http = http.clone();
        let base = base.clone();
        let queue = queue.to_owned();
        async move {
            let mut samples = Samples::default();
            let deadline = Instant::now() + phase;
            let processor = format!("bench-claimer-{k}");
            while Instant::now() < deadline {
                let started = Instant::now();
                match leasehold_cycle(&http, &base, &processor, &queue).await {
                    Ok(_) => samples.latencies.push(started.elapsed()),
                    Err(_) => samples.errors += 1,
                }
            }
            samples
        }
    })
    .await
}

async fn sample_comparison(bench: &Bench, options: &BenchOptions, report: &mut Report) {
    let section = "claim and complete: the sample's algorithm against Leasehold's";
    let mut half_load_rate = 0.0;
    for &pending in &options.backlog_sizes {
        let queue = format!("backlog-{pending}");
        fill_backlogs(bench, &queue, pending).await;

        let leases = bench.lease_client();
        let task_db = bench.task_db.clone();
        let phase = options.phase.max(Duration::from_secs(1));
        let (samples, elapsed) = run_clients(options.claim_clients, |k| {
            let leases = leases.clone();
            let task_db = task_db.clone();
            async move {
                let mut conn = connect(&task_db).await;
                let mut samples = Samples::default();
                let deadline = Instant::now() + phase;
                let processor = format!("sample-claimer-{k}");
                while Instant::now() < deadline {
                    let started = Instant::now();
                    match sample_cycle(&mut conn, &leases, &processor).await {
                        Ok(()) => samples.latencies.push(started.elapsed()),
                        Err(_) => samples.errors += 1,
                    }
                }
                samples
            }
        })
        .await;
        let sample = samples.figure(
            section,
            "the sample's claim (OFFSET scan, FOR UPDATE, lease call under the lock)",
            options.claim_clients,
            Some(pending),
            elapsed,
        );
        let (samples, elapsed) = leasehold_cycles(bench, options, &queue).await;
        let ours = samples.figure(
            section,
            "Leasehold's claim (SKIP LOCKED, fenced lease) over HTTP",
            options.claim_clients,
            Some(pending),
            elapsed,
        );
        report.ratio(
            format!("Leasehold / sample claim-and-complete, {pending} pending"),
            ours.per_second,
            sample.per_second,
        );
        if half_load_rate == 0.0 {
            half_load_rate = ours.per_second / 2.0;
        }
        // The end-to-end rates (worker processes, the sample's own way of working) against the
        // sample's claim on this backlog, when the end-to-end section ran.
        for (what, workers) in [
            ("single claims", options.single_workers),
            (
                "batched claims",
                options.workers * options.batch_concurrency,
            ),
        ] {
            let name = format!("{what}: claim → complete (claim-to-complete latency)");
            let end_to_end = report
                .find(
                    "tasks end to end (worker processes, no-op work)",
                    &name,
                    workers,
                )
                .map(|figure| figure.per_second);
            if let Some(rate) = end_to_end {
                report.ratio(
                    format!("end to end, {what} / sample claim-and-complete, {pending} pending"),
                    rate,
                    sample.per_second,
                );
            }
        }
        report.figures.push(sample);
        report.figures.push(ours);
    }
    half_load(bench, options, half_load_rate, report).await;
}

/// Claims at a fixed rate of half the measured maximum (open loop): their latency when the
/// service is not saturated.
async fn half_load(bench: &Bench, options: &BenchOptions, rate: f64, report: &mut Report) {
    let queue = "half-load";
    let count = (rate * options.phase.as_secs_f64().max(1.0))
        .ceil()
        .max(10.0) as u64;
    execute(
        &bench.task_db,
        &format!(
            "INSERT INTO tasks (task_data, queue, max_attempts)
             SELECT '{{}}', '{queue}', 3 FROM generate_series(1, {})",
            count + 10
        ),
    )
    .await;
    let period = Duration::from_secs_f64(1.0 / rate.max(1.0));
    let started = Instant::now();
    let mut ticker = tokio::time::interval(period);
    let mut handles = Vec::new();
    for i in 0..count {
        ticker.tick().await;
        let http = bench.http.clone();
        let base = bench.tasks.base_url();
        handles.push(tokio::spawn(async move {
            leasehold_cycle(&http, &base, &format!("half-load-{i}"), queue).await
        }));
    }
    let mut samples = Samples::default();
    for handle in handles {
        match handle.await {
            Ok(Ok(latency)) => samples.latencies.push(latency),
            _ => samples.errors += 1,
        }
    }
    report.figures.push(samples.figure(
        "claim latency at half the maximum claim rate (open loop)",
        &format!("claim at {rate:.0}/s"),
        0,
        None,
        started.elapsed(),
    ));
}

// ---------------------------------------------------------------------------------------------
// Growth: the same figures with more and more finished rows present.

async fn growth(bench: &Bench, options: &BenchOptions, report: &mut Report) {
    let mut present = 0u64;
    let mut first: Option<(f64, f64)> = None;
    let clients = 32.min(*options.lease_concurrency.iter().max().unwrap_or(&32));
    for &size in &options.growth_sizes {
        let more = size.saturating_sub(present);
        execute(
            &bench.task_db,
            &format!(
                "INSERT INTO tasks (task_data, queue, status, max_attempts, attempts, processor,
                                    fence, started_at, processed_at, task_output)
                 SELECT '{{}}', 'finished', 'succeeded', 1, 1, 'old', g, now(), now(), '{{}}'
                 FROM generate_series(1, {more}) g"
            ),
        )
        .await;
        execute(
            &bench.lease_db,
            &format!(
                "INSERT INTO leases (resource, holder, fence, ttl_seconds, created_at, released_at,
                                     expires_at)
                 SELECT 'ended-{size}-' || g, 'old', nextval('leases_fence_seq'), 30, now(),
                        now(), now()
                 FROM generate_series(1, {more}) g"
            ),
        )
        .await;
        execute(&bench.task_db, "VACUUM ANALYZE tasks").await;
        execute(&bench.lease_db, "VACUUM ANALYZE leases").await;
        // Write the bulk insert's dirty pages out now, or the checkpoint that follows it runs
        // during the measurement and the figure measures it instead of the table's size.
        execute(&bench.lease_db, "CHECKPOINT").await;
        present = size;

        let before = report.figures.len();
        let rates = lease_http(bench, options, clients, true, report).await;
        for figure in &mut report.figures[before..] {
            figure.rows = Some(size);
        }
        let queue = format!("growth-{size}");
        let backlog = (options.e2e_tasks / 2).max(100);
        execute(
            &bench.task_db,
            &format!(
                "INSERT INTO tasks (task_data, queue, max_attempts)
                 SELECT '{{}}', '{queue}', 3 FROM generate_series(1, {backlog})"
            ),
        )
        .await;
        let (samples, elapsed) = leasehold_cycles(bench, options, &queue).await;
        let claim = samples.figure(
            "growth: claim and complete over HTTP",
            "claim and complete",
            options.claim_clients,
            Some(size),
            elapsed,
        );
        let claim_rate = claim.per_second;
        report.figures.push(claim);
        match first {
            None => first = Some((rates[0], claim_rate)),
            Some((acquire0, claim0)) => {
                report.ratio(
                    format!("lease acquire with {size} rows / with the fewest"),
                    rates[0],
                    acquire0,
                );
                report.ratio(
                    format!("claim and complete with {size} rows / with the fewest"),
                    claim_rate,
                    claim0,
                );
            }
        }
    }
}

/// A hint of what limits what, printed under the tables.
pub const LIMITS: &str = "\
Every write is a durable commit (fsync of the WAL), shared by concurrent commits through
PostgreSQL's group commit; both cores serve PostgreSQL, the services and the load generator at
once. A claim is task-service's transaction with one lease-service call inside it (a batch
acquire: one statement, one commit); a completion likewise with a batch release. Claims and
single completions that arrive together are served as one group, and so are single lease
acquires, renewals and releases in lease-service (GROUPS_IN_FLIGHT of each service); the
direct-SQL clients run one statement and one commit per operation.
Memory under open reads is bounded by task-service itself, not by the machine: a listing page
ends at 4 MiB of task JSON, counted in PostgreSQL before any row is loaded, and a replica serves
4 listings at once (the rest wait), so the peak is about 4 pages of rows plus their JSON,
whatever the number of readers or the size of the tasks.";
