//! A private PostgreSQL server started by this process.
//!
//! Two flavours:
//!
//! * [`PrivatePostgres::start_persistent`] — for running the stack locally.
//!   Keeps its data between runs.
//! * [`PrivatePostgres::start_ephemeral`] — for test harnesses. A throw-away
//!   cluster tuned for speed.
//!
//! Neither can outlive the process that started it, even if that process
//! exits without running destructors or is killed with `SIGKILL`: the
//! postmaster is its direct child with a parent-death signal.
//!
//! Both listen on TCP 127.0.0.1 only (no Unix socket), trust every local
//! connection and have the superuser `postgres`. PostgreSQL refuses to run
//! as root, so when this process is root the server runs as the `postgres`
//! system user, which must be able to reach the data directory.
//!
//! This file keeps [`PrivatePostgres`] and its public methods; setting up the cluster on disk
//! is in `cluster`, starting and stopping the server in `server`, and the SQL it runs (database
//! and schema creation) in `sql`.

mod binaries;
mod cluster;
mod error;
pub mod formation;
mod server;
mod sql;

use std::fs::DirBuilder;
use std::io;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::{Gid, Uid, User};

pub use self::binaries::find_server_binaries;
pub use self::cluster::cargo_target_dir;
use self::cluster::{
    check_traversable, chown_to, create_dirs, ephemeral_base_dir, prepare_data_dir,
    remove_stale_instances,
};
pub use self::error::INSTALL_COMMAND;
pub use self::error::PgError;
use self::server::{file_len, free_port, open_log, port_was_taken};
pub use self::sql::{create_database_at, create_schema, ping, redact_url, validate_database_name};
use crate::process::pid_alive;

/// The superuser created by `initdb`, and the system user the server runs
/// as when this process is root.
pub const SUPERUSER: &str = "postgres";

/// How long to wait for a server to accept queries.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long to wait for a server to stop before killing it.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// How many ports `start_ephemeral` tries when the chosen one is taken.
const PORT_ATTEMPTS: u32 = 5;
/// Where ephemeral clusters go when there is no cargo target directory.
const EPHEMERAL_DIR_NAME: &str = "leasehold-test-pg";
/// Overrides the parent directory of ephemeral clusters.
pub const EPHEMERAL_DIR_ENV: &str = "LEASEHOLD_TEST_PG_DIR";

/// Settings for test servers: durability off, room for many connections.
const TEST_SETTINGS: &[(&str, &str)] = &[
    ("fsync", "off"),
    ("synchronous_commit", "off"),
    ("full_page_writes", "off"),
    ("max_connections", "400"),
    ("shared_buffers", "128MB"),
];

/// How to stop (or restart) the server, as in `pg_ctl stop -m MODE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShutdownMode {
    /// Disconnect clients, roll back their transactions, checkpoint, exit
    /// (`SIGINT` to the postmaster).
    Fast,
    /// Kill everything without a checkpoint, like a crash; the next start
    /// runs crash recovery (`SIGQUIT` to the postmaster).
    Immediate,
}

impl ShutdownMode {
    fn pg_ctl_mode(self) -> &'static str {
        match self {
            Self::Fast => "fast",
            Self::Immediate => "immediate",
        }
    }

    fn signal(self) -> Signal {
        match self {
            Self::Fast => Signal::SIGINT,
            Self::Immediate => Signal::SIGQUIT,
        }
    }
}

/// The system user the server runs as when this process is root.
#[derive(Debug, Clone)]
struct RunAs {
    uid: Uid,
    gid: Gid,
    name: String,
}

impl RunAs {
    fn current() -> Result<Option<Self>, PgError> {
        if !nix::unistd::geteuid().is_root() {
            return Ok(None);
        }
        let user = User::from_name(SUPERUSER)
            .map_err(|errno| {
                PgError::io(
                    format!("could not look up the `{SUPERUSER}` user"),
                    errno.into(),
                )
            })?
            .ok_or(PgError::NoPostgresUser)?;
        Ok(Some(Self {
            uid: user.uid,
            gid: user.gid,
            name: user.name,
        }))
    }
}

/// In both kinds `postgres` is spawned directly and tied to this process's
/// lifetime; `postmaster` is `None` while it is not running.
#[derive(Debug)]
enum Kind {
    /// The cluster's own settings; stopped with a fast shutdown (checkpoint)
    /// even when this process dies.
    Persistent { postmaster: Option<Child> },
    /// Test settings; `instance_dir` holds the data directory and the log
    /// and is removed when the server is stopped or dropped.
    Ephemeral {
        instance_dir: PathBuf,
        postmaster: Option<Child>,
    },
}

impl Kind {
    fn postmaster(&mut self) -> &mut Option<Child> {
        match self {
            Self::Persistent { postmaster } | Self::Ephemeral { postmaster, .. } => postmaster,
        }
    }
}

