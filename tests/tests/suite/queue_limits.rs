//! Concurrency limits per queue and per key, and rate limits, against real processes: two
//! task-service replicas, workers claiming the limited queue by name and others claiming any
//! queue, one worker killed and one frozen mid-run so that leases lapse, and the invariant
//! checker proving from the history that at no instant were more of the queue's (or a key's)
//! tasks running than its limit, while the limit was reached (it bound) and unlimited work went
//! on. Claims of a key-limited queue take turns across keys: a key's backlog never keeps
//! another key's task waiting.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::json;
use tests::checker::{self, Invariant};
use tests::{Service, all_tasks_final, eventually, fresh_database, metric_sum, snapshot};

const LIMIT: i64 = 3;

#[tokio::test(flavor = "multi_thread")]
async fn a_limited_queue_never_runs_more_than_its_limit_across_replicas_and_faults() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    // A short task lease, so the killed and frozen workers' tasks lapse and are taken again.
    let env = [("TASK_LEASE_TTL_SECONDS", "2")];
    let a = Service::task_service(&task_db, &leases.base_url(), &env).await;
    let b = Service::task_service(&task_db, &leases.base_url(), &env).await;

    let set = a
        .put("/api/queues/limited", &json!({"concurrency_limit": LIMIT}))
        .await;
    assert_eq!(set.status, 200, "{:?}", set.body);
    assert_eq!(set.body["concurrencyLimit"], LIMIT);
    assert_eq!(
        b.get("/api/queues/limited").await.body["concurrencyLimit"],
        LIMIT,
        "every replica reads the one setting"
    );

    let tasks: Vec<_> = (0..36)
        .map(|_| json!({"task_data": {"sleep_duration_seconds": 0.3}, "queue": "limited"}))
        .chain(
            (0..30).map(|_| json!({"task_data": {"sleep_duration_seconds": 0}, "queue": "free"})),
        )
        .collect();
    let created = a.post("/api/tasks/batch", &json!({"tasks": tasks})).await;
    assert_eq!(created.status, 200, "{:?}", created.body);

    // Sixteen claim slots for a limit of three: by name through one replica, any queue through
    // the other.
    let named = [
        ("WORKER_QUEUE", "limited"),
        ("WORKER_CONCURRENCY", "4"),
        ("HEARTBEAT_INTERVAL_SECONDS", "0.5"),
    ];
    let any = [
        ("WORKER_CONCURRENCY", "4"),
        ("HEARTBEAT_INTERVAL_SECONDS", "0.5"),
    ];
    let mut workers = [
        Service::worker(&a.base_url(), &named).await,
        Service::worker(&a.base_url(), &named).await,
        Service::worker(&b.base_url(), &any).await,
        Service::worker(&b.base_url(), &any).await,
    ];
    let client = a.task_client();
    eventually(
        Duration::from_secs(30),
        "limited tasks under way",
        || async {
            let counts = client.counts().await.unwrap();
            counts.queues["limited"]["succeeded"] >= 6
        },
    )
    .await;
    workers[0].kill();
    workers[2].pause();
    eventually(
        Duration::from_secs(60),
        "more limited tasks done",
        || async {
            let counts = client.counts().await.unwrap();
            counts.queues["limited"]["succeeded"] >= 18
        },
    )
    .await;
    workers[2].resume();
    let report = drained_within_limits(
        &client,
        &lease_db,
        &task_db,
        &[&a, &b],
        "limited",
        "concurrency",
    )
    .await;
    assert!(report.checked[&Invariant::QueueConcurrency] >= 36);
    assert_eq!(
        report.busiest["limited"], LIMIT,
        "the limit was reached, never passed"
    );
}

