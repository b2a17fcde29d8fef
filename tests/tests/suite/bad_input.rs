//! Bad requests get a clear 4xx JSON error with a stable code, write nothing, and the service
//! keeps serving.
#![allow(clippy::unwrap_used)]

use serde_json::json;
use tests::{Service, fresh_database, snapshot};

struct Case {
    name: &'static str,
    method: &'static str,
    path: String,
    content_type: Option<&'static str>,
    body: Vec<u8>,
    status: u16,
    code: &'static str,
}

/// Sends every case: each must get its status and `code` with a human `error`, and leave
/// `table` of `db` as `before`.
async fn refuse_all(svc: &Service, cases: &[Case], db: &str, table: &str, before: &[String]) {
    for case in cases {
        let answer = svc
            .raw(
                case.method,
                &case.path,
                case.content_type,
                case.body.clone(),
            )
            .await;
        assert_eq!(
            (answer.status, answer.code()),
            (case.status, case.code),
            "{}: {:?}",
            case.name,
            answer.body
        );
        assert!(
            answer.body["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{}: a human-readable error: {:?}",
            case.name,
            answer.body
        );
        assert_eq!(
            snapshot(db, table).await,
            before,
            "{} wrote to {table}",
            case.name
        );
    }
}

fn case(
    name: &'static str,
    method: &'static str,
    path: &str,
    body: impl Into<Vec<u8>>,
    status: u16,
    code: &'static str,
) -> Case {
    Case {
        name,
        method,
        path: path.to_owned(),
        content_type: Some("application/json"),
        body: body.into(),
        status,
        code,
    }
}

/// Names are bounded in characters, as the API's documents state them: the longest name of
/// four-byte characters (2,048 bytes) is a name like any other, one more is refused.
#[tokio::test]
async fn a_name_is_512_characters_however_many_bytes_they_take() {
    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[]).await;
    let longest = "𝄞".repeat(512);
    let acquired = svc
        .post(
            "/api/leases",
            &json!({"resource": longest, "holder": longest}),
        )
        .await;
    assert_eq!(acquired.status, 201, "{:?}", acquired.body);
    let too_long = svc
        .post(
            "/api/leases",
            &json!({"resource": format!("{longest}x"), "holder": "h"}),
        )
        .await;
    assert_eq!((too_long.status, too_long.code()), (400, "invalid_field"));
}

