//! The docs' curl tours, run as written against real services: every call must succeed. A
//! tour that hard-coded a fence (`"fence": 7`) failed for every reader, whose leases took the
//! fences a global counter gave them; these read theirs from the answers.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use tests::Service;

/// The shell block of `file` that holds or follows `marker`, up to `until` (or the block's end).
fn tour(file: &str, marker: &str, until: Option<&str>) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    let start = text
        .find(marker)
        .unwrap_or_else(|| panic!("{file}: no line {marker:?}"));
    // The marker may open the block or be its first line.
    let opening = match text[..start].rfind("```sh\n") {
        Some(open) if !text[open + 6..start].contains("```") => open,
        _ => start + text[start..].find("```sh\n").unwrap(),
    };
    let block = &text[opening + 6..];
    let block = &block[..block.find("```").unwrap()];
    match until.and_then(|until| block.find(until)) {
        Some(end) => block[..end].to_owned(),
        None => block.to_owned(),
    }
}

/// Runs `script` with `env` in bash, where every curl fails on a 4xx or 5xx answer.
async fn run(script: &str, env: &[(&str, String)]) {
    let wrapped = format!(
        "set -euo pipefail\ncurl() {{ command curl --fail-with-body -sS \"$@\"; echo; }}\n{script}"
    );
    let output = tokio::process::Command::new("bash")
        .arg("-c")
        .arg(&wrapped)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "the tour failed:\n{wrapped}\n--- stdout\n{}\n--- stderr\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test]
async fn the_readme_lease_tour_runs_as_written() {
    let db = tests::fresh_database().await;
    let leases = Service::lease_service(&db, &[]).await;
    // Someone else's leases first: the reader's fences are never the tour's first ones.
    for n in 0..3 {
        let body = serde_json::json!({"resource": format!("other-{n}"), "holder": "h"});
        assert_eq!(leases.post("/api/leases", &body).await.status, 201);
    }
    let script = tour("README.md", "L=http://127.0.0.1:8081/api/leases", None).replace(
        "L=http://127.0.0.1:8081/api/leases",
        &format!("L={}", leases.url("/api/leases")),
    );
    run(
        &script,
        &[("PROCESSOR", "w".to_owned()), ("TASK_ID", "1".to_owned())],
    )
    .await;
}

#[tokio::test]
async fn the_task_tour_runs_as_written_up_to_its_operators_calls() {
    let stack = tests::Stack::start(&[]).await;
    // A task of another queue, due first: the tour's claim names its own queue.
    let other = serde_json::json!({"task_data": {"n": 0}, "priority": 100});
    assert_eq!(stack.tasks.post("/api/tasks", &other).await.status, 201);
    let script = tour(
        "docs/src/task-api.md",
        "With the local stack running without its workers",
        Some("# Cancel"),
    );
    run(&script, &[("T", stack.tasks.url("/api/tasks"))]).await;
    let tasks = stack.tasks.get("/api/tasks?queue=tour").await;
    assert_eq!(
        tasks.body["tasks"][0]["status"], "succeeded",
        "{:?}",
        tasks.body
    );
}
