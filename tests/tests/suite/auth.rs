//! The locked front door, against real processes: bearer tokens with roles on every write route
//! of both services, a service token from task-service to lease-service, proof of holding for a
//! lease's renew and release, and no secret in any log or trace.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::{Value, json};
use tests::otlp::OtlpReceiver;
use tests::{Answer, Service, eventually, fresh_database, snapshot};

/// task-service's token at lease-service.
const SERVICE: &str = "task-service-to-lease-service-7f3a";
/// The generator's one token: leaseholder at lease-service, producer at task-service.
const GENERATOR: &str = "generator-token-9c1d2e3f";
const PRODUCER: &str = "producer-token-0a1b2c3d";
const WORKER: &str = "worker-token-4e5f6a7b";
const OPERATOR: &str = "operator-token-8c9d0e1f";
const UNKNOWN: &str = "nobody-knows-this-token-1234";

/// A refusal by authentication: 401 (no or unknown token, with `WWW-Authenticate`) or 403
/// (a known token without the role), as JSON with a message that names the role.
fn assert_refused(answer: &Answer, status: u16, what: &str) {
    assert_eq!(answer.status, status, "{what}: {:?}", answer.body);
    let code = if status == 401 {
        "unauthorized"
    } else {
        "forbidden"
    };
    assert_eq!(answer.code(), code, "{what}");
    let message = answer.body["error"].as_str().unwrap_or("");
    assert!(message.len() > 20, "{what}: a clear message: {message:?}");
    if status == 401 {
        assert!(
            answer.headers.contains_key("www-authenticate"),
            "{what}: 401 says how to authenticate"
        );
    }
}

#[tokio::test]
async fn lease_service_write_routes_need_the_leaseholder_role_and_revoke_the_operator_role() {
    let db = fresh_database().await;
    let tokens = format!("leaseholder:{SERVICE},operator:{OPERATOR},worker:{WORKER}");
    let leases = Service::lease_service(&db, &[("AUTH_TOKENS", tokens.as_str())]).await;
    assert!(
        leases
            .log_text()
            .contains("write routes need a bearer token")
    );

    let acquired = leases
        .send_as(
            Some(SERVICE),
            "POST",
            "/api/leases",
            Some(&json!({"resource": "r", "holder": "h"})),
        )
        .await;
    assert_eq!(acquired.status, 201, "{:?}", acquired.body);
    let id = acquired.body["id"].as_i64().unwrap();
    let secret = acquired.body["secret"].as_str().unwrap().to_owned();
    let holder = json!({"resource": "r", "holder": "h", "secret": secret});
    let routes: Vec<(&str, String, Value, &str)> = vec![
        (
            "POST",
            "/api/leases".to_owned(),
            json!({"resource": "other", "holder": "h"}),
            "leaseholder",
        ),
        (
            "PUT",
            "/api/leases/renew".to_owned(),
            holder.clone(),
            "leaseholder",
        ),
        (
            "DELETE",
            "/api/leases/release".to_owned(),
            holder.clone(),
            "leaseholder",
        ),
        (
            "DELETE",
            format!("/api/leases/{id}"),
            holder.clone(),
            "leaseholder",
        ),
        (
            "POST",
            "/api/leases/batch/check".to_owned(),
            json!({"leases": [{"resource": "r", "fence": 1}]}),
            "leaseholder",
        ),
        (
            "POST",
            format!("/api/leases/{id}/revoke"),
            json!({}),
            "operator",
        ),
    ];
    let before = snapshot(&db, "leases").await;
    for (method, path, body, role) in &routes {
        let what = format!("{method} {path}");
        let none = leases.send_as(None, method, path, Some(body)).await;
        assert_refused(&none, 401, &format!("{what} without a token"));
        assert!(
            none.body["error"].as_str().unwrap().contains(role),
            "{what}: the message names the role: {:?}",
            none.body
        );
        let unknown = leases
            .send_as(Some(UNKNOWN), method, path, Some(body))
            .await;
        assert_refused(&unknown, 401, &format!("{what} with an unknown token"));
        let wrong_role = if *role == "operator" { SERVICE } else { WORKER };
        let forbidden = leases
            .send_as(Some(wrong_role), method, path, Some(body))
            .await;
        assert_refused(&forbidden, 403, &format!("{what} with the wrong role"));
        // Authentication comes before the body is even read: garbage gets 401 too.
        let garbage = leases
            .raw(method, path, Some("application/json"), "{not json")
            .await;
        assert_refused(&garbage, 401, &format!("{what} with a bad body"));
    }
    assert_eq!(
        before,
        snapshot(&db, "leases").await,
        "refusals wrote nothing"
    );

    // Reads stay open.
    for path in [
        "/api/leases",
        "/api/leases/active",
        &format!("/api/leases/{id}"),
        "/healthz",
        "/readyz",
        "/metrics",
    ] {
        let answer = leases.send_as(None, "GET", path, None).await;
        assert_eq!(answer.status, 200, "GET {path} is open");
    }

    // With the right role each write does its job.
    for (method, path, body, role) in &routes[..3] {
        let token = if *role == "operator" {
            OPERATOR
        } else {
            SERVICE
        };
        let answer = leases.send_as(Some(token), method, path, Some(body)).await;
        assert!(
            (200..300).contains(&answer.status),
            "{method} {path}: {:?}",
            answer.body
        );
    }
    let again = leases
        .send_as(
            Some(SERVICE),
            "POST",
            "/api/leases",
            Some(&json!({"resource": "r", "holder": "h2"})),
        )
        .await;
    assert_eq!(again.status, 201);
    let revoked = leases
        .send_as(
            Some(OPERATOR),
            "POST",
            &format!("/api/leases/{}/revoke", again.body["id"]),
            None,
        )
        .await;
    assert_eq!(
        (revoked.status, revoked.body["status"].as_str()),
        (200, Some("revoked")),
        "{:?}",
        revoked.body
    );
}

