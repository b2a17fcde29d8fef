//! Leasehold side by side with graphile-worker 0.18, the fastest PostgreSQL queue we know, on
//! the same private PostgreSQL in the same run: the same number of no-op tasks, created in
//! batches of 1,000, drained by one graphile-worker process with batching off (24 concurrent
//! jobs, one fetch and one completion per job) and on (a local queue of 500, completions sent
//! together). Each on a fresh database, metered as Leasehold's own runs are. graphile-worker is
//! installed with npm on first use ([`crate::tools::graphile_worker`]); without npm the section
//! says so and is skipped.

use std::process::Command;

use serde::Deserialize;

use super::{Bench, BenchOptions, Figure, Report};

const SECTION: &str = "peers: graphile-worker 0.18 (one process, no-op tasks)";

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
        let database = format!("peer_{mode}");
        bench
            .postgres
            .create_database(&database)
            .await
            .unwrap_or_else(|err| panic!("creating {database}: {err}"));
        let url = bench.postgres.url(&database);
        let node_run = |args: Vec<String>| {
            let (node, dir, script) = (node.clone(), dir.clone(), script.clone());
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
        };
        node_run(vec!["migrate".into(), url.clone()]).await.unwrap();
        let meter = bench.meter().await;
        let out = node_run(vec![
            mode.into(),
            url.clone(),
            options.e2e_tasks.to_string(),
            "24".into(),
        ])
        .await
        .unwrap();
        let run: PeerRun = out
            .lines()
            .rev()
            .find_map(|line| serde_json::from_str(line).ok())
            .unwrap_or_else(|| panic!("graphile-worker printed no result:\n{out}"));
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
        report.costs.push(cost);
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
}
