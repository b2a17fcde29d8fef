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
//!   request for one task, the completion carrying the next claim) or batched claims (8 workers
//!   of 32 slots, each claim asking for the free slots at once, completions ready together sent
//!   together, each batched worker claiming ahead up to its slots under load (`WORKER_PREFETCH`;
//!   `--no-prefetch` turns it off); throughput and
//!   claim-to-complete latency from the database's own timestamps; then single tasks created
//!   at half the single-claim rate, each from its creation to its start (with how busy all
//!   cores were meanwhile, from `/proc/stat`). Each run is metered
//!   ([`cost`]): CPU per 1,000 tasks by process, WAL bytes, write transactions, commits and WAL
//!   fsyncs per task.
//! - **work in any language**: the same backlog drained by the same workers three ways: the
//!   in-process handler, a command per task (`WORKER_EXEC=/bin/true`) and an HTTP request per
//!   task to a no-op endpoint (`WORKER_PUSH_URL`); tasks/s, CPU per 1,000 tasks, and the ratios
//!   to the in-process handler.
//! - **wake-ups**: an idle worker's pickup and a waiting lease acquire's hand-over, one at a time.
//! - **peers**: graphile-worker 0.18 on the same PostgreSQL, the same number of tasks, batching
//!   off and on, metered the same way, and Leasehold's ratios to it.
//! - **sample's claim**: the sample's algorithm (`ORDER BY scheduled_at OFFSET n LIMIT 1 FOR
//!   UPDATE` on its unindexed table, the lease call made while the row is locked), against
//!   Leasehold's claim over HTTP, claim-and-complete cycles on the same backlog sizes.
//! - **contention**: clients racing for a few shared resources (1 is leader election), each
//!   acquiring one at random and releasing it at once when it wins: cycles and refusals per
//!   second, through HTTP and as direct SQL.
//! - **growth**: the lease and claim figures again with more and more finished tasks and ended
//!   leases present.
//! - **latency under half load**: claims at a fixed rate of half the measured maximum.
//! - **charts**: a day of history (a million events) folded into the per-minute rollup, then the
//!   dashboard's day and hour charts read through task-service, against the raw read they
//!   replaced.
//! - **reads**: the claim's latency with nobody reading, then while 60 clients read the heaviest
//!   routes over 30,000 queues, and the ratios.
//!
//! Layout: `options` says what to run; `measure` runs closed-loop clients and turns their
//! latencies into figures; `report` holds the figures, ratios and the markdown. One module per
//! section: `leases`, `contention`, `e2e`, `work`, `pickup`, `peers`, `sample` (with the half-load
//! latency), `growth`, `memory`, `charts` and `reads`; `cost` meters the end-to-end runs. This file starts the machine under test ([`Bench`]) and runs the sections.

mod charts;
mod contention;
mod cost;
mod e2e;
mod growth;
mod leases;
mod measure;
mod memory;
mod options;
mod peers;
mod pickup;
mod reads;
mod report;
mod sample;
mod wal;
mod work;

use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use leasehold::{LeaseClient, RetryPolicy, TaskClient};
use leasehold_local::postgres::PrivatePostgres;

use crate::Service;
use charts::charts;
use contention::contention;
use e2e::end_to_end;
use growth::growth;
use leases::leases;
use memory::memory;
use peers::peers;
use pickup::pickup;
use reads::reads;
use sample::sample_comparison;
use work::any_language;

pub use cost::Cost;
pub use options::BenchOptions;
pub use report::{Figure, MemoryFigure, Ratio, Report};

/// The machine under test: a durable private PostgreSQL and the two services.
pub struct Bench {
    postgres: PrivatePostgres,
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
            postgres,
            lease_db,
            task_db,
            leases,
            tasks,
            http: leasehold::keep_alive::client_builder()
                .pool_max_idle_per_host(256)
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap(),
        }
    }

    /// Starts the cost meter of a run: PostgreSQL and both services, from now.
    async fn meter(&self) -> cost::Meter {
        cost::Meter::start(
            &self.task_db,
            self.postgres.pid().unwrap_or(0),
            vec![
                ("task-service", self.tasks.pid_u32()),
                ("lease-service", self.leases.pid_u32()),
            ],
            leasehold_local::postgres::find_server_binaries()
                .ok()
                .and_then(|bindir| wal::WalLog::of(&bindir, self.postgres.data_dir())),
        )
        .await
    }

    fn lease_client(&self) -> LeaseClient {
        LeaseClient::from_parts(self.http.clone(), self.leases.base_url())
            .with_retry(RetryPolicy::none())
    }

    /// The typed task-service client the bench's producers use: one try per call, as the
    /// lease client, and the bench's generous timeout.
    fn task_client(&self) -> TaskClient {
        TaskClient::new([self.tasks.base_url()]).with_timeout(Duration::from_secs(60))
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
    if (wanted("e2e") || wanted("peers")) && !cost::statements_tracked(&bench.task_db).await {
        report.skipped.push(cost::STATEMENTS_SKIPPED.to_owned());
    }
    if wanted("e2e") {
        end_to_end(&bench, options, &mut report).await;
        pickup(&bench, options, &mut report).await;
    }
    if wanted("work") {
        any_language(&bench, options, &mut report).await;
    }
    if wanted("peers") {
        peers(&bench, options, &mut report).await;
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
    // The charts first: their day of history is then there for the heavy reads too.
    if wanted("charts") {
        charts(&bench, options, &mut report).await;
    }
    if wanted("reads") {
        reads(&bench, options, &mut report).await;
    }
    report
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

/// A hint of what limits what, printed under the tables.
pub const LIMITS: &str = "\
Every write is a durable commit (fsync of the WAL), shared by concurrent commits through
PostgreSQL's group commit; both cores serve PostgreSQL, the services and the load generator at
once. A claim is task-service's transaction with one lease-service call inside it (a batch
acquire: one statement, one commit); a completion likewise with a batch release. Claims and
single completions that arrive together are served as one group, and so are single lease
acquires, renewals and releases in lease-service (GROUPS_IN_FLIGHT of each service); the
direct-SQL clients run one statement and one commit per operation. A claim of a queue with a
concurrency limit adds two round trips inside its transaction (lock the queue's row, count its
running tasks) and waits for the claim before it to commit: claims of one limited queue run one
at a time.
Memory under open reads is bounded by task-service itself, not by the machine: a listing page
ends at 4 MiB of task JSON, counted in PostgreSQL before any row is loaded, and a replica serves
READS_IN_FLIGHT listings at once (the rest wait), so the peak is that many pages of rows plus
their JSON, whatever the number of readers or the size of the tasks.
Claims under heavy reads: every heavy read (listings, counts, queues, the dashboard's overview
and charts) waits for one of READS_IN_FLIGHT turns (by default half the cores: 1 here), so at
most that many of the pool's connections serve them and claims never wait for a connection;
what the readers still take from the claims is CPU: each heavy read keeps a core of PostgreSQL
busy and task-service serializes its megabytes, on the same two cores as the claims' round
trips (task-service, lease-service, PostgreSQL), so more turns only slow the claims.
The day chart reads at most 1,440 rows of the per-minute rollup and the few minutes of history
not folded yet: its cost no longer grows with the day's events; the raw read it replaced reads
every event of the day and, for each, the one before it.";