#[tokio::test]
async fn a_table_of_bad_requests_each_gets_the_right_error_and_writes_nothing() {
    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[]).await;
    let held = svc
        .post(
            "/api/leases",
            &json!({"resource": "held", "holder": "owner"}),
        )
        .await;
    assert_eq!(held.status, 201);
    let before = snapshot(&db, "leases").await;

    let long = "x".repeat(513);
    let huge = format!(r#"{{"resource":"{}","holder":"h"}}"#, "y".repeat(20_000));
    let cases = vec![
        case(
            "malformed JSON",
            "POST",
            "/api/leases",
            r#"{"resource": "r", "#,
            400,
            "malformed_json",
        ),
        case(
            "not JSON at all",
            "POST",
            "/api/leases",
            "resource=r&holder=h",
            400,
            "malformed_json",
        ),
        case(
            "empty body",
            "POST",
            "/api/leases",
            "",
            400,
            "malformed_json",
        ),
        case(
            "missing holder",
            "POST",
            "/api/leases",
            r#"{"resource":"r"}"#,
            400,
            "missing_field",
        ),
        case(
            "missing resource on renew",
            "PUT",
            "/api/leases/renew",
            r#"{"holder":"h"}"#,
            400,
            "missing_field",
        ),
        case(
            "resource of wrong type",
            "POST",
            "/api/leases",
            r#"{"resource":42,"holder":"h"}"#,
            400,
            "invalid_field",
        ),
        case(
            "ttl of wrong type",
            "POST",
            "/api/leases",
            r#"{"resource":"r","holder":"h","ttl_seconds":"ten"}"#,
            400,
            "invalid_field",
        ),
        case(
            "fractional ttl",
            "POST",
            "/api/leases",
            r#"{"resource":"r","holder":"h","ttl_seconds":1.5}"#,
            400,
            "invalid_field",
        ),
        case(
            "fence of wrong type",
            "PUT",
            "/api/leases/renew",
            r#"{"resource":"held","holder":"owner","fence":"1"}"#,
            400,
            "invalid_field",
        ),
        case(
            "empty resource",
            "POST",
            "/api/leases",
            r#"{"resource":"","holder":"h"}"#,
            400,
            "invalid_field",
        ),
        case(
            "empty holder",
            "DELETE",
            "/api/leases/release",
            r#"{"resource":"held","holder":""}"#,
            400,
            "invalid_field",
        ),
        case(
            "over-long resource",
            "POST",
            "/api/leases",
            format!(r#"{{"resource":"{long}","holder":"h"}}"#),
            400,
            "invalid_field",
        ),
        case(
            "over-long holder",
            "PUT",
            "/api/leases/renew",
            format!(r#"{{"resource":"held","holder":"{long}"}}"#),
            400,
            "invalid_field",
        ),
        case(
            "NUL in resource",
            "POST",
            "/api/leases",
            r#"{"resource":"a\u0000b","holder":"h"}"#,
            400,
            "invalid_field",
        ),
        case(
            "array instead of object",
            "POST",
            "/api/leases",
            r#"[{"resource":"r","holder":"h"}]"#,
            400,
            "invalid_field",
        ),
        case(
            "ttl out of bounds",
            "POST",
            "/api/leases",
            r#"{"resource":"r","holder":"h","ttl_seconds":999999}"#,
            400,
            "invalid_ttl",
        ),
        case(
            "oversized body",
            "POST",
            "/api/leases",
            huge,
            413,
            "payload_too_large",
        ),
        case(
            "unknown route",
            "GET",
            "/api/nothing-here",
            "",
            404,
            "not_found",
        ),
        case(
            "unknown lease id",
            "GET",
            "/api/leases/424242",
            "",
            404,
            "lease_not_found",
        ),
        case(
            "non-numeric lease id",
            "DELETE",
            "/api/leases/abc",
            r#"{"resource":"held","holder":"owner"}"#,
            400,
            "invalid_id",
        ),
        case(
            "wrong method on collection",
            "PATCH",
            "/api/leases",
            "{}",
            405,
            "method_not_allowed",
        ),
        case(
            "wrong method on renew",
            "GET",
            "/api/leases/renew",
            "",
            405,
            "method_not_allowed",
        ),
        case(
            "wrong method on release",
            "POST",
            "/api/leases/release",
            r#"{"resource":"held","holder":"owner"}"#,
            405,
            "method_not_allowed",
        ),
        case(
            "bad limit",
            "GET",
            "/api/leases/active?limit=many",
            "",
            400,
            "invalid_query",
        ),
        case(
            "id overflow",
            "GET",
            "/api/leases/99999999999999999999999",
            "",
            400,
            "invalid_id",
        ),
        case(
            "revoke of an unknown lease",
            "POST",
            "/api/leases/424242/revoke",
            "",
            404,
            "lease_not_found",
        ),
        case(
            "revoke of a non-numeric id",
            "POST",
            "/api/leases/abc/revoke",
            "",
            400,
            "invalid_id",
        ),
        case(
            "wrong method on revoke",
            "DELETE",
            "/api/leases/1/revoke",
            "",
            405,
            "method_not_allowed",
        ),
        Case {
            content_type: Some("text/xml"),
            ..case(
                "XML body",
                "POST",
                "/api/leases",
                "<lease/>",
                415,
                "unsupported_media_type",
            )
        },
        // What a web page can send anywhere without a preflight: refused, not parsed as JSON.
        Case {
            content_type: Some("text/plain"),
            ..case(
                "JSON sent as text/plain",
                "POST",
                "/api/leases",
                r#"{"resource":"r","holder":"h"}"#,
                415,
                "unsupported_media_type",
            )
        },
        Case {
            content_type: Some("application/x-www-form-urlencoded"),
            ..case(
                "a form's body",
                "PUT",
                "/api/leases/renew",
                r#"{"resource":"held","holder":"owner"}"#,
                415,
                "unsupported_media_type",
            )
        },
        Case {
            content_type: None,
            ..case(
                "a body without a content type",
                "DELETE",
                "/api/leases/release",
                r#"{"resource":"held","holder":"owner"}"#,
                415,
                "unsupported_media_type",
            )
        },
        // PostgreSQL text cannot hold NUL: a query parameter carrying one is refused up front.
        case(
            "NUL in resource_prefix",
            "GET",
            "/api/leases?resource_prefix=%00",
            "",
            400,
            "invalid_query",
        ),
        case(
            "NUL in resource",
            "GET",
            "/api/leases/active?resource=held%00",
            "",
            400,
            "invalid_query",
        ),
    ];
    assert!(cases.len() >= 12);
    refuse_all(&svc, &cases, &db, "leases", &before).await;
    // Still serving.
    assert_eq!(svc.get("/healthz").await.status, 200);
    let ok = svc
        .post("/api/leases", &json!({"resource": "after", "holder": "h"}))
        .await;
    assert_eq!(ok.status, 201);
}

#[tokio::test]
async fn task_service_refuses_bad_requests_with_the_right_error_and_writes_nothing() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let tasks = Service::task_service(&task_db, &leases.base_url(), &[]).await;
    let created = tasks
        .post("/api/tasks", &json!({"task_data": {"n": 1}}))
        .await;
    assert_eq!(created.status, 201);
    let id = created.body["id"].as_i64().unwrap();
    let before = snapshot(&task_db, "tasks").await;
    let leases_before = snapshot(&lease_db, "leases").await;

    let big_data = format!(r#"{{"task_data":{{"blob":"{}"}}}}"#, "z".repeat(70_000));
    let huge_body = format!(r#"{{"task_data":{{"blob":"{}"}}}}"#, "z".repeat(300_000));
    let heartbeat = format!("/api/tasks/{id}/heartbeat");
    let complete = format!("/api/tasks/{id}/complete");
    let cases = vec![
        case(
            "malformed JSON",
            "POST",
            "/api/tasks",
            r#"{"task_data": "#,
            400,
            "malformed_json",
        ),
        case(
            "missing task_data",
            "POST",
            "/api/tasks",
            r#"{"queue":"q"}"#,
            400,
            "missing_field",
        ),
        case(
            "task_data a string",
            "POST",
            "/api/tasks",
            r#"{"task_data":"sleep"}"#,
            400,
            "invalid_field",
        ),
        case(
            "task_data an array",
            "POST",
            "/api/tasks",
            r#"{"task_data":[1,2]}"#,
            400,
            "invalid_field",
        ),
        case(
            "task_data null",
            "POST",
            "/api/tasks",
            r#"{"task_data":null}"#,
            400,
            "invalid_field",
        ),
        case(
            "NUL inside task_data",
            "POST",
            "/api/tasks",
            r#"{"task_data":{"a":"x\u0000y"}}"#,
            400,
            "invalid_field",
        ),
        case(
            "task_data too large",
            "POST",
            "/api/tasks",
            big_data,
            400,
            "too_large",
        ),
        case(
            "oversized body",
            "POST",
            "/api/tasks",
            huge_body,
            413,
            "payload_too_large",
        ),
        case(
            "priority out of range",
            "POST",
            "/api/tasks",
            r#"{"task_data":{},"priority":5000}"#,
            400,
            "invalid_field",
        ),
        case(
            "max_attempts zero",
            "POST",
            "/api/tasks",
            r#"{"task_data":{},"max_attempts":0}"#,
            400,
            "invalid_field",
        ),
        case(
            "scheduled_at not a time",
            "POST",
            "/api/tasks",
            r#"{"task_data":{},"scheduled_at":"tomorrow"}"#,
            400,
            "invalid_field",
        ),
        case(
            "empty queue",
            "POST",
            "/api/tasks",
            r#"{"task_data":{},"queue":""}"#,
            400,
            "invalid_field",
        ),
        case(
            "missing processor",
            "POST",
            "/api/tasks/next",
            r#"{}"#,
            400,
            "missing_field",
        ),
        case(
            "empty processor",
            "POST",
            "/api/tasks/next",
            r#"{"processor":""}"#,
            400,
            "invalid_field",
        ),
        case(
            "processor a number",
            "POST",
            "/api/tasks/next",
            r#"{"processor":7}"#,
            400,
            "invalid_field",
        ),
        case(
            "negative limit",
            "POST",
            "/api/tasks/next",
            r#"{"processor":"w","limit":-1}"#,
            400,
            "invalid_limit",
        ),
        case(
            "huge limit",
            "POST",
            "/api/tasks/next",
            r#"{"processor":"w","limit":100000}"#,
            400,
            "invalid_limit",
        ),
        case(
            "heartbeat without processor",
            "PUT",
            &heartbeat,
            r#"{"fence":1}"#,
            400,
            "missing_field",
        ),
        case(
            "complete with a text fence",
            "PUT",
            &complete,
            r#"{"processor":"w","fence":"one"}"#,
            400,
            "invalid_field",
        ),
        case(
            "unknown task",
            "GET",
            "/api/tasks/987654",
            "",
            404,
            "task_not_found",
        ),
        case(
            "heartbeat on unknown task",
            "PUT",
            "/api/tasks/987654/heartbeat",
            r#"{"processor":"w"}"#,
            404,
            "task_not_found",
        ),
        case(
            "non-numeric id",
            "GET",
            "/api/tasks/abc",
            "",
            400,
            "invalid_id",
        ),
        case(
            "non-numeric id on complete",
            "PUT",
            "/api/tasks/abc/complete",
            r#"{"processor":"w"}"#,
            400,
            "invalid_id",
        ),
        case(
            "unknown status filter",
            "GET",
            "/api/tasks?status=finished",
            "",
            400,
            "invalid_status",
        ),
        case(
            "bad listing limit",
            "GET",
            "/api/tasks?limit=0",
            "",
            400,
            "invalid_limit",
        ),
        case(
            "wrong method on next",
            "GET",
            "/api/tasks/next",
            "",
            405,
            "method_not_allowed",
        ),
        case(
            "unknown route",
            "POST",
            "/api/tasks/1/explode",
            "{}",
            404,
            "not_found",
        ),
        // Before PostgreSQL's first timestamp (4713 BC), and past what RFC 3339 can write.
        case(
            "scheduled_at before 4713 BC",
            "POST",
            "/api/tasks",
            r#"{"task_data":{},"scheduled_at":"-5000-01-01T00:00:00Z"}"#,
            400,
            "invalid_field",
        ),
        case(
            "scheduled_at in year 0",
            "POST",
            "/api/tasks",
            r#"{"task_data":{},"scheduled_at":"0000-06-01T00:00:00Z"}"#,
            400,
            "invalid_field",
        ),
        case(
            "scheduled_at after year 9999",
            "POST",
            "/api/tasks",
            r#"{"task_data":{},"scheduled_at":"+10000-01-01T00:00:00Z"}"#,
            400,
            "invalid_field",
        ),
        // actix decodes bytes that are not UTF-8 lossily: `%FF%FE` and `%FE%FF` both named the
        // queue "��".
        case(
            "a queue named by bytes that are not UTF-8",
            "POST",
            "/api/queues/%FF%FE/pause",
            "",
            400,
            "invalid_path",
        ),
        case(
            "limits of a queue named by bytes that are not UTF-8",
            "PUT",
            "/api/queues/%FE%FF",
            r#"{"concurrency_limit":1}"#,
            400,
            "invalid_path",
        ),
        case(
            "a schedule named by half a character",
            "PUT",
            "/api/schedules/x%C3",
            r#"{"cron":"* * * * *","task_data":{}}"#,
            400,
            "invalid_path",
        ),
        case(
            "NUL in a queue's name",
            "GET",
            "/api/queues/a%00b",
            "",
            400,
            "invalid_path",
        ),
        case(
            "NUL in the queue filter",
            "GET",
            "/api/tasks?queue=q%00",
            "",
            400,
            "invalid_query",
        ),
        case(
            "NUL in the dashboard's lease filter",
            "GET",
            "/api/dashboard/leases?resource_prefix=%00",
            "",
            400,
            "invalid_query",
        ),
        Case {
            content_type: Some("text/plain"),
            ..case(
                "a task sent as text/plain",
                "POST",
                "/api/tasks",
                r#"{"task_data":{}}"#,
                415,
                "unsupported_media_type",
            )
        },
        case(
            "a generator start whose body is whitespace, not JSON",
            "POST",
            "/api/generator/start",
            "\n",
            400,
            "malformed_json",
        ),
        Case {
            content_type: Some("application/x-www-form-urlencoded"),
            ..case(
                "a generator start sent as a form",
                "POST",
                "/api/generator/start",
                "rate_per_second=5",
                415,
                "unsupported_media_type",
            )
        },
    ];
    let settings_before = snapshot(&task_db, "generator_settings").await;
    let queues_before = snapshot(&task_db, "queues").await;
    let schedules_before = snapshot(&task_db, "schedules").await;
    refuse_all(&tasks, &cases, &task_db, "tasks", &before).await;
    assert_eq!(snapshot(&task_db, "queues").await, queues_before);
    assert_eq!(snapshot(&task_db, "schedules").await, schedules_before);
    assert_eq!(
        snapshot(&lease_db, "leases").await,
        leases_before,
        "no lease was taken"
    );
    assert_eq!(
        snapshot(&task_db, "generator_settings").await,
        settings_before,
        "the generator was not touched"
    );
    assert_eq!(tasks.get("/healthz").await.status, 200);
}

#[tokio::test]
async fn a_client_too_slow_to_send_its_headers_is_cut_off_and_the_service_keeps_serving() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[("CLIENT_REQUEST_TIMEOUT_MS", "500")]).await;
    let mut slow = tokio::net::TcpStream::connect(("127.0.0.1", svc.port))
        .await
        .unwrap();
    // Half a request, then nothing: a slowloris.
    slow.write_all(b"POST /api/leases HTTP/1.1\r\nHost: leasehold\r\n")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut answer = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        slow.read_to_end(&mut answer),
    )
    .await
    .expect("the slow client is disconnected")
    .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(svc.get("/healthz").await.status, 200);
}

