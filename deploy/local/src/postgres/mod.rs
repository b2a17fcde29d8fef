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

mod binaries;
mod error;
mod sql;

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::future::Future;
use std::io::{self, Read as _, Seek as _, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::{Gid, Uid, User};

pub use self::binaries::{INSTALL_COMMAND, find_server_binaries};
pub use self::error::PgError;
pub use self::sql::{create_database_at, create_schema, ping, redact_url, validate_database_name};
use crate::process::{pid_alive, send_signal, spawn_tied_to_process};

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
    /// settings: every commit waits for its WAL to reach the disk (`fsync`). For benchmarks.
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

    fn shutdown(&mut self, mode: ShutdownMode) -> Result<(), PgError> {
        match &self.kind {
            Kind::Persistent { .. } => self.stop_postmaster(mode),
            Kind::Ephemeral { instance_dir, .. } => {
                let instance_dir = instance_dir.clone();
                let stopped = self.stop_postmaster(mode);
                match fs::remove_dir_all(&instance_dir) {
                    Ok(()) => {}
                    Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                    Err(error) => {
                        tracing::warn!(dir = %instance_dir.display(), %error, "could not remove the test cluster");
                    }
                }
                stopped
            }
        }
    }

    /// A `Command` for one of the server programs, run as the server's user.
    fn pg_command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bindir.join(program));
        if let Some(user) = &self.run_as {
            command.uid(user.uid.as_raw()).gid(user.gid.as_raw());
        }
        if let Some(parent) = self.data_dir.parent() {
            // Our own working directory may be unreadable for that user.
            command.current_dir(parent);
        }
        command.env_remove("PGDATA").stdin(Stdio::null());
        command
    }

    fn initdb(&self, fast: bool) -> Result<(), PgError> {
        let mut command = self.pg_command("initdb");
        command.arg("-D").arg(&self.data_dir).args([
            "-U",
            SUPERUSER,
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
        ]);
        if fast {
            command.arg("--no-sync");
        }
        run_checked(command, format!("initdb -D {}", self.data_dir.display()))?;
        Ok(())
    }

    // ---- persistent -----------------------------------------------------

    /// Stops a server this process did not start, with `pg_ctl`.
    fn pg_ctl_stop(&self, mode: ShutdownMode) -> Result<(), PgError> {
        if read_postmaster_pid(&self.data_dir).is_none_or(|pid| !pid_alive(pid)) {
            return Ok(());
        }
        let mut command = self.pg_command("pg_ctl");
        command
            .args(["stop", "-w", "-t", "30", "-m", mode.pg_ctl_mode(), "-D"])
            .arg(&self.data_dir);
        run_checked(
            command,
            format!(
                "pg_ctl stop -m {} -D {}",
                mode.pg_ctl_mode(),
                self.data_dir.display()
            ),
        )?;
        Ok(())
    }

    /// Stops a server an earlier run left running on our data directory.
    fn stop_leftover_server(&self) -> Result<(), PgError> {
        let Some(pid) = read_postmaster_pid(&self.data_dir) else {
            return Ok(());
        };
        if !pid_alive(pid) {
            // A stale lock file; the server removes it itself on start.
            return Ok(());
        }
        if serves_data_dir(pid, &self.data_dir) {
            tracing::info!(
                pid,
                data_dir = %self.data_dir.display(),
                "a PostgreSQL server from an earlier run is still running; stopping it to start it with the current settings"
            );
            return self.pg_ctl_stop(ShutdownMode::Fast);
        }
        // The pid was reused by an unrelated process; PostgreSQL would refuse
        // to start because of it.
        let lock = self.data_dir.join("postmaster.pid");
        tracing::warn!(pid, lock = %lock.display(), "removing a stale lock file whose pid belongs to another process");
        fs::remove_file(&lock)
            .map_err(|source| PgError::io(format!("could not remove {}", lock.display()), source))
    }

    // ---- both -----------------------------------------------------------

    fn spawn_postmaster(&mut self) -> Result<(), PgError> {
        let log = open_log(&self.log_path)?;
        let log_err = log.try_clone().map_err(|source| {
            PgError::io(
                format!("could not open {}", self.log_path.display()),
                source,
            )
        })?;
        let persistent = matches!(self.kind, Kind::Persistent { .. });
        let mut command = self.pg_command("postgres");
        command
            .arg("-D")
            .arg(&self.data_dir)
            .arg("-p")
            .arg(self.port.to_string())
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "unix_socket_directories="])
            // Ctrl-C at a terminal goes to the foreground process group; the
            // server must stop only after the clients that use it.
            .process_group(0);
        let test_settings = if persistent { &[][..] } else { TEST_SETTINGS };
        for (name, value) in test_settings {
            let durability = matches!(*name, "fsync" | "synchronous_commit" | "full_page_writes");
            if self.durable && durability {
                continue;
            }
            let value = match *name {
                "synchronous_commit" if self.crash_safe => "on",
                _ => value,
            };
            command.arg("-c").arg(format!("{name}={value}"));
        }
        command.stdout(log).stderr(log_err);
        // Kept data deserves a checkpoint; a test cluster's is thrown away.
        let death_signal = if persistent {
            ShutdownMode::Fast.signal()
        } else {
            ShutdownMode::Immediate.signal()
        };
        let child = spawn_tied_to_process(command, death_signal).map_err(|source| {
            PgError::io(
                format!("could not start {}", self.bindir.join("postgres").display()),
                source,
            )
        })?;
        *self.kind.postmaster() = Some(child);
        Ok(())
    }

    /// Signals the postmaster and waits for it to exit (killing it after
    /// [`STOP_TIMEOUT`]).
    fn stop_postmaster(&mut self, mode: ShutdownMode) -> Result<(), PgError> {
        let Some(mut child) = self.kind.postmaster().take() else {
            return Ok(());
        };
        let pid = child.id();
        let wait_error =
            |source| PgError::io(format!("could not wait for PostgreSQL (pid {pid})"), source);
        if child.try_wait().map_err(wait_error)?.is_some() {
            return Ok(());
        }
        if let Err(error) = send_signal(pid, mode.signal()) {
            tracing::debug!(pid, %error, "could not signal PostgreSQL");
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            if child.try_wait().map_err(wait_error)?.is_some() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(PgError::StopTimeout {
                    pid,
                    timeout: STOP_TIMEOUT,
                });
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// `Some(reason)` if the server is known not to be running.
    fn exited(&mut self) -> Result<Option<String>, PgError> {
        match self.kind.postmaster() {
            None => Ok(Some("not started".to_owned())),
            Some(child) => child
                .try_wait()
                .map(|status| status.map(|status| status.to_string()))
                .map_err(|source| PgError::io("could not wait for PostgreSQL", source)),
        }
    }

    /// Polls until the server answers `SELECT 1` on its TCP port and reports
    /// our data directory (so another server on the same port does not
    /// count), failing early with the log's tail if the server exits.
    fn wait_ready(&mut self) -> Result<(), PgError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let url = self.url(SUPERUSER);
        let address = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        let expected_dir =
            fs::canonicalize(&self.data_dir).unwrap_or_else(|_| self.data_dir.clone());
        let mut last_error: String;
        loop {
            if let Some(status) = self.exited()? {
                return Err(PgError::ServerExited {
                    data_dir: self.data_dir.clone(),
                    log_path: self.log_path.clone(),
                    status,
                    log_tail: log_tail(&self.log_path),
                });
            }
            match TcpStream::connect_timeout(&address, Duration::from_secs(1)) {
                Err(error) => last_error = format!("connecting to {address}: {error}"),
                Ok(_probe) => match block_on(sql::probe_data_directory(&url))? {
                    Ok(dir)
                        if fs::canonicalize(&dir).unwrap_or_else(|_| PathBuf::from(&dir))
                            == expected_dir =>
                    {
                        return Ok(());
                    }
                    Ok(dir) => {
                        last_error = format!(
                            "port {} is answered by another PostgreSQL server (data directory {dir})",
                            self.port
                        );
                    }
                    Err(error) => last_error = error.to_string(),
                },
            }
            if Instant::now() >= deadline {
                return Err(PgError::NotReady {
                    port: self.port,
                    timeout: READY_TIMEOUT,
                    last_error,
                    log_path: self.log_path.clone(),
                    log_tail: log_tail(&self.log_path),
                });
            }
            thread::sleep(Duration::from_millis(50));
        }
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

/// Runs `future` to completion on a fresh current-thread runtime in a
/// scoped thread, so this works both inside and outside a tokio runtime.
fn block_on<T: Send>(future: impl Future<Output = T> + Send) -> Result<T, PgError> {
    thread::scope(|scope| {
        let worker = scope.spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|source| PgError::io("could not start a tokio runtime", source))?;
            Ok(runtime.block_on(future))
        });
        match worker.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// Runs a helper program to completion; its output goes into the error.
fn run_checked(mut command: Command, shown: String) -> Result<String, PgError> {
    let output = command
        .output()
        .map_err(|source| PgError::io(format!("could not run `{shown}`"), source))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if output.status.success() {
        Ok(text)
    } else {
        Err(PgError::CommandFailed {
            command: shown,
            status: output.status.to_string(),
            output: text.trim_end().to_owned(),
        })
    }
}

/// Creates `dir` and missing parents, world-traversable (0755).
fn create_dirs(dir: &Path) -> Result<(), PgError> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(|source| PgError::io(format!("could not create {}", dir.display()), source))
}

fn chown_to(path: &Path, run_as: Option<&RunAs>) -> Result<(), PgError> {
    let Some(user) = run_as else {
        return Ok(());
    };
    std::os::unix::fs::chown(path, Some(user.uid.as_raw()), Some(user.gid.as_raw())).map_err(
        |source| {
            PgError::io(
                format!(
                    "could not give {} to the `{}` user",
                    path.display(),
                    user.name
                ),
                source,
            )
        },
    )
}

/// Makes sure `data_dir` exists, is private and belongs to the server's
/// user. Returns whether it already holds a cluster.
fn prepare_data_dir(data_dir: &Path, run_as: Option<&RunAs>) -> Result<bool, PgError> {
    let io_error =
        |what: &str, source| PgError::io(format!("{what} {}", data_dir.display()), source);
    match fs::metadata(data_dir) {
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            DirBuilder::new()
                .mode(0o700)
                .create(data_dir)
                .map_err(|source| io_error("could not create", source))?;
            chown_to(data_dir, run_as)?;
            Ok(false)
        }
        Err(source) => Err(io_error("could not inspect", source)),
        Ok(meta) => {
            if data_dir.join("PG_VERSION").is_file() {
                if let Some(user) = run_as
                    && meta.uid() != user.uid.as_raw()
                {
                    return Err(PgError::WrongOwner {
                        path: data_dir.to_path_buf(),
                        user: user.name.clone(),
                        expected: user.uid.as_raw(),
                        found: meta.uid(),
                    });
                }
                return Ok(true);
            }
            let empty = fs::read_dir(data_dir)
                .map_err(|source| io_error("could not read", source))?
                .next()
                .is_none();
            if !empty {
                return Err(PgError::DataDirNotEmpty(data_dir.to_path_buf()));
            }
            chown_to(data_dir, run_as)?;
            fs::set_permissions(data_dir, fs::Permissions::from_mode(0o700))
                .map_err(|source| io_error("could not set permissions of", source))?;
            Ok(false)
        }
    }
}

