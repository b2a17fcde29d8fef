//! Hostile input, generated: thousands of requests to every route with bodies and paths that are
//! random, truncated, oversized, of the wrong types, or valid but for one field; with query
//! strings of any parameters and values (numbers past every integer's range, NUL, over-long or
//! broken text); and with any content type, from no origin, the service's own or a foreign web
//! page's. Whatever arrives, the services answer below 500 with a JSON `{error, code}` when they
//! refuse, a refused request writes nothing, and where the front door alone decides (a foreign
//! page's write or preflight 403, a body not declared JSON 415, NUL in a query 400) the status is
//! that one.
#![allow(clippy::unwrap_used)]

use std::sync::OnceLock;

use diesel::QueryableByName;
use diesel::sql_types::Text;
use diesel_async::{AsyncConnection, AsyncPgConnection};
use leasehold::percent::encode;
use leasehold::server::db::OneRow;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};
use tests::{Service, fresh_database};

/// Floats at the edges, where arithmetic raises instead of rounding (a rate of 5e-324 once
/// underflowed a claim's float8 and failed every claim): subnormals, both zeros, the largest,
/// integers written as floats, and integers past 2^53.
fn edge_float() -> impl Strategy<Value = f64> {
    prop::sample::select(vec![
        5e-324,
        -5e-324,
        1e-310,
        f64::MIN_POSITIVE,
        1e-300,
        0.0,
        -0.0,
        1e-6,
        0.5,
        1.0,
        3.0,
        1000.0,
        86_400.0,
        2_147_483_648.0,
        9_007_199_254_740_993.0,
        1e300,
        f64::MAX,
        -f64::MAX,
        -1.0,
    ])
}

/// Any JSON value, nested a little.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        edge_float().prop_map(|f| json!(f)),
        ".{0,40}".prop_map(Value::String),
        "\\PC{0,600}".prop_map(Value::String),
        timestamp().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::hash_map("[a-z_]{1,16}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A time as RFC 3339 writes it, of any year from 300,000 BC to 300,000 AD (PostgreSQL's
/// `timestamptz` holds 4713 BC to 294276 AD), or something close to one.
fn timestamp() -> impl Strategy<Value = String> {
    prop_oneof![
        (-300_000i32..=300_000).prop_map(|year| {
            let sign = match year {
                ..0 => "-",
                10_000.. => "+",
                _ => "",
            };
            format!("{sign}{:04}-06-15T12:00:00.123456789Z", year.abs())
        }),
        "[+-]?[0-9]{4,6}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?(Z|[+-][01][0-9]:[0-5][0-9])",
    ]
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

/// A path segment standing for a name (a queue's, a schedule's, a worker's): names that exist,
/// any text percent-encoded, bytes that are not UTF-8, NUL, and over-long names.
fn name_segment() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec!["q", "default", "s", "w"]).prop_map(str::to_owned),
        2 => "\\PC{1,30}".prop_map(|name| encode(&name)),
        1 => prop::collection::vec(any::<u8>(), 1..8).prop_map(|bytes| {
            bytes.iter().map(|b| format!("%{b:02X}")).collect()
        }),
        1 => Just("a%00b".to_owned()),
        1 => "[a-z]{300,400}",
    ]
}

