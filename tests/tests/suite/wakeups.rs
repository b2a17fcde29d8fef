//! Claims that wait for work (`wait_ms`) are woken by the database's notifications, not by
//! polling: each test sets task-service's fallback re-check (`WAIT_RECHECK_MS`) far beyond
//! the claim's wait, so a claim that gets its task got it from a wake-up. A task due later wakes
//! its waiter by a timer; a listener whose connection is killed reconnects and loses no news;
//! the sample's claims, which send no `wait_ms`, are answered at once.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use leasehold::TaskClient;
use leasehold::tasks::{CreateTask, TaskStatus};
use serde_json::json;
use tests::{Service, eventually, execute, fresh_database, metric_sum};

/// A claim waits this long; task-service looks again on its own only after [`RECHECK_MS`]. So
/// a claim answered with a task within [`WOKEN_WITHIN`] was woken: it did not look again on its
/// own, nor reach the end of its wait (where it looks once more).
const WAIT: Duration = Duration::from_secs(30);
const WOKEN_WITHIN: Duration = Duration::from_secs(15);
const RECHECK_MS: &str = "600000";

async fn stack() -> tests::Stack {
    tests::Stack::start(&[("WAIT_RECHECK_MS", RECHECK_MS)]).await
}

/// A claim of `queue` waiting up to [`WAIT`], in the background.
fn waiting_claim(
    stack: &tests::Stack,
    queue: &str,
) -> tokio::task::JoinHandle<Vec<leasehold::tasks::Task>> {
    let (client, queue) = (stack.tasks.task_client(), queue.to_owned());
    tokio::spawn(async move {
        client
            .claim_waiting("waiter", Some(&queue), None, WAIT)
            .await
            .unwrap()
    })
}

async fn create(
    client: &TaskClient,
    queue: &str,
    scheduled_at: Option<chrono::DateTime<chrono::Utc>>,
) -> i64 {
    client
        .create(&CreateTask {
            task_data: json!({"n": 1}),
            queue: Some(queue.to_owned()),
            scheduled_at,
            ..CreateTask::default()
        })
        .await
        .unwrap()
        .into_task()
        .id
}

/// Waits until task-service holds a waiting claim (`task_claims_waiting`): its first claim round
/// found nothing, so what is created from now on can reach it only by a wake-up.
async fn until_waiting(stack: &tests::Stack) {
    eventually(Duration::from_secs(10), "a claim waiting", || async {
        metric_sum(&stack.tasks.metrics().await, "task_claims_waiting") >= 1.0
    })
    .await;
}

/// Whether task-service's listener is connected to the tasks database.
async fn listening(task_db: &str) -> bool {
    execute(
        task_db,
        "SELECT pid FROM pg_stat_activity \
         WHERE application_name = 'task-service wake-ups' AND datname = current_database()",
    )
    .await
        == 1
}

#[tokio::test]
async fn a_waiting_claim_is_woken_by_the_task_created_after_it_asked() {
    let stack = stack().await;
    let client = stack.tasks.task_client();
    let waiter = waiting_claim(&stack, "wake");
    until_waiting(&stack).await;
    let id = create(&client, "wake", None).await;
    let claimed = tokio::time::timeout(WOKEN_WITHIN, waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        claimed.len(),
        1,
        "woken by the insert, not by the wait's end"
    );
    assert_eq!(claimed[0].id, id);
    assert_eq!(claimed[0].status, TaskStatus::Running);
}

#[tokio::test]
async fn a_task_due_later_wakes_its_waiter_when_it_comes_due() {
    let stack = stack().await;
    let client = stack.tasks.task_client();
    let waiter = waiting_claim(&stack, "later");
    until_waiting(&stack).await;
    let due = chrono::Utc::now() + chrono::TimeDelta::milliseconds(1500);
    let id = create(&client, "later", Some(due)).await;
    let claimed = tokio::time::timeout(WOKEN_WITHIN, waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.len(), 1, "woken by the timer on its due time");
    assert_eq!(claimed[0].id, id);
    assert!(claimed[0].started_at.unwrap() >= claimed[0].scheduled_at);
}

