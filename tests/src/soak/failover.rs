//! The failover soak: the whole stack on a pg_auto_failover formation (monitor, primary,
//! synchronous secondary) instead of one server, under load, while the primary is failed over,
//! killed, frozen, and brought back as a secondary; then the soak's checks, and a ledger of what
//! the services acknowledged, held against what the new primary has.
//!
//! The ledger is the soak's own client ([`probe`]): it acquires and releases leases, and creates,
//! claims and completes tasks of a queue of its own, recording each write it was told succeeded.
//! A lost acknowledged write shows as a ledger entry missing from the history tables, which
//! the services' triggers write in the same transaction as the change.
//!
//! Faults come one at a time, each only once the formation is healthy again, in a seeded order.
//! For each it measures how long after the promotion (the monitor reporting the other node
//! primary) the ledger's acquisitions succeeded again: the unavailability `docs/src/failover.md` quotes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold::LeaseClient;
use leasehold::api::Proof;
use leasehold::tasks::CreateTask;
use leasehold_local::postgres::formation::Formation;
use leasehold_local::process::signal_tree;
use nix::sys::signal::Signal;
use rand::Rng;
use rand::rngs::StdRng;
use serde_json::json;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::load::Created;
use super::{Fault, client_with, tokens};

/// The ledger's queue: tasks the soak creates, claims and completes itself (a worker may take
/// some first; then they are simply not the ledger's).
const LEDGER_QUEUE: &str = "ledger";
const LEDGER_HOLDER: &str = "ledger";
const LEDGER_WORKER: &str = "ledger-prober";
/// Clients writing at once: a write lost in a failover is one in flight as the primary goes,
/// so the more in flight, the likelier a flaw shows.
const LEDGER_CLIENTS: usize = 3;

/// The database faults, one of which each injection draws.
pub const DATABASE_FAULTS: [Fault; 3] = [Fault::Failover, Fault::PrimaryKill, Fault::PrimaryFreeze];

/// What the services acknowledged to the ledger, and when its acquisitions failed.
#[derive(Debug, Default)]
pub struct Ledger {
    /// `(resource, fence)` of each acknowledged acquisition.
    pub acquired: Vec<(String, i64)>,
    pub created: Vec<Created>,
    /// `(task, fence)` of each acknowledged claim and completion.
    pub claimed: Vec<(i64, Option<i64>)>,
    pub completed: Vec<(i64, Option<i64>)>,
    /// When each acquisition's answer came, and whether it succeeded.
    samples: Vec<(Instant, bool)>,
}

/// One injected database fault and what it cost.
#[derive(Debug, Clone)]
pub struct FaultCost {
    pub fault: Fault,
    /// From the injection to the monitor reporting the other node primary.
    pub promotion: Duration,
    /// From the promotion to the ledger's first successful acquisition after it: what a client
    /// waits once the formation has done its part.
    pub after_promotion: Duration,
    /// Failed acquisitions in a row around this fault.
    pub outage: Duration,
}

/// What the ledger found missing, and what each fault cost.
#[derive(Debug, Default)]
pub struct FailoverReport {
    pub costs: Vec<FaultCost>,
    pub acquired: usize,
    pub created: usize,
    pub claimed: usize,
    pub completed: usize,
    /// Acknowledged writes the tables do not have, described.
    pub missing: Vec<String>,
    /// How often the monitor called the formation healthy before its standby was synchronous
    /// and caught up (the soak then waited for that too).
    pub early_healthy: usize,
    /// Each fault's injection and promotion, and each lost create's acknowledgement, in seconds
    /// from the first fault: to tell which fault lost a write.
    pub timeline: Vec<String>,
}

impl FailoverReport {
    /// p50 and maximum of the unavailability after promotion.
    pub fn after_promotion_p50_max(&self) -> (Duration, Duration) {
        let mut all: Vec<Duration> = self.costs.iter().map(|c| c.after_promotion).collect();
        all.sort();
        if all.is_empty() {
            return (Duration::ZERO, Duration::ZERO);
        }
        (all[all.len() / 2], all[all.len() - 1])
    }
}

