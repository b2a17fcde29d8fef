//! A pg_auto_failover formation on this machine: a monitor, a primary and a secondary with
//! synchronous replication, each a `pg_autoctl run` tree of its own. For `leasehold-local --ha`
//! and for the failover tests, which kill, freeze and restart its nodes.
//!
//! pg_auto_failover's defaults suit machines on a network: a node is declared unhealthy after
//! 20 s and a primary that cannot be reached is given 30 s to demote itself before its standby
//! is promoted. [`TUNING`] brings both down to seconds, so that a test sees a dozen failovers
//! in minutes; [`KEEPER_TUNING`] does the same for each node's keeper.
//!
//! Each node runs in a process group of its own that dies with this process
//! ([`crate::process::TiedGroup`]), and stopping a node kills every process under it. The
//! formation's directory is removed when it is dropped, and a leftover one (of a process that
//! was killed) by the next private server's or formation's start.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::binaries::find_server_binaries;
use super::cluster::{chown_to, create_dirs, ephemeral_base_dir, remove_stale_instances};
use super::server::{free_port, open_log, run_checked};
use super::{PgError, RunAs, SUPERUSER};
use crate::process::{TiedGroup, signal_tree, spawn_group_tied_to_process};
use nix::sys::signal::Signal;

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

/// The command to run when `pg_autoctl` is missing and cannot be installed here.
pub fn install_command(major: &str) -> String {
    format!("sudo apt-get install -y postgresql-{major}-auto-failover")
}

/// Finds `pg_autoctl`, installing it with apt when missing and this process is root;
/// [`PgError::AutoFailoverMissing`] names the command to run otherwise.
pub fn ensure_installed() -> Result<PathBuf, PgError> {
    find_pg_autoctl(&find_server_binaries()?)
}

/// What the monitor says of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    pub name: String,
    pub port: u16,
    pub reported: String,
    pub assigned: String,
    pub timeline: i32,
}

impl NodeState {
    /// Settled in `state`: it reports what it was assigned.
    pub fn is(&self, state: &str) -> bool {
        self.reported == state && self.assigned == state
    }
}

/// One `pg_autoctl` node (or the monitor): its data directory, port and running tree.
#[derive(Debug)]
struct Node {
    name: String,
    port: u16,
    pgdata: PathBuf,
    log: PathBuf,
    running: Option<TiedGroup>,
}

impl Node {
    /// Kills the node's whole tree: its process group, and PostgreSQL's processes too, which
    /// run in sessions of their own and, if the tree was paused, would never see their
    /// postmaster go.
    fn stop(&mut self) {
        if let Some(group) = self.running.take() {
            signal_tree(group.id(), Signal::SIGKILL);
        }
    }
}

/// A running formation; it stops, and its files go, when dropped.
#[derive(Debug)]
pub struct Formation {
    dir: PathBuf,
    pg_autoctl: PathBuf,
    bindir: PathBuf,
    run_as: Option<RunAs>,
    monitor: Node,
    nodes: Vec<Node>,
    /// How often the monitor called the formation healthy before the standby was synchronous
    /// and caught up ([`Formation::wait_healthy`]).
    early_healthy: std::sync::atomic::AtomicUsize,
}

