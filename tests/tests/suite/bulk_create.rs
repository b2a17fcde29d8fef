//! `POST /api/tasks/batch`: many creates in one statement and one commit, each judged as it
//! would be alone: new tasks in order, a taken idempotency key answered with its task (or
//! refused when the repeat asks for another task), bad items refused without writing, and a
//! bulk insert that wakes a waiting claim with one notification.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use leasehold::tasks::{CreateTask, MAX_CREATE_BATCH, TaskStatus};
use serde_json::json;
use tests::{Service, fresh_database, snapshot};

async fn services() -> (Service, Service, String) {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let tasks = Service::task_service(&task_db, &leases.base_url(), &[]).await;
    (leases, tasks, task_db)
}

fn create(n: usize, key: Option<&str>) -> CreateTask {
    CreateTask {
        task_data: json!({ "n": n }),
        queue: Some("bulk".to_owned()),
        idempotency_key: key.map(str::to_owned),
        ..CreateTask::default()
    }
}

#[tokio::test]
async fn a_batch_is_one_commit_of_creates_each_judged_alone() {
    let (_leases, tasks, task_db) = services().await;
    let client = tasks.task_client();
    let first = client
        .create(&create(0, Some("taken")))
        .await
        .unwrap()
        .into_task();
    client.create(&create(0, Some("other"))).await.unwrap();

    let bad = CreateTask {
        task_data: json!("not an object"),
        ..create(0, None)
    };
    let results = client
        .create_many(&[
            create(1, None),
            create(0, Some("taken")), // a repeat of the first create: its task
            bad,                      // refused alone
            create(2, Some("fresh")),
            create(3, Some("fresh")), // named twice in the batch
            create(9, Some("other")), // the key names a task made by another request
            create(4, None),
        ])
        .await
        .unwrap();
    let statuses: Vec<u16> = results.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [201, 200, 400, 201, 400, 422, 201]);
    let code = |i: usize| results[i].error.as_ref().unwrap().code.as_str();
    assert_eq!(code(2), "invalid_field");
    assert_eq!(code(4), "duplicate_idempotency_key");
    assert_eq!(code(5), "idempotency_key_reused");
    assert_eq!(results[1].task.as_ref().unwrap().id, first.id);
    let new: Vec<_> = [0, 3, 6]
        .iter()
        .map(|&i| results[i].task.clone().unwrap())
        .collect();
    assert!(
        new.windows(2).all(|w| w[0].id < w[1].id),
        "ids in input order"
    );
    assert_eq!(
        new.iter()
            .map(|t| t.task_data["n"].as_i64().unwrap())
            .collect::<Vec<_>>(),
        [1, 2, 4]
    );
    assert!(new.iter().all(|t| t.status == TaskStatus::Pending));
    // Exactly the two first creates and the three new tasks are stored: refused items wrote
    // nothing.
    assert_eq!(snapshot(&task_db, "tasks").await.len(), 5);
}

/// An item that is no create at all (no `task_data`, a date past year 9999, a float priority)
/// once refused the whole batch with one 400: it gets the answer it would get alone, and the
/// other 999 are created.
#[tokio::test]
async fn an_item_that_is_no_create_is_refused_alone_and_the_rest_are_created() {
    let (_leases, tasks, task_db) = services().await;
    let odd = [
        json!({"queue": "bulk"}),
        json!({"task_data": {}, "scheduled_at": "+10000-01-01T00:00:00Z"}),
        json!({"task_data": {}, "priority": 999.5}),
        json!({"task_data": {}, "max_attempts": 5e-324}),
        json!("not an object"),
    ];
    let mut items: Vec<serde_json::Value> = (0..MAX_CREATE_BATCH - odd.len())
        .map(|n| json!({"task_data": {"n": n}}))
        .collect();
    for (i, item) in odd.iter().enumerate() {
        items.insert(i * 200, item.clone());
    }
    let answer = tasks
        .post("/api/tasks/batch", &json!({ "tasks": items }))
        .await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let results = answer.body["results"].as_array().unwrap();
    assert_eq!(results.len(), MAX_CREATE_BATCH);
    for (i, item) in odd.iter().enumerate() {
        let alone = tasks.post("/api/tasks", item).await;
        let result = &results[i * 200];
        assert_eq!(
            (result["status"].as_u64(), &result["error"]["code"]),
            (Some(u64::from(alone.status)), &alone.body["code"]),
            "{item}: as it would be alone"
        );
        assert_eq!(alone.status, 400, "{item}");
    }
    let created = results.iter().filter(|r| r["status"] == 201).count();
    assert_eq!(created, MAX_CREATE_BATCH - odd.len());
    assert_eq!(snapshot(&task_db, "tasks").await.len(), created);
    // The batch itself must still be a batch.
    for body in [
        json!({"tasks": {}}),
        json!({"task": []}),
        json!({"tasks": [], "x": 1}),
    ] {
        let refused = tasks.post("/api/tasks/batch", &body).await;
        assert_eq!(refused.status, 400, "{body}: {:?}", refused.body);
    }
}

