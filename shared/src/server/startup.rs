//! The start-up both services run, after zero-to-production's `Application::build` /
//! `run_until_stopped`: [`bind`] migrates (unless told not to) and takes the listen address;
//! [`Server::run_until_stopped`] builds the HTTP server around the service's routes, starts its
//! sweeper, and on `stop` finishes in-flight requests, then waits for the sweeper to let go of
//! its lease. Each service brings only what is its own: its migrations, state, routes and
//! sweeper, and its [`ServerArgs`] flattened into its configuration.
//!
//! The database URL and the bearer tokens stay in each service's configuration: their help
//! names that service's database and roles.

use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use actix_web::web;
use anyhow::Context;
use tokio_util::sync::CancellationToken;

use super::auth::Auth;
use super::http::{AllowedOrigins, HttpMetrics};

/// The flags every HTTP service of Leasehold takes, with the same environment variables and
/// defaults in each (the README and the deploy files rely on them).
#[derive(Debug, Clone, clap::Args)]
pub struct ServerArgs {
    /// Address to listen on.
    #[arg(long, env = "LISTEN_ADDR", default_value = "0.0.0.0:8080")]
    pub listen_addr: SocketAddr,

    /// Do not apply pending migrations at start (run the `migrate` command instead).
    #[arg(long, env = "SKIP_MIGRATIONS", default_value_t = false)]
    pub skip_migrations: bool,

    /// Database connections in the pool (at least 1).
    #[arg(long, env = "DATABASE_POOL_SIZE", default_value_t = 16,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub database_pool_size: usize,

    /// Milliseconds to reach one database host, log in and learn whether it takes writes; then
    /// the next host of DATABASE_URL is tried.
    #[arg(long, env = "DATABASE_CONNECT_TIMEOUT_MS", default_value_t = 2_000,
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub database_connect_timeout_ms: u64,

    /// PostgreSQL's statement_timeout for every session, in milliseconds. A connection that
    /// sends nothing back for a second longer (a frozen server, a commit waiting for a standby
    /// that is gone) is closed and its request answered 503.
    #[arg(long, env = "DATABASE_STATEMENT_TIMEOUT_MS", default_value_t = 5_000,
          value_parser = clap::value_parser!(u64).range(100..=600_000))]
    pub database_statement_timeout_ms: u64,

    /// HTTP worker threads (0: one per CPU core).
    #[arg(long, env = "HTTP_WORKERS", default_value_t = 0)]
    pub http_workers: usize,

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

    /// Milliseconds a request waiting for the database's news (a claim's or an acquire's
    /// `wait_ms`) waits without any before it looks again: how late a lost notification, or a
    /// lapsed lease, reaches it.
    #[arg(long, env = "WAIT_RECHECK_MS", default_value_t = 2_000,
          value_parser = clap::value_parser!(u64).range(10..=600_000))]
    pub wait_recheck_ms: u64,
}

impl ServerArgs {
    /// The service's database at `url`, bounded by these flags' timeouts, each session
    /// starting with `session`.
    pub fn database(
        &self,
        url: &str,
        session: impl Into<String>,
    ) -> anyhow::Result<super::database::Database> {
        let timeouts = super::database::Timeouts {
            connect: Duration::from_millis(self.database_connect_timeout_ms),
            statement: Duration::from_millis(self.database_statement_timeout_ms),
        };
        super::database::Database::new(url, timeouts, session)
    }

    /// How long a waiting request waits without news before it looks again.
    pub fn wait_recheck(&self) -> Duration {
        Duration::from_millis(self.wait_recheck_ms)
    }

    /// The holder of `service`'s sweeper lease on this replica: `INSTANCE_ID`, else a name made
    /// unique to this process.
    pub fn holder(&self, service: &str) -> String {
        self.instance_id
            .clone()
            .unwrap_or_else(|| crate::identity::instance_id(service))
    }
}

/// Migrates with `migrate` unless `SKIP_MIGRATIONS` is set, then binds the listen address: both
/// before anything is served, so a replica that cannot do either exits at once.
pub async fn bind<F, Fut>(args: &ServerArgs, migrate: F) -> anyhow::Result<TcpListener>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    if !args.skip_migrations {
        migrate().await?;
    }
    TcpListener::bind(args.listen_addr).with_context(|| format!("binding {}", args.listen_addr))
}