/// Checks that `user` can traverse every ancestor of `path`.
fn check_traversable(path: &Path, user: &RunAs) -> Result<(), PgError> {
    for dir in path.ancestors().skip(1) {
        let Ok(meta) = fs::metadata(dir) else {
            continue;
        };
        let mode = meta.mode();
        let ok = mode & 0o001 != 0
            || (meta.uid() == user.uid.as_raw() && mode & 0o100 != 0)
            || (meta.gid() == user.gid.as_raw() && mode & 0o010 != 0);
        if !ok {
            return Err(PgError::NotTraversable {
                path: dir.to_path_buf(),
                user: user.name.clone(),
            });
        }
    }
    Ok(())
}

fn open_log(path: &Path) -> Result<File, PgError> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|source| PgError::io(format!("could not open {}", path.display()), source))
}

fn file_len(path: &Path) -> u64 {
    fs::metadata(path).map(|meta| meta.len()).unwrap_or(0)
}

/// The last lines of a log file, for error messages.
fn log_tail(path: &Path) -> String {
    const LINES: usize = 30;
    match fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            let start = lines.len().saturating_sub(LINES);
            let tail = lines[start..].join("\n");
            if tail.is_empty() {
                "(empty)".to_owned()
            } else {
                tail
            }
        }
        Err(error) => format!("(could not read it: {error})"),
    }
}