impl std::fmt::Display for FailoverReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "ledger: {} acquisitions, {} creates, {} claims, {} completions acknowledged",
            self.acquired, self.created, self.claimed, self.completed
        )?;
        for event in &self.timeline {
            writeln!(f, "  {event}")?;
        }
        if self.missing.is_empty() {
            writeln!(f, "every acknowledged write is on the surviving primary")?;
        } else {
            // The first few say what was lost; hundreds would push the rest of the report out
            // of what CI shows.
            const SHOWN: usize = 20;
            writeln!(f, "LOST {} acknowledged writes:", self.missing.len())?;
            for missing in self.missing.iter().take(SHOWN) {
                writeln!(f, "  {missing}")?;
            }
            if self.missing.len() > SHOWN {
                writeln!(f, "  ... and {} more", self.missing.len() - SHOWN)?;
            }
        }
        writeln!(
            f,
            "  {:<16} {:>10} {:>16} {:>10}",
            "fault", "promotion", "after promotion", "outage"
        )?;
        for cost in &self.costs {
            writeln!(
                f,
                "  {:<16} {:>9.1}s {:>15.1}s {:>9.1}s",
                format!("{:?}", cost.fault),
                cost.promotion.as_secs_f64(),
                cost.after_promotion.as_secs_f64(),
                cost.outage.as_secs_f64()
            )?;
        }
        writeln!(
            f,
            "the monitor called the formation healthy {} times before its standby was \
             synchronous and caught up",
            self.early_healthy
        )?;
        let (p50, max) = self.after_promotion_p50_max();
        writeln!(
            f,
            "unavailable after promotion: p50 {:.1}s, max {:.1}s over {} faults",
            p50.as_secs_f64(),
            max.as_secs_f64(),
            self.costs.len()
        )
    }
}

/// The formation and its two databases, as the stack's services reach them.
pub(super) struct Backing {
    pub(super) formation: Arc<Mutex<Formation>>,
    pub(super) lease_db: String,
    pub(super) task_db: String,
}

/// Starts a formation with the `leases` and `tasks` databases.
pub(super) async fn start_formation() -> Backing {
    let formation = Formation::start("leases")
        .await
        .unwrap_or_else(|err| panic!("cannot start the pg_auto_failover formation: {err}"));
    formation
        .create_database("tasks")
        .await
        .unwrap_or_else(|err| panic!("cannot create the tasks database: {err}"));
    Backing {
        lease_db: formation.url("leases"),
        task_db: formation.url("tasks"),
        formation: Arc::new(Mutex::new(formation)),
    }
}

/// The ledger's clients, [`LEDGER_CLIENTS`] of them at once, until `stop`; their ledgers merged.
pub(super) async fn probe(task_url: String, lease_url: String, stop: CancellationToken) -> Ledger {
    let clients: Vec<_> = (0..LEDGER_CLIENTS)
        .map(|client| {
            tokio::spawn(ledger_client(
                client,
                task_url.clone(),
                lease_url.clone(),
                stop.clone(),
            ))
        })
        .collect();
    let mut ledger = Ledger::default();
    for client in clients {
        let one = client.await.unwrap_or_default();
        ledger.acquired.extend(one.acquired);
        ledger.created.extend(one.created);
        ledger.claimed.extend(one.claimed);
        ledger.completed.extend(one.completed);
        ledger.samples.extend(one.samples);
    }
    ledger.samples.sort_by_key(|(when, _)| *when);
    ledger
}

