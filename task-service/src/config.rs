//! Configuration: command-line flags, each also read from an environment variable.

use clap::Args;
use leasehold::server::auth::Auth;
use leasehold::server::startup::ServerArgs;

/// The longest retry delay accepted: 30 days.
const MAX_RETRY_SECONDS: f64 = 2_592_000.0;

#[derive(Debug, Clone, Args)]
pub struct ServeConfig {
    /// PostgreSQL URL of the tasks database.
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: String,

    #[command(flatten)]
    pub server: ServerArgs,

    /// Base URL of lease-service.
    #[arg(
        long,
        env = "LEASE_SERVICE_URL",
        default_value = "http://127.0.0.1:8081",
        value_parser = leasehold::service_url
    )]
    pub lease_service_url: String,

    /// Claim transactions of one queue (and completion transactions) in flight at once on this
    /// replica. Claims and single completions arriving while all are busy wait and then go
    /// together, in one transaction and one lease-service call; 1 makes the largest groups,
    /// which is fastest on few cores.
    #[arg(long, env = "GROUPS_IN_FLIGHT", default_value_t = 1,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub groups_in_flight: usize,

    /// Heavy reads (task listings, counts, the queues, the dashboard's overview and charts, the
    /// gauges of `/metrics`) served at once on this replica, each holding a database connection
    /// until its answer is sent; the others wait their turn (503 after 10 s). At most half of
    /// DATABASE_POOL_SIZE, so that however many readers come, the rest of the pool stays for
    /// claims, completions and the other writes. 0: half this host's cores, at least 1 (each
    /// heavy read keeps a core of PostgreSQL busy; more at once only slow the claims beside them).
    #[arg(long, env = "READS_IN_FLIGHT", default_value_t = 0)]
    pub reads_in_flight: usize,

    /// Length of the lease behind each claim; workers must heartbeat well within it.
    #[arg(long, env = "TASK_LEASE_TTL_SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub lease_ttl_seconds: u64,

    /// Bearer token sent to lease-service (a token with the `leaseholder` role there, when its
    /// `AUTH_TOKENS` is set). Unset: none is sent.
    #[arg(long, env = "LEASE_SERVICE_TOKEN", hide_env_values = true)]
    pub lease_service_token: Option<leasehold::api::Secret>,

    /// Bearer tokens for the write routes: comma-separated `role[+role...]:token` entries,
    /// tokens of 16 bytes or more. Roles: `producer` (create tasks), `worker` (claim,
    /// heartbeat, complete, fail), `operator` (cancel tasks, start and stop the generator).
    /// Unset: every route is open, and a warning says so at start.
    #[arg(long, env = "AUTH_TOKENS", hide_env_values = true, default_value = "", hide_default_value = true, value_parser = Auth::parse)]
    pub auth_tokens: Auth,

    /// Timeout of a lease-service call made while task rows are locked.
    #[arg(long, env = "LEASE_CALL_TIMEOUT_MS", default_value_t = 2000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub lease_call_timeout_ms: u64,

    /// Prefix of the lease resource of a task (`<prefix><id>`).
    #[arg(long, env = "TASK_LEASE_PREFIX", default_value = "task:")]
    pub lease_prefix: String,

    /// The task generator's lease resource (as its replicas are configured); its status is read
    /// from this lease, and a create that names a `generator_fence` is stored (and counted as
    /// produced) only while that fence holds this lease and the generator is started.
    #[arg(
        long,
        env = "GENERATOR_LEASE_RESOURCE",
        default_value = "task-generator"
    )]
    pub generator_resource: String,

    /// Attempts a task gets when its creator names none.
    #[arg(long, env = "TASK_DEFAULT_MAX_ATTEMPTS", default_value_t = 10,
          value_parser = clap::value_parser!(i32).range(1..=1000))]
    pub default_max_attempts: i32,

    /// First retry delay after a failure; it doubles with each attempt (with jitter).
    #[arg(long, env = "TASK_RETRY_BASE_SECONDS", default_value_t = 1.0,
          value_parser = leasehold::float_within(0.0..=MAX_RETRY_SECONDS))]
    pub retry_base_seconds: f64,

    /// Longest retry delay (at most 30 days).
    #[arg(long, env = "TASK_RETRY_MAX_SECONDS", default_value_t = 300.0,
          value_parser = leasehold::float_within(0.0..=MAX_RETRY_SECONDS))]
    pub retry_max_seconds: f64,

    /// Finished tasks (succeeded, dead, cancelled) older than this are deleted.
    #[arg(long, env = "TASK_RETENTION_SECONDS", default_value_t = 604_800,
          value_parser = clap::value_parser!(i64).range(0..))]
    pub retention_seconds: i64,

    /// How often the retention sweeper runs (on whichever replica holds its lease).
    #[arg(long, env = "TASK_SWEEP_INTERVAL_SECONDS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub sweep_interval_seconds: u64,

    /// Most distinct queue names that get a `queue` label of their own in `/metrics`: the first
    /// this many queues a replica meets; tasks of any other queue are counted under
    /// `queue="_other"`, so producers choosing queue names cannot grow the metrics without bound.
    #[arg(long, env = "METRICS_MAX_QUEUES", default_value_t = crate::metrics::DEFAULT_MAX_QUEUES)]
    pub metrics_max_queues: usize,
}

