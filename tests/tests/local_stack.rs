//! The README's "run the stack" command, run for real: `leasehold-local` starts a private
//! PostgreSQL (or uses `DATABASE_URL`), migrates, starts lease-service, task-service and workers,
//! and stops everything on Ctrl-C.
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

/// Ports for one stack: PostgreSQL, lease-service, task-service, the first worker's metrics.
fn ports(home: &std::path::Path) -> Vec<(&'static str, String)> {
    vec![
        ("LEASEHOLD_HOME", home.display().to_string()),
        ("LEASEHOLD_PG_PORT", free_port().to_string()),
        ("LEASE_SERVICE_PORT", free_port().to_string()),
        ("TASK_SERVICE_PORT", free_port().to_string()),
        ("WORKER_METRICS_PORT", free_port().to_string()),
        ("LEASEHOLD_WORKERS", "1".to_owned()),
        ("GENERATOR_METRICS_PORT", free_port().to_string()),
        ("LEASEHOLD_GENERATORS", "2".to_owned()),
    ]
}

fn port_of(env: &[(&str, String)], name: &str) -> u16 {
    env.iter()
        .find(|(k, _)| *k == name)
        .unwrap()
        .1
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn runs_the_stack_on_a_private_postgres_and_stops_it_all_on_ctrl_c() {
    let home = std::env::temp_dir().join(format!("leasehold-stack-test-{}", std::process::id()));
    // Given an OTLP endpoint, every process of the stack exports its spans there.
    let receiver = tests::otlp::OtlpReceiver::start();
    let mut env = ports(&home);
    env.push(("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint()));
    env.push(("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()));
    let [pg_port, lease_port, task_port, worker_port] = [
        "LEASEHOLD_PG_PORT",
        "LEASE_SERVICE_PORT",
        "TASK_SERVICE_PORT",
        "WORKER_METRICS_PORT",
    ]
    .map(|name| port_of(&env, name));
    let mut child = stack(&env);
    wait_until_leases_answer(lease_port, &mut child).await;
    assert!(
        home.join("pg/data/PG_VERSION").exists(),
        "data kept under LEASEHOLD_HOME"
    );

    // The stack's worker does a task created through the stack's task-service.
    let tasks = format!("http://127.0.0.1:{task_port}/api/tasks");
    let deadline = Instant::now() + Duration::from_secs(60);
    let created: serde_json::Value = loop {
        let answer = reqwest::Client::new()
            .post(&tasks)
            .json(&json!({"task_data": {"sleep_duration_seconds": 0}}))
            .send()
            .await;
        if let Ok(answer) = answer
            && answer.status().as_u16() == 201
        {
            break answer.json().await.unwrap();
        }
        assert!(Instant::now() < deadline, "task-service did not come up");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let id = created["id"].as_i64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let task: serde_json::Value = reqwest::get(format!("{tasks}/{id}"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if task["status"] == "succeeded" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the stack's worker did not do the task: {task}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // One of the stack's two generator replicas produces once started.
    let generator = format!("http://127.0.0.1:{task_port}/api/generator");
    let started = reqwest::Client::new()
        .post(format!("{generator}/start"))
        .send()
        .await
        .unwrap();
    assert_eq!(started.status().as_u16(), 200);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status: serde_json::Value = reqwest::get(format!("{generator}/status"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if status["produced"].as_i64().unwrap_or(0) > 0 && status["producing"] == true {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the stack's generator did not produce: {status}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    assert_eq!(interrupt_and_wait(&mut child).await, 0);
    let services: std::collections::HashSet<String> = receiver
        .spans()
        .into_iter()
        .map(|span| span.service)
        .collect();
    for service in ["lease-service", "task-service", "worker", "task-generator"] {
        assert!(
            services.contains(service),
            "no spans from {service}: {services:?}"
        );
    }
    // Nothing it started is left listening.
    for port in [pg_port, lease_port, task_port, worker_port] {
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
            "port {port} still open"
        );
    }

    // Data is kept between runs: the lease taken in the first run is still there.
    let mut again = stack(&env);
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
    let mut env = ports(std::path::Path::new("/nonexistent/never-created"));
    env.push(("DATABASE_URL", db.clone()));
    let lease_port = port_of(&env, "LEASE_SERVICE_PORT");
    let mut child = stack(&env);
    wait_until_leases_answer(lease_port, &mut child).await;
    let rows = tests::snapshot(&db, "leasehold_leases.leases").await;
    assert_eq!(rows.len(), 1, "the lease landed in the given database");
    // task-service migrated its own schema of the same database, and works.
    let task_port = port_of(&env, "TASK_SERVICE_PORT");
    let created = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{task_port}/api/tasks"))
        .json(&json!({"task_data": {"sleep_duration_seconds": 0}}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status().as_u16(), 201);
    assert_eq!(
        tests::snapshot(&db, "leasehold_tasks.tasks").await.len(),
        1,
        "the task landed in the given database"
    );
    assert_eq!(interrupt_and_wait(&mut child).await, 0);
}
