//! Bulk operations by filter (`POST /api/tasks/retry`, `/cancel`, `/delete`), against real
//! lease-service and task-service processes: each touches only what matches, at most its limit
//! per call, says how many, refuses what it must not touch before writing anything, and needs
//! the operator role. The CLI's `retry-all` and `cancel-all` repeat them until nothing is left.
#![allow(clippy::unwrap_used)]

use serde_json::{Value, json};
use tests::{binary, snapshot};

tests::stack_with_helpers!(Stack);

const OPERATOR: &str = "operator-token-0123456789";
const PRODUCER: &str = "producer-token-0123456789";
const WORKER: &str = "worker-token-0123456789ab";

async fn stack() -> Stack {
    let tokens = format!("operator:{OPERATOR},producer:{PRODUCER},worker:{WORKER}");
    Stack(tests::Stack::start(&[("AUTH_TOKENS", &tokens)]).await)
}

impl Stack {
    async fn send(&self, token: &str, method: &str, path: &str, body: &Value) -> tests::Answer {
        self.tasks
            .send_as(Some(token), method, path, Some(body))
            .await
    }

    async fn create(&self, queue: &str, n: usize) -> Vec<i64> {
        let mut ids = Vec::new();
        for _ in 0..n {
            let body = json!({"task_data": {}, "queue": queue, "max_attempts": 1});
            let created = self.send(PRODUCER, "POST", "/api/tasks", &body).await;
            assert_eq!(created.status, 201, "{:?}", created.body);
            ids.push(created.body["id"].as_i64().unwrap());
        }
        ids
    }

    /// Claims every due task of `queue`: their ids and fences.
    async fn claim_all(&self, queue: &str) -> Vec<(i64, i64)> {
        let body = json!({"processor": "w", "queue": queue, "limit": 100});
        let claim = self.send(WORKER, "POST", "/api/tasks/next", &body).await;
        assert_eq!(claim.status, 202, "{:?}", claim.body);
        claim
            .body
            .as_array()
            .unwrap()
            .iter()
            .map(|t| (t["id"].as_i64().unwrap(), t["fence"].as_i64().unwrap()))
            .collect()
    }

    /// `n` dead tasks of `queue`.
    async fn dead(&self, queue: &str, n: usize) -> Vec<i64> {
        self.create(queue, n).await;
        let mut ids = Vec::new();
        for (id, fence) in self.claim_all(queue).await {
            let body = json!({"processor": "w", "fence": fence, "error": "no", "retryable": false});
            let failed = self
                .send(WORKER, "PUT", &format!("/api/tasks/{id}/fail"), &body)
                .await;
            assert_eq!(failed.status, 202, "{:?}", failed.body);
            ids.push(id);
        }
        ids
    }

    async fn bulk(&self, operation: &str, filter: Value) -> u64 {
        let answer = self
            .send(
                OPERATOR,
                "POST",
                &format!("/api/tasks/{operation}"),
                &filter,
            )
            .await;
        assert_eq!(
            answer.status, 200,
            "{operation} {filter}: {:?}",
            answer.body
        );
        answer.body["touched"].as_u64().unwrap()
    }

