//! The task generator: several replicas, exactly one producing, through crashes, pauses and
//! graceful hand-overs; and a status that every task-service replica tells the same.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use leasehold::generator::{GeneratorStatus, StartGenerator};
use leasehold::task_client::{Created, TaskListing};
use leasehold::tasks::CreateTask;
use leasehold::{CallError, TaskClient};
use serde_json::json;
use tests::{Service, create_new, eventually, fresh_database, refusal};

const TTL: &str = "2";
const RETRY: &str = "0.5";

struct Stack {
    /// With a second task-service replica on the same database, spoken to through
    /// `other_client`.
    stack: tests::Stack,
    /// Typed clients of the two replicas.
    client: TaskClient,
    other_client: TaskClient,
}

impl std::ops::Deref for Stack {
    type Target = tests::Stack;
    fn deref(&self) -> &tests::Stack {
        &self.stack
    }
}

async fn stack() -> Stack {
    let stack = tests::Stack::with().replicas(1).start().await;
    Stack {
        client: stack.tasks.task_client(),
        other_client: stack.replicas[0].task_client(),
        stack,
    }
}

impl Stack {
    async fn generator(&self, id: &str) -> Service {
        Service::generator(
            &self.tasks.base_url(),
            &self.leases.base_url(),
            id,
            &[
                ("GENERATOR_LEASE_TTL_SECONDS", TTL),
                ("GENERATOR_RETRY_INTERVAL_SECONDS", RETRY),
                ("GENERATOR_SETTINGS_POLL_MS", "200"),
            ],
        )
        .await
    }

    async fn start(&self, rate: f64) {
        let settings = StartGenerator {
            rate_per_second: Some(rate),
            min_sleep_seconds: Some(0.0),
            max_sleep_seconds: Some(2.0),
        };
        let status = self.client.start_generator(&settings).await.unwrap();
        assert!(status.is_running, "{status:?}");
    }

    async fn status(&self) -> GeneratorStatus {
        self.client.generator_status().await.unwrap()
    }

    async fn leader(&self) -> Option<String> {
        let status = self.client.generator_status().await.ok()?;
        Some(status.leader?.holder)
    }

    /// Every task with its generator, fence, sequence and creation time, in id order.
    async fn produced(&self) -> Vec<Produced> {
        let mut all = Vec::new();
        let mut listing = TaskListing {
            limit: Some(1000),
            ..TaskListing::default()
        };
        loop {
            let page = self.client.list(&listing).await.unwrap();
            for task in page.tasks {
                let generator = &task.task_data["generator"];
                all.push(Produced {
                    holder: generator["holder"].as_str().unwrap().to_owned(),
                    fence: generator["fence"].as_i64().unwrap(),
                    term: generator["term"].as_str().unwrap().to_owned(),
                    sequence: generator["sequence"].as_u64().unwrap(),
                    key: task.idempotency_key.unwrap(),
                    at: task.created_at,
                });
            }
            match page.next_cursor {
                Some(next) => listing.cursor = Some(next),
                None => return all,
            }
        }
    }
}

#[derive(Debug, Clone)]
struct Produced {
    holder: String,
    fence: i64,
    term: String,
    sequence: u64,
    key: String,
    at: DateTime<Utc>,
}

