//! One lease per claimant: a worker process that names its liveness lease (`worker:<id>`) in
//! its claims gets tasks covered by that lease, and no lease is taken per task. Each task still
//! has a fence of its own that rises with every claim; once the process's lease lapses, is taken
//! anew or is revoked, every task it covers is refused to the process (409) and can be claimed
//! again, while cancelling one task still stops only that task. A task stays its process's only
//! while its heartbeats go on too.
#![allow(clippy::unwrap_used)]

use serde_json::{Value, json};
use tests::{execute, query, snapshot};

tests::stack_with_helpers!(Stack);

async fn stack() -> Stack {
    Stack(tests::Stack::start(&[]).await)
}

const SECRET: &str = "0123456789abcdef0123456789abcdef";

impl Stack {
    /// A worker process's beat under `id` (run `instance`), with `ttl_seconds`; the fence of its
    /// liveness lease.
    async fn beat(&self, id: &str, instance: &str, ttl_seconds: i64, fence: Option<i64>) -> i64 {
        let mut body = json!({
            "instance": instance,
            "info": {"host": "h", "version": "v", "concurrency": 8, "busy": 0, "done": 0},
            "ttl_seconds": ttl_seconds,
            "secret": SECRET,
        });
        if let Some(fence) = fence {
            body["fence"] = json!(fence);
        }
        let answer = self.tasks.put(&format!("/api/workers/{id}"), &body).await;
        assert_eq!(answer.status, 200, "{:?}", answer.body);
        answer.body["fence"].as_i64().unwrap()
    }