#[tokio::test]
async fn limits_are_set_shown_lifted_and_bad_ones_refused_without_a_write() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    // Waiting claims are re-checked only every ten minutes: one that is answered was woken.
    let tasks = Service::task_service(
        &task_db,
        &leases.base_url(),
        &[("WAIT_RECHECK_MS", "600000")],
    )
    .await;
    let set = tasks
        .put("/api/queues/mail", &json!({"concurrency_limit": 1}))
        .await;
    assert_eq!(set.status, 200, "{:?}", set.body);
    // One task runs; the next waits for its slot, and gets it once the first is done.
    for _ in 0..2 {
        let created = tasks
            .post("/api/tasks", &json!({"task_data": {}, "queue": "mail"}))
            .await;
        assert_eq!(created.status, 201);
    }
    let first = tasks
        .post(
            "/api/tasks/next",
            &json!({"processor": "w", "queue": "mail"}),
        )
        .await;
    assert_eq!(first.status, 202, "{:?}", first.body);
    let held = tasks
        .post("/api/tasks/next", &json!({"processor": "w2", "limit": 5}))
        .await;
    assert_eq!(
        held.status, 200,
        "the any-queue claim steps over the full queue"
    );
    let waiting = waiting_claim(&tasks, "w3", "mail");
    until_waiting(&tasks).await;
    let done = tasks
        .put(
            &format!("/api/tasks/{}/complete", first.body["id"]),
            &json!({"processor": "w", "fence": first.body["fence"], "task_output": {}}),
        )
        .await;
    assert_eq!(done.status, 202, "{:?}", done.body);
    assert_eq!(
        waiting.await.unwrap(),
        202,
        "the freed slot woke the waiting claim"
    );

    // A rate limit that holds a task back, then lifted: the waiting claim is woken at once.
    let paced = tasks
        .put(
            "/api/queues/mail",
            &json!({"rate_limit": {"per_second": 0.001, "burst": 1}}),
        )
        .await;
    assert_eq!(paced.status, 200, "{:?}", paced.body);
    for _ in 0..2 {
        let created = tasks
            .post("/api/tasks", &json!({"task_data": {}, "queue": "mail"}))
            .await;
        assert_eq!(created.status, 201);
    }
    let spent = tasks
        .post(
            "/api/tasks/next",
            &json!({"processor": "w", "queue": "mail"}),
        )
        .await;
    assert_eq!(spent.status, 202, "the burst: {:?}", spent.body);
    let waiting = waiting_claim(&tasks, "w4", "mail");
    until_waiting(&tasks).await;
    let lifted = tasks.put("/api/queues/mail", &json!({})).await;
    assert_eq!(lifted.status, 200);
    assert_eq!(
        waiting.await.unwrap(),
        202,
        "lifting the rate woke the waiting claim"
    );

    let before = snapshot(&task_db, "queues").await;
    for (body, code) in [
        (json!({"concurrency_limit": -1}), "invalid_field"),
        (json!({"concurrency_limit": 2_000_000}), "invalid_field"),
        (json!({"concurrency_limit": "three"}), "invalid_field"),
        (json!({"concurrency": 3}), "invalid_field"),
        (
            json!({"rate_limit": {"per_second": 0, "burst": 1}}),
            "invalid_field",
        ),
        (
            json!({"rate_limit": {"per_second": -2, "burst": 1}}),
            "invalid_field",
        ),
        (
            json!({"rate_limit": {"per_second": 5, "burst": 0}}),
            "invalid_field",
        ),
        (json!({"rate_limit": {"per_second": 5}}), "missing_field"),
    ] {
        let answer = tasks.put("/api/queues/mail", &body).await;
        assert_eq!((answer.status, answer.code()), (400, code), "{body}");
    }
    assert_eq!(
        before,
        snapshot(&task_db, "queues").await,
        "nothing written"
    );

    let lifted = tasks.put("/api/queues/mail", &json!({})).await;
    assert_eq!(lifted.status, 200);
    assert_eq!(lifted.body["concurrencyLimit"], serde_json::Value::Null);
    let listed = tasks.get("/api/queues").await;
    assert_eq!(listed.body["queues"][0]["queue"], "mail");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rate_limited_queue_starts_no_more_than_its_rate_across_replicas() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let a = Service::task_service(&task_db, &leases.base_url(), &[]).await;
    let b = Service::task_service(&task_db, &leases.base_url(), &[]).await;
    let set = a
        .put(
            "/api/queues/paced",
            &json!({"rate_limit": {"per_second": 10, "burst": 3}}),
        )
        .await;
    assert_eq!(set.status, 200, "{:?}", set.body);
    assert_eq!(
        set.body["rateLimit"],
        json!({"perSecond": 10.0, "burst": 3})
    );

    let tasks: Vec<_> = (0..30)
        .map(|_| json!({"task_data": {"sleep_duration_seconds": 0}, "queue": "paced"}))
        .chain(
            (0..20).map(|_| json!({"task_data": {"sleep_duration_seconds": 0}, "queue": "free"})),
        )
        .collect();
    let created = a.post("/api/tasks/batch", &json!({"tasks": tasks})).await;
    assert_eq!(created.status, 200, "{:?}", created.body);
    let named = [("WORKER_QUEUE", "paced"), ("WORKER_CONCURRENCY", "4")];
    let any = [("WORKER_CONCURRENCY", "4")];
    let _workers = [
        Service::worker(&a.base_url(), &named).await,
        Service::worker(&a.base_url(), &named).await,
        Service::worker(&b.base_url(), &any).await,
    ];
    let client = a.task_client();
    let report =
        drained_within_limits(&client, &lease_db, &task_db, &[&a, &b], "paced", "rate").await;
    assert!(report.checked[&Invariant::QueueRate] >= 30);
}