/// The invariant: one holder per fence, no key twice, and the fences' production intervals
/// never overlap (nobody produced while another held the lease).
fn check_one_producer_at_a_time(
    tasks: &[Produced],
) -> Vec<(i64, String, DateTime<Utc>, DateTime<Utc>)> {
    let keys: HashSet<&str> = tasks.iter().map(|t| t.key.as_str()).collect();
    assert_eq!(keys.len(), tasks.len(), "an idempotency key was used twice");
    let triples: HashSet<(i64, &str, u64)> = tasks
        .iter()
        .map(|t| (t.fence, t.term.as_str(), t.sequence))
        .collect();
    assert_eq!(
        triples.len(),
        tasks.len(),
        "a (fence, term, sequence) was produced twice"
    );
    let mut terms: BTreeMap<i64, (String, DateTime<Utc>, DateTime<Utc>)> = BTreeMap::new();
    for task in tasks {
        let term = terms
            .entry(task.fence)
            .or_insert_with(|| (task.holder.clone(), task.at, task.at));
        assert_eq!(
            term.0, task.holder,
            "fence {} used by two holders",
            task.fence
        );
        term.1 = term.1.min(task.at);
        term.2 = term.2.max(task.at);
    }
    let terms: Vec<_> = terms
        .into_iter()
        .map(|(fence, (holder, from, to))| (fence, holder, from, to))
        .collect();
    for pair in terms.windows(2) {
        assert!(
            pair[1].2 > pair[0].3,
            "terms overlap: fence {} ({}) until {}, fence {} ({}) from {}",
            pair[0].0,
            pair[0].1,
            pair[0].3,
            pair[1].0,
            pair[1].1,
            pair[1].2
        );
    }
    terms
}

