//! The invariant checker: proves from the history the services record (tables `lease_events`
//! and `task_events`, written by triggers in the same transaction as each change) that a run kept
//! SPEC.md's invariants. It reports every violation with its evidence rather than stopping at the
//! first. Both databases must share one server (one clock), as they do in the tests.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Nullable, Text, Timestamptz};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

/// One holder's term on a resource: from its acquisition until it was released or expired.
#[derive(Debug, Clone)]
pub struct Term {
    pub resource: String,
    pub holder: String,
    pub fence: i64,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
}

/// What a check looked at, and what it found.
#[derive(Debug, Default)]
pub struct Report {
    pub lease_events: usize,
    pub terms: usize,
    pub task_events: usize,
    pub tasks: usize,
    pub generated_tasks: usize,
    pub violations: Vec<String>,
}

#[derive(QueryableByName)]
struct LeaseEvent {
    #[diesel(sql_type = Timestamptz)]
    at: DateTime<Utc>,
    #[diesel(sql_type = Text)]
    kind: String,
    #[diesel(sql_type = Text)]
    resource: String,
    #[diesel(sql_type = Text)]
    holder: String,
    #[diesel(sql_type = BigInt)]
    fence: i64,
    #[diesel(sql_type = Timestamptz)]
    expires_at: DateTime<Utc>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    released_at: Option<DateTime<Utc>>,
}

#[derive(QueryableByName)]
struct TaskEvent {
    #[diesel(sql_type = Timestamptz)]
    at: DateTime<Utc>,
    #[diesel(sql_type = BigInt)]
    task_id: i64,
    #[diesel(sql_type = Text)]
    to_status: String,
    #[diesel(sql_type = Nullable<Text>)]
    processor: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    fence: Option<i64>,
}

#[derive(QueryableByName)]
struct TaskRow {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    status: String,
    #[diesel(sql_type = Nullable<Text>)]
    idempotency_key: Option<String>,
    #[diesel(sql_type = Timestamptz)]
    created_at: DateTime<Utc>,
}

/// Lease terms per resource, in acquisition order, with violations of "fences only rise" and
/// "one holder per fence".
fn terms(events: &[LeaseEvent], violations: &mut Vec<String>) -> BTreeMap<String, Vec<Term>> {
    let mut by_resource: BTreeMap<String, Vec<Term>> = BTreeMap::new();
    for event in events {
        let terms = by_resource.entry(event.resource.clone()).or_default();
        if event.kind == "acquired" {
            if let Some(last) = terms.last()
                && event.fence <= last.fence
            {
                violations.push(format!(
                    "fence did not rise on {}: {} (holder {}) acquired after {} (holder {})",
                    event.resource, event.fence, event.holder, last.fence, last.holder
                ));
            }
            terms.push(Term {
                resource: event.resource.clone(),
                holder: event.holder.clone(),
                fence: event.fence,
                start: event.at,
                end: event.released_at.unwrap_or(event.expires_at),
            });
            continue;
        }
        match terms.iter_mut().rev().find(|t| t.fence == event.fence) {
            Some(term) if term.holder == event.holder => {
                term.end = event.released_at.unwrap_or(event.expires_at);
            }
            Some(term) => violations.push(format!(
                "fence {} on {} changed holder from {} to {}",
                event.fence, event.resource, term.holder, event.holder
            )),
            None => violations.push(format!(
                "{} of fence {} on {} that was never acquired",
                event.kind, event.fence, event.resource
            )),
        }
    }
    by_resource
}

/// "No two holders' lease intervals overlap on one resource."
fn check_exclusive(terms: &BTreeMap<String, Vec<Term>>, violations: &mut Vec<String>) {
    for list in terms.values() {
        for pair in list.windows(2) {
            let (earlier, later) = (&pair[0], &pair[1]);
            if later.start < earlier.end {
                violations.push(format!(
                    "overlap on {}: {} (fence {}) held until {} but {} (fence {}) acquired at {}",
                    earlier.resource,
                    earlier.holder,
                    earlier.fence,
                    earlier.end,
                    later.holder,
                    later.fence,
                    later.start
                ));
            }
        }
    }
}