/// A queue's limits with any numbers where it takes numbers, edge floats most of all.
fn queue_limits() -> impl Strategy<Value = Vec<u8>> {
    let number = prop_oneof![
        2 => edge_float().prop_map(|f| json!(f)),
        1 => any::<i64>().prop_map(|n| json!(n)),
        1 => Just(json!(5)),
    ];
    (number.clone(), number.clone(), number.clone(), number)
        .prop_map(|(concurrency, per_key, per_second, burst)| {
            serde_json::to_vec(&json!({
                "concurrency_limit": concurrency,
                "key_concurrency_limit": per_key,
                "rate_limit": {"per_second": per_second, "burst": burst},
            }))
            .unwrap()
        })
        .boxed()
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
        .get_one(conn)
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
    /// `Content-Type`, `Origin`, ...
    headers: Vec<(&'static str, String)>,
    /// The status the request must get, where the front door alone decides it.
    expect: Option<u16>,
}

impl Target {
    /// A request as the services' clients send it: any body, declared JSON.
    fn json(method: &'static str, path: impl Into<String>, body: Vec<u8>) -> Target {
        Target {
            method,
            path: path.into(),
            body,
            headers: vec![("content-type", "application/json".to_owned())],
            expect: None,
        }
    }
}

/// Sends `target` with its content type and origin, if any.
async fn send(client: &reqwest::Client, service: &Service, target: &Target) -> tests::Answer {
    let mut request = client
        .request(
            reqwest::Method::from_bytes(target.method.as_bytes()).unwrap(),
            service.url(&target.path),
        )
        .body(target.body.clone());
    for (name, value) in &target.headers {
        request = request.header(*name, value.as_str());
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response.bytes().await.unwrap();
    tests::Answer {
        status,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        headers,
    }
}

/// Sends every generated request; fails on a 5xx, on a refusal without `{error, code}`, on a
/// refusal that changed the database, and on a status other than the one the target expects.
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
    let client = reqwest::Client::new();
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
                let answer = send(&client, service, &target).await;
                if let Some(expected) = target.expect {
                    prop_assert_eq!(
                        answer.status,
                        expected,
                        "{} {} {:?} {:?} -> {:?}",
                        target.method,
                        target.path,
                        target.headers,
                        String::from_utf8_lossy(&target.body),
                        answer.body
                    );
                }
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
                    // One refusal writes by design: a worker's call on a task an operator
                    // cancelled meanwhile ends it as cancelled, and answers 409 `cancelled`.
                    let after = if answer.body["code"] == "cancelled" {
                        before.clone()
                    } else {
                        digest(&mut conn, tables).await
                    };
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
        body(lease.clone()).prop_map(|body| Target::json("POST", "/api/leases", body)),
        body(lease.clone()).prop_map(|body| Target::json("PUT", "/api/leases/renew", body)),
        body(lease.clone()).prop_map(|body| Target::json("DELETE", "/api/leases/release", body)),
        (id_segment(), body(lease.clone())).prop_map(|(id, body)| Target::json(
            "DELETE",
            format!("/api/leases/{id}"),
            body
        )),
        (id_segment(), body(lease.clone())).prop_map(|(id, body)| Target::json(
            "POST",
            format!("/api/leases/{id}/revoke"),
            body
        )),
        body(json!({"resources": ["a", "b", "new"], "holder": "h", "ttl_seconds": 30}))
            .prop_map(|body| Target::json("POST", "/api/leases/batch", body)),
        id_segment().prop_map(|id| Target::json("GET", format!("/api/leases/{id}"), Vec::new())),
        (
            prop::sample::select(vec!["", "/active", "/expired", "/renewed", "/released"]),
            "[a-z0-9=&%_-]{0,40}"
        )
            .prop_map(|(list, query)| Target::json(
                "GET",
                format!("/api/leases{list}?{query}"),
                Vec::new()
            )),
        (
            prop::sample::select(vec!["PATCH", "PUT", "POST", "DELETE"]),
            "[a-z/]{0,20}"
        )
            .prop_map(|(method, path)| Target::json(
                method,
                format!("/api/{path}"),
                b"{}".to_vec()
            )),
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
    let batch = json!({"tasks": [create.clone(), {"task_data": {}}]});
    let next =
        json!({"processor": "p", "queue": "q", "limit": 2, "worker": {"id": "w", "fence": 1}});
    let update = json!({"processor": "p", "fence": 1, "task_output": {"ok": true}, "error": "e",
                        "retryable": true, "requeue": false});
    let start = json!({"rate_per_second": 1.0, "min_sleep_seconds": 0.0, "max_sleep_seconds": 1.0});
    let strategy = prop_oneof![
        body(create).prop_map(|body| Target::json("POST", "/api/tasks", body)),
        timestamp().prop_map(|at| Target::json(
            "POST",
            "/api/tasks",
            serde_json::to_vec(&json!({"task_data": {}, "scheduled_at": at})).unwrap()
        )),
        body(batch).prop_map(|body| Target::json("POST", "/api/tasks/batch", body)),
        body(next).prop_map(|body| Target::json("POST", "/api/tasks/next", body)),
        (
            id_segment(),
            prop::sample::select(vec!["heartbeat", "complete", "fail"]),
            body(update.clone())
        )
            .prop_map(|(id, action, body)| Target::json(
                "PUT",
                format!("/api/tasks/{id}/{action}"),
                body
            )),
        prop_oneof![
            body(
                json!({"processor": "p", "tasks": [{"id": 1, "fence": 1, "task_output": {}},
                                                     {"id": 2, "task_output": null}]})
            ),
            // A completion that claims the next tasks in the same transaction.
            body(json!({"processor": "p", "tasks": [{"id": 1, "fence": 1}],
                        "next": {"queue": "q", "limit": 2, "worker": {"id": "w", "fence": 1}}})),
        ]
        .prop_map(|body| Target::json("PUT", "/api/tasks/complete", body)),
        id_segment().prop_map(|id| Target::json("GET", format!("/api/tasks/{id}"), Vec::new())),
        (
            id_segment(),
            body(
                json!({"instance": "i", "info": {"host": "h", "version": "1", "queue": "q", "concurrency": 2,
                                 "busy": 1, "done": 3}, "ttl_seconds": 5, "fence": 1})
            )
        )
            .prop_map(|(id, body)| Target::json("PUT", format!("/api/workers/{id}"), body)),
        "[a-z0-9=&%,_-]{0,40}".prop_map(|query| Target::json(
            "GET",
            format!("/api/dashboard/leases?{query}"),
            Vec::new()
        )),
        id_segment().prop_map(|id| Target::json(
            "GET",
            format!("/api/tasks/{id}/events"),
            Vec::new()
        )),
        (id_segment(), body(json!({}))).prop_map(|(id, body)| Target::json(
            "POST",
            format!("/api/dashboard/leases/{id}/revoke"),
            body
        )),
        (
            prop::sample::select(vec!["", "/processed", "/started", "/counts"]),
            "[a-z0-9=&%,_-]{0,40}"
        )
            .prop_map(|(list, query)| Target::json(
                "GET",
                format!("/api/tasks{list}?{query}"),
                Vec::new()
            )),
        body(start).prop_map(|body| Target::json("POST", "/api/generator/start", body)),
    ];
    // The routes added for queues, schedules, bulk operations and workers. A schedule's cron
    // fires yearly, so that no tick writes between a request and the check that it wrote nothing.
    let schedule = json!({"name": "s", "cron": "0 0 1 1 *", "task_data": {"n": 1}, "queue": "q",
                          "priority": 1, "max_attempts": 2, "concurrency_key": "k",
                          "timezone": "Europe/Paris", "catch_up": "none",
                          "misfire_grace_seconds": 30});
    let bulk = json!({"status": "dead", "queue": "q", "processor": "p", "key": "k", "ids": [1, 2],
                      "created_after": "2020-01-01T00:00:00Z",
                      "created_before": "2090-01-01T00:00:00Z", "limit": 10});
    let newer = prop_oneof![
        (name_segment(), queue_limits()).prop_map(|(name, body)| Target::json(
            "PUT",
            format!("/api/queues/{name}"),
            body
        )),
        (
            name_segment(),
            body(json!({"concurrency_limit": 2, "key_concurrency_limit": 1,
                                     "rate_limit": {"per_second": 1.5, "burst": 2}}))
        )
            .prop_map(|(name, body)| Target::json(
                "PUT",
                format!("/api/queues/{name}"),
                body
            )),
        (
            name_segment(),
            prop::sample::select(vec!["pause", "resume"]),
        )
            .prop_map(|(name, action)| Target::json(
                "POST",
                format!("/api/queues/{name}/{action}"),
                Vec::new()
            )),
        name_segment().prop_map(|name| Target::json(
            "GET",
            format!("/api/queues/{name}"),
            Vec::new()
        )),
        body(schedule.clone()).prop_map(|body| Target::json("POST", "/api/schedules", body)),
        (name_segment(), body(schedule)).prop_map(|(name, body)| Target::json(
            "PUT",
            format!("/api/schedules/{name}"),
            body
        )),
        (
            name_segment(),
            prop::sample::select(vec!["/pause", "/resume", ""]),
            prop::sample::select(vec!["POST", "DELETE", "GET"]),
        )
            .prop_map(|(name, action, method)| Target::json(
                method,
                format!("/api/schedules/{name}{action}"),
                Vec::new()
            )),
        (
            prop::sample::select(vec!["retry", "cancel", "delete"]),
            body(bulk)
        )
            .prop_map(|(operation, body)| Target::json(
                "POST",
                format!("/api/tasks/{operation}"),
                body
            )),
        (name_segment(), body(json!({"instance": "i", "fence": 1})))
            .prop_map(|(id, body)| Target::json("DELETE", format!("/api/workers/{id}"), body)),
        (
            prop::sample::select(vec![
                "/api/queues",
                "/api/schedules",
                "/api/workers",
                "/api/dashboard/throughput",
                "/api/dashboard/overview"
            ]),
            "[a-z0-9=&%,_.-]{0,40}"
        )
            .prop_map(|(path, query)| Target::json(
                "GET",
                format!("{path}?{query}"),
                Vec::new()
            )),
    ];
    let strategy = prop_oneof![2 => strategy, 1 => newer];
    hammer(
        count(),
        &tasks,
        &task_db,
        &["tasks", "generator_settings", "queues", "schedules"],
        strategy,
    );
    // Claims of any queue still serve, whatever limits and pauses the requests above left on
    // the others.
    let fresh = tasks
        .post(
            "/api/tasks",
            &json!({"task_data": {}, "queue": "untouched-by-the-hammer"}),
        )
        .await;
    assert_eq!(fresh.status, 201, "{:?}", fresh.body);
    let claim = tasks
        .post(
            "/api/tasks/next",
            &json!({"processor": "after", "limit": 5}),
        )
        .await;
    assert_eq!(claim.status, 202, "{:?}", claim.body);
    assert_eq!(tasks.get("/healthz").await.status, 200);
}

/// A query parameter's name: one the routes read, or any other.
fn param_name() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "limit", "cursor", "order", "status", "queue", "resource", "resource_prefix",
        ])
        .prop_map(str::to_owned),
        1 => "[a-z_]{1,12}",
    ]
}