/// lease-service and task-service, both locked; task-service calls lease-service with
/// `service_token`.
async fn locked_stack(service_token: &str) -> tests::Stack {
    let lease_tokens = format!("leaseholder:{SERVICE}");
    let task_tokens = format!("producer:{PRODUCER},worker:{WORKER},operator:{OPERATOR}");
    tests::Stack::with()
        .auth(&lease_tokens, &task_tokens, service_token)
        .lease_env(&[("LEASE_REQUIRE_SECRET", "true")])
        .start()
        .await
}

#[tokio::test]
async fn each_task_service_role_does_exactly_what_it_may() {
    let stack = locked_stack(SERVICE).await;
    let (tasks, lease_db, task_db) = (&stack.tasks, &stack.lease_db, &stack.task_db);
    let create = |token| {
        let tasks = &tasks;
        async move {
            tasks
                .send_as(
                    token,
                    "POST",
                    "/api/tasks",
                    Some(&json!({"task_data": {"sleep_duration_seconds": 0}})),
                )
                .await
        }
    };
    let first = create(Some(PRODUCER)).await;
    assert_eq!(first.status, 201, "{:?}", first.body);
    let id = first.body["id"].as_i64().unwrap();

    let routes: Vec<(&str, String, Value, &str)> = vec![
        (
            "POST",
            "/api/tasks".to_owned(),
            json!({"task_data": {}}),
            PRODUCER,
        ),
        (
            "POST",
            "/api/tasks/next".to_owned(),
            json!({"processor": "w"}),
            WORKER,
        ),
        (
            "PUT",
            format!("/api/tasks/{id}/heartbeat"),
            json!({"processor": "w"}),
            WORKER,
        ),
        (
            "PUT",
            format!("/api/tasks/{id}/complete"),
            json!({"processor": "w", "task_output": {}}),
            WORKER,
        ),
        (
            "PUT",
            format!("/api/tasks/{id}/fail"),
            json!({"processor": "w", "error": "x"}),
            WORKER,
        ),
        (
            "POST",
            format!("/api/tasks/{id}/cancel"),
            json!({}),
            OPERATOR,
        ),
        (
            "POST",
            "/api/generator/start".to_owned(),
            json!({"rate_per_second": 1}),
            OPERATOR,
        ),
        (
            "POST",
            "/api/generator/stop".to_owned(),
            json!({}),
            OPERATOR,
        ),
        (
            "POST",
            format!("/api/tasks/{id}/retry"),
            json!({}),
            OPERATOR,
        ),
        (
            "POST",
            "/api/tasks/batch".to_owned(),
            json!({"tasks": [{"task_data": {}}]}),
            PRODUCER,
        ),
        (
            "PUT",
            format!("/api/tasks/{id}/snooze"),
            json!({"processor": "w", "seconds": 1}),
            WORKER,
        ),
        (
            "POST",
            "/api/tasks/retry".to_owned(),
            json!({"status": "dead"}),
            OPERATOR,
        ),
        (
            "POST",
            "/api/tasks/cancel".to_owned(),
            json!({"status": "pending"}),
            OPERATOR,
        ),
        (
            "POST",
            "/api/tasks/delete".to_owned(),
            json!({"status": "succeeded"}),
            OPERATOR,
        ),
        (
            "POST",
            "/api/queues/default/pause".to_owned(),
            json!({}),
            OPERATOR,
        ),
        (
            "POST",
            "/api/queues/default/resume".to_owned(),
            json!({}),
            OPERATOR,
        ),
        (
            "PUT",
            "/api/queues/default".to_owned(),
            json!({"concurrency_limit": 1}),
            OPERATOR,
        ),
        (
            "POST",
            "/api/schedules".to_owned(),
            json!({"name": "s", "cron": "* * * * *", "task_data": {}}),
            OPERATOR,
        ),
        (
            "PUT",
            "/api/schedules/s".to_owned(),
            json!({"cron": "* * * * *", "task_data": {}}),
            OPERATOR,
        ),
        (
            "POST",
            "/api/schedules/s/pause".to_owned(),
            json!({}),
            OPERATOR,
        ),
        (
            "POST",
            "/api/schedules/s/resume".to_owned(),
            json!({}),
            OPERATOR,
        ),
        ("DELETE", "/api/schedules/s".to_owned(), json!({}), OPERATOR),
        (
            "PUT",
            "/api/workers/w".to_owned(),
            json!({"instance": "i", "info": {"host": "h", "version": "1", "concurrency": 1,
                   "busy": 0, "done": 0}, "ttl_seconds": 10}),
            WORKER,
        ),
        (
            "DELETE",
            "/api/workers/w".to_owned(),
            json!({"instance": "i", "fence": 1}),
            WORKER,
        ),
    ];
    let tables = [
        "tasks",
        "generator_settings",
        "task_events",
        "queues",
        "schedules",
    ];
    let mut before = Vec::new();
    for table in tables {
        before.push(snapshot(task_db, table).await);
    }
    let leases_before = snapshot(lease_db, "leases").await;
    let mut refusals = 0;
    for (method, path, body, allowed) in &routes {
        let what = format!("{method} {path}");
        assert_refused(
            &tasks.send_as(None, method, path, Some(body)).await,
            401,
            &format!("{what} without a token"),
        );
        assert_refused(
            &tasks.send_as(Some(UNKNOWN), method, path, Some(body)).await,
            401,
            &format!("{what} with an unknown token"),
        );
        // A lease-service token is no task-service token.
        assert_refused(
            &tasks.send_as(Some(SERVICE), method, path, Some(body)).await,
            401,
            &format!("{what} with lease-service's token"),
        );
        for token in [PRODUCER, WORKER, OPERATOR] {
            if token == *allowed {
                continue;
            }
            let answer = tasks.send_as(Some(token), method, path, Some(body)).await;
            assert_refused(&answer, 403, &format!("{what} with {token}"));
            refusals += 1;
        }
    }
    assert_eq!(refusals, 2 * routes.len());
    for (table, rows) in tables.iter().zip(&before) {
        assert_eq!(rows, &snapshot(task_db, table).await, "{table} unchanged");
    }
    assert_eq!(leases_before, snapshot(lease_db, "leases").await);

    // Each role, doing its own work, succeeds: a worker claims, heartbeats and completes
    // (task-service renewing and releasing with the lease's secret, which lease-service
    // requires here), a producer creates, an operator cancels and runs the generator.
    let claim = tasks
        .send_as(
            Some(WORKER),
            "POST",
            "/api/tasks/next",
            Some(&json!({"processor": "w"})),
        )
        .await;
    assert_eq!(claim.status, 202, "{:?}", claim.body);
    assert_eq!(claim.body["id"].as_i64(), Some(id));
    assert!(
        !claim.body.to_string().contains("secret"),
        "the task's lease secret is task-service's: {}",
        claim.body
    );
    for (method, path, body, _) in &routes[2..4] {
        let answer = tasks.send_as(Some(WORKER), method, path, Some(body)).await;
        assert_eq!(answer.status, 202, "{method} {path}: {:?}", answer.body);
    }
    assert_eq!(
        tasks.get(&format!("/api/tasks/{id}")).await.body["task"]["status"],
        "succeeded"
    );
    let second = create(Some(PRODUCER)).await;
    let second_id = second.body["id"].as_i64().unwrap();
    let cancelled = tasks
        .send_as(
            Some(OPERATOR),
            "POST",
            &format!("/api/tasks/{second_id}/cancel"),
            None,
        )
        .await;
    assert_eq!(cancelled.status, 200, "{:?}", cancelled.body);
    for (method, path, body, _) in &routes[6..8] {
        let answer = tasks
            .send_as(Some(OPERATOR), method, path, Some(body))
            .await;
        assert_eq!(answer.status, 200, "{method} {path}: {:?}", answer.body);
    }
}

