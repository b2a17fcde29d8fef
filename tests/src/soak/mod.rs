//! The soak: the whole stack as real processes on a private PostgreSQL, under load, with faults
//! injected on a seeded random schedule, then the invariant checker over the recorded history.
//!
//! The stack: two replicas each of lease-service and task-service behind round-robin proxies
//! ([`crate::proxy`]), three task-generator replicas, four or more workers, and a producer that
//! adds tasks of its own (some failing on purpose) next to the generator's. Every lease and
//! task change is recorded by the services' own triggers in the same transaction, so the
//! checker ([`crate::checker`]) judges what the databases committed, not what clients saw.
//!
//! The seed fixes the sequence of choices (which fault, which target, how long); the
//! processes' timing still differs between runs, so a replay reproduces the schedule, not
//! every interleaving.
//!
//! Run it long with `cargo run -p tests --bin soak -- --help` (after
//! `cargo build --workspace --bins`); `tests/tests/suite/soak.rs` runs the short CI mode.
//!
//! Layout: `options` says what to run; `stack` starts the processes and picks a fault's
//! targets; `faults` draws the schedule and injects each fault; `load` is the soak's own
//! producer and its operator's calls, the drain and the count of lost tasks; `summary` is what
//! a run found. This file holds the front door's tokens and [`run`].

mod failover;
mod faults;
mod load;
mod options;
mod stack;
mod summary;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinSet;

use crate::checker;
use faults::{Injection, draw_fault, draw_hold, inject};
use load::{OperatorCall, drain, missing_tasks, operator_until_ok, produce};
use stack::Stack;

pub use failover::{
    DATABASE_FAULTS, FailoverReport, FaultCost, Injected, inject as inject_database_fault,
    timeline as fault_timeline,
};
pub use faults::Fault;
pub use options::SoakOptions;
pub use summary::Summary;

/// Lease length of every lease in the soak (tasks, generator): short, so that pauses longer
/// than it are cheap to inject.
const TTL_SECONDS: f64 = 2.0;

/// The soak runs with the front door locked, as production would: every write carries a
/// bearer token with its role, and lease-service requires proof of holding (the lease's
/// secret) for renew and release.
mod tokens {
    /// task-service's token at lease-service.
    pub const SERVICE: &str = "soak-task-service-token-0001";
    /// The generators' one token: leaseholder at lease-service, producer at task-service.
    pub const GENERATOR: &str = "soak-generator-token-0001";
    pub const PRODUCER: &str = "soak-producer-token-0001";
    pub const WORKER: &str = "soak-worker-token-0001";
    pub const OPERATOR: &str = "soak-operator-token-0001";
}

/// A task-service client of `task_url` that sends `token` with every request.
fn client_with(task_url: &str, token: &str) -> leasehold::TaskClient {
    leasehold::TaskClient::new([task_url])
        .with_timeout(Duration::from_secs(2))
        .with_bearer_token(Some(token))
}

