//! Starts real PostgreSQL servers. Needs the server binaries (see
//! `leasehold_local::postgres::find_server_binaries`).

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use leasehold_local::postgres::{
    PgError, PrivatePostgres, ShutdownMode, find_server_binaries, ping,
};
use leasehold_local::process::pid_alive;

/// Set in the child process of `server_dies_with_its_process`.
const CHILD_MODE_ENV: &str = "LEASEHOLD_LOCAL_TEST_CHILD";
const CHILD_TEST: &str = "child_starts_server_and_exits_without_cleanup";
/// The data directory and port of the persistent server the child starts.
const PERSISTENT_DIR_ENV: &str = "LEASEHOLD_LOCAL_TEST_PERSISTENT_DIR";
const PERSISTENT_PORT_ENV: &str = "LEASEHOLD_LOCAL_TEST_PERSISTENT_PORT";
const PERSISTENT_CHILD_TEST: &str = "child_starts_persistent_server_and_exits_without_cleanup";

#[test]
fn finds_server_binaries() -> Result<(), PgError> {
    let bindir = find_server_binaries()?;
    for program in ["postgres", "initdb", "pg_ctl"] {
        assert!(
            bindir.join(program).is_file(),
            "{program} in {}",
            bindir.display()
        );
    }
    Ok(())
}

#[tokio::test]
async fn ephemeral_server_databases_and_restarts() -> Result<(), PgError> {
    let mut pg = PrivatePostgres::start_ephemeral()?;
    let port = pg.port();
    assert_eq!(
        pg.url("leases"),
        format!("postgres://postgres@127.0.0.1:{port}/leases")
    );
    assert!(pg.data_dir().join("PG_VERSION").is_file());

    pg.create_database("leases").await?;
    pg.create_database("tasks").await?;
    // Creating it again is fine.
    pg.create_database("leases").await?;
    assert!(matches!(
        pg.create_database("Bad-Name").await,
        Err(PgError::InvalidDatabaseName(_))
    ));
    ping(&pg.url("leases")).await?;
    ping(&pg.url("tasks")).await?;
    assert!(
        ping(&pg.url("missing")).await.is_err(),
        "a database that was never created"
    );

    for mode in [ShutdownMode::Fast, ShutdownMode::Immediate] {
        let before = pg.pid().expect("running before restart");
        pg.restart(mode)?;
        let after = pg.pid().expect("running after restart");
        assert_ne!(before, after, "{mode:?} restart starts a new postmaster");
        assert!(
            !pid_alive(before),
            "old postmaster gone after {mode:?} restart"
        );
        assert_eq!(pg.port(), port, "same port after {mode:?} restart");
        ping(&pg.url("leases")).await?;
        ping(&pg.url("tasks")).await?;
    }

    let pid = pg.pid().expect("running");
    let instance_dir = pg.data_dir().parent().expect("instance dir").to_path_buf();
    pg.stop()?;
    assert!(!pid_alive(pid), "postmaster gone after stop");
    assert!(!instance_dir.exists(), "test cluster removed after stop");
    Ok(())
}

/// Run only as the child of `server_dies_with_its_process`: starts a server,
/// reports it, and exits without running any destructor.
#[test]
#[ignore = "helper: run by server_dies_with_its_process in a child process"]
#[allow(clippy::print_stdout)] // Reports the server to the parent process.
fn child_starts_server_and_exits_without_cleanup() {
    if std::env::var_os(CHILD_MODE_ENV).is_none() {
        return;
    }
    let pg = match PrivatePostgres::start_ephemeral() {
        Ok(pg) => pg,
        Err(error) => panic!("child could not start PostgreSQL: {error}"),
    };
    // libtest prints "test NAME ... " before this, on the same line.
    println!(
        "\nLEASEHOLD_CHILD_SERVER port={} pid={} dir={}",
        pg.port(),
        pg.pid().unwrap_or(0),
        pg.data_dir().display()
    );
    // Like a test binary exiting with a server in a static: no Drop.
    std::mem::forget(pg);
    std::process::exit(0);
}

