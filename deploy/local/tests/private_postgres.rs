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

#[test]
fn server_dies_with_its_process() -> Result<(), Box<dyn std::error::Error>> {
    let output = Command::new(std::env::current_exe()?)
        .args([
            CHILD_TEST,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_MODE_ENV, "1")
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
    let port: u16 = field("port")?.parse()?;
    let pid: u32 = field("pid")?.parse()?;
    let data_dir = std::path::PathBuf::from(field("dir")?);
    assert!(pid > 0);

    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let alive = pid_alive(pid);
        let listening = TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok();
        if !alive && !listening {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "PostgreSQL (pid {pid}, port {port}) still running after its process exited \
             (alive: {alive}, listening: {listening})"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

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