impl Formation {
    /// Creates and starts a monitor and two nodes, with a database `database` on them, and
    /// waits until one is primary and the other its synchronous secondary.
    pub async fn start(database: &str) -> Result<Formation, PgError> {
        let bindir = find_server_binaries()?;
        let pg_autoctl = find_pg_autoctl(&bindir)?;
        let run_as = RunAs::current()?;
        // Beside the test clusters, named as they are (`<pid>-...`), so that the same sweep
        // removes a formation whose process was killed.
        let base = ephemeral_base_dir(run_as.as_ref())?;
        remove_stale_instances(&base);
        let dir = base.join(format!("{}-formation-{}", std::process::id(), free_port()?));
        for sub in ["", "config", "share", "run"] {
            let path = dir.join(sub);
            create_dirs(&path)?;
            chown_to(&path, run_as.as_ref())?;
        }
        let node = |name: &str| -> Result<Node, PgError> {
            Ok(Node {
                name: name.to_owned(),
                port: free_port()?,
                pgdata: dir.join(name),
                log: dir.join(format!("{name}.log")),
                running: None,
            })
        };
        let mut formation = Formation {
            monitor: node("monitor")?,
            nodes: vec![node("node1")?, node("node2")?],
            dir,
            pg_autoctl,
            bindir,
            run_as,
            early_healthy: std::sync::atomic::AtomicUsize::new(0),
        };
        formation.create_monitor().await?;
        for index in 0..formation.nodes.len() {
            formation.create_node(index, database).await?;
            // The second node copies the first with pg_basebackup: the first must be primary.
            formation
                .wait_until(Duration::from_secs(120), "the node to join", |states| {
                    states.len() == index + 1
                        && states
                            .iter()
                            .all(|s| s.is("primary") || s.is("secondary") || s.is("single"))
                })
                .await?;
            if index > 0 {
                let pgdata = formation.nodes[index].pgdata.clone();
                formation.tune_keeper(&pgdata).await?;
                let mut reload = formation.autoctl();
                reload.arg("reload").arg("--pgdata").arg(&pgdata);
                run_checked(reload, "pg_autoctl reload".to_owned())?;
            }
        }
        Ok(formation)
    }