    /// The ids of the finished tasks (or of `filter`'s status) a listing with `filter` shows.
    async fn finished(&self, filter: Value) -> Vec<i64> {
        let mut query = vec![("limit".to_owned(), "100".to_owned())];
        if filter.get("status").is_none() {
            query.push(("status".to_owned(), "succeeded,dead,cancelled".to_owned()));
        }
        for (field, value) in filter.as_object().unwrap() {
            query.push((field.clone(), value.as_str().unwrap().to_owned()));
        }
        let url = reqwest::Url::parse_with_params("http://listing/api/tasks", &query).unwrap();
        let listed = self
            .tasks
            .get(&format!("{}?{}", url.path(), url.query().unwrap()))
            .await;
        assert_eq!(listed.status, 200, "{filter}: {:?}", listed.body);
        let mut ids: Vec<i64> = listed.body["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|task| task["id"].as_i64().unwrap())
            .collect();
        ids.sort_unstable();
        ids
    }

    /// The `leasehold` CLI against this stack, as an operator.
    fn cli(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new(binary("leasehold"))
            .args(args)
            .env("TASK_SERVICE_URL", self.tasks.base_url())
            .env("LEASEHOLD_TOKEN", OPERATOR)
            .output()
            .unwrap()
    }

    async fn task(&self, id: i64) -> Value {
        self.tasks.get(&format!("/api/tasks/{id}")).await.body["task"].clone()
    }
}

#[tokio::test]
async fn retry_puts_back_the_dead_tasks_of_a_filter_a_limit_at_a_time() {
    let s = stack().await;
    let mail = s.dead("mail", 5).await;
    let reports = s.dead("reports", 2).await;
    assert_eq!(s.task(mail[0]).await["status"], "dead");

    let touched: Vec<u64> = {
        let mut calls = Vec::new();
        loop {
            let n = s.bulk("retry", json!({"queue": "mail", "limit": 2})).await;
            calls.push(n);
            if n == 0 {
                break calls;
            }
        }
    };
    assert_eq!(touched, [2, 2, 1, 0]);
    for id in &mail {
        let task = s.task(*id).await;
        assert_eq!(
            (&task["status"], &task["attempts"]),
            (&json!("pending"), &json!(0)),
            "{task}"
        );
    }
    for id in &reports {
        assert_eq!(s.task(*id).await["status"], "dead", "another queue");
    }
    // By id: only the one named.
    assert_eq!(s.bulk("retry", json!({"ids": [reports[1]]})).await, 1);
    assert_eq!(s.task(reports[0]).await["status"], "dead");
    assert_eq!(s.task(reports[1]).await["status"], "pending");
    // Created before an instant long past: none.
    let none = json!({"created_before": "2000-01-01T00:00:00Z"});
    assert_eq!(s.bulk("retry", none).await, 0);
}

#[tokio::test]
async fn cancel_ends_pending_tasks_now_and_running_ones_at_their_next_heartbeat() {
    let s = stack().await;
    s.create("mail", 1).await;
    let (running, fence) = s.claim_all("mail").await[0];
    let pending = s.create("mail", 3).await;
    let other = s.create("reports", 1).await;

    assert_eq!(s.bulk("cancel", json!({"queue": "mail"})).await, 4);
    for id in &pending {
        assert_eq!(s.task(*id).await["status"], "cancelled");
    }
    let marked = s.task(running).await;
    assert_eq!(
        (&marked["status"], &marked["cancelRequested"]),
        (&json!("running"), &json!(true)),
        "{marked}"
    );
    assert_eq!(
        s.bulk("cancel", json!({"queue": "mail"})).await,
        0,
        "a running task already marked is not touched again"
    );
    let heartbeat = s
        .send(
            WORKER,
            "PUT",
            &format!("/api/tasks/{running}/heartbeat"),
            &json!({"processor": "w", "fence": fence}),
        )
        .await;
    assert_eq!(
        (heartbeat.status, heartbeat.body["code"].as_str()),
        (409, Some("cancelled"))
    );
    assert_eq!(s.task(other[0]).await["status"], "pending", "another queue");
}

#[tokio::test]
async fn delete_removes_only_finished_tasks() {
    let s = stack().await;
    let dead = s.dead("mail", 2).await;
    let pending = s.create("mail", 2).await;
    assert_eq!(s.bulk("delete", json!({})).await, 2);
    for id in &dead {
        let gone = s.tasks.get(&format!("/api/tasks/{id}")).await;
        assert_eq!(gone.status, 404, "{:?}", gone.body);
    }
    for id in &pending {
        assert_eq!(s.task(*id).await["status"], "pending");
    }
}

#[tokio::test]
async fn bulk_operations_refuse_what_they_must_not_touch_and_write_nothing() {
    let s = stack().await;
    s.dead("mail", 1).await;
    s.create("mail", 1).await;
    let before = snapshot(&s.task_db, "tasks").await;
    let too_many: Vec<i64> = (1..=1001).collect();
    for (operation, body, status, code) in [
        ("retry", json!({"status": "pending"}), 400, "invalid_status"),
        ("cancel", json!({"status": "dead"}), 400, "invalid_status"),
        (
            "delete",
            json!({"status": "pending"}),
            400,
            "invalid_status",
        ),
        (
            "delete",
            json!({"status": "running"}),
            400,
            "invalid_status",
        ),
        ("retry", json!({"limit": 0}), 400, "invalid_limit"),
        ("retry", json!({"limit": 1001}), 400, "invalid_limit"),
        ("retry", json!({"ids": too_many}), 400, "too_many_ids"),
        ("retry", json!({"queue": ""}), 400, "invalid_field"),
        ("retry", json!({"status": "asleep"}), 400, "invalid_field"),
        // A field a bulk operation does not know is refused, never ignored: ignored, it
        // widened the operation to every task.
        ("delete", json!({"bogus": 1}), 400, "invalid_field"),
        ("delete", json!({"processors": "w"}), 400, "invalid_field"),
        (
            "cancel",
            json!({"queue": "mail", "prio": 1}),
            400,
            "invalid_field",
        ),
        ("retry", json!({"processor": ""}), 400, "invalid_field"),
        (
            "retry",
            json!({"created_after": "soon"}),
            400,
            "invalid_field",
        ),
    ] {
        let path = format!("/api/tasks/{operation}");
        let answer = s.send(OPERATOR, "POST", &path, &body).await;
        assert_eq!(
            (answer.status, answer.body["code"].as_str()),
            (status, Some(code)),
            "{operation} {body}: {:?}",
            answer.body
        );
    }
    let refused = s
        .send(PRODUCER, "POST", "/api/tasks/delete", &json!({}))
        .await;
    assert_eq!(refused.status, 403, "{:?}", refused.body);
    assert_eq!(snapshot(&s.task_db, "tasks").await, before);
}

/// Every field the listings take narrows a bulk operation exactly as it narrows the listing: a
/// bulk delete once ignored `processor`, `key` and `created_after`, and deleted every finished
/// task. Each filter below deletes exactly the tasks the listing showed for it, and no other.
#[tokio::test]
async fn a_bulk_operation_touches_exactly_what_the_same_filter_lists() {
    let s = stack().await;
    // Finished tasks of two queues, two processors and two keys (and none), created over time.
    for (queue, processor, key, ends) in [
        ("qa", "procA", Some("k1"), "fail"),
        ("qa", "procB", Some("k2"), "complete"),
        ("qb", "procA", None, "complete"),
        ("qb", "procB", Some("k1"), "fail"),
        ("qa", "procA", None, "complete"),
        ("qb", "procA", Some("k2"), "fail"),
        ("qa", "procB", Some("k1"), "complete"),
        ("qb", "procB", None, "fail"),
    ] {
        let mut body = json!({"task_data": {}, "queue": queue, "max_attempts": 1});
        if let Some(key) = key {
            body["concurrency_key"] = json!(key);
        }
        let created = s.send(PRODUCER, "POST", "/api/tasks", &body).await;
        assert_eq!(created.status, 201, "{:?}", created.body);
        let claim = json!({"processor": processor, "queue": queue, "limit": 1});
        let claimed = s.send(WORKER, "POST", "/api/tasks/next", &claim).await;
        assert_eq!(claimed.status, 202, "{:?}", claimed.body);
        let task = &claimed.body[0];
        let (path, end) = if ends == "fail" {
            (
                "fail",
                json!({"processor": processor, "fence": task["fence"], "error": "no", "retryable": false}),
            )
        } else {
            (
                "complete",
                json!({"processor": processor, "fence": task["fence"], "task_output": {}}),
            )
        };
        let ended = s
            .send(
                WORKER,
                "PUT",
                &format!("/api/tasks/{}/{path}", task["id"]),
                &end,
            )
            .await;
        assert_eq!(ended.status, 202, "{:?}", ended.body);
    }
    let all = s.finished(json!({})).await;
    assert_eq!(all.len(), 8);
    let middle = s.task(all[4]).await["createdAt"]
        .as_str()
        .unwrap()
        .to_owned();
    for filter in [
        json!({"queue": "qa", "processor": "procA"}),
        json!({"key": "k1"}),
        json!({"processor": "procB", "status": "dead"}),
        json!({"created_after": middle}),
        json!({"created_before": middle, "queue": "qb"}),
        json!({"processor": "nobody"}),
        json!({}),
    ] {
        let listed = s.finished(filter.clone()).await;
        let before = s.finished(json!({})).await;
        let touched = s.bulk("delete", filter.clone()).await;
        let after = s.finished(json!({})).await;
        let deleted: Vec<i64> = before
            .into_iter()
            .filter(|id| !after.contains(id))
            .collect();
        assert_eq!(
            deleted, listed,
            "{filter}: deleted what the listing did not show"
        );
        assert_eq!(touched, listed.len() as u64, "{filter}");
    }
    assert!(s.finished(json!({})).await.is_empty());

    // Cancel narrows pending tasks the same way: a processor none of them has touches none.
    s.create("qa", 2).await;
    assert_eq!(s.bulk("cancel", json!({"processor": "procA"})).await, 0);
    assert_eq!(s.bulk("cancel", json!({"key": "k9"})).await, 0);
    assert_eq!(s.bulk("cancel", json!({"queue": "qa"})).await, 2);
}

#[tokio::test]
async fn the_cli_retries_and_cancels_everything_that_matches() {
    let s = stack().await;
    s.dead("mail", 3).await;
    s.create("reports", 2).await;
    let cli = |args: &[&str]| s.cli(args);
    // A filter's verb says how many it would touch and asks first; with no terminal to ask
    // on it refuses (exit 2) and touches nothing, until told --yes.
    let before = snapshot(&s.task_db, "tasks").await;
    let unasked = cli(&["tasks", "retry", "--status", "dead", "--queue", "mail"]);
    assert_eq!(unasked.status.code(), Some(2), "{unasked:?}");
    let said = String::from_utf8_lossy(&unasked.stderr);
    assert!(
        said.contains("retry 3 dead tasks of queue mail?") && said.contains("--yes"),
        "{said}"
    );
    assert_eq!(snapshot(&s.task_db, "tasks").await, before);
    let retried = cli(&["tasks", "retry", "--queue", "mail", "--yes", "--json"]);
    assert!(retried.status.success(), "{retried:?}");
    let answer: Value = serde_json::from_slice(&retried.stdout).unwrap();
    assert_eq!(answer["retried"], 3);
    // Earlier releases' spelling still works, without asking.
    let cancelled = cli(&["tasks", "cancel-all", "--status", "pending", "--json"]);
    assert!(cancelled.status.success(), "{cancelled:?}");
    let answer: Value = serde_json::from_slice(&cancelled.stdout).unwrap();
    assert_eq!(answer["cancelled"], 5, "mail's 3 retried and reports' 2");
    // Nothing matching: said, and nothing asked.
    let none = cli(&["tasks", "retry", "--queue", "mail"]);
    assert!(none.status.success(), "{none:?}");
    assert!(String::from_utf8_lossy(&none.stderr).contains("nothing to retry"));
    let deleted = cli(&["tasks", "delete", "--status", "cancelled", "-y"]);
    assert!(deleted.status.success(), "{deleted:?}");
    assert_eq!(
        String::from_utf8_lossy(&deleted.stdout).trim(),
        "5 tasks deleted"
    );
    // An id and a filter together are a wrong command line.
    let both = cli(&["tasks", "retry", "1", "--queue", "mail"]);
    assert_eq!(both.status.code(), Some(2), "{both:?}");
}

/// The CLI's bulk verbs take every filter the bulk routes take: processor, key, ids,
/// created-after and a limit in all, beside queue, status and created-before; the confirmation
/// names them and says "at most" when the counts cannot tell the exact number.
#[tokio::test]
async fn the_cli_takes_every_filter_the_bulk_routes_take() {
    let s = stack().await;
    let cli = |args: &[&str]| s.cli(args);
    let answer = |output: &std::process::Output| -> Value {
        assert!(output.status.success(), "{output:?}");
        serde_json::from_slice(&output.stdout).unwrap()
    };
    let s = &s;
    let keyed = |key: &'static str| async move {
        let body = json!({"task_data": {}, "queue": "filtered", "concurrency_key": key});
        let created = s.send(PRODUCER, "POST", "/api/tasks", &body).await;
        assert_eq!(created.status, 201, "{:?}", created.body);
        created.body["id"].as_i64().unwrap()
    };
    let a = [keyed("a").await, keyed("a").await];
    let b = [keyed("b").await, keyed("b").await, keyed("b").await];
    let status = |id: i64| async move { s.task(id).await["status"].clone() };