/// One ledger client: one lease acquisition and release and one task's create, claim and
/// completion at a time, as fast as they are answered.
async fn ledger_client(
    client: usize,
    task_url: String,
    lease_url: String,
    stop: CancellationToken,
) -> Ledger {
    let leases = LeaseClient::new(lease_url)
        .with_timeout(Duration::from_secs(3))
        .with_bearer_token(Some(tokens::GENERATOR));
    let producer = client_with(&task_url, tokens::PRODUCER);
    let worker = client_with(&task_url, tokens::WORKER);
    let mut ledger = Ledger::default();
    let mut round = 0u64;
    while !stop.is_cancelled() {
        round += 1;
        let resource = format!("ledger-{client}-{}", round % 4);
        let acquired = leases
            .acquire(&resource, LEDGER_HOLDER, Some(Duration::from_secs(10)))
            .await;
        ledger.samples.push((Instant::now(), acquired.is_ok()));
        if let Ok(lease) = acquired {
            ledger.acquired.push((resource.clone(), lease.fence));
            let secret = lease.secret.as_ref().map(|s| s.expose().to_owned());
            let proof = Proof {
                fence: Some(lease.fence),
                secret: secret.as_deref(),
            };
            // A release that fails leaves the lease to lapse; the next round takes another.
            let _ = leases.release(&resource, LEDGER_HOLDER, proof).await;
        }
        let nonce = Created::nonce(&format!("ledger-{client}"), ledger.created.len());
        let task = CreateTask {
            task_data: json!({"sleep_duration_seconds": 0, "nonce": nonce}),
            queue: Some(LEDGER_QUEUE.to_owned()),
            ..CreateTask::default()
        };
        if let Ok(created) = producer.create(&task).await {
            ledger.created.push(Created {
                id: created.task().id,
                nonce,
                at: Instant::now(),
            });
        }
        if let Ok(claimed) = worker.claim(LEDGER_WORKER, Some(LEDGER_QUEUE), None).await {
            for task in claimed {
                ledger.claimed.push((task.id, task.fence));
                let done = worker
                    .complete(task.id, LEDGER_WORKER, task.fence, json!({"ledger": true}))
                    .await;
                if done.is_ok() {
                    ledger.completed.push((task.id, task.fence));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ledger
}

/// When a fault was injected and when the other node was promoted.
#[derive(Debug)]
pub struct Injected {
    fault: Fault,
    injected: Instant,
    /// The injection's wall-clock time, to match against the logs' (`HH:MM:SS.mmm`, local).
    wall: String,
    promoted: Instant,
    healthy: Instant,
}

/// Injects `fault` on the current primary, waits for the promotion, brings the old primary back
/// after `hold`, and waits until the formation is healthy again.
pub async fn inject(
    fault: Fault,
    formation: &Mutex<Formation>,
    hold: Duration,
) -> Result<Injected, String> {
    let mut formation = formation.lock().await;
    let old = formation
        .wait_healthy(Duration::from_secs(120))
        .await
        .map_err(|err| err.to_string())?;
    let root = formation
        .node_pid(old)
        .ok_or("the primary is not running")?;
    let injected = Instant::now();
    let wall = chrono::Local::now().format("%H:%M:%S%.3f").to_string();
    match fault {
        Fault::Failover => {
            let result = tokio::task::block_in_place(|| formation.perform_failover());
            result.map_err(|err| err.to_string())?;
        }
        // pg_autoctl and PostgreSQL together, as a crash of the machine would.
        Fault::PrimaryKill => formation.kill(old),
        Fault::PrimaryFreeze => signal_tree(root, Signal::SIGSTOP),
        other => return Err(format!("{other:?} is not a database fault")),
    }
    let promoted_state = |state: &str| state == "primary" || state == "wait_primary";
    formation
        .wait_until(
            Duration::from_secs(120),
            "the other node's promotion",
            |states| {
                states.iter().enumerate().any(|(i, s)| {
                    i != old && promoted_state(&s.reported) && promoted_state(&s.assigned)
                })
            },
        )
        .await
        .map_err(|err| {
            signal_tree(root, Signal::SIGCONT);
            err.to_string()
        })?;
    let promoted = Instant::now();
    tokio::time::sleep(hold).await;
    match fault {
        Fault::PrimaryKill => formation.restart(old).map_err(|err| err.to_string())?,
        Fault::PrimaryFreeze => signal_tree(root, Signal::SIGCONT),
        _ => {}
    }
    // The old primary rejoins as the new one's secondary.
    formation
        .wait_healthy(Duration::from_secs(180))
        .await
        .map_err(|err| format!("after {fault:?}: {err}"))?;
    Ok(Injected {
        fault,
        injected,
        wall,
        promoted,
        healthy: Instant::now(),
    })
}

/// The order of `count` database faults: every kind once in each run of three, in a seeded
/// order within it.
pub(super) fn schedule(rng: &mut StdRng, count: usize) -> Vec<Fault> {
    let mut order = Vec::with_capacity(count);
    while order.len() < count {
        let mut kinds = DATABASE_FAULTS;
        for i in (1..kinds.len()).rev() {
            kinds.swap(i, rng.random_range(0..=i));
        }
        order.extend(kinds);
    }
    order.truncate(count);
    order
}

/// The faults and the lost writes (each said by its label) on one time line, from the first
/// fault; empty when nothing was lost.
pub fn timeline(injected: &[Injected], lost: &[(String, Instant)]) -> Vec<String> {
    let Some(start) = injected.first().map(|f| f.injected) else {
        return Vec::new();
    };
    let at = |when: Instant| {
        if when >= start {
            format!("+{:.2}s", (when - start).as_secs_f64())
        } else {
            format!("-{:.2}s", (start - when).as_secs_f64())
        }
    };
    let mut events: Vec<(Instant, String)> = Vec::new();
    for fault in injected {
        events.push((
            fault.injected,
            format!(
                "{} {:?} injected (at {})",
                at(fault.injected),
                fault.fault,
                fault.wall
            ),
        ));
        events.push((
            fault.promoted,
            format!(
                "{} {:?}: other node promoted",
                at(fault.promoted),
                fault.fault
            ),
        ));
        events.push((
            fault.healthy,
            format!("{} {:?}: healthy again", at(fault.healthy), fault.fault),
        ));
    }
    if lost.is_empty() {
        return Vec::new();
    }
    for (what, when) in lost {
        events.push((*when, format!("{} {what} (LOST)", at(*when))));
    }
    events.sort_by_key(|(when, _)| *when);
    events.into_iter().map(|(_, text)| text).collect()
}

/// What each injection cost, from the ledger's samples.
pub(super) fn costs(injected: &[Injected], ledger: &Ledger) -> Vec<FaultCost> {
    injected
        .iter()
        .map(|fault| {
            let first_ok_after = |at: Instant| {
                ledger
                    .samples
                    .iter()
                    .find(|(when, ok)| *when >= at && *ok)
                    .map(|(when, _)| *when)
            };
            let after_promotion = first_ok_after(fault.promoted)
                .map_or(Duration::MAX, |ok| ok.duration_since(fault.promoted));
            // The first failure after the injection, to the first success after that.
            let outage = ledger
                .samples
                .iter()
                .find(|(when, ok)| *when >= fault.injected && !ok)
                .and_then(|(failed, _)| first_ok_after(*failed).map(|ok| ok - *failed))
                .unwrap_or(Duration::ZERO);
            FaultCost {
                fault: fault.fault,
                promotion: fault.promoted - fault.injected,
                after_promotion,
                outage,
            }
        })
        .collect()
}

/// The ledger's acknowledged writes that the history tables lack.
pub(super) async fn missing_writes(lease_db: &str, task_db: &str, ledger: &Ledger) -> Vec<String> {
    let leases = crate::query(
        lease_db,
        &format!("SELECT resource, fence FROM lease_events WHERE holder = '{LEDGER_HOLDER}'"),
    )
    .await;
    let acquired: std::collections::HashSet<(String, i64)> = leases
        .iter()
        .map(|row| {
            (
                row["resource"].as_str().unwrap_or_default().to_owned(),
                row["fence"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    let events = crate::query(
        task_db,
        &format!(
            "SELECT task_id, fence, to_status FROM task_transitions WHERE processor = '{LEDGER_WORKER}'"
        ),
    )
    .await;
    let has = |id: i64, fence: Option<i64>, status: &str| {
        events.iter().any(|row| {
            row["task_id"].as_i64() == Some(id)
                && row["fence"].as_i64() == fence
                && row["to_status"].as_str() == Some(status)
        })
    };
    let mut missing = Vec::new();
    for (resource, fence) in &ledger.acquired {
        if !acquired.contains(&(resource.clone(), *fence)) {
            missing.push(format!("acquisition of {resource} with fence {fence}"));
        }
    }
    for (id, fence) in &ledger.claimed {
        if !has(*id, *fence, "running") {
            missing.push(format!("claim of task {id} with fence {fence:?}"));
        }
    }
    for (id, fence) in &ledger.completed {
        if !has(*id, *fence, "succeeded") {
            missing.push(format!("completion of task {id} with fence {fence:?}"));
        }
    }
    missing
}