#[tokio::test]
async fn a_client_too_slow_to_send_its_body_gets_408_and_a_prompt_one_is_served() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[("CLIENT_REQUEST_TIMEOUT_MS", "500")]).await;
    let body = br#"{"resource": "slow-body", "holder": "h"}"#;
    let head = format!(
        "POST /api/leases HTTP/1.1\r\nHost: leasehold\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );

    // Headers at once, then half the body, then nothing.
    let mut slow = tokio::net::TcpStream::connect(("127.0.0.1", svc.port))
        .await
        .unwrap();
    slow.write_all(head.as_bytes()).await.unwrap();
    slow.write_all(&body[..10]).await.unwrap();
    let started = std::time::Instant::now();
    let mut answer = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        slow.read_to_end(&mut answer),
    )
    .await
    .expect("the slow client is answered and disconnected")
    .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains(r#""code":"request_timeout""#), "{answer}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(snapshot(&db, "leases").await, Vec::<String>::new());

    // The same request sent in two halves, within the time, is served.
    let mut prompt = tokio::net::TcpStream::connect(("127.0.0.1", svc.port))
        .await
        .unwrap();
    prompt.write_all(head.as_bytes()).await.unwrap();
    prompt.write_all(&body[..10]).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    prompt.write_all(&body[10..]).await.unwrap();
    let mut first_line = [0u8; 12];
    prompt.read_exact(&mut first_line).await.unwrap();
    assert_eq!(&first_line, b"HTTP/1.1 201");
    assert_eq!(svc.get("/healthz").await.status, 200);
}

