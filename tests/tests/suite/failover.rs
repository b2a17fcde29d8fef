//! The failover soak in its CI mode: the whole stack on a pg_auto_failover formation under the
//! CI soak's load, while its primary is failed over, killed with kill -9, and frozen with
//! SIGSTOP past the failover timeout, each once and in a seeded order, the old primary coming
//! back as a secondary each time. Then every invariant, every task ended, and every write the
//! services acknowledged (the ledger's and the producer's) on the surviving primary. `SOAK_SEED`
//! replays an order; the long mode is `cargo run -p tests --bin soak -- --failovers 30`.
#![allow(clippy::unwrap_used, clippy::print_stdout)]

use tests::soak::{self, DATABASE_FAULTS, SoakOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primary_fails_over_is_killed_and_frozen_and_nothing_acknowledged_is_lost() {
    if !tests::pg_auto_failover_available().await {
        return;
    }
    let seed = std::env::var("SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let summary = soak::run(SoakOptions::ci_failover(seed)).await;
    println!("{summary}");
    // Every invariant, every task ended, every fault recovered from, and every acknowledged
    // write on the surviving primary (the producer's creates, the ledger's acquisitions,
    // creates, claims and completions): what `passed` asks.
    assert!(summary.passed(), "{summary}");
    let failover = summary.failover.as_ref().unwrap();
    for fault in DATABASE_FAULTS {
        assert!(
            failover.costs.iter().any(|cost| cost.fault == fault),
            "no {fault:?} was injected:\n{summary}"
        );
    }
    assert!(
        failover.acquired > 50 && failover.claimed > 20 && failover.completed > 20,
        "the ledger saw too little:\n{summary}"
    );
    assert!(
        summary.report.generated_tasks > 20 && summary.produced > 20,
        "too little load:\n{summary}"
    );
}
