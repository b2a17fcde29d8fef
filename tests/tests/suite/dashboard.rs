//! The operator dashboard in headless Chromium against a real, locked stack: every page loads
//! without errors, a task created through the API appears and reaches succeeded, the generator's
//! start and stop (confirmed, and refused without a token) change its status, a lease's time
//! left counts down, and a lease is released from the page. Screenshots of each page go to
//! `target/dashboard-screenshots/`.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use tests::browser::Browser;
use tests::{Service, eventually, fresh_database};

const SERVICE: &str = "dashboard-task-service-token";
const GENERATOR: &str = "dashboard-generator-token-1";
const WORKER: &str = "dashboard-worker-token-0001";
const OPERATOR: &str = "dashboard-operator-token-01";

fn screenshots() -> PathBuf {
    leasehold_local::postgres::cargo_target_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("dashboard-screenshots")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_and_operates_a_live_stack() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let lease_tokens =
        format!("leaseholder:{SERVICE},leaseholder:{GENERATOR},leaseholder+operator:{OPERATOR}");
    let leases = Service::lease_service(
        &lease_db,
        &[
            ("AUTH_TOKENS", lease_tokens.as_str()),
            ("LEASE_REQUIRE_SECRET", "true"),
        ],
    )
    .await;
    let task_tokens = format!("producer:{GENERATOR},worker:{WORKER},producer+operator:{OPERATOR}");
    let tasks = Service::task_service(
        &task_db,
        &leases.base_url(),
        &[
            ("AUTH_TOKENS", task_tokens.as_str()),
            ("LEASE_SERVICE_TOKEN", SERVICE),
        ],
    )
    .await;
    let _worker = Service::worker(
        &tasks.base_url(),
        &[
            ("AUTH_TOKEN", WORKER),
            ("WORKER_ID", "dash-worker"),
            ("POLL_MAX_MS", "200"),
        ],
    )
    .await;
    let _generator = Service::generator(
        &tasks.base_url(),
        &leases.base_url(),
        "dash-gen",
        &[
            ("AUTH_TOKEN", GENERATOR),
            ("GENERATOR_RETRY_INTERVAL_SECONDS", "0.2"),
            ("GENERATOR_SETTINGS_POLL_MS", "200"),
        ],
    )
    .await;

    let browser = Browser::start().await;
    browser.goto(&tasks.url("/dashboard")).await;
    browser
        .wait_for_text("#footer", Duration::from_secs(10), |t| {
            t.contains("updated: ") && !t.contains("never")
        })
        .await;

    // Nothing is due yet: the card says '-', as the queue rows do, not "0.0 s".
    assert_eq!(
        browser.text("#oldest-due").await.as_deref(),
        Some("oldest due -")
    );
    // No task runs yet, but the idle worker process is listed, alive, with its slots; the
    // table of tasks in flight says it is empty.
    browser.click("#tab-workers").await;
    browser
        .wait_for_text(
            "tr[data-worker=\"dash-worker\"] .worker-state",
            Duration::from_secs(10),
            |t| t == "alive",
        )
        .await;
    assert_eq!(
        browser
            .text("tr[data-worker=\"dash-worker\"] .worker-busy")
            .await
            .as_deref(),
        Some("0 / 1")
    );
    browser
        .wait_for_text("#worker-rows", Duration::from_secs(10), |t| {
            t.contains("No task is in flight")
        })
        .await;
    browser.click("#tab-tasks").await;

    // Tasks: one created through the API shows up and reaches succeeded, with its history.
    let created = tasks
        .send_as(
            Some(OPERATOR),
            "POST",
            "/api/tasks",
            Some(&json!({"task_data": {"sleep_duration_seconds": 1}})),
        )
        .await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    let id = created.body["id"].as_i64().unwrap();
    let row = format!("tr[data-task-id=\"{id}\"] .status");
    browser
        .wait_for_text(&row, Duration::from_secs(20), |s| s == "succeeded")
        .await;
    browser
        .execute(
            &format!("document.querySelector('tr[data-task-id=\"{id}\"]').click();"),
            json!([]),
        )
        .await;
    browser
        .wait_for_text("#detail-status", Duration::from_secs(5), |s| {
            s == "succeeded"
        })
        .await;
    let detail = browser.text("#task-detail").await.unwrap();
    assert!(
        detail.contains("running") && detail.contains("dash-worker"),
        "{detail}"
    );
    // Its history's times read as people read them, the exact time on hover.
    let at = browser
        .execute(
            "const t = document.querySelector('#task-detail time'); \
             return [t.textContent, t.title, t.getAttribute('datetime')];",
            json!([]),
        )
        .await;
    assert!(
        at[0]
            .as_str()
            .is_some_and(|t| t.ends_with(" ago") || t == "now")
            && at[1].as_str().is_some_and(|t| !t.is_empty())
            && at[2].as_str().is_some_and(|t| t.contains('T')),
        "{at}"
    );
    // The open task is in the URL: a reload, or the link shared, shows it again.
    let path = browser
        .execute("return location.pathname;", json!([]))
        .await;
    assert_eq!(path, json!(format!("/dashboard/tasks/{id}")));
    browser
        .goto(&tasks.url(&format!("/dashboard/tasks/{id}")))
        .await;
    browser
        .wait_for_text("#detail-status", Duration::from_secs(10), |s| {
            s == "succeeded"
        })
        .await;
    // So are the filters, and back and forward move between views.
    browser
        .goto(&tasks.url("/dashboard/tasks?status=succeeded&queue=default"))
        .await;
    browser
        .wait_for_text(&row, Duration::from_secs(10), |s| s == "succeeded")
        .await;
    let filters = browser
        .execute(
            "return [document.getElementById('task-status').value, \
                     document.getElementById('task-queue').value];",
            json!([]),
        )
        .await;
    assert_eq!(filters, json!(["succeeded", "default"]));
    browser.click("#tab-leases").await;
    let path = browser
        .execute("return location.pathname;", json!([]))
        .await;
    assert_eq!(path, json!("/dashboard/leases"));
    browser.execute("history.back();", json!([])).await;
    browser
        .wait_for_text(&row, Duration::from_secs(10), |s| s == "succeeded")
        .await;
    let back = browser
        .execute(
            "return [location.pathname + location.search, \
                     document.querySelector('section.active').id];",
            json!([]),
        )
        .await;
    assert_eq!(
        back,
        json!(["/dashboard/tasks?status=succeeded&queue=default", "tasks"])
    );
    // Finer filters: who claimed it, and when it was created.
    browser
        .goto(&tasks.url("/dashboard/tasks?processor=dash-worker&since=3600"))
        .await;
    browser
        .wait_for_text(&row, Duration::from_secs(10), |s| s == "succeeded")
        .await;
    let finer = browser
        .execute(
            "return [document.getElementById('task-processor').value, \
                     document.getElementById('task-since').value, \
                     document.getElementById('bulk-delete').disabled];",
            json!([]),
        )
        .await;
    assert_eq!(finer, json!(["dash-worker", "3600", true]));
    browser
        .goto(&tasks.url("/dashboard/tasks?processor=nobody"))
        .await;
    browser
        .wait_for_text("#task-range", Duration::from_secs(10), |t| {
            t == "no tasks match"
        })
        .await;
    browser
        .goto(&tasks.url("/dashboard/leases?prefix=task%3A"))
        .await;
    let leases_view = browser
        .execute(
            "return [document.querySelector('section.active').id, \
                     document.getElementById('lease-prefix').value];",
            json!([]),
        )
        .await;
    assert_eq!(leases_view, json!(["leases", "task:"]));
    browser
        .goto(&tasks.url(&format!("/dashboard/tasks/{id}")))
        .await;
    browser
        .wait_for_text("#detail-status", Duration::from_secs(10), |s| {
            s == "succeeded"
        })
        .await;
    browser
        .wait_for_text("#count-succeeded", Duration::from_secs(5), |t| {
            t.contains('1')
        })
        .await;
    // The charts: per-second rates of each transition and the pickup latency, from the history,
    // with axes, their unit and a legend; over a chosen window kept in the URL.
    let series = tasks
        .get("/api/dashboard/throughput?window_seconds=300")
        .await;
    assert_eq!(series.status, 200, "{:?}", series.body);
    assert_eq!(series.body["bucketSeconds"], 5);
    let buckets = series.body["buckets"].as_array().unwrap();
    let sum = |field: &str| {
        buckets
            .iter()
            .map(|b| b[field].as_i64().unwrap())
            .sum::<i64>()
    };
    assert_eq!(
        (sum("created"), sum("started"), sum("succeeded")),
        (1, 1, 1)
    );
    assert!(
        buckets
            .iter()
            .any(|b| b["pickupP50Ms"].as_f64().is_some_and(|ms| ms >= 0.0)),
        "{buckets:?}"
    );
    let refused = tasks
        .get("/api/dashboard/throughput?window_seconds=7")
        .await;
    assert_eq!((refused.status, refused.code()), (400, "invalid_query"));
    browser
        .wait_for_text("#legend-throughput", Duration::from_secs(10), |t| {
            t == "createdstartedsucceededfailed"
        })
        .await;
    let chart = browser
        .execute(
            "const c = document.getElementById('chart-throughput'); \
             return [c.querySelectorAll('path').length, c.textContent.includes('tasks/s'), \
                     document.getElementById('legend-throughput').textContent];",
            json!([]),
        )
        .await;
    assert_eq!(chart, json!([4, true, "createdstartedsucceededfailed"]));
    let pickup = browser
        .execute(
            "return document.getElementById('chart-pickup').textContent.includes('ms');",
            json!([]),
        )
        .await;
    assert_eq!(pickup, json!(true));
    // Pending and running by queue: the default queue's task was pending, then running, then
    // neither; now nothing is pending or running.
    let queues = series.body["queues"].as_array().unwrap();
    let default = queues.iter().find(|q| q["queue"] == "default").unwrap();
    let values = |field: &str| -> Vec<i64> {
        default[field]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect()
    };
    let (pending, running) = (values("pending"), values("running"));
    assert_eq!((pending.len(), running.len()), (60, 60));
    assert_eq!((pending[59], running[59]), (0, 0), "now");
    assert!(
        pending.iter().chain(&running).all(|&n| n <= 1),
        "{pending:?} {running:?}"
    );
    browser
        .wait_for_text("#legend-queues", Duration::from_secs(10), |t| {
            t.contains("default")
        })
        .await;
    browser
        .goto(&tasks.url(&format!("/dashboard/tasks/{id}?window=3600")))
        .await;
    browser
        .wait_for_text("#detail-status", Duration::from_secs(10), |s| {
            s == "succeeded"
        })
        .await;
    // The whole view, as the book's caption names it: a task's detail, the counts, the charts,
    // the queues and the paged task list.
    browser
        .wait_for_text("#legend-queues", Duration::from_secs(10), |t| {
            t.contains("default")
        })
        .await;
    browser
        .screenshot_page(&screenshots().join("tasks.png"))
        .await;
    let window = browser
        .execute(
            "return document.getElementById('chart-window').value;",
            json!([]),
        )
        .await;
    assert_eq!(window, json!("3600"));

    // Workers: a task in flight shows its processor.
    tasks
        .send_as(
            Some(OPERATOR),
            "POST",
            "/api/tasks",
            Some(&json!({"task_data": {"sleep_duration_seconds": 4}})),
        )
        .await;
    browser.click("#tab-workers").await;
    browser
        .wait_for_text("#worker-rows", Duration::from_secs(10), |t| {
            t.contains("dash-worker")
        })
        .await;
    // Its process shows the busy slot too: a change of load brings its beat forward.
    browser
        .wait_for_text(
            "tr[data-worker=\"dash-worker\"] .worker-busy",
            Duration::from_secs(10),
            |t| t == "1 / 1",
        )
        .await;
    browser
        .screenshot_page(&screenshots().join("workers.png"))
        .await;

    // Generator: without a token the start is refused and nothing changes; with the operator's
    // token it starts (after confirmation), then stops.
    browser.click("#tab-generator").await;
    browser
        .wait_for_text("#generator-status", Duration::from_secs(5), |s| {
            s == "STOPPED"
        })
        .await;
    browser.click("#generator-start").await;
    browser.click("#confirm-yes").await;
    browser
        .wait_for_text("#message", Duration::from_secs(5), |m| {
            m.contains("unauthorized")
        })
        .await;
    assert_eq!(
        browser.text("#generator-status").await.as_deref(),
        Some("STOPPED")
    );
    browser
        .execute(
            "const t = document.getElementById('token'); t.value = arguments[0]; \
             t.dispatchEvent(new Event('change'));",
            json!([OPERATOR]),
        )
        .await;
    browser.click("#generator-start").await;
    assert!(
        browser
            .text("#confirm-text")
            .await
            .unwrap()
            .contains("Start the generator")
    );
    browser.click("#confirm-yes").await;
    browser
        .wait_for_text("#generator-status", Duration::from_secs(10), |s| {
            s == "STARTED"
        })
        .await;
    browser
        .wait_for_text("#generator-leader", Duration::from_secs(10), |s| {
            s.contains("dash-gen")
        })
        .await;
    browser
        .wait_for_text("#generator-produced", Duration::from_secs(15), |s| {
            s.parse::<i64>().unwrap_or(0) > 0
        })
        .await;
    browser
        .screenshot(&screenshots().join("generator.png"))
        .await;
    browser.click("#generator-stop").await;
    browser.click("#confirm-yes").await;
    browser
        .wait_for_text("#generator-status", Duration::from_secs(10), |s| {
            s == "STOPPED"
        })
        .await;
    // The start form shows the rate in force, so Start never silently resets it: set to 3
    // elsewhere, the box says 3.
    for path in ["/api/generator/start", "/api/generator/stop"] {
        let answer = tasks
            .send_as(
                Some(OPERATOR),
                "POST",
                path,
                Some(&json!({"rate_per_second": 3})),
            )
            .await;
        assert!(answer.status < 300, "{path}: {:?}", answer.body);
    }
    browser
        .wait_for_text("#generator-current-rate", Duration::from_secs(10), |s| {
            s == "3"
        })
        .await;
    let rate = browser
        .execute(
            "return document.getElementById('generator-rate').value;",
            json!([]),
        )
        .await;
    assert_eq!(rate, json!("3"));

    // Leases: a lease's time left counts down between refreshes, and it can be released here.
    let lease = leases
        .send_as(
            Some(OPERATOR),
            "POST",
            "/api/leases",
            Some(&json!({"resource": "dashboard-demo", "holder": "someone", "ttl_seconds": 60})),
        )
        .await;
    assert_eq!(lease.status, 201, "{:?}", lease.body);
    let lease_id = lease.body["id"].as_i64().unwrap();
    browser.click("#tab-leases").await;
    let left = format!("tr[data-lease-id=\"{lease_id}\"] .left");
    let seconds = |t: &str| t.trim_end_matches(" s").parse::<f64>().unwrap_or(f64::NAN);
    let first = seconds(
        &browser
            .wait_for_text(&left, Duration::from_secs(10), |t| t.ends_with(" s"))
            .await,
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let second = seconds(&browser.text(&left).await.unwrap());
    assert!(
        first > 50.0 && second < first - 0.5 && second > first - 5.0,
        "the countdown moves: {first} then {second}"
    );
    // Time left and expires at come from one reading of the database's clock, so they agree
    // even in a browser whose clock is off (here set 90 s ahead before the list is read again).
    let cells = browser
        .execute(
            &format!(
                "const real = Date.now; Date.now = () => real() + 90000; \
                 return refreshLeases().then(() => {{ \
                   const row = document.querySelector('tr[data-lease-id=\"{lease_id}\"]'); \
                   return [row.cells[5].textContent, row.cells[6].textContent]; }});"
            ),
            json!([]),
        )
        .await;
    let (time_left, expires) = (cells[0].as_str().unwrap(), cells[1].as_str().unwrap());
    let in_seconds = expires
        .strip_prefix("in ")
        .and_then(|t| t.strip_suffix(" s"))
        .and_then(|t| t.parse::<f64>().ok());
    assert!(
        in_seconds.is_some_and(|n| (n - seconds(time_left)).abs() <= 1.0),
        "time left {time_left:?} and expires at {expires:?} disagree"
    );
    browser.screenshot(&screenshots().join("leases.png")).await;
    // Leases page too: 105 under one prefix make a page of 100, more older, and one of 5.
    for chunk in [0..100, 100..105] {
        let resources: Vec<String> = chunk.map(|i| format!("paged-{i:03}")).collect();
        let taken = leases
            .send_as(
                Some(OPERATOR),
                "POST",
                "/api/leases/batch",
                Some(&json!({"resources": resources, "holder": "pager", "ttl_seconds": 300})),
            )
            .await;
        assert_eq!(taken.status, 200, "{:?}", taken.body);
    }
    browser
        .goto(&tasks.url("/dashboard/leases?prefix=paged-"))
        .await;
    browser
        .wait_for_text("#lease-range", Duration::from_secs(10), |t| {
            t == "1–100, more older"
        })
        .await;
    browser.click("#lease-older").await;
    browser
        .wait_for_text("#lease-range", Duration::from_secs(10), |t| t == "101–105")
        .await;
    browser
        .goto(&tasks.url("/dashboard/leases?prefix=dashboard-demo"))
        .await;
    browser
        .wait_for_text(&left, Duration::from_secs(10), |t| t.ends_with(" s"))
        .await;
    browser
        .execute(
            &format!(
                "document.querySelector('tr[data-lease-id=\"{lease_id}\"] button.revoke').click();"
            ),
            json!([]),
        )
        .await;
    assert!(
        browser
            .text("#confirm-text")
            .await
            .unwrap()
            .contains(&lease_id.to_string())
    );
    browser.click("#confirm-yes").await;
    eventually(Duration::from_secs(10), "the lease revoked", || async {
        leases.get(&format!("/api/leases/{lease_id}")).await.body["lease"]["status"] == "revoked"
    })
    .await;

    // Queues: the operator pauses the default queue from its row (after confirmation), and
    // resumes it.
    browser.click("#tab-tasks").await;
    let state = "tr[data-queue=\"default\"] .queue-state";
    browser
        .wait_for_text(state, Duration::from_secs(10), |s| s == "running")
        .await;
    for (expected, paused) in [("paused", true), ("running", false)] {
        // Clicked from the page itself: the rows are redrawn every second, so an element found
        // over WebDriver can go stale before the click reaches it.
        browser
            .execute(
                "document.querySelector('tr[data-queue=\"default\"] button.queue-toggle').click();",
                json!([]),
            )
            .await;
        browser.click("#confirm-yes").await;
        browser
            .wait_for_text(state, Duration::from_secs(10), |s| s == expected)
            .await;
        assert_eq!(
            tasks.get("/api/queues/default").await.body["paused"],
            paused
        );
    }

    // The task list pages newest first with a count, and acts on the filtered set in bulk:
    // 60 tasks due in a year fill a page of 50 and one of 10.
    let later: Vec<Value> = (0..60)
        .map(|i| json!({"task_data": {"i": i}, "queue": "paged", "scheduled_at": "2099-01-01T00:00:00Z"}))
        .collect();
    let created = tasks
        .send_as(
            Some(OPERATOR),
            "POST",
            "/api/tasks/batch",
            Some(&json!({ "tasks": later })),
        )
        .await;
    assert_eq!(created.status, 200, "{:?}", created.body);
    browser
        .goto(&tasks.url("/dashboard/tasks?queue=paged"))
        .await;
    browser
        .wait_for_text("#task-range", Duration::from_secs(10), |t| {
            t == "1–50 of 60"
        })
        .await;
    browser.click("#page-older").await;
    browser
        .wait_for_text("#task-range", Duration::from_secs(10), |t| {
            t == "51–60 of 60"
        })
        .await;
    browser.click("#page-newer").await;
    browser
        .wait_for_text("#task-range", Duration::from_secs(10), |t| {
            t == "1–50 of 60"
        })
        .await;
    // The keyboard moves along the list, and the row it is on keeps the focus through the
    // redraw every second.
    let focus = browser
        .execute(
            "const rows = document.querySelectorAll('tr[data-task-id]'); rows[0].focus(); \
             rows[0].dispatchEvent(new KeyboardEvent('keydown', {key: 'ArrowDown', bubbles: true})); \
             return [rows[1].dataset.taskId, document.activeElement.dataset.taskId];",
            json!([]),
        )
        .await;
    assert_eq!(focus[0], focus[1], "{focus}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let still = browser
        .execute("return document.activeElement.dataset.taskId;", json!([]))
        .await;
    assert_eq!(still, focus[1]);
    // Newest first by default; oldest first when asked, kept in the URL.
    let first_id = async |browser: &Browser| {
        browser
            .execute(
                "return Number(document.querySelector('tr[data-task-id]').dataset.taskId);",
                json!([]),
            )
            .await
            .as_i64()
            .unwrap()
    };
    let newest = first_id(&browser).await;
    browser
        .goto(&tasks.url("/dashboard/tasks?queue=paged&sort=oldest"))
        .await;
    browser
        .wait_for_text("#task-range", Duration::from_secs(10), |t| {
            t == "1–50 of 60"
        })
        .await;
    assert_eq!(first_id(&browser).await, newest - 59);
    // Bulk: cancel every pending task of the queue, after a confirmation that says how many.
    browser
        .wait_for_text("#bulk-cancel", Duration::from_secs(10), |t| {
            t == "Cancel 60"
        })
        .await;
    browser.click("#bulk-cancel").await;
    assert_eq!(
        browser.text("#confirm-text").await.as_deref(),
        Some("Cancel 60 pending or running tasks of queue paged?")
    );
    browser.click("#confirm-yes").await;
    browser
        .wait_for_text("#message", Duration::from_secs(10), |m| {
            m == "60 tasks cancelled"
        })
        .await;
    assert_eq!(
        tasks.get("/api/queues/paged").await.body["counts"]["cancelled"],
        60
    );
    // With a status no bulk action takes, that action is off.
    browser
        .goto(&tasks.url("/dashboard/tasks?status=cancelled&queue=paged"))
        .await;
    browser
        .wait_for_text("#bulk-retry", Duration::from_secs(10), |t| t == "Retry 60")
        .await;
    let cancel_off = browser
        .execute(
            "return document.getElementById('bulk-cancel').disabled;",
            json!([]),
        )
        .await;
    assert_eq!(cancel_off, json!(true));
    // A task's own link, loaded directly, shows that task: its detail is on screen, not below
    // a page of 50 rows.
    browser
        .goto(&tasks.url(&format!("/dashboard/tasks/{id}")))
        .await;
    browser
        .wait_for_text("#detail-status", Duration::from_secs(10), |s| {
            s == "succeeded"
        })
        .await;
    let shown = browser
        .execute(
            "const box = document.getElementById('task-detail').getBoundingClientRect(); \
             return [document.querySelectorAll('tr[data-task-id]').length, \
                     box.top >= 0 && box.top < window.innerHeight, box.top];",
            json!([]),
        )
        .await;
    assert_eq!(
        (&shown[0], &shown[1]),
        (&json!(50), &json!(true)),
        "{shown}"
    );
    browser.goto(&tasks.url("/dashboard/tasks")).await;

    // Its limits are shown in its row, a limit per key too.
    let set = tasks
        .send_as(
            Some(OPERATOR),
            "PUT",
            "/api/queues/default",
            Some(&json!({"concurrency_limit": 7, "key_concurrency_limit": 2})),
        )
        .await;
    assert_eq!(set.status, 200, "{:?}", set.body);
    browser
        .wait_for_text(
            "tr[data-queue=\"default\"] .queue-limit",
            Duration::from_secs(10),
            |s| s == "7 · 2 per key",
        )
        .await;
    let lifted = tasks
        .send_as(
            Some(OPERATOR),
            "PUT",
            "/api/queues/default",
            Some(&json!({})),
        )
        .await;
    assert_eq!(lifted.status, 200);

    // Schedules: listed with their next tick; paused and resumed from the row, as queues are.
    let created = tasks
        .send_as(
            Some(OPERATOR),
            "POST",
            "/api/schedules",
            Some(&json!({"name": "nightly", "cron": "0 3 * * *", "task_data": {}})),
        )
        .await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    browser.click("#tab-schedules").await;
    let state = "tr[data-schedule=\"nightly\"] .schedule-state";
    browser
        .wait_for_text(state, Duration::from_secs(10), |s| s == "running")
        .await;
    browser
        .screenshot(&screenshots().join("schedules.png"))
        .await;
    for (expected, paused) in [("paused", true), ("running", false)] {
        browser
            .execute(
                "document.querySelector('tr[data-schedule=\"nightly\"] button.schedule-toggle').click();",
                json!([]),
            )
            .await;
        browser.click("#confirm-yes").await;
        browser
            .wait_for_text(state, Duration::from_secs(10), |s| s == expected)
            .await;
        assert_eq!(
            tasks.get("/api/schedules/nightly").await.body["paused"],
            paused
        );
    }
    // Managed from the page: created from the form, edited with the form showing its current
    // values (a save changes only what was changed), and deleted, each after a confirmation.
    browser
        .execute(
            "document.getElementById('schedule-name').value = 'hourly'; \
             document.getElementById('schedule-cron').value = '0 * * * *'; \
             document.getElementById('schedule-queue').value = 'reports'; \
             document.getElementById('schedule-data').value = '{\"report\": 1}'; \
             document.getElementById('schedule-save').click();",
            json!([]),
        )
        .await;
    assert_eq!(
        browser.text("#confirm-text").await.as_deref(),
        Some("Create schedule hourly (0 * * * *)?")
    );
    browser.click("#confirm-yes").await;
    eventually(Duration::from_secs(10), "the schedule created", || async {
        tasks.get("/api/schedules/hourly").await.body["cron"] == "0 * * * *"
    })
    .await;
    browser
        .wait_for_text(
            "tr[data-schedule=\"hourly\"] .schedule-state",
            Duration::from_secs(10),
            |s| s == "running",
        )
        .await;
    browser
        .execute(
            "document.querySelector('tr[data-schedule=\"hourly\"] button.schedule-edit').click();",
            json!([]),
        )
        .await;
    let form = browser
        .execute(
            "return ['schedule-name', 'schedule-cron', 'schedule-queue', 'schedule-data'] \
                 .map(id => document.getElementById(id).value);",
            json!([]),
        )
        .await;
    assert_eq!(
        form,
        json!(["hourly", "0 * * * *", "reports", "{\"report\":1}"])
    );
    browser
        .execute(
            "document.getElementById('schedule-cron').value = '30 * * * *'; \
             document.getElementById('schedule-save').click();",
            json!([]),
        )
        .await;
    browser.click("#confirm-yes").await;
    eventually(Duration::from_secs(10), "the schedule saved", || async {
        let saved = tasks.get("/api/schedules/hourly").await.body;
        saved["cron"] == "30 * * * *" && saved["queue"] == "reports"
    })
    .await;
    browser
        .execute(
            "document.querySelector('tr[data-schedule=\"hourly\"] button.schedule-delete').click();",
            json!([]),
        )
        .await;
    browser.click("#confirm-yes").await;
    eventually(Duration::from_secs(10), "the schedule deleted", || async {
        tasks.get("/api/schedules/hourly").await.status == 404
    })
    .await;

    let errors = browser.page_errors().await;
    assert!(errors.is_empty(), "the page met errors: {errors:?}");

    // Another replica of task-service serves the same page and tells the same truth.
    let other = Service::task_service(
        &task_db,
        &leases.base_url(),
        &[
            ("AUTH_TOKENS", task_tokens.as_str()),
            ("LEASE_SERVICE_TOKEN", SERVICE),
        ],
    )
    .await;
    let number = |text: &str| {
        text.chars()
            .filter(char::is_ascii_digit)
            .collect::<String>()
            .parse::<i64>()
            .unwrap_or(-1)
    };
    let succeeded = number(&browser.text("#count-succeeded").await.unwrap_or_default());
    assert!(succeeded >= 1);
    browser.goto(&other.url("/dashboard")).await;
    browser.click("#tab-generator").await;
    browser
        .wait_for_text("#generator-status", Duration::from_secs(10), |s| {
            s == "STOPPED"
        })
        .await;
    let produced = browser.text("#generator-produced").await;
    browser.click("#tab-tasks").await;
    browser
        .wait_for_text("#count-succeeded", Duration::from_secs(10), |t| {
            number(t) >= succeeded
        })
        .await;
    assert_ne!(
        produced.as_deref(),
        Some("0"),
        "the production count is shared"
    );
    // 420 px wide, a phone's width: the navigation wraps rather than run past the window's
    // edge (it ran 200 px past it).
    browser.resize(420, 900).await;
    let overflow = browser
        .execute(
            "const width = document.documentElement.clientWidth;
             return [...document.querySelectorAll('header > *')]
               .filter(e => e.getBoundingClientRect().right > width + 0.5)
               .map(e => `${e.id || e.tagName}: right edge ${e.getBoundingClientRect().right} of ${width}`);",
            json!([]),
        )
        .await;
    assert_eq!(overflow, json!([]), "the header overflows at 420 px");
    let errors = browser.page_errors().await;
    assert!(errors.is_empty(), "the page met errors: {errors:?}");
    browser.quit().await;
    for page in ["tasks", "workers", "generator", "leases"] {
        let shot = screenshots().join(format!("{page}.png"));
        let bytes = std::fs::read(&shot).unwrap();
        assert!(
            bytes.starts_with(b"\x89PNG") && bytes.len() > 5_000,
            "{}",
            shot.display()
        );
    }
}

/// The dashboard's lease routes go through task-service's one lease-service client: a
/// revocation carries the operator's own token, never task-service's, and lease-service's
/// refusals come back as it gave them (status and code), its absence as 503.
#[tokio::test]
async fn lease_views_pass_on_lease_services_answers_and_never_lend_task_services_token() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let lease_tokens = format!("leaseholder:{SERVICE},leaseholder+operator:{OPERATOR}");
    let mut leases =
        Service::lease_service(&lease_db, &[("AUTH_TOKENS", lease_tokens.as_str())]).await;
    let tasks = Service::task_service(
        &task_db,
        &leases.base_url(),
        &[("LEASE_SERVICE_TOKEN", SERVICE)],
    )
    .await;
    let held = leases
        .send_as(
            Some(SERVICE),
            "POST",
            "/api/leases",
            Some(&json!({"resource": "r", "holder": "h"})),
        )
        .await;
    assert_eq!(held.status, 201, "{:?}", held.body);
    let id = held.body["id"].as_i64().unwrap();
    let revoke = format!("/api/dashboard/leases/{id}/revoke");

    // task-service's own token has no operator role, and it is not lent: without a token of
    // their own the operator is refused by lease-service.
    let anonymous = tasks.send_as(None, "POST", &revoke, None).await;
    assert_eq!(anonymous.status, 401, "{:?}", anonymous.body);
    assert_eq!(anonymous.body["code"], "unauthorized");
    let not_operator = tasks.send_as(Some(SERVICE), "POST", &revoke, None).await;
    assert_eq!(not_operator.status, 403, "{:?}", not_operator.body);
    assert_eq!(not_operator.body["code"], "forbidden");
    let unknown = tasks
        .send_as(
            Some(OPERATOR),
            "POST",
            "/api/dashboard/leases/999999/revoke",
            None,
        )
        .await;
    assert_eq!(unknown.status, 404, "{:?}", unknown.body);
    assert_eq!(unknown.body["code"], "lease_not_found");
    let listed = tasks.get("/api/dashboard/leases?status=active").await;
    assert_eq!(listed.status, 200);
    assert_eq!(listed.body["leases"][0]["status"], "active");
    // With the database's clock the page was judged by, which the page times every lease from.
    assert!(listed.body["now"].is_string(), "{:?}", listed.body);

    let revoked = tasks.send_as(Some(OPERATOR), "POST", &revoke, None).await;
    assert_eq!(revoked.status, 200, "{:?}", revoked.body);
    assert_eq!(revoked.body["status"], "revoked");
    let bad = tasks.get("/api/dashboard/leases?status=maybe").await;
    assert_eq!(
        (bad.status, &bad.body["code"]),
        (400, &json!("invalid_query"))
    );

    leases.kill();
    let gone = tasks.get("/api/dashboard/leases").await;
    assert_eq!(gone.status, 503, "{:?}", gone.body);
    assert_eq!(gone.body["code"], "unavailable");
}

/// The dashboard's data routes refuse a query parameter they do not take (400 `invalid_query`,
/// JSON, naming it) rather than ignore it: `?window=86400`, the page's own name for the chart
/// window, used to answer the default five minutes without a word.
#[tokio::test]
async fn the_dashboards_data_routes_refuse_parameters_they_do_not_take() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let tasks = Service::task_service(&task_db, &leases.base_url(), &[]).await;
    for path in [
        "/api/dashboard/throughput?window=86400",
        "/api/dashboard/throughput?window_seconds=86400&window=86400",
        "/api/dashboard/leases?state=active",
        "/api/dashboard/leases?status=active&prefix=task%3A",
        "/api/dashboard/overview?window=86400",
    ] {
        let refused = tasks.get(path).await;
        assert_eq!(
            (refused.status, refused.code()),
            (400, "invalid_query"),
            "{path}: {:?}",
            refused.body
        );
        let message = refused.body["error"].as_str().unwrap();
        let name = path.rsplit('&').next().unwrap().rsplit('?').next().unwrap();
        let name = name.split('=').next().unwrap();
        assert!(message.contains(name), "{path}: {message}");
    }
    let day = tasks
        .get("/api/dashboard/throughput?window_seconds=86400")
        .await;
    assert_eq!(day.status, 200, "{:?}", day.body);
    assert_eq!(day.body["windowSeconds"], 86_400);
    assert_eq!(tasks.get("/api/dashboard/overview").await.status, 200);
    let listed = tasks
        .get("/api/dashboard/leases?status=active&resource_prefix=task%3A&limit=5&order=desc")
        .await;
    assert_eq!(listed.status, 200, "{:?}", listed.body);
}
