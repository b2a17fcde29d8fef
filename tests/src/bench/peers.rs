//! Leasehold side by side with graphile-worker 0.18, the fastest PostgreSQL queue we know, on
//! the same private PostgreSQL in the same run: the same number of no-op tasks, created in
//! batches of 1,000, drained by one graphile-worker process with batching off (24 concurrent
//! jobs, one fetch and one completion per job) and on (a local queue of 500, completions sent
//! together). Each on a fresh database, metered as Leasehold's own runs are. Then its idle
//! pickup, taken as Leasehold's is. graphile-worker is
//! installed with npm on first use ([`crate::tools::graphile_worker`]); without npm the section
//! says so and is skipped.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde::Deserialize;

use super::measure::Samples;
use super::{Bench, BenchOptions, Figure, Report};

const SECTION: &str = "peers: graphile-worker 0.18 (one process, no-op tasks)";

/// graphile-worker's idle pickups, in milliseconds by the database's clock.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PeerPickup {
    pickup_ms: Vec<f64>,
}

/// graphile-worker's own account of a run (`tests/peers/graphile-worker.js`).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PeerRun {
    tasks: u64,
    seconds: f64,
    create_seconds: f64,
    cpu_ms: f64,
}

pub(super) async fn peers(bench: &Bench, options: &BenchOptions, report: &mut Report) {
    let installed = tokio::task::spawn_blocking(crate::tools::graphile_worker).await;
    let (node, dir) = match installed {
        Ok(Ok(found)) => found,
        Ok(Err(why)) => {
            report.skipped.push(format!("{SECTION}: skipped, {why}"));
            return;
        }
        Err(err) => panic!("installing graphile-worker: {err}"),
    };
    let script = dir.join("leasehold-peer.js");
    std::fs::write(&script, include_str!("../../peers/graphile-worker.js"))
        .unwrap_or_else(|err| panic!("{}: {err}", script.display()));
    for (mode, name, leasehold) in [
        ("single", "no batching, concurrency 24", "single claims"),
        ("batched", "batched, local queue 500", "batched claims"),
    ] {
        let url = peer_database(bench, &format!("peer_{mode}"), (&node, &dir, &script)).await;
        let meter = bench.meter().await;
        let out = node_run(
            &node,
            &dir,
            &script,
            vec![
                mode.into(),
                url.clone(),
                options.e2e_tasks.to_string(),
                "24".into(),
            ],
        )
        .await;
        let run: PeerRun = last_json(&out);
        let mut cost = meter
            .finish(
                &format!("graphile-worker, {name}"),
                run.tasks,
                &[],
                run.cpu_ms,
            )
            .await;
        // Its one process creates the backlog too: there are no services, and it is its
        // own driver.
        cost.run
            .push_str(" (workers = its one process, create included)");
        let theirs = cost.tasks_per_postgres_cpu_second();
        report.costs.push(cost);
        if let Some(ours) = report
            .costs
            .iter()
            .find(|c| c.run == leasehold)
            .map(super::Cost::tasks_per_postgres_cpu_second)
        {
            report.ratio(
                format!(
                    "{leasehold}: tasks per PostgreSQL CPU-second, Leasehold / graphile-worker {name}"
                ),
                ours,
                theirs,
            );
        }
        let seconds = run.seconds.max(1e-9);
        let create_seconds = run.create_seconds.max(1e-9);
        report.figures.push(Figure {
            section: SECTION.to_owned(),
            name: format!("create (addJobs, batches of 1000) for {name}"),
            concurrency: 1,
            rows: None,
            ops: run.tasks,
            errors: 0,
            seconds: create_seconds,
            per_second: run.tasks as f64 / create_seconds,
            p50_ms: 0.0,
            p99_ms: 0.0,
        });
        let per_second = run.tasks as f64 / seconds;
        report.figures.push(Figure {
            section: SECTION.to_owned(),
            name: format!("{name}: first start → last completion committed"),
            concurrency: 24,
            rows: None,
            ops: run.tasks,
            errors: options.e2e_tasks.saturating_sub(run.tasks),
            seconds,
            per_second,
            p50_ms: 0.0,
            p99_ms: 0.0,
        });
        let ours = report
            .figures
            .iter()
            .find(|f| {
                f.section == super::e2e::SECTION
                    && f.name.starts_with(leasehold)
                    && f.name.contains('→')
            })
            .map(|f| f.per_second);
        if let Some(ours) = ours {
            report.ratio(
                format!("Leasehold {leasehold} / graphile-worker {name} (tasks/s)"),
                ours,
                per_second,
            );
        }
    }
    idle_pickup(bench, options, report, (&node, &dir, &script)).await;
}

/// graphile-worker's idle pickup, taken as Leasehold's is (one worker waiting, one job at a
/// time, creation to start by the database's clock), and the ratio of the p99s.
async fn idle_pickup(
    bench: &Bench,
    options: &BenchOptions,
    report: &mut Report,
    (node, dir, script): (&Path, &Path, &Path),
) {
    let url = peer_database(bench, "peer_pickup", (node, dir, script)).await;
    let out = node_run(
        node,
        dir,
        script,
        vec!["pickup".into(), url, options.pickup_samples.to_string()],
    )
    .await;
    let run: PeerPickup = last_json(&out);
    let samples = Samples {
        latencies: run
            .pickup_ms
            .iter()
            .map(|ms| Duration::from_secs_f64(ms.max(0.0) / 1000.0))
            .collect(),
        errors: options.pickup_samples.saturating_sub(run.pickup_ms.len()) as u64,
    };
    let figure = samples.figure(
        SECTION,
        "graphile-worker idle pickup: create → start, one worker waiting (LISTEN/NOTIFY)",
        1,
        None,
        Duration::from_secs(1),
    );
    let ours = report
        .find(super::pickup::SECTION, super::pickup::IDLE_PICKUP, 1)
        .map(|f| f.p99_ms);
    if let Some(ours) = ours {
        report.ratio(
            "idle pickup p99, Leasehold / graphile-worker (target < 1)",
            ours,
            figure.p99_ms,
        );
    }
    report.figures.push(figure);
}

/// A fresh database `name` with graphile-worker's schema migrated in; its URL.
async fn peer_database(
    bench: &Bench,
    name: &str,
    (node, dir, script): (&Path, &Path, &Path),
) -> String {
    bench
        .postgres
        .create_database(name)
        .await
        .unwrap_or_else(|err| panic!("creating {name}: {err}"));
    let url = bench.postgres.url(name);
    node_run(node, dir, script, vec!["migrate".into(), url.clone()]).await;
    url
}

/// The driver's account of a run: the last line it printed that parses as `T`.
fn last_json<T: serde::de::DeserializeOwned>(out: &str) -> T {
    out.lines()
        .rev()
        .find_map(|line| serde_json::from_str(line).ok())
        .unwrap_or_else(|| panic!("graphile-worker printed no result:\n{out}"))
}

/// Runs the driver with `args` and returns what it printed; panics if it fails.
async fn node_run(node: &Path, dir: &Path, script: &Path, args: Vec<String>) -> String {
    let (node, dir, script) = (node.to_owned(), dir.to_owned(), script.to_owned());
    tokio::task::spawn_blocking(move || {
        let output = Command::new(&node)
            .arg(&script)
            .args(&args)
            .current_dir(&dir)
            .output()
            .unwrap_or_else(|err| panic!("{}: {err}", node.display()));
        assert!(
            output.status.success(),
            "graphile-worker {args:?} failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    })
    .await
    .unwrap()
}