/// `POST /api/generator/start` reads its optional body as bytes, outside the JSON extractor and
/// its error handler: a body too large or too slow is still answered in JSON, and changes
/// nothing.
#[tokio::test]
async fn errors_actix_web_makes_itself_are_json_too() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let tasks = Service::task_service(
        &task_db,
        &leases.base_url(),
        &[("CLIENT_REQUEST_TIMEOUT_MS", "500")],
    )
    .await;
    let before = snapshot(&task_db, "generator_settings").await;

    let oversized = format!(
        r#"{{"rate_per_second": 1, "pad": "{}"}}"#,
        "z".repeat(300_000)
    );
    let answer = tasks
        .raw(
            "POST",
            "/api/generator/start",
            Some("application/json"),
            oversized,
        )
        .await;
    assert_eq!(
        (answer.status, answer.code()),
        (413, "payload_too_large"),
        "{:?} {:?}",
        answer.headers.get("content-type"),
        answer.body
    );
    assert!(answer.body["error"].is_string(), "{:?}", answer.body);

    // Headers at once, then half the body, then nothing.
    let body = br#"{"rate_per_second": 2}"#;
    let head = format!(
        "POST /api/generator/start HTTP/1.1\r\nHost: leasehold\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    let mut slow = tokio::net::TcpStream::connect(("127.0.0.1", tasks.port))
        .await
        .unwrap();
    slow.write_all(head.as_bytes()).await.unwrap();
    slow.write_all(&body[..8]).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        slow.read_to_end(&mut answer),
    )
    .await
    .expect("the slow client is answered and disconnected")
    .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{answer}"
    );
    assert!(answer.contains(r#""code":"request_timeout""#), "{answer}");

    assert_eq!(snapshot(&task_db, "generator_settings").await, before);
    assert_eq!(tasks.get("/healthz").await.status, 200);
}

/// A misspelt field is refused on every worker route the sample's clients never call, so the
/// check it meant is not silently skipped: a completion's `"fencing"` would complete whatever
/// claim is current, `"nxt"` would complete without claiming, a claim's `"wrker"` would take a
/// lease per task. The sample's own bodies (claim, heartbeat, complete) stay lenient.
#[tokio::test]
async fn unknown_fields_are_refused_where_the_sample_never_sends_a_body() {
    let stack = tests::Stack::start(&[]).await;
    let created = stack
        .tasks
        .post("/api/tasks", &json!({"task_data": {"n": 1}}))
        .await;
    let id = created.body["id"].as_i64().unwrap();
    let claimed = stack
        .tasks
        .post("/api/tasks/next", &json!({"processor": "w"}))
        .await;
    assert_eq!(claimed.status, 202, "{:?}", claimed.body);
    let fence = claimed.body["fence"].as_i64().unwrap();
    let before = snapshot(&stack.task_db, "tasks").await;
    let misspelt = [
        (
            "PUT",
            "/api/tasks/complete".to_owned(),
            json!({"processor": "w", "tasks": [{"id": id, "fencing": fence}]}),
            "fencing",
        ),
        (
            "PUT",
            "/api/tasks/complete".to_owned(),
            json!({"processor": "w", "tasks": [{"id": id, "fence": fence}], "nxt": {}}),
            "nxt",
        ),
        (
            "PUT",
            "/api/tasks/complete".to_owned(),
            json!({"processor": "w", "tasks": [{"id": id, "fence": fence}],
                   "next": {"wrker": {"id": "w1", "fence": 1}}}),
            "wrker",
        ),
        (
            "PUT",
            format!("/api/tasks/{id}/fail"),
            json!({"processor": "w", "error": "e", "fencing": fence}),
            "fencing",
        ),
        (
            "PUT",
            format!("/api/tasks/{id}/snooze"),
            json!({"processor": "w", "seconds": 1, "fence": fence, "sconds": 60}),
            "sconds",
        ),
    ];
    for (method, path, body, field) in misspelt {
        let answer = stack
            .tasks
            .raw(method, &path, Some("application/json"), body.to_string())
            .await;
        assert_eq!(
            (answer.status, answer.code()),
            (400, "invalid_field"),
            "{method} {path} {body}: {:?}",
            answer.body
        );
        let error = answer.body["error"].as_str().unwrap();
        assert!(
            error.contains(&format!("`{field}`")),
            "names {field}: {error}"
        );
        assert_eq!(
            snapshot(&stack.task_db, "tasks").await,
            before,
            "{method} {path} {body} wrote"
        );
    }
    // The sample's worker sends only known fields, but its server ignored others: so do these.
    let lenient = stack
        .tasks
        .put(
            &format!("/api/tasks/{id}/heartbeat"),
            &json!({"processor": "w", "fence": fence, "note": "extra"}),
        )
        .await;
    assert_eq!(lenient.status, 202, "{:?}", lenient.body);
    let done = stack
        .tasks
        .put(
            &format!("/api/tasks/{id}/complete"),
            &json!({"processor": "w", "fence": fence, "task_output": {}, "note": "extra"}),
        )
        .await;
    assert_eq!(done.status, 202, "{:?}", done.body);
}