#[tokio::test]
async fn a_listener_whose_connection_is_killed_reconnects_and_misses_nothing() {
    let stack = stack().await;
    let client = stack.tasks.task_client();
    eventually(Duration::from_secs(10), "the listener connected", || {
        listening(&stack.task_db)
    })
    .await;
    let waiter = waiting_claim(&stack, "dropped");
    until_waiting(&stack).await;

    // The listener's connection dies (as in a failover); the task is created at once, possibly
    // before the listener is back, so its notification may be lost for good.
    let killed = execute(
        &stack.task_db,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name = 'task-service wake-ups' AND datname = current_database()",
    )
    .await;
    assert_eq!(killed, 1);
    let id = create(&client, "dropped", None).await;
    let claimed = tokio::time::timeout(WOKEN_WITHIN, waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.len(), 1, "the reconnected listener woke the waiter");
    assert_eq!(claimed[0].id, id);
    eventually(Duration::from_secs(10), "the listener is back", || {
        listening(&stack.task_db)
    })
    .await;

    // And news flows again through the new connection.
    let waiter = waiting_claim(&stack, "dropped");
    until_waiting(&stack).await;
    let second = create(&client, "dropped", None).await;
    let claimed = tokio::time::timeout(WOKEN_WITHIN, waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.iter().map(|t| t.id).collect::<Vec<_>>(), [second]);
}

#[tokio::test]
async fn a_claim_without_wait_is_answered_at_once_and_a_wait_too_long_is_refused() {
    let stack = stack().await;
    let started = std::time::Instant::now();
    let empty = stack
        .tasks
        .post("/api/tasks/next", &json!({"processor": "sample"}))
        .await;
    assert_eq!(empty.status, 200);
    assert_eq!(empty.body, json!({"message": "No tasks available"}));
    assert!(started.elapsed() < WAIT, "the sample's claim did not wait");
    let too_long = stack
        .tasks
        .post(
            "/api/tasks/next",
            &json!({"processor": "p", "wait_ms": 30_001}),
        )
        .await;
    assert_eq!((too_long.status, too_long.code()), (400, "invalid_wait"));
}

/// A lease-service whose waiters look again on their own only after [`RECHECK_MS`].
async fn lease_service() -> Service {
    let db = fresh_database().await;
    Service::lease_service(&db, &[("WAIT_RECHECK_MS", RECHECK_MS)]).await
}

/// Waits until lease-service holds `n` waiting acquires.
async fn until_acquires_waiting(leases: &Service, n: f64) {
    eventually(Duration::from_secs(10), "acquires waiting", || async {
        metric_sum(&leases.metrics().await, "lease_acquires_waiting") >= n
    })
    .await;
}

/// An acquire of `resource` by `holder`, waiting up to [`WAIT`], in the background.
fn waiting_acquire(
    leases: &Service,
    resource: &str,
    holder: &str,
) -> tokio::task::JoinHandle<Result<leasehold::api::Lease, leasehold::LeaseError>> {
    let client = leases.lease_client();
    let (resource, holder) = (resource.to_owned(), holder.to_owned());
    tokio::spawn(async move {
        client
            .acquire_waiting(&resource, &holder, None, None, WAIT)
            .await
            .map(|(lease, _)| lease)
    })
}

#[tokio::test]
async fn waiting_acquires_get_a_released_lease_in_arrival_order() {
    let leases = lease_service().await;
    let client = leases.lease_client();
    let held = client.acquire("lock", "first", None).await.unwrap();
    let second = waiting_acquire(&leases, "lock", "second");
    until_acquires_waiting(&leases, 1.0).await;
    let third = waiting_acquire(&leases, "lock", "third");
    until_acquires_waiting(&leases, 2.0).await;

    // The lease lasts 30 s and each waiter looks again on its own only after 10 minutes: a
    // waiter that gets it within WOKEN_WITHIN was woken by the release.
    client.release("lock", "first", held.proof()).await.unwrap();
    let got = tokio::time::timeout(WOKEN_WITHIN, second)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(got.holder, "second", "the oldest waiter first");
    assert!(got.fence > held.fence);
    assert!(!third.is_finished(), "the younger waiter waits on");
    client.release("lock", "second", got.proof()).await.unwrap();
    let last = tokio::time::timeout(WOKEN_WITHIN, third)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(last.holder, "third");
    assert!(last.fence > got.fence);
}