/// Waits until `tasks` holds a claim waiting for work (its first claim round found nothing).
async fn until_waiting(tasks: &Service) {
    eventually(Duration::from_secs(10), "a claim waiting", || async {
        metric_sum(&tasks.metrics().await, "task_claims_waiting") >= 1.0
    })
    .await;
}

/// A claim of `queue` by `processor` that waits up to 20 s for a task: its answer's status.
fn waiting_claim(tasks: &Service, processor: &str, queue: &str) -> tokio::task::JoinHandle<u16> {
    let url = tasks.url("/api/tasks/next");
    let body = json!({"processor": processor, "queue": queue, "wait_ms": 20000});
    tokio::spawn(async move {
        reqwest::Client::new()
            .post(url)
            .json(&body)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    })
}

/// Completes, as its claimant, a running task of `queue` with concurrency key `key`.
async fn complete_one_of(tasks: &Service, queue: &str, key: &str) {
    let running = tasks
        .get(&format!("/api/tasks?status=running&queue={queue}"))
        .await;
    let task = running.body["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["concurrencyKey"] == key)
        .unwrap()
        .clone();
    let done = tasks
        .put(
            &format!("/api/tasks/{}/complete", task["id"]),
            &json!({"processor": task["processor"], "fence": task["fence"], "task_output": {}}),
        )
        .await;
    assert_eq!(done.status, 202, "{:?}", done.body);
}

/// The concurrency keys (`-` for none) of the tasks a claim answered with, in its order.
fn claimed(answer: &tests::Answer) -> Vec<String> {
    if answer.status == 200 {
        return Vec::new();
    }
    assert_eq!(answer.status, 202, "{:?}", answer.body);
    answer
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["concurrencyKey"].as_str().unwrap_or("-").to_owned())
        .collect()
}

