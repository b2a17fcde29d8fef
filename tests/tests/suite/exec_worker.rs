//! The worker's exec mode (`WORKER_EXEC`, `--exec -- CMD`): a real command per task, against
//! real lease-service and task-service processes. Its outcome by exit code (0, 75, 65, any
//! other, a signal) and the result file; JSON and text output, and output past the bound while
//! the command has not read its input yet; stderr in the failure message; the time limit; a
//! cancel that kills the command's whole process group; and a command that cannot start,
//! refused at startup.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::json;
use tests::work::{Scratch, cancel, create_once as create, gone, settled, snoozed_for, task};
use tests::{Service, binary, eventually};

tests::stack_with_helpers!(Stack);

/// The one command of these tests: what it does is chosen by the task's data, matched in the
/// task JSON it reads on stdin (serialised compactly, so `"exit":65` appears as written).
const SCRIPT: &str = r#"input=$(cat)
case "$input" in
  *'"do":"json"'*) echo "{\"id\": $LEASEHOLD_TASK_ID, \"queue\": \"$LEASEHOLD_QUEUE\", \"attempt\": $LEASEHOLD_ATTEMPT}" ;;
  *'"do":"text"'*) echo "plain text" ;;
  *'"do":"bad"'*) echo "the input was wrong" >&2; exit 65 ;;
  *'"do":"later"'*) echo '{"snooze_seconds": 30}' > "$LEASEHOLD_RESULT"; exit 75 ;;
  *'"do":"said"'*) echo '{"message": "from the result file"}' > "$LEASEHOLD_RESULT"; echo "not this" >&2; exit 3 ;;
  *'"do":"boom"'*) echo "first line" >&2; echo "boom at the end" >&2; exit 3 ;;
  *'"do":"noisy"'*) head -c 3000 /dev/zero | tr "\0" x >&2; echo >&2; echo "the real reason" >&2; exit 3 ;;
  *'"do":"signal"'*) kill -9 $$ ;;
  *'"do":"secret"'*) echo "\"${AUTH_TOKEN:-none}\"" ;;
  *'"do":"hang"'*) pidfile=$(echo "$input" | sed 's/.*"pidfile":"\([^"]*\)".*/\1/')
    trap 'echo TERM > "$pidfile.term"; exit 143' TERM
    sleep 300 & echo $! > "$pidfile"; wait ;;
esac"#;

async fn stack() -> tests::Stack {
    tests::Stack::start(&[("TASK_RETRY_BASE_SECONDS", "0.2")]).await
}

async fn exec_worker(stack: &tests::Stack, extra: &[(&str, &str)]) -> Service {
    let line = format!("sh -c '{}'", SCRIPT.replace('\'', r"'\''"));
    let mut env = vec![
        ("WORKER_EXEC", line.as_str()),
        ("HEARTBEAT_INTERVAL_SECONDS", "1"),
        ("WORKER_CONCURRENCY", "4"),
        ("AUTH_TOKEN", "a-secret-the-command-must-not-see"),
    ];
    env.extend_from_slice(extra);
    Service::worker(&stack.tasks.base_url(), &env).await
}

/// A task of `queue` whose command starts a child that sleeps for minutes and waits for it;
/// returns the task's id and, once the command has written it, the child's pid.
async fn hang(stack: &tests::Stack, queue: &str, scratch: &Scratch) -> (i64, i32) {
    let pidfile = scratch.0.join(format!("{queue}.pid"));
    let answer = stack
        .tasks
        .post(
            "/api/tasks",
            &json!({"task_data": {"do": "hang", "pidfile": pidfile}, "queue": queue, "max_attempts": 1}),
        )
        .await;
    assert_eq!(answer.status, 201, "{:?}", answer.body);
    let read = || {
        std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|pid| pid.trim().parse().ok())
    };
    eventually(
        Duration::from_secs(30),
        "the command's child to start",
        || async { read().is_some() },
    )
    .await;
    (answer.body["id"].as_i64().unwrap(), read().unwrap())
}

/// Whether the command of `hang(.., queue, scratch)` was sent SIGTERM (its trap writes a file)
/// rather than only killed.
fn was_asked_to_stop(scratch: &Scratch, queue: &str) -> bool {
    scratch.0.join(format!("{queue}.pid.term")).exists()
}

