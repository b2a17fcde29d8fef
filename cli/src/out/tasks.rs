//! How tasks print: one row each, or one task field by field.

use chrono::{DateTime, Utc};
use leasehold::tasks::Task;
use serde_json::Value;

use super::{View, or_dash, table, time};

pub(crate) fn task_table(tasks: &[Task], view: View) -> String {
    let wide = view.wide;
    let at = |at: &Option<DateTime<Utc>>| or_dash(at.as_ref().map(time));
    let rows: Vec<Vec<String>> = tasks
        .iter()
        .map(|t| {
            let mut row = vec![
                t.id.to_string(),
                view.status(t.status.as_str()),
                t.queue.clone(),
                t.priority.to_string(),
                format!("{}/{}", t.attempts, t.max_attempts),
                or_dash(t.processor.clone()),
                time(&t.scheduled_at),
            ];
            if wide {
                row.extend([
                    or_dash(t.concurrency_key.clone()),
                    or_dash(t.fence.map(|f| f.to_string())),
                    time(&t.created_at),
                    at(&t.started_at),
                    at(&t.processed_at),
                    or_dash(t.last_error.clone()),
                ]);
            }
            row
        })
        .collect();
    let mut headers = vec![
        "ID",
        "STATUS",
        "QUEUE",
        "PRIORITY",
        "ATTEMPTS",
        "PROCESSOR",
        "SCHEDULED AT",
    ];
    if wide {
        headers.extend([
            "KEY",
            "FENCE",
            "CREATED AT",
            "STARTED AT",
            "PROCESSED AT",
            "LAST ERROR",
        ]);
    }
    table(&headers, &rows)
}

pub(crate) fn task_detail(task: &Task) -> String {
    let at = |at: &Option<DateTime<Utc>>| or_dash(at.as_ref().map(time));
    let rows: Vec<Vec<String>> = [
        ("id", task.id.to_string()),
        ("status", task.status.as_str().to_owned()),
        ("queue", task.queue.clone()),
        ("priority", task.priority.to_string()),
        ("attempts", task.attempts.to_string()),
        ("max attempts", task.max_attempts.to_string()),
        ("processor", or_dash(task.processor.clone())),
        ("fence", or_dash(task.fence.map(|f| f.to_string()))),
        ("scheduled at", time(&task.scheduled_at)),
        ("started at", at(&task.started_at)),
        ("last heartbeat", at(&task.last_heart_beat_at)),
        ("heartbeat before", at(&task.must_heart_beat_before)),
        ("processed at", at(&task.processed_at)),
        ("last error", or_dash(task.last_error.clone())),
        ("cancel requested", task.cancel_requested.to_string()),
        ("idempotency key", or_dash(task.idempotency_key.clone())),
        ("concurrency key", or_dash(task.concurrency_key.clone())),
        ("data", task.task_data.to_string()),
        (
            "output",
            or_dash(task.task_output.as_ref().map(Value::to_string)),
        ),
    ]
    .into_iter()
    .map(|(label, value)| vec![label.to_owned(), value])
    .collect();
    table(&["FIELD", "VALUE"], &rows)
}
