//! `cargo run -p leasehold-local`: runs the Leasehold stack on this machine.

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use leasehold_local::stack::{
    self, DEFAULT_GENERATOR_METRICS_PORT, DEFAULT_GENERATORS, DEFAULT_LEASE_SERVICE_PORT,
    DEFAULT_PG_PORT, DEFAULT_TASK_SERVICE_PORT, DEFAULT_WORKER_CONCURRENCY,
    DEFAULT_WORKER_METRICS_PORT, DEFAULT_WORKERS, StackConfig,
};
use tracing_subscriber::EnvFilter;

/// Run the Leasehold stack locally.
///
/// Builds the service binaries and the `leasehold` CLI (`cargo build --bins`,
/// same profile as this binary), starts a private PostgreSQL on 127.0.0.1
/// (data kept in `$LEASEHOLD_HOME/pg/data`) unless DATABASE_URL is set,
/// creates the databases leasehold_leases and leasehold_tasks, runs each
/// service's migrations, and starts the services one by one, each once the
/// one before is ready (`GET /readyz`, or `/healthz` for workers and
/// generators, answers 200). Their output appears here. Once all are ready it
/// prints a banner starting "Leasehold is running:" with every address, the
/// dashboard's among them.
///
/// Ctrl-C (or SIGTERM) stops everything in dependency order: generators and
/// workers first (a worker's tasks get 5 s to finish, the rest are handed
/// back), then task-service, then lease-service, each stage waited for
/// (SIGKILL after 15 s), then PostgreSQL. A second Ctrl-C kills what is left.
///
/// Exit status: 0 after Ctrl-C/SIGTERM, 1 if anything fails or a service
/// dies.
#[derive(Debug, Parser)]
#[command(name = "leasehold-local", version, verbatim_doc_comment)]
struct Cli {
    /// Use this PostgreSQL database for every service and start no private
    /// PostgreSQL (e.g. postgres://user:pass@host:5432/leasehold).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,

    /// Run on a pg_auto_failover formation instead of one server: a monitor, a primary and a
    /// synchronous secondary on free local ports (pg_autoctl is installed with apt when missing
    /// and running as root). Its data is thrown away on exit. Try a failover with the command
    /// the banner prints.
    #[arg(long, env = "LEASEHOLD_HA", conflicts_with = "database_url")]
    ha: bool,

    /// Directory for local state: the private PostgreSQL's data
    /// (`pg/data`) and log (`pg/postgres.log`).
    #[arg(long, env = "LEASEHOLD_HOME", value_name = "DIR", default_value_os_t = StackConfig::new().home)]
    home: PathBuf,

    /// Port of the private PostgreSQL on 127.0.0.1.
    #[arg(long, env = "LEASEHOLD_PG_PORT", default_value_t = DEFAULT_PG_PORT)]
    pg_port: u16,

    /// Port of the lease-service on 127.0.0.1.
    #[arg(long, env = "LEASE_SERVICE_PORT", default_value_t = DEFAULT_LEASE_SERVICE_PORT)]
    lease_service_port: u16,

    /// Port of the task-service on 127.0.0.1.
    #[arg(long, env = "TASK_SERVICE_PORT", default_value_t = DEFAULT_TASK_SERVICE_PORT)]
    task_service_port: u16,

    /// Worker processes to run (0: none).
    #[arg(long, env = "LEASEHOLD_WORKERS", default_value_t = DEFAULT_WORKERS)]
    workers: u16,

    /// Tasks in flight per worker process.
    #[arg(long, env = "LEASEHOLD_WORKER_CONCURRENCY", default_value_t = DEFAULT_WORKER_CONCURRENCY)]
    worker_concurrency: u16,

    /// Metrics port of the first worker on 127.0.0.1 (worker i uses PORT+i).
    #[arg(long, env = "WORKER_METRICS_PORT", default_value_t = DEFAULT_WORKER_METRICS_PORT)]
    worker_metrics_port: u16,

    /// Task-generator replicas to run (0: none).
    #[arg(long, env = "LEASEHOLD_GENERATORS", default_value_t = DEFAULT_GENERATORS)]
    generators: u16,

    /// Metrics port of the first generator replica on 127.0.0.1 (replica i uses PORT+i).
    #[arg(long, env = "GENERATOR_METRICS_PORT", default_value_t = DEFAULT_GENERATOR_METRICS_PORT)]
    generator_metrics_port: u16,

    /// Do not run `cargo build` first; use the binaries already built.
    #[arg(long, env = "LEASEHOLD_NO_BUILD")]
    no_build: bool,

    /// Directory holding the service binaries.
    /// [default: the directory of this executable]
    #[arg(long, env = "LEASEHOLD_BIN_DIR", value_name = "DIR")]
    bin_dir: Option<PathBuf>,
}

impl Cli {
    fn into_config(self) -> StackConfig {
        let defaults = StackConfig::new();
        StackConfig {
            database_url: self.database_url.filter(|url| !url.trim().is_empty()),
            ha: self.ha,
            home: self.home,
            pg_port: self.pg_port,
            lease_service_port: self.lease_service_port,
            task_service_port: self.task_service_port,
            workers: self.workers,
            worker_concurrency: self.worker_concurrency,
            worker_metrics_port: self.worker_metrics_port,
            generators: self.generators,
            generator_metrics_port: self.generator_metrics_port,
            build: !self.no_build,
            bin_dir: self.bin_dir,
            workspace_root: defaults.workspace_root,
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        // Colours only for a person at a terminal, never in files.
        .with_ansi(std::io::stdout().is_terminal())
        .init();
    stack::run(cli.into_config()).await
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory as _;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    /// A port that numbers its kind's copies ("worker i uses PORT+i") belongs to a kind whose
    /// count a flag sets: the help once promised replicas of lease-service that no flag made.
    #[test]
    fn every_numbered_port_is_of_a_kind_with_a_count() {
        let command = Cli::command();
        let ids: Vec<&str> = command
            .get_arguments()
            .map(|arg| arg.get_id().as_str())
            .collect();
        let mut numbered = 0;
        for arg in command.get_arguments() {
            let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
            if !help.contains("PORT+i") {
                continue;
            }
            numbered += 1;
            let id = arg.get_id().as_str();
            let kind = id.strip_suffix("_metrics_port").unwrap_or(id);
            assert!(
                ids.contains(&format!("{kind}s").as_str()),
                "--{id} numbers copies of {kind}, but no flag sets how many: {help}"
            );
        }
        assert_eq!(
            numbered, 2,
            "the workers' and the generators' metrics ports"
        );
    }
}
