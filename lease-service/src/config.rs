//! Configuration: command-line flags, each also read from an environment variable.

use clap::Args;
use leasehold::server::auth::Auth;
use leasehold::server::startup::ServerArgs;

#[derive(Debug, Clone, Args)]
pub struct ServeConfig {
    /// PostgreSQL URL of the leases database.
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: String,

    #[command(flatten)]
    pub server: ServerArgs,

    /// Statements of each kind (acquire, renew, release) in flight at once for single requests.
    /// Requests that arrive while all are busy go together as the next statement, one commit
    /// for all; 1 makes the largest groups, more suit more cores. At most a third of
    /// DATABASE_POOL_SIZE.
    #[arg(long, env = "GROUPS_IN_FLIGHT", default_value_t = 2,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub groups_in_flight: usize,

    /// Lease length when a request names none.
    #[arg(long, env = "LEASE_DEFAULT_TTL_SECONDS", default_value_t = 30)]
    pub default_ttl_seconds: i64,

    /// Shortest `ttl_seconds` a request may ask for.
    #[arg(long, env = "LEASE_MIN_TTL_SECONDS", default_value_t = 1,
          value_parser = clap::value_parser!(i64).range(1..=i64::from(i32::MAX)))]
    pub min_ttl_seconds: i64,

    /// Longest `ttl_seconds` a request may ask for.
    #[arg(long, env = "LEASE_MAX_TTL_SECONDS", default_value_t = 3600,
          value_parser = clap::value_parser!(i64).range(1..=i64::from(i32::MAX)))]
    pub max_ttl_seconds: i64,

    /// The most two database nodes' clocks may differ, in milliseconds. Expiry is judged by the
    /// primary's clock; after a failover, a lease the old primary set may be taken over only
    /// this long after it expired, so that a new primary whose clock runs ahead cannot end it
    /// early.
    #[arg(long, env = "LEASE_MAX_CLOCK_SKEW_MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(0..=60_000))]
    pub max_clock_skew_ms: u32,

    /// Expired or released leases older than this are deleted by the retention sweeper.
    #[arg(long, env = "LEASE_RETENTION_SECONDS", default_value_t = 86_400,
          value_parser = clap::value_parser!(i64).range(0..))]
    pub retention_seconds: i64,

    /// How often the retention sweeper runs (on whichever replica holds its lease).
    #[arg(long, env = "LEASE_SWEEP_INTERVAL_SECONDS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub sweep_interval_seconds: u64,

    /// Acquires that may wait for a held lease (`wait_ms`) on this replica at once. One past
    /// the bound answers at once, as without `wait_ms` (409 `lease_held`), and counts in
    /// `lease_acquire_waits_refused_total`: each waiting request holds memory while it waits.
    /// 0: no acquire waits.
    #[arg(long, env = "LEASE_MAX_WAITERS", default_value_t = 1000)]
    pub max_waiters: usize,

    /// Bearer tokens for the write routes: comma-separated `role[+role...]:token` entries,
    /// tokens of 16 bytes or more. Roles: `leaseholder` (acquire, renew, release) and
    /// `operator` (revoke anyone's lease). Unset: every route is open, and a warning says so.
    #[arg(long, env = "AUTH_TOKENS", hide_env_values = true, default_value = "", hide_default_value = true, value_parser = Auth::parse)]
    pub auth_tokens: Auth,

    /// Renew, release and a reentrant acquire must present the lease's `secret` (returned by
    /// the acquire), so a holder's name alone cannot release its lease. Off by default, so the
    /// sample's clients, which send only `{resource, holder}`, keep working.
    #[arg(long, env = "LEASE_REQUIRE_SECRET", default_value_t = false)]
    pub require_secret: bool,

    /// TESTS ONLY: acquire without its expiry check, so another holder can take a live lease.
    /// It exists to show that the invariant checker catches a broken build; never set it. Only
    /// a build with the `test-hooks` feature has it; any other refuses to start when it is set,
    /// so no one believes it on where it is not.
    #[arg(
        long,
        env = "LEASEHOLD_TEST_BREAK_ACQUIRE",
        hide = true,
        default_value_t = false
    )]
    pub test_break_acquire: bool,
}

