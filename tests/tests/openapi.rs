//! The OpenAPI documents (`GET /api/openapi.json`): each is valid OpenAPI 3.1 by a validator no
//! one here wrote, and lists exactly the routes its service serves: the paths actix mounted
//! (read from actix's own route map) and, over HTTP, the methods each path answers.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;

use actix_web::web::ServiceConfig;
use serde_json::Value;
use tests::{Service, Stack, tools};

/// How a service mounts its routes.
type Configure = fn(&mut ServiceConfig);

/// Each service: its name, its process, and the function that mounts its routes.
fn services(stack: &Stack) -> [(&'static str, &Service, Configure); 2] {
    [
        ("lease-service", &stack.leases, lease_routes),
        ("task-service", &stack.tasks, task_service::http::configure),
    ]
}

/// lease-service's routes (the TTL bounds only change its document).
fn lease_routes(cfg: &mut ServiceConfig) {
    lease_service::http::configure(lease_service::leases::TtlPolicy {
        default_seconds: 30,
        min_seconds: 1,
        max_seconds: 3600,
    })(cfg);
}

async fn document(service: &Service) -> Value {
    let answer = service.get("/api/openapi.json").await;
    assert_eq!(answer.status, 200, "{}: {:?}", service.name, answer.body);
    let content_type = answer.headers["content-type"].to_str().unwrap_or("");
    assert!(
        content_type.starts_with("application/json"),
        "{content_type}"
    );
    answer.body
}

#[tokio::test]
async fn each_service_serves_a_valid_openapi_3_1_document() {
    let stack = Stack::start(&[]).await;
    let validator = tools::python_tools("openapi", &[], &["openapi-spec-validator==0.9.0"])
        .join("openapi-spec-validator");
    for (name, service, _) in services(&stack) {
        let document = document(service).await;
        assert_eq!(document["openapi"], "3.1.0", "{name}");
        assert_eq!(document["info"]["title"], name);
        // Every 503 says when to try again, and every 401 how to authenticate.
        for (path, operations) in document["paths"].as_object().unwrap() {
            for (method, operation) in operations.as_object().unwrap() {
                for (status, header) in [("503", "Retry-After"), ("401", "WWW-Authenticate")] {
                    let answer = &operation["responses"][status];
                    assert!(
                        answer.is_null() || answer["headers"][header].is_object(),
                        "{name}: {method} {path} {status} without {header}: {answer}"
                    );
                }
            }
        }
        // A refusal's `code` is one of a documented list of strings, every code this build
        // knows, so a client generated from the document can match on it.
        let schemas = &document["components"]["schemas"];
        assert_eq!(
            schemas["ErrorBody"]["properties"]["code"]["$ref"], "#/components/schemas/ErrorCode",
            "{name}"
        );
        assert_eq!(schemas["ErrorCode"]["type"], "string", "{name}");
        let listed: Vec<&str> = schemas["ErrorCode"]["enum"]
            .as_array()
            .unwrap_or_else(|| panic!("{name}: ErrorCode lists no codes"))
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let known: Vec<&str> = leasehold::ErrorCode::KNOWN
            .iter()
            .map(leasehold::ErrorCode::as_str)
            .collect();
        assert_eq!(listed, known, "{name}");
        for code in [
            "lease_held",
            "stale_fence",
            "task_not_found",
            "invalid_field",
        ] {
            assert!(listed.contains(&code), "{name}: {code} is not listed");
        }
        let file = std::env::temp_dir().join(format!(
            "leasehold-openapi-{name}-{}.json",
            std::process::id()
        ));
        std::fs::write(&file, serde_json::to_vec_pretty(&document).unwrap()).unwrap();
        let output = std::process::Command::new(&validator)
            .arg(&file)
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", validator.display()));
        let _ = std::fs::remove_file(&file);
        // The validator prints the whole document with its verdict: its end says what is wrong.
        let said = String::from_utf8_lossy(&output.stdout);
        let tail: String = said
            .chars()
            .rev()
            .take(3000)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        assert!(
            output.status.success(),
            "{name}'s document is not valid OpenAPI:\n...{tail}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        // The reference page is served beside it, and names where it reads the document.
        let page = reqwest::get(service.url("/api/docs")).await.unwrap();
        assert_eq!(page.status(), 200);
        assert!(page.text().await.unwrap().contains("/api/openapi.json"));
    }
    // The dashboard links to task-service's reference.
    let dashboard = reqwest::get(stack.tasks.url("/dashboard")).await.unwrap();
    assert!(
        dashboard
            .text()
            .await
            .unwrap()
            .contains("href=\"/api/docs\"")
    );
}

#[tokio::test]
async fn lease_service_documents_the_ttls_it_is_configured_with() {
    let db = tests::fresh_database().await;
    let leases = Service::lease_service(
        &db,
        &[
            ("LEASE_MIN_TTL_SECONDS", "5"),
            ("LEASE_MAX_TTL_SECONDS", "120"),
        ],
    )
    .await;
    let document = document(&leases).await;
    for schema in ["AcquireLease", "AcquireLeases", "RenewLease"] {
        let ttl = &document["components"]["schemas"][schema]["properties"]["ttl_seconds"];
        assert_eq!(
            (&ttl["minimum"], &ttl["maximum"]),
            (&serde_json::json!(5), &serde_json::json!(120)),
            "{schema}: {ttl}"
        );
    }
}

#[tokio::test]
async fn each_document_lists_exactly_the_routes_its_service_serves() {
    let stack = Stack::start(&[]).await;
    for (name, service, configure) in services(&stack) {
        let document = document(service).await;
        let documented: BTreeSet<String> = document["paths"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        let mounted = mounted_paths(configure).await;
        assert_eq!(
            documented, mounted,
            "{name}: the document's paths (left) against those actix mounted (right)"
        );
        for (path, item) in document["paths"].as_object().unwrap() {
            let concrete = example_path(path);
            for method in ["GET", "POST", "PUT", "DELETE", "PATCH"] {
                let documented = item.get(method.to_lowercase()).is_some();
                let answer = service.raw(method, &concrete, None, Vec::new()).await;
                if documented {
                    assert!(
                        !(answer.status == 404 && answer.code() == "not_found")
                            && answer.status != 405,
                        "{name}: {method} {concrete} is documented but not served: {} {:?}",
                        answer.status,
                        answer.body
                    );
                } else {
                    assert_eq!(
                        (answer.status, answer.code()),
                        (405, "method_not_allowed"),
                        "{name}: {method} {concrete} is served but not documented"
                    );
                }
            }
        }
    }
}

/// `path` with each `{parameter}` given a value its route accepts the shape of.
fn example_path(path: &str) -> String {
    path.split('/')
        .map(|segment| {
            match segment {
                "{id}" => "1",
                // The dashboard's views: a route matches only these.
                "{view}" => "tasks",
                _ if segment.starts_with('{') => "probe",
                _ => segment,
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// The path of every resource `configure` mounts, read from the route map actix built of them.
/// Its map is private, so it is read from its `Debug` print: each resource's `ResourceDef`
/// shows its patterns as `patterns: Single("/path")`.
async fn mounted_paths(configure: Configure) -> BTreeSet<String> {
    use actix_web::{App, HttpRequest, HttpResponse, test, web};
    let app = test::init_service(App::new().configure(configure).default_service(web::to(
        |request: HttpRequest| async move {
            HttpResponse::Ok().body(format!("{:?}", request.resource_map()))
        },
    )))
    .await;
    let request = test::TestRequest::get()
        .uri("/no/route/has/this/path")
        .to_request();
    let map = test::call_and_read_body(&app, request).await;
    let map = String::from_utf8_lossy(&map);
    let paths: BTreeSet<String> = map
        .split("patterns: Single(\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .filter(|pattern| !pattern.is_empty())
        .map(without_regexes)
        .collect();
    assert!(
        !map.contains("patterns: List("),
        "a resource with several patterns: read them too\n{map}"
    );
    paths
}

/// An actix pattern as the document writes its path: `{id:[0-9]{1,19}}` is `{id}`.
fn without_regexes(pattern: &str) -> String {
    let mut path = String::new();
    let mut depth = 0;
    let mut in_regex = false;
    for c in pattern.chars() {
        match c {
            '{' => {
                depth += 1;
                if depth == 1 {
                    path.push(c);
                }
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    in_regex = false;
                    path.push(c);
                }
            }
            ':' if depth == 1 => in_regex = true,
            _ if !in_regex => path.push(c),
            _ => {}
        }
    }
    path
}
