//! The `leasehold-local` runner: builds the service binaries and the CLI,
//! starts a private PostgreSQL (unless `DATABASE_URL` points at one), runs
//! each service's migrations, starts the services one after the other, each
//! once the one before is ready, prints the ready banner once all are, and
//! stops everything on Ctrl-C/`SIGTERM` or when a service dies: clients
//! first, then the services they use, PostgreSQL last.
//!
//! The services are described by a small table, [`services`]; adding a
//! service (task-service, workers, generators) means adding an entry there.
//!
//! This file keeps only the orchestration (the order of start, wait and stop); the table and
//! configuration, the children, the banner and the build each live in a module of their own.

mod banner;
mod build;
mod children;
mod config;

use std::io;
use std::path::PathBuf;
use std::process::{Child, ExitCode};
use std::time::Duration;

use anyhow::{Context as _, ensure};
use tokio::signal::unix::{SignalKind, signal};

use crate::postgres::formation::Formation;
use crate::postgres::{PrivatePostgres, redact_url};

use self::build::{build, migrate};
pub use self::build::{build_args, build_packages};
pub use self::children::http_get_status;
pub use self::config::{Databases, Listen, ServiceSpec, StackConfig, services, workspace_root};

/// Default port of the private PostgreSQL (`LEASEHOLD_PG_PORT`).
pub const DEFAULT_PG_PORT: u16 = 54329;
/// Default port of the (first) lease-service (`LEASE_SERVICE_PORT`).
pub const DEFAULT_LEASE_SERVICE_PORT: u16 = 8081;
/// Default port of the (first) task-service (`TASK_SERVICE_PORT`).
pub const DEFAULT_TASK_SERVICE_PORT: u16 = 8082;
/// Default metrics port of the first worker (`WORKER_METRICS_PORT`); worker i uses PORT+i.
pub const DEFAULT_WORKER_METRICS_PORT: u16 = 9101;
/// Default metrics port of the first generator replica (`GENERATOR_METRICS_PORT`).
pub const DEFAULT_GENERATOR_METRICS_PORT: u16 = 9201;
/// Default number of task-generator replicas (`LEASEHOLD_GENERATORS`).
pub const DEFAULT_GENERATORS: u16 = 2;
/// Default number of worker processes (`LEASEHOLD_WORKERS`).
pub const DEFAULT_WORKERS: u16 = 2;
/// Default tasks in flight per worker process (`LEASEHOLD_WORKER_CONCURRENCY`). The default
/// workers keep up with the generator's defaults even when every task sleeps the longest: at
/// 2 × 2 slots, a started generator built a backlog that never ended, which looked like a
/// fault to anyone trying the stack.
pub const DEFAULT_WORKER_CONCURRENCY: u16 = 8;
/// What a started generator makes until told otherwise: task-service's defaults (its
/// `generator_settings` migration), restated here for the banner and for sizing the workers
/// above; `tests/tests/suite/local_stack.rs` checks them against a fresh task-service.
pub const GENERATOR_DEFAULT_RATE_PER_SECOND: f64 = 1.0;
/// The shortest and longest sleep of a generated task, by default.
pub const GENERATOR_DEFAULT_SLEEP_SECONDS: (f64, f64) = (1.0, 10.0);
/// Database of the lease-service.
pub const LEASES_DATABASE: &str = "leasehold_leases";
/// Database of the task-service.
pub const TASKS_DATABASE: &str = "leasehold_tasks";
/// Databases created on the private PostgreSQL.
pub const DATABASES: [&str; 2] = [LEASES_DATABASE, TASKS_DATABASE];

/// How long each service gets to answer its health check.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(30);
/// How long children get to exit after `SIGTERM` before `SIGKILL`: more than a worker's
/// [`WORKER_SHUTDOWN_GRACE_SECONDS`] plus the time it takes to hand its tasks back.
const STOP_GRACE: Duration = Duration::from_secs(15);
/// How long a worker's tasks get to finish after Ctrl-C; the rest are handed back (no attempt
/// charged) and run on the next start.
pub const WORKER_SHUTDOWN_GRACE_SECONDS: u16 = 5;
/// The operators' command line, built with the services because the README uses it.
pub const CLI_PACKAGE: &str = "leasehold-cli";
/// Its binary.
pub const CLI_BINARY: &str = "leasehold";
/// The first line of the banner printed once every service is ready.
pub const READY_BANNER: &str = "Leasehold is running:";
/// How often to look for children that exited.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Runs the stack until Ctrl-C/`SIGTERM` (exit code 0) or until something
/// fails or a service dies (exit code 1). Everything started is stopped
/// before returning.
pub async fn run(config: StackConfig) -> ExitCode {
    let mut signals = match Signals::new() {
        Ok(signals) => signals,
        Err(error) => {
            tracing::error!(%error, "could not install signal handlers");
            return ExitCode::FAILURE;
        }
    };
    let mut stack = Stack::default();
    let started = tokio::select! {
        biased;
        name = signals.recv() => Err(Interrupted::Signal(name)),
        result = stack.start(&config) => result.map_err(Interrupted::Failed),
    };
    let exit = match started {
        Ok(()) => {
            stack.print_summary(&config);
            tokio::select! {
                biased;
                name = signals.recv() => {
                    tracing::info!("received {name}; stopping");
                    ExitCode::SUCCESS
                }
                (label, how) = stack.wait_for_exit() => {
                    tracing::error!("{label} stopped unexpectedly ({how}); stopping everything");
                    ExitCode::FAILURE
                }
            }
        }
        Err(Interrupted::Signal(name)) => {
            tracing::info!("received {name} during startup; stopping");
            ExitCode::SUCCESS
        }
        Err(Interrupted::Failed(error)) => {
            tracing::error!("{error:#}");
            ExitCode::FAILURE
        }
    };
    let stopping = std::time::Instant::now();
    stack.shutdown(&mut signals).await;
    // The last line a person sees: without it, a log ending at "stopping PostgreSQL" reads as a
    // hang.
    tracing::info!(
        took_ms = u64::try_from(stopping.elapsed().as_millis()).unwrap_or(u64::MAX),
        "stopped; nothing of the stack is left running"
    );
    exit
}

