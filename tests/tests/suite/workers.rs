//! Workers as real processes against real lease-service and task-service processes: throughput
//! with several workers, and the failure cases a lease exists for (kill -9, SIGSTOP past the
//! lease, a shared worker name, lease-service down, graceful shutdown).
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tests::{Service, eventually, metric_sum};

tests::stack_with_helpers!(Stack);

/// lease-service and task-service with a short task lease, so that faults resolve quickly.
async fn stack(lease_ttl: &str) -> Stack {
    Stack(
        tests::Stack::start(&[
            ("TASK_LEASE_TTL_SECONDS", lease_ttl),
            ("TASK_RETRY_BASE_SECONDS", "0.2"),
        ])
        .await,
    )
}

impl Stack {
    /// A worker that heartbeats four times per lease of the stack's (the lease's length itself
    /// comes with each claim answer).
    async fn worker(&self, id: &str, lease_ttl: &str, extra: &[(&str, &str)]) -> Service {
        let heartbeat = format!("{}", lease_ttl.parse::<f64>().unwrap() / 4.0);
        let mut env = vec![
            ("WORKER_ID", id),
            ("HEARTBEAT_INTERVAL_SECONDS", heartbeat.as_str()),
            ("POLL_MIN_MS", "20"),
            ("POLL_MAX_MS", "200"),
        ];
        env.extend_from_slice(extra);
        Service::worker(&self.tasks.base_url(), &env).await
    }

    async fn create(&self, task_data: Value) -> i64 {
        let answer = self
            .tasks
            .post("/api/tasks", &json!({ "task_data": task_data }))
            .await;
        assert_eq!(answer.status, 201, "{:?}", answer.body);
        answer.body["id"].as_i64().unwrap()
    }

    async fn task(&self, id: i64) -> Value {
        self.tasks.get(&format!("/api/tasks/{id}")).await.body["task"].clone()
    }

    async fn counts(&self) -> Value {
        self.tasks.get("/api/tasks/counts").await.body["total"].clone()
    }

    /// `tasks_completed_total` summed over queues: accepted completions.
    async fn accepted_completions(&self) -> u64 {
        let total = metric_sum(&self.tasks.metrics().await, "tasks_completed_total{");
        total as u64
    }
}

#[tokio::test]
async fn a_thousand_tasks_three_workers_every_task_succeeds_once() {
    let s = stack("10").await;
    for batch in 0..10 {
        let creates = (0..100).map(|i| {
            let tasks = &s.tasks;
            async move {
                let body =
                    json!({"task_data": {"sleep_duration_seconds": 0, "n": batch * 100 + i}});
                assert_eq!(tasks.post("/api/tasks", &body).await.status, 201);
            }
        });
        futures_util::future::join_all(creates).await;
    }
    let _one = s.worker("solo", "10", &[("WORKER_CONCURRENCY", "1")]).await;
    let _four = s.worker("quad", "10", &[("WORKER_CONCURRENCY", "4")]).await;
    let _eight = s.worker("octo", "10", &[("WORKER_CONCURRENCY", "8")]).await;
    eventually(Duration::from_secs(240), "1000 succeeded tasks", || async {
        s.counts().await["succeeded"] == 1000
    })
    .await;
    assert_eq!(
        s.accepted_completions().await,
        1000,
        "one accepted completion per task"
    );
    let processors: std::collections::HashSet<String> = {
        let mut seen = std::collections::HashSet::new();
        let mut cursor = String::new();
        loop {
            let page = s
                .tasks
                .get(&format!("/api/tasks?limit=1000&cursor={cursor}"))
                .await;
            for task in page.body["tasks"].as_array().unwrap() {
                assert_eq!(task["attempts"], 1, "{task}");
                seen.insert(task["processor"].as_str().unwrap().to_owned());
            }
            match page.headers.get("x-next-cursor") {
                Some(next) => cursor = next.to_str().unwrap().to_owned(),
                None => break,
            }
        }
        seen
    };
    assert_eq!(
        processors.len(),
        3,
        "all three workers took part: {processors:?}"
    );
}