fn produced_metric(text: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with("generator_tasks_produced_total "))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn of_three_replicas_exactly_one_produces_through_a_crash_of_the_leader() {
    let s = stack().await;
    let mut replicas: HashMap<String, Service> = HashMap::new();
    for id in ["gen-a", "gen-b", "gen-c"] {
        replicas.insert(id.to_owned(), s.generator(id).await);
    }
    s.start(10.0).await;
    let run_started = Instant::now();
    tokio::time::sleep(Duration::from_secs(12)).await;

    let leader = s.leader().await.expect("a leader");
    let before = s.produced().await.len();
    replicas.get_mut(&leader).unwrap().kill();
    let killed = Utc::now();
    let takeover = Instant::now();
    eventually(
        Duration::from_secs(10),
        "production under a new leader",
        || async {
            s.produced().await.len() > before && s.leader().await.is_some_and(|l| l != leader)
        },
    )
    .await;
    let gap = takeover.elapsed();
    // TTL + one retry interval (+20 % jitter), plus room for the request itself.
    assert!(
        gap < Duration::from_millis(2000 + 600 + 1000),
        "takeover took {gap:?}"
    );
    tokio::time::sleep(Duration::from_secs(30).saturating_sub(run_started.elapsed())).await;
    let stop = s.other_client.stop_generator().await.unwrap();
    assert!(!stop.is_running, "{stop:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;

    let tasks = s.produced().await;
    assert!(tasks.len() > 250, "{} tasks in 30 s at 10/s", tasks.len());
    let terms = check_one_producer_at_a_time(&tasks);
    assert!(terms.len() >= 2, "{terms:?}");
    // A create the leader sent just before the kill may still be stored just after it, under
    // its live lease; nothing of it may be stored once its successor has produced.
    let successor_began = tasks
        .iter()
        .filter(|t| t.holder != leader && t.at > killed)
        .map(|t| t.at)
        .min()
        .expect("the successor produced");
    assert!(
        tasks
            .iter()
            .all(|t| t.holder != leader || t.at < successor_began),
        "the killed leader produced after its successor began"
    );
    let mut total = 0;
    for replica in replicas.values().filter(|r| r.name == "task-generator") {
        if let Ok(answer) = reqwest::get(replica.url("/metrics")).await {
            total += produced_metric(&answer.text().await.unwrap());
        }
    }
    let by_killed = tasks.iter().filter(|t| t.holder == leader).count() as u64;
    assert_eq!(
        total + by_killed,
        tasks.len() as u64,
        "replicas' counts add up to the tasks"
    );
    assert_eq!(s.status().await.produced, tasks.len() as i64);
}

#[tokio::test]
async fn sigterm_hands_leadership_over_within_a_second_or_two() {
    let s = stack().await;
    let mut first = s.generator("first").await;
    let _second = s.generator("second").await;
    s.start(20.0).await;
    eventually(
        Duration::from_secs(10),
        "first leads and produces",
        || async { s.leader().await.as_deref() == Some("first") && !s.produced().await.is_empty() },
    )
    .await;
    let stopping = Instant::now();
    assert_eq!(first.terminate(Duration::from_secs(10)).await, Some(0));
    let before = s.produced().await.len();
    eventually(Duration::from_secs(3), "second producing", || async {
        s.produced()
            .await
            .iter()
            .skip(before)
            .any(|t| t.holder == "second")
    })
    .await;
    assert!(
        stopping.elapsed() < Duration::from_millis(2500),
        "{:?}",
        stopping.elapsed()
    );
    check_one_producer_at_a_time(&s.produced().await);
}

#[tokio::test]
async fn a_paused_leader_produces_nothing_after_it_wakes() {
    let s = stack().await;
    let sleeper = s.generator("sleeper").await;
    s.start(20.0).await;
    eventually(Duration::from_secs(10), "sleeper leads", || async {
        s.leader().await.as_deref() == Some("sleeper") && !s.produced().await.is_empty()
    })
    .await;
    let _standby = s.generator("standby").await;
    sleeper.pause();
    let paused = Utc::now();
    eventually(Duration::from_secs(10), "standby takes over", || async {
        s.produced().await.iter().any(|t| t.holder == "standby")
    })
    .await;
    sleeper.resume();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let tasks = s.produced().await;
    check_one_producer_at_a_time(&tasks);
    // A create in flight at the pause may be stored just after it, under the live lease;
    // nothing of the sleeper's may be stored once the standby has produced.
    let standby_began = tasks
        .iter()
        .filter(|t| t.holder == "standby" && t.at > paused)
        .map(|t| t.at)
        .min()
        .expect("the standby produced");
    let late: Vec<_> = tasks
        .iter()
        .filter(|t| t.holder == "sleeper" && t.at > standby_began)
        .collect();
    assert!(
        late.is_empty(),
        "the paused leader produced after waking: {late:?}"
    );
    let metrics = sleeper.metrics().await;
    assert!(metrics.contains("generator_leader 0"), "{metrics}");
    assert!(
        metrics.contains("generator_lease_losses_total 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn status_is_the_same_through_every_replica_and_start_stop_work_through_either() {
    let s = stack().await;
    // Both replicas' answers, without the leader's time left (it passes between the two).
    let both = || async {
        let comparable = |status: Result<GeneratorStatus, CallError>| {
            let mut status = status.unwrap();
            if let Some(leader) = status.leader.as_mut() {
                leader.expires_in_ms = 0;
            }
            status
        };
        (
            comparable(s.client.generator_status().await),
            comparable(s.other_client.generator_status().await),
        )
    };
    let (a, b) = both().await;
    assert_eq!(a, b);
    assert_eq!(a.status, "STOPPED");
    assert!(a.leader.is_none());

    let mut first = s.generator("first").await;
    let _second = s.generator("second").await;
    // Started through one replica, seen through both.
    let five = StartGenerator {
        rate_per_second: Some(5.0),
        ..StartGenerator::default()
    };
    let started = s.other_client.start_generator(&five).await.unwrap();
    assert!(started.is_running, "{started:?}");
    eventually(Duration::from_secs(10), "production", || async {
        !s.produced().await.is_empty()
    })
    .await;
    let (a, b) = both().await;
    assert_eq!(a.leader, b.leader);
    assert_eq!((a.status.as_str(), a.producing), ("STARTED", true));
    assert_eq!(a.settings.rate_per_second, 5.0);

    // After a takeover, both still agree, on the new leader.
    let old = a.leader.unwrap().holder;
    if old == "first" {
        first.kill();
    } else {
        let _ = s.client.stop_generator().await;
    }
    if old == "first" {
        eventually(Duration::from_secs(10), "second leads", || async {
            s.leader().await.as_deref() == Some("second")
        })
        .await;
        let (a, b) = both().await;
        assert_eq!(a.leader, b.leader);
        assert_eq!(a.leader.unwrap().holder, "second");
    }

    // Stopped through the other replica: production stops, though the leader keeps its lease.
    let stopped = s.other_client.stop_generator().await.unwrap();
    assert_eq!(stopped.status, "STOPPED");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let count = s.produced().await.len();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        s.produced().await.len(),
        count,
        "nothing produced while stopped"
    );
    let status = s.status().await;
    assert_eq!(
        (status.status.as_str(), status.producing),
        ("STOPPED", false)
    );
    assert!(
        status.leader.is_some(),
        "a stopped generator keeps its lease"
    );

    // Bad settings are refused and change nothing (sent raw: they are bad input on the wire).
    let before = s.client.generator_settings().await.unwrap();
    for body in [
        json!({"rate_per_second": 0}),
        json!({"min_sleep_seconds": 5, "max_sleep_seconds": 1}),
    ] {
        let answer = s.tasks.post("/api/generator/start", &body).await;
        assert_eq!((answer.status, answer.code()), (400, "invalid_field"));
    }
    let bad = s
        .tasks
        .raw(
            "POST",
            "/api/generator/start",
            Some("application/json"),
            "{oops",
        )
        .await;
    assert_eq!((bad.status, bad.code()), (400, "malformed_json"));
    assert_eq!(s.client.generator_settings().await.unwrap(), before);
}

/// A generator's task under `fence`, keyed `task-generator:<fence>:<term>:<seq>`, as
/// task-generator sends them.
fn generated_task(fence: i64, seq: u32) -> CreateTask {
    CreateTask {
        task_data: json!({"sleep_duration_seconds": 0}),
        idempotency_key: Some(format!("task-generator:{fence}:1:{seq}")),
        generator_fence: Some(fence),
        ..CreateTask::default()
    }
}

/// Creates `task` and returns the refusal, which it asserts there was.
async fn create_refused(tasks: &TaskClient, task: &CreateTask) -> CallError {
    match tasks.create(task).await {
        Err(err) => err,
        Ok(created) => panic!("expected a refusal, got {created:?}"),
    }
}

#[tokio::test]
async fn task_service_stores_a_generators_task_only_under_a_live_current_fence() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let service = Service::task_service(&task_db, &leases.base_url(), &[]).await;
    let tasks = service.task_client();
    let started = tasks.start_generator(&StartGenerator::default()).await;
    assert!(started.unwrap().is_running);
    let take = |holder: &'static str| {
        let leases = &leases;
        async move { take_lease(leases, holder, 5).await }
    };

    let old = take("g1").await;
    create_new(&tasks, &generated_task(old, 1)).await;
    // g1's lease ends; g2 takes over with a higher fence.
    tests::execute(
        &lease_db,
        "UPDATE leases SET expires_at = now() - interval '1 second'",
    )
    .await;
    let new = take("g2").await;
    assert!(new > old);
    let before = tests::snapshot(&task_db, "tasks").await;
    let stale = create_refused(&tasks, &generated_task(old, 2)).await;
    assert_eq!(refusal(&stale), (409, "stale_generator"), "{stale}");
    assert_eq!(
        tests::snapshot(&task_db, "tasks").await,
        before,
        "nothing stored"
    );
    create_new(&tasks, &generated_task(new, 1)).await;

    // The current fence, but expired: refused too.
    tests::execute(
        &lease_db,
        "UPDATE leases SET expires_at = now() - interval '1 second'",
    )
    .await;
    let expired = create_refused(&tasks, &generated_task(new, 2)).await;
    assert_eq!(refusal(&expired), (409, "stale_generator"), "{expired}");

    // A lease with less time left than the insert's safety margin: the check passes, but the
    // insert's deadline on the database's clock has already gone, so nothing is stored.
    let mut ran_out = false;
    for seq in 3..40 {
        tests::execute(
            &lease_db,
            "UPDATE leases SET expires_at = clock_timestamp() + interval '45 milliseconds'",
        )
        .await;
        let late = create_refused(&tasks, &generated_task(new, seq)).await;
        assert_eq!(refusal(&late), (409, "stale_generator"), "{late}");
        if matches!(&late, CallError::Refused { error, .. } if error.contains("ran out")) {
            ran_out = true;
            break;
        }
    }
    assert!(ran_out, "the check never passed with a lease about to end");
    let kept: Vec<String> = tests::snapshot(&task_db, "tasks").await;
    assert_eq!(
        kept.len(),
        2,
        "only the two tasks made under live fences: {kept:?}"
    );
}