enum Interrupted {
    Signal(&'static str),
    Failed(anyhow::Error),
}

/// `SIGINT` and `SIGTERM`.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> io::Result<Self> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
        }
    }
}

#[derive(Debug)]
struct RunningChild {
    label: String,
    child: Child,
    stop_stage: u8,
}

#[derive(Debug)]
struct Endpoint {
    label: String,
    url: String,
}

#[derive(Debug, Default)]
struct Stack {
    postgres: Option<PrivatePostgres>,
    formation: Option<Formation>,
    children: Vec<RunningChild>,
    endpoints: Vec<Endpoint>,
    bin_dir: PathBuf,
}

impl Stack {
    async fn start(&mut self, config: &StackConfig) -> anyhow::Result<()> {
        // Every port first, before a build or a database: a taken one fails the run at once.
        children::refuse_taken_ports(&services(config, &config.databases()))?;
        let databases = if config.ha {
            self.start_formation().await?
        } else {
            config.databases()
        };
        let services = services(config, &databases);
        if config.build {
            build(config, &services).await?;
        }
        let bin_dir = match &config.bin_dir {
            Some(dir) => dir.clone(),
            None => std::env::current_exe()
                .context("could not find this executable")?
                .parent()
                .context("this executable has no parent directory")?
                .to_path_buf(),
        };
        self.bin_dir.clone_from(&bin_dir);

        match &config.database_url {
            Some(url) => {
                tracing::info!(url = %redact_url(url), "using DATABASE_URL for every service (schemas leasehold_leases and leasehold_tasks); not starting PostgreSQL");
                for schema in DATABASES {
                    crate::postgres::create_schema(url, schema)
                        .await
                        .with_context(|| format!("could not create the schema {schema}"))?;
                }
            }
            None if config.ha => {}
            None => self.start_postgres(config).await?,
        }

        for service in &services {
            let binary = bin_dir.join(service.binary);
            ensure!(
                binary.is_file(),
                "{} not found; build the stack with `cargo {}` (or drop --no-build), \
                 or point LEASEHOLD_BIN_DIR at the directory holding it",
                binary.display(),
                build_args(&services).join(" ")
            );
            if let Some(args) = &service.migrate_args {
                migrate(service, &binary, args).await?;
            }
            for replica in 0..service.replicas {
                self.start_replica(service, &binary, replica).await?;
            }
        }
        Ok(())
    }

    /// Starts the formation `--ha` asks for, with both databases; their URLs name every node.
    async fn start_formation(&mut self) -> anyhow::Result<Databases> {
        tracing::info!("starting a pg_auto_failover formation: monitor, primary, secondary");
        let formation = Formation::start(DATABASES[0])
            .await
            .context("could not start the pg_auto_failover formation")?;
        for database in &DATABASES[1..] {
            formation
                .create_database(database)
                .await
                .with_context(|| format!("could not create the database {database}"))?;
        }
        let formation = self.formation.insert(formation);
        Ok(Databases {
            leases: formation.url(LEASES_DATABASE),
            tasks: formation.url(TASKS_DATABASE),
        })
    }

    async fn start_postgres(&mut self, config: &StackConfig) -> anyhow::Result<()> {
        let data_dir = config.pg_data_dir();
        let port = config.pg_port;
        tracing::info!(port, data_dir = %data_dir.display(), "starting the private PostgreSQL");
        let started = {
            let data_dir = data_dir.clone();
            tokio::task::spawn_blocking(move || PrivatePostgres::start_persistent(&data_dir, port))
                .await
                .context("the PostgreSQL start-up task failed")?
        };
        let pg = started.with_context(|| {
            format!(
                "could not start the private PostgreSQL on 127.0.0.1:{port} with data in {} \
                 (if the port is taken, set LEASEHOLD_PG_PORT; to use another server, set DATABASE_URL)",
                data_dir.display()
            )
        })?;
        let pg = self.postgres.insert(pg);
        for database in DATABASES {
            pg.create_database(database)
                .await
                .with_context(|| format!("could not create the database {database}"))?;
        }
        Ok(())
    }
}
