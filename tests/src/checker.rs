//! The invariant checker: proves from the history the services record (`lease_events`, written
//! by a trigger, and `task_events`, written by each transition's own statement; both in the same
//! transaction as the change they record) that a run kept
//! The invariants of `docs/src/design.md`. It reports every violation with its evidence rather than stopping at the
//! first. Both databases must share one server (one clock), as they do in the tests.

use std::collections::BTreeMap;
use std::fmt;

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

/// The invariants the checker proves, in the words of `docs/src/design.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Invariant {
    /// Every new acquisition of a resource has a greater fence than the one before.
    FencesRise,
    /// Renewals and releases keep the fence and the holder of the acquisition they belong to.
    OneHolderPerFence,
    /// No two holders' lease intervals overlap on one resource.
    Exclusive,
    /// No task was completed twice.
    AtMostOneCompletion,
    /// A completion comes from the worker (and fence) of the task's last claim.
    CompletedByItsClaimant,
    /// No task was completed under a lease that a newer acquisition had superseded.
    NotSuperseded,
    /// Every task reached a terminal state (when the run asked for it).
    AllFinal,
    /// No generator produced outside its own term of the generator lease.
    OneGenerator,
    /// At no instant were more tasks of a limited queue running than its concurrency limit.
    QueueConcurrency,
    /// No window of time held more starts of a rate-limited queue than its rate allows.
    QueueRate,
    /// At no instant were more tasks of one concurrency key running than its queue's limit per
    /// key.
    KeyConcurrency,
}

impl Invariant {
    pub const ALL: [Invariant; 11] = [
        Invariant::FencesRise,
        Invariant::OneHolderPerFence,
        Invariant::Exclusive,
        Invariant::AtMostOneCompletion,
        Invariant::CompletedByItsClaimant,
        Invariant::NotSuperseded,
        Invariant::AllFinal,
        Invariant::OneGenerator,
        Invariant::QueueConcurrency,
        Invariant::QueueRate,
        Invariant::KeyConcurrency,
    ];

    /// What the invariant says, and what its count in [`Report::checked`] counts.
    pub fn describe(self) -> &'static str {
        match self {
            Self::FencesRise => "fences only rise (acquisitions)",
            Self::OneHolderPerFence => "one holder per fence (renewals and releases)",
            Self::Exclusive => "no overlapping terms on a resource (consecutive terms)",
            Self::AtMostOneCompletion => "no task completed twice (tasks)",
            Self::CompletedByItsClaimant => "completed by its last claimant (completions)",
            Self::NotSuperseded => "no completion under a superseded lease (completions)",
            Self::AllFinal => "every task terminal after the faults (tasks)",
            Self::OneGenerator => "no generator output outside its term (generated tasks)",
            Self::QueueConcurrency => "no more running than a queue's limit (claims)",
            Self::QueueRate => "no more starts than a queue's rate allows (claims)",
            Self::KeyConcurrency => "no more running of one key than its limit (claims)",
        }
    }
}

/// One broken invariant, with the evidence from the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub invariant: Invariant,
    pub evidence: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.invariant, self.evidence)
    }
}

/// What a check looked at, and what it found.
#[derive(Debug, Default)]
pub struct Report {
    pub lease_events: usize,
    pub terms: usize,
    pub task_events: usize,
    pub tasks: usize,
    pub generated_tasks: usize,
    /// Tasks per status at the end of the run.
    pub tasks_by_status: BTreeMap<String, usize>,
    /// Per invariant, how many cases it was checked over.
    pub checked: BTreeMap<Invariant, usize>,
    /// Per limited queue, and per key of a key-limited queue (as `queue[key]`), the most of its
    /// tasks running at one instant.
    pub busiest: BTreeMap<String, i64>,
    pub violations: Vec<Violation>,
}

impl Report {
    fn checked(&mut self, invariant: Invariant) {
        *self.checked.entry(invariant).or_default() += 1;
    }

