//! What the stack runs: the configuration, each service's database URL and the service
//! table. Kept apart from the code that acts on it so that adding a service (or reading which
//! ports and databases the stack uses) means reading one pure, unit-tested file with no
//! processes or signals in it.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use crate::postgres::SUPERUSER;

use super::{
    DEFAULT_GENERATOR_METRICS_PORT, DEFAULT_GENERATORS, DEFAULT_LEASE_SERVICE_PORT,
    DEFAULT_PG_PORT, DEFAULT_TASK_SERVICE_PORT, DEFAULT_WORKER_CONCURRENCY,
    DEFAULT_WORKER_METRICS_PORT, DEFAULT_WORKERS, LEASES_DATABASE, TASKS_DATABASE,
    WORKER_SHUTDOWN_GRACE_SECONDS,
};

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
    /// Start a throw-away pg_auto_failover formation (monitor, primary, synchronous secondary)
    /// instead of the private server.
    pub ha: bool,
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
            ha: false,
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
    /// The `leasehold-local` flag that sets `base_port`, for a refusal to name when the port is
    /// taken.
    pub flag: &'static str,
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
                flag: "--lease-service-port",
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
                flag: "--task-service-port",
            }),
            stop_stage: 1,
        },
        ServiceSpec {
            binary: "worker",
            package: "leasehold-worker",
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
                flag: "--worker-metrics-port",
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
                flag: "--generator-metrics-port",
            }),
            stop_stage: 0,
        },
    ]
}

/// `url` with its connections' `search_path` set to `schema` (a libpq `options` parameter,
/// which tokio-postgres honours too).
pub(super) fn with_search_path(url: &str, schema: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}options=-csearch_path%3D{schema}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stack::{GENERATOR_DEFAULT_RATE_PER_SECOND, GENERATOR_DEFAULT_SLEEP_SECONDS};

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

    /// Little's law at the worst: every generated task sleeping the longest still finds a free
    /// slot, so the default stack never builds a backlog that only grows.
    #[test]
    fn the_default_workers_keep_up_with_the_default_generator() {
        let config = StackConfig::new();
        let slots = f64::from(config.workers) * f64::from(config.worker_concurrency);
        let busy = GENERATOR_DEFAULT_RATE_PER_SECOND * GENERATOR_DEFAULT_SLEEP_SECONDS.1;
        assert!(
            slots >= busy,
            "{slots} slots for {busy} tasks in flight at the generator's defaults"
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
}