#[tokio::test]
async fn a_task_service_whose_lease_token_is_refused_says_so_and_claims_nothing() {
    let stack = locked_stack("a-token-lease-service-refuses").await;
    let (tasks, lease_db) = (&stack.tasks, &stack.lease_db);
    let created = tasks
        .send_as(
            Some(PRODUCER),
            "POST",
            "/api/tasks",
            Some(&json!({"task_data": {}})),
        )
        .await;
    let id = created.body["id"].as_i64().unwrap();
    let claim = tasks
        .send_as(
            Some(WORKER),
            "POST",
            "/api/tasks/next",
            Some(&json!({"processor": "w"})),
        )
        .await;
    assert_eq!((claim.status, claim.code()), (503, "unavailable"));
    assert!(
        claim.body["error"]
            .as_str()
            .unwrap()
            .contains("LEASE_SERVICE_TOKEN"),
        "{:?}",
        claim.body
    );
    assert_eq!(
        tasks.get(&format!("/api/tasks/{id}")).await.body["task"]["status"],
        "pending"
    );
    assert!(snapshot(lease_db, "leases").await.is_empty());
}

#[tokio::test]
async fn with_proof_required_a_holders_name_alone_cannot_renew_or_release_its_lease() {
    let db = fresh_database().await;
    let leases = Service::lease_service(&db, &[("LEASE_REQUIRE_SECRET", "true")]).await;
    let acquired = leases
        .post("/api/leases", &json!({"resource": "r", "holder": "h"}))
        .await;
    assert_eq!(acquired.status, 201);
    let id = acquired.body["id"].as_i64().unwrap();
    let fence = acquired.body["fence"].as_i64().unwrap();
    let secret = acquired.body["secret"].as_str().unwrap().to_owned();
    assert_eq!(secret.len(), 64, "256 random bits, hex");
    assert!(secret.chars().all(|c| c.is_ascii_hexdigit()));

    // The secret is in no read and not in the table (only its digest is).
    for path in [
        "/api/leases",
        "/api/leases/active",
        &format!("/api/leases/{id}"),
    ] {
        let text = leases.get(path).await.body.to_string();
        assert!(!text.contains("secret"), "GET {path}: {text}");
    }
    let before = snapshot(&db, "leases").await;
    assert!(!before.concat().contains(&secret));

    // The sample's request shape, and the holder's name with its fence, prove nothing.
    let name_only = json!({"resource": "r", "holder": "h"});
    let with_fence = json!({"resource": "r", "holder": "h", "fence": fence});
    let wrong = json!({"resource": "r", "holder": "h", "secret": "0".repeat(64)});
    let attempts = [
        ("PUT", "/api/leases/renew".to_owned()),
        ("DELETE", "/api/leases/release".to_owned()),
        ("DELETE", format!("/api/leases/{id}")),
        ("POST", "/api/leases".to_owned()),
    ];
    for (method, path) in &attempts {
        for body in [&name_only, &with_fence] {
            let answer = leases.send_as(None, method, path, Some(body)).await;
            assert_eq!(
                (answer.status, answer.code(), answer.body["field"].as_str()),
                (400, "secret_required", Some("secret")),
                "{method} {path} {body}"
            );
        }
        let answer = leases.send_as(None, method, path, Some(&wrong)).await;
        assert_eq!(
            (answer.status, answer.code()),
            (409, "wrong_secret"),
            "{method} {path}"
        );
    }
    assert_eq!(before, snapshot(&db, "leases").await, "nothing changed");

    // With the secret: reentrant acquire (same fence, secret echoed), renew, release, and a
    // repeated release answers as the first did.
    let proven = json!({"resource": "r", "holder": "h", "secret": secret});
    let reentrant = leases.post("/api/leases", &proven).await;
    assert_eq!(
        (
            reentrant.status,
            reentrant.body["fence"].as_i64(),
            reentrant.body["secret"].as_str()
        ),
        (200, Some(fence), Some(secret.as_str()))
    );
    let renewed = leases.put("/api/leases/renew", &proven).await;
    assert_eq!(renewed.status, 200, "{:?}", renewed.body);
    assert!(renewed.body.get("secret").is_none());
    for _ in 0..2 {
        let released = leases.delete("/api/leases/release", &proven).await;
        assert_eq!(
            (released.status, released.body["status"].as_str()),
            (200, Some("released"))
        );
    }
    // The next holder gets a new secret; the old one proves nothing about the new lease.
    let next = leases
        .post("/api/leases", &json!({"resource": "r", "holder": "h"}))
        .await;
    assert_eq!(next.status, 201);
    assert_ne!(next.body["secret"].as_str(), Some(secret.as_str()));
    let stale = leases.put("/api/leases/renew", &proven).await;
    assert_eq!((stale.status, stale.code()), (409, "wrong_secret"));
}