/// Takes the generator's lease by hand for `ttl_seconds`, as a replica would, and asserts it
/// is a new lease (201); its fence.
async fn take_lease(leases: &Service, holder: &str, ttl_seconds: u64) -> i64 {
    let ttl = Some(Duration::from_secs(ttl_seconds));
    let (lease, new) = leases
        .lease_client()
        .acquire_proving("task-generator", holder, ttl, None)
        .await
        .unwrap();
    assert!(new, "{lease:?}");
    lease.fence
}

/// Takes the generator's lease by hand, as a replica would; its fence.
async fn take_generator_lease(leases: &Service, holder: &str) -> i64 {
    take_lease(leases, holder, 60).await
}

#[tokio::test]
async fn once_stop_is_answered_no_generator_task_is_stored() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let service = Service::task_service(&task_db, &leases.base_url(), &[]).await;
    let tasks = service.task_client();
    let fence = take_generator_lease(&leases, "g1").await;
    // Stopped (as it starts out): refused.
    let refused = create_refused(&tasks, &generated_task(fence, 0)).await;
    assert_eq!(refusal(&refused), (409, "generator_stopped"));

    let start = StartGenerator::default();
    assert!(tasks.start_generator(&start).await.unwrap().is_running);
    let created = create_new(&tasks, &generated_task(fence, 1)).await;
    let stopped = tasks.stop_generator().await.unwrap();
    assert_eq!((stopped.status.as_str(), stopped.produced), ("STOPPED", 1));
    let before = tests::snapshot(&task_db, "tasks").await;
    let late = create_refused(&tasks, &generated_task(fence, 2)).await;
    assert_eq!(refusal(&late), (409, "generator_stopped"), "{late}");
    assert_eq!(
        tests::snapshot(&task_db, "tasks").await,
        before,
        "nothing stored"
    );
    // A retry of a task stored before the stop still gets its task.
    // (200: the task stored before, not a new one.)
    let repeat = tasks.create(&generated_task(fence, 1)).await.unwrap();
    assert!(
        matches!(&repeat, Created::Existing(task) if task.id == created.id),
        "{repeat:?}"
    );
    assert_eq!(tasks.generator_status().await.unwrap().produced, 1);

    assert!(tasks.start_generator(&start).await.unwrap().is_running);
    create_new(&tasks, &generated_task(fence, 2)).await;
}