/// What a service's retention sweeper needs: whose turn it is to sweep, how often, and how old
/// a finished row must be to go.
#[derive(Debug, Clone)]
pub struct SweeperConfig {
    /// This replica's holder name for the sweeper's lease ([`ServerArgs::holder`]).
    pub holder: String,
    pub interval: Duration,
    pub retention_seconds: i64,
}

/// One service, ready to serve: what the common start-up needs from it besides its routes.
#[derive(Debug)]
pub struct Server {
    /// The service's name, for logs.
    pub name: &'static str,
    pub args: ServerArgs,
    pub auth: Auth,
    pub http_metrics: HttpMetrics,
}

impl Server {
    /// Serves on `listener` until `stop` is cancelled, then finishes in-flight requests (up to
    /// the grace period) and waits for `background` to end.
    ///
    /// `routes` mounts the service's routes, which find `state` as app data; the bearer tokens
    /// and allowed origins are added here, for the front door. `background` (the sweeper, and
    /// task-service's schedule ticker) must end once `stop` is cancelled; it is started only
    /// once the server listens.
    pub async fn run_until_stopped<S: Send + Sync + 'static>(
        self,
        listener: TcpListener,
        stop: CancellationToken,
        state: web::Data<S>,
        routes: impl Fn(&mut web::ServiceConfig) + Clone + Send + 'static,
        background: impl Future<Output = ()> + 'static,
    ) -> anyhow::Result<()> {
        let Server {
            name,
            args,
            auth,
            http_metrics,
        } = self;
        auth.announce(name);
        let auth = web::Data::new(auth);
        let origins = web::Data::new(args.cors_allowed_origins.clone());
        let address = listener
            .local_addr()
            .context("reading the listen address")?;
        let server = super::http::serve(
            listener,
            args.http_workers,
            args.shutdown_grace_seconds,
            Duration::from_millis(args.client_request_timeout_ms),
            http_metrics,
            stop.clone(),
            move |cfg| {
                cfg.app_data(auth.clone())
                    .app_data(origins.clone())
                    .app_data(state.clone());
                routes(cfg);
            },
        )
        .context("listening")?;
        tracing::info!(%address, "{name} listening");

        let background = actix_web::rt::spawn(background);
        let served = server.await.context("serving HTTP");
        stop.cancel();
        if background.await.is_err() {
            tracing::warn!("a background job panicked");
        }
        tracing::info!("{name} stopped");
        served
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::ServerArgs;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        server: ServerArgs,
    }

    fn parse(args: &[&str]) -> ServerArgs {
        let argv = std::iter::once("service").chain(args.iter().copied());
        Cli::try_parse_from(argv).expect("parses").server
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let args = parse(&[]);
        assert_eq!(args.listen_addr.to_string(), "0.0.0.0:8080");
        assert!(!args.skip_migrations);
        assert_eq!(args.database_pool_size, 16);
        assert_eq!(args.http_workers, 0);
        assert_eq!(args.shutdown_grace_seconds, 10);
        assert_eq!(args.client_request_timeout_ms, 5000);
    }

    /// A bound is written once, in the flag's attribute, and clap's refusal names the variable
    /// it came from, whether set as a flag or in the environment.
    #[test]
    fn a_setting_out_of_its_bounds_is_refused_by_name() {
        for (flag, bad) in [
            ("--database-pool-size", "0"),
            ("--database-connect-timeout-ms", "0"),
            ("--database-connect-timeout-ms", "60001"),
            ("--database-statement-timeout-ms", "99"),
            ("--wait-recheck-ms", "9"),
        ] {
            let argv = ["service", flag, bad];
            let refusal = Cli::try_parse_from(argv).expect_err(flag).to_string();
            let variable = flag
                .trim_start_matches("--")
                .replace('-', "_")
                .to_uppercase();
            assert!(
                refusal.contains(&variable) && refusal.contains(bad),
                "{flag} {bad}: {refusal}"
            );
        }
        for (flag, edge) in [
            ("--database-pool-size", "1"),
            ("--database-connect-timeout-ms", "60000"),
            ("--database-statement-timeout-ms", "100"),
            ("--wait-recheck-ms", "10"),
        ] {
            assert!(
                Cli::try_parse_from(["service", flag, edge]).is_ok(),
                "{flag} {edge}"
            );
        }
    }

    #[test]
    fn the_sweeper_holder_is_the_instance_id_when_given() {
        assert_eq!(parse(&["--instance-id", "r1"]).holder("svc"), "r1");
        assert_ne!(parse(&[]).holder("svc"), "");
    }
}
