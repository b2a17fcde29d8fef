//! The sample's own clients (digitalocean/template-job-manager) against Leasehold: each test
//! sends exactly the requests one of its pages, its lease client, its worker or its generator
//! page sends, and reads exactly the fields that client reads. Its article is silent on most of
//! this; its source is the contract.
#![allow(clippy::unwrap_used)]

use serde_json::{Value, json};
use tests::Service;

async fn stack() -> tests::Stack {
    tests::Stack::start(&[]).await
}

/// The sample's fetch-with-JSON: `Content-Type: application/json` and a JSON body.
async fn fetch_json(service: &Service, method: &str, path: &str, body: Value) -> tests::Answer {
    service
        .raw(method, path, Some("application/json"), body.to_string())
        .await
}

/// The sample's lease page (`leases/src/app/page.js`, `components/Lease.js`): every listing is
/// read as `data.leases`, the detail as `data.lease`, with camelCase dates.
#[tokio::test]
async fn the_sample_lease_page_reads_listings_and_a_lease_by_their_names() {
    let s = stack().await;
    let mut ids = Vec::new();
    for resource in ["printer", "scanner"] {
        let lease = fetch_json(
            &s.leases,
            "POST",
            "/api/leases",
            json!({"resource": resource, "holder": "host-1"}),
        )
        .await;
        assert_eq!(lease.status, 201, "{:?}", lease.body);
        ids.push(lease.body["id"].as_i64().unwrap());
    }
    let renewed = fetch_json(
        &s.leases,
        "PUT",
        "/api/leases/renew",
        json!({"resource": "printer", "holder": "host-1"}),
    )
    .await;
    assert!(renewed.status < 300, "{:?}", renewed.body);
    let released = fetch_json(
        &s.leases,
        "DELETE",
        &format!("/api/leases/{}", ids[1]),
        json!({"resource": "scanner", "holder": "host-1"}),
    )
    .await;
    assert!(released.status < 300, "{:?}", released.body);

    for (path, expected) in [
        ("/api/leases", vec!["printer", "scanner"]),
        ("/api/leases/active", vec!["printer"]),
        ("/api/leases/renewed", vec!["printer"]),
        ("/api/leases/released", vec!["scanner"]),
        ("/api/leases/expired", vec![]),
    ] {
        let page = s.leases.get(path).await;
        assert_eq!(page.status, 200, "{path}: {:?}", page.body);
        let listed = page.body["leases"]
            .as_array()
            .unwrap_or_else(|| panic!("{path} answers {{\"leases\": [...]}}: {}", page.body));
        let resources: Vec<_> = listed
            .iter()
            .map(|lease| {
                assert!(
                    lease["id"].is_i64() && lease["holder"].is_string(),
                    "{lease}"
                );
                lease["resource"].as_str().unwrap()
            })
            .collect();
        assert_eq!(resources, expected, "{path}");
    }

    let detail = s.leases.get(&format!("/api/leases/{}", ids[1])).await;
    assert_eq!(detail.status, 200);
    let lease = &detail.body["lease"];
    assert_eq!(lease["resource"], "scanner");
    assert_eq!(lease["holder"], "host-1");
    for field in ["createdAt", "expiresAt", "releasedAt"] {
        assert!(lease[field].is_string(), "{field} in {lease}");
    }
    // One convention: no snake_case twin of a camelCase field anywhere in a lease.
    for key in lease.as_object().unwrap().keys() {
        assert!(!key.contains('_'), "snake_case field {key} in {lease}");
    }
}