impl ServeConfig {
    /// Heavy reads at once: `READS_IN_FLIGHT`, or when it is 0, half of `cores` (at least 1);
    /// never more than half the pool.
    pub fn reads_in_flight(&self, cores: usize) -> usize {
        let wanted = if self.reads_in_flight == 0 {
            cores / 2
        } else {
            self.reads_in_flight
        };
        wanted.clamp(1, (self.server.database_pool_size / 2).max(1))
    }

    /// Refuses a configuration that cannot work, with a sentence saying why: the rules
    /// between settings (each setting's own bounds are in its attribute, checked by clap).
    pub fn validate(&self) -> Result<(), String> {
        if self.retry_base_seconds > self.retry_max_seconds {
            return Err(
                "TASK_RETRY_BASE_SECONDS must be at most TASK_RETRY_MAX_SECONDS".to_owned(),
            );
        }
        if self.groups_in_flight > self.server.database_pool_size {
            return Err("GROUPS_IN_FLIGHT must be at most DATABASE_POOL_SIZE".to_owned());
        }
        if self.reads_in_flight > (self.server.database_pool_size / 2).max(1) {
            return Err("READS_IN_FLIGHT must be at most half of DATABASE_POOL_SIZE".to_owned());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use leasehold::server::command::{ServiceCli, ServiceCommand};

    use super::ServeConfig;

    fn serve_config(args: &[&str]) -> ServeConfig {
        let argv = ["task-service", "--database-url", "postgres://db/tasks"];
        let argv: Vec<&str> = argv.iter().chain(args).copied().collect();
        match ServiceCli::<ServeConfig>::parse_from_as("task-service", "test", argv) {
            ServiceCommand::Serve(config) => *config,
            ServiceCommand::Migrate(_) => panic!("no subcommand was given"),
        }
    }

    #[test]
    fn heavy_reads_take_half_the_cores_and_never_more_than_half_the_pool() {
        let default = serve_config(&[]);
        assert_eq!(default.validate(), Ok(()));
        assert_eq!(default.reads_in_flight(2), 1);
        assert_eq!(default.reads_in_flight(1), 1);
        assert_eq!(default.reads_in_flight(8), 4);
        assert_eq!(
            default.reads_in_flight(64),
            8,
            "half of the default pool of 16"
        );
        let set = serve_config(&["--reads-in-flight", "3"]);
        assert_eq!((set.validate(), set.reads_in_flight(64)), (Ok(()), 3));
        let too_many = serve_config(&["--reads-in-flight", "9"]).validate();
        let refusal = too_many.expect_err("9 is more than half the pool of 16");
        assert!(refusal.contains("READS_IN_FLIGHT"), "{refusal}");
        let one_connection = serve_config(&["--database-pool-size", "1"]);
        assert_eq!(one_connection.validate(), Ok(()));
        assert_eq!(one_connection.reads_in_flight(8), 1);
    }

    /// Each setting's bounds are declared once, in its attribute: clap refuses a value outside
    /// them, naming the variable.
    #[test]
    fn a_setting_out_of_its_bounds_is_refused_by_its_variable() {
        for (flag, bad, variable) in [
            ("--lease-ttl-seconds", "3601", "TASK_LEASE_TTL_SECONDS"),
            ("--lease-call-timeout-ms", "0", "LEASE_CALL_TIMEOUT_MS"),
            (
                "--default-max-attempts",
                "1001",
                "TASK_DEFAULT_MAX_ATTEMPTS",
            ),
            ("--retry-base-seconds", "-1", "TASK_RETRY_BASE_SECONDS"),
            ("--retry-max-seconds", "2592001", "TASK_RETRY_MAX_SECONDS"),
            ("--retention-seconds", "-1", "TASK_RETENTION_SECONDS"),
            (
                "--sweep-interval-seconds",
                "0",
                "TASK_SWEEP_INTERVAL_SECONDS",
            ),
            ("--groups-in-flight", "0", "GROUPS_IN_FLIGHT"),
            ("--lease-service-url", "https://x", "LEASE_SERVICE_URL"),
        ] {
            let argv = [
                "task-service",
                "--database-url",
                "postgres://db/tasks",
                &format!("{flag}={bad}"),
            ];
            let refusal =
                ServiceCli::<ServeConfig>::try_parse_from_as("task-service", "test", argv)
                    .expect_err(flag)
                    .to_string();
            assert!(
                refusal.contains(&format!("<{variable}>")),
                "{flag} {bad}: {refusal}"
            );
        }
    }
}
