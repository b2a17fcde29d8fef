//! The `leasehold-local` runner: builds the service binaries and the CLI,
//! starts a private PostgreSQL (unless `DATABASE_URL` points at one), runs
//! each service's migrations, starts the services one after the other, each
//! once the one before is ready, prints the ready banner once all are, and
//! stops everything on Ctrl-C/`SIGTERM` or when a service dies: clients
//! first, then the services they use, PostgreSQL last.
//!
//! The services are described by a small table, [`services`]; adding a
//! service (task-service, workers, generators) means adding an entry there.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use nix::sys::signal::Signal;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::signal::unix::{SignalKind, signal};

use crate::postgres::{PrivatePostgres, SUPERUSER, redact_url};
use crate::process::{send_signal, spawn_group_tied_to_process, spawn_tied_to_process};

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
/// Default tasks in flight per worker process (`LEASEHOLD_WORKER_CONCURRENCY`).
pub const DEFAULT_WORKER_CONCURRENCY: u16 = 2;
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

/// The workspace this binary was built from (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .and_then(Path::parent)
        .unwrap_or(manifest_dir)
        .to_path_buf()
}

/// Everything the runner needs to know; built from the command line and
/// environment by the binary.
#[derive(Debug, Clone)]
pub struct StackConfig {
    /// Use this database for every service; start no private PostgreSQL.
    pub database_url: Option<String>,
    /// State directory; the private PostgreSQL lives in `<home>/pg/data`.
    pub home: PathBuf,
    /// Port of the private PostgreSQL.
    pub pg_port: u16,
    /// Port of the first lease-service replica.
    pub lease_service_port: u16,
    /// Port of the first task-service replica.
    pub task_service_port: u16,
    /// Worker processes to run.
    pub workers: u16,
    /// Tasks in flight per worker process.
    pub worker_concurrency: u16,
    /// Metrics port of the first worker.
    pub worker_metrics_port: u16,
    /// Task-generator replicas to run.
    pub generators: u16,
    /// Metrics port of the first generator replica.
    pub generator_metrics_port: u16,
    /// Run `cargo build` for the services first.
    pub build: bool,
    /// Where the service binaries are; `None` = next to this executable.
    pub bin_dir: Option<PathBuf>,
    /// Where to run `cargo build`.
    pub workspace_root: PathBuf,
}

impl StackConfig {
    /// Defaults: no `DATABASE_URL`, state in `<workspace>/.leasehold`,
    /// default ports, build first, binaries next to this executable.
    pub fn new() -> Self {
        let workspace_root = workspace_root();
        Self {
            database_url: None,
            home: workspace_root.join(".leasehold"),
            pg_port: DEFAULT_PG_PORT,
            lease_service_port: DEFAULT_LEASE_SERVICE_PORT,
            task_service_port: DEFAULT_TASK_SERVICE_PORT,
            workers: DEFAULT_WORKERS,
            worker_concurrency: DEFAULT_WORKER_CONCURRENCY,
            worker_metrics_port: DEFAULT_WORKER_METRICS_PORT,
            generators: DEFAULT_GENERATORS,
            generator_metrics_port: DEFAULT_GENERATOR_METRICS_PORT,
            build: true,
            bin_dir: None,
            workspace_root,
        }
    }

    /// The private PostgreSQL's data directory.
    pub fn pg_data_dir(&self) -> PathBuf {
        self.home.join("pg").join("data")
    }

    /// Database URLs the services get.
    ///
    /// With `DATABASE_URL`, both services share that one database, each in a schema of its
    /// own (named like the private databases), chosen by the connection's `search_path`: their
    /// tables never meet, and neither do their migration histories (diesel keeps one
    /// `__diesel_schema_migrations` per schema, and the two services' version numbers overlap).
    pub fn databases(&self) -> Databases {
        match &self.database_url {
            Some(url) => Databases {
                leases: with_search_path(url, LEASES_DATABASE),
                tasks: with_search_path(url, TASKS_DATABASE),
            },
            None => {
                let url = |database: &str| {
                    format!(
                        "postgres://{SUPERUSER}@127.0.0.1:{}/{database}",
                        self.pg_port
                    )
                };
                Databases {
                    leases: url(LEASES_DATABASE),
                    tasks: url(TASKS_DATABASE),
                }
            }
        }
    }
}