/// A PostgreSQL server this process started. See the [module docs](self).
///
/// Dropping it stops the server (persistent: fast shutdown; ephemeral:
/// immediate shutdown, then its directory is removed).
#[derive(Debug)]
pub struct PrivatePostgres {
    bindir: PathBuf,
    data_dir: PathBuf,
    log_path: PathBuf,
    port: u16,
    run_as: Option<RunAs>,
    kind: Kind,
    /// Acknowledge a commit only once its WAL is written (`synchronous_commit=on`).
    crash_safe: bool,
    /// PostgreSQL's own durable defaults (`fsync`, `synchronous_commit`, `full_page_writes`
    /// on): for benchmarks, whose figures must be what production would see.
    durable: bool,
}

// Test harnesses keep one in a `static`.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<PrivatePostgres>();
};

impl PrivatePostgres {
    /// Starts a server on `data_dir` that keeps its data between runs,
    /// listening on `127.0.0.1:port`. Blocks until it accepts queries.
    ///
    /// * Runs `initdb` only if `data_dir` has no cluster yet (it may be
    ///   missing or empty; missing parents are created).
    /// * If a server is still running on `data_dir` (say, one an older
    ///   version started with `pg_ctl`), it is stopped with
    ///   `pg_ctl stop -m fast` and started again, so the current port and
    ///   settings always apply.
    /// * Runs `postgres` as a child in a process group of its own, logging to
    ///   `<data_dir>/../postgres.log`: Ctrl-C at the terminal does not reach
    ///   it, so the caller decides when it stops (call [`stop`](Self::stop)
    ///   or drop the value). Should this process die, the kernel asks the
    ///   server for a fast shutdown (`SIGINT`), so it never outlives us.
    pub fn start_persistent(data_dir: &Path, port: u16) -> Result<Self, PgError> {
        let bindir = find_server_binaries()?;
        let run_as = RunAs::current()?;
        let data_dir = std::path::absolute(data_dir).map_err(|source| {
            PgError::io(
                format!("invalid data directory {}", data_dir.display()),
                source,
            )
        })?;
        let parent = data_dir
            .parent()
            .ok_or_else(|| {
                PgError::io(
                    format!("invalid data directory {}", data_dir.display()),
                    io::Error::from(io::ErrorKind::InvalidInput),
                )
            })?
            .to_path_buf();
        create_dirs(&parent)?;
        if let Some(user) = &run_as {
            check_traversable(&data_dir, user)?;
        }
        let initialised = prepare_data_dir(&data_dir, run_as.as_ref())?;
        let log_path = parent.join("postgres.log");
        let mut pg = Self {
            bindir,
            data_dir,
            log_path,
            port,
            run_as,
            kind: Kind::Persistent { postmaster: None },
            // The cluster's own (durable) settings.
            crash_safe: true,
            durable: true,
        };
        if !initialised {
            tracing::info!(data_dir = %pg.data_dir.display(), "initialising a new PostgreSQL cluster");
            pg.initdb(false)?;
        }
        // The server's user's, so that `pg_ctl` run by hand can write to it too.
        let log = open_log(&pg.log_path)?;
        chown_to(&pg.log_path, pg.run_as.as_ref())?;
        drop(log);
        pg.stop_leftover_server()?;
        pg.spawn_postmaster()?;
        if let Err(error) = pg.wait_ready() {
            let _ = pg.stop_postmaster(ShutdownMode::Immediate);
            return Err(error);
        }
        tracing::info!(
            port,
            data_dir = %pg.data_dir.display(),
            log = %pg.log_path.display(),
            "PostgreSQL is running"
        );
        Ok(pg)
    }

    /// Starts a throw-away server for tests, on a free port of 127.0.0.1.
    /// Blocks until it accepts queries.
    ///
    /// Its directory is `<cargo target dir>/leasehold-test-pg/<pid>-<random>`
    /// (`data/` plus `postgres.log`); the target dir comes from
    /// `$CARGO_TARGET_DIR` or from the location of the running executable,
    /// falling back to the system temp dir. `$LEASEHOLD_TEST_PG_DIR`
    /// overrides the parent directory. Directories left behind by processes
    /// that no longer exist are removed first.
    ///
    /// The server cannot outlive this process: it is spawned from a
    /// dedicated thread with a parent-death signal (`SIGQUIT`, immediate
    /// shutdown), so it goes away even if the process exits without running
    /// destructors (as test binaries do with statics) or is killed.
    ///
    /// Tuned for tests: `fsync`, `synchronous_commit` and `full_page_writes`
    /// off, `max_connections=400`, `shared_buffers=128MB`.
    pub fn start_ephemeral() -> Result<Self, PgError> {
        Self::ephemeral(false, false)
    }

