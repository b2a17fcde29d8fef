//! Closed-loop measurement: concurrent clients, their latencies and errors, and the figure
//! they make.

use std::time::{Duration, Instant};

use super::Figure;

/// Latencies of the successful operations of a measurement, and its failures.
#[derive(Debug, Default)]
pub(super) struct Samples {
    pub(super) latencies: Vec<Duration>,
    pub(super) errors: u64,
}

impl Samples {
    pub(super) fn merge(&mut self, other: Samples) {
        self.latencies.extend(other.latencies);
        self.errors += other.errors;
    }

    pub(super) fn figure(
        mut self,
        section: &str,
        name: &str,
        concurrency: usize,
        rows: Option<u64>,
        elapsed: Duration,
    ) -> Figure {
        self.latencies.sort_unstable();
        let ops = self.latencies.len() as u64;
        let seconds = elapsed.as_secs_f64().max(1e-9);
        Figure {
            section: section.to_owned(),
            name: name.to_owned(),
            concurrency,
            rows,
            ops,
            errors: self.errors,
            seconds,
            per_second: ops as f64 / seconds,
            p50_ms: percentile(&self.latencies, 0.50),
            p99_ms: percentile(&self.latencies, 0.99),
        }
    }
}

fn percentile(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[index.min(sorted.len() - 1)].as_secs_f64() * 1000.0
}

/// Runs `clients` copies of `client` at once; each gets its index and returns its samples.
/// Returns the merged samples and the wall time from start to the last client's end.
pub(super) async fn run_clients<F, Fut>(clients: usize, client: F) -> (Samples, Duration)
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = Samples> + Send + 'static,
{
    let started = Instant::now();
    let handles: Vec<_> = (0..clients).map(|k| tokio::spawn(client(k))).collect();
    let mut all = Samples::default();
    for handle in handles {
        if let Ok(samples) = handle.await {
            all.merge(samples);
        }
    }
    (all, started.elapsed())
}