#[tokio::test]
async fn a_batch_holds_at_most_a_thousand_and_never_zero() {
    let (_leases, tasks, task_db) = services().await;
    let full: Vec<CreateTask> = (0..MAX_CREATE_BATCH).map(|n| create(n, None)).collect();
    let results = tasks.task_client().create_many(&full).await.unwrap();
    assert!(results.iter().all(|r| r.status == 201));
    assert_eq!(snapshot(&task_db, "tasks").await.len(), MAX_CREATE_BATCH);

    for size in [0, MAX_CREATE_BATCH + 1] {
        let body = json!({ "tasks": vec![json!({"task_data": {}}); size] });
        let refused = tasks.post("/api/tasks/batch", &body).await;
        assert_eq!(
            (refused.status, refused.code()),
            (400, "invalid_batch"),
            "{size}"
        );
    }
    assert_eq!(snapshot(&task_db, "tasks").await.len(), MAX_CREATE_BATCH);
}

#[tokio::test]
async fn a_waiting_claim_gets_tasks_of_a_bulk_insert() {
    let (_leases, tasks, _task_db) = services().await;
    let waiter = {
        let client = tasks.task_client();
        tokio::spawn(async move {
            client
                .claim_waiting("w", Some("bulk"), Some(10), Duration::from_secs(30))
                .await
                .unwrap()
        })
    };
    let creates: Vec<CreateTask> = (0..50).map(|n| create(n, None)).collect();
    tasks.task_client().create_many(&creates).await.unwrap();
    let claimed = tokio::time::timeout(Duration::from_secs(15), waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(!claimed.is_empty());
}

/// Single creates that arrive together are stored together (one statement), each answered as
/// it would have been alone: a new task 201 with an id of its own, a repeat of a key 200 with
/// the first task (a repeat within the same group too), a key reused for another task 422.
#[tokio::test]
async fn single_creates_arriving_together_are_each_answered_as_alone() {
    let (_leases, tasks, task_db) = services().await;
    let first = tasks
        .post(
            "/api/tasks",
            &json!({"task_data": {"n": "first"}, "idempotency_key": "taken"}),
        )
        .await;
    assert_eq!(first.status, 201, "{:?}", first.body);

    let mut bodies = Vec::new();
    for n in 0..40 {
        bodies.push(("new", json!({"task_data": {"n": n}})));
    }
    for _ in 0..10 {
        bodies.push((
            "repeat",
            json!({"task_data": {"n": "first"}, "idempotency_key": "taken"}),
        ));
        bodies.push((
            "fresh",
            json!({"task_data": {"n": "fresh"}, "idempotency_key": "fresh"}),
        ));
    }
    for n in 0..5 {
        bodies.push((
            "reused",
            json!({"task_data": {"n": n}, "idempotency_key": "taken"}),
        ));
    }
    let answers = futures_util::future::join_all(
        bodies
            .iter()
            .map(|(_, body)| tasks.post("/api/tasks", body)),
    )
    .await;

    let mut new_ids = std::collections::HashSet::new();
    let mut fresh = Vec::new();
    for ((kind, body), answer) in bodies.iter().zip(&answers) {
        match *kind {
            "new" => {
                assert_eq!(answer.status, 201, "{:?}", answer.body);
                // Its own task, not a neighbour's of the same group.
                assert_eq!(answer.body["taskData"], body["task_data"]);
                assert!(new_ids.insert(answer.body["id"].as_i64().unwrap()));
            }
            "repeat" => {
                assert_eq!(answer.status, 200, "{:?}", answer.body);
                assert_eq!(answer.body["id"], first.body["id"]);
            }
            "fresh" => fresh.push((answer.status, answer.body["id"].as_i64().unwrap())),
            _ => {
                assert_eq!(answer.status, 422, "{:?}", answer.body);
                assert_eq!(answer.body["code"], "idempotency_key_reused");
            }
        }
    }
    // The fresh key: one create made the task, the other nine were repeats of it.
    assert_eq!(fresh.iter().filter(|(status, _)| *status == 201).count(), 1);
    assert_eq!(fresh.iter().filter(|(status, _)| *status == 200).count(), 9);
    assert!(fresh.windows(2).all(|pair| pair[0].1 == pair[1].1));
    // Exactly those tasks are stored: the first, the fresh one and the forty new.
    assert_eq!(snapshot(&task_db, "tasks").await.len(), 42);
}