    fn violated(&mut self, invariant: Invariant, evidence: String) {
        self.violations.push(Violation {
            invariant,
            evidence,
        });
    }

    /// The violations of one invariant.
    pub fn violations_of(&self, invariant: Invariant) -> impl Iterator<Item = &Violation> {
        self.violations
            .iter()
            .filter(move |v| v.invariant == invariant)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "history: {} lease events, {} terms, {} task events, {} tasks ({} generated)",
            self.lease_events, self.terms, self.task_events, self.tasks, self.generated_tasks
        )?;
        for invariant in Invariant::ALL {
            let Some(cases) = self.checked.get(&invariant) else {
                continue;
            };
            let broken = self.violations_of(invariant).count();
            let verdict = if broken == 0 {
                "ok".to_owned()
            } else {
                format!("VIOLATED {broken} times")
            };
            writeln!(f, "  {:<62} {cases:>7}  {verdict}", invariant.describe())?;
        }
        // The first few show what broke (each invariant's count is above); hundreds would push
        // the rest of a report out of what CI shows.
        const SHOWN: usize = 30;
        for violation in self.violations.iter().take(SHOWN) {
            writeln!(f, "  violation: {violation}")?;
        }
        if self.violations.len() > SHOWN {
            writeln!(
                f,
                "  ... and {} more violations",
                self.violations.len() - SHOWN
            )?;
        }
        Ok(())
    }
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
    /// The task's own fence (its claim counter).
    #[diesel(sql_type = Nullable<BigInt>)]
    fence: Option<i64>,
    /// The fence of the lease that covered the claim.
    #[diesel(sql_type = Nullable<BigInt>)]
    lease_fence: Option<i64>,
    /// The shared lease that covered the claim (a worker process's); none: the task's own.
    #[diesel(sql_type = Nullable<Text>)]
    lease_resource: Option<String>,
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
fn terms(events: &[LeaseEvent], report: &mut Report) -> BTreeMap<String, Vec<Term>> {
    let mut by_resource: BTreeMap<String, Vec<Term>> = BTreeMap::new();
    for event in events {
        let terms = by_resource.entry(event.resource.clone()).or_default();
        if event.kind == "acquired" {
            report.checked(Invariant::FencesRise);
            if let Some(last) = terms.last()
                && event.fence <= last.fence
            {
                report.violated(
                    Invariant::FencesRise,
                    format!(
                        "fence did not rise on {}: {} (holder {}) acquired after {} (holder {})",
                        event.resource, event.fence, event.holder, last.fence, last.holder
                    ),
                );
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
        report.checked(Invariant::OneHolderPerFence);
        match terms.iter_mut().rev().find(|t| t.fence == event.fence) {
            Some(term) if term.holder == event.holder => {
                term.end = event.released_at.unwrap_or(event.expires_at);
            }
            Some(term) => {
                let evidence = format!(
                    "fence {} on {} changed holder from {} to {}",
                    event.fence, event.resource, term.holder, event.holder
                );
                report.violated(Invariant::OneHolderPerFence, evidence);
            }
            None => report.violated(
                Invariant::OneHolderPerFence,
                format!(
                    "{} of fence {} on {} that was never acquired",
                    event.kind, event.fence, event.resource
                ),
            ),
        }
    }
    by_resource
}

/// "No two holders' lease intervals overlap on one resource."
fn check_exclusive(terms: &BTreeMap<String, Vec<Term>>, report: &mut Report) {
    for list in terms.values() {
        for pair in list.windows(2) {
            let (earlier, later) = (&pair[0], &pair[1]);
            report.checked(Invariant::Exclusive);
            if later.start < earlier.end {
                report.violated(Invariant::Exclusive, format!(
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
    let terms = terms(&events, &mut report);
    report.terms = terms.values().map(Vec::len).sum();
    check_exclusive(&terms, &mut report);

    let Some(task_db) = task_db else {
        return report;
    };
    let mut tasks_conn = AsyncPgConnection::establish(task_db)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let task_events: Vec<TaskEvent> = diesel::sql_query(
        "SELECT at, task_id, to_status, processor, fence, lease_fence, lease_resource
         FROM task_transitions ORDER BY id, ord",
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
        report.checked(Invariant::AtMostOneCompletion);
        if completions.len() > 1 {
            report.violated(
                Invariant::AtMostOneCompletion,
                format!("task {id} was completed {} times", completions.len()),
            );
        }
        for completion in completions {
            report.checked(Invariant::CompletedByItsClaimant);
            report.checked(Invariant::NotSuperseded);
            let claim = events
                .iter()
                .rfind(|e| e.to_status == "running" && e.at <= completion.at);
            let Some(claim) = claim else {
                report.violated(
                    Invariant::CompletedByItsClaimant,
                    format!("task {id} completed without a claim"),
                );
                continue;
            };
            if claim.fence != completion.fence || claim.processor != completion.processor {
                report.violated(Invariant::CompletedByItsClaimant, format!(
                    "task {id} completed by {:?} under fence {:?}, but its last claim was {:?} under {:?}",
                    completion.processor, completion.fence, claim.processor, claim.fence
                ));
            }
            // Superseded: a newer lease on the resource that covered the claim (the task's own,
            // or its worker process's) had been acquired before the completion.
            let covering = completion
                .lease_resource
                .clone()
                .unwrap_or_else(|| format!("task:{id}"));
            if let Some(newer) = terms.get(&covering).and_then(|list| {
                list.iter()
                    .find(|t| Some(t.fence) > completion.lease_fence && t.start < completion.at)
            }) {
                report.violated(Invariant::NotSuperseded, format!(
                    "task {id} completed under {covering} fence {:?} at {} after fence {} ({}) was acquired at {}",
                    completion.lease_fence, completion.at, newer.fence, newer.holder, newer.start
                ));
            }
        }
    }

    let queue_limits = "SELECT t.id, t.queue AS slot, q.concurrency_limit::bigint AS most
         FROM tasks t JOIN queues q USING (queue) WHERE q.concurrency_limit IS NOT NULL";
    let key_limits = "SELECT t.id, t.queue || '[' || t.concurrency_key || ']' AS slot,
                q.key_concurrency_limit::bigint AS most
         FROM tasks t JOIN queues q USING (queue)
         WHERE q.key_concurrency_limit IS NOT NULL AND t.concurrency_key IS NOT NULL";
    for (invariant, limited) in [
        (Invariant::QueueConcurrency, queue_limits),
        (Invariant::KeyConcurrency, key_limits),
    ] {
        let limited: Vec<LimitedTask> = diesel::sql_query(limited)
            .load(&mut tasks_conn)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        check_running_limits(invariant, &limited, &by_task, &terms, &mut report);
    }
    check_queue_rates(&mut tasks_conn, &by_task, &mut report).await;

    let tasks: Vec<TaskRow> =
        diesel::sql_query("SELECT id, status, idempotency_key, created_at FROM tasks ORDER BY id")
            .load(&mut tasks_conn)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    report.tasks = tasks.len();
    let generator_terms = terms.get("task-generator").cloned().unwrap_or_default();
    for task in &tasks {
        *report
            .tasks_by_status
            .entry(task.status.clone())
            .or_default() += 1;
        if all_final {
            report.checked(Invariant::AllFinal);
            if !matches!(task.status.as_str(), "succeeded" | "dead" | "cancelled") {
                report.violated(
                    Invariant::AllFinal,
                    format!("task {} ended the run {}", task.id, task.status),
                );
            }
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
        report.checked(Invariant::OneGenerator);
        let within = generator_terms
            .iter()
            .any(|t| t.fence == fence && t.start <= task.created_at && task.created_at <= t.end);
        if !within {
            report.violated(
                Invariant::OneGenerator,
                format!(
                    "task {} was generated under fence {fence} at {}, outside that fence's term",
                    task.id, task.created_at
                ),
            );
        }
    }
    report
}

/// A task held by a concurrency limit: the slots it takes one of (a queue's, or a key's), and
/// how many there are.
#[derive(QueryableByName)]
struct LimitedTask {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    slot: String,
    #[diesel(sql_type = BigInt)]
    most: i64,
}

/// "No instant with more than N running tasks of a queue (or a key) limited to N", over the
/// limits set at the end of the run. Each claim runs from its lease's acquisition, if it took a
/// lease of its own (lease-service records it during the claim's transaction, after the claim
/// counted the running tasks), or else from the start the claim recorded, until
/// the task's next transition (its completion, failure, snooze, cancellation or next claim, at
/// that transaction's `now()`, which is before its commit): so a correct claim, which counts
/// only committed transitions, never starts an interval before the one whose slot it took ended.
fn check_running_limits(
    invariant: Invariant,
    limited: &[LimitedTask],
    by_task: &BTreeMap<i64, Vec<&TaskEvent>>,
    terms: &BTreeMap<String, Vec<Term>>,
    report: &mut Report,
) {
    // Per slot: its limit, and every claim's (time, +1, task) start and (time, -1, task) end.
    type Points = Vec<(DateTime<Utc>, i64, i64)>;
    let mut slots: BTreeMap<&str, (i64, Points)> = BTreeMap::new();
    for task in limited {
        let Some(events) = by_task.get(&task.id) else {
            continue;
        };
        let leases = terms.get(&format!("task:{}", task.id));
        let entry = slots
            .entry(task.slot.as_str())
            .or_insert_with(|| (task.most, Vec::new()));
        for (index, claim) in events.iter().enumerate() {
            if claim.to_status != "running" {
                continue;
            }
            report.checked(invariant);
            // Only a claim under the task's own lease started with one of the task's terms: a
            // worker process's lease has fences of its own, which the task's may share.
            let start = leases
                .filter(|_| claim.lease_resource.is_none())
                .and_then(|list| list.iter().find(|t| Some(t.fence) == claim.lease_fence))
                .map_or(claim.at, |t| t.start);
            entry.1.push((start, 1, task.id));
            if let Some(next) = events.get(index + 1) {
                entry.1.push((next.at, -1, task.id));
            }
        }
    }
    for (slot, (limit, mut points)) in slots {
        // Ends before starts at one instant: a slot freed and taken at once is not two.
        points.sort_by_key(|(at, delta, _)| (*at, *delta));
        let (mut running, mut most) = (0i64, 0i64);
        for (at, delta, task) in points {
            running += delta;
            if running > most {
                most = running;
            }
            if delta > 0 && running > limit {
                report.violated(
                    invariant,
                    format!(
                        "{slot:?} (limit {limit}) had {running} tasks running at {at}, \
                         when task {task} started"
                    ),
                );
            }
        }
        report.busiest.insert(slot.to_owned(), most);
    }
}

#[derive(QueryableByName)]
struct PacedTask {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    queue: String,
    #[diesel(sql_type = diesel::sql_types::Double)]
    per_second: f64,
    #[diesel(sql_type = BigInt)]
    burst: i64,
}

/// "No window with more starts than the rate allows", over the rates set at the end of the run:
/// for any two claims of a rate-limited queue, the claims from the one to the other (both
/// counted) are at most `burst + per_second × the time between them`, by the starts the history
/// records (for a rate-limited queue, the moment each claim read the bucket, after it was
/// granted the queue's lock: the clock the bucket is kept by).
async fn check_queue_rates(
    conn: &mut AsyncPgConnection,
    by_task: &BTreeMap<i64, Vec<&TaskEvent>>,
    report: &mut Report,
) {
    let paced: Vec<PacedTask> = diesel::sql_query(
        "SELECT t.id, t.queue, q.rate_per_second AS per_second, q.rate_burst::bigint AS burst
         FROM tasks t JOIN queues q USING (queue) WHERE q.rate_per_second IS NOT NULL",
    )
    .load(conn)
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let mut starts: BTreeMap<&str, (f64, i64, Vec<DateTime<Utc>>)> = BTreeMap::new();
    for task in &paced {
        let entry = starts
            .entry(task.queue.as_str())
            .or_insert_with(|| (task.per_second, task.burst, Vec::new()));
        for event in by_task.get(&task.id).into_iter().flatten() {
            if event.to_status == "running" {
                report.checked(Invariant::QueueRate);
                entry.2.push(event.at);
            }
        }
    }
    for (queue, (per_second, burst, mut times)) in starts {
        times.sort();
        let mut reported = false;
        for first in 0..times.len() {
            for last in first..times.len() {
                let seconds = (times[last] - times[first]).as_seconds_f64();
                #[allow(clippy::cast_precision_loss)]
                let (count, allowed) = (
                    (last - first + 1) as f64,
                    burst as f64 + per_second * seconds,
                );
                if allowed >= times.len() as f64 {
                    break;
                }
                if count > allowed + 1e-6 && !reported {
                    reported = true;
                    report.violated(
                        Invariant::QueueRate,
                        format!(
                            "queue {queue:?} ({per_second}/s, burst {burst}) started {count} tasks \
                             from {} to {}, where {allowed:.2} were allowed",
                            times[first], times[last]
                        ),
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + second, 0).unwrap_or_default()
    }

    fn event(second: i64, task_id: i64, to_status: &str, lease: Option<(&str, i64)>) -> TaskEvent {
        TaskEvent {
            at: at(second),
            task_id,
            to_status: to_status.to_owned(),
            processor: Some("w".to_owned()),
            fence: None,
            lease_fence: lease.map(|(_, fence)| fence),
            lease_resource: lease
                .map(|(resource, _)| resource.to_owned())
                .filter(|resource| !resource.starts_with("task:")),
        }
    }

    /// Task 1 runs under its own lease (fence 1) from 0 to 1, task 2 from 2 to 4, and task 1
    /// again from 5, under its worker process's lease, whose fence is 1 too: never two at once.
    /// Matching that claim to task 1's own term of fence 1 made it start at 0, and the checker
    /// found two running at 2 (as it once did in the full suite, under load).
    #[test]
    fn a_claim_under_a_process_lease_is_not_timed_by_the_task_lease_of_the_same_fence() {
        let events = [
            event(0, 1, "running", Some(("task:1", 1))),
            event(1, 1, "pending", None),
            event(2, 2, "running", Some(("task:2", 1))),
            event(4, 2, "succeeded", None),
            event(5, 1, "running", Some(("worker:w", 1))),
            event(6, 1, "succeeded", None),
        ];
        let mut by_task: BTreeMap<i64, Vec<&TaskEvent>> = BTreeMap::new();
        for event in &events {
            by_task.entry(event.task_id).or_default().push(event);
        }
        let term = |task: i64, start: i64| Term {
            resource: format!("task:{task}"),
            holder: "w".to_owned(),
            fence: 1,
            start: at(start),
            end: at(start + 1),
        };
        let terms = BTreeMap::from([
            ("task:1".to_owned(), vec![term(1, 0)]),
            ("task:2".to_owned(), vec![term(2, 2)]),
        ]);
        let limited: Vec<LimitedTask> = [1, 2]
            .into_iter()
            .map(|id| LimitedTask {
                id,
                slot: "q".to_owned(),
                most: 1,
            })
            .collect();
        let mut report = Report::default();
        check_running_limits(
            Invariant::QueueConcurrency,
            &limited,
            &by_task,
            &terms,
            &mut report,
        );
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        assert_eq!(report.busiest["q"], 1);
    }
}