/// Runs the ignored helper test `test` in a child process with `env`; the fields of the line
/// it printed after `LEASEHOLD_CHILD_SERVER`.
fn run_child(test: &str, env: &[(&str, &str)]) -> Result<ChildReport, Box<dyn std::error::Error>> {
    let output = Command::new(std::env::current_exe()?)
        .args([
            test,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_MODE_ENV, "1")
        .envs(env.iter().copied())
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "child failed: {}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|line| {
            line.split_once("LEASEHOLD_CHILD_SERVER ")
                .map(|(_, rest)| rest)
        })
        .ok_or_else(|| format!("child did not report its server:\n{stdout}"))?;
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|part| part.strip_prefix(name)?.strip_prefix('='))
            .map(str::to_owned)
            .ok_or_else(|| format!("no {name} in {line:?}"))
    };
    Ok(ChildReport {
        port: field("port")?.parse()?,
        pid: field("pid")?.parse()?,
        data_dir: std::path::PathBuf::from(field("dir")?),
    })
}

struct ChildReport {
    port: u16,
    pid: u32,
    data_dir: std::path::PathBuf,
}

/// Waits until the server `pid` is gone and nothing listens on `port`.
fn wait_gone(pid: u32, port: u16) {
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let alive = pid_alive(pid);
        let listening = TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok();
        if !alive && !listening {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "PostgreSQL (pid {pid}, port {port}) still running after its process exited \
             (alive: {alive}, listening: {listening})"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn server_dies_with_its_process() -> Result<(), Box<dyn std::error::Error>> {
    let ChildReport {
        port,
        pid,
        data_dir,
    } = run_child(CHILD_TEST, &[])?;
    assert!(pid > 0);
    wait_gone(pid, port);

    // The next start cleans up the directory the dead process left behind.
    let instance_dir = data_dir.parent().ok_or("no instance dir")?.to_path_buf();
    assert!(instance_dir.exists());
    let pg = PrivatePostgres::start_ephemeral()?;
    assert!(
        !instance_dir.exists(),
        "stale {} removed",
        instance_dir.display()
    );
    drop(pg);
    Ok(())
}

/// Run only as the child of `persistent_server_keeps_its_data_and_dies_with_its_process`:
/// starts the local stack's kind of server on the directory and port it is given, makes a
/// database, reports the server and exits without running any destructor.
#[test]
#[ignore = "helper: run by persistent_server_keeps_its_data_and_dies_with_its_process"]
#[allow(clippy::print_stdout)] // Reports the server to the parent process.
fn child_starts_persistent_server_and_exits_without_cleanup() {
    let (Some(dir), Some(port)) = (
        std::env::var_os(PERSISTENT_DIR_ENV),
        std::env::var(PERSISTENT_PORT_ENV).ok(),
    ) else {
        return;
    };
    let port: u16 = port.parse().expect("port");
    let pg = match PrivatePostgres::start_persistent(std::path::Path::new(&dir), port) {
        Ok(pg) => pg,
        Err(error) => panic!("child could not start PostgreSQL: {error}"),
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime
        .block_on(pg.create_database("kept"))
        .expect("create database");
    println!(
        "\nLEASEHOLD_CHILD_SERVER port={} pid={} dir={}",
        pg.port(),
        pg.pid().unwrap_or(0),
        pg.data_dir().display()
    );
    // Like `leasehold-local` killed with SIGKILL: no Drop.
    std::mem::forget(pg);
    std::process::exit(0);
}

/// `leasehold-local`'s PostgreSQL is not left running when `leasehold-local` dies however it
/// dies, and it shuts down cleanly then: the next start finds the data and needs no recovery.
#[test]
fn persistent_server_keeps_its_data_and_dies_with_its_process()
-> Result<(), Box<dyn std::error::Error>> {
    let home = std::env::temp_dir().join(format!(
        "leasehold-persistent-pg-test-{}",
        std::process::id()
    ));
    let data_dir = home.join("data");
    let port = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port();
    let report = run_child(
        PERSISTENT_CHILD_TEST,
        &[
            (PERSISTENT_DIR_ENV, &data_dir.display().to_string()),
            (PERSISTENT_PORT_ENV, &port.to_string()),
        ],
    )?;
    assert_eq!(report.port, port);
    assert!(report.pid > 0);
    wait_gone(report.pid, port);

    let log = home.join("postgres.log");
    let before = std::fs::metadata(&log)?.len();
    let pg = PrivatePostgres::start_persistent(&data_dir, port)?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(ping(&pg.url("kept")))?;
    let text = std::fs::read_to_string(&log)?;
    let second_start = &text[usize::try_from(before)?..];
    assert!(
        !second_start.contains("not properly shut down"),
        "the server was not shut down cleanly when its process died:\n{second_start}"
    );
    let pid = pg.pid().ok_or("running")?;
    pg.stop()?;
    assert!(!pid_alive(pid), "postmaster gone after stop");
    let _ = std::fs::remove_dir_all(&home);
    Ok(())
}