/// The sample's lease client (`lib/leases-client.js`): it reads `result.id` after acquire and
/// renew, and `result.error` on every refusal.
#[tokio::test]
async fn the_sample_lease_client_acquires_renews_and_releases_by_id() {
    let s = stack().await;
    let body = json!({"resource": "urn:task-generator:http://a", "holder": "pod-a"});
    let acquired = fetch_json(&s.leases, "POST", "/api/leases", body.clone()).await;
    assert_eq!(acquired.status, 201);
    let id = acquired.body["id"].as_i64().unwrap();

    let taken = fetch_json(
        &s.leases,
        "POST",
        "/api/leases",
        json!({"resource": "urn:task-generator:http://a", "holder": "pod-b"}),
    )
    .await;
    assert_eq!(taken.status, 409);
    assert!(taken.body["error"].is_string(), "{:?}", taken.body);

    let renewed = fetch_json(&s.leases, "PUT", "/api/leases/renew", body.clone()).await;
    assert!(renewed.status < 300, "{:?}", renewed.body);
    assert_eq!(renewed.body["id"].as_i64(), Some(id));

    let released = fetch_json(&s.leases, "DELETE", &format!("/api/leases/{id}"), body).await;
    assert!(released.status < 300, "{:?}", released.body);
    let again = fetch_json(
        &s.leases,
        "PUT",
        "/api/leases/renew",
        json!({"resource": "urn:task-generator:http://a", "holder": "pod-a"}),
    )
    .await;
    assert!(again.status >= 400);
    assert!(again.body["error"].is_string(), "{:?}", again.body);
}

/// The sample's worker (`task-worker/main.js`, `tasks-client.js`) and task pages
/// (`components/TasksView.js`, `Task.js`): claim, heartbeat and complete as `test-worker`,
/// then read the listings as `data.tasks` and the detail as `data.task`.
#[tokio::test]
async fn the_sample_worker_and_task_pages_see_what_they_read() {
    let s = stack().await;
    let created = s
        .tasks
        .post(
            "/api/tasks",
            &json!({"task_data": {"sleep_duration_seconds": 1}}),
        )
        .await;
    assert_eq!(created.status, 201);
    let id = created.body["id"].as_i64().unwrap();

    let worker = json!({"processor": "test-worker"});
    let task = fetch_json(&s.tasks, "POST", "/api/tasks/next", worker.clone()).await;
    assert_eq!(task.status, 202);
    assert_eq!(task.body["taskData"]["sleep_duration_seconds"], 1);
    for field in ["mustHeartBeatBefore", "lastHeartBeatAt"] {
        assert!(task.body[field].is_string(), "{field} in {}", task.body);
    }
    let beat = fetch_json(
        &s.tasks,
        "PUT",
        &format!("/api/tasks/{id}/heartbeat"),
        worker.clone(),
    )
    .await;
    assert_eq!(beat.status, 202);
    assert_eq!(beat.body["id"].as_i64(), Some(id));
    assert_eq!(beat.body["taskData"]["sleep_duration_seconds"], 1);

    let started = s.tasks.get("/api/tasks/started").await;
    assert_eq!(started.body["tasks"][0]["id"].as_i64(), Some(id));

    let done = fetch_json(
        &s.tasks,
        "PUT",
        &format!("/api/tasks/{id}/complete"),
        json!({"processor": "test-worker", "task_output": {"message": "done!!"}}),
    )
    .await;
    assert_eq!(done.status, 202);
    // Nothing left: the worker tells "no task" by a `message` without `taskData`.
    let none = fetch_json(&s.tasks, "POST", "/api/tasks/next", worker).await;
    assert_eq!(none.status, 200);
    assert!(none.body["message"].is_string() && none.body["taskData"].is_null());

    for path in ["/api/tasks", "/api/tasks/processed"] {
        let page = s.tasks.get(path).await;
        let task = &page.body["tasks"][0];
        assert_eq!(task["id"].as_i64(), Some(id), "{path}: {}", page.body);
        for field in [
            "processedAt",
            "scheduledAt",
            "startedAt",
            "lastHeartBeatAt",
            "mustHeartBeatBefore",
        ] {
            assert!(task[field].is_string(), "{path}: {field} in {task}");
        }
    }
    assert_eq!(
        s.tasks.get("/api/tasks/started").await.body["tasks"],
        json!([])
    );
    let detail = s.tasks.get(&format!("/api/tasks/{id}")).await;
    assert_eq!(detail.status, 200);
    let task = &detail.body["task"];
    assert_eq!(task["taskData"]["sleep_duration_seconds"], 1);
    assert_eq!(task["taskOutput"]["message"], "done!!");
}

