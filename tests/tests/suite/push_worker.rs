//! The worker's push mode (`WORKER_PUSH_URL`, `--push URL`): each task POSTed to a real HTTP
//! server (`tests/python/push_server.py`, standard library only), against real lease-service
//! and task-service processes. Each answer class's outcome; `Retry-After` in seconds and as an
//! HTTP-date; `traceparent` naming the worker's trace; the Standard Webhooks signature checked by Python's own hmac; a cancel and a
//! revoked worker lease, which close the request's connection as the server sees; a server down,
//! then back; a slow server past the time limit; and a URL refused at startup.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::json;
use tests::otlp::OtlpReceiver;
use tests::work::{Scratch, cancel, create_once as create, settled, snoozed_for, task};
use tests::{ChildGuard, Service, binary, eventually, free_port};

tests::stack_with_helpers!(Stack);

/// A key of 24 bytes in Standard Webhooks' form.
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

async fn stack() -> tests::Stack {
    tests::Stack::start(&[("TASK_RETRY_BASE_SECONDS", "0.2")]).await
}

/// The test server on `port`, writing its events to `events`, checking signatures with
/// `secret`; returns once it accepts connections.
async fn server(port: u16, events: &Path, secret: Option<&str>) -> ChildGuard {
    let mut command = Command::new("python3");
    command
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/python/push_server.py"
        ))
        .arg(port.to_string())
        .arg(events)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    if let Some(secret) = secret {
        command.env("PUSH_SECRET", secret);
    }
    let guard = ChildGuard::spawn(command, Signal::SIGKILL).unwrap();
    eventually(
        Duration::from_secs(30),
        "the push server to listen",
        || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        },
    )
    .await;
    guard
}

async fn push_worker(stack: &tests::Stack, port: u16, extra: &[(&str, &str)]) -> Service {
    let url = format!("http://127.0.0.1:{port}/work");
    let mut env = vec![
        ("WORKER_PUSH_URL", url.as_str()),
        ("WORKER_PUSH_SECRET", SECRET),
        ("HEARTBEAT_INTERVAL_SECONDS", "1"),
        ("WORKER_CONCURRENCY", "4"),
    ];
    env.extend_from_slice(extra);
    Service::worker(&stack.tasks.base_url(), &env).await
}