/// A query parameter's value as it goes on the wire: numbers in and out of every integer's
/// range, words the routes know and do not, any text percent-encoded (control characters and
/// NUL among it), over-long text, NUL on purpose, and broken percent-encoding.
fn param_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        "-?[0-9]{10,40}",
        "-?[0-9]{1,6}\\.[0-9]{1,6}(e[+-]?[0-9]{1,3})?",
        prop::sample::select(vec![
            "",
            "asc",
            "desc",
            "DESC",
            "pending,running",
            "dead,bogus",
            ",",
            "null",
            "NaN",
            "-0",
            "0",
            "-1",
            "2147483648",
            "9223372036854775808",
        ])
        .prop_map(str::to_owned),
        "\\PC{0,40}".prop_map(|v| encode(&v)),
        any::<String>().prop_map(|v| encode(&v)),
        "[a-z]{0,5}".prop_map(|v| format!("{v}%00{v}")),
        "x{500,700}",
        "%[0-9A-Za-z]{0,2}",
        "[a-z]{1,4}%(C3|E2%82|F0%9F%98|FF|C0%80)",
    ]
}

/// A query string of a few parameters.
fn query() -> impl Strategy<Value = String> {
    prop::collection::vec((param_name(), param_value()), 0..5).prop_map(|pairs| {
        pairs
            .into_iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect::<Vec<_>>()
            .join("&")
    })
}

