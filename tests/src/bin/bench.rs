//! The benchmark harness, for a person: Leasehold side by side with the physical limit, the
//! sample's claim algorithm and itself as tables grow, in one run. Build the services first, in
//! the same profile: `cargo build --release --workspace --bins`.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::time::Duration;

use clap::Parser;
use tests::bench::{self, BenchOptions};

/// Starts a private PostgreSQL with durable settings, lease-service and task-service as real
/// processes (and worker processes), measures, and prints markdown tables and ratios; `--json`
/// also writes every figure as JSON.
#[derive(Debug, Parser)]
#[command(name = "bench", version)]
struct Cli {
    /// The quick mode CI runs (seconds; figures meaningless).
    #[arg(long)]
    quick: bool,
    /// Seconds each closed-loop measurement runs.
    #[arg(long)]
    phase_seconds: Option<f64>,
    /// Concurrent clients of the lease benchmarks, comma-separated.
    #[arg(long, value_delimiter = ',')]
    lease_clients: Option<Vec<usize>>,
    /// Tasks in each end-to-end backlog.
    #[arg(long)]
    e2e_tasks: Option<u64>,
    /// Worker processes (one slot each) of the single-claim end-to-end run.
    #[arg(long)]
    single_workers: Option<usize>,
    /// Worker processes of the batched end-to-end run.
    #[arg(long)]
    workers: Option<usize>,
    /// Slots per worker in the batched end-to-end run.
    #[arg(long)]
    batch_concurrency: Option<usize>,
    /// Pending tasks of the claim comparison's backlogs, comma-separated.
    #[arg(long, value_delimiter = ',')]
    backlogs: Option<Vec<u64>>,
    /// Finished rows present for the growth figures, comma-separated.
    #[arg(long, value_delimiter = ',')]
    growth: Option<Vec<u64>>,
    /// Large (63 KiB) tasks stored for the memory figure.
    #[arg(long)]
    memory_tasks: Option<u64>,
    /// Shared resources the contention figures race for, comma-separated.
    #[arg(long, value_delimiter = ',')]
    contended_resources: Option<Vec<u64>>,
    /// Concurrent clients reading the heaviest routes while claims are measured (reads).
    #[arg(long)]
    heavy_readers: Option<usize>,
    /// Queues present for the heavy reads (reads).
    #[arg(long)]
    read_queues: Option<u64>,
    /// Events of history in the last day for the dashboard charts (charts).
    #[arg(long)]
    chart_events: Option<u64>,
    /// End-to-end workers claim no task ahead of their free slots (WORKER_PREFETCH=0); by
    /// default each claims ahead up to its slots under load.
    #[arg(long)]
    no_prefetch: bool,
    /// Run only these sections, comma-separated: leases, contention, e2e, work, peers, sample,
    /// growth, memory, charts, reads (default: all).
    #[arg(long, value_delimiter = ',', value_parser = ["leases", "contention", "e2e", "work", "peers", "sample", "growth", "memory", "charts", "reads"])]
    only: Vec<String>,
    /// Write the report as JSON to this file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let mut options = if cli.quick {
        BenchOptions::quick()
    } else {
        BenchOptions::full()
    };
    if let Some(seconds) = cli.phase_seconds {
        options.phase = Duration::from_secs_f64(seconds);
    }
    if let Some(clients) = cli.lease_clients {
        options.lease_concurrency = clients;
    }
    if let Some(n) = cli.e2e_tasks {
        options.e2e_tasks = n;
    }
    if let Some(n) = cli.single_workers {
        options.single_workers = n;
    }
    if let Some(n) = cli.workers {
        options.workers = n;
    }
    if let Some(n) = cli.batch_concurrency {
        options.batch_concurrency = n;
    }
    if let Some(sizes) = cli.backlogs {
        options.backlog_sizes = sizes;
    }
    if let Some(sizes) = cli.growth {
        options.growth_sizes = sizes;
    }
    if let Some(n) = cli.memory_tasks {
        options.memory_tasks = n;
    }
    if let Some(resources) = cli.contended_resources {
        options.contended_resources = resources;
    }
    if let Some(n) = cli.heavy_readers {
        options.heavy_readers = n;
    }
    if let Some(n) = cli.read_queues {
        options.read_queues = n;
    }
    if let Some(n) = cli.chart_events {
        options.chart_events = n;
    }
    options.prefetch = !cli.no_prefetch;
    options.sections = cli.only;
    eprintln!("bench: {options:?}");
    let report = bench::run(&options).await;
    println!("{}", report.markdown());
    println!("{}", bench::LIMITS);
    if let Some(path) = cli.json {
        std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
        eprintln!("bench: JSON written to {}", path.display());
    }
    Ok(())
}
