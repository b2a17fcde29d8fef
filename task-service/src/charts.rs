//! The dashboard's charts and overview: throughput and pickup latency over a window, from the
//! per-minute rollup and the unfolded tail of the history, and the per-queue series of pending
//! and running tasks walked back from now. Plain arithmetic over what the repository reads;
//! nothing here locks a row or writes.

use leasehold::ErrorCode;
use leasehold::server::ApiError;
use serde::Serialize;

use crate::context::Context;
use crate::generator;
use crate::repo::{self, Db, OldestDue, Processor, QueueCount, ThroughputBucket};

/// Throughput shown on the dashboard: the last ten minutes in ten-second buckets.
const WINDOW_SECONDS: i64 = 600;
const BUCKET_SECONDS: i64 = 10;

/// `GET /api/dashboard/overview`: everything the tasks, workers and generator views show.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Overview {
    pub counts: Vec<QueueCount>,
    pub oldest_due: Vec<OldestDue>,
    pub throughput: Throughput,
    pub workers: Vec<Processor>,
    pub generator: leasehold::generator::GeneratorStatus,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Throughput {
    pub window_seconds: i64,
    pub bucket_seconds: i64,
    pub buckets: Vec<ThroughputBucket>,
    /// The charts' queues: pending and running at the end of each bucket, oldest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub queues: Vec<QueueSeries>,
}

/// One queue's pending and running tasks over a window, at the end of each bucket, oldest
/// first (the last is now).
#[derive(Debug, Serialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueSeries {
    pub queue: String,
    pub pending: Vec<i64>,
    pub running: Vec<i64>,
}

/// Most queues the charts draw: the busiest now.
pub const CHART_QUEUES: usize = 8;

/// Each queue's counts at the end of each of `buckets` buckets, from its counts now and its net
/// moves per bucket (bucket 0 the newest): walking back, a bucket's moves are undone to reach
/// the end of the bucket before it.
pub fn queue_series(
    moves: Vec<repo::QueueMoves>,
    buckets: usize,
    bucket_seconds: i64,
) -> Vec<QueueSeries> {
    use std::collections::BTreeMap;
    let mut now: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    let mut deltas: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    for m in moves {
        match m.seconds_ago {
            None => {
                now.insert(m.queue, (m.pending, m.running));
            }
            Some(ago) => {
                let index = usize::try_from(ago / bucket_seconds.max(1)).unwrap_or(usize::MAX);
                if index < buckets {
                    let per = deltas
                        .entry(m.queue)
                        .or_insert_with(|| vec![(0, 0); buckets]);
                    per[index].0 += m.pending;
                    per[index].1 += m.running;
                }
            }
        }
    }
    let queues: std::collections::BTreeSet<String> =
        now.keys().chain(deltas.keys()).cloned().collect();
    let mut series: Vec<QueueSeries> = queues
        .into_iter()
        .map(|queue| {
            let (mut pending, mut running) = now.get(&queue).copied().unwrap_or((0, 0));
            let moves = deltas.get(&queue);
            let mut p = vec![0; buckets];
            let mut r = vec![0; buckets];
            for k in 0..buckets {
                // The end of bucket k (k buckets ago), oldest first in the series.
                p[buckets - 1 - k] = pending.max(0);
                r[buckets - 1 - k] = running.max(0);
                if let Some(moves) = moves {
                    pending -= moves[k].0;
                    running -= moves[k].1;
                }
            }
            QueueSeries {
                queue,
                pending: p,
                running: r,
            }
        })
        .collect();
    series.sort_by_key(|s| {
        std::cmp::Reverse(
            s.pending
                .iter()
                .chain(&s.running)
                .copied()
                .max()
                .unwrap_or(0),
        )
    });
    series.truncate(CHART_QUEUES);
    series
}

/// The windows the dashboard's charts offer, in seconds (5 minutes, an hour, a day), each cut
/// into 60 buckets.
pub const CHART_WINDOWS: [i64; 3] = [300, 3600, 86_400];

/// Refuses a window the charts do not offer, before the read waits for its turn.
pub fn check_window(window_seconds: i64) -> Result<(), ApiError> {
    if CHART_WINDOWS.contains(&window_seconds) {
        Ok(())
    } else {
        Err(ApiError::invalid(
            ErrorCode::InvalidQuery,
            "window_seconds",
            "window_seconds must be 300, 3600 or 86400",
        ))
    }
}

