//! A claim whose client has gone takes nothing. A long-poll claim (`wait_ms`) whose client
//! timed out stops waiting with it, so the task that arrives next goes to a client that is
//! there; and a claim that took tasks while its client left (a complete-then-claim held up by
//! a lock past its client's timeout) hands them back at once, their attempts not charged. Each
//! test's task allows one attempt, so a task claimed for nobody would end `dead` untried.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::{Value, json};
use tests::{Service, eventually, metric_sum};

/// The departing client's patience.
const CLIENT_TIMEOUT: Duration = Duration::from_millis(500);

/// Sends `body` to task-service with a client that gives up after [`CLIENT_TIMEOUT`], and
/// checks that it did give up.
async fn send_and_leave(tasks: &Service, method: reqwest::Method, path: &str, body: Value) {
    let impatient = reqwest::Client::builder()
        .timeout(CLIENT_TIMEOUT)
        .build()
        .unwrap();
    let sent = impatient
        .request(method, format!("{}{path}", tasks.base_url()))
        .json(&body)
        .send()
        .await;
    let err = sent.expect_err("the client left before an answer");
    assert!(err.is_timeout(), "{err}");
}

async fn create(tasks: &Service, queue: &str) -> i64 {
    let body = json!({"task_data": {"n": 1}, "queue": queue, "max_attempts": 1});
    let answer = tasks.post("/api/tasks", &body).await;
    assert_eq!(answer.status, 201, "{:?}", answer.body);
    answer.body["id"].as_i64().unwrap()
}

/// A present client's claim of `queue`, waiting up to a second: the task it must get.
async fn claim_right_after(tasks: &Service, queue: &str) -> Value {
    let body = json!({"processor": "present", "queue": queue, "wait_ms": 1000});
    let answer = tasks.post("/api/tasks/next", &body).await;
    assert_eq!(
        answer.status, 202,
        "the present client gets the task: {:?}",
        answer.body
    );
    answer.body
}

/// The task ran once, for the client that was there: its one attempt is the present client's.
async fn ran_for_the_present_client(tasks: &Service, claimed: &Value, id: i64) {
    assert_eq!(claimed["id"], id);
    assert_eq!(
        claimed["attempts"], 1,
        "the departed client's claim was not charged"
    );
    let body = json!({"processor": "present", "fence": claimed["fence"]});
    let done = tasks.put(&format!("/api/tasks/{id}/complete"), &body).await;
    assert_eq!(done.status, 202, "{:?}", done.body);
    assert_eq!(done.body["status"], "succeeded");
}

#[tokio::test]
async fn a_waiting_claim_whose_client_left_takes_nothing() {
    // No look again on task-service's own while the claim waits: the gauge counts the claim
    // the whole time it waits, so it drops only when the wait ends.
    let stack = tests::Stack::start(&[("WAIT_RECHECK_MS", "600000")]).await;
    let body = json!({"processor": "departed", "queue": "q", "wait_ms": 20000});
    let leaving = send_and_leave(&stack.tasks, reqwest::Method::POST, "/api/tasks/next", body);
    let waiting = eventually(Duration::from_secs(10), "the claim waiting", || async {
        metric_sum(&stack.tasks.metrics().await, "task_claims_waiting") >= 1.0
    });
    tokio::join!(leaving, waiting);
    // The wait ends with its client, not 20 s later.
    eventually(
        Duration::from_secs(10),
        "the departed claim's wait over",
        || async { metric_sum(&stack.tasks.metrics().await, "task_claims_waiting") == 0.0 },
    )
    .await;

    let id = create(&stack.tasks, "q").await;
    let claimed = claim_right_after(&stack.tasks, "q").await;
    ran_for_the_present_client(&stack.tasks, &claimed, id).await;
}

#[tokio::test]
async fn tasks_claimed_after_the_client_left_go_back_at_once_uncharged() {
    use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
    let stack = tests::Stack::start(&[]).await;
    let done = create(&stack.tasks, "qa").await;
    let held = stack
        .tasks
        .post("/api/tasks/next", &json!({"processor": "w", "queue": "qa"}))
        .await;
    assert_eq!(held.status, 202, "{:?}", held.body);
    let next = create(&stack.tasks, "qb").await;

    // The completion's row is locked by the test, so the request waits past its client's
    // patience, then claims `next` for a client that is no longer there.
    let mut lock = AsyncPgConnection::establish(&stack.task_db).await.unwrap();
    diesel::sql_query("BEGIN").execute(&mut lock).await.unwrap();
    diesel::sql_query(format!("SELECT id FROM tasks WHERE id = {done} FOR UPDATE"))
        .execute(&mut lock)
        .await
        .unwrap();
    let body = json!({"processor": "w", "tasks": [{"id": done, "fence": held.body["fence"]}],
                      "next": {"queue": "qb"}});
    send_and_leave(
        &stack.tasks,
        reqwest::Method::PUT,
        "/api/tasks/complete",
        body,
    )
    .await;
    tests::until_waiting_for_locks(&stack.task_db, 1).await;
    diesel::sql_query("COMMIT")
        .execute(&mut lock)
        .await
        .unwrap();

    let claimed = claim_right_after(&stack.tasks, "qb").await;
    ran_for_the_present_client(&stack.tasks, &claimed, next).await;
    // The completion it carried stands, as it would had only its answer been lost.
    let finished = stack.tasks.get(&format!("/api/tasks/{done}")).await;
    assert_eq!(finished.body["task"]["status"], "succeeded");
}
