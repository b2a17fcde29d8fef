//! Creating the monitor and the nodes, tuned for failovers in seconds ([`TUNING`],
//! [`KEEPER_TUNING`]).

use std::path::Path;
use std::time::{Duration, Instant};

use super::Formation;
use super::health::simple_query;
use crate::postgres::server::run_checked;
use crate::postgres::{PgError, SUPERUSER};

/// The monitor's settings, as `ALTER SYSTEM` sets them (defaults in brackets).
pub const TUNING: &[(&str, &str)] = &[
    // How often, and how patiently, the monitor checks each node [5000, 5000, 2, 2000 ms].
    ("pgautofailover.health_check_period", "1000"),
    ("pgautofailover.health_check_timeout", "1000"),
    ("pgautofailover.health_check_max_retries", "1"),
    ("pgautofailover.health_check_retry_delay", "500"),
    // A node failing its checks and silent for this long is unhealthy [20000 ms].
    ("pgautofailover.node_considered_unhealthy_timeout", "3000"),
    // How long an unreachable primary has to demote itself before the standby is promoted:
    // the bound on two primaries at once [30000 ms].
    ("pgautofailover.primary_demote_timeout", "3000"),
    // A restarted monitor's patience before judging nodes [10000 ms].
    ("pgautofailover.startup_grace_period", "2000"),
];

/// How long a `config set` that found a keeper's configuration half written waits to read it
/// again.
const CONFIG_REWRITE_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// Each keeper's settings, as `pg_autoctl config set` sets them (defaults in brackets).
pub const KEEPER_TUNING: &[(&str, &str)] = &[
    // A primary that reaches neither monitor nor standby this long demotes itself [20 s]; kept
    // below the monitor's unhealthy timeout plus its demote timeout, so it has gone before the
    // standby is promoted.
    ("timeout.network_partition_timeout", "5"),
    // How long a failed PostgreSQL restart is retried before the node reports it [20 s].
    ("timeout.postgresql_restart_failure_timeout", "5"),
];

impl Formation {
    pub(super) async fn create_monitor(&mut self) -> Result<(), PgError> {
        let mut command = self.autoctl();
        command
            .args(["create", "monitor", "--run", "--no-ssl", "--auth", "trust"])
            .args(["--hostname", "127.0.0.1", "--pgport"])
            .arg(self.monitor.port.to_string())
            .arg("--pgctl")
            .arg(self.bindir.join("pg_ctl"))
            .arg("--pgdata")
            .arg(&self.monitor.pgdata);
        self.spawn_monitor(command)?;
        let url = format!(
            "postgres://{SUPERUSER}@127.0.0.1:{}/pg_auto_failover",
            self.monitor.port
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        // The monitor is ready when its extension answers.
        while simple_query(&url, "SELECT count(*) FROM pgautofailover.node")
            .await
            .is_err()
        {
            if Instant::now() > deadline {
                return Err(PgError::Formation(format!(
                    "the monitor did not come up; its log:\n{}",
                    crate::postgres::server::log_tail(&self.monitor.log)
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // One statement each: ALTER SYSTEM refuses to run in a transaction block, which a
        // multi-statement query is.
        for (name, value) in TUNING {
            simple_query(&url, &format!("ALTER SYSTEM SET {name} = {value}")).await?;
        }
        simple_query(&url, "SELECT pg_reload_conf()").await?;
        Ok(())
    }

    pub(super) async fn create_node(
        &mut self,
        index: usize,
        database: &str,
    ) -> Result<(), PgError> {
        let node = &self.nodes[index];
        let monitor = format!(
            "postgres://autoctl_node@127.0.0.1:{}/pg_auto_failover?sslmode=disable",
            self.monitor.port
        );
        // The keeper's settings live in its configuration file, which `create` writes and
        // `run` reads: so create first, tune, then run.
        let mut create = self.autoctl();
        create
            .args(["create", "postgres", "--no-ssl", "--auth", "trust"])
            .args(["--hostname", "127.0.0.1", "--pgport"])
            .arg(node.port.to_string())
            .args([
                "--name",
                &node.name,
                "--dbname",
                database,
                "--monitor",
                &monitor,
            ])
            .arg("--pgctl")
            .arg(self.bindir.join("pg_ctl"))
            .arg("--pgdata")
            .arg(&node.pgdata);
        let pgdata = node.pgdata.clone();
        if index == 0 {
            run_checked(
                create,
                format!("pg_autoctl create postgres ({})", node.name),
            )?;
        } else {
            // A secondary's creation copies the primary, which needs the primary's keeper to
            // take part: run it as the node's service from the start.
            create.arg("--run");
            return self.spawn(index, create);
        }
        self.tune_keeper(&pgdata).await?;
        let mut run = self.autoctl();
        run.arg("run").arg("--pgdata").arg(&pgdata);
        self.spawn(index, run)
    }

    /// Writes [`KEEPER_TUNING`] into a node's configuration; a running keeper reads it on
    /// `pg_autoctl reload`. A running keeper also rewrites that file in place as its state
    /// changes, so a `config set` may find it half written ("Failed to parse configuration
    /// file", seen in CI on the secondary): it is read again once the keeper is done, within a
    /// bound.
    pub(super) async fn tune_keeper(&self, pgdata: &Path) -> Result<(), PgError> {
        const TRIES: u32 = 50;
        for (name, value) in KEEPER_TUNING {
            let shown = format!("pg_autoctl config set {name} {value}");
            let mut tries = 0;
            loop {
                let mut set = self.autoctl();
                set.args(["config", "set", "--pgdata"])
                    .arg(pgdata)
                    .args([name, value]);
                match run_checked(set, shown.clone()) {
                    Err(PgError::CommandFailed { output, .. })
                        if output.contains("Failed to parse configuration file")
                            && tries < TRIES =>
                    {
                        tries += 1;
                        tokio::time::sleep(CONFIG_REWRITE_PAUSE).await;
                    }
                    done => {
                        done?;
                        break;
                    }
                }
            }
        }
        Ok(())
    }
}