/// `path?query` read with GET: a query with NUL must get 400.
fn read_with_query(paths: Vec<&'static str>) -> impl Strategy<Value = Target> {
    (prop::sample::select(paths), query()).prop_map(|(path, query)| {
        let mut target = Target::json("GET", format!("{path}?{query}"), Vec::new());
        target.headers.clear();
        if query.contains("%00") {
            target.expect = Some(400);
        }
        target
    })
}

/// A `Content-Type` header (or none), and whether it declares JSON.
fn content_type() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        Just(None),
        prop::sample::select(vec![
            "application/json",
            "application/json; charset=utf-8",
            "APPLICATION/JSON",
            "application/problem+json",
            "application/vnd.leasehold+json; v=1",
            "text/plain",
            "text/plain;charset=UTF-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=----x",
            "text/xml",
            "application/octet-stream",
            "application/jsonp",
            "application/json-seq",
            "json",
            "*/*",
            "",
        ])
        .prop_map(|c| Some(c.to_owned())),
        "[a-zA-Z0-9/+.;= -]{0,40}".prop_map(Some),
    ]
}

/// The front door's rule: `application/json` or `application/*+json`, any parameters.
fn declares_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// A write to one of `routes` (method, path, a valid body) with any content type, from no
/// origin, the service's own or a foreign one, with a body or none, and a query string now and
/// then. A foreign page's write must get 403; a body not declared JSON 415; NUL in the query
/// 400.
fn write_with_content_type(
    routes: Vec<(&'static str, &'static str, Value)>,
    own_origin: String,
) -> impl Strategy<Value = Target> {
    let origin = prop_oneof![
        2 => Just(None),
        1 => Just(Some(own_origin)),
        1 => prop::sample::select(vec!["https://evil.example", "null", "http://127.0.0.1:1"])
            .prop_map(|o| Some(o.to_owned())),
    ];
    let route = prop::sample::select(routes).prop_flat_map(|(method, path, valid)| {
        (
            Just(method),
            Just(path),
            prop_oneof![
                2 => Just(serde_json::to_vec(&valid).unwrap()),
                2 => near_valid(valid).prop_map(|v| serde_json::to_vec(&v).unwrap()),
                1 => Just(Vec::new()),
                1 => "[a-z_]{1,10}=[a-z0-9]{0,10}".prop_map(String::into_bytes),
            ],
        )
    });
    (
        route,
        content_type(),
        origin,
        prop::option::weighted(0.2, query()),
    )
        .prop_map(|((method, path, body), content_type, origin, query)| {
            let foreign = origin
                .as_deref()
                .is_some_and(|o| !o.starts_with("http://127.0.0.1:") || o.ends_with(":1"));
            let query = query.unwrap_or_default();
            let expect = if foreign {
                Some(403)
            } else if !body.is_empty() && !content_type.as_deref().is_some_and(declares_json) {
                Some(415)
            } else if query.contains("%00") {
                Some(400)
            } else {
                None
            };
            let mut headers = Vec::new();
            if let Some(content_type) = content_type {
                headers.push(("content-type", content_type));
            }
            if let Some(origin) = origin {
                headers.push(("origin", origin));
            }
            Target {
                method,
                path: format!("{path}?{query}"),
                body,
                headers,
                expect,
            }
        })
}

