//! Worker processes as operators see them (`GET /api/workers`): each live process known by its
//! liveness lease `worker:<id>`, with what it says about itself; one that dies shown as lost
//! once its lease lapses; one that stops shown as stopped at once. Real processes throughout.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::{Value, json};
use tests::{Service, binary, eventually, fresh_database};

const WORKER: &str = "worker-token-0123456789";
const OPERATOR: &str = "operator-token-0123456789";

async fn workers(tasks: &Service) -> Vec<Value> {
    let answer = tasks.get("/api/workers").await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    answer.body["workers"].as_array().unwrap().clone()
}

async fn worker(tasks: &Service, id: &str) -> Option<Value> {
    workers(tasks).await.into_iter().find(|w| w["id"] == id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_processes_are_listed_and_dead_ones_shown_gone() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let tokens = format!("worker:{WORKER},producer+operator:{OPERATOR}");
    let tasks = Service::task_service(
        &task_db,
        &leases.base_url(),
        &[("AUTH_TOKENS", tokens.as_str())],
    )
    .await;
    // Beats every second, so a process that stops beating is lost after three.
    let start = |id: &'static str, queue: &'static str, slots: &'static str| {
        let url = tasks.base_url();
        async move {
            Service::worker(
                &url,
                &[
                    ("AUTH_TOKEN", WORKER),
                    ("WORKER_ID", id),
                    ("WORKER_QUEUE", queue),
                    ("WORKER_CONCURRENCY", slots),
                    ("HEARTBEAT_INTERVAL_SECONDS", "1"),
                ],
            )
            .await
        }
    };
    let mut busy = start("w-busy", "slow", "3").await;
    let mut doomed = start("w-doomed", "other", "2").await;

    // Both idle processes are listed, alive, with what they said about themselves.
    eventually(Duration::from_secs(20), "both workers listed", || async {
        let listed = workers(&tasks).await;
        listed.len() == 2 && listed.iter().all(|w| w["liveness"] == "alive")
    })
    .await;
    let w = worker(&tasks, "w-busy").await.unwrap();
    assert_eq!(w["info"]["queue"], "slow", "{w}");
    assert_eq!(w["info"]["concurrency"], 3, "{w}");
    assert_eq!(w["info"]["busy"], 0, "{w}");
    assert!(
        w["info"]["host"].as_str().is_some_and(|h| !h.is_empty()),
        "{w}"
    );
    assert!(w["info"]["version"].is_string(), "{w}");
    assert!(w["since"].is_string() && w["lastBeatAt"].is_string(), "{w}");
    // The CLI lists the same.
    let cli = |args: &[&str]| {
        std::process::Command::new(binary("leasehold"))
            .args(args)
            .env("TASK_SERVICE_URL", tasks.base_url())
            .output()
            .unwrap()
    };
    let table = cli(&["workers", "list", "-o", "wide"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(table.status.success(), "{table:?}");
    assert!(
        text.lines()
            .next()
            .is_some_and(|h| h.contains("BUSY") && h.contains("VERSION")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("w-busy") && l.contains("alive") && l.contains("0/3")),
        "{text}"
    );
    let json: Value =
        serde_json::from_slice(&cli(&["workers", "list", "-o", "json"]).stdout).unwrap();
    assert_eq!(json["workers"].as_array().map(Vec::len), Some(2), "{json}");

    // A task in flight shows as a busy slot, and once done, as done.
    let created = tasks
        .send_as(
            Some(OPERATOR),
            "POST",
            "/api/tasks",
            Some(&json!({"task_data": {"sleep_duration_seconds": 3}, "queue": "slow"})),
        )
        .await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    eventually(Duration::from_secs(20), "a busy slot reported", || async {
        worker(&tasks, "w-busy").await.unwrap()["info"]["busy"] == 1
    })
    .await;
    eventually(
        Duration::from_secs(30),
        "the task reported done",
        || async {
            let w = worker(&tasks, "w-busy").await.unwrap();
            w["info"]["busy"] == 0 && w["info"]["done"] == 1
        },
    )
    .await;

    // kill -9: no goodbye. First late, with its lease still live, once half its TTL passed
    // without a beat (a stack restarted after a kill showed its dead processes alive until
    // their leases ran out); then lost once its lease lapses, still showing its host.
    doomed.kill();
    eventually(
        Duration::from_secs(20),
        "the killed worker late",
        || async {
            let w = worker(&tasks, "w-doomed").await.unwrap();
            w["liveness"] == "late" || w["liveness"] == "lost"
        },
    )
    .await;
    let late = worker(&tasks, "w-doomed").await.unwrap();
    assert_eq!(late["liveness"], "late", "seen late before lost: {late}");
    let listed = workers(&tasks).await;
    assert_eq!(
        (&listed[0]["id"], &listed[1]["id"]),
        (&json!("w-busy"), &json!("w-doomed")),
        "live ones first, late ones among them: {listed:?}"
    );
    let text = String::from_utf8_lossy(&cli(&["workers", "list"]).stdout).into_owned();
    assert!(
        text.lines()
            .any(|l| l.starts_with("w-doomed") && l.contains("late")),
        "{text}"
    );
    eventually(
        Duration::from_secs(20),
        "the killed worker lost",
        || async { worker(&tasks, "w-doomed").await.unwrap()["liveness"] == "lost" },
    )
    .await;
    let lost = worker(&tasks, "w-doomed").await.unwrap();
    assert_eq!(lost["info"]["concurrency"], 2, "{lost}");
    let listed = workers(&tasks).await;
    assert_eq!(listed[0]["id"], "w-busy", "live ones first: {listed:?}");

    // SIGTERM: the process says it stops, and shows as stopped at once, long before a lapse
    // would show it (its lease is 3 s; the release is what the test waits for).
    busy.terminate(Duration::from_secs(20)).await;
    let stopped = worker(&tasks, "w-busy").await.unwrap();
    assert_eq!(stopped["liveness"], "stopped", "{stopped}");

    // A process started again under the same id is alive again.
    let _again = start("w-busy", "slow", "3").await;
    eventually(
        Duration::from_secs(20),
        "the restarted worker alive",
        || async { worker(&tasks, "w-busy").await.unwrap()["liveness"] == "alive" },
    )
    .await;
    // Another process under a live one's id is refused, and the live one keeps its lease and
    // what it said.
    let impostor = tasks
        .send_as(
            Some(WORKER),
            "PUT",
            "/api/workers/w-busy",
            Some(&json!({"instance": "someone-else", "ttl_seconds": 10,
                         "info": {"host": "elsewhere", "version": "1", "concurrency": 1,
                                  "busy": 0, "done": 0}})),
        )
        .await;
    assert_eq!(
        (impostor.status, impostor.code()),
        (409, "worker_id_in_use"),
        "{:?}",
        impostor.body
    );
    let kept = worker(&tasks, "w-busy").await.unwrap();
    assert_ne!(kept["info"]["host"], "elsewhere", "{kept}");
    // A goodbye for a lease that already ended (the process was paused past its TTL) is no
    // error: the process is gone either way. From anyone but its holder it is refused.
    let info = json!({"host": "h", "version": "1", "concurrency": 1, "busy": 0, "done": 0});
    let taken = tasks
        .send_as(
            Some(WORKER),
            "PUT",
            "/api/workers/paused",
            Some(&json!({"instance": "p-1", "ttl_seconds": 1, "info": info})),
        )
        .await;
    assert_eq!(taken.status, 200, "{:?}", taken.body);
    let fence = taken.body["fence"].clone();
    eventually(
        Duration::from_secs(20),
        "the paused worker lost",
        || async { worker(&tasks, "paused").await.unwrap()["liveness"] == "lost" },
    )
    .await;
    let goodbye = |instance: &'static str| {
        let body = json!({"instance": instance, "fence": fence.clone()});
        let tasks = &tasks;
        async move {
            tasks
                .send_as(Some(WORKER), "DELETE", "/api/workers/paused", Some(&body))
                .await
        }
    };
    let stranger = goodbye("p-2").await;
    assert_eq!(
        (stranger.status, stranger.code()),
        (409, "not_holder"),
        "{:?}",
        stranger.body
    );
    let late = goodbye("p-1").await;
    assert_eq!(late.status, 204, "{:?}", late.body);

    // Beats need the worker role, and bad beats are refused without writing anything: no
    // lease for the id they name. (The live worker renews its own meanwhile, so the table as a
    // whole is not compared.)
    let untouched =
        async || leases.get("/api/leases?resource=worker:x").await.body["leases"] == json!([]);
    assert!(untouched().await);
    let beat = |info: Value, ttl: i64| json!({"instance": "i-1", "info": info, "ttl_seconds": ttl});
    let good = json!({"host": "h", "version": "1", "concurrency": 2, "busy": 0, "done": 0});
    let unauthenticated = tasks
        .send_as(None, "PUT", "/api/workers/x", Some(&beat(good.clone(), 10)))
        .await;
    assert_eq!(unauthenticated.status, 401, "{:?}", unauthenticated.body);
    for (body, field) in [
        (beat(good.clone(), 0), "ttl_seconds"),
        (beat(good.clone(), 301), "ttl_seconds"),
        (
            beat(
                json!({"host": "", "version": "1", "concurrency": 2, "busy": 0, "done": 0}),
                10,
            ),
            "info.host",
        ),
        (
            beat(
                json!({"host": "h", "version": "1", "concurrency": 2, "busy": 3, "done": 0}),
                10,
            ),
            "info.busy",
        ),
    ] {
        let refused = tasks
            .send_as(Some(WORKER), "PUT", "/api/workers/x", Some(&body))
            .await;
        assert_eq!(
            (refused.status, refused.body["field"].as_str()),
            (400, Some(field)),
            "{body}: {:?}",
            refused.body
        );
    }
    assert!(untouched().await, "a refused beat wrote a lease");
}

/// Under `LEASE_REQUIRE_SECRET=true`, a real worker's beats keep renewing its liveness lease
/// when its answers are lost and across task-service restarts: its first beats reach a paused
/// task-service and time out, to be served (the lease taken) once it resumes, with nobody left
/// to read the answer; then task-service is killed and started again, three times. Each renewal
/// carries the process's own secret, whichever start of task-service serves it, so the lease
/// is renewed, never refused (400 `secret_required`) nor taken anew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beats_renew_the_liveness_lease_through_lost_answers_and_restarts_when_secrets_are_required()
 {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[("LEASE_REQUIRE_SECRET", "true")]).await;
    let mut tasks = Service::task_service(&task_db, &leases.base_url(), &[]).await;
    tasks.pause();
    let worker = Service::worker(
        &tasks.base_url(),
        &[
            ("WORKER_ID", "w-locked"),
            ("HEARTBEAT_INTERVAL_SECONDS", "1"),
            ("RUST_LOG", "info,leasehold_worker::presence=debug"),
        ],
    )
    .await;
    eventually(Duration::from_secs(20), "a beat timed out", || async {
        worker.log_text().contains("worker beat failed")
    })
    .await;
    tasks.resume();
    let lease = async || {
        let listed = leases.get("/api/leases?resource=worker:w-locked").await;
        listed.body["leases"][0].clone()
    };
    // Renewed twice by beats whose answers the worker reads.
    for _ in 0..2 {
        let seen = lease().await["renewedAt"].as_str().unwrap_or("").to_owned();
        eventually(
            Duration::from_secs(20),
            "the worker's lease renewed",
            || async {
                lease().await["renewedAt"]
                    .as_str()
                    .is_some_and(|at| at > seen.as_str())
            },
        )
        .await;
    }
    let first = lease().await;
    for round in 0..3 {
        tasks.restart().await;
        // Two renewals after the restart: the first beat may have been in flight across it.
        for _ in 0..2 {
            let seen = lease().await["renewedAt"].as_str().unwrap().to_owned();
            eventually(
                Duration::from_secs(20),
                "a renewal after the restart",
                || async {
                    lease().await["renewedAt"]
                        .as_str()
                        .is_some_and(|at| at > seen.as_str())
                },
            )
            .await;
        }
        let now = lease().await;
        assert_eq!(
            (&now["fence"], &now["createdAt"], &now["status"]),
            (&first["fence"], &first["createdAt"], &json!("active")),
            "round {round}: renewed, not taken anew: {now}"
        );
    }
    let log = worker.log_text();
    assert!(!log.contains("worker beat refused"), "{log}");
    assert_eq!(
        self::worker(&tasks, "w-locked").await.unwrap()["liveness"],
        "alive"
    );
}

