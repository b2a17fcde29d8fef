//! Small helpers the tests assert with: waiting for a condition, and reading metrics and batch
//! answers.

use std::time::{Duration, Instant};

use serde_json::Value;

/// Polls `check` every 100 ms until it holds; panics naming `what` after `timeout`.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The sum of the samples in Prometheus text `metrics` whose line starts with `prefix` (a name,
/// or a name with `{` and leading labels, to pick series).
pub fn metric_sum(metrics: &str, prefix: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Each item of a batch answer's `results`: its status and its error code (`""` when none).
pub fn verdicts(results: &Value) -> Vec<(i64, &str)> {
    results
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["status"].as_i64().unwrap(),
                r["error"]["code"].as_str().unwrap_or(""),
            )
        })
        .collect()
}