/// Runs a soak and returns its summary; it does not assert anything itself.
///
/// With `options.failovers`, the database is a pg_auto_failover formation and the faults are
/// that many failovers, kills and freezes of its primary ([`failover`]), one at a time.
pub async fn run(options: SoakOptions) -> Summary {
    let backing = if options.failovers > 0 {
        Some(failover::start_formation().await)
    } else {
        None
    };
    let stack = Stack::start(&options, backing.as_ref()).await;
    let mut rng = StdRng::seed_from_u64(options.seed);
    let task_url = stack.task_proxy.base_url();

    let settings = leasehold::generator::StartGenerator {
        rate_per_second: Some(f64::from(options.generator_rate)),
        min_sleep_seconds: Some(0.0),
        max_sleep_seconds: Some(1.0),
    };
    assert!(
        operator_until_ok(
            &task_url,
            &OperatorCall::Start(settings),
            Duration::from_secs(30)
        )
        .await,
        "the generator would not start"
    );
    assert!(
        operator_until_ok(&task_url, &OperatorCall::Limit, Duration::from_secs(30)).await,
        "the limited queue's limit would not be set"
    );
    let stop_producing = tokio_util::sync::CancellationToken::new();
    let producer = tokio::spawn(produce(
        task_url.clone(),
        options.producer_rate,
        options.seed,
        stop_producing.clone(),
    ));

    let probe = backing.as_ref().map(|_| {
        tokio::spawn(failover::probe(
            task_url.clone(),
            stack.lease_proxy.base_url(),
            stop_producing.clone(),
        ))
    });

    let mut faults: BTreeMap<Fault, usize> = BTreeMap::new();
    let mut fault_errors = Vec::new();
    let mut injected = Vec::new();
    if let Some(backing) = &backing {
        for fault in failover::schedule(&mut rng, options.failovers) {
            let hold = Duration::from_secs_f64(rng.random_range(0.5..3.0));
            match failover::inject(fault, &backing.formation, hold).await {
                Ok(done) => injected.push(done),
                Err(error) => fault_errors.push(error),
            }
            *faults.entry(fault).or_default() += 1;
        }
    }
    let mut running = JoinSet::new();
    let start = Instant::now();
    let mean = options.mean_fault_interval.as_secs_f64();
    while backing.is_none() && start.elapsed() < options.duration {
        // Exponential gaps: faults come in bursts and lulls, as they do.
        let gap = -mean * (1.0 - rng.random::<f64>()).ln();
        tokio::time::sleep(Duration::from_secs_f64(gap.min(mean * 10.0))).await;
        let fault = draw_fault(&mut rng);
        let pick = rng.random_range(0..16);
        let hold = draw_hold(fault, &mut rng);
        let Some(targets) = stack.claim(fault, pick) else {
            continue; // its targets are all in a fault already
        };
        *faults.entry(fault).or_default() += 1;
        running.spawn(inject(
            Injection {
                fault,
                targets,
                hold,
            },
            Arc::clone(&stack.postgres),
            Arc::clone(&stack.restart_gate),
        ));
        while let Some(done) = running.try_join_next() {
            record(done, &mut fault_errors);
        }
    }
    while let Some(done) = running.join_next().await {
        record(done, &mut fault_errors);
    }

    stop_producing.cancel();
    let mut produced = producer.await.unwrap_or_default();
    let ledger = match probe {
        Some(probe) => Some(probe.await.unwrap_or_default()),
        None => None,
    };
    if let Some(ledger) = &ledger {
        produced.extend(ledger.created.iter().cloned());
    }
    if !operator_until_ok(&task_url, &OperatorCall::Stop, Duration::from_secs(30)).await {
        fault_errors.push("the generator could not be stopped after the faults".to_owned());
    }
    let drained_in = drain(
        &task_url,
        options.drain_timeout,
        options.drain_timeout.max(options.duration),
    )
    .await;
    // What was left, should the drain run out: due work (too little capacity) or retries not
    // due yet (backoff longer than the drain) tell different stories.
    let left = match drained_in {
        Some(_) => None,
        None => Some(load::left_over(&stack.task_db).await),
    };
    // Every replica's pool works again, whether or not it was restarted after PostgreSQL was.
    for replica in stack.lease_replicas.iter().chain(&stack.task_replicas) {
        let replica = replica.lock().await;
        let ready = replica.get("/readyz").await;
        if ready.status != 200 {
            fault_errors.push(format!(
                "{} on port {} is not ready after the faults: {} {}",
                replica.name, replica.port, ready.status, ready.body
            ));
        }
    }
    let report = checker::check(&stack.lease_db, Some(&stack.task_db), true).await;
    let lost = missing_tasks(&stack.task_db, &produced).await;
    let by_exec = crate::query(
        &stack.task_db,
        "SELECT count(*) AS n FROM tasks WHERE status = 'succeeded' AND task_output->>'by' = 'sh'",
    )
    .await[0]["n"]
        .as_u64()
        .unwrap_or(0) as usize;
    let lost_at: Vec<(String, Instant)> = produced
        .iter()
        .filter(|created| lost.contains(&created.id))
        .map(|created| {
            (
                format!("create of task {} acknowledged", created.id),
                created.at,
            )
        })
        .collect();
    let failover = match &ledger {
        Some(ledger) => Some(FailoverReport {
            costs: failover::costs(&injected, ledger),
            acquired: ledger.acquired.len(),
            created: ledger.created.len(),
            claimed: ledger.claimed.len(),
            completed: ledger.completed.len(),
            missing: failover::missing_writes(&stack.lease_db, &stack.task_db, ledger).await,
            timeline: failover::timeline(&injected, &lost_at),
            early_healthy: match &backing {
                Some(backing) => backing.formation.lock().await.early_healthy_reports(),
                None => 0,
            },
        }),
        None => None,
    };
    let log_dir = crate::log_dir();
    let planted_bug = options.break_acquire;
    let mut summary = Summary {
        seed: options.seed,
        options,
        faults,
        fault_errors,
        produced: produced.len(),
        by_exec,
        lost,
        drained_in,
        left,
        report,
        failover,
        log_dir: log_dir.display().to_string(),
        story: Vec::new(),
    };
    // A failed run's logs are what tells its story: the services' would go with them as the
    // stack stops (the verdict is not a panic), the formation's with its directory. A run of a
    // planted bug is meant to fail: its logs tell nothing, and kept they would outlive a test
    // that passed.
    if !summary.passed() && !planted_bug {
        crate::keep_logs();
        if let Some(backing) = &backing {
            let formation = backing.formation.lock().await;
            formation.copy_logs_to(&log_dir);
            summary.story = story(formation.story(), &log_dir);
        }
    }
    drop(stack);
    summary
}

