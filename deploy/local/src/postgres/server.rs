//! Starting and stopping the server process: spawning the postmaster tied to this process,
//! waiting until it accepts queries, stopping it (or a leftover one from an earlier run) and
//! reading its log for errors. Kept in one place because every path that can leave a server
//! running, or lose one, goes through here, which is what guarantees none outlives us.

use std::fs::{self, File, OpenOptions};
use std::future::Future;
use std::io::{self, Read as _, Seek as _, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::error::PgError;
use crate::process::{pid_alive, send_signal, spawn_tied_to_process};

use super::{
    Kind, PrivatePostgres, READY_TIMEOUT, STOP_TIMEOUT, SUPERUSER, ShutdownMode, TEST_SETTINGS, sql,
};

impl PrivatePostgres {
    pub(super) fn shutdown(&mut self, mode: ShutdownMode) -> Result<(), PgError> {
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
    pub(super) fn pg_command(&self, program: &str) -> Command {
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

    // ---- persistent -----------------------------------------------------

    /// Stops a server this process did not start, with `pg_ctl`.
    pub(super) fn pg_ctl_stop(&self, mode: ShutdownMode) -> Result<(), PgError> {
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
    pub(super) fn stop_leftover_server(&self) -> Result<(), PgError> {
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

    /// Whether the server's package has loadable module `name` (in `../lib` of its binaries).
    fn has_library(&self, name: &str) -> bool {
        self.bindir
            .parent()
            .is_some_and(|root| root.join("lib").join(format!("{name}.so")).is_file())
    }

    pub(super) fn spawn_postmaster(&mut self) -> Result<(), PgError> {
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
        // A benchmark's cluster tells where its time goes, statement by statement, when the
        // extension is installed (Debian's postgresql-15 ships it); nested statements (those
        // of triggers) too, so a trigger's share is seen apart from its statement's, and the
        // planning of each statement apart from its execution.
        if self.durable && !persistent && self.has_library("pg_stat_statements") {
            command
                .args(["-c", "shared_preload_libraries=pg_stat_statements"])
                .args(["-c", "pg_stat_statements.track=all"])
                .args(["-c", "pg_stat_statements.track_planning=on"]);
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
    pub(super) fn stop_postmaster(&mut self, mode: ShutdownMode) -> Result<(), PgError> {
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
    pub(super) fn exited(&mut self) -> Result<Option<String>, PgError> {
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
    pub(super) fn wait_ready(&mut self) -> Result<(), PgError> {
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

/// Runs `future` to completion on a fresh current-thread runtime in a
/// scoped thread, so this works both inside and outside a tokio runtime.
pub(super) fn block_on<T: Send>(future: impl Future<Output = T> + Send) -> Result<T, PgError> {
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
pub(super) fn run_checked(mut command: Command, shown: String) -> Result<String, PgError> {
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

pub(super) fn open_log(path: &Path) -> Result<File, PgError> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|source| PgError::io(format!("could not open {}", path.display()), source))
}

pub(super) fn file_len(path: &Path) -> u64 {
    fs::metadata(path).map(|meta| meta.len()).unwrap_or(0)
}

/// The last lines of a log file, for error messages.
pub(super) fn log_tail(path: &Path) -> String {
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
pub(super) fn port_was_taken(log_path: &Path, offset: u64) -> bool {
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
pub(super) fn free_port() -> Result<u16, PgError> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .map_err(|source| PgError::io("could not find a free TCP port on 127.0.0.1", source))
}

/// The postmaster pid from the first line of `postmaster.pid`.
pub(super) fn read_postmaster_pid(data_dir: &Path) -> Option<u32> {
    let text = fs::read_to_string(data_dir.join("postmaster.pid")).ok()?;
    text.lines().next()?.trim().parse().ok()
}

/// Whether process `pid` is a postmaster running on `data_dir` (the
/// postmaster's working directory is its data directory).
pub(super) fn serves_data_dir(pid: u32, data_dir: &Path) -> bool {
    match (
        fs::read_link(format!("/proc/{pid}/cwd")),
        fs::canonicalize(data_dir),
    ) {
        (Ok(cwd), Ok(data_dir)) => cwd == data_dir,
        _ => fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|comm| comm.trim() == "postgres"),
    }
}
