//! What a benchmark run measures, and how long: the full run for a person, the quick one for CI.

use std::time::Duration;

/// What to measure, and how long.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Concurrent clients of the lease benchmarks.
    pub lease_concurrency: Vec<usize>,
    /// How long each closed-loop measurement runs.
    pub phase: Duration,
    /// Tasks in each end-to-end backlog.
    pub e2e_tasks: u64,
    /// Tasks of each way of the work-in-any-language runs (in-process, exec, push), drained by
    /// `workers` workers of `batch_concurrency` slots.
    pub work_tasks: u64,
    /// Worker processes of the single-claim run, each with one slot: every claim and every
    /// completion is a request for one task.
    pub single_workers: usize,
    /// Worker processes of the batched run, and slots per worker (each claim asks for as many
    /// tasks as there are free slots; completions ready together go in one request).
    pub workers: usize,
    pub batch_concurrency: usize,
    /// Under load, each end-to-end worker claims ahead as many tasks as it has slots
    /// (`WORKER_PREFETCH`).
    pub prefetch: bool,
    /// Samples of the wake-up latencies (idle pickup, lease handover), taken one at a time.
    pub pickup_samples: usize,
    /// Pending tasks in the claim comparison's backlogs (the sample's table and Leasehold's).
    pub backlog_sizes: Vec<u64>,
    /// Finished tasks and ended leases present, for the growth figures.
    pub growth_sizes: Vec<u64>,
    /// Shared resources the contention figures race for.
    pub contended_resources: Vec<u64>,
    /// Concurrent claim-and-complete clients.
    pub claim_clients: usize,
    /// Large tasks stored, and concurrent readers paging through them, for the memory figure.
    pub memory_tasks: u64,
    pub memory_readers: usize,
    /// Concurrent clients reading the heaviest routes while claims are measured, and the queues
    /// present (each with two tasks) for them to read.
    pub heavy_readers: usize,
    pub read_queues: u64,
    /// Events of history in the last day, for the dashboard charts' figures.
    pub chart_events: u64,
    /// The sections to run (all when empty): `leases`, `contention`, `e2e`, `work`, `sample`,
    /// `growth`, `memory`, `charts`, `reads`.
    pub sections: Vec<String>,
}

impl BenchOptions {
    /// The full run, for a person: several minutes.
    pub fn full() -> BenchOptions {
        BenchOptions {
            lease_concurrency: vec![1, 8, 32, 128],
            phase: Duration::from_secs(5),
            e2e_tasks: 20_000,
            work_tasks: 5_000,
            single_workers: 32,
            workers: 8,
            batch_concurrency: 32,
            prefetch: true,
            pickup_samples: 200,
            backlog_sizes: vec![10_000, 1_000_000],
            growth_sizes: vec![10_000, 100_000, 1_000_000],
            contended_resources: vec![1, 100],
            claim_clients: 8,
            memory_tasks: 1_000,
            memory_readers: 8,
            heavy_readers: 60,
            read_queues: 30_000,
            chart_events: 1_000_000,
            sections: Vec::new(),
        }
    }

    /// The quick run CI makes to keep the harness working: well under a minute, figures
    /// meaningless.
    pub fn quick() -> BenchOptions {
        BenchOptions {
            lease_concurrency: vec![1, 8],
            phase: Duration::from_millis(400),
            e2e_tasks: 200,
            work_tasks: 100,
            single_workers: 2,
            workers: 2,
            batch_concurrency: 8,
            prefetch: true,
            pickup_samples: 10,
            backlog_sizes: vec![300, 1_000],
            growth_sizes: vec![1_000, 3_000],
            contended_resources: vec![1, 2],
            claim_clients: 4,
            memory_tasks: 40,
            memory_readers: 8,
            // More readers than READS_IN_FLIGHT, so that reads wait their turn, but few enough
            // that the last in line is served within task-service's 10 s `READ_WAIT` while the
            // rest of the suite loads both cores: with 12, CI's run saw a reader refused.
            heavy_readers: 4,
            read_queues: 300,
            chart_events: 20_000,
            sections: Vec::new(),
        }
    }
}