/// A foreign page's CORS preflight, to any path: refused, 403.
fn foreign_preflight(paths: Vec<&'static str>) -> impl Strategy<Value = Target> {
    (
        prop::sample::select(paths),
        prop::sample::select(vec!["POST", "PUT", "DELETE", "PATCH", "GET"]),
    )
        .prop_map(|(path, method)| Target {
            method: "OPTIONS",
            path: path.to_owned(),
            body: Vec::new(),
            headers: vec![
                ("origin", "https://evil.example".to_owned()),
                ("access-control-request-method", method.to_owned()),
                ("access-control-request-headers", "content-type".to_owned()),
            ],
            expect: Some(403),
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_service_survives_hostile_query_strings_and_content_types() {
    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[]).await;
    for (resource, holder) in [("a", "h"), ("b", "h"), ("c", "other")] {
        let answer = svc
            .post(
                "/api/leases",
                &json!({"resource": resource, "holder": holder}),
            )
            .await;
        assert_eq!(answer.status, 201);
    }
    let paths = vec![
        "/api/leases",
        "/api/leases/active",
        "/api/leases/expired",
        "/api/leases/renewed",
        "/api/leases/released",
        "/api/leases/1",
        "/healthz",
        "/readyz",
        "/metrics",
    ];
    let lease = json!({"resource": "a", "holder": "h", "ttl_seconds": 30});
    let routes = vec![
        (
            "POST",
            "/api/leases",
            json!({"resource": "new", "holder": "h"}),
        ),
        ("PUT", "/api/leases/renew", lease.clone()),
        (
            "DELETE",
            "/api/leases/release",
            json!({"resource": "b", "holder": "h"}),
        ),
        (
            "DELETE",
            "/api/leases/3",
            json!({"resource": "c", "holder": "other"}),
        ),
        ("POST", "/api/leases/2/revoke", json!({})),
        (
            "POST",
            "/api/leases/batch",
            json!({"resources": ["x", "y"], "holder": "h"}),
        ),
        (
            "POST",
            "/api/leases/batch/release",
            json!({"leases": [{"resource": "a", "holder": "h"}]}),
        ),
        (
            "POST",
            "/api/leases/batch/check",
            json!({"leases": [{"resource": "a", "fence": 1}]}),
        ),
    ];
    let strategy = prop_oneof![
        3 => read_with_query(paths.clone()),
        3 => write_with_content_type(routes, svc.base_url()),
        1 => foreign_preflight(paths),
    ];
    hammer(count(), &svc, &db, &["leases"], strategy);
    assert_eq!(svc.get("/healthz").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_service_survives_hostile_query_strings_and_content_types() {
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
    let paths = vec![
        "/api/tasks",
        "/api/tasks/processed",
        "/api/tasks/started",
        "/api/tasks/counts",
        "/api/tasks/1",
        "/api/tasks/1/events",
        "/api/dashboard/leases",
        "/api/dashboard/overview",
        "/api/generator/status",
        "/api/generator/settings",
        "/dashboard",
        "/metrics",
        "/readyz",
    ];
    let routes = vec![
        (
            "POST",
            "/api/tasks",
            json!({"task_data": {"sleep_duration_seconds": 1}, "queue": "q",
                   "scheduled_at": "2030-01-01T00:00:00Z"}),
        ),
        (
            "POST",
            "/api/tasks/next",
            json!({"processor": "p2", "limit": 2}),
        ),
        (
            "PUT",
            "/api/tasks/1/heartbeat",
            json!({"processor": "p", "fence": 1}),
        ),
        (
            "PUT",
            "/api/tasks/1/complete",
            json!({"processor": "p", "task_output": {"ok": true}}),
        ),
        (
            "PUT",
            "/api/tasks/complete",
            json!({"processor": "p", "tasks": [{"id": 1, "task_output": {}}]}),
        ),
        ("POST", "/api/tasks/2/cancel", json!({})),
        ("POST", "/api/tasks/3/retry", json!({})),
        (
            "POST",
            "/api/generator/start",
            json!({"rate_per_second": 2}),
        ),
        ("DELETE", "/api/generator/stop", json!({})),
        ("POST", "/api/dashboard/leases/1/revoke", json!({})),
    ];
    let strategy = prop_oneof![
        3 => read_with_query(paths.clone()),
        3 => write_with_content_type(routes, tasks.base_url()),
        1 => foreign_preflight(paths),
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