/// Whether the log written since `offset` says the port was in use.
fn port_was_taken(log_path: &Path, offset: u64) -> bool {
    let mut text = String::new();
    let read = File::open(log_path).and_then(|mut file| {
        file.seek(SeekFrom::Start(offset))?;
        file.read_to_string(&mut text)
    });
    read.is_ok()
        && (text.contains("could not bind")
            || text.contains("Address already in use")
            || text.contains("could not create any TCP/IP sockets"))
}

/// A port that was free a moment ago.
fn free_port() -> Result<u16, PgError> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .map_err(|source| PgError::io("could not find a free TCP port on 127.0.0.1", source))
}

/// The postmaster pid from the first line of `postmaster.pid`.
fn read_postmaster_pid(data_dir: &Path) -> Option<u32> {
    let text = fs::read_to_string(data_dir.join("postmaster.pid")).ok()?;
    text.lines().next()?.trim().parse().ok()
}

/// Whether process `pid` is a postmaster running on `data_dir` (the
/// postmaster's working directory is its data directory).
fn serves_data_dir(pid: u32, data_dir: &Path) -> bool {
    match (
        fs::read_link(format!("/proc/{pid}/cwd")),
        fs::canonicalize(data_dir),
    ) {
        (Ok(cwd), Ok(data_dir)) => cwd == data_dir,
        _ => fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|comm| comm.trim() == "postgres"),
    }
}

