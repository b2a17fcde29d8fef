//! Open reads cannot starve claims: however many heavy reads come at once (listings, counts, the
//! queues, the dashboard's overview and charts), at most `READS_IN_FLIGHT` of them hold a
//! database connection, so claims and completions keep the rest of the pool; the reads beyond
//! the bound wait their turn and are answered.
//!
//! To hold the reads without relying on how long they take, the test locks `generator_settings`
//! (which the overview reads last, and no claim or completion touches): every overview that gets
//! a connection then waits in PostgreSQL, holding it, until the test lets go.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde_json::json;
use tests::{Answer, Service, eventually, execute, fresh_database, query};

const READS: usize = 60;
const READS_IN_FLIGHT: usize = 4;
const CLAIMS: usize = 20;

/// Sessions of the task database waiting for a lock: the overviews held by the test's lock.
async fn waiting_on_the_lock(task_db: &str) -> usize {
    let rows = query(
        task_db,
        "SELECT count(*) AS n FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .await;
    usize::try_from(rows[0]["n"].as_i64().unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_and_completions_are_served_while_sixty_heavy_reads_wait_their_turn() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    // A statement timeout far beyond the test: a held read waits for the test's lock, not for
    // PostgreSQL to give up on it.
    let tasks = Service::task_service(
        &task_db,
        &leases.base_url(),
        &[
            ("DATABASE_POOL_SIZE", "16"),
            ("READS_IN_FLIGHT", &READS_IN_FLIGHT.to_string()),
            ("DATABASE_STATEMENT_TIMEOUT_MS", "120000"),
        ],
    )
    .await;
    execute(
        &task_db,
        &format!(
            "INSERT INTO tasks (task_data, queue, max_attempts)
             SELECT '{{}}', 'work', 3 FROM generate_series(1, {CLAIMS})"
        ),
    )
    .await;
    execute(
        &task_db,
        "INSERT INTO tasks (task_data, queue, max_attempts)
         SELECT '{}', 'other-' || g, 3 FROM generate_series(1, 300) g",
    )
    .await;

    let mut lock = AsyncPgConnection::establish(&task_db).await.unwrap();
    diesel::sql_query("BEGIN").execute(&mut lock).await.unwrap();
    diesel::sql_query("LOCK TABLE generator_settings IN ACCESS EXCLUSIVE MODE")
        .execute(&mut lock)
        .await
        .unwrap();

    // Two in three are overviews, held by the lock once they have a connection; the others
    // are the rest of the heavy reads, which wait for a turn behind them.
    let others = [
        "/api/tasks/counts",
        "/api/queues?limit=1000",
        "/api/tasks?limit=1000",
        "/api/dashboard/throughput?window_seconds=86400",
        "/api/queues/work",
    ];
    let reads: Vec<_> = (0..READS)
        .map(|k| {
            let path = if k % 3 == 2 {
                others[k % others.len()].to_owned()
            } else {
                "/api/dashboard/overview".to_owned()
            };
            let url = tasks.url(&path);
            tokio::spawn(async move {
                let answer = reqwest::Client::new()
                    .get(&url)
                    .timeout(Duration::from_secs(60))
                    .send()
                    .await;
                (path, answer.map(|a| a.status().as_u16()))
            })
        })
        .collect();
    eventually(
        Duration::from_secs(30),
        "overviews hold every turn, waiting for the test's lock",
        || async { waiting_on_the_lock(&task_db).await >= READS_IN_FLIGHT },
    )
    .await;

    // Claims and completions, several at once, while the reads hold their connections.
    let claimers: Vec<_> = (0..CLAIMS)
        .map(|k| {
            let tasks = tasks.base_url();
            tokio::spawn(async move {
                let http = reqwest::Client::new();
                let processor = format!("w{k}");
                let claim = http
                    .post(format!("{tasks}/api/tasks/next"))
                    .json(&json!({"processor": processor, "queue": "work"}))
                    .send()
                    .await
                    .unwrap();
                let claimed = claim.status().as_u16();
                let task: serde_json::Value = claim.json().await.unwrap_or_default();
                let completed = if claimed == 202 {
                    http.put(format!("{tasks}/api/tasks/{}/complete", task["id"]))
                        .json(&json!({"processor": processor, "fence": task["fence"],
                                      "task_output": {}}))
                        .send()
                        .await
                        .unwrap()
                        .status()
                        .as_u16()
                } else {
                    0
                };
                (claimed, completed, task)
            })
        })
        .collect();
    let mut answered = Vec::new();
    for claimer in claimers {
        answered.push(claimer.await.unwrap());
    }
    let held = waiting_on_the_lock(&task_db).await;
    diesel::sql_query("ROLLBACK")
        .execute(&mut lock)
        .await
        .unwrap();
    for (claimed, completed, task) in &answered {
        assert_eq!(
            (*claimed, *completed),
            (202, 202),
            "a claim and its completion are served beside the held reads: {task}"
        );
    }
    assert_eq!(
        held, READS_IN_FLIGHT,
        "only READS_IN_FLIGHT reads hold a connection, however many wait"
    );

    for read in reads {
        let (path, status) = read.await.unwrap();
        assert_eq!(
            status.as_ref().ok(),
            Some(&200),
            "{path}: a read beyond the bound waits its turn and is answered ({status:?})"
        );
    }
    let done: Answer = tasks.get("/api/tasks/counts?queue=work").await;
    assert_eq!(
        done.body["queues"]["work"]["succeeded"],
        json!(CLAIMS),
        "{:?}",
        done.body
    );
}