fn events(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Waits up to `seconds` until the server's events at `path` hold `line`, naming `what` if they
/// never do.
async fn seen(path: &Path, line: &str, seconds: u64, what: &str) {
    eventually(Duration::from_secs(seconds), what, || async {
        events(path).contains(line)
    })
    .await;
}

#[tokio::test]
async fn each_answer_class_has_its_outcome_and_every_push_is_signed() {
    let s = stack().await;
    let scratch = Scratch::new("push-classes");
    let log = scratch.0.join("events");
    let port = free_port();
    let _server = server(port, &log, Some(SECRET)).await;
    let traces = OtlpReceiver::start();
    let endpoint = traces.endpoint();
    let _worker = push_worker(
        &s,
        port,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
    .await;

    let id = create(&s, json!({"do": "json"})).await;
    let done = settled(&s, id).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    let mut seen = done["taskOutput"].clone();
    let traceparent = seen["traceparent"].take();
    assert_eq!(
        seen,
        json!({"id": id, "taskId": id.to_string(), "attempt": "1", "deadline": true,
               "traceparent": null}),
        "the body is the task, and the headers name it"
    );
    // `traceparent` names the worker's trace of the task, so the application's spans join it.
    let trace_id = traceparent
        .as_str()
        .unwrap()
        .split('-')
        .nth(1)
        .unwrap()
        .to_owned();
    eventually(
        Duration::from_secs(30),
        "the worker's span of the push",
        || async {
            traces
                .spans()
                .iter()
                .any(|span| span.service == "worker" && span.trace_id == trace_id)
        },
    )
    .await;

    let id = create(&s, json!({"do": "text"})).await;
    assert_eq!(settled(&s, id).await["taskOutput"], "plain text");

    let id = create(&s, json!({"do": "bad"})).await;
    let bad = settled(&s, id).await;
    assert_eq!(bad["status"], "dead", "another 4xx fails for good: {bad}");
    assert!(
        bad["lastError"]
            .as_str()
            .unwrap()
            .contains("the input was wrong"),
        "{bad}"
    );

    for what in ["broken", "busy"] {
        let id = s
            .tasks
            .post(
                "/api/tasks",
                &json!({"task_data": {"do": what}, "max_attempts": 2}),
            )
            .await
            .body["id"]
            .as_i64()
            .unwrap();
        eventually(Duration::from_secs(30), "two attempts", || async {
            task(&s, id).await["status"] == "dead"
        })
        .await;
        let t = task(&s, id).await;
        assert_eq!(t["attempts"], 2, "{what} is retried: {t}");
    }

    // 429 with `Retry-After: 30`, and 503 with an HTTP-date 45 s past the answer's `Date`:
    // snoozed that long by the database's clock, the attempt not charged.
    for (what, longest) in [("later", 30.5), ("later-date", 45.5)] {
        let id = create(&s, json!({"do": what})).await;
        let seconds = snoozed_for(&s, id).await;
        assert!(
            (longest - 15.5..=longest).contains(&seconds),
            "{what}: due in {seconds} s"
        );
    }

    let seen = events(&log);
    assert!(
        seen.contains("signed") && !seen.contains(" bad") && !seen.contains(" none"),
        "every push carried a signature Python's hmac accepts:\n{seen}"
    );
}

#[tokio::test]
async fn a_wrong_secret_is_refused_by_the_application_and_the_task_fails_for_good() {
    let s = stack().await;
    let scratch = Scratch::new("push-secret");
    let log = scratch.0.join("events");
    let port = free_port();
    let other = "whsec_c2VjcmV0LW9mLWFub3RoZXItYXBwbGljYXRpb24=";
    let _server = server(port, &log, Some(other)).await;
    let _worker = push_worker(&s, port, &[]).await;
    let id = create(&s, json!({"do": "json"})).await;
    let refused = settled(&s, id).await;
    assert_eq!(refused["status"], "dead", "{refused}");
    assert!(events(&log).contains(&format!("signed {id} bad")));
}

/// A cancel, and a revoked worker lease, each close the request's connection (the server sees
/// its client leave), and the task is not completed by the worker.
#[tokio::test]
async fn a_cancel_or_a_lost_lease_aborts_the_request_and_completes_nothing() {
    let s = stack().await;
    let scratch = Scratch::new("push-abort");
    let log = scratch.0.join("events");
    let port = free_port();
    let _server = server(port, &log, Some(SECRET)).await;
    let worker = push_worker(&s, port, &[("WORKER_ID", "pushing")]).await;

    let id = create(&s, json!({"do": "hang"})).await;
    seen(&log, &format!("signed {id} ok"), 30, "the push to arrive").await;
    cancel(&s, id).await;
    seen(
        &log,
        &format!("closed {id}"),
        20,
        "the server to see the worker hang up",
    )
    .await;
    assert_eq!(task(&s, id).await["status"], "cancelled");

    let id = create(&s, json!({"do": "hang"})).await;
    seen(&log, &format!("signed {id} ok"), 30, "the push to arrive").await;
    tests::revoke_worker_lease(&s.leases, "pushing").await;
    seen(
        &log,
        &format!("closed {id}"),
        20,
        "the server to see the worker hang up",
    )
    .await;
    eventually(Duration::from_secs(20), "the loss logged", || async {
        worker.log_text().contains(&format!("lost task {id}"))
    })
    .await;
    // The server answers a push it still holds after 25 s: no answer went to this worker.
    assert!(
        !events(&log).contains(&format!("answered {id}")),
        "{}",
        events(&log)
    );
    assert_ne!(task(&s, id).await["status"], "succeeded");
}

/// An endpoint that is down fails its tasks retryably, and they succeed once it is back; one
/// slower than `WORKER_PUSH_TIMEOUT_SECONDS` fails its attempt as timed out.
#[tokio::test]
async fn a_server_down_then_back_and_a_slow_one_past_the_time_limit() {
    let s = stack().await;
    let scratch = Scratch::new("push-down");
    let log = scratch.0.join("events");
    let port = free_port();
    let _worker = push_worker(&s, port, &[("WORKER_PUSH_TIMEOUT_SECONDS", "1")]).await;
    let id = s
        .tasks
        .post(
            "/api/tasks",
            &json!({"task_data": {"do": "json"}, "max_attempts": 25}),
        )
        .await
        .body["id"]
        .as_i64()
        .unwrap();
    eventually(Duration::from_secs(30), "a failed attempt", || async {
        task(&s, id).await["lastError"]
            .as_str()
            .is_some_and(|e| e.contains("no answer"))
    })
    .await;
    let _server = server(port, &log, Some(SECRET)).await;
    eventually(Duration::from_secs(60), "the task to succeed", || async {
        task(&s, id).await["status"] == "succeeded"
    })
    .await;

    let id = create(&s, json!({"do": "hang"})).await;
    let timed_out = settled(&s, id).await;
    assert_eq!(timed_out["status"], "dead", "{timed_out}");
    assert!(
        timed_out["lastError"]
            .as_str()
            .unwrap()
            .contains("timed out"),
        "{timed_out}"
    );
    seen(
        &log,
        &format!("closed {id}"),
        20,
        "the server to see the worker hang up",
    )
    .await;
}

#[tokio::test]
async fn a_url_or_secret_that_cannot_be_used_stops_the_worker_at_startup() {
    for (url, secret) in [
        ("not a url", None),
        ("https://example.com/work", None),
        ("http://127.0.0.1:9/work", Some("whsec_not base64!")),
    ] {
        let mut command = Command::new(binary("worker"));
        command
            .env("TASK_SERVICE_URL", "http://127.0.0.1:9")
            .env("WORKER_PUSH_URL", url);
        if let Some(secret) = secret {
            command.env("WORKER_PUSH_SECRET", secret);
        }
        let output = command.output().unwrap();
        assert_eq!(output.status.code(), Some(2), "{url}: {output:?}");
        let said = String::from_utf8_lossy(&output.stderr);
        assert!(
            said.contains(if secret.is_some() {
                "WORKER_PUSH_SECRET"
            } else {
                url
            }),
            "{said}"
        );
        assert!(
            !said.contains("not base64!"),
            "the secret is not echoed: {said}"
        );
    }
}
