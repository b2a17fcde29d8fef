//! Traces, metrics and logs of a real run: spans collected by a real OTLP receiver follow one
//! task across worker, task-service and lease-service; metrics equal a known workload; an
//! unreachable collector slows nothing down.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use leasehold::TaskClient;
use leasehold::generator::StartGenerator;
use leasehold::lease_client::LeaseListing;
use leasehold::task_client::TaskListing;
use leasehold::tasks::{CreateTask, TaskStatus};
use leasehold::workers::WorkerLiveness;
use serde_json::json;
use tests::otlp::{OtlpReceiver, ReceivedSpan};
use tests::{Service, create_new, eventually, fresh_database, metric_sum, new_task};

/// How many tasks task-service counts as succeeded (0 when it does not answer).
async fn succeeded(tasks: &TaskClient) -> i64 {
    tasks.counts().await.map_or(0, |counts| {
        counts.total.get("succeeded").copied().unwrap_or(0)
    })
}

const SERVER: i32 = 2;
const CLIENT: i32 = 3;

/// lease-service, task-service and one worker, all exporting to `endpoint`.
async fn stack(endpoint: &str) -> (Service, Service, Service) {
    let otel = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ("LOG_FORMAT", "json"),
        // Each task's lines (logged inside its request's span) are at debug level.
        ("RUST_LOG", "info,task_service=debug"),
    ];
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &otel).await;
    let tasks = Service::task_service(&task_db, &leases.base_url(), &otel).await;
    let mut worker_env = vec![("WORKER_ID", "traced-worker"), ("POLL_MAX_MS", "200")];
    worker_env.extend_from_slice(&otel);
    let worker = Service::worker(&tasks.base_url(), &worker_env).await;
    (leases, tasks, worker)
}