/// Under `LEASE_REQUIRE_SECRET=true`, a beat whose answer was lost (sent again, as a worker
/// whose request timed out sends its next) still renews the process's lease: the process's own
/// secret, sent at every beat, is the lease's. Before, the lost answer took lease-service's
/// secret with it, and every beat was refused (400 `secret_required`) until the lease lapsed.
#[tokio::test]
async fn a_beat_sent_again_after_its_answer_was_lost_renews_the_lease() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[("LEASE_REQUIRE_SECRET", "true")]).await;
    let tasks = Service::task_service(&task_db, &leases.base_url(), &[]).await;
    let secret = "5".repeat(64);
    let info = json!({"host": "h", "version": "1", "concurrency": 1, "busy": 0, "done": 0});
    let beat = |fence: Value| {
        json!({"instance": "run-1", "info": info, "ttl_seconds": 30, "fence": fence,
               "secret": secret})
    };
    let first = tasks.put("/api/workers/w", &beat(Value::Null)).await;
    assert_eq!(first.status, 200, "{:?}", first.body);
    assert!(first.body.get("secret").is_none(), "{:?}", first.body);
    let fence = first.body["fence"].clone();
    // The first answer lost: the next beat has no fence.
    let again = tasks.put("/api/workers/w", &beat(Value::Null)).await;
    assert_eq!(
        (again.status, &again.body["fence"]),
        (200, &fence),
        "{:?}",
        again.body
    );
    // A stale fence (an answer lost after the lease was taken anew) is no refusal either.
    let stale = tasks
        .put("/api/workers/w", &beat(json!(fence.as_i64().unwrap() - 1)))
        .await;
    assert_eq!((stale.status, &stale.body["fence"]), (200, &fence));
    let renewed = tasks.put("/api/workers/w", &beat(fence.clone())).await;
    assert_eq!((renewed.status, &renewed.body["fence"]), (200, &fence));
    let lease = &leases.get("/api/leases?resource=worker:w").await.body["leases"][0];
    assert_eq!(
        (&lease["fence"], &lease["status"]),
        (&fence, &json!("active"))
    );

    // Another run under the id, whatever secret it brings, is refused; a short secret is bad
    // input.
    let impostor = json!({"instance": "run-2", "info": info, "ttl_seconds": 30,
                          "secret": "6".repeat(64)});
    let refused = tasks.put("/api/workers/w", &impostor).await;
    assert_eq!((refused.status, refused.code()), (409, "worker_id_in_use"));
    let short = json!({"instance": "run-1", "info": info, "ttl_seconds": 30, "secret": "00ff"});
    let refused = tasks.put("/api/workers/w", &short).await;
    assert_eq!(
        (
            refused.status,
            refused.code(),
            refused.body["field"].as_str()
        ),
        (400, "invalid_secret", Some("secret"))
    );
    // The goodbye proves itself with the same secret.
    let gone = tasks
        .delete(
            "/api/workers/w",
            &json!({"instance": "run-1", "fence": fence, "secret": secret}),
        )
        .await;
    assert_eq!(gone.status, 204, "{:?}", gone.body);
    assert_eq!(worker(&tasks, "w").await.unwrap()["liveness"], "stopped");
}

