//! What a soak runs, and for how long.

use std::time::Duration;

/// What to run, and for how long.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    /// How long faults are injected; the drain and the check come after.
    pub duration: Duration,
    pub seed: u64,
    /// Mean time between two faults (exponentially distributed).
    pub mean_fault_interval: Duration,
    pub workers: usize,
    pub generators: usize,
    /// The generator's rate, in tasks per second.
    pub generator_rate: u32,
    /// Tasks per second the soak's own producer adds.
    pub producer_rate: u32,
    /// After the faults stop, how long the stack may go without bringing a task to an end while
    /// some are unfinished; the whole drain may take at most this or the faults' duration,
    /// whichever is longer.
    pub drain_timeout: Duration,
    /// Runs lease-service with acquire's expiry check removed (`LEASEHOLD_TEST_BREAK_ACQUIRE`),
    /// to show that the checker catches a broken build.
    pub break_acquire: bool,
    /// When not 0: run on a pg_auto_failover formation and inject this many database faults
    /// (failovers, kills and freezes of the primary) instead of the random ones; `duration` and
    /// `mean_fault_interval` are then unused.
    pub failovers: usize,
}

impl SoakOptions {
    /// The failover CI mode: each database fault once, under the CI soak's load.
    pub fn ci_failover(seed: u64) -> SoakOptions {
        SoakOptions {
            failovers: super::DATABASE_FAULTS.len(),
            ..SoakOptions::ci(seed)
        }
    }

    /// The CI mode: two minutes of faults, one every 0.25 s on average.
    pub fn ci(seed: u64) -> SoakOptions {
        SoakOptions {
            duration: Duration::from_secs(120),
            seed,
            mean_fault_interval: Duration::from_millis(250),
            workers: 4,
            generators: 3,
            generator_rate: 10,
            producer_rate: 10,
            drain_timeout: Duration::from_secs(120),
            break_acquire: false,
            failovers: 0,
        }
    }
}