    /// The formation's URL for `database`: every node, for a client to find the primary (the
    /// one that takes writes, also for clients that would settle for any node).
    pub fn url(&self, database: &str) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        format!(
            "postgres://{SUPERUSER}@{}/{database}?target_session_attrs=read-write",
            hosts.join(",")
        )
    }

    /// Creates `database` on the primary; the secondary gets it by replication.
    pub async fn create_database(&self, database: &str) -> Result<(), PgError> {
        super::validate_database_name(database)?;
        let primary = self.wait_healthy(Duration::from_secs(60)).await?;
        simple_query(
            &self.node_url(primary, "postgres"),
            &format!("CREATE DATABASE \"{database}\""),
        )
        .await
        .map(|_| ())
    }

    /// Node `index`'s own URL for `database`.
    pub fn node_url(&self, index: usize, database: &str) -> String {
        format!(
            "postgres://{SUPERUSER}@127.0.0.1:{}/{database}",
            self.nodes[index].port
        )
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub fn node_port(&self, index: usize) -> u16 {
        self.nodes[index].port
    }

    /// The pid of node `index`'s `pg_autoctl run`, the root of its process tree, if running.
    pub fn node_pid(&self, index: usize) -> Option<u32> {
        self.nodes[index].running.as_ref().map(TiedGroup::id)
    }

    /// Where node `index` logs.
    pub fn node_log(&self, index: usize) -> &Path {
        &self.nodes[index].log
    }

    /// The monitor's view of the data nodes, in node order.
    pub async fn states(&self) -> Result<Vec<NodeState>, PgError> {
        let url = format!(
            "postgres://autoctl_node@127.0.0.1:{}/pg_auto_failover",
            self.monitor.port
        );
        let rows = simple_query(
            &url,
            "SELECT nodename, nodeport, reportedstate, goalstate, reportedtli \
             FROM pgautofailover.node ORDER BY nodeid",
        )
        .await?;
        Ok(rows
            .into_iter()
            .map(|row| NodeState {
                name: row[0].clone(),
                port: row[1].parse().unwrap_or(0),
                reported: row[2].clone(),
                assigned: row[3].clone(),
                timeline: row[4].parse().unwrap_or(0),
            })
            .collect())
    }

    /// Index of the node the monitor has settled as primary, if one has.
    pub async fn primary(&self) -> Result<Option<usize>, PgError> {
        let states = self.states().await?;
        Ok(states.iter().position(|s| s.is("primary")))
    }

    /// Waits until `check` holds of the monitor's view.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        what: &str,
        check: impl Fn(&[NodeState]) -> bool,
    ) -> Result<Vec<NodeState>, PgError> {
        let deadline = Instant::now() + timeout;
        let mut last = Vec::new();
        loop {
            if let Ok(states) = self.states().await {
                if check(&states) {
                    return Ok(states);
                }
                last = states;
            }
            if Instant::now() > deadline {
                return Err(PgError::Formation(format!(
                    "timed out after {timeout:?} waiting for {what}; the monitor says {last:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until one node is primary and every other its secondary, and the primary's
    /// commits wait for that secondary again: healthy, able to lose a node without losing an
    /// acknowledged write. Returns the primary's index.
    ///
    /// The monitor's word alone is not enough: it reports a returning standby `secondary`, and
    /// turns synchronous replication back on, once it is within
    /// `pgautofailover.enable_sync_wal_log_threshold` (16 MB) of WAL, not once it has caught up.
    /// A planned failover started at that moment lost an acknowledged write (the failover
    /// soak's ledger saw it, three times in its first 35 faults), so this also waits until the
    /// primary's `pg_stat_replication` shows a synchronous standby that has flushed all the
    /// primary had flushed when asked.
    pub async fn wait_healthy(&self, timeout: Duration) -> Result<usize, PgError> {
        let deadline = Instant::now() + timeout;
        loop {
            let states = self
                .wait_until(timeout, "a primary and its secondary", |states| {
                    states.iter().filter(|s| s.is("primary")).count() == 1
                        && states.iter().all(|s| s.is("primary") || s.is("secondary"))
                })
                .await?;
            let primary = states.iter().position(|s| s.is("primary")).unwrap_or(0);
            let first_look = self.synchronous_and_caught_up(primary, false).await;
            if first_look.unwrap_or(false) {
                return Ok(primary);
            }
            self.early_healthy
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if self
                .synchronous_and_caught_up(primary, true)
                .await
                .unwrap_or(false)
            {
                return Ok(primary);
            }
            if Instant::now() > deadline {
                return Err(PgError::Formation(format!(
                    "timed out after {timeout:?} waiting for node {primary}'s standby to be \
                     synchronous and caught up"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// How often the monitor has called the formation healthy while the primary's standby was
    /// not yet synchronous and caught up.
    pub fn early_healthy_reports(&self) -> usize {
        self.early_healthy
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// What each node's keeper did, in time order: its state machine's transitions and the
    /// settings that decide which node takes writes and whether a commit waits for a standby.
    /// Lines as the logs have them (`HH:MM:SS`, local time of this machine), each after its
    /// node's name: for a failed test's report, where the logs themselves may be out of reach.
    pub fn story(&self) -> Vec<String> {
        const TOLD: [&str; 5] = [
            "FSM transition from",
            "Setting synchronous_standby_names",
            "Setting default_transaction_read_only",
            "network partition",
            "Failed to",
        ];
        let mut lines: Vec<(String, String)> = Vec::new();
        for node in &self.nodes {
            let Ok(text) = std::fs::read_to_string(&node.log) else {
                continue;
            };
            for line in text
                .lines()
                .filter(|line| TOLD.iter().any(|t| line.contains(t)))
            {
                let time = line
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                lines.push((time, format!("{} {line}", node.name)));
            }
        }
        // Stable: a node's lines of one second keep their order.
        lines.sort_by(|a, b| a.0.cmp(&b.0));
        lines.into_iter().map(|(_, line)| line).collect()
    }

    /// Copies the monitor's and each node's logs (pg_autoctl's, and PostgreSQL's own under
    /// `PGDATA/log`) into `dir`, named by node: the directory they live in goes with the
    /// formation, and a failed test needs them after.
    pub fn copy_logs_to(&self, dir: &Path) {
        for node in std::iter::once(&self.monitor).chain(&self.nodes) {
            let _ = std::fs::copy(&node.log, dir.join(format!("pg-{}.log", node.name)));
            let Ok(entries) = std::fs::read_dir(node.pgdata.join("log")) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = format!("pg-{}-{}", node.name, entry.file_name().to_string_lossy());
                let _ = std::fs::copy(entry.path(), dir.join(name));
            }
        }
    }

    /// Whether node `primary` replicates synchronously to a standby that has flushed all it had
    /// flushed a moment ago; with `wait`, waiting up to 10 s for it.
    async fn synchronous_and_caught_up(&self, primary: usize, wait: bool) -> Result<bool, PgError> {
        let url = self.node_url(primary, "postgres");
        let flushed = simple_query(&url, "SELECT pg_current_wal_flush_lsn()::text").await?;
        let Some(lsn) = flushed.first().and_then(|row| row.first()).cloned() else {
            return Ok(false);
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let rows = simple_query(
                &url,
                &format!(
                    "SELECT count(*) FROM pg_stat_replication \
                     WHERE sync_state IN ('sync', 'quorum') AND flush_lsn >= '{lsn}'::pg_lsn \
                       AND current_setting('synchronous_standby_names') <> ''"
                ),
            )
            .await?;
            if rows
                .first()
                .and_then(|row| row.first())
                .is_some_and(|n| n != "0")
            {
                return Ok(true);
            }
            if !wait {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(false)
    }

    /// `pg_autoctl perform failover`: the monitor has the secondary promoted and the primary
    /// demoted, and this waits for it.
    pub fn perform_failover(&self) -> Result<(), PgError> {
        let mut command = self.autoctl();
        command
            .args(["perform", "failover", "--wait", "60", "--pgdata"])
            .arg(&self.monitor.pgdata);
        run_checked(command, "pg_autoctl perform failover".to_owned()).map(|_| ())
    }

    /// The shell command a person runs to fail this formation over by hand.
    pub fn failover_command(&self) -> String {
        let user = if self.run_as.is_some() {
            format!("runuser -u {SUPERUSER} -- ")
        } else {
            String::new()
        };
        format!(
            "{user}env XDG_CONFIG_HOME={} XDG_DATA_HOME={} {} perform failover --pgdata {}",
            self.dir.join("config").display(),
            self.dir.join("share").display(),
            self.pg_autoctl.display(),
            self.monitor.pgdata.display()
        )
    }

    /// Starts node `index` again (after a kill), as its service manager would.
    pub fn restart(&mut self, index: usize) -> Result<(), PgError> {
        // The old tree, whatever is left of it, goes first.
        self.nodes[index].stop();
        let pgdata = self.nodes[index].pgdata.clone();
        let mut command = self.autoctl();
        command.arg("run").arg("--pgdata").arg(&pgdata);
        self.spawn(index, command)
    }

    /// Kills node `index`'s `pg_autoctl` and PostgreSQL, every process of it at once
    /// (`SIGKILL`), as a crash of its machine would.
    pub fn kill(&mut self, index: usize) {
        self.nodes[index].stop();
    }

    async fn create_monitor(&mut self) -> Result<(), PgError> {
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
                    super::server::log_tail(&self.monitor.log)
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

    async fn create_node(&mut self, index: usize, database: &str) -> Result<(), PgError> {
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
    async fn tune_keeper(&self, pgdata: &Path) -> Result<(), PgError> {
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

    /// A `pg_autoctl` command run as the server's user, with its configuration and state kept
    /// in the formation's directory rather than that user's home.
    fn autoctl(&self) -> Command {
        let mut command = Command::new(&self.pg_autoctl);
        if let Some(user) = &self.run_as {
            use std::os::unix::process::CommandExt as _;
            command.uid(user.uid.as_raw()).gid(user.gid.as_raw());
        }
        command
            .current_dir(&self.dir)
            .env("XDG_CONFIG_HOME", self.dir.join("config"))
            .env("XDG_DATA_HOME", self.dir.join("share"))
            .env("XDG_RUNTIME_DIR", self.dir.join("run"))
            .env("PG_CONFIG", self.bindir.join("pg_config"))
            .env_remove("PGDATA")
            .stdin(Stdio::null());
        command
    }

    fn spawn(&mut self, index: usize, command: Command) -> Result<(), PgError> {
        let node = &mut self.nodes[index];
        node.running = Some(spawn_logged(command, &node.log)?);
        Ok(())
    }

    fn spawn_monitor(&mut self, command: Command) -> Result<(), PgError> {
        self.monitor.running = Some(spawn_logged(command, &self.monitor.log)?);
        Ok(())
    }
}

impl Drop for Formation {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.stop();
        }
        self.monitor.stop();
        // PostgreSQL's processes leave once they see their postmaster gone; the files can go now.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn spawn_logged(mut command: Command, log: &Path) -> Result<TiedGroup, PgError> {
    let out = open_log(log)?;
    let err = out
        .try_clone()
        .map_err(|source| PgError::io("could not open a log", source))?;
    command.stdout(out).stderr(err);
    spawn_group_tied_to_process(command, nix::sys::signal::Signal::SIGTERM)
        .map_err(|source| PgError::io("could not start pg_autoctl", source))
}

/// `pg_autoctl`, installed with apt when missing and this process is root.
fn find_pg_autoctl(bindir: &Path) -> Result<PathBuf, PgError> {
    let major = bindir
        .parent()
        .and_then(Path::file_name)
        .and_then(|name| name.to_str())
        .unwrap_or("15")
        .to_owned();
    let candidates = [
        PathBuf::from("/usr/bin/pg_autoctl"),
        bindir.join("pg_autoctl"),
    ];
    let found = || candidates.iter().find(|path| path.is_file()).cloned();
    if let Some(path) = found() {
        return Ok(path);
    }
    let command = install_command(&major);
    if nix::unistd::geteuid().is_root() {
        tracing::warn!("pg_autoctl not found; installing it: {command}");
        let package = format!("postgresql-{major}-auto-failover");
        let apt = |args: &[&str]| {
            Command::new("apt-get")
                .args(args)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .stdin(Stdio::null())
                .status()
                .is_ok_and(|status| status.success())
        };
        // A fresh machine may have no package lists yet: update only when the install needs it.
        let installed = apt(&["install", "-y", &package])
            || (apt(&["update"]) && apt(&["install", "-y", &package]));
        if installed && let Some(path) = found() {
            return Ok(path);
        }
    }
    Err(PgError::AutoFailoverMissing { command })
}

/// Runs `sql` (one or more statements) on a new connection; the rows of the last, as text.
async fn simple_query(url: &str, sql: &str) -> Result<Vec<Vec<String>>, PgError> {
    let connect = tokio_postgres::connect(url, tokio_postgres::NoTls);
    let (client, connection) = tokio::time::timeout(Duration::from_secs(5), connect)
        .await
        .map_err(|_| PgError::Formation(format!("no answer from {url} within 5 s")))?
        .map_err(|err| PgError::Formation(format!("connecting to {url}: {err}")))?;
    let driver = tokio::spawn(connection);
    let messages = tokio::time::timeout(Duration::from_secs(10), client.simple_query(sql))
        .await
        .map_err(|_| PgError::Formation(format!("no answer to a query from {url} within 10 s")))?
        .map_err(|err| {
            let detail = err
                .as_db_error()
                .map_or_else(|| err.to_string(), |db| db.message().to_owned());
            PgError::Formation(format!("querying {url}: {detail}"))
        })?;
    drop(client);
    driver.abort();
    Ok(messages
        .into_iter()
        .filter_map(|message| match message {
            tokio_postgres::SimpleQueryMessage::Row(row) => Some(
                (0..row.len())
                    .map(|i| row.get(i).unwrap_or_default().to_owned())
                    .collect(),
            ),
            _ => None,
        })
        .collect())
}
