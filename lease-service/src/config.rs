//! Configuration: command-line flags, each also read from an environment variable.

use std::net::SocketAddr;

use clap::{Args, Parser, Subcommand};
use leasehold::server::auth::Auth;
use leasehold::server::http::AllowedOrigins;

/// Leasehold's lease service: time-bound, exclusive, renewable, fenced leases kept in PostgreSQL.
#[derive(Debug, Parser)]
#[command(
    name = "lease-service",
    version,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub serve: ServeConfig,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the HTTP API (the default).
    Serve(ServeConfig),
    /// Apply pending database migrations and exit.
    Migrate(MigrateConfig),
}

#[derive(Debug, Clone, Args)]
pub struct MigrateConfig {
    /// PostgreSQL URL of the leases database.
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: String,
}

#[derive(Debug, Clone, Args)]
pub struct ServeConfig {
    /// PostgreSQL URL of the leases database.
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: String,

    /// Address to listen on.
    #[arg(long, env = "LISTEN_ADDR", default_value = "0.0.0.0:8080")]
    pub listen_addr: SocketAddr,

    /// Do not apply pending migrations at start (run `lease-service migrate` instead).
    #[arg(long, env = "SKIP_MIGRATIONS", default_value_t = false)]
    pub skip_migrations: bool,

    /// Database connections in the pool.
    #[arg(long, env = "DATABASE_POOL_SIZE", default_value_t = 16)]
    pub database_pool_size: usize,

    /// Statements of each kind (acquire, renew, release) in flight at once for single requests.
    /// Requests that arrive while all are busy go together as the next statement, one commit
    /// for all; 1 makes the largest groups, more suit more cores. At most a third of
    /// DATABASE_POOL_SIZE.
    #[arg(long, env = "GROUPS_IN_FLIGHT", default_value_t = 2)]
    pub groups_in_flight: usize,

    /// HTTP worker threads (0: one per CPU core).
    #[arg(long, env = "HTTP_WORKERS", default_value_t = 0)]
    pub http_workers: usize,

    /// Lease length when a request names none.
    #[arg(long, env = "LEASE_DEFAULT_TTL_SECONDS", default_value_t = 30)]
    pub default_ttl_seconds: i64,

    /// Shortest `ttl_seconds` a request may ask for.
    #[arg(long, env = "LEASE_MIN_TTL_SECONDS", default_value_t = 1)]
    pub min_ttl_seconds: i64,

    /// Longest `ttl_seconds` a request may ask for.
    #[arg(long, env = "LEASE_MAX_TTL_SECONDS", default_value_t = 3600)]
    pub max_ttl_seconds: i64,

    /// Expired or released leases older than this are deleted by the retention sweeper.
    #[arg(long, env = "LEASE_RETENTION_SECONDS", default_value_t = 86_400)]
    pub retention_seconds: i64,

    /// How often the retention sweeper runs (on whichever replica holds its lease).
    #[arg(long, env = "LEASE_SWEEP_INTERVAL_SECONDS", default_value_t = 60)]
    pub sweep_interval_seconds: u64,

    /// Name of this replica, used as the holder of the sweeper's lease (default: host name,
    /// process id and a random suffix).
    #[arg(long, env = "INSTANCE_ID")]
    pub instance_id: Option<String>,

    /// Seconds to let in-flight requests finish after SIGTERM or SIGINT.
    #[arg(long, env = "SHUTDOWN_GRACE_SECONDS", default_value_t = 10)]
    pub shutdown_grace_seconds: u64,

    /// A client that has not sent a request's headers within this time, or then its body within
    /// as long again, gets 408 and is disconnected, so slow clients cannot hold connections.
    #[arg(long, env = "CLIENT_REQUEST_TIMEOUT_MS", default_value_t = 5000)]
    pub client_request_timeout_ms: u64,

    /// Origins whose web pages may call this service from a browser (CORS): comma-separated
    /// `scheme://host[:port]`, or `*` for any. Unset: none; a page of another origin can
    /// neither write (403 `origin_not_allowed`) nor read the answers.
    #[arg(long, env = "CORS_ALLOWED_ORIGINS", default_value = "", hide_default_value = true, value_parser = AllowedOrigins::parse)]
    pub cors_allowed_origins: AllowedOrigins,

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
    /// It exists to show that the invariant checker catches a broken build; never set it.
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
        if self.min_ttl_seconds < 1 || self.min_ttl_seconds > self.max_ttl_seconds {
            return Err(format!(
                "LEASE_MIN_TTL_SECONDS ({}) must be at least 1 and at most LEASE_MAX_TTL_SECONDS ({})",
                self.min_ttl_seconds, self.max_ttl_seconds
            ));
        }
        if self.max_ttl_seconds > i64::from(i32::MAX) {
            return Err("LEASE_MAX_TTL_SECONDS is too large".to_owned());
        }
        if !(self.min_ttl_seconds..=self.max_ttl_seconds).contains(&self.default_ttl_seconds) {
            return Err(format!(
                "LEASE_DEFAULT_TTL_SECONDS ({}) must lie within {}..={}",
                self.default_ttl_seconds, self.min_ttl_seconds, self.max_ttl_seconds
            ));
        }
        if self.retention_seconds < 0 {
            return Err("LEASE_RETENTION_SECONDS must not be negative".to_owned());
        }
        if self.sweep_interval_seconds == 0 {
            return Err("LEASE_SWEEP_INTERVAL_SECONDS must be at least 1".to_owned());
        }
        if self.database_pool_size == 0 {
            return Err("DATABASE_POOL_SIZE must be at least 1".to_owned());
        }
        // Three kinds of group (acquire, renew, release) each hold up to that many connections.
        if self.groups_in_flight == 0 || 3 * self.groups_in_flight > self.database_pool_size {
            return Err(
                "GROUPS_IN_FLIGHT must be at least 1 and at most a third of DATABASE_POOL_SIZE"
                    .to_owned(),
            );
        }
        Ok(())
    }
}