/// `GET /api/dashboard/throughput?window_seconds=N`: the history's transitions and pickup
/// latency over one of [`CHART_WINDOWS`], in 60 buckets.
pub async fn throughput(conn: &mut Db, window_seconds: i64) -> Result<Throughput, ApiError> {
    check_window(window_seconds)?;
    let bucket_seconds = window_seconds / 60;
    // Buckets of whole minutes (the hour's and the day's) come from the history's per-minute
    // rollup and its unfolded tail: a day of a busy system's history is too much to read raw.
    // The five minutes' buckets of seconds read the little history they need as it is.
    let (buckets, moves) = if bucket_seconds % 60 == 0 {
        let bucket_minutes = bucket_seconds / 60;
        let (minutes, moves) = repo::throughput_minutes(
            conn,
            i32::try_from(window_seconds / 60).unwrap_or(i32::MAX),
            i32::try_from(bucket_minutes).unwrap_or(i32::MAX),
        )
        .await?;
        (buckets_of_minutes(minutes, bucket_minutes, 60), moves)
    } else {
        repo::throughput(conn, window_seconds, bucket_seconds, true).await?
    };
    Ok(Throughput {
        window_seconds,
        bucket_seconds,
        buckets,
        queues: queue_series(moves, 60, bucket_seconds),
    })
}

/// The minutes' counts in buckets of `bucket_minutes` (bucket 0 holds the current minute), the
/// first `buckets` of them; a bucket's pickup percentiles from its minutes' histograms merged.
/// Buckets without a minute are left out, as the raw read leaves out buckets without events.
pub fn buckets_of_minutes(
    minutes: Vec<repo::MinuteCounts>,
    bucket_minutes: i64,
    buckets: i64,
) -> Vec<ThroughputBucket> {
    use std::collections::BTreeMap;
    #[derive(Default)]
    struct Sum {
        created: i64,
        started: i64,
        succeeded: i64,
        failed: i64,
        pickup: BTreeMap<i32, i64>,
    }
    let mut sums: BTreeMap<i64, Sum> = BTreeMap::new();
    for minute in minutes {
        let index = minute.minutes_ago.max(0) / bucket_minutes.max(1);
        if index >= buckets {
            continue;
        }
        let sum = sums.entry(index).or_default();
        sum.created += minute.created;
        sum.started += minute.started;
        sum.succeeded += minute.succeeded;
        sum.failed += minute.failed;
        for (bin, count) in minute.pickup_bins.into_iter().zip(minute.pickup_counts) {
            *sum.pickup.entry(bin).or_default() += count;
        }
    }
    sums.into_iter()
        .map(|(index, sum)| ThroughputBucket {
            seconds_ago: index * bucket_minutes * 60,
            claimed: sum.started,
            completed: sum.succeeded,
            created: sum.created,
            started: sum.started,
            succeeded: sum.succeeded,
            failed: sum.failed,
            pickup_p50_ms: pickup_quantile(&sum.pickup, 0.5),
            pickup_p99_ms: pickup_quantile(&sum.pickup, 0.99),
        })
        .collect()
}

/// The `q` quantile of a pickup histogram (bin to count) as PostgreSQL's `percentile_disc`
/// takes it (the `ceil(q * n)`-th smallest latency), read as the middle of the bin holding it;
/// none from an empty histogram.
pub fn pickup_quantile(histogram: &std::collections::BTreeMap<i32, i64>, q: f64) -> Option<f64> {
    let n: i64 = histogram.values().sum();
    if n <= 0 {
        return None;
    }
    // As percentile_disc computes the rank, in the same floating point.
    #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
    let rank = ((q * n as f64).ceil() as i64).clamp(1, n);
    let mut seen = 0;
    histogram.iter().find_map(|(&bin, &count)| {
        seen += count;
        (seen >= rank).then(|| pickup_bin_middle(bin))
    })
}

/// The latency in the middle of a pickup bin: bin `b` holds the latencies `ms` with
/// `floor(bins * log2(1 + ms)) = b`, so its middle is `2^((b + 0.5) / bins) - 1`.
pub fn pickup_bin_middle(bin: i32) -> f64 {
    2f64.powf((f64::from(bin) + 0.5) / f64::from(repo::PICKUP_BINS_PER_DOUBLING)) - 1.0
}