impl ServeConfig {
    /// Refuses a configuration that cannot work, with a sentence saying why.
    pub fn validate(&self) -> Result<(), String> {
        if self.test_break_acquire && !cfg!(feature = "test-hooks") {
            return Err(
                "LEASEHOLD_TEST_BREAK_ACQUIRE is set, but this lease-service was built without its test hooks (cargo feature `test-hooks`, which `cargo build --workspace --bins` and `cargo test --workspace` turn on through the tests crate); unset it"
                    .to_owned(),
            );
        }
        // The bounds of each setting are in its attribute; what is left are the rules between
        // settings.
        if self.min_ttl_seconds > self.max_ttl_seconds {
            return Err(format!(
                "LEASE_MIN_TTL_SECONDS ({}) must be at most LEASE_MAX_TTL_SECONDS ({})",
                self.min_ttl_seconds, self.max_ttl_seconds
            ));
        }
        if !(self.min_ttl_seconds..=self.max_ttl_seconds).contains(&self.default_ttl_seconds) {
            return Err(format!(
                "LEASE_DEFAULT_TTL_SECONDS ({}) must lie within {}..={}",
                self.default_ttl_seconds, self.min_ttl_seconds, self.max_ttl_seconds
            ));
        }
        // Three kinds of group (acquire, renew, release) each hold up to that many connections.
        if 3 * self.groups_in_flight > self.server.database_pool_size {
            return Err(
                "GROUPS_IN_FLIGHT must be at most a third of DATABASE_POOL_SIZE".to_owned(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use leasehold::server::command::{ServiceCli, ServiceCommand};

    use super::ServeConfig;

    fn serve_config(args: &[&str]) -> ServeConfig {
        let argv = ["lease-service", "--database-url", "postgres://db/leases"];
        let argv: Vec<&str> = argv.iter().chain(args).copied().collect();
        match ServiceCli::<ServeConfig>::parse_from_as("lease-service", "test", argv) {
            ServiceCommand::Serve(config) => *config,
            ServiceCommand::Migrate(_) => panic!("no subcommand was given"),
        }
    }

    #[test]
    fn the_defaults_are_valid() {
        assert_eq!(serve_config(&[]).validate(), Ok(()));
    }

    #[test]
    fn the_test_switch_starts_only_a_build_with_test_hooks() {
        let verdict = serve_config(&["--test-break-acquire"]).validate();
        if cfg!(feature = "test-hooks") {
            assert_eq!(verdict, Ok(()));
        } else {
            let refusal = verdict.expect_err("a build without hooks refuses the switch");
            assert!(
                refusal.contains("LEASEHOLD_TEST_BREAK_ACQUIRE"),
                "{refusal}"
            );
        }
    }

    #[test]
    fn groups_may_hold_at_most_the_whole_pool() {
        let refused = serve_config(&["--database-pool-size", "5", "--groups-in-flight", "2"]);
        assert!(refused.validate().is_err());
        let accepted = serve_config(&["--database-pool-size", "6", "--groups-in-flight", "2"]);
        assert_eq!(accepted.validate(), Ok(()));
    }

    /// Each setting's bounds are declared once, in its attribute: clap refuses a value outside
    /// them, naming the variable.
    #[test]
    fn a_setting_out_of_its_bounds_is_refused_by_its_variable() {
        for (flag, bad, variable) in [
            ("--min-ttl-seconds", "0", "LEASE_MIN_TTL_SECONDS"),
            ("--max-ttl-seconds", "2147483648", "LEASE_MAX_TTL_SECONDS"),
            ("--max-clock-skew-ms", "60001", "LEASE_MAX_CLOCK_SKEW_MS"),
            ("--retention-seconds", "-1", "LEASE_RETENTION_SECONDS"),
            (
                "--sweep-interval-seconds",
                "0",
                "LEASE_SWEEP_INTERVAL_SECONDS",
            ),
            ("--groups-in-flight", "0", "GROUPS_IN_FLIGHT"),
        ] {
            let argv = [
                "lease-service",
                "--database-url",
                "postgres://db/leases",
                &format!("{flag}={bad}"),
            ];
            let refusal =
                ServiceCli::<ServeConfig>::try_parse_from_as("lease-service", "test", argv)
                    .expect_err(flag)
                    .to_string();
            assert!(
                refusal.contains(&format!("<{variable}>")),
                "{flag} {bad}: {refusal}"
            );
        }
    }
}