#[tokio::test]
async fn a_producing_generator_stores_nothing_after_stop_is_answered() {
    let s = stack().await;
    let _generator = s.generator("fast").await;
    s.start(100.0).await;
    eventually(Duration::from_secs(10), "production", || async {
        s.produced().await.len() >= 20
    })
    .await;
    let stopped = s.client.stop_generator().await.unwrap();
    let produced = u64::try_from(stopped.produced).unwrap();
    // The leader reads the settings every 200 ms, and at 100/s it sends creates meanwhile:
    // give it time to send some after the stop.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        u64::try_from(s.status().await.produced).ok(),
        Some(produced)
    );
    assert_eq!(s.produced().await.len() as u64, produced);
    // It kept its lease, and produces again when started.
    assert_eq!(s.leader().await.as_deref(), Some("fast"));
    s.start(100.0).await;
    eventually(Duration::from_secs(10), "production again", || async {
        s.produced().await.len() as u64 > produced
    })
    .await;
}

#[tokio::test]
async fn settings_out_of_bounds_are_refused_and_the_generator_survives_the_bounds() {
    let s = stack().await;
    let generator = s.generator("slow").await;
    // The refusals are sent raw: they are bad input on the wire.
    let before = s.client.generator_settings().await.unwrap();
    for body in [
        json!({"rate_per_second": 1e-300}),
        json!({"rate_per_second": 0.0009}),
        json!({"rate_per_second": 1000.5}),
        json!({"rate_per_second": -1}),
        json!({"min_sleep_seconds": -1}),
        json!({"min_sleep_seconds": 0, "max_sleep_seconds": 3601}),
        json!({"min_sleep_seconds": 1e300, "max_sleep_seconds": 1e300}),
    ] {
        let answer = s.tasks.post("/api/generator/start", &body).await;
        assert_eq!(
            (answer.status, answer.code()),
            (400, "invalid_field"),
            "{body}: {:?}",
            answer.body
        );
    }
    assert_eq!(s.client.generator_settings().await.unwrap(), before);

    // The slowest rate and the longest sleep are accepted, and the leader lives with them.
    let slowest = StartGenerator {
        rate_per_second: Some(0.001),
        min_sleep_seconds: Some(3600.0),
        max_sleep_seconds: Some(3600.0),
    };
    let answer = s.client.start_generator(&slowest).await.unwrap();
    assert!(answer.is_running, "{answer:?}");
    eventually(Duration::from_secs(10), "one task", || async {
        !s.produced().await.is_empty()
    })
    .await;
    let page = s.client.list(&TaskListing::default()).await.unwrap();
    assert_eq!(page.tasks[0].task_data["sleep_duration_seconds"], 3600.0);
    let healthy = reqwest::get(generator.url("/healthz")).await.unwrap();
    assert!(healthy.status().is_success());
    assert_eq!(s.leader().await.as_deref(), Some("slow"));
}

