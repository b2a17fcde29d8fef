//! How queues print.

use leasehold::queues::QueueState;

use super::{Tone, View, or_dash, table};

pub(crate) fn queue_table(queues: &[QueueState], view: View) -> String {
    let wide = view.wide;
    let count =
        |q: &QueueState, status: &str| q.counts.get(status).copied().unwrap_or(0).to_string();
    let rows: Vec<Vec<String>> = queues
        .iter()
        .map(|q| {
            let mut row = vec![
                q.queue.clone(),
                if q.paused {
                    view.paint("paused", Tone::Waiting)
                } else {
                    view.paint("running", Tone::Good)
                },
                or_dash(q.concurrency_limit.map(|l| l.to_string())),
                or_dash(q.key_concurrency_limit.map(|l| l.to_string())),
                count(q, "pending"),
                count(q, "running"),
                count(q, "succeeded"),
                count(q, "dead"),
                or_dash(q.oldest_due_age_seconds.map(|s| format!("{s:.1} s"))),
            ];
            if wide {
                row.extend([
                    or_dash(q.rate_limit.as_ref().map(|r| r.per_second.to_string())),
                    or_dash(q.rate_limit.as_ref().map(|r| r.burst.to_string())),
                    count(q, "cancelled"),
                ]);
            }
            row
        })
        .collect();
    let mut headers = vec![
        "QUEUE",
        "STATE",
        "LIMIT",
        "KEY LIMIT",
        "PENDING",
        "RUNNING",
        "SUCCEEDED",
        "DEAD",
        "OLDEST DUE",
    ];
    if wide {
        headers.extend(["RATE/S", "BURST", "CANCELLED"]);
    }
    table(&headers, &rows)
}