#[tokio::test(flavor = "multi_thread")]
async fn one_trace_follows_each_call_from_worker_to_task_service_to_lease_service() {
    let receiver = OtlpReceiver::start();
    let (leases, tasks, worker) = stack(&receiver.endpoint()).await;
    // The test's own calls go through the typed client, which sends no trace context here (the
    // test process sets no propagator): the worker's claim is still the trace's root.
    let client = tasks.task_client();
    let created = create_new(&client, &new_task(json!({"sleep_duration_seconds": 0}))).await;
    eventually(Duration::from_secs(20), "the task done", || async {
        client
            .task(created.id)
            .await
            .is_ok_and(|task| task.status == TaskStatus::Succeeded)
    })
    .await;
    let id = created.id.to_string();

    // The claim: the worker's root span carries the task id; its trace holds task-service's
    // spans, linked parent to child across the HTTP hop. The task is covered by the worker
    // process's lease, so the claim only reads where that lease stands; the completion proves
    // it too (below).
    let mut claim_trace = Vec::new();
    eventually(
        Duration::from_secs(15),
        "the claim's spans from all three services",
        || {
            let spans = receiver.spans();
            claim_trace = spans
                .iter()
                .find(|s| {
                    s.service == "worker"
                        && s.name == "claim tasks"
                        && s.attributes.get("task.id") == Some(&id)
                })
                .map(|root| {
                    spans
                        .iter()
                        .filter(|s| s.trace_id == root.trace_id)
                        .cloned()
                        .collect()
                })
                .unwrap_or_default();
            // Every span looked at below: they are exported in batches, each process's
            // separately, so the trace can arrive in parts (some task-service spans before its
            // server span, which ends last).
            let has = |service: &str, what: &dyn Fn(&ReceivedSpan) -> bool| {
                claim_trace.iter().any(|s| s.service == service && what(s))
            };
            let db = |operation: &'static str| {
                move |s: &ReceivedSpan| {
                    s.attributes.get("db.operation.name").map(String::as_str) == Some(operation)
                }
            };
            let done = has("worker", &|s| s.kind == CLIENT)
                && has("task-service", &|s| s.kind == SERVER)
                && has("task-service", &|s| s.name == "claim tasks")
                && has("task-service", &db("SELECT"))
                && has("task-service", &db("UPDATE"));
            async move { done }
        },
    )
    .await;
    let by_id: HashMap<&str, &ReceivedSpan> = claim_trace
        .iter()
        .map(|s| (s.span_id.as_str(), s))
        .collect();
    let parent = |span: &ReceivedSpan| by_id.get(span.parent_span_id.as_str()).copied();

    let worker_root = claim_trace
        .iter()
        .find(|s| s.name == "claim tasks" && s.service == "worker")
        .unwrap();
    assert!(
        worker_root.parent_span_id.is_empty(),
        "the claim starts the trace"
    );
    let task_server = claim_trace
        .iter()
        .find(|s| s.service == "task-service" && s.kind == SERVER)
        .expect("task-service's server span");
    assert_eq!(
        task_server.attributes.get("http.route").map(String::as_str),
        Some("/api/tasks/next")
    );
    assert_eq!(
        task_server
            .attributes
            .get("http.request.method")
            .map(String::as_str),
        Some("POST")
    );
    assert_eq!(
        task_server
            .attributes
            .get("http.response.status_code")
            .map(String::as_str),
        Some("202")
    );
    let caller =
        parent(task_server).expect("task-service's span has the worker's client span as parent");
    assert_eq!((caller.service.as_str(), caller.kind), ("worker", CLIENT));
    assert_eq!(
        parent(caller).map(|s| s.span_id.as_str()),
        Some(worker_root.span_id.as_str())
    );

    let claim = claim_trace
        .iter()
        .find(|s| s.service == "task-service" && s.name == "claim tasks")
        .unwrap();
    assert_eq!(claim.attributes.get("task.id"), Some(&id));
    assert_eq!(
        claim.attributes.get("task.processor").map(String::as_str),
        Some("traced-worker")
    );
    assert!(claim.attributes.contains_key("task.fence"));

    assert!(claim_trace.iter().any(|s| s.service == "task-service"
        && s.attributes.get("db.operation.name").map(String::as_str) == Some("SELECT")));
    // Covered by the process's lease, the claim takes no lease of the task's own: lease-service
    // only reads where the process's lease stands (once per look: a claim that waited for its
    // task looked more than once).
    let lease_calls: Vec<Option<&str>> = claim_trace
        .iter()
        .filter(|s| s.service == "lease-service" && s.kind == SERVER)
        .map(|s| s.attributes.get("http.route").map(String::as_str))
        .collect();
    assert!(
        !lease_calls.is_empty()
            && lease_calls
                .iter()
                .all(|route| *route == Some("/api/leases/batch/check")),
        "a claim covered by the process's lease only checks that lease: {lease_calls:?}"
    );

    // The completion is a trace of its own, tagged with the task, and it crosses both hops:
    // task-service proves the process's lease with lease-service, reading. The worker's one slot
    // is busy until then, so the completion carries its next claim.
    let mut completion_trace = Vec::new();
    eventually(Duration::from_secs(15), "the completion's spans", || {
        let spans = receiver.spans();
        completion_trace = spans
            .iter()
            .find(|s| {
                s.service == "task-service"
                    && s.name == "complete tasks and claim"
                    && s.attributes.get("task.ids") == Some(&id)
            })
            .map(|completion| {
                spans
                    .iter()
                    .filter(|s| s.trace_id == completion.trace_id)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let found = completion_trace.iter().any(|s| {
            s.service == "lease-service"
                && s.attributes.get("db.system.name").map(String::as_str) == Some("postgresql")
        }) && completion_trace
            .iter()
            .any(|s| s.service == "lease-service" && s.kind == SERVER);
        async move { found }
    })
    .await;
    let by_id: HashMap<&str, &ReceivedSpan> = completion_trace
        .iter()
        .map(|s| (s.span_id.as_str(), s))
        .collect();
    let parent = |span: &ReceivedSpan| by_id.get(span.parent_span_id.as_str()).copied();
    let lease_server = completion_trace
        .iter()
        .find(|s| s.service == "lease-service" && s.kind == SERVER)
        .expect("lease-service's server span");
    assert_eq!(
        lease_server
            .attributes
            .get("http.route")
            .map(String::as_str),
        Some("/api/leases/batch/check"),
        "a completion proves the process's lease with one read"
    );
    let lease_caller =
        parent(lease_server).expect("lease-service's span has a parent in task-service");
    assert_eq!(
        (lease_caller.service.as_str(), lease_caller.kind),
        ("task-service", CLIENT)
    );
    let database = completion_trace
        .iter()
        .find(|s| {
            s.service == "lease-service"
                && s.attributes.get("db.system.name").map(String::as_str) == Some("postgresql")
        })
        .expect("lease-service's database span");
    assert_eq!(
        database
            .attributes
            .get("db.operation.name")
            .map(String::as_str),
        Some("SELECT")
    );

    // Logs: JSON lines inside a span carry its trace and span ids.
    let log = tasks.log_text();
    let correlated = log
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .any(|line| {
            line["trace_id"].as_str().is_some_and(|t| t.len() == 32) && line["span_id"].is_string()
        });
    assert!(correlated, "no log line with trace_id and span_id:\n{log}");
    drop((leases, worker));
    receiver.stop().await;
}

/// The sum of a counter's samples whose line starts with `prefix`.

#[tokio::test(flavor = "multi_thread")]
async fn metrics_equal_the_workload_and_an_unreachable_collector_slows_nothing() {
    // Nothing listens here: every export fails, in the background.
    let dead = format!("http://127.0.0.1:{}", tests::free_port());
    let (leases, tasks, worker) = stack(&dead).await;
    let client = tasks.task_client();
    // The worker process's own liveness lease is one acquisition: taken before the workload.
    eventually(Duration::from_secs(30), "the worker known", || async {
        client.workers().await.is_ok_and(|w| {
            w.workers
                .iter()
                .any(|w| w.liveness == WorkerLiveness::Alive)
        })
    })
    .await;
    let started = Instant::now();
    // Forty created one by one, ten as a batch's items (and a repeat of one of its keys, which
    // stores nothing and is not counted): both ways count what they stored.
    for n in 0..40 {
        create_new(
            &client,
            &new_task(json!({"sleep_duration_seconds": 0, "n": n})),
        )
        .await;
    }
    let keyed = |n: i64| leasehold::tasks::CreateTask {
        idempotency_key: Some(format!("batch-{n}")),
        ..new_task(json!({"sleep_duration_seconds": 0, "n": n}))
    };
    let statuses = async |batch: Vec<leasehold::tasks::CreateTask>| -> Vec<u16> {
        let results = client.create_many(&batch).await.unwrap();
        results.iter().map(|r| r.status).collect()
    };
    assert_eq!(statuses((40..50).map(keyed).collect()).await, [201; 10]);
    assert_eq!(statuses(vec![keyed(40)]).await, [200]);
    eventually(Duration::from_secs(60), "50 completions", || async {
        succeeded(&client).await == 50
    })
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );

    let task_metrics = tasks.metrics().await;
    assert_eq!(metric_sum(&task_metrics, "tasks_created_total{"), 50.0);
    assert_eq!(metric_sum(&task_metrics, "tasks_claimed_total{"), 50.0);
    assert_eq!(metric_sum(&task_metrics, "tasks_completed_total{"), 50.0);
    assert_eq!(
        metric_sum(&task_metrics, "task_claim_to_complete_seconds_count{"),
        50.0
    );
    assert_eq!(
        metric_sum(
            &task_metrics,
            r#"tasks{queue="default",status="succeeded"}"#
        ),
        50.0
    );
    assert_eq!(
        metric_sum(
            &task_metrics,
            r#"http_requests_total{method="POST",route="/api/tasks",status="201"}"#
        ),
        40.0
    );
    assert_eq!(
        metric_sum(
            &task_metrics,
            r#"http_requests_total{method="POST",route="/api/tasks/batch",status="200"}"#
        ),
        2.0
    );
    // The worker process's liveness lease covers every task it claims: one acquisition, and
    // no lease taken or released per task.
    let lease_metrics = leases.metrics().await;
    assert_eq!(
        metric_sum(&lease_metrics, r#"lease_acquisitions_total{kind="new"}"#),
        1.0,
        "the worker's liveness lease only"
    );
    assert_eq!(metric_sum(&lease_metrics, "lease_releases_total"), 0.0);
    let worker_metrics = worker.metrics().await;
    assert_eq!(
        metric_sum(&worker_metrics, "worker_tasks_claimed_total"),
        50.0
    );
    assert_eq!(
        metric_sum(&worker_metrics, "worker_tasks_completed_total"),
        50.0
    );
    assert_eq!(metric_sum(&worker_metrics, "worker_tasks_in_flight"), 0.0);
    assert_eq!(
        metric_sum(
            &worker_metrics,
            "worker_task_claim_to_complete_seconds_count"
        ),
        50.0
    );
    assert_eq!(tasks.get("/readyz").await.status, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_generated_task_has_one_creation_trace_from_generator_to_database() {
    let receiver = OtlpReceiver::start();
    let endpoint = receiver.endpoint();
    let (leases, tasks, _worker) = stack(&endpoint).await;
    let generator = Service::generator(
        &tasks.base_url(),
        &leases.base_url(),
        "traced-generator",
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("GENERATOR_SETTINGS_POLL_MS", "200"),
        ],
    )
    .await;
    let operator = tasks.task_client();
    let five = StartGenerator {
        rate_per_second: Some(5.0),
        ..StartGenerator::default()
    };
    assert!(operator.start_generator(&five).await.unwrap().is_running);
    let mut trace = Vec::new();
    eventually(
        Duration::from_secs(20),
        "a creation trace through task-service's database",
        || {
            let spans = receiver.spans();
            trace = spans
                .iter()
                .filter(|s| {
                    s.service == "task-generator"
                        && s.name == "generate task"
                        && s.attributes.contains_key("task.id")
                })
                .map(|root| {
                    spans
                        .iter()
                        .filter(|s| s.trace_id == root.trace_id)
                        .cloned()
                        .collect::<Vec<_>>()
                })
                .find(|trace| {
                    trace.iter().any(|s| {
                        s.service == "task-service"
                            && s.attributes.get("db.operation.name").map(String::as_str)
                                == Some("INSERT")
                    })
                })
                .unwrap_or_default();
            let found = !trace.is_empty();
            async move { found }
        },
    )
    .await;
    let root = trace.iter().find(|s| s.name == "generate task").unwrap();
    let id = root.attributes.get("task.id").unwrap();
    let create = trace
        .iter()
        .find(|s| s.service == "task-service" && s.name == "create task")
        .expect("task-service's create span");
    assert_eq!(
        create.attributes.get("task.id"),
        Some(id),
        "tagged with the task it created"
    );
    let server = trace
        .iter()
        .find(|s| s.service == "task-service" && s.kind == SERVER)
        .unwrap();
    let client = trace
        .iter()
        .find(|s| s.span_id == server.parent_span_id)
        .unwrap();
    assert_eq!(
        (client.service.as_str(), client.kind),
        ("task-generator", CLIENT)
    );
    assert_eq!(client.parent_span_id, root.span_id);
    let _ = operator.stop_generator().await;
    drop(generator);
    receiver.stop().await;
}

/// The values of `label` over the series of `metric` (lines `metric{...label="value"...} n`).
fn label_values(metrics: &str, metric: &str, label: &str) -> std::collections::BTreeSet<String> {
    let prefix = format!("{metric}{{");
    let key = format!("{label}=\"");
    metrics
        .lines()
        .filter(|line| line.starts_with(&prefix))
        .filter_map(|line| {
            let start = line.find(&key)? + key.len();
            let end = start + line[start..].find('"')?;
            Some(line[start..end].to_owned())
        })
        .collect()
}

/// Queue names are the producers' choice: `/metrics` names at most `METRICS_MAX_QUEUES` of them,
/// and counts every other queue under `queue="_other"`, totals intact.
#[tokio::test(flavor = "multi_thread")]
async fn queue_labels_are_capped_and_the_other_queues_add_up_under_other() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let tasks = Service::task_service(
        &task_db,
        &leases.base_url(),
        &[("METRICS_MAX_QUEUES", "10")],
    )
    .await;
    let client = tasks.task_client();
    for n in 0..40 {
        let task = CreateTask {
            queue: Some(format!("queue-{n}")),
            ..new_task(json!({"n": n}))
        };
        create_new(&client, &task).await;
    }
    let metrics = tasks.metrics().await;
    for metric in [
        "tasks_created_total",
        "tasks",
        "oldest_due_task_age_seconds",
    ] {
        let queues = label_values(&metrics, metric, "queue");
        assert_eq!(queues.len(), 11, "{metric}: {queues:?}");
        assert!(queues.contains("_other"), "{metric}: {queues:?}");
    }
    assert_eq!(metric_sum(&metrics, "tasks_created_total{"), 40.0);
    assert_eq!(
        metric_sum(&metrics, r#"tasks_created_total{queue="_other"}"#),
        30.0
    );
    assert_eq!(
        metric_sum(&metrics, r#"tasks{queue="_other",status="pending"}"#),
        30.0
    );
    assert_eq!(metric_sum(&metrics, "tasks{"), 40.0);
    // A queue keeps the label it first got.
    let claimed = client.claim("p", Some("queue-0"), None).await.unwrap();
    assert_eq!(claimed.len(), 1, "one task claimed (202): {claimed:?}");
    let metrics = tasks.metrics().await;
    assert_eq!(
        metric_sum(&metrics, r#"tasks_claimed_total{queue="queue-0"}"#),
        1.0
    );
    assert_eq!(label_values(&metrics, "tasks", "queue").len(), 11);
}

/// Lines logged after `skip` lines, at INFO or above.
fn loud_lines_after(log: &str, skip: usize) -> Vec<String> {
    log.lines()
        .skip(skip)
        .filter(|line| {
            [" INFO ", " WARN ", " ERROR "]
                .iter()
                .any(|l| line.contains(l))
        })
        .map(str::to_owned)
        .collect()
}

/// A request, or a task going through, is no log line at INFO: a stack at `RUST_LOG=info` that
/// does steady work logs next to nothing (each task's lines are at debug level).
#[tokio::test(flavor = "multi_thread")]
async fn requests_and_tasks_are_not_logged_one_by_one_at_info() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let tasks = Service::task_service(&task_db, &leases.base_url(), &[]).await;
    let worker = Service::worker(
        &tasks.base_url(),
        &[("WORKER_ID", "quiet-worker"), ("POLL_MAX_MS", "200")],
    )
    .await;
    let lines = |service: &Service| service.log_text().lines().count();
    let started = [lines(&leases), lines(&tasks), lines(&worker)];
    let client = tasks.task_client();
    let lease_client = leases.lease_client();
    for n in 0..20 {
        create_new(
            &client,
            &new_task(json!({"sleep_duration_seconds": 0, "n": n})),
        )
        .await;
    }
    eventually(Duration::from_secs(60), "20 completions", || async {
        succeeded(&client).await == 20
    })
    .await;
    let five_tasks = TaskListing {
        limit: Some(5),
        ..TaskListing::default()
    };
    let five_leases = LeaseListing {
        limit: Some(5),
        ..LeaseListing::default()
    };
    for _ in 0..20 {
        client.list(&five_tasks).await.unwrap();
        lease_client.list(&five_leases).await.unwrap();
    }
    for (service, skip) in [&leases, &tasks, &worker].into_iter().zip(started) {
        let loud = loud_lines_after(&service.log_text(), skip);
        assert!(
            loud.len() < 5,
            "{} logged {} lines at INFO or above for 20 tasks and 40 reads:\n{}",
            service.name,
            loud.len(),
            loud.join("\n")
        );
    }
}

/// With `RUST_LOG=warn` the log is quiet, but the traces are whole: spans are exported and
/// `traceparent` crosses the hop from task-service to lease-service, and a warning logged
/// inside a request still names its trace.
#[tokio::test(flavor = "multi_thread")]
async fn traces_do_not_depend_on_the_log_level() {
    let receiver = OtlpReceiver::start();
    let endpoint = receiver.endpoint();
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ("LOG_FORMAT", "json"),
        ("RUST_LOG", "warn"),
    ];
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let mut leases = Service::lease_service(&lease_db, &env).await;
    let tasks = Service::task_service(&task_db, &leases.base_url(), &env).await;
    let client = tasks.task_client();
    create_new(&client, &new_task(json!({}))).await;
    let claimed = client.claim("p", None, None).await.unwrap();
    assert_eq!(claimed.len(), 1, "one task claimed (202): {claimed:?}");

    let mut found = None;
    eventually(
        Duration::from_secs(20),
        "the claim's spans from task-service and lease-service, in one trace",
        || {
            let spans = receiver.spans();
            found = spans
                .iter()
                .filter(|s| {
                    s.service == "task-service"
                        && s.kind == SERVER
                        && s.attributes.get("http.route").map(String::as_str)
                            == Some("/api/tasks/next")
                })
                .find_map(|server| {
                    let lease_server = spans.iter().find(|s| {
                        s.service == "lease-service"
                            && s.kind == SERVER
                            && s.trace_id == server.trace_id
                    })?;
                    let caller = spans
                        .iter()
                        .find(|s| s.span_id == lease_server.parent_span_id)?;
                    Some((caller.service.clone(), caller.kind))
                });
            let done = found.is_some();
            async move { done }
        },
    )
    .await;
    assert_eq!(found, Some(("task-service".to_owned(), CLIENT)));

    // A warning inside a request: lease-service is gone, so the next claim is 503.
    create_new(&client, &new_task(json!({}))).await;
    leases.kill();
    // Raw: the typed client reports a 503 as transient, without its status.
    let refused = tasks
        .post("/api/tasks/next", &json!({"processor": "p2"}))
        .await;
    assert_eq!(refused.status, 503, "{:?}", refused.body);
    let log = tasks.log_text();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    assert!(
        lines.iter().all(|line| line["level"] != "INFO"),
        "RUST_LOG=warn still rules the log:\n{log}"
    );
    assert!(
        lines.iter().any(|line| line["level"] == "WARN"
            && line["trace_id"].as_str().is_some_and(|t| t.len() == 32)),
        "a warning logged inside a request carries its trace id:\n{log}"
    );
    receiver.stop().await;
}