impl Default for StackConfig {
    fn default() -> Self {
        Self::new()
    }
}

/// The database URL of each service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Databases {
    /// lease-service's database.
    pub leases: String,
    /// task-service's database.
    pub tasks: String,
}

/// One row of the service table.
#[derive(Debug, Clone)]
pub struct ServiceSpec {
    /// Name of the binary (in the bin dir).
    pub binary: &'static str,
    /// Cargo package that builds it.
    pub package: &'static str,
    /// Arguments to run the service.
    pub args: Vec<String>,
    /// Arguments of a one-off run before starting the service (with the
    /// same environment), e.g. `["migrate"]`; it must succeed.
    pub migrate_args: Option<Vec<String>>,
    /// Environment of every replica (and of the migration run).
    pub env: Vec<(&'static str, String)>,
    /// How many copies to run.
    pub replicas: u16,
    /// How replicas listen, if they do.
    pub listen: Option<Listen>,
    /// Shutdown stage. Stage 0 stops first; a stage gets `SIGTERM` only once every process of
    /// the stages before has exited, so clients finish or hand back their work and release
    /// their leases while the services they use still answer.
    pub stop_stage: u8,
}

/// How a service's replicas listen: replica `i` gets
/// `env_var=127.0.0.1:(base_port + i)` and must answer `GET health_path`
/// with 200 once it is ready to be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listen {
    /// Environment variable carrying the listen address.
    pub env_var: &'static str,
    /// Port of replica 0.
    pub base_port: u16,
    /// Readiness-check path.
    pub health_path: &'static str,
}

impl Listen {
    /// The address replica `replica` (from 0) listens on.
    pub fn address(&self, replica: u16) -> Option<SocketAddr> {
        let port = self.base_port.checked_add(replica)?;
        Some(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
    }
}

/// The services to run, in start order.
pub fn services(config: &StackConfig, databases: &Databases) -> Vec<ServiceSpec> {
    let lease_service_url = format!("http://127.0.0.1:{}", config.lease_service_port);
    let task_service_url = format!("http://127.0.0.1:{}", config.task_service_port);
    vec![
        ServiceSpec {
            binary: "lease-service",
            package: "lease-service",
            args: vec!["serve".to_owned()],
            migrate_args: Some(vec!["migrate".to_owned()]),
            env: vec![("DATABASE_URL", databases.leases.clone())],
            replicas: 1,
            listen: Some(Listen {
                env_var: "LISTEN_ADDR",
                base_port: config.lease_service_port,
                // Ready means its database answers, not only that it listens.
                health_path: "/readyz",
            }),
            stop_stage: 2,
        },
        ServiceSpec {
            binary: "task-service",
            package: "task-service",
            args: vec!["serve".to_owned()],
            migrate_args: Some(vec!["migrate".to_owned()]),
            env: vec![
                ("DATABASE_URL", databases.tasks.clone()),
                ("LEASE_SERVICE_URL", lease_service_url.clone()),
            ],
            replicas: 1,
            listen: Some(Listen {
                env_var: "LISTEN_ADDR",
                base_port: config.task_service_port,
                // Ready means its database and lease-service answer.
                health_path: "/readyz",
            }),
            stop_stage: 1,
        },
        ServiceSpec {
            binary: "worker",
            package: "worker",
            args: Vec::new(),
            migrate_args: None,
            env: vec![
                ("TASK_SERVICE_URL", task_service_url.clone()),
                ("WORKER_CONCURRENCY", config.worker_concurrency.to_string()),
                (
                    "SHUTDOWN_GRACE_SECONDS",
                    WORKER_SHUTDOWN_GRACE_SECONDS.to_string(),
                ),
            ],
            replicas: config.workers,
            listen: Some(Listen {
                env_var: "METRICS_ADDR",
                base_port: config.worker_metrics_port,
                health_path: "/healthz",
            }),
            stop_stage: 0,
        },
        ServiceSpec {
            binary: "task-generator",
            package: "task-generator",
            args: Vec::new(),
            migrate_args: None,
            env: vec![
                ("TASK_SERVICE_URL", task_service_url),
                ("LEASE_SERVICE_URL", lease_service_url.clone()),
            ],
            replicas: config.generators,
            listen: Some(Listen {
                env_var: "METRICS_ADDR",
                base_port: config.generator_metrics_port,
                health_path: "/healthz",
            }),
            stop_stage: 0,
        },
    ]
}

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
    stack.shutdown(&mut signals).await;
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
    children: Vec<RunningChild>,
    endpoints: Vec<Endpoint>,
    bin_dir: PathBuf,
}