#[tokio::test]
async fn each_exit_code_class_has_its_outcome() {
    let s = stack().await;
    let worker = exec_worker(&s, &[]).await;

    let id = create(&s, json!({"do": "json"})).await;
    let done = settled(&s, id).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(
        done["taskOutput"],
        json!({"id": id, "queue": "default", "attempt": 1}),
        "the task's own environment"
    );

    let id = create(&s, json!({"do": "text"})).await;
    assert_eq!(settled(&s, id).await["taskOutput"], "plain text");

    let id = create(&s, json!({"do": "secret"})).await;
    assert_eq!(
        settled(&s, id).await["taskOutput"],
        "none",
        "the worker's token is not passed on"
    );

    let id = create(&s, json!({"do": "bad"})).await;
    let bad = settled(&s, id).await;
    assert_eq!(bad["status"], "dead", "{bad}");
    assert!(
        bad["lastError"]
            .as_str()
            .unwrap()
            .contains("the input was wrong"),
        "{bad}"
    );

    let id = create(&s, json!({"do": "boom"})).await;
    let boom = settled(&s, id).await;
    assert_eq!(boom["status"], "dead", "{boom}");
    assert!(
        boom["lastError"]
            .as_str()
            .unwrap()
            .ends_with("boom at the end"),
        "stderr's tail: {boom}"
    );

    // The result file's message comes before stderr's tail.
    let id = create(&s, json!({"do": "said"})).await;
    let said = settled(&s, id).await;
    let message = said["lastError"].as_str().unwrap();
    assert!(
        message.ends_with("from the result file") && !message.contains("not this"),
        "{said}"
    );

    // Past the 1,024 characters a failure's message keeps, the end of stderr is what is kept.
    let id = create(&s, json!({"do": "noisy"})).await;
    let noisy = settled(&s, id).await;
    assert!(
        noisy["lastError"]
            .as_str()
            .unwrap()
            .ends_with("the real reason"),
        "{noisy}"
    );

    let id = create(&s, json!({"do": "signal"})).await;
    let killed = settled(&s, id).await;
    assert!(
        killed["lastError"].as_str().unwrap().contains("SIGKILL"),
        "{killed}"
    );

    // 75: snoozed for the result file's 30 s, by the database's clock, attempt not charged.
    let id = create(&s, json!({"do": "later"})).await;
    let seconds = snoozed_for(&s, id).await;
    assert!((15.0..=30.5).contains(&seconds), "due in {seconds} s");
    drop(worker);
}

#[tokio::test]
async fn output_past_the_bound_is_cut_and_a_command_that_writes_before_reading_ends() {
    let s = stack().await;
    // 1 MiB on stdout before the 60 KiB task on stdin is read.
    let line = "sh -c 'head -c 1048576 /dev/zero | tr \"\\0\" a; cat > /dev/null'";
    let _worker = Service::worker(&s.tasks.base_url(), &[("WORKER_EXEC", line)]).await;
    let id = create(&s, json!({"padding": "x".repeat(60 * 1024)})).await;
    let done = settled(&s, id).await;
    assert_eq!(done["status"], "succeeded", "{}", done["lastError"]);
    assert_eq!(done["taskOutput"]["truncated"], true);
    let kept = done["taskOutput"]["stdout"].as_str().unwrap();
    assert!(kept.len() > 1000 && kept.chars().all(|c| c == 'a'));
}

#[tokio::test]
async fn a_cancel_or_the_time_limit_kills_the_whole_process_group() {
    let s = stack().await;
    let scratch = Scratch::new("cancel");
    let _worker = exec_worker(
        &s,
        &[
            ("WORKER_EXEC_KILL_GRACE_SECONDS", "1"),
            ("WORKER_QUEUE", "default"),
        ],
    )
    .await;
    let (id, child) = hang(&s, "default", &scratch).await;
    cancel(&s, id).await;
    eventually(
        Duration::from_secs(20),
        "the command's child killed",
        || async { gone(child) },
    )
    .await;
    assert_eq!(task(&s, id).await["status"], "cancelled");

    let _limited = exec_worker(
        &s,
        &[
            ("WORKER_EXEC_TIMEOUT_SECONDS", "1"),
            ("WORKER_QUEUE", "limited"),
        ],
    )
    .await;
    let (id, child) = hang(&s, "limited", &scratch).await;
    let timed_out = settled(&s, id).await;
    assert!(
        timed_out["lastError"]
            .as_str()
            .unwrap()
            .contains("timed out"),
        "{timed_out}\n{}",
        _limited.log_tail()
    );
    assert!(
        gone(child),
        "the command's child {child} outlived its time limit"
    );
}

#[tokio::test]
async fn a_command_that_cannot_start_stops_the_worker_at_startup() {
    let output = std::process::Command::new(binary("worker"))
        .env("TASK_SERVICE_URL", "http://127.0.0.1:9")
        .env("WORKER_EXEC", "no-such-command-of-leasehold --flag")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(said.contains("no-such-command-of-leasehold"), "{said}");
}

