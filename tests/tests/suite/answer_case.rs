//! One convention holds across every answer of both services: field names are camelCase
//! (requests keep the sample's snake_case). Schedules once answered `task_data` and
//! `next_tick_at` among camelCase answers, unseen by a walk that predated them. This walks every
//! route of both services, writes and refusals included, with state behind each (leases, tasks
//! in every status, limits, a schedule, a worker, the generator), and looks at every key of
//! every answer, except inside the JSON that callers own (a task's data and output, a lease's
//! metadata) and the names callers chose.
#![allow(clippy::unwrap_used)]

use serde_json::{Value, json};
use tests::{Answer, Service, fresh_database};

/// Keys whose values are a caller's own JSON, kept as the caller wrote it.
const CALLERS_JSON: [&str; 3] = ["taskData", "taskOutput", "metadata"];

/// Every key under `value` that is not camelCase, with where it is. A map keyed by names the
/// callers chose (the counts' `queues`, an object, unlike `GET /api/queues`' list) is not ours
/// to name, but what it maps to is.
fn snake_keys(value: &Value, at: &str, found: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                let here = format!("{at}.{key}");
                if key.contains('_') || key.contains('-') || key.starts_with(char::is_uppercase) {
                    found.push(here.clone());
                }
                if CALLERS_JSON.contains(&key.as_str()) {
                    continue;
                }
                match (key.as_str(), inner) {
                    ("queues", Value::Object(named)) => {
                        for (name, inner) in named {
                            snake_keys(inner, &format!("{here}[{name:?}]"), found);
                        }
                    }
                    _ => snake_keys(inner, &here, found),
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                snake_keys(item, &format!("{at}[{i}]"), found);
            }
        }
        _ => {}
    }
}

struct Walk {
    found: Vec<String>,
    routes: usize,
}

impl Walk {
    /// Sends one request, expects it to succeed, and records the answer's keys.
    async fn call(&mut self, service: &Service, method: &str, path: &str, body: Value) -> Value {
        let answer: Answer = service.send_as(None, method, path, Some(&body)).await;
        assert!(
            (200..300).contains(&answer.status),
            "{method} {path} {body}: {} {:?}",
            answer.status,
            answer.body
        );
        self.routes += 1;
        snake_keys(&answer.body, &format!("{method} {path}"), &mut self.found);
        answer.body
    }

