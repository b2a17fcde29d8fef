//! The README's "run the stack" command, run for real: `leasehold-local` starts a private
//! PostgreSQL (or uses `DATABASE_URL`), migrates, starts lease-service, and stops everything on
//! Ctrl-C.
#![allow(clippy::unwrap_used)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;
use tests::{binary, free_port, fresh_database};

fn stack(env: &[(&str, String)]) -> Child {
    let bin_dir = binary("lease-service").parent().unwrap().to_owned();
    Command::new(binary("leasehold-local"))
        .env("LEASEHOLD_NO_BUILD", "true")
        .env("LEASEHOLD_BIN_DIR", bin_dir)
        .env_remove("DATABASE_URL")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

async fn wait_until_leases_answer(port: u16, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let url = format!("http://127.0.0.1:{port}/api/leases");
    loop {
        let answer = reqwest::Client::new()
            .post(&url)
            .json(&json!({"resource": "stack", "holder": "test"}))
            .send()
            .await;
        if let Ok(answer) = answer
            && answer.status().as_u16() == 201
        {
            return;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "leasehold-local exited early"
        );
        assert!(Instant::now() < deadline, "the stack did not come up");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn interrupt_and_wait(child: &mut Child) -> i32 {
    kill(
        Pid::from_raw(i32::try_from(child.id()).unwrap()),
        Signal::SIGINT,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().unwrap_or(-1);
        }
        assert!(Instant::now() < deadline, "leasehold-local ignored Ctrl-C");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn runs_the_stack_on_a_private_postgres_and_stops_it_all_on_ctrl_c() {
    let home = std::env::temp_dir().join(format!("leasehold-stack-test-{}", std::process::id()));
    let (pg_port, lease_port) = (free_port(), free_port());
    let mut child = stack(&[
        ("LEASEHOLD_HOME", home.display().to_string()),
        ("LEASEHOLD_PG_PORT", pg_port.to_string()),
        ("LEASE_SERVICE_PORT", lease_port.to_string()),
    ]);
    wait_until_leases_answer(lease_port, &mut child).await;
    assert!(
        home.join("pg/data/PG_VERSION").exists(),
        "data kept under LEASEHOLD_HOME"
    );
    assert_eq!(interrupt_and_wait(&mut child).await, 0);
    // Nothing it started is left listening.
    assert!(std::net::TcpStream::connect(("127.0.0.1", lease_port)).is_err());
    assert!(std::net::TcpStream::connect(("127.0.0.1", pg_port)).is_err());

    // Data is kept between runs: the lease taken in the first run is still there.
    let mut again = stack(&[
        ("LEASEHOLD_HOME", home.display().to_string()),
        ("LEASEHOLD_PG_PORT", pg_port.to_string()),
        ("LEASE_SERVICE_PORT", lease_port.to_string()),
    ]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let leases = loop {
        if let Ok(answer) = reqwest::get(format!("http://127.0.0.1:{lease_port}/api/leases")).await
            && answer.status().is_success()
        {
            break answer.json::<serde_json::Value>().await.unwrap();
        }
        assert!(Instant::now() < deadline, "the second run did not come up");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(leases[0]["resource"], "stack");
    assert_eq!(interrupt_and_wait(&mut again).await, 0);
    let _ = std::fs::remove_dir_all(&home);
}

#[tokio::test]
async fn uses_database_url_when_given() {
    let db = fresh_database().await;
    let lease_port = free_port();
    let mut child = stack(&[
        ("DATABASE_URL", db.clone()),
        ("LEASE_SERVICE_PORT", lease_port.to_string()),
        ("LEASEHOLD_HOME", "/nonexistent/never-created".to_owned()),
    ]);
    wait_until_leases_answer(lease_port, &mut child).await;
    let rows = tests::snapshot(&db, "leases").await;
    assert_eq!(rows.len(), 1, "the lease landed in the given database");
    assert_eq!(interrupt_and_wait(&mut child).await, 0);
}
