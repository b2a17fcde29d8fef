//! The soak in its CI mode: two minutes of seeded random faults over the whole stack, then the
//! invariant checker. `SOAK_SEED` replays a schedule; `SOAK_SECONDS` changes the length. The long
//! mode is the `soak` binary: `cargo run -p tests --bin soak -- --help`.
#![allow(clippy::unwrap_used, clippy::print_stdout)]

use std::time::Duration;

use tests::soak::{self, Fault, SoakOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_minutes_of_faults_keep_every_invariant() {
    let seed = std::env::var("SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let mut options = SoakOptions::ci(seed);
    if let Some(seconds) = std::env::var("SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        options.duration = Duration::from_secs(seconds);
    }
    let summary = soak::run(options).await;
    println!("{summary}");
    assert!(summary.passed(), "{summary}");
    assert!(
        summary.faults_total() >= 300,
        "too few faults injected:\n{summary}"
    );
    for fault in Fault::ALL {
        assert!(
            summary.faults.contains_key(&fault),
            "no {fault:?} was injected:\n{summary}"
        );
    }
    assert!(
        summary.report.generated_tasks > 100 && summary.produced > 100,
        "too little load:\n{summary}"
    );
}