/// A worker whose process lease an operator revoked learns it at its next claim (409
/// `lease_revoked`) and claims without the lease, each task under a lease of its own, until its
/// next beat takes the lease anew. So the tasks created meanwhile run once, at their first
/// attempt: none is handed to it under the dead lease, to be refused at completion and wait a
/// task lease TTL for someone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_lease_was_revoked_claims_without_it_and_runs_each_task_once() {
    let s = tests::Stack::start(&[]).await;
    // Beats far apart, so the claims after the revocation come before the next beat.
    let _worker = Service::worker(
        &s.tasks.base_url(),
        &[("WORKER_ID", "w1"), ("HEARTBEAT_INTERVAL_SECONDS", "20")],
    )
    .await;
    eventually(
        Duration::from_secs(20),
        "the worker's lease taken",
        || async {
            s.leases
                .get("/api/leases/active?resource=worker:w1")
                .await
                .body["leases"]
                .as_array()
                .is_some_and(|leases| leases.len() == 1)
        },
    )
    .await;
    tests::revoke_worker_lease(&s.leases, "w1").await;
    let mut ids = Vec::new();
    for n in 0..3 {
        let created = s
            .tasks
            .post(
                "/api/tasks",
                &json!({"task_data": {"sleep_duration_seconds": 0, "n": n}}),
            )
            .await;
        assert_eq!(created.status, 201, "{:?}", created.body);
        ids.push(created.body["id"].as_i64().unwrap());
    }
    for id in ids {
        let path = format!("/api/tasks/{id}");
        eventually(Duration::from_secs(60), "every task done", || async {
            s.tasks.get(&path).await.body["task"]["status"] == "succeeded"
        })
        .await;
        let task = s.tasks.get(&path).await.body["task"].clone();
        assert_eq!(task["attempts"], 1, "{task}");
    }
    // Claimed without the process lease, not after waiting for the next beat: each took a
    // lease of its own.
    let own = s.leases.get("/api/leases?resource_prefix=task:").await;
    assert_eq!(
        own.body["leases"].as_array().map(Vec::len),
        Some(3),
        "{:?}",
        own.body
    );
}