/// The cargo target directory of the running executable, if any:
/// `$CARGO_TARGET_DIR` when absolute, else the nearest ancestor of the
/// executable that looks like one (has `CACHEDIR.TAG`, `debug/` or
/// `release/`).
pub fn cargo_target_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .filter(|dir| dir.is_absolute())
    {
        return Some(dir);
    }
    let exe = std::env::current_exe().ok()?;
    exe.ancestors()
        .skip(1)
        .find(|dir| {
            dir.join("CACHEDIR.TAG").is_file()
                || dir.join("debug").is_dir()
                || dir.join("release").is_dir()
        })
        .map(Path::to_path_buf)
}

/// The first usable parent directory for ephemeral clusters.
fn ephemeral_base_dir(run_as: Option<&RunAs>) -> Result<PathBuf, PgError> {
    let mut candidates = Vec::new();
    if let Some(dir) = std::env::var_os(EPHEMERAL_DIR_ENV).filter(|dir| !dir.is_empty()) {
        candidates.push(PathBuf::from(dir));
    }
    if let Some(target) = cargo_target_dir() {
        candidates.push(target.join(EPHEMERAL_DIR_NAME));
    }
    candidates.push(std::env::temp_dir().join(EPHEMERAL_DIR_NAME));
    let mut problems = Vec::new();
    for base in candidates {
        let usable = create_dirs(&base).and_then(|()| match run_as {
            // `join` so that `base` itself is checked too.
            Some(user) => check_traversable(&base.join("instance"), user),
            None => Ok(()),
        });
        match usable {
            Ok(()) => return Ok(base),
            Err(error) => {
                tracing::debug!(%error, "not using {} for test clusters", base.display());
                problems.push(error);
            }
        }
    }
    // The temp dir is always a candidate, so there is at least one problem.
    Err(problems
        .pop()
        .unwrap_or_else(|| PgError::io("no directory for test clusters", io::Error::other("none"))))
}

/// Removes cluster directories of processes that no longer exist (and
/// kills a server still running in one, which should not happen thanks to
/// the parent-death signal).
fn remove_stale_instances(base: &Path) {
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(owner) = name
            .to_str()
            .and_then(|name| name.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if owner == std::process::id() || pid_alive(owner) {
            continue;
        }
        let dir = entry.path();
        let data_dir = dir.join("data");
        if let Some(pid) = read_postmaster_pid(&data_dir)
            && pid_alive(pid)
            && serves_data_dir(pid, &data_dir)
        {
            tracing::warn!(pid, dir = %dir.display(), "killing a leftover test PostgreSQL");
            let _ = send_signal(pid, Signal::SIGKILL);
        }
        tracing::debug!(dir = %dir.display(), "removing a stale test cluster");
        let _ = fs::remove_dir_all(&dir);
    }
}
