//! Pausing and resuming a queue, against real lease-service and task-service processes: a paused
//! queue's tasks are not claimed (due or lapsed), its running tasks finish, creates still
//! succeed, other queues are unaffected, and a resume wakes the claims waiting for it.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tests::{Answer, eventually, execute, metric_sum};

tests::stack_with_helpers!(Stack);

async fn stack(env: &[(&str, &str)]) -> Stack {
    Stack(tests::Stack::start(env).await)
}

impl Stack {
    async fn create(&self, queue: &str) -> i64 {
        let answer = self
            .tasks
            .post(
                "/api/tasks",
                &json!({"task_data": {"sleep_duration_seconds": 0}, "queue": queue}),
            )
            .await;
        assert_eq!(answer.status, 201, "{:?}", answer.body);
        answer.body["id"].as_i64().unwrap()
    }

    /// One claim answered at once: the task's id and fence, or `None` for the "no task" answer.
    async fn claim(&self, queue: Option<&str>) -> Option<(i64, i64)> {
        let mut body = json!({"processor": "w"});
        if let Some(queue) = queue {
            body["queue"] = json!(queue);
        }
        let answer = self.tasks.post("/api/tasks/next", &body).await;
        match answer.status {
            202 => Some((
                answer.body["id"].as_i64().unwrap(),
                answer.body["fence"].as_i64().unwrap(),
            )),
            200 => {
                assert!(answer.body["message"].is_string(), "{:?}", answer.body);
                None
            }
            other => panic!("claim answered {other}: {:?}", answer.body),
        }
    }

    async fn set(&self, queue: &str, action: &str) -> Answer {
        self.tasks
            .send_as(None, "POST", &format!("/api/queues/{queue}/{action}"), None)
            .await
    }

    async fn queue(&self, queue: &str) -> Value {
        let answer = self.tasks.get(&format!("/api/queues/{queue}")).await;
        assert_eq!(answer.status, 200, "{:?}", answer.body);
        answer.body
    }
}

