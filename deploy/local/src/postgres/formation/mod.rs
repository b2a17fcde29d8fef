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

mod create;
mod faults;
mod health;
mod install;
mod logs;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::binaries::find_server_binaries;
use super::cluster::{chown_to, create_dirs, ephemeral_base_dir, remove_stale_instances};
use super::server::{free_port, open_log, run_checked};
use super::{PgError, RunAs, SUPERUSER};
use crate::process::{TiedGroup, signal_tree, spawn_group_tied_to_process};
use nix::sys::signal::Signal;

pub use create::{KEEPER_TUNING, TUNING};
pub use health::NodeState;
use health::simple_query;
use install::find_pg_autoctl;
pub use install::{ensure_installed, install_command};

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
