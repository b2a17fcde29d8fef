//! The crate docs' runnable examples, run as their docs say against real services: the
//! `square` worker of `leasehold-worker` completes a task with its own output, and two copies of
//! `leasehold`'s `hold_a_lease` share one lease, the second taking over when the first is
//! killed with SIGKILL.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use leasehold::api::LeaseStatus;
use leasehold::tasks::{CreateTask, TaskStatus};
use nix::sys::signal::Signal;
use serde_json::json;
use tests::{ChildGuard, Service, eventually, fresh_database};

/// An example binary, built by `cargo test --workspace` beside the others.
fn example(name: &str) -> PathBuf {
    let bin = tests::binary("lease-service");
    let path = bin.parent().unwrap().join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: run the tests with `cargo test --workspace` (it builds the examples)",
        path.display()
    );
    path
}

fn run(name: &str, url: &str) -> ChildGuard {
    let mut command = Command::new(example(name));
    command
        .arg(url)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    ChildGuard::spawn(command, Signal::SIGKILL).unwrap()
}

#[tokio::test]
async fn the_square_worker_example_completes_a_task_with_its_own_output() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let tasks = Service::task_service(&task_db, &leases.base_url(), &[]).await;
    let mut worker = run("square", &tasks.base_url());
    let client = tasks.task_client();
    let created = client
        .create(&CreateTask {
            task_data: json!({"n": 12}),
            ..CreateTask::default()
        })
        .await
        .unwrap()
        .into_task();
    eventually(Duration::from_secs(30), "the task squared", || async {
        client.task(created.id).await.unwrap().status == TaskStatus::Succeeded
    })
    .await;
    let done = client.task(created.id).await.unwrap();
    assert_eq!(done.task_output, Some(json!({"square": 144})));
    assert!(done.processor.unwrap().starts_with("square-"));

    // Ctrl-C (SIGINT) stops it cleanly.
    worker.signal(Signal::SIGINT);
    let status = tokio::task::spawn_blocking(move || worker.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn two_copies_of_the_lease_example_take_turns_and_survive_a_kill() {
    let db = fresh_database().await;
    let leases = Service::lease_service(&db, &[]).await;
    let client = leases.lease_client();
    let mut first = run("hold_a_lease", &leases.base_url());
    let first_holder = format!("example-{}", first.id());
    eventually(Duration::from_secs(20), "the first copy holds", || async {
        client
            .current("example:report")
            .await
            .unwrap()
            .is_some_and(|lease| {
                lease.holder == first_holder && lease.status == LeaseStatus::Active
            })
    })
    .await;
    let held = client.current("example:report").await.unwrap().unwrap();
    let second = run("hold_a_lease", &leases.base_url());
    let second_holder = format!("example-{}", second.id());

    // The second waits its turn while the first holds...
    tokio::time::sleep(Duration::from_secs(2)).await;
    let still = client.current("example:report").await.unwrap().unwrap();
    assert_eq!(
        (still.holder.as_str(), still.fence),
        (first_holder.as_str(), held.fence)
    );

    // ...and takes over once the first dies without a word, under a greater fence.
    first.kill_tree();
    eventually(
        Duration::from_secs(30),
        "the second copy takes over",
        || async {
            client
                .current("example:report")
                .await
                .unwrap()
                .is_some_and(|lease| lease.holder == second_holder && lease.fence > held.fence)
        },
    )
    .await;
}