    /// Sends one request that must be refused, and records the refusal's keys: refusals are
    /// answers too.
    async fn refused(&mut self, service: &Service, method: &str, path: &str, body: Value) {
        let answer: Answer = service.send_as(None, method, path, Some(&body)).await;
        assert!(
            (400..500).contains(&answer.status),
            "{method} {path} {body}: {} {:?}",
            answer.status,
            answer.body
        );
        snake_keys(
            &answer.body,
            &format!("{method} {path} ({})", answer.status),
            &mut self.found,
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_answer_of_both_services_is_camel_case() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let tasks = Service::task_service(&task_db, &leases.base_url(), &[]).await;
    let mut walk = Walk {
        found: Vec::new(),
        routes: 0,
    };
    let (l, t) = (&leases, &tasks);

    // lease-service.
    let meta = json!({"snake_case": {"is_yours": true}});
    let lease = walk
        .call(
            l,
            "POST",
            "/api/leases",
            json!({"resource": "r", "holder": "h", "ttl_seconds": 30, "metadata": meta}),
        )
        .await;
    let fence = lease["fence"].clone();
    walk.call(
        l,
        "PUT",
        "/api/leases/renew",
        json!({"resource": "r", "holder": "h", "fence": fence}),
    )
    .await;
    walk.call(
        l,
        "POST",
        "/api/leases/batch",
        json!({"resources": ["b1", "b2"], "holder": "h", "ttl_seconds": 30}),
    )
    .await;
    walk.call(
        l,
        "POST",
        "/api/leases/batch/release",
        json!({"leases": [{"resource": "b1", "holder": "h"}]}),
    )
    .await;
    walk.call(
        l,
        "POST",
        "/api/leases/batch/check",
        json!({"leases": [{"resource": "b2", "fence": 1}]}),
    )
    .await;
    for path in [
        "/api/leases",
        "/api/leases/active",
        "/api/leases/expired",
        "/api/leases/renewed",
        "/api/leases/released",
        "/healthz",
        "/readyz",
    ] {
        walk.call(l, "GET", path, json!({})).await;
    }
    let id = lease["id"].as_i64().unwrap();
    walk.call(l, "GET", &format!("/api/leases/{id}"), json!({}))
        .await;
    walk.call(
        l,
        "DELETE",
        "/api/leases/release",
        json!({"resource": "r", "holder": "h"}),
    )
    .await;
    let by_id = walk
        .call(
            l,
            "POST",
            "/api/leases",
            json!({"resource": "r1", "holder": "h"}),
        )
        .await;
    walk.call(
        l,
        "DELETE",
        &format!("/api/leases/{}", by_id["id"]),
        json!({"resource": "r1", "holder": "h", "fence": by_id["fence"]}),
    )
    .await;
    let other = walk
        .call(
            l,
            "POST",
            "/api/leases",
            json!({"resource": "r2", "holder": "h"}),
        )
        .await;
    walk.call(
        l,
        "POST",
        &format!("/api/leases/{}/revoke", other["id"]),
        json!({}),
    )
    .await;

    // task-service: tasks through every status.
    let data = json!({"snake_case": 1});
    let first = walk
        .call(
            t,
            "POST",
            "/api/tasks",
            json!({"task_data": data, "queue": "q", "concurrency_key": "k"}),
        )
        .await;
    walk.call(
        t,
        "POST",
        "/api/tasks/batch",
        json!({"tasks": [{"task_data": {}, "queue": "q"}, {"task_data": {}, "queue": "q"},
                          {"task_data": {}, "queue": "q"}]}),
    )
    .await;
    let claimed = walk
        .call(
            t,
            "POST",
            "/api/tasks/next",
            json!({"processor": "w", "queue": "q", "limit": 4}),
        )
        .await;
    let held: Vec<(i64, Value)> = claimed
        .as_array()
        .unwrap()
        .iter()
        .map(|task| (task["id"].as_i64().unwrap(), task["fence"].clone()))
        .collect();
    assert_eq!(held.len(), 4, "{claimed}");
    let (a, fa) = &held[0];
    walk.call(
        t,
        "PUT",
        &format!("/api/tasks/{a}/heartbeat"),
        json!({"processor": "w", "fence": fa}),
    )
    .await;
    walk.call(
        t,
        "PUT",
        &format!("/api/tasks/{a}/complete"),
        json!({"processor": "w", "fence": fa, "task_output": {"out_put": 1}}),
    )
    .await;
    let (b, fb) = &held[1];
    walk.call(
        t,
        "PUT",
        &format!("/api/tasks/{b}/fail"),
        json!({"processor": "w", "fence": fb, "error": "no", "retryable": false}),
    )
    .await;
    let (c, fc) = &held[2];
    walk.call(
        t,
        "PUT",
        &format!("/api/tasks/{c}/snooze"),
        json!({"processor": "w", "fence": fc, "seconds": 3600}),
    )
    .await;
    let (d, fd) = &held[3];
    walk.call(
        t,
        "PUT",
        "/api/tasks/complete",
        json!({"processor": "w", "tasks": [{"id": d, "fence": fd, "task_output": {}}]}),
    )
    .await;
    walk.call(t, "POST", &format!("/api/tasks/{b}/retry"), json!({}))
        .await;
    walk.call(t, "POST", &format!("/api/tasks/{c}/cancel"), json!({}))
        .await;
    let id = first["id"].as_i64().unwrap();
    for path in [
        "/api/tasks".to_owned(),
        "/api/tasks/processed".to_owned(),
        "/api/tasks/started".to_owned(),
        "/api/tasks/counts".to_owned(),
        format!("/api/tasks/{id}"),
        format!("/api/tasks/{id}/events"),
    ] {
        walk.call(t, "GET", &path, json!({})).await;
    }
    for operation in ["retry", "cancel", "delete"] {
        walk.call(t, "POST", &format!("/api/tasks/{operation}"), json!({}))
            .await;
    }

    // Queues, schedules, workers, the generator, the dashboard.
    walk.call(
        t,
        "PUT",
        "/api/queues/q",
        json!({"concurrency_limit": 2, "key_concurrency_limit": 1,
               "rate_limit": {"per_second": 1, "burst": 2}}),
    )
    .await;
    for (method, path) in [
        ("GET", "/api/queues"),
        ("GET", "/api/queues/q"),
        ("POST", "/api/queues/q/pause"),
        ("POST", "/api/queues/q/resume"),
    ] {
        walk.call(t, method, path, json!({})).await;
    }
    let schedule = json!({"cron": "0 3 * * *", "task_data": {}, "catch_up": "none",
                          "misfire_grace_seconds": 30, "concurrency_key": "k"});
    let mut create = schedule.clone();
    create["name"] = json!("s");
    walk.call(t, "POST", "/api/schedules", create).await;
    walk.call(t, "PUT", "/api/schedules/s", schedule).await;
    for (method, path) in [
        ("GET", "/api/schedules"),
        ("GET", "/api/schedules/s"),
        ("POST", "/api/schedules/s/pause"),
        ("POST", "/api/schedules/s/resume"),
        ("DELETE", "/api/schedules/s"),
    ] {
        walk.call(t, method, path, json!({})).await;
    }
    let beat = walk
        .call(
            t,
            "PUT",
            "/api/workers/w1",
            json!({"instance": "i", "info": {"host": "h", "version": "1", "concurrency": 1,
                   "busy": 0, "done": 0}, "ttl_seconds": 10}),
        )
        .await;
    walk.call(t, "GET", "/api/workers", json!({})).await;
    walk.call(
        t,
        "DELETE",
        "/api/workers/w1",
        json!({"instance": "i", "fence": beat["fence"]}),
    )
    .await;
    for (method, path) in [
        ("GET", "/api/generator/status"),
        ("GET", "/api/generator/settings"),
        ("POST", "/api/generator/start"),
        ("POST", "/api/generator/stop"),
        ("GET", "/api/dashboard/overview"),
        ("GET", "/api/dashboard/throughput"),
        ("GET", "/api/dashboard/leases"),
        ("GET", "/healthz"),
        ("GET", "/readyz"),
    ] {
        walk.call(t, method, path, json!({})).await;
    }
    let held = walk
        .call(
            l,
            "POST",
            "/api/leases",
            json!({"resource": "r3", "holder": "h"}),
        )
        .await;
    walk.call(
        t,
        "POST",
        &format!("/api/dashboard/leases/{}/revoke", held["id"]),
        json!({}),
    )
    .await;

    // Refusals, those with details of their own (the holder of a held lease) among them.
    walk.call(
        l,
        "POST",
        "/api/leases",
        json!({"resource": "held", "holder": "h"}),
    )
    .await;
    walk.refused(
        l,
        "POST",
        "/api/leases",
        json!({"resource": "held", "holder": "someone else"}),
    )
    .await;
    walk.refused(
        l,
        "PUT",
        "/api/leases/renew",
        json!({"resource": "r", "holder": "h"}),
    )
    .await;
    walk.refused(t, "POST", "/api/tasks", json!({"task_data": 1}))
        .await;
    walk.refused(
        t,
        "PUT",
        &format!("/api/tasks/{id}/heartbeat"),
        json!({"processor": "x"}),
    )
    .await;
    walk.refused(t, "GET", "/api/schedules/ghost", json!({}))
        .await;

    // The walk does look inside: nested answers were read.
    let overview = walk
        .call(t, "GET", "/api/dashboard/overview", json!({}))
        .await;
    assert!(overview["oldestDue"].is_array(), "{overview}");
    let counts = walk.call(t, "GET", "/api/tasks/counts", json!({})).await;
    assert!(counts["queues"].is_object(), "{counts}");

    assert!(walk.routes >= 60, "walked {} routes", walk.routes);
    assert!(
        walk.found.is_empty(),
        "keys that are not camelCase:\n{}",
        walk.found.join("\n")
    );
}