pub async fn overview(conn: &mut Db, engine: &Context) -> Result<Overview, ApiError> {
    Ok(Overview {
        counts: repo::counts(conn).await?,
        oldest_due: repo::oldest_due(conn).await?,
        throughput: Throughput {
            window_seconds: WINDOW_SECONDS,
            bucket_seconds: BUCKET_SECONDS,
            buckets: repo::throughput(conn, WINDOW_SECONDS, BUCKET_SECONDS, false)
                .await?
                .0,
            queues: Vec::new(),
        },
        workers: repo::processors(conn).await?,
        generator: generator::status(conn, engine).await?,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn queue_series_walk_back_from_now_undoing_each_buckets_moves() {
        let moves = |queue: &str, ago: Option<i64>, pending: i64, running: i64| repo::QueueMoves {
            queue: queue.to_owned(),
            seconds_ago: ago,
            pending,
            running,
        };
        let series = queue_series(
            vec![
                moves("q", None, 5, 1),
                moves("q", Some(0), 1, 1),
                moves("q", Some(10), 2, 0),
                // Older than the window's buckets: ignored.
                moves("q", Some(40), 7, 7),
            ],
            4,
            5,
        );
        assert_eq!(
            series,
            vec![QueueSeries {
                queue: "q".to_owned(),
                pending: vec![2, 4, 4, 5],
                running: vec![0, 0, 0, 1],
            }]
        );
    }

    fn minute(ago: i64, started: i64, bins: &[(i32, i64)]) -> repo::MinuteCounts {
        repo::MinuteCounts {
            minutes_ago: ago,
            created: 1,
            started,
            succeeded: 0,
            failed: 0,
            pickup_bins: bins.iter().map(|(bin, _)| *bin).collect(),
            pickup_counts: bins.iter().map(|(_, count)| *count).collect(),
        }
    }

    #[test]
    fn minutes_add_up_into_buckets_and_their_histograms_merge() {
        let buckets = buckets_of_minutes(
            vec![
                minute(0, 2, &[(10, 1), (40, 1)]),
                minute(23, 1, &[(10, 2)]),
                minute(24, 5, &[]),
                // A claim stamped after the read began: the current minute.
                minute(-1, 1, &[]),
                // Past the window: left out.
                minute(24 * 60, 9, &[(1, 1)]),
            ],
            24,
            60,
        );
        assert_eq!(buckets.len(), 2);
        let (newest, older) = (&buckets[0], &buckets[1]);
        assert_eq!(
            (
                newest.seconds_ago,
                newest.created,
                newest.started,
                newest.claimed
            ),
            (0, 3, 4, 4)
        );
        assert_eq!(newest.pickup_p50_ms, Some(pickup_bin_middle(10)));
        assert_eq!(newest.pickup_p99_ms, Some(pickup_bin_middle(40)));
        assert_eq!((older.seconds_ago, older.started), (24 * 60, 5));
        assert_eq!((older.pickup_p50_ms, older.pickup_p99_ms), (None, None));
    }

    #[test]
    fn a_bins_middle_is_within_two_percent_of_every_latency_in_it() {
        for ms in [0.0, 0.5, 1.0, 3.7, 250.0, 12_345.6, 86_400_000.0] {
            #[allow(clippy::cast_possible_truncation)]
            let bin = (16.0 * f64::ln(1.0 + ms) / f64::ln(2.0)).floor() as i32;
            let middle = pickup_bin_middle(bin);
            assert!(
                (middle - ms).abs() <= 0.022 * (1.0 + ms),
                "{ms} ms in bin {bin}, read as {middle}"
            );
        }
        let histogram = [(1, 1), (2, 98), (3, 1)].into_iter().collect();
        assert_eq!(pickup_quantile(&histogram, 0.5), Some(pickup_bin_middle(2)));
        assert_eq!(
            pickup_quantile(&histogram, 0.99),
            Some(pickup_bin_middle(2))
        );
        assert_eq!(
            pickup_quantile(&histogram, 0.995),
            Some(pickup_bin_middle(3))
        );
        assert_eq!(
            pickup_quantile(&std::collections::BTreeMap::new(), 0.5),
            None
        );
    }
}
