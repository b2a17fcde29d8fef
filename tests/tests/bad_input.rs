//! Bad requests get a clear 4xx JSON error with a stable code, write nothing, and the service
//! keeps serving.
#![allow(clippy::unwrap_used)]

use serde_json::json;
use tests::{Service, fresh_database, snapshot};

struct Case {
    name: &'static str,
    method: &'static str,
    path: &'static str,
    content_type: Option<&'static str>,
    body: Vec<u8>,
    status: u16,
    code: &'static str,
}

fn case(
    name: &'static str,
    method: &'static str,
    path: &'static str,
    body: impl Into<Vec<u8>>,
    status: u16,
    code: &'static str,
) -> Case {
    Case {
        name,
        method,
        path,
        content_type: Some("application/json"),
        body: body.into(),
        status,
        code,
    }
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
        Case {
            content_type: Some("text/xml"),
            ..case(
                "XML body",
                "POST",
                "/api/leases",
                "<lease/>",
                400,
                "malformed_json",
            )
        },
    ];
    assert!(cases.len() >= 12);
    for case in &cases {
        let answer = svc
            .raw(case.method, case.path, case.content_type, case.body.clone())
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
            snapshot(&db, "leases").await,
            before,
            "{} wrote something",
            case.name
        );
    }
    // Still serving.
    assert_eq!(svc.get("/healthz").await.status, 200);
    let ok = svc
        .post("/api/leases", &json!({"resource": "after", "holder": "h"}))
        .await;
    assert_eq!(ok.status, 201);
}
