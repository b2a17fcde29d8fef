//! The invariant checker on real runs: a busy run with faults keeps every invariant, and a
//! deliberately broken build (acquire without its expiry check) is caught.
#![allow(clippy::unwrap_used, clippy::print_stdout)]

use std::time::Duration;

use leasehold::TaskClient;
use leasehold::generator::StartGenerator;
use tests::checker;
use tests::{Service, all_tasks_final, eventually, fresh_database};

/// The generator replica holding the lease, as task-service reports it.
async fn leader(tasks: &TaskClient) -> Option<String> {
    let status = tasks.generator_status().await.ok()?;
    Some(status.leader?.holder)
}

#[tokio::test]
async fn a_busy_run_with_crashes_and_pauses_keeps_every_invariant() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let tasks = Service::task_service(
        &task_db,
        &leases.base_url(),
        &[("TASK_LEASE_TTL_SECONDS", "2")],
    )
    .await;
    let worker_env = [
        ("HEARTBEAT_INTERVAL_SECONDS", "0.5"),
        ("POLL_MAX_MS", "200"),
        ("WORKER_CONCURRENCY", "3"),
    ];
    let mut workers = Vec::new();
    for _ in 0..4 {
        workers.push(Service::worker(&tasks.base_url(), &worker_env).await);
    }
    let generator_env = [
        ("GENERATOR_LEASE_TTL_SECONDS", "2"),
        ("GENERATOR_RETRY_INTERVAL_SECONDS", "0.5"),
        ("GENERATOR_SETTINGS_POLL_MS", "200"),
    ];
    let mut generators = Vec::new();
    for id in ["g1", "g2", "g3"] {
        generators.push(
            Service::generator(&tasks.base_url(), &leases.base_url(), id, &generator_env).await,
        );
    }
    let client = tasks.task_client();
    let start = StartGenerator {
        rate_per_second: Some(15.0),
        min_sleep_seconds: Some(0.0),
        max_sleep_seconds: Some(1.0),
    };
    assert!(client.start_generator(&start).await.unwrap().is_running);

    // Faults: kill -9 a worker mid-task, pause the generators' leader past its lease, kill it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    workers[0].kill();
    // Three seconds of work are no promise that a leader has been elected on a slow machine.
    eventually(Duration::from_secs(30), "a generator leader", || async {
        leader(&client).await.is_some()
    })
    .await;
    let leader_now = leader(&client).await.unwrap();
    let leading = generators
        .iter()
        .position(|g| g.log_text().contains(&format!("holder={leader_now}")))
        .unwrap_or(0);
    generators[leading].pause();
    tokio::time::sleep(Duration::from_secs(3)).await;
    workers[1].pause();
    generators[leading].resume();
    tokio::time::sleep(Duration::from_secs(3)).await;
    workers[1].resume();
    let leader_now = leader(&client).await.unwrap_or_default();
    if let Some(g) = generators
        .iter_mut()
        .find(|g| g.log_text().contains(&format!("holder={leader_now}")))
    {
        g.kill();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!client.stop_generator().await.unwrap().is_running);

    eventually(Duration::from_secs(90), "every task final", || {
        all_tasks_final(&client)
    })
    .await;
    let report = checker::check(&lease_db, Some(&task_db), true).await;
    println!("{report}");
    assert!(report.generated_tasks > 50, "{report:?}");
    // The workers' liveness leases cover their tasks (a term each, and another after a pause
    // that outlived one), beside the generators' terms; every completion was judged against
    // the terms of the lease that covered its claim.
    assert!(report.terms > workers.len(), "{report:?}");
    assert_eq!(
        report.checked[&checker::Invariant::NotSuperseded],
        report.tasks_by_status["succeeded"],
        "{report:?}"
    );
    assert!(report.violations.is_empty(), "{report}");
}

#[tokio::test]
async fn the_checker_catches_an_acquire_without_its_expiry_check() {
    for broken in [false, true] {
        let db = fresh_database().await;
        let env: &[(&str, &str)] = if broken {
            &[("LEASEHOLD_TEST_BREAK_ACQUIRE", "true")]
        } else {
            &[]
        };
        let svc = Service::lease_service(&db, env).await;
        let client = svc.lease_client();
        let attempts = (0..16).map(|i| {
            let client = &client;
            async move {
                client
                    .acquire_proving("contended", &format!("h{i}"), None, None)
                    .await
            }
        });
        // A grant is a new lease (201); a reentrant one (200) cannot happen with 16 holders.
        let granted = futures_util::future::join_all(attempts)
            .await
            .iter()
            .filter(|a| matches!(a, Ok((_, true))))
            .count();
        let report = checker::check(&db, None, false).await;
        if broken {
            assert!(granted > 1, "the broken build grants a live lease again");
            assert!(
                report
                    .violations_of(checker::Invariant::Exclusive)
                    .any(|v| v.evidence.starts_with("overlap on contended")),
                "the checker missed the broken build: {report:?}"
            );
        } else {
            assert_eq!(granted, 1);
            assert!(report.violations.is_empty(), "{report:?}");
        }
    }
}