#[tokio::test]
async fn claims_take_turns_across_keys_and_hold_each_key_to_its_limit() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let tasks = Service::task_service(&task_db, &leases.base_url(), &[]).await;
    let set = tasks
        .put("/api/queues/tenants", &json!({"key_concurrency_limit": 2}))
        .await;
    assert_eq!(set.status, 200, "{:?}", set.body);
    assert_eq!(set.body["keyConcurrencyLimit"], 2);

    // One tenant's backlog of 3,000, then another tenant's one task and one task without a key,
    // all of one priority: by age alone they would wait for the 3,000.
    for _ in 0..3 {
        let batch: Vec<_> = (0..1000)
            .map(|_| json!({"task_data": {}, "queue": "tenants", "concurrency_key": "big"}))
            .collect();
        let created = tasks
            .post("/api/tasks/batch", &json!({"tasks": batch}))
            .await;
        assert_eq!(created.status, 200);
    }
    for extra in [
        json!({"task_data": {}, "queue": "tenants", "concurrency_key": "small"}),
        json!({"task_data": {}, "queue": "tenants"}),
    ] {
        let created = tasks.post("/api/tasks", &extra).await;
        assert_eq!(created.status, 201, "{:?}", created.body);
        assert_eq!(created.body["concurrencyKey"], extra["concurrency_key"]);
    }
    let claim = |processor: &str, limit: i64| json!({"processor": processor, "queue": "tenants", "limit": limit});

    // One claim at a time: turns go round the keys, the tasks without a key counting as one.
    let first = claimed(&tasks.post("/api/tasks/next", &claim("w1", 1)).await);
    let second = claimed(&tasks.post("/api/tasks/next", &claim("w2", 1)).await);
    let third = claimed(&tasks.post("/api/tasks/next", &claim("w3", 1)).await);
    assert_eq!(
        [first, second, third].concat(),
        ["big", "small", "-"],
        "each key gets its turn, whatever its backlog"
    );
    // The big tenant has one running of its two: one more, then none while two run.
    let fourth = claimed(&tasks.post("/api/tasks/next", &claim("w4", 5)).await);
    assert_eq!(fourth, ["big"], "up to the key's limit");
    let any = tasks
        .post("/api/tasks/next", &json!({"processor": "w5", "limit": 5}))
        .await;
    assert_eq!(
        claimed(&any),
        Vec::<String>::new(),
        "a claim of any queue too"
    );
    assert!(
        metric_sum(
            &tasks.metrics().await,
            "queue_limit_waits_total{limit=\"key_concurrency\",queue=\"tenants\"}"
        ) > 0.0,
        "the key limit's waits are counted"
    );

    // A task of another key is still taken, by a claim of any queue too; and a finished task
    // frees its key's slot.
    let other = tasks
        .post(
            "/api/tasks",
            &json!({"task_data": {}, "queue": "tenants", "concurrency_key": "third"}),
        )
        .await;
    assert_eq!(other.status, 201);
    let any = tasks
        .post("/api/tasks/next", &json!({"processor": "w6", "limit": 5}))
        .await;
    assert_eq!(claimed(&any), ["third"]);
    complete_one_of(&tasks, "tenants", "big").await;
    let freed = claimed(&tasks.post("/api/tasks/next", &claim("w7", 5)).await);
    assert_eq!(freed, ["big"], "one slot freed, one task of the key");

    // Bad input is refused and writes nothing.
    let before = snapshot(&task_db, "queues").await;
    let refused = tasks
        .put("/api/queues/tenants", &json!({"key_concurrency_limit": -1}))
        .await;
    assert_eq!((refused.status, refused.code()), (400, "invalid_field"));
    assert_eq!(
        before,
        snapshot(&task_db, "queues").await,
        "nothing written"
    );
    let before = snapshot(&task_db, "tasks").await;
    for key in [
        json!(""),
        json!("x".repeat(300)),
        json!("a\u{7}b"),
        json!(3),
    ] {
        let refused = tasks
            .post(
                "/api/tasks",
                &json!({"task_data": {}, "queue": "tenants", "concurrency_key": key}),
            )
            .await;
        assert_eq!(
            (refused.status, refused.code()),
            (400, "invalid_field"),
            "{key}"
        );
    }
    assert_eq!(before, snapshot(&task_db, "tasks").await, "nothing written");
}