/// A shutdown whose grace runs out while a command runs stops the command's whole process
/// group, SIGTERM first, hands the task back rather than completing it, and exits 0.
#[tokio::test]
async fn a_shutdown_past_its_grace_stops_running_commands_and_hands_their_tasks_back() {
    let s = stack().await;
    let scratch = Scratch::new("stop");
    let mut worker = exec_worker(
        &s,
        &[
            ("SHUTDOWN_GRACE_SECONDS", "1"),
            ("WORKER_EXEC_KILL_GRACE_SECONDS", "1"),
        ],
    )
    .await;
    let (id, child) = hang(&s, "default", &scratch).await;
    let status = worker.terminate(Duration::from_secs(30)).await;
    assert_eq!(status, Some(0), "{}", worker.log_tail());
    assert!(
        gone(child),
        "the command's child {child} outlived the worker"
    );
    // The worker waited for its command to end, trap and all, before it exited.
    assert!(
        was_asked_to_stop(&scratch, "default"),
        "the command got SIGKILL without SIGTERM first\n{}",
        worker.log_tail()
    );
    let task = task(&s, id).await;
    assert_ne!(task["status"], "succeeded", "{task}");
    assert_ne!(task["status"], "running", "handed back: {task}");
}

/// An operator revokes the worker process's lease, which covers its task: the next heartbeat is
/// refused, the command's process group is sent SIGTERM and is gone, and the task is not
/// completed by it.
#[tokio::test]
async fn a_revoked_worker_lease_kills_the_command_and_completes_nothing() {
    let s = stack().await;
    let scratch = Scratch::new("revoke");
    let worker = exec_worker(&s, &[("WORKER_ID", "revoked")]).await;
    let (id, child) = hang(&s, "default", &scratch).await;
    tests::revoke_worker_lease(&s.leases, "revoked").await;
    eventually(
        Duration::from_secs(20),
        "the command's child killed",
        || async { gone(child) },
    )
    .await;
    // The command's trap runs, and the loss is logged, once the command has ended.
    eventually(
        Duration::from_secs(20),
        "the loss logged, after the command's SIGTERM",
        || async {
            worker.log_text().contains(&format!("lost task {id}"))
                && was_asked_to_stop(&scratch, "default")
        },
    )
    .await;
    assert_ne!(task(&s, id).await["status"], "succeeded");
}

/// `WORKER_EXEC_EXIT_CODES` remaps an exit code's outcome, as Kubernetes Jobs' `onExitCodes`
/// does: exit 3, a retry by default, fails for good, on its first of three attempts. And
/// `WORKER_EXEC_PASS_ENV` names a credential the operator does want the command to see.
#[tokio::test]
async fn a_remapped_exit_code_takes_its_new_outcome_and_a_named_secret_is_passed_on() {
    let s = stack().await;
    let _worker = exec_worker(
        &s,
        &[
            ("WORKER_EXEC_EXIT_CODES", "3=fail"),
            ("WORKER_EXEC_PASS_ENV", "AUTH_TOKEN"),
        ],
    )
    .await;
    let answer = s
        .tasks
        .post(
            "/api/tasks",
            &json!({"task_data": {"do": "boom"}, "max_attempts": 3}),
        )
        .await;
    let id = answer.body["id"].as_i64().unwrap();
    let done = settled(&s, id).await;
    assert_eq!(
        (done["status"].as_str(), done["attempts"].as_i64()),
        (Some("dead"), Some(1)),
        "{done}"
    );
    let id = create(&s, json!({"do": "secret"})).await;
    assert_eq!(
        settled(&s, id).await["taskOutput"],
        "a-secret-the-command-must-not-see",
        "named, the worker's token is passed on"
    );
}

/// Heartbeats go on while a command runs: one that runs three times its lease's length
/// succeeds, and was never taken from its worker (one claim, one attempt).
#[tokio::test]
async fn a_command_that_outlasts_its_lease_succeeds_on_heartbeats() {
    let s = tests::Stack::start(&[("TASK_LEASE_TTL_SECONDS", "2")]).await;
    let _worker = Service::worker(
        &s.tasks.base_url(),
        &[
            ("WORKER_EXEC", "sh -c 'cat > /dev/null; sleep 6; echo done'"),
            ("HEARTBEAT_INTERVAL_SECONDS", "0.5"),
        ],
    )
    .await;
    let id = create(&s, json!({})).await;
    let done = settled(&s, id).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["taskOutput"], "done");
    assert_eq!(done["attempts"], 1, "{done}");
}