/// Checks the lease history of `lease_db`, and, when `task_db` is given, the task history
/// against it (tasks' leases are `task:<id>`, the generator's is `task-generator`).
/// `all_final` also requires every task to have reached a final state.
pub async fn check(lease_db: &str, task_db: Option<&str>, all_final: bool) -> Report {
    let mut report = Report::default();
    let mut leases = AsyncPgConnection::establish(lease_db)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let events: Vec<LeaseEvent> = diesel::sql_query(
        "SELECT at, kind, resource, holder, fence, expires_at, released_at FROM lease_events ORDER BY id",
    )
    .load(&mut leases)
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    report.lease_events = events.len();
    let terms = terms(&events, &mut report.violations);
    report.terms = terms.values().map(Vec::len).sum();
    check_exclusive(&terms, &mut report.violations);

    let Some(task_db) = task_db else {
        return report;
    };
    let mut tasks_conn = AsyncPgConnection::establish(task_db)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let task_events: Vec<TaskEvent> = diesel::sql_query(
        "SELECT at, task_id, to_status, processor, fence FROM task_events ORDER BY id",
    )
    .load(&mut tasks_conn)
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    report.task_events = task_events.len();
    let mut by_task: BTreeMap<i64, Vec<&TaskEvent>> = BTreeMap::new();
    for event in &task_events {
        by_task.entry(event.task_id).or_default().push(event);
    }
    for (id, events) in &by_task {
        let completions: Vec<&&TaskEvent> = events
            .iter()
            .filter(|e| e.to_status == "succeeded")
            .collect();
        if completions.len() > 1 {
            report.violations.push(format!(
                "task {id} was completed {} times",
                completions.len()
            ));
        }
        for completion in completions {
            let claim = events
                .iter()
                .rfind(|e| e.to_status == "running" && e.at <= completion.at);
            let Some(claim) = claim else {
                report
                    .violations
                    .push(format!("task {id} completed without a claim"));
                continue;
            };
            if claim.fence != completion.fence || claim.processor != completion.processor {
                report.violations.push(format!(
                    "task {id} completed by {:?} under fence {:?}, but its last claim was {:?} under {:?}",
                    completion.processor, completion.fence, claim.processor, claim.fence
                ));
            }
            // Superseded: a newer lease on the task had been acquired before the completion.
            if let Some(newer) = terms.get(&format!("task:{id}")).and_then(|list| {
                list.iter()
                    .find(|t| Some(t.fence) > completion.fence && t.start < completion.at)
            }) {
                report.violations.push(format!(
                    "task {id} completed under fence {:?} at {} after fence {} ({}) was acquired at {}",
                    completion.fence, completion.at, newer.fence, newer.holder, newer.start
                ));
            }
        }
    }

    let tasks: Vec<TaskRow> =
        diesel::sql_query("SELECT id, status, idempotency_key, created_at FROM tasks ORDER BY id")
            .load(&mut tasks_conn)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    report.tasks = tasks.len();
    let generator_terms = terms.get("task-generator").cloned().unwrap_or_default();
    for task in &tasks {
        if all_final && !matches!(task.status.as_str(), "succeeded" | "dead" | "cancelled") {
            report
                .violations
                .push(format!("task {} ended the run {}", task.id, task.status));
        }
        let Some(fence) = task
            .idempotency_key
            .as_deref()
            .and_then(|key| key.strip_prefix("task-generator:"))
            .and_then(|rest| rest.split(':').next())
            .and_then(|fence| fence.parse::<i64>().ok())
        else {
            continue;
        };
        report.generated_tasks += 1;
        let within = generator_terms
            .iter()
            .any(|t| t.fence == fence && t.start <= task.created_at && task.created_at <= t.end);
        if !within {
            report.violations.push(format!(
                "task {} was generated under fence {fence} at {}, outside that fence's term",
                task.id, task.created_at
            ));
        }
    }
    report
}