#[tokio::test]
async fn neither_full_keys_nor_keyless_tasks_of_higher_priority_hold_other_keys_back() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let tasks = Service::task_service(&task_db, &leases.base_url(), &[]).await;
    let set = tasks
        .put("/api/queues/fair", &json!({"key_concurrency_limit": 1}))
        .await;
    assert_eq!(set.status, 200, "{:?}", set.body);
    let mut batch: Vec<_> = ["a", "b", "c"]
        .iter()
        .flat_map(|key| {
            (0..3).map(move |_| json!({"task_data": {}, "queue": "fair", "concurrency_key": key}))
        })
        .collect();
    batch.extend((0..3).map(|_| json!({"task_data": {}, "queue": "fair", "priority": 10})));
    let created = tasks
        .post("/api/tasks/batch", &json!({"tasks": batch}))
        .await;
    assert_eq!(created.status, 200);
    let claim = |processor: String, limit: i64| json!({"processor": processor, "queue": "fair", "limit": limit});
    // The keyless tasks come first by priority in every claim, and the keys still take their
    // turns behind them, each held to one running task.
    let mut rounds = Vec::new();
    for round in 0..4 {
        let answer = tasks
            .post("/api/tasks/next", &claim(format!("w{round}"), 2))
            .await;
        rounds.push(claimed(&answer));
    }
    assert_eq!(
        rounds,
        [
            vec!["-", "a"],
            vec!["-", "b"],
            vec!["-", "c"],
            Vec::<&str>::new()
        ],
        "the keys' turns, behind the keyless tasks of higher priority"
    );
    // Every key is at its limit, and the first ones in the walk stay so: a freed slot of a
    // later key is still found behind them.
    complete_one_of(&tasks, "fair", "b").await;
    let freed = tasks
        .post("/api/tasks/next", &claim("w9".to_owned(), 1))
        .await;
    assert_eq!(
        claimed(&freed),
        ["b"],
        "the full key ahead did not block it"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_limit_waits_for_the_claims_in_flight_so_none_judges_by_the_old_one() {
    use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let tasks = Service::task_service(&task_db, &leases.base_url(), &[]).await;
    // A claim in flight, as task-service's claims hold it: a transaction that has read the
    // limits with `lock_limits`'s row-share lock on `queues`, and has not committed.
    let mut claim = AsyncPgConnection::establish(&task_db).await.unwrap();
    for sql in [
        "BEGIN",
        "SELECT queue FROM queues WHERE concurrency_limit IS NOT NULL FOR NO KEY UPDATE",
    ] {
        diesel::sql_query(sql).execute(&mut claim).await.unwrap();
    }
    let set = tokio::spawn({
        let url = tasks.url("/api/queues/late");
        async move {
            reqwest::Client::new()
                .put(url)
                .json(&json!({"concurrency_limit": 1}))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    });
    eventually(
        Duration::from_secs(10),
        "the new limit waiting for the claim in flight",
        || async {
            !tests::query(
                &task_db,
                "SELECT pid FROM pg_stat_activity
                 WHERE wait_event_type = 'Lock' AND query LIKE 'LOCK TABLE queues%'",
            )
            .await
            .is_empty()
        },
    )
    .await;
    assert!(!set.is_finished(), "answered while a claim was in flight");
    diesel::sql_query("COMMIT")
        .execute(&mut claim)
        .await
        .unwrap();
    assert_eq!(set.await.unwrap(), 200, "answered once the claim committed");
}

#[tokio::test(flavor = "multi_thread")]
async fn no_key_runs_more_than_its_limit_across_replicas_and_faults() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let env = [("TASK_LEASE_TTL_SECONDS", "2")];
    let a = Service::task_service(&task_db, &leases.base_url(), &env).await;
    let b = Service::task_service(&task_db, &leases.base_url(), &env).await;
    let set = a
        .put(
            "/api/queues/tenants",
            &json!({"key_concurrency_limit": 2, "concurrency_limit": 5}),
        )
        .await;
    assert_eq!(set.status, 200, "{:?}", set.body);
    // Two keys of two slots each, under a queue limit of five and twelve claim slots: the keys'
    // limits bind.
    let tasks: Vec<_> = ["a", "b"]
        .iter()
        .flat_map(|key| {
            (0..14).map(move |_| {
                json!({"task_data": {"sleep_duration_seconds": 0.2}, "queue": "tenants",
                       "concurrency_key": key})
            })
        })
        .chain(
            (0..4)
                .map(|_| json!({"task_data": {"sleep_duration_seconds": 0.1}, "queue": "tenants"})),
        )
        .collect();
    let created = a.post("/api/tasks/batch", &json!({"tasks": tasks})).await;
    assert_eq!(created.status, 200, "{:?}", created.body);
    let named = [
        ("WORKER_QUEUE", "tenants"),
        ("WORKER_CONCURRENCY", "4"),
        ("HEARTBEAT_INTERVAL_SECONDS", "0.5"),
    ];
    let any = [
        ("WORKER_CONCURRENCY", "4"),
        ("HEARTBEAT_INTERVAL_SECONDS", "0.5"),
    ];
    let mut workers = [
        Service::worker(&a.base_url(), &named).await,
        Service::worker(&b.base_url(), &named).await,
        Service::worker(&b.base_url(), &any).await,
    ];
    let client = a.task_client();
    eventually(Duration::from_secs(30), "keyed tasks under way", || async {
        let counts = client.counts().await.unwrap();
        counts.queues["tenants"]["succeeded"] >= 6
    })
    .await;
    workers[0].kill();
    let report = drained_within_limits(
        &client,
        &lease_db,
        &task_db,
        &[&a, &b],
        "tenants",
        "key_concurrency",
    )
    .await;
    assert!(
        report.checked[&Invariant::KeyConcurrency] >= 28,
        "every keyed task's claims were checked"
    );
    let busiest = ["a", "b"]
        .iter()
        .map(|key| report.busiest[&format!("tenants[{key}]")])
        .max();
    assert_eq!(busiest, Some(2), "the key limit was reached, never passed");
}

/// Waits until every task is final, has the checker prove the run kept every invariant, and
/// checks that `limit` held claims of `queue` back on some replica (so that it bound).
async fn drained_within_limits(
    client: &leasehold::TaskClient,
    lease_db: &str,
    task_db: &str,
    replicas: &[&Service],
    queue: &str,
    limit: &str,
) -> checker::Report {
    eventually(Duration::from_secs(120), "every task final", || async {
        all_tasks_final(client).await
    })
    .await;
    let report = checker::check(lease_db, Some(task_db), true).await;
    eprintln!("{report}");
    assert!(
        report.violations.is_empty(),
        "violations:\n{:#?}",
        report.violations
    );
    let mut waits = 0.0;
    for replica in replicas {
        waits += metric_sum(
            &replica.metrics().await,
            &format!("queue_limit_waits_total{{limit=\"{limit}\",queue=\"{queue}\"}}"),
        );
    }
    assert!(
        waits > 0.0,
        "claims of {queue} were held back by its {limit} limit"
    );
    report
}

/// A rate of 5e-324 tasks per second was accepted, and its bucket's refill then underflowed
/// float8: every claim that read the bucket, of this queue or of any, answered 500. Rates below
/// one task a day are refused, the table holds the same bound, and the slowest accepted rate
/// serves claims, spent twice in a row, of its queue and of every queue.
#[tokio::test(flavor = "multi_thread")]
async fn a_rate_below_one_a_day_is_refused_and_the_slowest_accepted_fails_no_claim() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let tasks = Service::task_service(&task_db, &leases.base_url(), &[]).await;

    let before = snapshot(&task_db, "queues").await;
    for per_second in [
        5e-324,
        1e-300,
        -0.0,
        0.0,
        1e-6,
        1.0 / 86_400.0 * 0.999,
        1e308,
    ] {
        let body = json!({"rate_limit": {"per_second": per_second, "burst": 100}});
        let answer = tasks.put("/api/queues/sub", &body).await;
        assert_eq!(
            (answer.status, answer.code()),
            (400, "invalid_field"),
            "{body}"
        );
    }
    assert_eq!(
        before,
        snapshot(&task_db, "queues").await,
        "nothing written"
    );

    let slowest = json!({"rate_limit": {"per_second": leasehold::queues::MIN_RATE, "burst": 100}});
    let set = tasks.put("/api/queues/sub", &slowest).await;
    assert_eq!(set.status, 200, "{:?}", set.body);
    // What the API refuses, the table refuses too: no row can make the refill raise.
    let forced = tests::try_execute(
        &task_db,
        "UPDATE queues SET rate_per_second = 5e-324 WHERE queue = 'sub'",
    )
    .await;
    assert!(
        forced.is_err_and(|err| err.contains("queues_rate_per_second_range")),
        "the table took a rate below one a day"
    );

    for queue in ["sub", "sub", "sub", "other", "other"] {
        let created = tasks
            .post("/api/tasks", &json!({"task_data": {}, "queue": queue}))
            .await;
        assert_eq!(created.status, 201);
    }
    // Claims right after a spend are those whose refill is smallest.
    for claim in [
        json!({"processor": "p", "queue": "sub"}),
        json!({"processor": "p", "queue": "sub"}),
        json!({"processor": "p", "queue": "other"}),
        json!({"processor": "p", "limit": 5}),
    ] {
        let answer = tasks.post("/api/tasks/next", &claim).await;
        assert_eq!(answer.status, 202, "{claim}: {:?}", answer.body);
    }
}