#[tokio::test]
async fn a_task_whose_worker_is_killed_is_completed_by_another_after_its_lease_expires() {
    let s = stack("2").await;
    let id = s.create(json!({"sleep_duration_seconds": 3})).await;
    let mut doomed = s.worker("doomed", "2", &[]).await;
    eventually(Duration::from_secs(10), "the first claim", || async {
        s.task(id).await["processor"] == "doomed"
    })
    .await;
    doomed.kill();
    let _rescuer = s.worker("rescuer", "2", &[]).await;
    eventually(Duration::from_secs(20), "the rescue", || async {
        s.task(id).await["status"] == "succeeded"
    })
    .await;
    let task = s.task(id).await;
    assert_eq!(task["processor"], "rescuer");
    assert_eq!(task["attempts"], 2, "two claims: {task}");
    assert_eq!(s.accepted_completions().await, 1);
}

/// Seed 004's ownership race: a paused worker wakes up after its task moved on.
async fn paused_worker_race(first: &str, second: &str) {
    let s = stack("2").await;
    let id = s.create(json!({"sleep_duration_seconds": 4})).await;
    // At debug level a worker logs each task it claims and completes.
    let sleeper = s
        .worker(first, "2", &[("RUST_LOG", "info,leasehold_worker=debug")])
        .await;
    eventually(Duration::from_secs(10), "the first claim", || async {
        s.task(id).await["status"] == "running"
    })
    .await;
    let first_fence = s.task(id).await["fence"].as_i64().unwrap();
    sleeper.pause();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let second_worker = s.worker(second, "2", &[]).await;
    eventually(Duration::from_secs(10), "the second claim", || async {
        s.task(id).await["fence"].as_i64().unwrap() > first_fence
    })
    .await;
    // The first worker wakes while the second still works; its heartbeat and completion are
    // refused, and it must not complete.
    sleeper.resume();
    eventually(Duration::from_secs(20), "the second completion", || async {
        s.task(id).await["status"] == "succeeded"
    })
    .await;
    // Judge once the first worker has had its say: it gives the task up when its heartbeat or
    // completion is refused.
    eventually(
        Duration::from_secs(20),
        "the first worker giving up",
        || async { sleeper.log_text().contains(&format!("lost task {id}")) },
    )
    .await;
    let task = s.task(id).await;
    assert_eq!(task["processor"], second);
    assert!(task["fence"].as_i64().unwrap() > first_fence, "{task}");
    assert_eq!(task["attempts"], 2);
    assert_eq!(
        s.accepted_completions().await,
        1,
        "exactly one completion accepted"
    );
    let log = sleeper.log_text();
    assert!(!log.contains(&format!("completed task {id}")), "{log}");
    drop(second_worker);
}

#[tokio::test]
async fn a_worker_paused_past_its_lease_is_refused_after_another_completes_the_task() {
    paused_worker_race("sleeper", "successor").await;
}

#[tokio::test]
async fn two_workers_with_the_same_name_cannot_both_complete_a_task() {
    paused_worker_race("twin", "twin").await;
}

