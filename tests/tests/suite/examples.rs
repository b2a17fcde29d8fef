//! The crate docs' runnable examples, run as their docs say against real services: the
//! `square` worker of `leasehold-worker` completes a task with its own output, and two copies of
//! `leasehold`'s `hold_a_lease` share one lease, the second taking over when the first is
//! killed with SIGKILL. And `examples/`, the work in other languages: the exec handlers in
//! Python, Node and shell, and the push applications in Python and Node.
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
    // Another queue's task, due first: the example claims only from its own queue.
    let elsewhere = client
        .create(&CreateTask {
            task_data: json!({"n": 3}),
            priority: Some(100),
            ..CreateTask::default()
        })
        .await
        .unwrap()
        .into_task();
    let created = client
        .create(&CreateTask {
            task_data: json!({"n": 12}),
            queue: Some("square".to_owned()),
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
    let untouched = client.task(elsewhere.id).await.unwrap();
    assert_eq!(untouched.status, TaskStatus::Pending, "{untouched:?}");

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

/// `examples/` at the top of the repository: work in other languages, run by the bundled
/// worker as its docs say.
fn any_language(path: &str) -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/").to_owned() + path
}

/// The exec handlers in Python, Node and shell each complete a task with their own output, and
/// fail for good (exit 65) a task whose input is wrong.
#[tokio::test]
async fn the_exec_examples_in_python_node_and_shell_do_their_tasks() {
    let node = tests::tools::node().unwrap();
    let s = tests::Stack::start(&[]).await;
    let node = node.to_string_lossy().into_owned();
    let examples = [
        (
            "python",
            "python3",
            "exec/square.py",
            json!({"n": 7}),
            json!({"square": 49}),
        ),
        (
            "node",
            node.as_str(),
            "exec/square.mjs",
            json!({"n": 7}),
            json!({"square": 49}),
        ),
        (
            "sh",
            "sh",
            "exec/sleep.sh",
            json!({"sleep_duration_seconds": 0.1}),
            json!({"slept_seconds": 0.1, "by": "sh"}),
        ),
    ];
    for (queue, interpreter, script, data, output) in examples {
        let line = format!("{interpreter} {}", any_language(script));
        let _worker = Service::worker(
            &s.tasks.base_url(),
            &[("WORKER_EXEC", line.as_str()), ("WORKER_QUEUE", queue)],
        )
        .await;
        for (data, expected) in [(data, Some(output)), (json!({}), None)] {
            let done = run_example_task(&s, queue, data, expected.as_ref(), script).await;
            if expected.is_none() {
                assert!(
                    done["lastError"]
                        .as_str()
                        .unwrap()
                        .contains("must be a number"),
                    "{script}: stderr is the failure: {done}"
                );
            }
        }
    }
}

/// The push applications in Python and Node answer the worker's signed pushes, and refuse
/// pushes signed with another secret, which fails the task for good.
#[tokio::test]
async fn the_push_apps_in_python_and_node_check_the_signature_and_answer() {
    let node = tests::tools::node().unwrap();
    let s = tests::Stack::start(&[]).await;
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let node = node.to_string_lossy().into_owned();
    for (queue, interpreter, script) in [
        ("python", "python3", "push/app.py"),
        ("node", node.as_str(), "push/app.mjs"),
    ] {
        let port = tests::free_port();
        let mut app = Command::new(interpreter);
        app.arg(any_language(script))
            .arg(port.to_string())
            .env("PUSH_SECRET", secret)
            .stdout(Stdio::null());
        let _app = ChildGuard::spawn(app, Signal::SIGKILL).unwrap();
        eventually(Duration::from_secs(30), "the app to listen", || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        })
        .await;
        let url = format!("http://127.0.0.1:{port}/tasks");
        for (worker_secret, data, expected) in [
            (secret, json!({"n": 7}), Some(json!({"square": 49}))),
            (secret, json!({}), None),
            (
                "whsec_c2VjcmV0LW9mLWFub3RoZXItYXBwbGljYXRpb24=",
                json!({"n": 7}),
                None,
            ),
        ] {
            let worker = Service::worker(
                &s.tasks.base_url(),
                &[
                    ("WORKER_PUSH_URL", url.as_str()),
                    ("WORKER_PUSH_SECRET", worker_secret),
                    ("WORKER_QUEUE", queue),
                ],
            )
            .await;
            run_example_task(&s, queue, data, expected.as_ref(), script).await;
            drop(worker);
        }
    }
}

/// Creates a task of `data` in `queue` (two attempts) and waits for it to settle: succeeded with
/// `expected` as its output, or, with none expected, dead at its first attempt (a failure for
/// good is not retried). The task, for more checks.
async fn run_example_task(
    s: &tests::Stack,
    queue: &str,
    data: serde_json::Value,
    expected: Option<&serde_json::Value>,
    script: &str,
) -> serde_json::Value {
    let created = s
        .tasks
        .post(
            "/api/tasks",
            &json!({"task_data": data, "queue": queue, "max_attempts": 2}),
        )
        .await;
    let id = created.body["id"].as_i64().unwrap();
    let done = tests::work::settled(s, id).await;
    match expected {
        Some(output) => {
            assert_eq!(done["status"], "succeeded", "{script}: {done}");
            assert_eq!(&done["taskOutput"], output, "{script}");
        }
        None => {
            assert_eq!(done["status"], "dead", "{script}: {done}");
            assert_eq!(done["attempts"], 1, "{script}: not retried: {done}");
        }
    }
    done
}