/// A beat whose every field is at its documented longest is accepted, whatever its characters
/// weigh in bytes; one character more of a field is refused naming that field, never with a
/// refusal of metadata the caller did not send.
#[tokio::test]
async fn a_beat_at_every_documented_bound_is_accepted_and_one_past_a_bound_names_its_field() {
    use leasehold::schema::{MAX_NAME_CHARS, MAX_QUEUE_CHARS, MAX_WORKER_LABEL_CHARS};
    let stack = tests::Stack::start(&[]).await;
    let longest = |chars: usize| "𝄞".repeat(chars);
    let id = longest(MAX_NAME_CHARS - leasehold::workers::RESOURCE_PREFIX.len());
    let beat = |host: String| {
        json!({
            "instance": "i",
            "info": {"host": host, "version": longest(MAX_WORKER_LABEL_CHARS),
                     "queue": longest(MAX_QUEUE_CHARS), "concurrency": u32::MAX,
                     "busy": u32::MAX, "done": u64::MAX},
            "ttl_seconds": 60,
        })
    };
    let path = format!("/api/workers/{}", id.replace('𝄞', "%F0%9D%84%9E"));
    let answer = stack
        .tasks
        .put(&path, &beat(longest(MAX_WORKER_LABEL_CHARS)))
        .await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let listed = worker(&stack.tasks, &id)
        .await
        .expect("the process is listed");
    assert_eq!(listed["info"]["done"], u64::MAX);

    let answer = stack
        .tasks
        .put(&path, &beat(longest(MAX_WORKER_LABEL_CHARS + 1)))
        .await;
    assert_eq!(
        (answer.status, answer.code()),
        (400, "invalid_field"),
        "{:?}",
        answer.body
    );
    assert_eq!(answer.body["field"], "info.host", "{:?}", answer.body);
}