#[tokio::test]
async fn the_leader_is_seen_however_many_leases_share_its_prefix() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let service = Service::task_service(&task_db, &leases.base_url(), &[]).await;
    let tasks = service.task_client();
    // More than a page of leases whose names start with the generator's, all older than its.
    let crowd = leases.lease_client();
    let holders = vec!["crowd".to_owned(); 100];
    for batch in 0..11 {
        let resources: Vec<String> = (0..100)
            .map(|i| format!("task-generator-crowd-{batch}-{i}"))
            .collect();
        let answer = crowd
            .acquire_each(&resources, &holders, Some(Duration::from_secs(300)))
            .await
            .unwrap();
        assert_eq!(answer.acquired.len(), 100, "{answer:?}");
    }
    let fence = take_generator_lease(&leases, "g1").await;
    let status = tasks.generator_status().await.unwrap();
    assert_eq!(
        status.leader.as_ref().map(|l| l.holder.as_str()),
        Some("g1"),
        "{status:?}"
    );
    let start = StartGenerator::default();
    assert!(tasks.start_generator(&start).await.unwrap().is_running);
    create_new(&tasks, &generated_task(fence, 1)).await;
}

#[tokio::test]
async fn a_start_changes_nothing_but_a_stop_works_when_lease_service_cannot_answer() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let mut leases = Service::lease_service(&lease_db, &[]).await;
    let tasks = Service::task_service(&task_db, &leases.base_url(), &[]).await;
    leases.kill();
    let before = tests::snapshot(&task_db, "generator_settings").await;
    // Raw: the typed client reports a 503 as transient, without its code.
    let start = tasks
        .post("/api/generator/start", &json!({"rate_per_second": 7}))
        .await;
    assert_eq!(
        (start.status, start.code()),
        (503, "unavailable"),
        "{:?}",
        start.body
    );
    assert_eq!(
        tests::snapshot(&task_db, "generator_settings").await,
        before,
        "a 503 start stored nothing"
    );

    // Started, with a leader; then lease-service goes down and an operator stops the generator.
    leases.start_again().await;
    let client = tasks.task_client();
    let started = client.start_generator(&StartGenerator::default()).await;
    assert!(started.unwrap().is_running);
    let fence = take_generator_lease(&leases, "g1").await;
    leases.kill();
    let stop = client.stop_generator().await.unwrap();
    assert_eq!(
        (stop.status.as_str(), stop.settings.running, &stop.leader),
        ("STOPPED", false, &None),
        "{stop:?}"
    );
    assert!(
        stop.message.contains("leader is unknown") && stop.message.contains("lease-service"),
        "{}",
        stop.message
    );
    assert!(!client.generator_settings().await.unwrap().running);
    // The leader, its lease still live once lease-service is back, produces nothing.
    leases.start_again().await;
    let refused = create_refused(&client, &generated_task(fence, 1)).await;
    assert_eq!(refusal(&refused), (409, "generator_stopped"), "{refused}");
}