#[tokio::test]
async fn without_proof_required_the_samples_requests_work_and_a_wrong_secret_is_still_refused() {
    let db = fresh_database().await;
    let leases = Service::lease_service(&db, &[]).await;
    let acquired = leases
        .post("/api/leases", &json!({"resource": "r", "holder": "h"}))
        .await;
    assert_eq!(acquired.status, 201);
    assert!(acquired.body["secret"].is_string());
    let name_only = json!({"resource": "r", "holder": "h"});
    let wrong = json!({"resource": "r", "holder": "h", "secret": "nope"});
    assert_eq!(leases.post("/api/leases", &name_only).await.status, 200);
    assert_eq!(
        leases.put("/api/leases/renew", &name_only).await.status,
        200
    );
    let refused = leases.put("/api/leases/renew", &wrong).await;
    assert_eq!((refused.status, refused.code()), (409, "wrong_secret"));
    let refused = leases.delete("/api/leases/release", &wrong).await;
    assert_eq!((refused.status, refused.code()), (409, "wrong_secret"));
    // An acquire's secret may become the lease's, so one that short is bad input there.
    let refused = leases.post("/api/leases", &wrong).await;
    assert_eq!((refused.status, refused.code()), (400, "invalid_secret"));
    let wrong = json!({"resource": "r", "holder": "h", "secret": "0".repeat(64)});
    let refused = leases.post("/api/leases", &wrong).await;
    assert_eq!((refused.status, refused.code()), (409, "wrong_secret"));
    assert_eq!(
        leases
            .delete("/api/leases/release", &name_only)
            .await
            .status,
        200
    );
}