#[tokio::test]
async fn a_waiting_acquire_gets_a_lease_that_expires_and_a_wait_too_long_is_refused() {
    let leases = lease_service().await;
    let client = leases.lease_client();
    let held = client
        .acquire("expiring", "gone", Some(Duration::from_secs(2)))
        .await
        .unwrap();
    // Nobody releases: the waiter tries again when the lease runs out, as the refusal said.
    let waiter = waiting_acquire(&leases, "expiring", "next");
    let got = tokio::time::timeout(WOKEN_WITHIN, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(got.holder, "next");
    assert!(got.fence > held.fence);

    let too_long = leases
        .post(
            "/api/leases",
            &json!({"resource": "x", "holder": "h", "wait_ms": 30_001}),
        )
        .await;
    assert_eq!((too_long.status, too_long.code()), (400, "invalid_wait"));
    assert!(
        client.current("x").await.unwrap().is_none(),
        "nothing written"
    );
}

/// At most `LEASE_MAX_WAITERS` acquires wait on a replica at once: one more answers at once, as
/// without `wait_ms` (409 `lease_held`), and is counted; a place freed by a waiter that got its
/// lease is taken by the next to ask.
#[tokio::test]
async fn past_the_bound_on_waiters_an_acquire_answers_at_once() {
    let db = fresh_database().await;
    let leases = Service::lease_service(
        &db,
        &[("WAIT_RECHECK_MS", RECHECK_MS), ("LEASE_MAX_WAITERS", "5")],
    )
    .await;
    let client = leases.lease_client();
    let held = client.acquire("lock", "first", None).await.unwrap();
    // One at a time, so that they are in line in this order.
    let mut waiters = Vec::new();
    for i in 0..5 {
        waiters.push(waiting_acquire(&leases, "lock", &format!("waiter-{i}")));
        until_acquires_waiting(&leases, f64::from(i + 1)).await;
    }

    // The sixth, with the same wait as the five that asked before it, is answered while they
    // all still wait: it did not wait.
    let sixth = client
        .acquire_waiting("lock", "sixth", None, None, WAIT)
        .await
        .unwrap_err();
    assert!(
        matches!(&sixth, leasehold::LeaseError::Held { holder, .. } if holder == "first"),
        "{sixth:?}"
    );
    assert!(waiters.iter().all(|w| !w.is_finished()));
    let metrics = leases.metrics().await;
    assert_eq!(
        metric_sum(&metrics, "lease_acquire_waits_refused_total"),
        1.0
    );
    assert_eq!(metric_sum(&metrics, "lease_acquires_waiting"), 5.0);

    // One waiter gets the released lease and leaves: its place is free for the next.
    client.release("lock", "first", held.proof()).await.unwrap();
    let got = waiters.remove(0).await.unwrap().unwrap();
    assert_eq!(got.holder, "waiter-0");
    waiters.push(waiting_acquire(&leases, "lock", "seventh"));
    until_acquires_waiting(&leases, 5.0).await;
    assert_eq!(
        metric_sum(&leases.metrics().await, "lease_acquire_waits_refused_total"),
        1.0
    );
    assert!(waiters.iter().all(|w| !w.is_finished()));
}

/// The resident memory of process `pid`, in KiB.
fn resident_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap()
}

/// A thousand waiting acquires grow lease-service by tens of MB (their connections, buffers
/// and places in line); once they have all gone, what they freed goes back to the system. It
/// all stayed with the process before (glibc keeps what was freed, until `malloc_trim`); now
/// about 40% goes back here, the rest being reused by the next burst rather than added to.
#[tokio::test(flavor = "multi_thread")]
async fn the_memory_a_burst_of_waiters_took_is_given_back_once_they_are_gone() {
    const WAITERS: usize = 1000;
    let db = fresh_database().await;
    let leases = Service::lease_service(&db, &[("WAIT_RECHECK_MS", RECHECK_MS)]).await;
    // Each waiter waits for a resource of its own, so that one release lets each go.
    let resources: Vec<String> = (0..WAITERS).map(|i| format!("r{i}")).collect();
    let mut held = Vec::new();
    for chunk in resources.chunks(leasehold::api::MAX_BATCH_RESOURCES) {
        let body = json!({"resources": chunk, "holder": "first", "ttl_seconds": 600});
        let acquired = leases.post("/api/leases/batch", &body).await;
        assert_eq!(acquired.status, 200, "{:?}", acquired.body);
        held.extend(acquired.body["acquired"].as_array().unwrap().clone());
    }
    assert_eq!(held.len(), WAITERS);
    let before = resident_kib(leases.pid_u32());
    let waiters: Vec<_> = resources
        .iter()
        .map(|resource| waiting_acquire(&leases, resource, "second"))
        .collect();
    until_acquires_waiting(&leases, WAITERS as f64).await;
    let peak = resident_kib(leases.pid_u32());
    assert!(
        peak > before + 10 * 1024,
        "{WAITERS} waiters took only {} KiB",
        peak - before
    );

    for chunk in held.chunks(leasehold::api::MAX_BATCH_RESOURCES) {
        let releases: Vec<_> = chunk
            .iter()
            .map(|lease| json!({"resource": lease["resource"], "holder": "first"}))
            .collect();
        let released = leases
            .post("/api/leases/batch/release", &json!({"leases": releases}))
            .await;
        assert_eq!(released.status, 200, "{:?}", released.body);
    }
    for waiter in waiters {
        assert_eq!(waiter.await.unwrap().unwrap().holder, "second");
    }
    let grew = peak - before;
    eventually(
        Duration::from_secs(30),
        "lease-service to give back at least a quarter of what the waiters took",
        || async { resident_kib(leases.pid_u32()) < peak - grew / 4 },
    )
    .await;
}