/// The sample's generator page (`components/TaskGenerator.js`): status read as `status` and
/// `message`; start is a POST with no body and no headers; stop is a DELETE with none.
#[tokio::test]
async fn the_sample_generator_page_starts_and_stops_with_its_own_requests() {
    let s = stack().await;
    let status = s.tasks.get("/api/generator/status").await;
    assert_eq!(status.status, 200);
    assert_eq!(status.body["status"], "STOPPED");
    assert_eq!(status.body["isRunning"], false);
    assert!(status.body["message"].is_string());

    let started = s.tasks.raw("POST", "/api/generator/start", None, "").await;
    assert_eq!(started.status, 200, "{:?}", started.body);
    assert_eq!(started.body["status"], "STARTED");
    assert_eq!(started.body["isRunning"], true);
    assert!(started.body["message"].is_string());

    let stopped = s.tasks.raw("DELETE", "/api/generator/stop", None, "").await;
    assert_eq!(stopped.status, 200, "{:?}", stopped.body);
    assert_eq!(stopped.body["status"], "STOPPED");
    assert_eq!(stopped.body["isRunning"], false);
    assert!(stopped.body["message"].is_string());
    assert_eq!(
        s.tasks.get("/api/generator/status").await.body["status"],
        "STOPPED"
    );
}

/// Listings page by `nextCursor`, oldest first by default and newest first on request; the
/// cursor of the last page is `null`.
#[tokio::test]
async fn listings_page_by_next_cursor_in_either_order() {
    let s = stack().await;
    for n in 0..5 {
        let created = s
            .tasks
            .post("/api/tasks", &json!({"task_data": {"n": n}}))
            .await;
        assert_eq!(created.status, 201);
    }
    for (order, expected) in [("asc", [0, 1, 2, 3, 4]), ("desc", [4, 3, 2, 1, 0])] {
        let mut seen = Vec::new();
        let mut cursor = String::new();
        loop {
            let page = s
                .tasks
                .get(&format!("/api/tasks?limit=2&order={order}&cursor={cursor}"))
                .await;
            assert_eq!(page.status, 200, "{:?}", page.body);
            for task in page.body["tasks"].as_array().unwrap() {
                seen.push(task["taskData"]["n"].as_i64().unwrap());
            }
            match page.body["nextCursor"].as_str() {
                Some(next) => cursor = next.to_owned(),
                None => break,
            }
        }
        assert_eq!(seen, expected, "order={order}");
    }
    let bad = s.tasks.get("/api/tasks?order=sideways").await;
    assert_eq!((bad.status, bad.code()), (400, "invalid_query"));
    // One resource, those under a prefix, or both: then each narrows, neither is dropped.
    let both = s
        .leases
        .get("/api/leases?resource=a&resource_prefix=b")
        .await;
    assert_eq!(both.status, 200);
    assert_eq!(both.body["leases"].as_array().map(Vec::len), Some(0));
    for (query, expected) in [("resource=printer", 1), ("resource=print", 0)] {
        let exact = s.leases.get(&format!("/api/leases?{query}")).await;
        assert_eq!(
            exact.body["leases"].as_array().map(Vec::len),
            Some(0),
            "{query}"
        );
        let acquired = s
            .leases
            .post(
                "/api/leases",
                &json!({"resource": "printer", "holder": "h"}),
            )
            .await;
        assert!(acquired.status < 300);
        let exact = s.leases.get(&format!("/api/leases?{query}")).await;
        assert_eq!(
            exact.body["leases"].as_array().map(Vec::len),
            Some(expected),
            "{query}"
        );
    }
    let both = s
        .leases
        .get("/api/leases?resource=printer&resource_prefix=print")
        .await;
    assert_eq!(both.body["leases"].as_array().map(Vec::len), Some(1));
}

