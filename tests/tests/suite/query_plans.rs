//! Query plans on a real PostgreSQL. A claim reads due tasks in index order and stops at its
//! `LIMIT`, never by sorting a queue's whole backlog, even while the planner's statistics have
//! not yet seen the queue (a burst of new tasks between two `ANALYZE`s). And no session keeps a
//! plan that scans a table which has grown since: task-service keeps key lookups prepared, and
//! the claim groups' statements over sets in transactions that price sequential scans out, and
//! plans its other statements over sets on each call; lease-service keeps all of its
//! statements, in sessions that price sequential scans out.
#![allow(clippy::unwrap_used)]

use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Nullable, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use leasehold::server::db::OneRow;
use task_service::repo;
use tests::fresh_database;

#[derive(QueryableByName)]
struct PlanLine {
    #[diesel(sql_type = Text, column_name = "QUERY PLAN")]
    line: String,
}

/// The plan PostgreSQL makes for the claim of `limit` due tasks of `queue`, as text.
async fn claim_plan(conn: &mut AsyncPgConnection, queue: &str, limit: i64) -> String {
    let lines: Vec<PlanLine> = diesel::sql_query(format!("EXPLAIN {}", repo::due_sql(true)))
        .bind::<Nullable<Text>, _>(Some(queue))
        .bind::<BigInt, _>(limit)
        .load(conn)
        .await
        .unwrap();
    lines
        .into_iter()
        .map(|l| l.line)
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn a_claim_walks_the_due_index_even_when_statistics_have_not_seen_its_queue() {
    let db = fresh_database().await;
    task_service::migrate(&db).await.unwrap();
    let mut conn = AsyncPgConnection::establish(&db).await.unwrap();
    // The end-to-end benchmark's state when it found claims taking 20 ms: statistics gathered
    // while another queue was half done, then a burst of 20,000 tasks into a queue they have
    // never seen. Autovacuum is off so that nothing refreshes them behind the test's back.
    for sql in [
        "ALTER TABLE tasks SET (autovacuum_enabled = false)",
        "INSERT INTO tasks (task_data, queue, max_attempts)
         SELECT '{}', 'earlier', 3 FROM generate_series(1, 20000)",
        "UPDATE tasks SET status = 'running', processor = 'w', fence = 1 WHERE id % 2 = 0",
        "UPDATE tasks SET status = 'succeeded', processed_at = now() WHERE id % 2 = 0",
        "ANALYZE tasks",
        "UPDATE tasks SET status = 'succeeded', processed_at = now() WHERE id % 2 = 1",
        "INSERT INTO tasks (task_data, queue, max_attempts)
         SELECT '{}', 'burst', 3 FROM generate_series(1, 20000)",
    ] {
        diesel::sql_query(sql).execute(&mut conn).await.unwrap();
    }

    let unguarded = conn
        .transaction::<_, diesel::result::Error, _>(async |conn| {
            Ok(claim_plan(conn, "burst", 32).await)
        })
        .await
        .unwrap();
    let guarded = repo::in_index_order::<_, diesel::result::Error>(&mut conn, async |conn| {
        Ok(claim_plan(conn, "burst", 32).await)
    })
    .await
    .unwrap();

    // The hazard is real on this PostgreSQL: left to its statistics, the planner sorts the
    // queue's whole backlog on every claim. (Should a future PostgreSQL stop doing so, this
    // set-up no longer shows anything and must be revisited.)
    assert!(
        unguarded.contains("Sort"),
        "the set-up no longer reproduces the sorting plan:\n{unguarded}"
    );
    // The claim's transaction reads the ordered partial index instead.
    assert!(
        !guarded.contains("Sort") && guarded.contains("tasks_due_by_queue_idx"),
        "a claim's plan sorts or misses the due index:\n{guarded}"
    );

    // The statement that claims a queue's due tasks where it finds them (for workers that name
    // their process's lease) reads them the same way: what it claims, and the handful of rows
    // around them, never the queue's backlog.
    let slots = repo::Slots {
        processors: vec!["w"; 32],
        resources: vec![Some("worker:w"); 32],
        fences: vec![1; 32],
        hint: std::time::Duration::from_secs(30),
    };
    // A session of its own: the set-up's scans, made by this one, may not be counted yet.
    let mut claimer = AsyncPgConnection::establish(&db).await.unwrap();
    let (claimed, scans) =
        repo::in_index_order::<_, diesel::result::Error>(&mut claimer, async |conn| {
            let taken = repo::take_lapsed(conn, Some("burst"), 32, 32, Some(&slots)).await?;
            let claimed = taken.iter().filter(|row| row.claim_slot.is_some()).count();
            Ok((claimed, scans_of(conn, "tasks").await))
        })
        .await
        .unwrap();
    assert_eq!(claimed, 32);
    assert_eq!(scans.seq_scan, 0);
    assert!(
        scans.rows_read < 500,
        "claiming 32 due tasks read {} rows of the backlog of 20,000",
        scans.rows_read
    );
}

#[derive(Debug, QueryableByName)]
struct Prepared {
    #[diesel(sql_type = Text)]
    statement: String,
    #[diesel(sql_type = BigInt)]
    generic_plans: i64,
}

async fn prepared_statements(conn: &mut AsyncPgConnection) -> Vec<Prepared> {
    diesel::sql_query("SELECT statement, generic_plans FROM pg_prepared_statements")
        .load(conn)
        .await
        .unwrap()
}

#[derive(QueryableByName)]
struct Scans {
    #[diesel(sql_type = BigInt)]
    seq_scan: i64,
    /// Rows read by sequential scans and fetched through indexes.
    #[diesel(sql_type = BigInt)]
    rows_read: i64,
}

/// Sequential scans of `table` in this transaction, and rows read from it.
async fn scans_of(conn: &mut AsyncPgConnection, table: &str) -> Scans {
    diesel::sql_query(
        "SELECT seq_scan, seq_tup_read + COALESCE(idx_tup_fetch, 0) AS rows_read
         FROM pg_stat_xact_user_tables WHERE relname = $1",
    )
    .bind::<Text, _>(table)
    .get_one(conn)
    .await
    .unwrap()
}

/// Runs lease-service's group statements (two leases each) the way a busy service does, so that
/// the session keeps them prepared.
async fn run_lease_groups(conn: &mut AsyncPgConnection, round: usize) {
    use lease_service::repo as leases;
    let hash = [7u8; 32];
    let names = [format!("a{round}"), format!("b{round}")];
    let wants: Vec<leases::Want<'_>> = names
        .iter()
        .map(|name| leases::Want {
            resource: name,
            holder: "h",
            ttl_seconds: 30,
            new_secret_hash: &hash,
            metadata: None,
        })
        .collect();
    leases::take_each(conn, &wants, false).await.unwrap();
    let renewals: Vec<leases::Renewal> = names
        .iter()
        .map(|name| leases::Renewal {
            resource: name.clone(),
            holder: "h".to_owned(),
            fence: None,
            secret_hash: None,
            ttl_seconds: None,
            metadata: None,
        })
        .collect();
    leases::renew_each(conn, &renewals).await.unwrap();
    let releases: Vec<leases::Release> = names
        .iter()
        .map(|name| leases::Release {
            resource: name.clone(),
            holder: "h".to_owned(),
            fence: None,
            secret_hash: None,
            id: None,
        })
        .collect();
    leases::release_each(conn, &releases).await.unwrap();
}

/// Sequential scans of `leases`, and rows read from it, by lease-service's group statements
/// (two leases each) run once more after the table grew from nothing to 20,000 rows under
/// plans the session kept from when it was empty.
async fn scans_after_growth(conn: &mut AsyncPgConnection) -> (Scans, Vec<Prepared>) {
    diesel::sql_query("ALTER TABLE leases SET (autovacuum_enabled = false)")
        .execute(conn)
        .await
        .unwrap();
    for round in 0..8 {
        run_lease_groups(conn, round).await;
    }
    let kept = prepared_statements(conn).await;
    diesel::sql_query(
        "INSERT INTO leases (resource, holder, fence, ttl_seconds, created_at, expires_at)
         SELECT 'grown-' || g, 'h', nextval('leases_fence_seq'), 30, now(), now()
         FROM generate_series(1, 20000) AS g",
    )
    .execute(conn)
    .await
    .unwrap();
    let scans = conn
        .transaction::<_, diesel::result::Error, _>(async |conn| {
            run_lease_groups(conn, 100).await;
            Ok(scans_of(conn, "leases").await)
        })
        .await
        .unwrap();
    (scans, kept)
}

#[tokio::test]
async fn lease_statements_stay_prepared_and_never_keep_a_plan_that_scans_a_grown_table() {
    let lease_db = fresh_database().await;
    lease_service::db::migrate(&lease_db).await.unwrap();

    // The hazard is real: a plain session keeps the group statements' plans made while
    // `leases` was empty, and they scan the table once it has grown.
    let mut plain = AsyncPgConnection::establish(&lease_db).await.unwrap();
    let (scans, _) = scans_after_growth(&mut plain).await;
    assert!(
        scans.seq_scan > 0,
        "the set-up no longer reproduces a kept scanning plan"
    );

    // lease-service's sessions keep every statement prepared on its generic plan, and the plans
    // made while the table was empty find rows by index however it has grown.
    let lease_db = fresh_database().await;
    lease_service::db::migrate(&lease_db).await.unwrap();
    let mut conn = lease_service::db::establish(&lease_db).await.unwrap();
    let (scans, kept) = scans_after_growth(&mut conn).await;
    // The acquire, renewal and release groups, by the names their `unnest` columns take.
    for statement in ["INSERT INTO leases", "rn_resource", "rel_resource"] {
        let prepared = kept
            .iter()
            .find(|p| p.statement.contains(statement) && p.statement.contains("unnest"));
        assert!(
            prepared.is_some_and(|p| p.generic_plans > 0),
            "the group statement {statement:?} does not run on a kept plan: {:#?}",
            kept.iter().map(|p| &p.statement).collect::<Vec<_>>()
        );
    }
    assert_eq!(
        scans.seq_scan, 0,
        "a kept plan scans the grown leases table"
    );
    // Six rows touched, a few more read (a renewal's and a release's row, found again by the
    // next statement): nothing like the 20,000 a scan or a merge over the whole index reads.
    assert!(
        scans.rows_read <= 40,
        "kept plans read {} rows of the grown leases table",
        scans.rows_read
    );
}

#[tokio::test]
async fn task_key_lookups_stay_prepared_and_set_statements_outside_claims_are_planned_on_each_call()
{
    let task_db = fresh_database().await;
    task_service::migrate(&task_db).await.unwrap();
    let mut conn = AsyncPgConnection::establish(&task_db).await.unwrap();
    for _ in 0..6 {
        repo::find(&mut conn, 1).await.unwrap();
        repo::counts_of(&mut conn, &["q".to_owned()]).await.unwrap();
    }
    let kept: Vec<String> = prepared_statements(&mut conn)
        .await
        .into_iter()
        .map(|p| p.statement)
        .collect();
    assert!(
        kept.iter().any(|s| s.contains("WHERE id = $1")),
        "the lookup by id is kept prepared: {kept:#?}"
    );
    assert!(
        !kept.iter().any(|s| s.contains("ANY(")),
        "a set statement that runs outside claim groups was kept prepared: {kept:#?}"
    );
}

/// One claim group's statements, as a busy queue runs them: the lapsed, the due (two), their
/// claims, and their completions carried by the next claim, in a claim group's transaction
/// (`guarded`: a [`repo::in_index_order`] transaction, as claim groups run in) or a plain one;
/// and what the transaction scanned.
async fn run_claim_group(conn: &mut AsyncPgConnection, guarded: bool) -> Scans {
    if guarded {
        repo::in_index_order::<_, diesel::result::Error>(conn, async |conn| {
            claim_group_statements(conn).await?;
            Ok(scans_of(conn, "tasks").await)
        })
        .await
    } else {
        conn.transaction::<_, diesel::result::Error, _>(async |conn| {
            claim_group_statements(conn).await?;
            Ok(scans_of(conn, "tasks").await)
        })
        .await
    }
    .unwrap()
}

async fn claim_group_statements(conn: &mut AsyncPgConnection) -> diesel::QueryResult<()> {
    let output = serde_json::json!({});
    // The lapsed and the due read apart (a claim of a limited queue, or of any queue), and
    // their claims recorded in a statement of their own.
    repo::take_lapsed(conn, Some("q"), 2, 2, None).await?;
    let due = repo::lock_due(conn, Some("q"), 2, &[]).await?;
    let claims: Vec<repo::Claim<'_>> = due
        .iter()
        .map(|task| repo::Claim {
            id: task.id,
            from: task.status,
            first: true,
            processor: "w",
            lease_resource: Some("worker:w"),
            lease_fence: 1,
            lease_secret: None,
            lease_expiry: None,
            started_at: None,
        })
        .collect();
    let mut claimed = repo::mark_claimed(conn, &claims, std::time::Duration::from_secs(30)).await?;
    // The lapsed and the due of a queue without limits in one statement, which claims the
    // next due task there (its slot's request named its process's lease) and only locks the
    // one after (its request did not).
    let slots = repo::Slots {
        processors: vec!["w", "v"],
        resources: vec![Some("worker:w"), None],
        fences: vec![1, 0],
        hint: std::time::Duration::from_secs(30),
    };
    let taken = repo::take_lapsed(conn, Some("q"), 2, 2, Some(&slots)).await?;
    claimed.extend(
        taken
            .into_iter()
            .filter(|row| row.claim_slot.is_some())
            .map(|row| row.task),
    );
    // Their completions, carried by the next claim.
    let done: Vec<repo::Covered<'_>> = claimed
        .iter()
        .map(|task| repo::Covered {
            id: task.id,
            output: &output,
            processor: "w",
            fence: task.fence,
            lease_resource: "worker:w",
            lease_fence: 1,
        })
        .collect();
    repo::mark_succeeded_covered(conn, &done).await?;
    // The limits' lock, as a claim of one queue and of every queue takes it.
    repo::lock_limits(conn, Some("q")).await?;
    repo::lock_limits(conn, None).await?;
    Ok(())
}

/// Sequential scans of `tasks`, and rows read from it, by one claim group run after the table
/// grew from a few tasks to 20,000 under the statements the session kept from before.
async fn claim_scans_after_growth(db: &str, guarded: bool) -> (Scans, Vec<Prepared>) {
    let mut conn = AsyncPgConnection::establish(db).await.unwrap();
    // The table is set up by another session, so that its scans are not counted.
    let mut setup = AsyncPgConnection::establish(db).await.unwrap();
    for sql in [
        "ALTER TABLE tasks SET (autovacuum_enabled = false)",
        "INSERT INTO tasks (task_data, queue, max_attempts)
         SELECT '{}', 'q', 3 FROM generate_series(1, 20)",
    ] {
        diesel::sql_query(sql).execute(&mut setup).await.unwrap();
    }
    for _ in 0..8 {
        run_claim_group(&mut conn, guarded).await;
    }
    for sql in [
        "INSERT INTO tasks (task_data, queue, max_attempts)
         SELECT '{}', 'q', 3 FROM generate_series(1, 20000)",
        // Finished, running and lapsed work beside the backlog, as a day of claims leaves.
        "UPDATE tasks SET status = 'succeeded', processed_at = now() WHERE id % 3 = 0",
        "UPDATE tasks SET status = 'running', processor = 'w', fence = 1, attempts = 1,
                          must_heartbeat_before = now() + interval '1 hour'
         WHERE id % 3 = 1 AND id > 100",
    ] {
        diesel::sql_query(sql).execute(&mut setup).await.unwrap();
    }
    let scans = run_claim_group(&mut conn, guarded).await;
    (scans, prepared_statements(&mut conn).await)
}

#[tokio::test]
async fn claim_group_statements_stay_prepared_and_never_keep_a_plan_that_scans_a_grown_table() {
    // The hazard is real: the same kept statements in a plain transaction keep plans made
    // while `tasks` was tiny, and they scan it once it has grown.
    let task_db = fresh_database().await;
    task_service::migrate(&task_db).await.unwrap();
    let (scans, _) = claim_scans_after_growth(&task_db, false).await;
    assert!(
        scans.seq_scan > 0,
        "the set-up no longer reproduces a kept scanning plan"
    );

    let task_db = fresh_database().await;
    task_service::migrate(&task_db).await.unwrap();
    let (scans, kept) = claim_scans_after_growth(&task_db, true).await;
    // The lapsed, the due, the claims and the completions, by words only each one has.
    for statement in [
        "exhausted AS",
        "due AS",
        "LIMIT $2",
        "claim_processor",
        "done_lease_fence",
        "FOR NO KEY UPDATE",
    ] {
        assert!(
            kept.iter().any(|p| p.statement.contains(statement)),
            "the claim group's statement {statement:?} is not kept prepared: {:#?}",
            kept.iter().map(|p| &p.statement).collect::<Vec<_>>()
        );
    }
    // The limits' lock of one queue runs its generic plan once PostgreSQL has made five custom
    // ones (its plan does not change with the name): planned at every call, as it was when one
    // statement served both kinds of claim, it cost a claim group about 100 µs of planning.
    let lock = kept
        .iter()
        .find(|p| p.statement.contains("key_cursor") && p.statement.contains("queue = $1"));
    assert!(
        lock.is_some_and(|p| p.generic_plans > 0),
        "the limits' lock is planned at every call: {kept:#?}"
    );
    assert_eq!(
        scans.seq_scan, 0,
        "a claim group's kept plan scans the grown tasks table"
    );
    // Two tasks claimed and completed, a few index entries stepped over: nothing like the
    // 20,000 a scan, or a walk of a whole index, reads.
    assert!(
        scans.rows_read <= 200,
        "a claim group's kept plans read {} rows of the grown tasks table",
        scans.rows_read
    );
}

/// A completion group's statements (a worker's batch of completions: the rows locked, then
/// marked succeeded) run their generic plans, made while `tasks` held twenty rows, and those
/// still find each task by its id once the table holds 20,000.
#[tokio::test]
async fn completion_group_statements_run_generic_plans_that_never_scan_a_grown_table() {
    let db = fresh_database().await;
    task_service::migrate(&db).await.unwrap();
    let mut conn = AsyncPgConnection::establish(&db).await.unwrap();
    let mut setup = AsyncPgConnection::establish(&db).await.unwrap();
    let running = "UPDATE tasks SET status = 'running', processor = 'w', fence = 1, attempts = 1,
                          started_at = now(), must_heartbeat_before = now() + interval '1 hour'";
    for sql in [
        "ALTER TABLE tasks SET (autovacuum_enabled = false)".to_owned(),
        "INSERT INTO tasks (task_data, queue, max_attempts)
         SELECT '{}', 'q', 3 FROM generate_series(1, 20)"
            .to_owned(),
        format!("{running} WHERE id <= 20"),
    ] {
        diesel::sql_query(sql).execute(&mut setup).await.unwrap();
    }
    let output = serde_json::json!({"ok": true});
    let complete = async |conn: &mut AsyncPgConnection, ids: Vec<i64>| {
        repo::in_index_order_generic::<_, diesel::result::Error>(conn, async |conn| {
            let locked = repo::lock_many(conn, &ids).await?;
            let done: Vec<(i64, &serde_json::Value)> =
                locked.iter().map(|t| (t.id, &output)).collect();
            let ended = repo::mark_succeeded_many(conn, &done).await?;
            Ok((ended.len(), scans_of(conn, "tasks").await))
        })
        .await
        .unwrap()
    };
    for n in 0..8 {
        let (ended, _) = complete(&mut conn, vec![2 * n + 1, 2 * n + 2]).await;
        assert_eq!(ended, 2);
    }
    for sql in [
        "INSERT INTO tasks (task_data, queue, max_attempts)
         SELECT '{}', 'q', 3 FROM generate_series(1, 20000)"
            .to_owned(),
        format!("{running} WHERE id % 3 = 1 AND id > 100"),
    ] {
        diesel::sql_query(sql).execute(&mut setup).await.unwrap();
    }
    let (ended, scans) = complete(&mut conn, vec![19, 20, 103, 106]).await;
    assert_eq!(ended, 4);
    assert_eq!(
        scans.seq_scan, 0,
        "a completion group's plan scans the grown table"
    );
    assert!(
        scans.rows_read <= 40,
        "completing four tasks read {} rows of the grown tasks table",
        scans.rows_read
    );
    let kept = prepared_statements(&mut conn).await;
    for statement in ["ORDER BY id FOR UPDATE", "AS c(done_id, done_output)"] {
        assert!(
            kept.iter()
                .any(|p| p.statement.contains(statement) && p.generic_plans > 0),
            "{statement:?} does not run its generic plan: {kept:#?}"
        );
    }
}

#[tokio::test]
async fn a_claim_of_a_key_limited_queue_probes_keys_never_a_keys_backlog() {
    let db = fresh_database().await;
    task_service::migrate(&db).await.unwrap();
    let mut conn = AsyncPgConnection::establish(&db).await.unwrap();
    // One tenant's backlog of 20,000, then three other tenants' one task each, statistics fresh;
    // no task without a key (whose probe must not walk past the keyed ones either).
    for sql in [
        "INSERT INTO queues (queue, key_concurrency_limit) VALUES ('tenants', 5)",
        "INSERT INTO tasks (task_data, queue, max_attempts, concurrency_key)
         SELECT '{}', 'tenants', 3, 'big' FROM generate_series(1, 20000)",
        "INSERT INTO tasks (task_data, queue, max_attempts, concurrency_key)
         SELECT '{}', 'tenants', 3, 'small-' || i FROM generate_series(1, 3) i",
        "ANALYZE tasks",
    ] {
        diesel::sql_query(sql).execute(&mut conn).await.unwrap();
    }
    let plan = repo::in_index_order::<_, diesel::result::Error>(&mut conn, async |conn| {
        let lines: Vec<PlanLine> = diesel::sql_query(format!(
            "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) {}",
            repo::DUE_BY_KEY
        ))
        .bind::<Text, _>("tenants")
        .bind::<Nullable<Text>, _>(None::<&str>)
        .bind::<BigInt, _>(10)
        .bind::<diesel::sql_types::Integer, _>(5)
        .load(conn)
        .await?;
        Ok(lines
            .into_iter()
            .map(|l| l.line)
            .collect::<Vec<_>>()
            .join("\n"))
    })
    .await
    .unwrap();
    eprintln!("{plan}");
    assert!(
        plan.contains("tasks_due_by_key_idx") && !plan.contains("Seq Scan on tasks"),
        "the claim does not walk the keys' index:\n{plan}"
    );
    // Its few small sorts, priced out by the claim's `enable_sort = off`, must not make the plan
    // look costly enough to compile (600 ms a claim, measured).
    assert!(!plan.contains("JIT"), "the claim was JIT-compiled:\n{plan}");
    // No node reads more rows than a key's room and the keys walked: never the backlog.
    let most_rows = plan
        .lines()
        .filter_map(|line| {
            line.split("rows=")
                .nth(1)
                .or_else(|| line.split("Removed by Filter: ").nth(1))
        })
        .filter_map(|rest| {
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<u64>()
                .ok()
        })
        .max()
        .unwrap();
    assert!(most_rows <= 20, "a node read {most_rows} rows:\n{plan}");
}

#[derive(QueryableByName)]
struct TaskScans {
    #[diesel(sql_type = BigInt)]
    seq_scan: i64,
    #[diesel(sql_type = BigInt)]
    idx_scan: i64,
}

/// A page of `GET /api/queues` finds its names one index descent per queue (a loose index
/// scan) and counts those queues alone: however many tasks and queues there are, it never scans
/// the tasks table, and its descents grow with the page, not with the table.
#[tokio::test]
async fn a_page_of_queues_descends_the_index_once_a_queue_and_never_scans_the_table() {
    let db = fresh_database().await;
    task_service::migrate(&db).await.unwrap();
    let mut conn = AsyncPgConnection::establish(&db).await.unwrap();
    for sql in [
        "INSERT INTO tasks (task_data, queue, max_attempts)
         SELECT '{}', 'q-' || lpad((g % 20000)::text, 5, '0'), 3
         FROM generate_series(1, 100000) g",
        "INSERT INTO queues (queue, paused) SELECT 's-' || g, true FROM generate_series(1, 500) g",
        "VACUUM ANALYZE tasks",
    ] {
        diesel::sql_query(sql).execute(&mut conn).await.unwrap();
    }
    drop(conn);
    for (after, descending) in [
        (None, false),
        (Some("q-10000"), false),
        (Some("q-10000"), true),
    ] {
        // A session of its own: its counters start at zero.
        let mut conn = AsyncPgConnection::establish(&db).await.unwrap();
        let (names, scans) = conn
            .transaction::<_, diesel::result::Error, _>(async |conn| {
                let names = repo::queue_names(conn, after, descending, 101).await?;
                repo::counts_of(conn, &names).await?;
                repo::oldest_due_of(conn, &names).await?;
                let scans: TaskScans = diesel::sql_query(
                    "SELECT seq_scan, COALESCE(idx_scan, 0) AS idx_scan
                     FROM pg_stat_xact_user_tables WHERE relname = 'tasks'",
                )
                .get_one(conn)
                .await?;
                Ok((names, scans))
            })
            .await
            .unwrap();
        assert_eq!(names.len(), 101);
        assert_eq!(
            scans.seq_scan, 0,
            "{after:?} {descending}: a scan of the tasks table"
        );
        assert!(
            // Two descents a queue to find the names (one in the index of the tasks not running,
            // one in the running tasks'), one for its oldest due, and the counts' ranges.
            scans.idx_scan <= 4 * 101 + 10,
            "{after:?} {descending}: {} index scans for a page of 101",
            scans.idx_scan
        );
    }
}

/// Issue 48: a task's history is found through the index over each row's first id, reading the
/// rows of its band only, never by a scan of the history: 100,000 rows of history here, of
/// 50,000 tasks.
#[tokio::test]
async fn a_tasks_history_reads_the_rows_of_its_band_through_the_first_id_index() {
    let db = fresh_database().await;
    task_service::migrate(&db).await.unwrap();
    let mut conn = AsyncPgConnection::establish(&db).await.unwrap();
    for sql in [
        // A create and a claim row for each band of 256 tasks, as the services write them.
        "INSERT INTO task_events (at, queue, from_status, to_status, task_ids, fences, attempts)
         SELECT now(), 'q', s.f, s.t, array_agg(g ORDER BY g), array_agg(g ORDER BY g),
                array_agg(1 ORDER BY g)
         FROM generate_series(1, 50000) g,
              (VALUES (NULL, 'pending'), ('pending', 'running')) s(f, t)
         GROUP BY g / 256, s.f, s.t",
        // And many single rows for one task of each band, the 200th.
        "INSERT INTO task_events (at, queue, from_status, to_status, task_ids, fences, attempts)
         SELECT now(), 'q', 'running', 'pending', ARRAY[(g % 195) * 256 + 200], ARRAY[1::bigint],
                ARRAY[1]
         FROM generate_series(1, 99000) g",
        "VACUUM ANALYZE task_events",
    ] {
        diesel::sql_query(sql).execute(&mut conn).await.unwrap();
    }
    drop(conn);
    let mut conn = AsyncPgConnection::establish(&db).await.unwrap();
    let (events, scans, read) = conn
        .transaction::<_, diesel::result::Error, _>(async |conn| {
            let events = repo::events(conn, 30_000).await?;
            let scans = scans_of(conn, "task_events").await;
            let read: Reads = diesel::sql_query(
                "SELECT COALESCE(idx_scan, 0) AS idx_scan FROM pg_stat_xact_user_tables
                 WHERE relname = 'task_events'",
            )
            .get_one(conn)
            .await?;
            Ok((events, scans, read))
        })
        .await
        .unwrap();
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(scans.seq_scan, 0, "a scan of the history");
    // One descent of an index, which reads the rows of its band up to its own id: two, of
    // 100,000 (the many rows of its band name a task after it, 30,152).
    assert_eq!(read.idx_scan, 1);
    assert!(scans.rows_read <= 4, "{} rows read", scans.rows_read);
}

#[derive(QueryableByName)]
struct Reads {
    #[diesel(sql_type = BigInt)]
    idx_scan: i64,
}
