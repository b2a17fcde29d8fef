//! The front door both services share: a write's body must be declared JSON, a web page of
//! another origin can neither write nor get a CORS preflight answered unless
//! `CORS_ALLOWED_ORIGINS` names it, and what is refused writes nothing. Requests without a body
//! (the sample's generator start and stop, a cancel) and the services' own clients keep
//! working.
#![allow(clippy::unwrap_used)]

use serde_json::{Value, json};
use tests::{Answer, Service, fresh_database, snapshot};

const EVIL: &str = "https://evil.example";

/// `method path` with `headers` and, if any, `body`.
async fn send(
    service: &Service,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Answer {
    let client = reqwest::Client::new();
    let mut request = client.request(
        reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
        service.url(path),
    );
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    if let Some(body) = body {
        request = request.body(body.to_owned());
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response.bytes().await.unwrap();
    Answer {
        status,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        headers,
    }
}

fn assert_refused(answer: &Answer, status: u16, code: &str, what: &str) {
    assert_eq!(
        (answer.status, answer.code()),
        (status, code),
        "{what}: {:?}",
        answer.body
    );
    assert!(
        answer.body["error"].is_string(),
        "{what}: {:?}",
        answer.body
    );
    assert!(
        !answer.headers.contains_key("access-control-allow-origin"),
        "{what}: no CORS grant"
    );
}

async fn stack(env: &[(&str, &str)]) -> tests::Stack {
    tests::Stack::with().env(env).start().await
}

#[tokio::test]
async fn a_write_body_must_be_declared_json_and_a_write_without_one_needs_no_content_type() {
    let s = stack(&[]).await;
    let task = r#"{"task_data": {"sleep_duration_seconds": 1}}"#;
    for (content_type, what) in [
        (Some("text/plain"), "text/plain"),
        (
            Some("text/plain;charset=UTF-8"),
            "text/plain with a charset",
        ),
        (Some("application/x-www-form-urlencoded"), "a form"),
        (Some("multipart/form-data; boundary=x"), "multipart"),
        (None, "no content type"),
    ] {
        let headers: Vec<(&str, &str)> = content_type
            .map(|c| vec![("content-type", c)])
            .unwrap_or_default();
        let answer = send(&s.tasks, "POST", "/api/tasks", &headers, Some(task)).await;
        assert_refused(&answer, 415, "unsupported_media_type", what);
        let answer = send(
            &s.leases,
            "POST",
            "/api/leases",
            &headers,
            Some(r#"{"resource": "r", "holder": "h"}"#),
        )
        .await;
        assert_refused(&answer, 415, "unsupported_media_type", what);
    }
    assert!(snapshot(&s.task_db, "tasks").await.is_empty());
    assert!(snapshot(&s.lease_db, "leases").await.is_empty());

    // JSON, with parameters or as a +json type, is served.
    let answer = send(
        &s.tasks,
        "POST",
        "/api/tasks",
        &[("content-type", "application/json; charset=utf-8")],
        Some(task),
    )
    .await;
    assert_eq!(answer.status, 201, "{:?}", answer.body);
    let id = answer.body["id"].as_i64().unwrap();
    let answer = send(
        &s.leases,
        "POST",
        "/api/leases",
        &[("content-type", "application/vnd.leasehold+json")],
        Some(r#"{"resource": "r", "holder": "h"}"#),
    )
    .await;
    assert_eq!(answer.status, 201, "{:?}", answer.body);

    // Without a body no content type is needed: the sample's generator page and curl.
    let started = send(&s.tasks, "POST", "/api/generator/start", &[], None).await;
    assert_eq!(started.status, 200, "{:?}", started.body);
    let stopped = send(&s.tasks, "DELETE", "/api/generator/stop", &[], None).await;
    assert_eq!(stopped.status, 200, "{:?}", stopped.body);
    let cancelled = send(
        &s.tasks,
        "POST",
        &format!("/api/tasks/{id}/cancel"),
        &[],
        None,
    )
    .await;
    assert_eq!(cancelled.status, 200, "{:?}", cancelled.body);
}

#[tokio::test]
async fn a_web_page_of_another_origin_can_neither_write_nor_be_granted_a_preflight() {
    let s = stack(&[]).await;
    let created = s
        .tasks
        .post(
            "/api/tasks",
            &json!({"task_data": {"sleep_duration_seconds": 1}}),
        )
        .await;
    assert_eq!(created.status, 201);
    let id = created.body["id"].as_i64().unwrap();
    let tasks_before = snapshot(&s.task_db, "tasks").await;
    let settings_before = snapshot(&s.task_db, "generator_settings").await;

    // The preflight a page sends before a JSON write: refused, in JSON, without a grant.
    for (service, path) in [(&s.tasks, "/api/tasks"), (&s.leases, "/api/leases")] {
        let answer = send(
            service,
            "OPTIONS",
            path,
            &[
                ("origin", EVIL),
                ("access-control-request-method", "POST"),
                ("access-control-request-headers", "content-type"),
            ],
            None,
        )
        .await;
        assert_refused(&answer, 403, "origin_not_allowed", path);
    }

    // What a page can send without a preflight: body-less writes and writes with a "simple"
    // content type. Each is refused before it does anything.
    let foreign = [("origin", EVIL)];
    let answer = send(&s.tasks, "POST", "/api/generator/start", &foreign, None).await;
    assert_refused(&answer, 403, "origin_not_allowed", "generator start");
    let answer = send(
        &s.tasks,
        "POST",
        &format!("/api/tasks/{id}/cancel"),
        &foreign,
        None,
    )
    .await;
    assert_refused(&answer, 403, "origin_not_allowed", "cancel");
    let answer = send(
        &s.tasks,
        "POST",
        "/api/tasks/next",
        &[("origin", EVIL), ("content-type", "text/plain")],
        Some(r#"{"processor": "evil"}"#),
    )
    .await;
    assert_refused(&answer, 403, "origin_not_allowed", "claim");
    let answer = send(
        &s.leases,
        "POST",
        "/api/leases",
        &[("origin", "null"), ("content-type", "application/json")],
        Some(r#"{"resource": "r", "holder": "h"}"#),
    )
    .await;
    assert_refused(
        &answer,
        403,
        "origin_not_allowed",
        "acquire from an opaque origin",
    );
    assert_eq!(snapshot(&s.task_db, "tasks").await, tasks_before);
    assert_eq!(
        snapshot(&s.task_db, "generator_settings").await,
        settings_before
    );
    assert!(snapshot(&s.lease_db, "leases").await.is_empty());

    // Reads stay open, but the page is not allowed to read the answer.
    let read = send(&s.tasks, "GET", "/api/tasks", &foreign, None).await;
    assert_eq!(read.status, 200);
    assert!(!read.headers.contains_key("access-control-allow-origin"));

    // The dashboard's own page is of the service's origin: its writes are served.
    let own = s.tasks.base_url();
    let answer = send(
        &s.tasks,
        "POST",
        &format!("/api/tasks/{id}/cancel"),
        &[
            ("origin", own.as_str()),
            ("content-type", "application/json"),
        ],
        Some("{}"),
    )
    .await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
}

#[tokio::test]
async fn an_origin_named_in_cors_allowed_origins_is_granted() {
    let ops = "https://ops.example.com";
    let s = stack(&[(
        "CORS_ALLOWED_ORIGINS",
        "http://localhost:3000, https://ops.example.com/",
    )])
    .await;
    for (service, path) in [(&s.tasks, "/api/tasks"), (&s.leases, "/api/leases/renew")] {
        let answer = send(
            service,
            "OPTIONS",
            path,
            &[
                ("origin", ops),
                ("access-control-request-method", "PUT"),
                (
                    "access-control-request-headers",
                    "content-type, authorization",
                ),
            ],
            None,
        )
        .await;
        assert_eq!(answer.status, 204, "{path}: {:?}", answer.body);
        let header = |name: &str| {
            answer
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_ascii_lowercase()
        };
        assert_eq!(header("access-control-allow-origin"), ops);
        assert!(header("access-control-allow-methods").contains("put"));
        assert!(header("access-control-allow-headers").contains("content-type"));
        assert!(header("access-control-allow-headers").contains("authorization"));
        assert!(header("vary").contains("origin"));
    }
    let created = send(
        &s.tasks,
        "POST",
        "/api/tasks",
        &[("origin", ops), ("content-type", "application/json")],
        Some(r#"{"task_data": {}}"#),
    )
    .await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    assert_eq!(
        created.headers.get("access-control-allow-origin").unwrap(),
        ops
    );
    let listed = send(&s.leases, "GET", "/api/leases", &[("origin", ops)], None).await;
    assert_eq!(listed.status, 200);
    assert_eq!(
        listed.headers.get("access-control-allow-origin").unwrap(),
        ops
    );
    // Any other origin is still refused.
    let answer = send(
        &s.tasks,
        "POST",
        "/api/generator/start",
        &[("origin", EVIL)],
        None,
    )
    .await;
    assert_refused(&answer, 403, "origin_not_allowed", "another origin");
}

#[tokio::test]
async fn a_malformed_cors_allowed_origins_stops_the_service_at_start() {
    let db = fresh_database().await;
    for name in ["lease-service", "task-service"] {
        let run = tokio::process::Command::new(tests::binary(name))
            .env("DATABASE_URL", &db)
            .env("LISTEN_ADDR", format!("127.0.0.1:{}", tests::free_port()))
            .env("CORS_ALLOWED_ORIGINS", "ops.example.com/dashboard")
            .kill_on_drop(true)
            .output();
        // A service that starts anyway is killed when the wait is given up.
        let output = tokio::time::timeout(std::time::Duration::from_secs(20), run)
            .await
            .unwrap_or_else(|_| panic!("{name} started with a malformed CORS_ALLOWED_ORIGINS"))
            .unwrap();
        assert!(!output.status.success(), "{name} started");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("CORS_ALLOWED_ORIGINS"), "{name}: {stderr}");
    }
}

/// A page of the service's own origin whose browser sends `Origin: null` (the page was served
/// with `Referrer-Policy: no-referrer`) still writes: the browser's `Sec-Fetch-Site` says the
/// request is same-origin, and no page can forge it. Without it, `null` is a foreign origin.
#[tokio::test]
async fn a_same_origin_page_whose_browser_sends_origin_null_still_writes() {
    let s = stack(&[]).await;
    let json = ("content-type", "application/json");
    let body = r#"{"task_data": {"sleep_duration_seconds": 0}}"#;
    let own = send(
        &s.tasks,
        "POST",
        "/api/tasks",
        &[json, ("origin", "null"), ("sec-fetch-site", "same-origin")],
        Some(body),
    )
    .await;
    assert_eq!(own.status, 201, "{:?}", own.body);
    let before = snapshot(&s.task_db, "tasks").await;
    for site in [None, Some("cross-site"), Some("same-site")] {
        let mut headers = vec![json, ("origin", "null")];
        if let Some(site) = site {
            headers.push(("sec-fetch-site", site));
        }
        let foreign = send(&s.tasks, "POST", "/api/tasks", &headers, Some(body)).await;
        assert_refused(&foreign, 403, "origin_not_allowed", &format!("{site:?}"));
    }
    assert_eq!(snapshot(&s.task_db, "tasks").await, before);
}

/// One request on an open connection and its whole answer's status line; `None` if the service
/// closed the connection instead of answering.
async fn exchange(connection: &mut tokio::net::TcpStream) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let request = "GET /healthz HTTP/1.1\r\nhost: leasehold\r\n\r\n";
    connection.write_all(request.as_bytes()).await.ok()?;
    let mut answer = Vec::new();
    let mut buffer = [0_u8; 4096];
    loop {
        let read = connection.read(&mut buffer).await.ok()?;
        if read == 0 {
            return None;
        }
        answer.extend_from_slice(&buffer[..read]);
        let text = String::from_utf8_lossy(&answer);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length: usize = head
                .lines()
                .find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().ok())?
                })
                .unwrap_or(0);
            if body.len() >= length {
                return head.lines().next().map(str::to_owned);
            }
        }
    }
}

/// The services keep an idle connection open longer than their clients keep one in their pools
/// (`leasehold::keep_alive`), so a client never reuses a connection the service is closing. With
/// actix-web's default (5 s) a worker pausing 6 s between calls sent its next request into a
/// closing socket and could not know whether it was served.
#[tokio::test]
async fn an_idle_connection_outlives_the_pause_a_client_pool_allows() {
    const {
        assert!(
            leasehold::keep_alive::CLIENT_IDLE.as_secs()
                < leasehold::keep_alive::SERVER_IDLE.as_secs()
        );
    }
    let db = fresh_database().await;
    let leases = Service::lease_service(&db, &[]).await;
    let mut connection = tokio::net::TcpStream::connect(("127.0.0.1", leases.port))
        .await
        .unwrap();
    assert_eq!(
        exchange(&mut connection).await.as_deref(),
        Some("HTTP/1.1 200 OK")
    );
    // Longer than actix-web's default keep-alive, far shorter than the pools' idle timeout.
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    assert_eq!(
        exchange(&mut connection).await.as_deref(),
        Some("HTTP/1.1 200 OK"),
        "the service closed a connection idle for 6 s"
    );
}

/// A body that lists a request's fields as a JSON array, in the order the Rust struct declares
/// them, is refused (400) and writes nothing: the documents describe objects only, and serde,
/// left alone, reads a struct from an array too (`leasehold::strict`). Bulk filters and queue
/// settings, whose fields are all optional, were accepted as `[null, null]`.
#[tokio::test]
async fn a_body_that_lists_its_fields_as_an_array_is_refused() {
    let s = stack(&[]).await;
    let writes: [(&Service, &str, &str, Value); 12] = [
        (&s.leases, "POST", "/api/leases", json!(["r", "h", 30])),
        (
            &s.leases,
            "POST",
            "/api/leases/batch",
            json!([["r"], "h", 30]),
        ),
        (&s.leases, "PUT", "/api/leases/renew", json!(["r", "h", 1])),
        (&s.tasks, "POST", "/api/tasks", json!([{"n": 1}])),
        (
            &s.tasks,
            "POST",
            "/api/tasks/batch",
            json!([[{"task_data": {}}]]),
        ),
        (
            &s.tasks,
            "POST",
            "/api/tasks/batch",
            json!({"tasks": [[{}]]}),
        ),
        (&s.tasks, "POST", "/api/tasks/next", json!(["p"])),
        (&s.tasks, "POST", "/api/tasks/retry", json!([null, null])),
        (&s.tasks, "POST", "/api/tasks/cancel", json!([null, null])),
        (&s.tasks, "PUT", "/api/queues/q", json!([null, null, null])),
        (
            &s.tasks,
            "POST",
            "/api/generator/start",
            json!([null, null]),
        ),
        (
            &s.tasks,
            "PUT",
            "/api/schedules/s",
            json!(["* * * * *", {}]),
        ),
    ];
    let tables = [
        (&s.lease_db, "leases"),
        (&s.task_db, "tasks"),
        (&s.task_db, "queues"),
        (&s.task_db, "generator_settings"),
        (&s.task_db, "schedules"),
    ];
    let mut before = Vec::new();
    for (db, table) in tables {
        before.push(snapshot(db, table).await);
    }
    for (service, method, path, body) in &writes {
        let answer = send(
            service,
            method,
            path,
            &[("content-type", "application/json")],
            Some(&body.to_string()),
        )
        .await;
        let what = format!("{method} {path} {body}");
        // A batch of creates judges each as if alone: the batch is answered, its item refused.
        let refused = if body.is_object() {
            assert_eq!(answer.status, 200, "{what}: {:?}", answer.body);
            &answer.body["results"][0]["error"]
        } else {
            assert_eq!(answer.status, 400, "{what}: {:?}", answer.body);
            &answer.body
        };
        assert_eq!(
            refused["code"], "invalid_field",
            "{what}: {:?}",
            answer.body
        );
    }
    let mut after = Vec::new();
    for (db, table) in tables {
        after.push(snapshot(db, table).await);
    }
    assert_eq!(before, after, "a refused body wrote");
}
