//! The soak in its CI mode: two minutes of seeded random faults over the whole stack (one of its
//! workers in exec mode, a shell command per task), then the invariant checker. `SOAK_SEED` replays a schedule; `SOAK_SECONDS` changes the length. The long
//! mode is the `soak` binary: `cargo run -p tests --bin soak -- --help`.
#![allow(clippy::unwrap_used, clippy::print_stdout)]

use std::time::Duration;

use tests::checker::Invariant;
use tests::soak::{self, Fault, SoakOptions};

/// One soak at a time: each runs a whole stack, and two would only slow each other down.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_minutes_of_faults_keep_every_invariant() {
    let _turn = ONE_AT_A_TIME.lock().await;
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
    assert!(
        summary.by_exec > 10,
        "the exec worker did too little:\n{summary}"
    );
    assert!(
        summary.report.checked[&Invariant::QueueConcurrency] > 30
            && summary.report.checked[&Invariant::QueueRate] > 30
            && summary.report.checked[&Invariant::KeyConcurrency] > 20,
        "too few claims of the limited queue:\n{summary}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_soak_catches_a_build_whose_acquire_skips_the_expiry_check() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let mut options = SoakOptions::ci(rand::random());
    options.duration = Duration::from_secs(15);
    options.break_acquire = true;
    let summary = soak::run(options).await;
    println!("{summary}");
    assert!(!summary.passed(), "the broken build passed:\n{summary}");
    assert!(
        summary
            .report
            .violations_of(Invariant::Exclusive)
            .next()
            .is_some(),
        "no overlap found:\n{summary}"
    );
}
