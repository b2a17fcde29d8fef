use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// The command a person should run when the server binaries are missing: the errors below
/// name it, and `binaries` says it too.
pub const INSTALL_COMMAND: &str = "sudo apt-get install -y postgresql";

/// Everything that can go wrong while finding, starting, stopping or using
/// a private PostgreSQL server. The messages say what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// A pg_auto_failover formation did not do what was asked of it.
    #[error("pg_auto_failover: {0}")]
    Formation(String),

    /// `pg_autoctl` is not installed and could not be installed here.
    #[error("pg_autoctl (pg_auto_failover) is not installed; install it with: {command}")]
    AutoFailoverMissing { command: String },

    /// No PostgreSQL server binaries anywhere we looked.
    #[error(
        "the PostgreSQL server binaries (postgres, initdb, pg_ctl) were not found in $PG_BINDIR, \
         `pg_config --bindir`, /usr/lib/postgresql/<version>/bin or $PATH; install them with: \
         {INSTALL_COMMAND}"
    )]
    BinariesNotFound,

    /// `PG_BINDIR` is set but does not hold the server binaries.
    #[error(
        "PG_BINDIR={} does not contain the PostgreSQL server binaries (postgres, initdb, pg_ctl); \
         point it at the server's bin directory (for example /usr/lib/postgresql/15/bin) or unset it",
        .0.display()
    )]
    InvalidBinDir(PathBuf),

    /// Installing PostgreSQL with apt-get did not work.
    #[error(
        "installing PostgreSQL failed: `{command}` {status}; run `{INSTALL_COMMAND}` yourself and retry"
    )]
    InstallFailed { command: String, status: String },

    /// We are root but there is no `postgres` user to run the server as.
    #[error(
        "running as root, but there is no `postgres` user to run PostgreSQL as (it refuses to run \
         as root); install the `postgresql` package or create the user with: \
         useradd --system --user-group --home-dir /var/lib/postgresql postgres"
    )]
    NoPostgresUser,

    /// The `postgres` user cannot reach the data directory.
    #[error(
        "{} is not accessible to the `{user}` user that runs PostgreSQL; run `chmod o+x {}` \
         or use a directory outside it",
        path.display(),
        path.display()
    )]
    NotTraversable { path: PathBuf, user: String },

    /// The data directory holds something other than a PostgreSQL cluster.
    #[error(
        "{} is not empty but is not a PostgreSQL data directory (it has no PG_VERSION); \
         move it away or choose another data directory",
        .0.display()
    )]
    DataDirNotEmpty(PathBuf),

    /// The data directory belongs to another user.
    #[error(
        "the data directory {} is owned by uid {found}, but PostgreSQL runs as `{user}` (uid {expected}); \
         fix it with `chown -R {user}: {}` or remove it to start afresh",
        path.display(),
        path.display()
    )]
    WrongOwner {
        path: PathBuf,
        user: String,
        expected: u32,
        found: u32,
    },

    /// A file-system or process operation failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },

    /// A helper program (initdb, pg_ctl, apt-get) failed.
    #[error("`{command}` failed ({status}):\n{output}")]
    CommandFailed {
        command: String,
        status: String,
        output: String,
    },

    /// The server process exited while we waited for it.
    #[error(
        "PostgreSQL (data directory {}) exited during startup ({status}); last lines of {}:\n{log_tail}",
        data_dir.display(),
        log_path.display()
    )]
    ServerExited {
        data_dir: PathBuf,
        log_path: PathBuf,
        status: String,
        log_tail: String,
    },

    /// The server did not start answering queries in time.
    #[error(
        "PostgreSQL on 127.0.0.1:{port} did not accept queries within {timeout:?} (last error: {last_error}); \
         last lines of {}:\n{log_tail}",
        log_path.display()
    )]
    NotReady {
        port: u16,
        timeout: Duration,
        last_error: String,
        log_path: PathBuf,
        log_tail: String,
    },

    /// The server did not stop in time and was killed.
    #[error(
        "PostgreSQL (pid {pid}) did not stop within {timeout:?}, so it was killed with SIGKILL"
    )]
    StopTimeout { pid: u32, timeout: Duration },

    /// The server is not running (it was stopped, or a restart failed).
    #[error("the private PostgreSQL server is not running")]
    NotRunning,

    /// A database name we refuse to quote into SQL.
    #[error(
        "invalid database name {0:?}: use only lowercase ASCII letters, digits and underscores (at most 63)"
    )]
    InvalidDatabaseName(String),

    /// Could not connect to a server.
    #[error("could not connect to {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: diesel::ConnectionError,
    },

    /// A statement failed.
    #[error("{what} on {url} failed: {source}")]
    Query {
        what: String,
        url: String,
        #[source]
        source: diesel::result::Error,
    },
}

impl PgError {
    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            what: what.into(),
            source,
        }
    }
}