    // By key: the confirmation names the filter and, since the counts are by queue and status
    // only, says "at most".
    let unasked = cli(&["tasks", "cancel", "--queue", "filtered", "--key", "a"]);
    assert_eq!(unasked.status.code(), Some(2), "{unasked:?}");
    let said = String::from_utf8_lossy(&unasked.stderr);
    assert!(
        said.contains("cancel at most 5 pending,running tasks of queue filtered with key a?"),
        "{said}"
    );
    let cancelled = cli(&["tasks", "cancel", "--key", "a", "--yes", "--json"]);
    assert_eq!(answer(&cancelled)["cancelled"], 2);
    for id in a {
        assert_eq!(status(id).await, "cancelled");
    }
    for id in b {
        assert_eq!(status(id).await, "pending");
    }
    // By ids, and a limit in all.
    let ids = format!("{},{}", b[0], b[1]);
    let limited = cli(&[
        "tasks", "cancel", "--ids", &ids, "--limit", "1", "-y", "--json",
    ]);
    assert_eq!(answer(&limited)["cancelled"], 1);
    let ended = [status(b[0]).await, status(b[1]).await, status(b[2]).await];
    assert_eq!(
        ended.iter().filter(|s| **s == "cancelled").count(),
        1,
        "{ended:?}"
    );
    assert_eq!(ended[2], "pending", "not among the ids: {ended:?}");
    // Created after a moment later than every task: nothing matches.
    let later = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let none = cli(&["tasks", "delete", "--created-after", &later, "-y", "--json"]);
    assert_eq!(answer(&none)["deleted"], 0);
    // By processor: a claimed task, cancelled by its worker's name alone.
    let claim = s
        .send(
            WORKER,
            "POST",
            "/api/tasks/next",
            &json!({"processor": "box-7", "queue": "filtered"}),
        )
        .await;
    assert_eq!(claim.status, 202, "{:?}", claim.body);
    let claimed = claim.body["id"].as_i64().unwrap();
    let by_processor = cli(&["tasks", "cancel", "--processor", "box-7", "-y", "--json"]);
    assert_eq!(answer(&by_processor)["cancelled"], 1);
    let task = s.task(claimed).await;
    assert_eq!(task["cancelRequested"], true, "{task}");
    // A wrong filter is refused by the command line, before any request.
    let bad = cli(&["tasks", "retry", "--limit", "0"]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
}
