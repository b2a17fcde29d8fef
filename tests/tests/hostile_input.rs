//! Hostile input, generated: thousands of requests to every route with bodies and paths that are
//! random, truncated, oversized, of the wrong types, or valid but for one field. Whatever
//! arrives, the services answer below 500 with a JSON `{error, code}` when they refuse, and a
//! refused request writes nothing.
#![allow(clippy::unwrap_used)]

use std::sync::OnceLock;

use diesel::QueryableByName;
use diesel::sql_types::Text;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};
use tests::{Service, fresh_database};

/// Any JSON value, nested a little.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        ".{0,40}".prop_map(Value::String),
        "\\PC{0,600}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::hash_map("[a-z_]{1,16}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A valid body for the route, with one field replaced by anything (or removed).
fn near_valid(valid: Value) -> impl Strategy<Value = Value> {
    let keys: Vec<String> = valid
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    (0..keys.len().max(1), any_json(), any::<bool>()).prop_map(
        move |(index, replacement, remove)| {
            let mut body = valid.clone();
            if let (Some(object), Some(key)) = (body.as_object_mut(), keys.get(index)) {
                if remove {
                    object.remove(key);
                } else {
                    object.insert(key.clone(), replacement);
                }
            }
            body
        },
    )
}

/// A request body: JSON of any shape, a near-valid one, or raw bytes.
fn body(valid: Value) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => near_valid(valid).prop_map(|v| serde_json::to_vec(&v).unwrap()),
        2 => any_json().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        1 => prop::collection::vec(any::<u8>(), 0..300),
        1 => Just(Vec::new()),
    ]
}