/// Every string in `secrets` that occurs in `text`.
fn leaked<'a>(text: &str, secrets: &'a [String]) -> Vec<&'a str> {
    secrets
        .iter()
        .filter(|s| text.contains(s.as_str()))
        .map(String::as_str)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_locked_stack_runs_tasks_and_generator_and_no_secret_reaches_a_log_or_a_trace() {
    let receiver = OtlpReceiver::start();
    let endpoint = receiver.endpoint();
    let otel = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        (
            "RUST_LOG",
            "debug,h2=info,hyper=info,reqwest=info,tokio_postgres=info",
        ),
    ];
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let lease_tokens = format!("leaseholder:{SERVICE},leaseholder:{GENERATOR}");
    let mut env = vec![
        ("AUTH_TOKENS", lease_tokens.as_str()),
        ("LEASE_REQUIRE_SECRET", "true"),
    ];
    env.extend_from_slice(&otel);
    let mut leases = Service::lease_service(&lease_db, &env).await;
    let task_tokens =
        format!("producer:{PRODUCER},worker:{WORKER},operator:{OPERATOR},producer:{GENERATOR}");
    let mut env = vec![
        ("AUTH_TOKENS", task_tokens.as_str()),
        ("LEASE_SERVICE_TOKEN", SERVICE),
        ("TASK_LEASE_TTL_SECONDS", "3"),
    ];
    env.extend_from_slice(&otel);
    let mut tasks = Service::task_service(&task_db, &leases.base_url(), &env).await;
    let mut env = vec![
        ("AUTH_TOKEN", WORKER),
        ("WORKER_ID", "locked-worker"),
        ("WORKER_QUEUE", "default"),
        ("HEARTBEAT_INTERVAL_SECONDS", "0.5"),
        ("POLL_MAX_MS", "200"),
    ];
    env.extend_from_slice(&otel);
    let mut worker = Service::worker(&tasks.base_url(), &env).await;
    let mut env = vec![
        ("AUTH_TOKEN", GENERATOR),
        ("GENERATOR_LEASE_TTL_SECONDS", "3"),
        ("GENERATOR_RETRY_INTERVAL_SECONDS", "0.5"),
        ("GENERATOR_SETTINGS_POLL_MS", "200"),
    ];
    env.extend_from_slice(&otel);
    let mut generator = Service::generator(&tasks.base_url(), &leases.base_url(), "g1", &env).await;

    for _ in 0..5 {
        let created = tasks
            .send_as(
                Some(PRODUCER),
                "POST",
                "/api/tasks",
                Some(&json!({"task_data": {"sleep_duration_seconds": 1}})),
            )
            .await;
        assert_eq!(created.status, 201, "{:?}", created.body);
    }
    let started = tasks
        .send_as(
            Some(OPERATOR),
            "POST",
            "/api/generator/start",
            Some(&json!({"rate_per_second": 4, "min_sleep_seconds": 0, "max_sleep_seconds": 0.2})),
        )
        .await;
    assert_eq!(started.status, 200, "{:?}", started.body);
    eventually(
        Duration::from_secs(30),
        "the generator's tasks and ours done",
        || async {
            let counts = tasks.get("/api/tasks/counts").await.body;
            counts["total"]["succeeded"].as_i64().unwrap_or(0) >= 10
        },
    )
    .await;
    let stopped = tasks
        .send_as(Some(OPERATOR), "POST", "/api/generator/stop", None)
        .await;
    assert_eq!(stopped.status, 200);
    eventually(Duration::from_secs(30), "every task done", || async {
        let counts = tasks.get("/api/tasks/counts").await.body;
        counts["total"]["pending"].as_i64() == Some(0)
            && counts["total"]["running"].as_i64() == Some(0)
    })
    .await;
    let counts = tasks.get("/api/tasks/counts").await.body;
    assert_eq!(counts["total"]["dead"].as_i64().unwrap_or(0), 0, "{counts}");

    // The worker process's tasks are covered by its liveness lease (whose secret it drew
    // itself); tasks claimed as the sample's worker claims, naming no such lease, each take a
    // lease of their own, whose secret task-service stores.
    for _ in 0..5 {
        let created = tasks
            .send_as(
                Some(PRODUCER),
                "POST",
                "/api/tasks",
                Some(&json!({"task_data": {}, "queue": "anonymous"})),
            )
            .await;
        assert_eq!(created.status, 201, "{:?}", created.body);
        let claimed = tasks
            .send_as(
                Some(WORKER),
                "POST",
                "/api/tasks/next",
                Some(&json!({"processor": "sample-worker", "queue": "anonymous"})),
            )
            .await;
        assert_eq!(claimed.status, 202, "{:?}", claimed.body);
        for (what, body) in [
            ("heartbeat", json!({"processor": "sample-worker"})),
            (
                "complete",
                json!({"processor": "sample-worker", "task_output": {}}),
            ),
        ] {
            let answer = tasks
                .send_as(
                    Some(WORKER),
                    "PUT",
                    &format!("/api/tasks/{}/{what}", claimed.body["id"]),
                    Some(&body),
                )
                .await;
            assert_eq!(answer.status, 202, "{what}: {:?}", answer.body);
        }
    }

    // Every secret there is: the bearer tokens, and every task lease's secret that task-service
    // stored (the generator's own lease secret never leaves its process but in requests).
    let mut secrets: Vec<String> = [SERVICE, GENERATOR, PRODUCER, WORKER, OPERATOR]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    for row in snapshot(&task_db, "tasks").await {
        let row: Value = serde_json::from_str(&row).unwrap();
        if let Some(secret) = row["lease_secret"].as_str() {
            secrets.push(secret.to_owned());
        }
    }
    assert!(
        secrets.len() >= 10,
        "every task claimed as the sample's worker claims had a lease secret: {}",
        secrets.len()
    );

    // Stopped, each process has exported its last spans and written its last line; a fixed
    // wait would be no promise of either on a slow machine.
    for service in [&mut generator, &mut worker, &mut tasks, &mut leases] {
        let name = service.name.clone();
        assert_eq!(
            service.terminate(Duration::from_secs(30)).await,
            Some(0),
            "{name}"
        );
    }
    let spans = receiver.spans();
    for service in ["lease-service", "task-service", "worker"] {
        assert!(
            spans.iter().any(|s| s.service == service),
            "spans from {service}: the check below is not vacuous"
        );
    }
    let span_text: String = spans
        .iter()
        .map(|s| format!("{} {:?}\n", s.name, s.attributes))
        .collect();
    assert!(
        leaked(&span_text, &secrets).is_empty(),
        "secrets in spans: {:?}",
        leaked(&span_text, &secrets)
    );
    for service in [&leases, &tasks, &worker, &generator] {
        let log = service.log_text();
        assert!(log.len() > 1000, "{} logged at debug", service.name);
        assert!(
            leaked(&log, &secrets).is_empty(),
            "secrets in {}'s log: {:?}",
            service.name,
            leaked(&log, &secrets)
        );
    }
}