    /// Like [`start_ephemeral`](Self::start_ephemeral), but a commit is acknowledged only once
    /// its WAL is written (`synchronous_commit=on`), so an immediate shutdown (a crash of
    /// PostgreSQL, not of the machine: `fsync` stays off) loses nothing it acknowledged. For
    /// tests that crash the server and count what survived.
    pub fn start_ephemeral_crash_safe() -> Result<Self, PgError> {
        Self::ephemeral(true, false)
    }

    /// Like [`start_ephemeral`](Self::start_ephemeral), but with PostgreSQL's default, durable
    /// settings: every commit waits for its WAL to reach the disk (`fsync`). For benchmarks:
    /// it also loads `pg_stat_statements` (tracking nested statements) when the server's
    /// package has it, so a benchmark can tell where PostgreSQL's time goes.
    pub fn start_ephemeral_durable() -> Result<Self, PgError> {
        Self::ephemeral(true, true)
    }

    fn ephemeral(crash_safe: bool, durable: bool) -> Result<Self, PgError> {
        let bindir = find_server_binaries()?;
        let run_as = RunAs::current()?;
        let base = ephemeral_base_dir(run_as.as_ref())?;
        remove_stale_instances(&base);
        let instance_dir = base.join(format!(
            "{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        DirBuilder::new()
            .mode(0o755)
            .create(&instance_dir)
            .map_err(|source| {
                PgError::io(
                    format!("could not create {}", instance_dir.display()),
                    source,
                )
            })?;
        // From here on, dropping `pg` removes the instance directory.
        let mut pg = Self {
            bindir,
            data_dir: instance_dir.join("data"),
            log_path: instance_dir.join("postgres.log"),
            port: 0,
            run_as,
            kind: Kind::Ephemeral {
                instance_dir,
                postmaster: None,
            },
            crash_safe,
            durable,
        };
        prepare_data_dir(&pg.data_dir, pg.run_as.as_ref())?;
        pg.initdb(true)?;
        let mut attempt = 1;
        loop {
            pg.port = free_port()?;
            let log_offset = file_len(&pg.log_path);
            let started = pg.spawn_postmaster().and_then(|()| pg.wait_ready());
            match started {
                Ok(()) => break,
                Err(error) => {
                    let _ = pg.stop_postmaster(ShutdownMode::Immediate);
                    if attempt < PORT_ATTEMPTS && port_was_taken(&pg.log_path, log_offset) {
                        tracing::debug!(port = pg.port, "port taken; trying another one");
                        attempt += 1;
                        continue;
                    }
                    return Err(error);
                }
            }
        }
        tracing::debug!(
            port = pg.port,
            data_dir = %pg.data_dir.display(),
            "ephemeral PostgreSQL is running"
        );
        Ok(pg)
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:PORT/DATABASE`.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://{SUPERUSER}@127.0.0.1:{}/{database}", self.port)
    }

    /// The cluster's data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The server's log file.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The postmaster's pid, if the server is running.
    pub fn pid(&self) -> Option<u32> {
        match &self.kind {
            Kind::Persistent { postmaster } | Kind::Ephemeral { postmaster, .. } => postmaster
                .as_ref()
                .map(Child::id)
                .filter(|pid| pid_alive(*pid)),
        }
    }

    /// Creates database `name` (`[a-z0-9_]+`) unless it already exists.
    pub async fn create_database(&self, name: &str) -> Result<(), PgError> {
        create_database_at(&self.url(SUPERUSER), name).await
    }

    /// Stops the server with `mode` and starts it again on the same port and
    /// data directory; blocks until it accepts queries again. Existing
    /// connections are broken. After [`ShutdownMode::Immediate`] the server
    /// runs crash recovery on start.
    pub fn restart(&mut self, mode: ShutdownMode) -> Result<(), PgError> {
        if self.kind.postmaster().is_none() {
            return Err(PgError::NotRunning);
        }
        self.stop_postmaster(mode)?;
        self.spawn_postmaster()?;
        self.wait_ready()?;
        tracing::debug!(port = self.port, ?mode, "PostgreSQL restarted");
        Ok(())
    }

    /// Stops the server (fast shutdown). An ephemeral server's directory is
    /// removed as well.
    pub fn stop(mut self) -> Result<(), PgError> {
        self.shutdown(ShutdownMode::Fast)
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        // A test cluster's data is thrown away, so skip the checkpoint.
        let mode = match self.kind {
            Kind::Persistent { .. } => ShutdownMode::Fast,
            Kind::Ephemeral { .. } => ShutdownMode::Immediate,
        };
        if let Err(error) = self.shutdown(mode) {
            tracing::warn!(%error, "could not stop PostgreSQL cleanly");
        }
    }
}