/// A path segment standing for an id: numbers in and out of range, and junk.
fn id_segment() -> impl Strategy<Value = String> {
    prop_oneof![
        (1i64..5).prop_map(|n| n.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        "[0-9]{19,30}",
        "[a-zA-Z%._~-]{1,20}",
    ]
}

#[derive(QueryableByName)]
struct Digest {
    #[diesel(sql_type = Text)]
    digest: String,
}

/// A digest of every row of `tables`: equal before and after means nothing was written.
async fn digest(conn: &mut AsyncPgConnection, tables: &[&str]) -> String {
    let mut all = String::new();
    for table in tables {
        let row: Digest = diesel::sql_query(format!(
            "SELECT COALESCE(md5(string_agg(t::text, ',' ORDER BY t::text)), '') AS digest FROM {table} t"
        ))
        .get_result(conn)
        .await
        .unwrap();
        all.push_str(&row.digest);
    }
    all
}

#[derive(Debug, Clone)]
struct Target {
    method: &'static str,
    path: String,
    body: Vec<u8>,
}

/// Sends every generated request; fails on a 5xx, on a refusal without `{error, code}`, and on
/// a refusal that changed the database.
fn hammer(
    cases: u32,
    service: &Service,
    database_url: &str,
    tables: &[&str],
    strategy: impl Strategy<Value = Target>,
) {
    let runtime = tokio::runtime::Handle::current();
    let conn = tokio::sync::Mutex::new(tokio::task::block_in_place(|| {
        runtime
            .block_on(AsyncPgConnection::establish(database_url))
            .unwrap()
    }));
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&strategy, |target| {
        tokio::task::block_in_place(|| {
            runtime.block_on(async {
                let mut conn = conn.lock().await;
                let before = digest(&mut conn, tables).await;
                let answer = service
                    .raw(
                        target.method,
                        &target.path,
                        Some("application/json"),
                        target.body.clone(),
                    )
                    .await;
                prop_assert!(
                    answer.status < 500,
                    "{} {} {:?} -> {} {:?}",
                    target.method,
                    target.path,
                    String::from_utf8_lossy(&target.body),
                    answer.status,
                    answer.body
                );
                if answer.status >= 400 {
                    prop_assert!(
                        answer.body["error"].is_string() && answer.body["code"].is_string(),
                        "{} {} -> {} without a JSON error: {:?}",
                        target.method,
                        target.path,
                        answer.status,
                        answer.body
                    );
                    let after = digest(&mut conn, tables).await;
                    prop_assert_eq!(
                        before,
                        after,
                        "{} {} was refused ({}) but wrote",
                        target.method,
                        target.path,
                        answer.status
                    );
                }
                Ok(())
            })
        })
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

fn count() -> u32 {
    static CASES: OnceLock<u32> = OnceLock::new();
    *CASES.get_or_init(|| {
        std::env::var("HOSTILE_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(5000)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_service_survives_generated_hostile_requests() {
    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[]).await;
    // Some state for the requests to collide with.
    for (resource, holder) in [("a", "h"), ("b", "h"), ("c", "other")] {
        let answer = svc
            .post(
                "/api/leases",
                &json!({"resource": resource, "holder": holder}),
            )
            .await;
        assert_eq!(answer.status, 201);
    }
    let lease =
        json!({"resource": "a", "holder": "h", "ttl_seconds": 30, "fence": 1, "secret": "00ff"});
    let strategy = prop_oneof![
        body(lease.clone()).prop_map(|body| Target {
            method: "POST",
            path: "/api/leases".into(),
            body
        }),
        body(lease.clone()).prop_map(|body| Target {
            method: "PUT",
            path: "/api/leases/renew".into(),
            body
        }),
        body(lease.clone()).prop_map(|body| Target {
            method: "DELETE",
            path: "/api/leases/release".into(),
            body
        }),
        (id_segment(), body(lease.clone())).prop_map(|(id, body)| Target {
            method: "DELETE",
            path: format!("/api/leases/{id}"),
            body
        }),
        (id_segment(), body(lease.clone())).prop_map(|(id, body)| Target {
            method: "POST",
            path: format!("/api/leases/{id}/revoke"),
            body
        }),
        body(json!({"resources": ["a", "b", "new"], "holder": "h", "ttl_seconds": 30})).prop_map(
            |body| Target {
                method: "POST",
                path: "/api/leases/batch".into(),
                body
            }
        ),
        id_segment().prop_map(|id| Target {
            method: "GET",
            path: format!("/api/leases/{id}"),
            body: Vec::new()
        }),
        (
            prop::sample::select(vec!["", "/active", "/expired", "/renewed", "/released"]),
            "[a-z0-9=&%_-]{0,40}"
        )
            .prop_map(|(list, query)| Target {
                method: "GET",
                path: format!("/api/leases{list}?{query}"),
                body: Vec::new()
            }),
        (
            prop::sample::select(vec!["PATCH", "PUT", "POST", "DELETE"]),
            "[a-z/]{0,20}"
        )
            .prop_map(|(method, path)| Target {
                method,
                path: format!("/api/{path}"),
                body: b"{}".to_vec()
            }),
    ];
    hammer(count(), &svc, &db, &["leases"], strategy);
    assert_eq!(svc.get("/healthz").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_service_survives_generated_hostile_requests() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let tasks = Service::task_service(&task_db, &leases.base_url(), &[]).await;
    for n in 0..3 {
        let answer = tasks
            .post("/api/tasks", &json!({"task_data": {"n": n}}))
            .await;
        assert_eq!(answer.status, 201);
    }
    let claimed = tasks
        .post("/api/tasks/next", &json!({"processor": "p"}))
        .await;
    assert_eq!(claimed.status, 202);

    let create = json!({"task_data": {"sleep_duration_seconds": 1}, "queue": "q", "priority": 1,
                        "max_attempts": 3, "idempotency_key": "k", "scheduled_at": "2030-01-01T00:00:00Z"});
    let next = json!({"processor": "p", "queue": "q", "limit": 2});
    let update = json!({"processor": "p", "fence": 1, "task_output": {"ok": true}, "error": "e",
                        "retryable": true, "requeue": false});
    let start = json!({"rate_per_second": 1.0, "min_sleep_seconds": 0.0, "max_sleep_seconds": 1.0});
    let strategy = prop_oneof![
        body(create).prop_map(|body| Target {
            method: "POST",
            path: "/api/tasks".into(),
            body
        }),
        body(next).prop_map(|body| Target {
            method: "POST",
            path: "/api/tasks/next".into(),
            body
        }),
        (
            id_segment(),
            prop::sample::select(vec!["heartbeat", "complete", "fail"]),
            body(update.clone())
        )
            .prop_map(|(id, action, body)| Target {
                method: "PUT",
                path: format!("/api/tasks/{id}/{action}"),
                body
            }),
        body(
            json!({"processor": "p", "tasks": [{"id": 1, "fence": 1, "task_output": {}},
                                                 {"id": 2, "task_output": null}]})
        )
        .prop_map(|body| Target {
            method: "PUT",
            path: "/api/tasks/complete".into(),
            body
        }),
        id_segment().prop_map(|id| Target {
            method: "GET",
            path: format!("/api/tasks/{id}"),
            body: Vec::new()
        }),
        "[a-z0-9=&%,_-]{0,40}".prop_map(|query| Target {
            method: "GET",
            path: format!("/api/dashboard/leases?{query}"),
            body: Vec::new()
        }),
        id_segment().prop_map(|id| Target {
            method: "GET",
            path: format!("/api/tasks/{id}/events"),
            body: Vec::new()
        }),
        (id_segment(), body(json!({}))).prop_map(|(id, body)| Target {
            method: "POST",
            path: format!("/api/dashboard/leases/{id}/revoke"),
            body
        }),
        (
            prop::sample::select(vec!["", "/processed", "/started", "/counts"]),
            "[a-z0-9=&%,_-]{0,40}"
        )
            .prop_map(|(list, query)| Target {
                method: "GET",
                path: format!("/api/tasks{list}?{query}"),
                body: Vec::new()
            }),
        body(start).prop_map(|body| Target {
            method: "POST",
            path: "/api/generator/start".into(),
            body
        }),
    ];
    hammer(
        count(),
        &tasks,
        &task_db,
        &["tasks", "generator_settings"],
        strategy,
    );
    assert_eq!(tasks.get("/healthz").await.status, 200);
}