fn record(done: Result<Result<(), String>, tokio::task::JoinError>, errors: &mut Vec<String>) {
    match done {
        Ok(Ok(())) => {}
        Ok(Err(error)) => errors.push(error),
        Err(join) => errors.push(format!("a fault task failed: {join}")),
    }
}

/// The formation's story merged with the services' sessions (which node each opened a session
/// on, by the line `leasehold::server::database` logs), in time order by each line's first
/// `HH:MM:SS`.
fn story(formation: Vec<String>, log_dir: &std::path::Path) -> Vec<String> {
    const SESSION: &str = "database session opened on a writable node";
    let mut lines = formation;
    if let Ok(entries) = std::fs::read_dir(log_dir) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !(name.starts_with("lease-service") || name.starts_with("task-service")) {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(entry.path()) else {
                continue;
            };
            let service = name.trim_end_matches(".log");
            // A service opens sessions all the time: only a move to another node or timeline
            // is part of the story.
            let mut last = "";
            for line in text.lines().filter(|line| line.contains(SESSION)) {
                let node = line.find("host=").map_or("", |at| &line[at..]);
                if node != last {
                    lines.push(format!("{service} {} session on {node}", clock_of(line)));
                    last = node;
                }
            }
        }
    }
    lines.sort_by_key(|line| clock_of(line).to_owned());
    lines
}

/// The first `HH:MM:SS` in `line`, or "" when it has none.
fn clock_of(line: &str) -> &str {
    let bytes = line.as_bytes();
    (0..bytes.len().saturating_sub(7))
        .find(|&i| {
            let b = &bytes[i..i + 8];
            b[2] == b':'
                && b[5] == b':'
                && [0, 1, 3, 4, 6, 7].iter().all(|&j| b[j].is_ascii_digit())
        })
        .map_or("", |i| &line[i..i + 8])
}

#[cfg(test)]
mod tests {
    use super::clock_of;

    #[test]
    fn a_lines_clock_is_its_first_hh_mm_ss_in_either_log_format() {
        assert_eq!(
            clock_of("node1 06:49:16 2122 INFO  FSM transition"),
            "06:49:16"
        );
        assert_eq!(
            clock_of("lease-service-1 2026-11-28T06:49:16.123Z  INFO opened"),
            "06:49:16"
        );
        assert_eq!(clock_of("no clock 12:3 here"), "");
    }
}