#[tokio::test]
async fn the_sweepers_lease_cannot_be_renewed_by_someone_who_knows_its_holders_name() {
    let db = fresh_database().await;
    let leases = Service::lease_service(
        &db,
        &[
            ("INSTANCE_ID", "replica-a"),
            ("LEASE_SWEEP_INTERVAL_SECONDS", "1"),
            ("LEASE_REQUIRE_SECRET", "true"),
        ],
    )
    .await;
    let resource = "leasehold:lease-retention-sweeper";
    eventually(Duration::from_secs(10), "the sweeper's lease", || async {
        let active = leases.get("/api/leases/active").await.body;
        active["leases"]
            .as_array()
            .is_some_and(|list| list.iter().any(|l| l["resource"] == resource))
    })
    .await;
    for guess in ["replica-a", "", "0"] {
        let body = json!({"resource": resource, "holder": "replica-a", "secret": guess});
        for (method, path) in [
            ("PUT", "/api/leases/renew"),
            ("DELETE", "/api/leases/release"),
        ] {
            let answer = leases.send_as(None, method, path, Some(&body)).await;
            assert_eq!(
                (answer.status, answer.code()),
                (409, "wrong_secret"),
                "{method} {path} with secret {guess:?}"
            );
        }
    }
}

/// The dashboard's revoke, with both services locked: a token task-service knows without the
/// operator role is refused there with 403 `forbidden`, as every other route refuses it (not
/// passed on to lease-service, which does not know it: 401), writing nothing; an unknown token
/// is 401; the operator's token revokes.
#[tokio::test]
async fn the_dashboards_revoke_refuses_a_known_token_without_the_role_with_403() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let lease_tokens = format!("leaseholder:{SERVICE},operator:{OPERATOR}");
    let leases = Service::lease_service(&lease_db, &[("AUTH_TOKENS", lease_tokens.as_str())]).await;
    let task_tokens = format!("producer:{PRODUCER},worker:{WORKER},operator:{OPERATOR}");
    let tasks = Service::task_service(
        &task_db,
        &leases.base_url(),
        &[
            ("AUTH_TOKENS", task_tokens.as_str()),
            ("LEASE_SERVICE_TOKEN", SERVICE),
        ],
    )
    .await;
    let held = leases
        .send_as(
            Some(SERVICE),
            "POST",
            "/api/leases",
            Some(&json!({"resource": "r", "holder": "h"})),
        )
        .await;
    assert_eq!(held.status, 201, "{:?}", held.body);
    let revoke = format!("/api/dashboard/leases/{}/revoke", held.body["id"]);

    let before = snapshot(&lease_db, "leases").await;
    for token in [PRODUCER, WORKER] {
        let answer = tasks.send_as(Some(token), "POST", &revoke, None).await;
        assert_refused(&answer, 403, &format!("revoke with {token}"));
    }
    for token in [None, Some(UNKNOWN), Some(SERVICE)] {
        let answer = tasks.send_as(token, "POST", &revoke, None).await;
        assert_refused(&answer, 401, &format!("revoke with {token:?}"));
    }
    assert_eq!(before, snapshot(&lease_db, "leases").await);

    let revoked = tasks.send_as(Some(OPERATOR), "POST", &revoke, None).await;
    assert_eq!(
        (revoked.status, revoked.body["status"].as_str()),
        (200, Some("revoked")),
        "{:?}",
        revoked.body
    );
}