/// A page of large tasks is cut by its size in bytes, not only its row count, and the cursor
/// continues it: no answer is allowed to grow with `limit` times the largest task.
#[tokio::test]
async fn a_page_of_large_tasks_is_cut_by_size_and_continued_by_its_cursor() {
    let s = stack().await;
    let big = "x".repeat(60 * 1024);
    for n in 0..100 {
        let created = s
            .tasks
            .post("/api/tasks", &json!({"task_data": {"n": n, "pad": big}}))
            .await;
        assert_eq!(created.status, 201);
    }
    let mut pages = 0;
    let mut seen = 0;
    let mut cursor = String::new();
    loop {
        let page = s
            .tasks
            .get(&format!("/api/tasks?limit=1000&cursor={cursor}"))
            .await;
        assert_eq!(page.status, 200);
        let tasks = page.body["tasks"].as_array().unwrap();
        let bytes = page.body.to_string().len();
        assert!(bytes <= 4 * 1024 * 1024 + 128 * 1024, "{bytes} bytes");
        for task in tasks {
            assert_eq!(task["taskData"]["n"].as_i64(), Some(seen));
            seen += 1;
        }
        pages += 1;
        match page.body["nextCursor"].as_str() {
            Some(next) => cursor = next.to_owned(),
            None => break,
        }
    }
    assert_eq!(seen, 100);
    assert!(pages >= 2, "100 tasks of 60 KiB fit no 4 MiB page");
}

/// A browser sent to task-service's address lands on the dashboard.
#[tokio::test]
async fn the_root_sends_a_browser_to_the_dashboard() {
    let s = stack().await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let root = http.get(s.tasks.url("/")).send().await.unwrap();
    assert_eq!(root.status().as_u16(), 302);
    assert_eq!(root.headers()["location"], "/dashboard");
    let page = reqwest::get(s.tasks.url("/")).await.unwrap();
    assert_eq!(page.status().as_u16(), 200);
    assert!(page.text().await.unwrap().contains("<html"));
}

/// Readers that ask for pages of large tasks and never read them hold their listing's turn
/// until the page is sent, so their pages count against the bound on memory; a listing that
/// finds every turn held answers 503 once it has waited, and one is served again as soon as a
/// reader goes away.
#[tokio::test]
async fn readers_that_do_not_read_hold_their_turn_and_the_rest_are_told_to_wait() {
    use tokio::io::AsyncWriteExt;
    let s = stack().await;
    let big = "x".repeat(60 * 1024);
    for n in 0..80 {
        let created = s
            .tasks
            .post("/api/tasks", &json!({"task_data": {"n": n, "pad": big}}))
            .await;
        assert_eq!(created.status, 201);
    }
    let address: std::net::SocketAddr = format!("127.0.0.1:{}", s.tasks.port).parse().unwrap();
    let mut stalled = Vec::new();
    for _ in 0..4 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        // A small window, so the kernel cannot take a 4 MiB page off task-service's hands.
        socket.set_recv_buffer_size(4096).unwrap();
        let mut stream = socket.connect(address).await.unwrap();
        stream
            .write_all(b"GET /api/tasks?limit=1000 HTTP/1.1\r\nhost: test\r\n\r\n")
            .await
            .unwrap();
        stalled.push(stream);
    }
    // Patient enough to outwait task-service's own wait for a turn.
    let patient = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(60))
        .build()
        .unwrap();
    let mut turned_away = None;
    for _ in 0..5 {
        let answer = patient
            .get(s.tasks.url("/api/tasks?limit=1"))
            .send()
            .await
            .unwrap();
        if answer.status().as_u16() == 503 {
            turned_away = Some(answer.json::<Value>().await.unwrap());
            break;
        }
    }
    let answer = turned_away.expect("a listing waited out the stalled readers' turns");
    assert_eq!(answer["code"], "unavailable");
    drop(stalled);
    tests::eventually(
        std::time::Duration::from_secs(30),
        "a listing served once the stalled readers left",
        || async { s.tasks.get("/api/tasks?limit=1").await.status == 200 },
    )
    .await;
}