#[tokio::test]
async fn a_task_that_always_fails_ends_dead_after_its_attempts_with_backoff() {
    let s = stack("5").await;
    let answer = s
        .tasks
        .post(
            "/api/tasks",
            &json!({"task_data": {"sleep_duration_seconds": 0, "fail": "always"}, "max_attempts": 3}),
        )
        .await;
    let id = answer.body["id"].as_i64().unwrap();
    let started = Instant::now();
    let _worker = s.worker("w", "5", &[]).await;
    eventually(Duration::from_secs(30), "a dead task", || async {
        s.task(id).await["status"] == "dead"
    })
    .await;
    let task = s.task(id).await;
    assert_eq!(task["attempts"], 3);
    assert!(
        task["lastError"].as_str().unwrap().contains("always"),
        "{task}"
    );
    // Backoff of 0.1–0.2 s then 0.2–0.4 s between the three attempts.
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn cancelling_a_running_task_stops_its_worker() {
    let s = stack("4").await;
    let id = s.create(json!({"sleep_duration_seconds": 30})).await;
    let _worker = s.worker("w", "4", &[]).await;
    eventually(Duration::from_secs(10), "the claim", || async {
        s.task(id).await["status"] == "running"
    })
    .await;
    let cancel = s
        .tasks
        .post(&format!("/api/tasks/{id}/cancel"), &json!({}))
        .await;
    assert_eq!(cancel.status, 202);
    eventually(Duration::from_secs(5), "the cancellation", || async {
        s.task(id).await["status"] == "cancelled"
    })
    .await;
    // The worker is free again: a new task gets done.
    let next = s.create(json!({"sleep_duration_seconds": 0})).await;
    eventually(Duration::from_secs(10), "the next task", || async {
        s.task(next).await["status"] == "succeeded"
    })
    .await;
}

#[tokio::test]
async fn lease_service_down_longer_than_a_ttl_loses_no_task_and_doubles_none() {
    let mut s = stack("2").await;
    for i in 0..60 {
        s.create(json!({"sleep_duration_seconds": 0.2, "n": i}))
            .await;
    }
    let _a = s.worker("a", "2", &[("WORKER_CONCURRENCY", "2")]).await;
    let _b = s.worker("b", "2", &[("WORKER_CONCURRENCY", "2")]).await;
    let _c = s.worker("c", "2", &[("WORKER_CONCURRENCY", "2")]).await;
    eventually(Duration::from_secs(30), "some progress", || async {
        s.counts().await["succeeded"].as_i64().unwrap() >= 10
    })
    .await;
    s.leases.kill();
    let claim = s
        .tasks
        .post("/api/tasks/next", &json!({"processor": "probe"}))
        .await;
    assert_eq!((claim.status, claim.code()), (503, "unavailable"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    s.leases.start_again().await;
    eventually(Duration::from_secs(60), "every task done", || async {
        s.counts().await["succeeded"] == 60
    })
    .await;
    assert_eq!(
        s.accepted_completions().await,
        60,
        "no task completed twice"
    );
}

#[tokio::test]
async fn sigterm_hands_unfinished_work_back_and_exits_zero() {
    let s = stack("10").await;
    let long = s.create(json!({"sleep_duration_seconds": 60})).await;
    let short = s.create(json!({"sleep_duration_seconds": 0.5})).await;
    let mut worker = s
        .worker(
            "leaving",
            "10",
            &[("WORKER_CONCURRENCY", "2"), ("SHUTDOWN_GRACE_SECONDS", "2")],
        )
        .await;
    eventually(Duration::from_secs(10), "both claimed", || async {
        s.task(long).await["status"] == "running" && s.task(short).await["status"] != "pending"
    })
    .await;
    let stopping = Instant::now();
    assert_eq!(worker.terminate(Duration::from_secs(10)).await, Some(0));
    assert!(stopping.elapsed() < Duration::from_secs(6));
    assert_eq!(
        s.task(short).await["status"],
        "succeeded",
        "finished within the grace period"
    );
    let handed_back = s.task(long).await;
    assert_eq!(handed_back["status"], "pending", "{handed_back}");
    assert_eq!(handed_back["attempts"], 0, "the attempt is not charged");
    let claim = s
        .tasks
        .post("/api/tasks/next", &json!({"processor": "next"}))
        .await;
    assert_eq!(claim.body["id"].as_i64(), Some(long), "claimable at once");
}

/// Under load a worker claims ahead (`WORKER_PREFETCH`): a task claimed ahead is heartbeaten
/// from its claim, so it stays the worker's however long the slot stays busy (longer than a
/// lease here), and starts when the slot frees; at a stop, the one not started goes back at
/// once, its attempt not charged, while the one at work finishes within the grace period.
#[tokio::test]
async fn tasks_claimed_ahead_are_kept_until_started_and_go_back_unstarted_at_a_stop() {
    let s = stack("2").await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(s.create(json!({"sleep_duration_seconds": 3})).await);
    }
    let [first, second, third] = [ids[0], ids[1], ids[2]];
    let mut worker = s
        .worker(
            "ahead",
            "2",
            &[
                ("WORKER_CONCURRENCY", "1"),
                ("WORKER_PREFETCH", "1"),
                ("SHUTDOWN_GRACE_SECONDS", "10"),
            ],
        )
        .await;
    eventually(
        Duration::from_secs(10),
        "one at work, one claimed ahead",
        || async {
            s.task(first).await["status"] == "running"
                && s.task(second).await["status"] == "running"
        },
    )
    .await;
    // The first takes 3 s, longer than a 2 s lease: the second, claimed ahead, must be kept
    // by its heartbeats meanwhile; the third is claimed ahead once the first is done.
    eventually(
        Duration::from_secs(15),
        "the first done, the third claimed",
        || async {
            s.task(first).await["status"] == "succeeded"
                && s.task(third).await["status"] == "running"
        },
    )
    .await;
    let kept = s.task(second).await;
    assert_eq!(
        (kept["status"].as_str(), kept["fence"].as_i64()),
        (Some("running"), Some(1)),
        "the task claimed ahead was never taken over: {kept}"
    );
    assert_eq!(worker.terminate(Duration::from_secs(15)).await, Some(0));
    let done = s.task(second).await;
    assert_eq!(
        (
            done["status"].as_str(),
            done["attempts"].as_i64(),
            done["fence"].as_i64()
        ),
        (Some("succeeded"), Some(1), Some(1)),
        "the task at work finished within the grace period, claimed once: {done}"
    );
    let back = s.task(third).await;
    assert_eq!(back["status"], "pending", "{back}");
    assert_eq!(back["attempts"], 0, "the attempt is not charged: {back}");
    assert!(
        worker
            .log_text()
            .contains(&format!("handed back task {third}")),
        "{}",
        worker.log_tail()
    );
}

/// A stop does not wait out a claim waiting in task-service (up to `CLAIM_WAIT_MS`, here the
/// 30 s maximum, which held every Ctrl-C for seconds): the worker abandons it and exits, the
/// wait ends taking nothing, and a task created then waits, uncharged, for the next worker.
#[tokio::test]
async fn a_stop_abandons_a_waiting_claim_and_the_task_goes_to_the_next_worker() {
    let s = stack("10").await;
    let mut worker = s
        .worker(
            "stopping",
            "10",
            &[("WORKER_CONCURRENCY", "1"), ("CLAIM_WAIT_MS", "30000")],
        )
        .await;
    let waiting = || async { metric_sum(&s.tasks.metrics().await, "task_claims_waiting") };
    eventually(
        Duration::from_secs(10),
        "the worker's claim to wait",
        || async { waiting().await >= 1.0 },
    )
    .await;
    // Well inside the claim's 30 s wait: a worker that waited it out fails here.
    let status = worker.terminate(Duration::from_secs(20)).await;
    assert_eq!(status, Some(0), "{}", worker.log_tail());
    assert!(
        worker.log_text().contains("abandoning the waiting claim"),
        "{}",
        worker.log_tail()
    );
    eventually(
        Duration::from_secs(10),
        "task-service to end the wait",
        || async { waiting().await < 1.0 },
    )
    .await;
    let id = s.create(json!({"sleep_duration_seconds": 0.2})).await;
    let task = s.task(id).await;
    assert_eq!(
        (task["status"].as_str(), task["attempts"].as_i64()),
        (Some("pending"), Some(0)),
        "{task}"
    );
    let _next = s.worker("next", "10", &[]).await;
    eventually(
        Duration::from_secs(30),
        "the next worker to run it",
        || async { s.task(id).await["status"] == "succeeded" },
    )
    .await;
    let task = s.task(id).await;
    assert_eq!(
        (task["attempts"].as_i64(), task["processor"].as_str()),
        (Some(1), Some("next")),
        "{task}"
    );
}

#[tokio::test]
async fn a_chaos_crash_kills_the_worker_mid_task_and_the_task_survives() {
    use std::os::unix::process::ExitStatusExt;
    let s = stack("2").await;
    // The worker starts before the task exists: it would otherwise claim and crash before
    // its first health check answered, and the start-up would look like a failure.
    let mut crasher = s
        .worker("crasher", "2", &[("CHAOS_CRASH_PROBABILITY", "1")])
        .await;
    let id = s.create(json!({"sleep_duration_seconds": 1})).await;
    let status = crasher
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("the chaos crash");
    assert_eq!(status.signal(), Some(9), "{status:?}");
    let task = s.task(id).await;
    assert_eq!(
        (task["status"].as_str(), task["processor"].as_str()),
        (Some("running"), Some("crasher"))
    );
    let _steady = s.worker("steady", "2", &[]).await;
    eventually(
        Duration::from_secs(15),
        "the task done by another",
        || async { s.task(id).await["status"] == "succeeded" },
    )
    .await;
    assert_eq!(s.task(id).await["attempts"], 2);
}

#[tokio::test]
async fn a_worker_whose_heartbeats_stall_gives_its_task_up_and_never_completes_it() {
    let s = stack("2").await;
    let answer = s
        .tasks
        .post(
            "/api/tasks",
            &json!({"task_data": {"sleep_duration_seconds": 4}, "max_attempts": 2}),
        )
        .await;
    let id = answer.body["id"].as_i64().unwrap();
    let stalled = s
        .worker(
            "stalled",
            "2",
            &[
                ("CHAOS_HEARTBEAT_PAUSE_PROBABILITY", "1"),
                ("CHAOS_HEARTBEAT_PAUSE_SECONDS", "30"),
            ],
        )
        .await;
    eventually(
        Duration::from_secs(30),
        "the task to die of its attempts, each given up",
        || async { s.task(id).await["status"] == "dead" },
    )
    .await;
    // Each time, the worker gave the task up when no heartbeat was confirmed in time, and
    // handed it back as a failure: its process's lease, which covers the task, was alive, so
    // nobody else could have taken it until the process ended.
    let task = s.task(id).await;
    assert!(
        task["lastError"]
            .as_str()
            .unwrap()
            .contains("the worker gave the task up"),
        "{task}"
    );
    assert_eq!(s.accepted_completions().await, 0);
    assert!(
        stalled.log_text().contains(&format!("lost task {id}")),
        "{}",
        stalled.log_tail()
    );
}

#[tokio::test]
async fn a_dead_task_service_url_is_skipped_and_the_log_names_each_task() {
    let s = stack("5").await;
    let id = s.create(json!({"sleep_duration_seconds": 0})).await;
    let urls = format!(
        "http://127.0.0.1:{},{}",
        tests::free_port(),
        s.tasks.base_url()
    );
    let worker = Service::worker(
        &urls,
        &[
            ("WORKER_ID", "w"),
            ("HEARTBEAT_INTERVAL_SECONDS", "1"),
            ("POLL_MAX_MS", "200"),
            // Each task's claim and completion are logged at debug level.
            ("RUST_LOG", "info,leasehold_worker=debug"),
        ],
    )
    .await;
    eventually(Duration::from_secs(15), "the task done", || async {
        s.task(id).await["status"] == "succeeded"
    })
    .await;
    // The worker logs the completion once task-service has answered, after the task changed.
    eventually(Duration::from_secs(15), "the completion logged", || async {
        worker.log_text().contains(&format!("completed task {id}"))
    })
    .await;
    let log = worker.log_text();
    assert!(log.contains(&format!("claimed task {id}")), "{log}");
}

#[tokio::test]
async fn completions_ready_together_travel_in_one_request_and_each_counts_once() {
    let s = stack("10").await;
    let creates = (0..300).map(|i| {
        let tasks = &s.tasks;
        async move {
            let body = json!({"task_data": {"sleep_duration_seconds": 0, "n": i}});
            assert_eq!(tasks.post("/api/tasks", &body).await.status, 201);
        }
    });
    futures_util::future::join_all(creates).await;
    let _wide = s
        .worker("wide", "10", &[("WORKER_CONCURRENCY", "32")])
        .await;
    eventually(Duration::from_secs(60), "300 succeeded tasks", || async {
        s.counts().await["succeeded"] == 300
    })
    .await;
    assert_eq!(s.accepted_completions().await, 300);
    let metrics = s.tasks.metrics().await;
    let batches: u64 = metrics
        .lines()
        .filter(|l| {
            l.starts_with("http_requests_total{")
                && l.contains("route=\"/api/tasks/complete\"")
                && l.contains("status=\"200\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    let singles: u64 = metrics
        .lines()
        .filter(|l| {
            l.starts_with("http_requests_total{")
                && l.contains("route=\"/api/tasks/{id}/complete\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(batches > 0, "no batched completion:\n{metrics}");
    assert!(
        batches + singles < 300,
        "{batches} batches and {singles} single completions for 300 tasks"
    );
}

/// The lease's length is task-service's alone: claim and heartbeat answers carry it, and the
/// worker, which has no TTL setting, heartbeats by it. With 2 s task leases and the sample's
/// 15 s heartbeat interval, a 5 s task is heartbeaten every half TTL and succeeds on its first
/// attempt. A worker counting a 30 s lease of its own would beat too late: the lease would lapse,
/// the task be claimed again, and the first run's completion be refused.
#[tokio::test]
async fn the_worker_keeps_the_lease_task_service_gives() {
    let s = stack("2").await;
    let probe = s.create(json!({"sleep_duration_seconds": 0})).await;
    let claimed = s
        .tasks
        .post("/api/tasks/next", &json!({"processor": "probe"}))
        .await;
    assert_eq!(claimed.body["id"], probe, "{:?}", claimed.body);
    assert_eq!(claimed.body["leaseTtlMs"], 2_000, "{:?}", claimed.body);
    let fence = claimed.body["fence"].clone();
    let beat = s
        .tasks
        .put(
            &format!("/api/tasks/{probe}/heartbeat"),
            &json!({"processor": "probe", "fence": fence}),
        )
        .await;
    assert_eq!(beat.status, 202, "{:?}", beat.body);
    let beaten = beat.body.get("task").unwrap_or(&beat.body);
    assert_eq!(beaten["leaseTtlMs"], 2_000, "{:?}", beat.body);
    // Other answers do not carry it: it is a claim's and a heartbeat's.
    assert!(s.task(probe).await.get("leaseTtlMs").is_none());
    let done = s
        .tasks
        .put(
            &format!("/api/tasks/{probe}/complete"),
            &json!({"processor": "probe", "fence": fence, "task_output": {}}),
        )
        .await;
    assert_eq!(done.status, 202, "{:?}", done.body);

    let id = s.create(json!({"sleep_duration_seconds": 5})).await;
    let _worker = Service::worker(
        &s.tasks.base_url(),
        &[("WORKER_ID", "sample-paced"), ("POLL_MAX_MS", "200")],
    )
    .await;
    eventually(Duration::from_secs(60), "the 5 s task to end", || async {
        let status = s.task(id).await["status"].clone();
        status == "succeeded" || status == "dead"
    })
    .await;
    let task = s.task(id).await;
    assert_eq!(task["status"], "succeeded", "{task}");
    assert_eq!(
        task["attempts"], 1,
        "the lease lapsed under the worker: {task}"
    );
}

/// One rule for names: a queue name task-service accepts (here, a name of spaces) is one the
/// worker accepts as its `WORKER_QUEUE`, and works from. The worker had a rule of its own, which
/// refused at startup what task-service would have served.
#[tokio::test]
async fn a_queue_name_task_service_accepts_is_one_the_worker_accepts() {
    let s = stack("10").await;
    let queue = "   ";
    let created = s
        .tasks
        .post(
            "/api/tasks",
            &json!({"task_data": {"sleep_duration_seconds": 0}, "queue": queue}),
        )
        .await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    let id = created.body["id"].as_i64().unwrap();
    let _worker = s.worker("spaces", "10", &[("WORKER_QUEUE", queue)]).await;
    eventually(Duration::from_secs(30), "the task done", || async {
        s.task(id).await["status"] == "succeeded"
    })
    .await;
}

/// A worker beating twice a second keeps a task past its first heartbeat. That heartbeat
/// confirms the task for what is left of the process's lease (2 s, three beats rounded up),
/// and the deadline's margin was sized for the claim's 30 s TTL (2 s), so the deadline fell
/// before the confirmation and every task was given up half a second in.
#[tokio::test]
async fn a_worker_beating_twice_a_second_keeps_its_task_past_the_first_heartbeat() {
    let s = Stack(tests::Stack::start(&[]).await);
    let _worker = Service::worker(
        &s.tasks.base_url(),
        &[
            ("HEARTBEAT_INTERVAL_SECONDS", "0.5"),
            ("WORKER_ID", "quick"),
        ],
    )
    .await;
    let id = s.create(json!({"sleep_duration_seconds": 2})).await;
    eventually(Duration::from_secs(30), "the task finished", || async {
        matches!(
            s.task(id).await["status"].as_str(),
            Some("succeeded" | "dead")
        ) || s.task(id).await["lastError"].is_string()
    })
    .await;
    let task = s.task(id).await;
    assert_eq!(
        (task["status"].as_str(), task["attempts"].as_i64()),
        (Some("succeeded"), Some(1)),
        "{task}"
    );
}