/// A holder may bring its own secret: a new acquisition keeps the one its acquire presents, so
/// an acquire whose answer was lost and that is sent again is reentrant (same fence), never
/// refused for want of a proof the holder never saw. Renew and release take it as they take a
/// drawn one, a later new acquisition presenting it keeps it again, and another holder's is
/// still refused. A secret too short to be unguessable is refused and writes nothing.
#[tokio::test]
async fn an_acquire_that_brings_its_own_secret_holds_the_lease_with_it() {
    let db = fresh_database().await;
    let leases = Service::lease_service(&db, &[("LEASE_REQUIRE_SECRET", "true")]).await;
    let own = "f".repeat(64);
    let mine = json!({"resource": "r", "holder": "h", "secret": own});

    let first = leases.post("/api/leases", &mine).await;
    assert_eq!(first.status, 201, "{:?}", first.body);
    assert_eq!(first.body["secret"].as_str(), Some(own.as_str()));
    let fence = first.body["fence"].as_i64().unwrap();
    // Sent again, as after a lost answer: reentrant, same fence.
    let again = leases.post("/api/leases", &mine).await;
    assert_eq!(
        (again.status, again.body["fence"].as_i64()),
        (200, Some(fence)),
        "{:?}",
        again.body
    );
    let renewed = leases.put("/api/leases/renew", &mine).await;
    assert_eq!(renewed.status, 200, "{:?}", renewed.body);
    assert!(!snapshot(&db, "leases").await.concat().contains(&own));
    // Someone else's secret is no proof, and the holder's name alone is none either.
    let other = json!({"resource": "r", "holder": "h", "secret": "e".repeat(64)});
    let refused = leases.post("/api/leases", &other).await;
    assert_eq!((refused.status, refused.code()), (409, "wrong_secret"));
    let bare = leases
        .post("/api/leases", &json!({"resource": "r", "holder": "h"}))
        .await;
    assert_eq!((bare.status, bare.code()), (400, "secret_required"));

    let released = leases.delete("/api/leases/release", &mine).await;
    assert_eq!(released.status, 200, "{:?}", released.body);
    let next = leases.post("/api/leases", &mine).await;
    assert_eq!(next.status, 201, "{:?}", next.body);
    assert!(next.body["fence"].as_i64() > Some(fence));
    assert_eq!(
        leases.put("/api/leases/renew", &mine).await.status,
        200,
        "the new acquisition kept the secret it was given"
    );

    let before = snapshot(&db, "leases").await;
    for short in ["", "00ff", &"a".repeat(31)] {
        for resource in ["r", "fresh"] {
            let body = json!({"resource": resource, "holder": "h", "secret": short});
            let answer = leases.post("/api/leases", &body).await;
            assert_eq!(
                (answer.status, answer.code(), answer.body["field"].as_str()),
                (400, "invalid_secret", Some("secret")),
                "{body}"
            );
        }
    }
    assert_eq!(before, snapshot(&db, "leases").await);
}