impl Stack {
    async fn start(&mut self, config: &StackConfig) -> anyhow::Result<()> {
        let databases = config.databases();
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
            None => self.start_postgres(config).await?,
        }

        for service in &services {
            let binary = bin_dir.join(service.binary);
            ensure!(
                binary.is_file(),
                "{} not found; build it with `cargo build --bins -p {}` (or drop --no-build), \
                 or point LEASEHOLD_BIN_DIR at the directory holding it",
                binary.display(),
                service.package
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

    async fn start_replica(
        &mut self,
        service: &ServiceSpec,
        binary: &Path,
        replica: u16,
    ) -> anyhow::Result<()> {
        let label = if service.replicas > 1 {
            format!("{}#{}", service.binary, replica + 1)
        } else {
            service.binary.to_owned()
        };
        let mut command = Command::new(binary);
        command
            .args(&service.args)
            .envs(service.env.iter().map(|(name, value)| (name, value)))
            .stdin(Stdio::null())
            // Own process group: Ctrl-C reaches only the runner, which then
            // stops the children in order.
            .process_group(0);
        let address = match &service.listen {
            Some(listen) => {
                let address = listen.address(replica).with_context(|| {
                    format!(
                        "{label}: port {} + {replica} is out of range",
                        listen.base_port
                    )
                })?;
                command.env(listen.env_var, address.to_string());
                Some((address, listen.health_path))
            }
            None => None,
        };
        tracing::info!("starting {label}");
        // SIGTERM reaches the child even if the runner itself is killed.
        let child = spawn_tied_to_process(command, Signal::SIGTERM)
            .with_context(|| format!("could not start {}", binary.display()))?;
        let index = self.children.len();
        self.children.push(RunningChild {
            label: label.clone(),
            child,
            stop_stage: service.stop_stage,
        });
        if let Some((address, path)) = address {
            self.wait_healthy(index, address, path).await?;
            self.endpoints.push(Endpoint {
                label,
                url: format!("http://{address}"),
            });
        }
        Ok(())
    }

    async fn wait_healthy(
        &mut self,
        index: usize,
        address: SocketAddr,
        path: &str,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + HEALTH_TIMEOUT;
        let mut last_error;
        loop {
            let running = &mut self.children[index];
            if let Some(status) = running.child.try_wait()? {
                bail!(
                    "{} exited ({status}) before answering GET http://{address}{path}; see its output above",
                    running.label
                );
            }
            match tokio::time::timeout(Duration::from_secs(2), http_get_status(address, path)).await
            {
                Ok(Ok(200)) => {
                    tracing::info!("{} is ready on http://{address}", running.label);
                    return Ok(());
                }
                Ok(Ok(code)) => last_error = format!("HTTP status {code}"),
                Ok(Err(error)) => last_error = error.to_string(),
                Err(_) => last_error = "no answer within 2 s".to_owned(),
            }
            if Instant::now() >= deadline {
                bail!(
                    "{} did not answer GET http://{address}{path} with 200 within {} s (last: {last_error})",
                    running.label,
                    HEALTH_TIMEOUT.as_secs()
                );
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Waits until a child exits or the private PostgreSQL stops.
    async fn wait_for_exit(&mut self) -> (String, String) {
        let mut tick = tokio::time::interval(POLL_INTERVAL);
        loop {
            tick.tick().await;
            for running in &mut self.children {
                match running.child.try_wait() {
                    Ok(None) => {}
                    Ok(Some(status)) => return (running.label.clone(), status.to_string()),
                    Err(error) => {
                        return (
                            running.label.clone(),
                            format!("could not wait for it: {error}"),
                        );
                    }
                }
            }
            if let Some(pg) = &self.postgres
                && pg.pid().is_none()
            {
                return (
                    "PostgreSQL".to_owned(),
                    format!("see {}", pg.log_path().display()),
                );
            }
        }
    }

    #[allow(clippy::print_stdout)] // The point of this function.
    fn print_summary(&self, config: &StackConfig) {
        let mut text = format!("\n{READY_BANNER}\n");
        match (&self.postgres, &config.database_url) {
            (Some(pg), _) => {
                text.push_str(&format!(
                    "  {:<16} {}  (data {}, log {})\n",
                    "PostgreSQL",
                    pg.url(""),
                    pg.data_dir().display(),
                    pg.log_path().display()
                ));
                for database in DATABASES {
                    text.push_str(&format!("  {:<16} {}\n", "", pg.url(database)));
                }
            }
            (None, Some(url)) => {
                text.push_str(&format!(
                    "  {:<16} {}  (DATABASE_URL)\n",
                    "PostgreSQL",
                    redact_url(url)
                ));
            }
            (None, None) => {}
        }
        for endpoint in &self.endpoints {
            text.push_str(&format!("  {:<16} {}\n", endpoint.label, endpoint.url));
        }
        text.push_str(&format!(
            "  {:<16} http://127.0.0.1:{}/dashboard  (open it in a browser)\n",
            "dashboard", config.task_service_port
        ));
        // The CLI's defaults are the default ports; other ports need its URLs.
        let mut cli = String::new();
        if config.lease_service_port != DEFAULT_LEASE_SERVICE_PORT {
            cli.push_str(&format!(
                "LEASE_SERVICE_URL=http://127.0.0.1:{} ",
                config.lease_service_port
            ));
        }
        if config.task_service_port != DEFAULT_TASK_SERVICE_PORT {
            cli.push_str(&format!(
                "TASK_SERVICE_URL=http://127.0.0.1:{} ",
                config.task_service_port
            ));
        }
        text.push_str(&format!(
            "  {:<16} {cli}{} tasks list\n",
            "CLI",
            self.bin_dir.join(CLI_BINARY).display()
        ));
        for running in &self.children {
            if !self.endpoints.iter().any(|e| e.label == running.label) {
                text.push_str(&format!(
                    "  {:<16} (pid {})\n",
                    running.label,
                    running.child.id()
                ));
            }
        }
        text.push_str("Ctrl-C to stop.\n");
        println!("{text}");
    }

    /// Stops the children stage by stage (see [`ServiceSpec::stop_stage`]): `SIGTERM` to a
    /// stage's processes, `SIGKILL` to those still there after [`STOP_GRACE`] (or to every
    /// process left at once on a second Ctrl-C), then the next stage; then stops the private
    /// PostgreSQL.
    async fn shutdown(&mut self, signals: &mut Signals) {
        let mut stages: Vec<u8> = self.children.iter().map(|c| c.stop_stage).collect();
        stages.sort_unstable();
        stages.dedup();
        let mut hurry: Option<String> = None;
        for stage in stages {
            let (mut now, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.children)
                .into_iter()
                .partition(|running| running.stop_stage == stage);
            self.children = later;
            if let Some(reason) = &hurry {
                kill_all(&mut now, reason);
                continue;
            }
            hurry = stop_together(&mut now, signals).await;
        }
        if let Some(pg) = self.postgres.take() {
            tracing::info!("stopping PostgreSQL");
            match tokio::task::spawn_blocking(move || pg.stop()).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::error!("{error}"),
                Err(error) => tracing::error!(%error, "the PostgreSQL stop task failed"),
            }
        }
    }
}

/// `SIGTERM` to each of `children`, then waits until all have exited; `SIGKILL` to those still
/// there after [`STOP_GRACE`]. A second Ctrl-C kills them at once, and the returned reason
/// says so: the caller kills the rest without waiting.
async fn stop_together(children: &mut Vec<RunningChild>, signals: &mut Signals) -> Option<String> {
    for running in children.iter_mut() {
        if matches!(running.child.try_wait(), Ok(None)) {
            tracing::info!("stopping {} (pid {})", running.label, running.child.id());
            if let Err(error) = send_signal(running.child.id(), Signal::SIGTERM) {
                tracing::warn!(%error, "could not send SIGTERM to {}", running.label);
            }
        }
    }
    let deadline = tokio::time::Instant::now() + STOP_GRACE;
    loop {
        children.retain_mut(|running| matches!(running.child.try_wait(), Ok(None)));
        if children.is_empty() {
            return None;
        }
        tokio::select! {
            () = tokio::time::sleep(POLL_INTERVAL) => {
                if tokio::time::Instant::now() >= deadline {
                    kill_all(children, &format!("did not stop within {} s", STOP_GRACE.as_secs()));
                    return None;
                }
            }
            name = signals.recv() => {
                let reason = format!("still running after a second {name}");
                kill_all(children, &reason);
                return Some(reason);
            }
        }
    }
}

fn kill_all(children: &mut Vec<RunningChild>, reason: &str) {
    for running in children.iter_mut() {
        if matches!(running.child.try_wait(), Ok(None)) {
            tracing::warn!("{} {reason}; killing it", running.label);
            let _ = running.child.kill();
        }
        let _ = running.child.wait();
    }
    children.clear();
}

/// `$CARGO build --bins -p PKG...` in this binary's profile.
async fn build(config: &StackConfig, services: &[ServiceSpec]) -> anyhow::Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let mut args = vec!["build".to_owned(), "--bins".to_owned()];
    for package in build_packages(services) {
        args.push("-p".to_owned());
        args.push(package.to_owned());
    }
    if !cfg!(debug_assertions) {
        args.push("--release".to_owned());
    }
    let shown = format!("cargo {}", args.join(" "));
    tracing::info!("building the services and the CLI: {shown}");
    let mut command = Command::new(&cargo);
    command
        .args(&args)
        .current_dir(&config.workspace_root)
        .stdin(Stdio::null());
    let status = run_to_end(command).await.with_context(|| {
        format!(
            "could not run `{shown}` (cargo: {})",
            cargo.to_string_lossy()
        )
    })?;
    ensure!(
        status.success(),
        "`{shown}` failed ({status}) in {}; fix the errors above, or use --no-build to run the binaries already built",
        config.workspace_root.display()
    );
    Ok(())
}

/// The packages `leasehold-local` builds: every service's, and the CLI's.
pub fn build_packages(services: &[ServiceSpec]) -> BTreeSet<&'static str> {
    services
        .iter()
        .map(|service| service.package)
        .chain([CLI_PACKAGE])
        .collect()
}

/// Runs `binary MIGRATE_ARGS` once with the service's environment.
async fn migrate(service: &ServiceSpec, binary: &Path, args: &[String]) -> anyhow::Result<()> {
    let shown = format!("{} {}", service.binary, args.join(" "));
    tracing::info!("running `{shown}`");
    let mut command = Command::new(binary);
    command
        .args(args)
        .envs(service.env.iter().map(|(name, value)| (name, value)))
        .stdin(Stdio::null());
    let status = run_to_end(command)
        .await
        .with_context(|| format!("could not run {}", binary.display()))?;
    if !status.success() {
        let database = service
            .env
            .iter()
            .find(|(name, _)| *name == "DATABASE_URL")
            .map(|(_, url)| format!(" against {}", redact_url(url)))
            .unwrap_or_default();
        bail!("`{shown}` failed ({status}){database}; see its output above");
    }
    Ok(())
}

/// Runs `command` to its end, in a process group of its own that dies with this process, or as
/// soon as the returned future is dropped (Ctrl-C during the build): cargo passes no signal on
/// to rustc and build scripts, so killing cargo alone would leave them compiling.
async fn run_to_end(command: Command) -> io::Result<std::process::ExitStatus> {
    let mut group = spawn_group_tied_to_process(command, Signal::SIGKILL)?;
    loop {
        if let Some(status) = group.try_wait()? {
            return Ok(status);
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Sends `GET path` over HTTP/1.1 and returns the response's status code.
pub async fn http_get_status(address: SocketAddr, path: &str) -> io::Result<u16> {
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::with_capacity(256);
    let mut chunk = [0_u8; 256];
    while !response.windows(2).any(|pair| pair == b"\r\n") && response.len() < 4096 {
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            break;
        }
        response.extend_from_slice(&chunk[..read]);
    }
    let text = String::from_utf8_lossy(&response);
    let status_line = text.lines().next().unwrap_or_default();
    let mut parts = status_line.split_whitespace();
    match (parts.next(), parts.next().map(str::parse::<u16>)) {
        (Some(version), Some(Ok(code))) if version.starts_with("HTTP/") => Ok(code),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not an HTTP response: {status_line:?}"),
        )),
    }
}

/// `url` with its connections' `search_path` set to `schema` (a libpq `options` parameter,
/// which tokio-postgres honours too).
fn with_search_path(url: &str, schema: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}options=-csearch_path%3D{schema}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_database_urls() {
        let config = StackConfig::new();
        let databases = config.databases();
        assert_eq!(
            databases.leases,
            "postgres://postgres@127.0.0.1:54329/leasehold_leases"
        );
        assert_eq!(
            databases.tasks,
            "postgres://postgres@127.0.0.1:54329/leasehold_tasks"
        );
        assert!(config.pg_data_dir().ends_with(".leasehold/pg/data"));
    }

    #[test]
    fn database_url_is_used_for_everything_one_schema_per_service() {
        let config = StackConfig {
            database_url: Some("postgres://u:p@db/x".to_owned()),
            ..StackConfig::new()
        };
        let databases = config.databases();
        assert_eq!(
            databases.leases,
            "postgres://u:p@db/x?options=-csearch_path%3Dleasehold_leases"
        );
        assert_eq!(
            databases.tasks,
            "postgres://u:p@db/x?options=-csearch_path%3Dleasehold_tasks"
        );
        let config = StackConfig {
            database_url: Some("postgres://db/x?sslmode=disable".to_owned()),
            ..StackConfig::new()
        };
        assert_eq!(
            config.databases().tasks,
            "postgres://db/x?sslmode=disable&options=-csearch_path%3Dleasehold_tasks"
        );
    }

    #[test]
    fn service_table() {
        let config = StackConfig {
            lease_service_port: 9000,
            ..StackConfig::new()
        };
        let table = services(&config, &config.databases());
        let lease = table
            .iter()
            .find(|service| service.binary == "lease-service")
            .expect("lease-service in the table");
        assert_eq!(
            lease.migrate_args.as_deref(),
            Some(&["migrate".to_owned()][..])
        );
        let listen = lease.listen.expect("lease-service listens");
        assert_eq!(listen.env_var, "LISTEN_ADDR");
        assert_eq!(
            listen.address(0),
            Some("127.0.0.1:9000".parse().expect("address"))
        );
        assert_eq!(
            listen.address(1),
            Some("127.0.0.1:9001".parse().expect("address"))
        );
        assert!(
            lease
                .env
                .iter()
                .any(|(name, url)| *name == "DATABASE_URL" && url.ends_with("/leasehold_leases"))
        );
    }

    #[test]
    fn clients_stop_before_the_services_they_use_and_the_cli_is_built() {
        let config = StackConfig::new();
        let table = services(&config, &config.databases());
        let stage = |binary: &str| {
            table
                .iter()
                .find(|service| service.binary == binary)
                .map(|service| service.stop_stage)
                .expect("in the table")
        };
        assert!(stage("worker") < stage("task-service"));
        assert!(stage("task-generator") < stage("task-service"));
        assert!(stage("task-service") < stage("lease-service"));
        let packages = build_packages(&table);
        assert!(packages.contains(CLI_PACKAGE), "{packages:?}");
        for service in &table {
            assert!(packages.contains(service.package), "{packages:?}");
        }
    }

    #[tokio::test]
    async fn health_check_reads_the_status_code() -> io::Result<()> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let server = tokio::spawn(async move {
            for status in ["200 OK", "503 Service Unavailable"] {
                let (mut socket, _) = listener.accept().await?;
                let mut buffer = [0_u8; 1024];
                let _ = socket.read(&mut buffer).await?;
                socket
                    .write_all(format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n").as_bytes())
                    .await?;
            }
            io::Result::Ok(())
        });
        assert_eq!(http_get_status(address, "/healthz").await?, 200);
        assert_eq!(http_get_status(address, "/healthz").await?, 503);
        server.await.map_err(io::Error::other)??;
        Ok(())
    }
}
