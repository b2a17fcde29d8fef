//! The soak's long mode, for a person: the whole stack under seeded random faults for as long as
//! asked, then the invariant checker. Build the services first: `cargo build --workspace --bins`.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tests::soak::{self, SoakOptions};

/// Runs Leasehold's whole stack on a private PostgreSQL under load, injects faults on a seeded
/// random schedule (kill -9, SIGSTOP, restarts of services and of PostgreSQL), then proves
/// from the recorded history that every invariant held. Exits 1 on any violation.
#[derive(Debug, Parser)]
#[command(name = "soak", version)]
struct Cli {
    /// How long to inject faults: seconds, or with a unit (90s, 30m, 2h).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    duration: Duration,
    /// The schedule's seed (default: random; the summary prints it for a replay).
    #[arg(long)]
    seed: Option<u64>,
    /// Mean milliseconds between faults.
    #[arg(long, default_value_t = 250)]
    fault_interval_ms: u64,
    /// Worker processes (each runs 3 tasks at a time).
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Generator replicas.
    #[arg(long, default_value_t = 3)]
    generators: usize,
    /// The generator's tasks per second.
    #[arg(long, default_value_t = 10)]
    generator_rate: u32,
    /// Tasks per second the soak adds itself (some fail on purpose).
    #[arg(long, default_value_t = 10)]
    producer_rate: u32,
    /// After the faults stop, seconds the stack may go without a task reaching its end while
    /// some are unfinished (the whole drain: at most this or the faults' duration, whichever is
    /// longer).
    #[arg(long, default_value_t = 300)]
    drain_timeout_seconds: u64,
    /// Remove acquire's expiry check in lease-service (a test-only switch), to watch the
    /// checker catch a broken build.
    #[arg(long)]
    break_acquire: bool,
    /// Run on a pg_auto_failover formation (monitor, primary, synchronous secondary; installed
    /// with apt when missing and root) and inject this many failovers, kills and freezes of the
    /// primary, one at a time, instead of the random faults; prints what each cost.
    #[arg(long, default_value_t = 0)]
    failovers: usize,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or((text, "s"), |at| text.split_at(at));
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 90s, 30m or 2h"))?;
    let scale = match unit {
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        other => return Err(format!("unknown unit {other:?}: use s, m or h")),
    };
    Duration::try_from_secs_f64(value * scale).map_err(|err| err.to_string())
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let seed = cli.seed.unwrap_or_else(rand::random);
    let options = SoakOptions {
        duration: cli.duration,
        seed,
        mean_fault_interval: Duration::from_millis(cli.fault_interval_ms),
        workers: cli.workers,
        generators: cli.generators,
        generator_rate: cli.generator_rate,
        producer_rate: cli.producer_rate,
        drain_timeout: Duration::from_secs(cli.drain_timeout_seconds),
        break_acquire: cli.break_acquire,
        failovers: cli.failovers,
    };
    // Its verdict is its report, not a panic: every log stays for it.
    tests::keep_logs();
    eprintln!(
        "soak: seed {seed}, {:?} of faults; services' logs go to {}",
        options.duration,
        tests::log_dir().display()
    );
    let summary = soak::run(options).await;
    println!("{summary}");
    if summary.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