    async fn create(&self, n: usize) -> Vec<i64> {
        let items: Vec<Value> = (0..n).map(|i| json!({"task_data": {"n": i}})).collect();
        let answer = self
            .tasks
            .post("/api/tasks/batch", &json!({ "tasks": items }))
            .await;
        assert_eq!(answer.status, 200, "{:?}", answer.body);
        answer.body["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["task"]["id"].as_i64().unwrap())
            .collect()
    }

    /// Claims up to `limit` tasks as `processor`, covered by `worker` (id, fence) when given.
    async fn claim(&self, processor: &str, limit: i64, worker: Option<(&str, i64)>) -> Vec<Value> {
        let mut body = json!({"processor": processor, "limit": limit});
        if let Some((id, fence)) = worker {
            body["worker"] = json!({"id": id, "fence": fence});
        }
        let answer = self.tasks.post("/api/tasks/next", &body).await;
        if answer.status == 200 {
            // The sample's answer when nothing is due.
            assert_eq!(answer.body["message"], "No tasks available");
            return Vec::new();
        }
        assert_eq!(answer.status, 202, "{:?}", answer.body);
        answer.body.as_array().unwrap().clone()
    }

    async fn act(&self, task: &Value, processor: &str, what: &str) -> tests::Answer {
        let id = &task["id"];
        let mut body = json!({"processor": processor, "fence": task["fence"]});
        match what {
            "complete" => body["task_output"] = json!({}),
            "fail" => body["error"] = json!("boom"),
            "snooze" => body["seconds"] = json!(60),
            _ => {}
        }
        self.tasks
            .put(&format!("/api/tasks/{id}/{what}"), &body)
            .await
    }

    /// Completes `tasks` as `processor` in one request that carries the worker's next claim
    /// (`next.worker`), as the bundled worker does; the answer's per-task `results`.
    async fn carry(&self, tasks: &[&Value], processor: &str, worker: (&str, i64)) -> Value {
        let items: Vec<Value> = tasks
            .iter()
            .map(|task| json!({"id": task["id"], "fence": task["fence"], "task_output": {}}))
            .collect();
        let body = json!({
            "processor": processor,
            "tasks": items,
            "next": {"worker": {"id": worker.0, "fence": worker.1}},
        });
        let answer = self.tasks.put("/api/tasks/complete", &body).await;
        assert_eq!(answer.status, 200, "{:?}", answer.body);
        assert!(answer.body["claimed"].is_array(), "{:?}", answer.body);
        answer.body["results"].clone()
    }

    async fn status(&self, task: &Value) -> String {
        query(
            &self.task_db,
            &format!("SELECT status FROM tasks WHERE id = {}", task["id"]),
        )
        .await[0]["status"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// The leases lease-service holds on tasks' own resources.
    async fn task_leases(&self) -> usize {
        query(
            &self.lease_db,
            "SELECT count(*) AS n FROM leases WHERE resource LIKE 'task:%'",
        )
        .await[0]["n"]
            .as_i64()
            .unwrap() as usize
    }

    /// Makes every running task look lapsed to the next claim (its recorded expiry passed),
    /// as if its hint ran out: only lease-service's answer then decides.
    async fn hints_run_out(&self) {
        execute(
            &self.task_db,
            "UPDATE tasks SET must_heartbeat_before = now() - interval '1 second'
             WHERE status = 'running'",
        )
        .await;
    }
}

#[tokio::test]
async fn tasks_claimed_under_a_worker_lease_take_no_lease_of_their_own() {
    let s = stack().await;
    let fence = s.beat("w1", "run-1", 60, None).await;
    s.create(4).await;
    let lease_writes = snapshot(&s.lease_db, "lease_events").await.len();

    let claimed = s.claim("w1", 4, Some(("w1", fence))).await;
    assert_eq!(claimed.len(), 4);
    for task in &claimed {
        assert_eq!(task["fence"], 1, "a first claim: {task}");
    }
    // One of them heartbeats, then all complete, two in one request.
    let beat = s.act(&claimed[0], "w1", "heartbeat").await;
    assert_eq!(beat.status, 202, "{:?}", beat.body);
    assert!(
        beat.body["leaseTtlMs"].as_u64().unwrap() > 0,
        "{:?}",
        beat.body
    );
    for task in &claimed[..2] {
        let done = s.act(task, "w1", "complete").await;
        assert_eq!(done.status, 202, "{:?}", done.body);
    }
    let batch: Vec<Value> = claimed[2..]
        .iter()
        .map(|t| json!({"id": t["id"], "fence": t["fence"], "task_output": {}}))
        .collect();
    let done = s
        .tasks
        .put(
            "/api/tasks/complete",
            &json!({"processor": "w1", "tasks": batch}),
        )
        .await;
    assert_eq!(done.status, 200, "{:?}", done.body);
    for result in done.body["results"].as_array().unwrap() {
        assert_eq!(result["status"], 202, "{result}");
    }

    // lease-service wrote nothing for the tasks: no lease, no lease event.
    assert_eq!(s.task_leases().await, 0);
    assert_eq!(
        snapshot(&s.lease_db, "lease_events").await.len(),
        lease_writes,
        "a claim, heartbeat or completion under a worker lease wrote to lease-service"
    );
    // The history names the lease of the claim's group: one row for the four.
    let claims = query(
        &s.task_db,
        "SELECT claimant_leases[1] AS lease_resource, cardinality(task_ids) AS n,
                lease_fences[1] AS lease_fence
         FROM task_events WHERE to_status = 'running'",
    )
    .await;
    assert_eq!(
        claims,
        vec![json!({"lease_resource": "worker:w1", "n": 4, "lease_fence": fence})]
    );
}

#[tokio::test]
async fn revoking_a_worker_lease_fences_every_task_it_covers() {
    let s = stack().await;
    let fence = s.beat("w1", "run-1", 60, None).await;
    s.create(3).await;
    let claimed = s.claim("w1", 3, Some(("w1", fence))).await;
    tests::revoke_worker_lease(&s.leases, "w1").await;
    for (task, what) in claimed.iter().zip(["heartbeat", "complete", "fail"]) {
        let refused = s.act(task, "w1", what).await;
        assert_eq!(
            (refused.status, refused.code()),
            (409, "lease_revoked"),
            "{what}: {:?}",
            refused.body
        );
    }
    // Once their hints run out, another worker takes them over, each under a higher fence.
    s.hints_run_out().await;
    let other = s.claim("w2", 3, None).await;
    assert_eq!(other.len(), 3, "{other:?}");
    for task in &other {
        assert_eq!(task["fence"], 2, "{task}");
        let done = s.act(task, "w2", "complete").await;
        assert_eq!(done.status, 202, "{:?}", done.body);
    }
}

#[tokio::test]
async fn a_task_whose_heartbeats_stop_is_taken_over_even_while_its_process_lives() {
    let s = stack().await;
    let fence = s.beat("w1", "run-1", 60, None).await;
    s.create(2).await;
    let claimed = s.claim("w1", 2, Some(("w1", fence))).await;
    // The process heartbeats its first task; the second's claim answer never reached it, so
    // nothing heartbeats that one. Once a task lease TTL passed for both, the first's heartbeat
    // moves its expiry on, and only the second is taken, though the process's lease lives.
    s.hints_run_out().await;
    let beat = s.act(&claimed[0], "w1", "heartbeat").await;
    assert_eq!(beat.status, 202, "{:?}", beat.body);
    let taken = s.claim("w2", 2, None).await;
    assert_eq!(taken.len(), 1, "{taken:?}");
    assert_eq!(taken[0]["id"], claimed[1]["id"]);
    assert_eq!(taken[0]["fence"], 2);
    let late = s.act(&claimed[1], "w1", "complete").await;
    assert_eq!(
        (late.status, late.code()),
        (409, "lease_lost"),
        "{:?}",
        late.body
    );
    for (task, processor) in [(&claimed[0], "w1"), (&taken[0], "w2")] {
        let done = s.act(task, processor, "complete").await;
        assert_eq!(done.status, 202, "{:?}", done.body);
    }
}

#[tokio::test]
async fn a_lapsed_worker_lease_loses_every_task_it_covers() {
    let s = stack().await;
    let fence = s.beat("w1", "run-1", 60, None).await;
    s.create(2).await;
    let claimed = s.claim("w1", 2, Some(("w1", fence))).await;
    // The process is paused past its lease: its lease lapses (expired by lease-service's
    // clock). Every task it covers is refused to it, heartbeats included.
    execute(
        &s.lease_db,
        "UPDATE leases SET expires_at = now() - interval '1 second' WHERE resource = 'worker:w1'",
    )
    .await;
    for task in &claimed {
        let refused = s.act(task, "w1", "heartbeat").await;
        assert_eq!(
            (refused.status, refused.code()),
            (409, "lease_lost"),
            "{:?}",
            refused.body
        );
    }
    // Their expiry passes; another process takes them under its own lease.
    s.hints_run_out().await;
    let fence2 = s.beat("w2", "run-2", 60, None).await;
    let taken = s.claim("w2", 2, Some(("w2", fence2))).await;
    assert_eq!(taken.len(), 2, "{taken:?}");
    // The first process wakes: its beat takes its lease anew, under a new fence; its old
    // claims stay refused, the new owner's are not.
    let renewed = s.beat("w1", "run-1", 60, Some(fence)).await;
    assert!(renewed > fence);
    for task in &claimed {
        let refused = s.act(task, "w1", "complete").await;
        assert_eq!(
            (refused.status, refused.code()),
            (409, "lease_lost"),
            "{:?}",
            refused.body
        );
    }
    for task in &taken {
        let done = s.act(task, "w2", "complete").await;
        assert_eq!(done.status, 202, "{:?}", done.body);
    }
}

#[tokio::test]
async fn a_worker_lease_taken_anew_refuses_the_claims_made_under_the_old_one() {
    let s = stack().await;
    let old = s.beat("w1", "run-1", 60, None).await;
    s.create(2).await;
    let claimed = s.claim("w1", 2, Some(("w1", old))).await;
    // The process's lease ends (it said it stopped) and a new run takes it anew.
    let gone = s
        .tasks
        .delete(
            "/api/workers/w1",
            &json!({"instance": "run-1", "fence": old, "secret": SECRET}),
        )
        .await;
    assert_eq!(gone.status, 204, "{:?}", gone.body);
    let new = s.beat("w1", "run-2", 60, None).await;
    assert!(new > old);
    for (task, what) in claimed.iter().zip(["heartbeat", "snooze"]) {
        let refused = s.act(task, "w1", what).await;
        assert_eq!(
            (refused.status, refused.code()),
            (409, "lease_lost"),
            "{what}: {:?}",
            refused.body
        );
    }
}

#[tokio::test]
async fn cancelling_one_task_of_a_worker_stops_only_that_task() {
    let s = stack().await;
    let fence = s.beat("w1", "run-1", 60, None).await;
    s.create(2).await;
    let claimed = s.claim("w1", 2, Some(("w1", fence))).await;
    let cancelled = s
        .tasks
        .post(
            &format!("/api/tasks/{}/cancel", claimed[0]["id"]),
            &json!({}),
        )
        .await;
    assert_eq!(cancelled.status, 202, "{:?}", cancelled.body);
    let stopped = s.act(&claimed[0], "w1", "heartbeat").await;
    assert_eq!((stopped.status, stopped.code()), (409, "cancelled"));
    let going = s.act(&claimed[1], "w1", "heartbeat").await;
    assert_eq!(going.status, 202, "{:?}", going.body);
    let done = s.act(&claimed[1], "w1", "complete").await;
    assert_eq!(done.status, 202, "{:?}", done.body);
    // The worker's lease still lives: the cancellation ended one task, not the lease.
    let lease = s.leases.get("/api/leases/active?resource=worker:w1").await;
    assert_eq!(lease.body["leases"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn a_task_whose_own_lease_is_held_is_not_taken_over_by_a_worker_lease_claim() {
    let s = stack().await;
    s.create(1).await;
    // The sample's way: a claim without a worker lease takes the task's own lease.
    let first = s.claim("anon", 1, None).await;
    assert_eq!(s.task_leases().await, 1);
    s.hints_run_out().await;
    let fence = s.beat("w1", "run-1", 60, None).await;
    assert_eq!(
        s.claim("w1", 1, Some(("w1", fence))).await,
        Vec::<Value>::new()
    );
    // Its own lease released by a failure (a retry at once), the worker's claim takes it.
    let failed = s
        .tasks
        .put(
            &format!("/api/tasks/{}/fail", first[0]["id"]),
            &json!({"processor": "anon", "fence": first[0]["fence"], "error": "x", "requeue": true}),
        )
        .await;
    assert_eq!(failed.status, 202, "{:?}", failed.body);
    let taken = s.claim("w1", 1, Some(("w1", fence))).await;
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0]["fence"], 2);
}

#[tokio::test]
async fn a_claim_naming_a_bad_worker_lease_is_refused_and_claims_nothing() {
    let s = stack().await;
    s.create(1).await;
    for (worker, code) in [
        (json!({"id": "", "fence": 1}), "invalid_field"),
        (json!({"id": "w", "fence": 0}), "invalid_fence"),
        (
            json!({"id": "w", "fence": 1, "extra": true}),
            "invalid_field",
        ),
        (json!({"id": "w"}), "missing_field"),
    ] {
        let refused = s
            .tasks
            .post(
                "/api/tasks/next",
                &json!({"processor": "w", "worker": worker}),
            )
            .await;
        assert_eq!((refused.status, refused.code()), (400, code), "{worker}");
    }
    let pending = query(
        &s.task_db,
        "SELECT count(*) AS n FROM tasks WHERE status = 'pending'",
    )
    .await;
    assert_eq!(pending[0]["n"], 1);
}

/// A claim under a worker lease that is not held (never granted, revoked, or taken anew under
/// another fence) is refused as a heartbeat under it would be, 409, and takes nothing: its
/// worker could never complete what it got. Carried by completions, the claim is refused
/// (`claimRefused`) and the completions are judged as ever.
#[tokio::test]
async fn a_claim_under_a_worker_lease_not_held_is_refused_and_takes_nothing() {
    let s = stack().await;
    s.create(2).await;
    let refused = |answer: tests::Answer| (answer.status, answer.code().to_owned());
    let claim = |id: &str, fence: i64| json!({"processor": "w", "limit": 2, "worker": {"id": id, "fence": fence}});
    let never = s.tasks.post("/api/tasks/next", &claim("ghost", 5)).await;
    assert_eq!(refused(never), (409, "lease_lost".to_owned()));
    let fence = s.beat("w1", "run-1", 60, None).await;
    tests::revoke_worker_lease(&s.leases, "w1").await;
    let revoked = s.tasks.post("/api/tasks/next", &claim("w1", fence)).await;
    assert_eq!(refused(revoked), (409, "lease_revoked".to_owned()));
    let renewed = s.beat("w1", "run-1", 60, Some(fence)).await;
    assert!(renewed > fence);
    let stale = s.tasks.post("/api/tasks/next", &claim("w1", fence)).await;
    assert_eq!(refused(stale), (409, "lease_lost".to_owned()));
    let pending = query(
        &s.task_db,
        "SELECT count(*) AS n FROM tasks WHERE status = 'pending'",
    )
    .await;
    assert_eq!(pending[0]["n"], 2, "a refused claim took tasks");
    // Under the lease as it is now, the claim takes both; completed with a claim carried
    // under the stale fence, they succeed and the claim is refused.
    let claimed = s.claim("w1", 2, Some(("w1", renewed))).await;
    assert_eq!(claimed.len(), 2, "{claimed:?}");
    let items: Vec<Value> = claimed
        .iter()
        .map(|task| json!({"id": task["id"], "fence": task["fence"], "task_output": {}}))
        .collect();
    let carried = s
        .tasks
        .put(
            "/api/tasks/complete",
            &json!({"processor": "w1", "tasks": items,
                    "next": {"worker": {"id": "w1", "fence": fence}}}),
        )
        .await;
    assert_eq!(carried.status, 200, "{:?}", carried.body);
    assert_eq!(
        tests::verdicts(&carried.body["results"]),
        vec![(202, ""), (202, "")],
        "{:?}",
        carried.body
    );
    assert_eq!(
        carried.body["claimRefused"]["status"], 409,
        "{:?}",
        carried.body
    );
    assert_eq!(carried.body["claimRefused"]["error"]["code"], "lease_lost");
}

/// A completion that carries its worker's next claim names the worker's lease, and is judged
/// in one statement once lease-service has said that lease is held. Every refusal a lone
/// completion gets still holds for it: the task taken over by another claim, the lease revoked,
/// the lease taken anew under another fence; and a cancelled task ends cancelled, its worker told
/// to stop (409 `cancelled`).
#[tokio::test]
async fn completions_carrying_a_claim_are_judged_as_lone_ones_are() {
    let s = stack().await;
    let fence = s.beat("w1", "run-1", 60, None).await;
    s.create(4).await;
    let claimed = s.claim("w1", 4, Some(("w1", fence))).await;
    assert_eq!(claimed.len(), 4, "{claimed:?}");
    // The first task's hint runs out and another worker takes it over (fence 2); the second's
    // cancellation is asked for.
    execute(
        &s.task_db,
        &format!(
            "UPDATE tasks SET must_heartbeat_before = now() - interval '1 second' WHERE id = {}",
            claimed[0]["id"]
        ),
    )
    .await;
    let taken = s.claim("w2", 1, None).await;
    assert_eq!(taken.len(), 1, "{taken:?}");
    assert_eq!(taken[0]["id"], claimed[0]["id"]);
    let cancel = s
        .tasks
        .post(
            &format!("/api/tasks/{}/cancel", claimed[1]["id"]),
            &json!({}),
        )
        .await;
    assert_eq!(cancel.status, 202, "{:?}", cancel.body);

    let results = s
        .carry(
            &[&claimed[0], &claimed[1], &claimed[2]],
            "w1",
            ("w1", fence),
        )
        .await;
    assert_eq!(
        tests::verdicts(&results),
        vec![(409, "lease_lost"), (409, "cancelled"), (202, "")],
        "{results:?}"
    );
    assert_eq!(results[2]["task"]["status"], "succeeded", "{results:?}");
    assert_eq!(s.status(&claimed[0]).await, "running");
    assert_eq!(s.status(&claimed[1]).await, "cancelled");

    // Revoked: the last task is refused, and stays running (and so is the claim carried).
    tests::revoke_worker_lease(&s.leases, "w1").await;
    let results = s.carry(&[&claimed[3]], "w1", ("w1", fence)).await;
    assert_eq!(
        tests::verdicts(&results),
        vec![(409, "lease_revoked")],
        "{results:?}"
    );
    // Taken anew: the new lease is held, but it is not the one the task was claimed under.
    let renewed = s.beat("w1", "run-2", 60, None).await;
    assert!(renewed > fence);
    let results = s.carry(&[&claimed[3]], "w1", ("w1", renewed)).await;
    assert_eq!(tests::verdicts(&results)[0].0, 409, "{results:?}");
    assert_eq!(s.status(&claimed[3]).await, "running");
}

/// A claim of one queue reads its lapsed and its due tasks in one statement, the due for the
/// room the lapsed leave; a lapsed task whose own lease turns out to be held is not taken, and
/// its place goes to a due task: the claim gets all it asked for that is due.
#[tokio::test]
async fn a_lapsed_task_not_taken_leaves_its_place_to_a_due_one() {
    let s = stack().await;
    s.create(1).await;
    let held = s.claim("anon", 1, None).await;
    assert_eq!(held.len(), 1);
    s.hints_run_out().await;
    let due = s.create(3).await;
    let fence = s.beat("w1", "run-1", 60, None).await;
    let answer = s
        .tasks
        .post(
            "/api/tasks/next",
            &json!({"processor": "w1", "queue": "default", "limit": 3,
                    "worker": {"id": "w1", "fence": fence}}),
        )
        .await;
    assert_eq!(answer.status, 202, "{:?}", answer.body);
    let mut taken: Vec<i64> = answer
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|task| task["id"].as_i64().unwrap())
        .collect();
    taken.sort_unstable();
    assert_eq!(taken, due, "the held one is left, every due one taken");
    assert_eq!(s.status(&held[0]).await, "running");
}

/// A claim of one queue under a worker's lease claims its due tasks in the statement that finds
/// them; any other claim records them in a statement of their own. Both must leave the same
/// task and the same history behind.
#[tokio::test]
async fn a_claim_made_where_its_tasks_are_found_is_recorded_as_any_other() {
    let s = stack().await;
    let fence = s.beat("w1", "run-1", 60, None).await;
    let mut recorded = Vec::new();
    for queue in [Some("default"), None] {
        let ids = s.create(2).await;
        let mut body =
            json!({"processor": "w1", "limit": 2, "worker": {"id": "w1", "fence": fence}});
        if let Some(queue) = queue {
            body["queue"] = json!(queue);
        }
        let answer = s.tasks.post("/api/tasks/next", &body).await;
        assert_eq!(answer.status, 202, "{:?}", answer.body);
        let answered: Vec<Value> = answer.body.as_array().unwrap().clone();
        assert_eq!(answered.len(), 2, "{answered:?}");
        let ids = ids
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let tasks = query(
            &s.task_db,
            &format!(
                "SELECT status, processor, fence, attempts, lease_resource, lease_fence,
                        lease_secret IS NULL AS no_secret, started_at = last_heartbeat_at AS started,
                        must_heartbeat_before > now() AS heartbeat_due_later,
                        round(EXTRACT(EPOCH FROM must_heartbeat_before - last_heartbeat_at))
                            AS heartbeat_within
                 FROM tasks WHERE id IN ({ids}) ORDER BY id"
            ),
        )
        .await;
        let history = query(
            &s.task_db,
            &format!(
                "SELECT from_status, to_status, claimants, charged, claimant_leases,
                        claimant_of, fences,
                        attempts, lease_fences, cardinality(pickup_ms) AS pickups,
                        0 <= ALL(pickup_ms) AS pickups_measured
                 FROM task_events WHERE task_ids && ARRAY[{ids}]::bigint[] ORDER BY id"
            ),
        )
        .await;
        recorded.push((answered, tasks, history));
    }
    let (in_place, apart) = (&recorded[0], &recorded[1]);
    for (answered, _, _) in &recorded {
        for task in answered {
            assert_eq!(
                (&task["status"], &task["processor"], &task["fence"]),
                (&json!("running"), &json!("w1"), &json!(1)),
                "{task}"
            );
        }
    }
    assert_eq!(in_place.1, apart.1, "the tasks' rows differ");
    assert_eq!(in_place.2, apart.2, "the history differs");
    // One creation row and one claim row each, the claim naming the worker's lease.
    assert_eq!(in_place.2.len(), 2, "{:?}", in_place.2);
    assert_eq!(in_place.2[1]["claimant_leases"], json!(["worker:w1"]));
    assert_eq!(in_place.2[1]["pickups"], 2);
}
