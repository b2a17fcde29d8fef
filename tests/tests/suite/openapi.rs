//! The OpenAPI documents (`GET /api/openapi.json`): each is valid OpenAPI 3.1 by a validator no
//! one here wrote, and lists exactly the routes its service serves: the paths actix mounted
//! (read from actix's own route map) and, over HTTP, the methods each path answers.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;

use actix_web::web::ServiceConfig;
use leasehold::server::auth::Auth;
use serde_json::Value;
use tests::{Service, Stack, tools};

/// How a service mounts its routes.
type Configure = fn(&mut ServiceConfig);

/// Each service: its name, its process, and the function that mounts its routes.
fn services(stack: &Stack) -> [(&'static str, &Service, Configure); 2] {
    [
        ("lease-service", &stack.leases, lease_routes),
        ("task-service", &stack.tasks, task_routes),
    ]
}

fn task_routes(cfg: &mut ServiceConfig) {
    task_service::http::configure(&Auth::open())(cfg);
}

/// lease-service's routes (the TTL bounds only change its document).
fn lease_routes(cfg: &mut ServiceConfig) {
    lease_service::http::configure(
        lease_service::leases::TtlPolicy {
            default_seconds: 30,
            min_seconds: 1,
            max_seconds: 3600,
        },
        &Auth::open(),
    )(cfg);
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

/// The operations of `document` that ask for a bearer token, and those that answer 401.
fn locked_operations(document: &Value) -> (Vec<String>, Vec<String>) {
    let (mut secured, mut refusing) = (Vec::new(), Vec::new());
    for (path, operations) in document["paths"].as_object().unwrap() {
        for (method, operation) in operations.as_object().unwrap() {
            let name = format!("{method} {path}");
            if !operation["security"].is_null() {
                secured.push(name.clone());
            }
            if !operation["responses"]["401"].is_null() {
                refusing.push(name);
            }
        }
    }
    (secured, refusing)
}

#[tokio::test]
async fn a_document_asks_for_a_token_only_when_its_service_checks_tokens() {
    let open = Stack::start(&[]).await;
    for (name, service, _) in services(&open) {
        let document = document(service).await;
        let (secured, refusing) = locked_operations(&document);
        assert_eq!(
            secured,
            Vec::<String>::new(),
            "{name}, open: asks for a token"
        );
        assert_eq!(refusing, Vec::<String>::new(), "{name}, open: answers 401");
        assert!(
            document["components"]["securitySchemes"].is_null(),
            "{name}, open: {}",
            document["components"]["securitySchemes"]
        );
        // A browser's write from a foreign origin is refused whether or not tokens are.
        let create = match name {
            "task-service" => &document["paths"]["/api/tasks"]["post"],
            _ => &document["paths"]["/api/leases"]["post"],
        };
        let forbidden = create["responses"]["403"]["description"].as_str().unwrap();
        assert!(forbidden.contains("origin_not_allowed"), "{forbidden}");
        assert!(!forbidden.contains("`forbidden`"), "{forbidden}");
    }
    drop(open);

    let locked = Stack::with()
        .every_role(
            "a-token-with-every-role-0123456789",
            "task-service-token-0123456789",
        )
        .start()
        .await;
    for (name, service, _) in services(&locked) {
        let document = document(service).await;
        let (secured, refusing) = locked_operations(&document);
        assert!(
            !secured.is_empty(),
            "{name}, locked: no route asks for a token"
        );
        assert_eq!(
            secured, refusing,
            "{name}: each locked route, and only those, answers 401"
        );
        assert!(
            secured.iter().any(|op| op.starts_with("post ")),
            "{name}: {secured:?}"
        );
        assert!(
            secured.iter().all(|op| !op.starts_with("get ")),
            "{name}: reads are open: {secured:?}"
        );
        assert_eq!(
            document["components"]["securitySchemes"]["bearer"]["scheme"],
            "bearer"
        );
    }
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

/// The codes every route may answer, whatever its document says: the front door's and the
/// HTTP layer's (`ErrorCode`'s first group), and a path segment that does not parse.
const ANY_ROUTE: &[&str] = &[
    "unauthorized",
    "forbidden",
    "origin_not_allowed",
    "not_found",
    "method_not_allowed",
    "request_timeout",
    "length_required",
    "payload_too_large",
    "uri_too_long",
    "unsupported_media_type",
    "headers_too_large",
    "bad_request",
    "unavailable",
    "internal",
    "invalid_path",
];

/// The codes an operation's document names for `status`: the backquoted words of its
/// description.
fn documented_codes(operation: &Value, status: u16) -> BTreeSet<String> {
    let description = operation["responses"][status.to_string()]["description"]
        .as_str()
        .unwrap_or("");
    description
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// Each route's error codes are written as text in its document's descriptions: this holds the
/// text to the code. Every backquoted word of a refusal's description names a code that exists,
/// and every refusal the services give to a battery of bad requests, route by route (no body, an
/// empty object, broken JSON, an unknown parameter, ids and names that match nothing), is a code
/// its route's description names for that status, or one any route may answer.
#[tokio::test]
async fn each_routes_documented_error_codes_are_the_ones_it_answers() {
    let stack = Stack::start(&[]).await;
    let known: BTreeSet<&str> = leasehold::ErrorCode::KNOWN
        .iter()
        .map(leasehold::ErrorCode::as_str)
        .collect();
    let mut wrong = Vec::new();
    for (name, service, _) in services(&stack) {
        let doc = document(service).await;
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, operation) in item.as_object().unwrap() {
                for (status, response) in operation["responses"].as_object().unwrap() {
                    if !status.starts_with('4') && !status.starts_with('5') {
                        continue;
                    }
                    let status: u16 = status.parse().unwrap();
                    for code in documented_codes(operation, status) {
                        // Descriptions also quote field names (`holder`, `expiresAt`).
                        let looks_like_code = code.contains('_')
                            && code.chars().all(|c| c.is_ascii_lowercase() || c == '_');
                        if looks_like_code && !known.contains(code.as_str()) {
                            wrong.push(format!(
                                "{name} {method} {path} {status}: `{code}` is no code ({:?})",
                                response["description"]
                            ));
                        }
                    }
                }
                let concrete = path
                    .split('/')
                    .map(|segment| {
                        if segment.starts_with('{') {
                            "0"
                        } else {
                            segment
                        }
                    })
                    .collect::<Vec<_>>()
                    .join("/");
                let method_upper = method.to_uppercase();
                let mut answers = Vec::new();
                for (query, content_type, body) in [
                    ("", None, ""),
                    ("", Some("application/json"), "{}"),
                    ("", Some("application/json"), "{"),
                    ("", Some("application/json"), "[]"),
                    ("?zzz=1", None, ""),
                ] {
                    let answer = service
                        .raw(
                            &method_upper,
                            &format!("{concrete}{query}"),
                            content_type,
                            body.to_owned(),
                        )
                        .await;
                    answers.push((format!("{query} {body}"), answer));
                }
                for (sent, answer) in answers {
                    if answer.status < 400 {
                        continue;
                    }
                    let code = answer.body["code"].as_str().unwrap_or("").to_owned();
                    if ANY_ROUTE.contains(&code.as_str())
                        || documented_codes(operation, answer.status).contains(&code)
                    {
                        continue;
                    }
                    wrong.push(format!(
                        "{name} {method_upper} {path} ({sent}): answered {} `{code}`, which its \
                         document does not name for {}: {:?}",
                        answer.status,
                        answer.status,
                        operation["responses"][answer.status.to_string()]["description"]
                    ));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