#[tokio::test]
async fn a_paused_queue_is_not_claimed_but_finishes_and_accepts_work_and_others_run() {
    let s = stack(&[]).await;
    let running = s.create("mail").await;
    let (claimed, fence) = s.claim(Some("mail")).await.unwrap();
    assert_eq!(claimed, running);

    let paused = s.set("mail", "pause").await;
    assert_eq!(paused.status, 200, "{:?}", paused.body);
    assert_eq!(paused.body["paused"], true);
    assert_eq!(paused.body["counts"]["running"], 1);
    let waiting = s.create("mail").await;
    assert_eq!(
        s.claim(Some("mail")).await,
        None,
        "a paused queue is not claimed"
    );
    assert_eq!(
        s.claim(None).await,
        None,
        "not by a claim of every queue either"
    );
    let other = s.create("reports").await;
    assert_eq!(
        s.claim(None).await.map(|(id, _)| id),
        Some(other),
        "other queues run"
    );

    let done = s
        .tasks
        .put(
            &format!("/api/tasks/{running}/complete"),
            &json!({"processor": "w", "fence": fence, "task_output": {}}),
        )
        .await;
    assert_eq!(done.status, 202, "a running task finishes: {:?}", done.body);

    let state = s.queue("mail").await;
    assert_eq!(
        (
            &state["paused"],
            &state["counts"]["pending"],
            &state["counts"]["succeeded"]
        ),
        (&json!(true), &json!(1), &json!(1)),
        "{state}"
    );
    assert!(state["oldestDueAgeSeconds"].as_f64().unwrap() >= 0.0);
    let listed = s.tasks.get("/api/queues").await.body;
    let names: Vec<&str> = listed["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["queue"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["mail", "reports"], "{listed}");
    let metrics = s.tasks.metrics().await;
    assert_eq!(metric_sum(&metrics, "queue_paused{queue=\"mail\"}"), 1.0);

    let resumed = s.set("mail", "resume").await;
    assert_eq!(resumed.body["paused"], false, "{:?}", resumed.body);
    assert_eq!(s.claim(Some("mail")).await.map(|(id, _)| id), Some(waiting));
    assert_eq!(
        metric_sum(&s.tasks.metrics().await, "queue_paused{queue=\"mail\"}"),
        0.0
    );
}

/// A task whose lease lapsed is not handed out again from a paused queue; after the resume it
/// is, as its next attempt.
#[tokio::test]
async fn a_lapsed_task_of_a_paused_queue_waits_for_the_resume() {
    let s = stack(&[("TASK_LEASE_TTL_SECONDS", "1")]).await;
    let id = s.create("mail").await;
    assert_eq!(s.claim(Some("mail")).await.map(|(id, _)| id), Some(id));
    assert_eq!(s.set("mail", "pause").await.status, 200);
    // Past the lease's expiry, by the database's clock: the task would be claimable, were its
    // queue not paused.
    let lapsed = format!("SELECT 1 FROM tasks WHERE id = {id} AND must_heartbeat_before < now()");
    eventually(Duration::from_secs(10), "the lease to lapse", || async {
        execute(&s.task_db, &lapsed).await == 1
    })
    .await;
    for _ in 0..3 {
        assert_eq!(s.claim(Some("mail")).await, None);
        assert_eq!(s.claim(None).await, None);
    }
    assert_eq!(s.set("mail", "resume").await.status, 200);
    eventually(
        Duration::from_secs(10),
        "the lapsed task claimed",
        || async { s.claim(Some("mail")).await.map(|(claimed, _)| claimed) == Some(id) },
    )
    .await;
    let task = s.tasks.get(&format!("/api/tasks/{id}")).await.body["task"].clone();
    assert_eq!(task["attempts"], 2, "{task}");
}

/// A claim waiting on a paused queue is not answered with its tasks, and the resume wakes it:
/// task-service's own re-check is set far beyond the claim's wait, so only the resume's
/// notification can bring the task before the wait ends.
#[tokio::test]
async fn a_resume_wakes_the_claims_waiting_for_the_queue() {
    const WAIT: Duration = Duration::from_secs(30);
    let s = stack(&[("WAIT_RECHECK_MS", "600000")]).await;
    assert_eq!(s.set("mail", "pause").await.status, 200);
    let id = s.create("mail").await;
    let client = s.tasks.task_client();
    let started = Instant::now();
    let waiting = tokio::spawn(async move {
        client
            .claim_waiting("waiter", Some("mail"), None, WAIT)
            .await
            .unwrap()
    });
    eventually(Duration::from_secs(10), "the claim to wait", || async {
        metric_sum(&s.tasks.metrics().await, "task_claims_waiting") >= 1.0
    })
    .await;
    assert!(!waiting.is_finished(), "answered while the queue is paused");
    assert_eq!(s.set("mail", "resume").await.status, 200);
    let claimed = waiting.await.unwrap();
    assert_eq!(claimed.iter().map(|t| t.id).collect::<Vec<_>>(), [id]);
    assert!(
        started.elapsed() < WAIT / 2,
        "woken by the resume, not at the end of its wait ({:?})",
        started.elapsed()
    );
}

#[tokio::test]
async fn queue_routes_refuse_bad_names_and_need_the_operator_role() {
    let operator = "operator-token-0123456789";
    let producer = "producer-token-0123456789";
    let tokens = format!("operator:{operator},producer:{producer}");
    let s = stack(&[("AUTH_TOKENS", &tokens)]).await;
    let path = "/api/queues/mail/pause";
    let anonymous = s.tasks.send_as(None, "POST", path, None).await;
    assert_eq!(anonymous.status, 401, "{:?}", anonymous.body);
    let refused = s.tasks.send_as(Some(producer), "POST", path, None).await;
    assert_eq!(refused.status, 403, "{:?}", refused.body);
    let long = "q".repeat(leasehold::tasks::MAX_QUEUE_CHARS + 1);
    let bad = s
        .tasks
        .send_as(
            Some(operator),
            "POST",
            &format!("/api/queues/{long}/pause"),
            None,
        )
        .await;
    assert_eq!(bad.status, 400, "{:?}", bad.body);
    assert!(bad.body["code"].is_string() && bad.body["error"].is_string());
    assert_eq!(
        s.tasks.get("/api/queues").await.body["queues"],
        json!([]),
        "a refused pause writes nothing"
    );
    let wrong_method = s.tasks.send_as(Some(operator), "GET", path, None).await;
    assert_eq!(wrong_method.status, 405, "{:?}", wrong_method.body);
    assert!(wrong_method.body["code"].is_string());
    let paused = s.tasks.send_as(Some(operator), "POST", path, None).await;
    assert_eq!(paused.status, 200, "{:?}", paused.body);
    assert_eq!(paused.body["paused"], true);
}

/// The queues' listing pages by name as the task listings page by id: every queue (those with
/// tasks, those with settings only, and names that need encoding) once, in the database's name
/// order either way, each page within its limit, and each queue with its own counts. A bad
/// cursor or limit is refused. One queue's read answers for that queue alone.
#[tokio::test]
async fn the_queues_page_by_name_in_either_order() {
    let s = stack(&[]).await;
    execute(
        &s.task_db,
        "INSERT INTO tasks (task_data, queue, max_attempts)
         SELECT '{}', 'q-' || lpad((g % 250)::text, 3, '0'), 3 FROM generate_series(0, 299) g",
    )
    .await;
    execute(
        &s.task_db,
        "INSERT INTO tasks (task_data, queue, max_attempts)
         SELECT '{}', name, 3 FROM unnest(ARRAY['mail b', 'é', 'a%20b', '100%', 'x/y?z']) name",
    )
    .await;
    execute(
        &s.task_db,
        "INSERT INTO queues (queue, paused)
         SELECT 's-' || lpad(g::text, 2, '0'), true FROM generate_series(0, 39) g
         UNION ALL SELECT 'q-010', true",
    )
    .await;
    let expected: Vec<String> = tests::query(
        &s.task_db,
        "SELECT queue FROM (SELECT queue FROM tasks UNION SELECT queue FROM queues) q
         ORDER BY queue",
    )
    .await
    .into_iter()
    .map(|row| row["queue"].as_str().unwrap().to_owned())
    .collect();
    assert_eq!(expected.len(), 250 + 5 + 40);

    let client = s.tasks.task_client();
    for descending in [false, true] {
        let mut names: Vec<String> = Vec::new();
        let mut cursor = None;
        let mut pages = 0;
        loop {
            let page = client
                .queues(&leasehold::task_client::QueueListing {
                    limit: Some(37),
                    cursor: cursor.take(),
                    descending,
                })
                .await
                .unwrap();
            pages += 1;
            assert!(page.queues.len() <= 37, "{}", page.queues.len());
            for queue in &page.queues {
                let pending = queue.counts["pending"];
                let wanted = match queue.queue.as_str() {
                    name if name.starts_with("s-") => 0,
                    name if name < "q-050" && name.starts_with("q-") => 2,
                    _ => 1,
                };
                assert_eq!(pending, wanted, "{queue:?}");
                assert_eq!(
                    queue.paused,
                    queue.queue.starts_with("s-") || queue.queue == "q-010",
                    "{queue:?}"
                );
            }
            names.extend(page.queues.into_iter().map(|q| q.queue));
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        let mut wanted = expected.clone();
        if descending {
            wanted.reverse();
        }
        assert_eq!(names, wanted, "descending: {descending}");
        assert_eq!(pages, expected.len().div_ceil(37));
    }

    let first = s.tasks.get("/api/queues?limit=2").await;
    assert_eq!(first.status, 200, "{:?}", first.body);
    let next = first.body["nextCursor"].as_str().unwrap();
    assert_eq!(
        first.headers["x-next-cursor"].to_str().unwrap(),
        next,
        "the cursor travels in a header too"
    );
    let link = first.headers["link"].to_str().unwrap();
    let followed = s
        .tasks
        .get(link.trim_start_matches('<').split('>').next().unwrap())
        .await;
    assert_eq!(
        followed.body["queues"][0]["queue"], expected[2],
        "the link goes on after the page"
    );
    for (query, code) in [
        ("cursor=%25zz", "invalid_cursor"),
        ("cursor=%2500", "invalid_cursor"),
        ("limit=0", "invalid_limit"),
        ("order=sideways", "invalid_query"),
        ("limt=5", "invalid_query"),
    ] {
        let refused = s.tasks.get(&format!("/api/queues?{query}")).await;
        assert_eq!(
            (refused.status, refused.code()),
            (400, code),
            "{query}: {:?}",
            refused.body
        );
    }

    let one = s.queue("q-007").await;
    assert_eq!(
        (&one["counts"]["pending"], &one["paused"]),
        (&json!(2), &json!(false))
    );
    let settings_only = s.queue("s-03").await;
    assert_eq!(
        (
            &settings_only["counts"]["pending"],
            &settings_only["paused"]
        ),
        (&json!(0), &json!(true))
    );
    let unused = s.queue("never-used").await;
    assert_eq!(
        (
            &unused["paused"],
            &unused["updatedAt"],
            &unused["counts"]["pending"]
        ),
        (&json!(false), &Value::Null, &json!(0))
    );
}

/// `GET /api/tasks/counts` is paged by queue name (30,000 queues made one answer of 2-3 MB):
/// the pages together hold every queue with its counts, each page's `total` is over every
/// queue, one queue can be asked by name (zeros when it has no task), and bad paging is a 400.
#[tokio::test]
async fn the_counts_page_by_queue_beside_a_total_over_every_queue() {
    let s = stack(&[]).await;
    execute(
        &s.task_db,
        "INSERT INTO tasks (task_data, queue, max_attempts)
         SELECT '{}'::jsonb, 'q-' || lpad((g % 250)::text, 3, '0'), 3 FROM generate_series(0, 299) g
         UNION ALL
         SELECT '{}'::jsonb, name, 3 FROM unnest(ARRAY['mail b', 'é', 'a%20b', '100%', 'x/y?z']) name",
    )
    .await;
    let client = s.tasks.task_client();
    let mut seen = std::collections::BTreeMap::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let page = client.counts_page(cursor.as_deref()).await.unwrap();
        pages += 1;
        assert!(page.queues.len() <= 100, "{}", page.queues.len());
        assert_eq!(page.total["pending"], 305, "the total is over every queue");
        for (queue, counts) in page.queues {
            assert!(
                seen.insert(queue.clone(), counts["pending"]).is_none(),
                "{queue} twice"
            );
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(seen.len(), 255);
    assert_eq!(seen["q-010"], 2);
    assert_eq!(seen["q-200"], 1);
    for name in ["mail b", "é", "a%20b", "100%", "x/y?z"] {
        assert_eq!(seen[name], 1, "{name}");
    }
    // One queue by name; a queue with no task reads as zeros.
    assert_eq!(client.queue_counts("q-010").await.unwrap()["pending"], 2);
    assert_eq!(client.queue_counts("100%").await.unwrap()["pending"], 1);
    let empty = client.queue_counts("nobody-uses-this").await.unwrap();
    assert!(
        empty.values().all(|n| *n == 0) && empty.len() == 5,
        "{empty:?}"
    );
    // Bad paging and unknown parameters are refused, by name.
    for (query, code) in [
        ("limit=0", "invalid_limit"),
        ("cursor=%ZZ", "invalid_cursor"),
        ("colour=red", "invalid_query"),
    ] {
        let answer = s.tasks.get(&format!("/api/tasks/counts?{query}")).await;
        assert_eq!(
            (answer.status, answer.body["code"].as_str()),
            (400, Some(code)),
            "{query}: {:?}",
            answer.body
        );
    }
    let limited = s.tasks.get("/api/tasks/counts?limit=2").await;
    assert_eq!(limited.body["queues"].as_object().unwrap().len(), 2);
    assert!(limited.body["nextCursor"].is_string(), "{:?}", limited.body);
}
