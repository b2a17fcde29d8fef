//! The benchmark harness in its quick mode, so that it keeps working: every section produces
//! its figures, and the JSON report parses. No time is asserted: performance is shown by the
//! harness's own output (`cargo run --release -p tests --bin bench`), never by a timed test.
#![allow(clippy::unwrap_used, clippy::print_stdout)]

use tests::bench::{self, BenchOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quick_benchmark_produces_every_figure() {
    let options = BenchOptions::quick();
    let report = bench::run(&options).await;
    println!("{}", report.markdown());
    for &clients in &options.lease_concurrency {
        for section in [
            "leases through HTTP",
            "leases as direct SQL (the physical limit)",
        ] {
            for operation in ["acquire", "renew", "release"] {
                let figure = report
                    .find(section, operation, clients)
                    .unwrap_or_else(|| panic!("no {section} {operation} at {clients}"));
                assert!(figure.ops > 0, "{figure:?}");
                assert_eq!(figure.errors, 0, "{figure:?}");
            }
        }
    }
    let sections: std::collections::BTreeSet<&str> =
        report.figures.iter().map(|f| f.section.as_str()).collect();
    // graphile-worker side by side wherever npm can install it (the machine's report says
    // why not otherwise).
    let peers = report.skipped.is_empty();
    assert_eq!(
        sections.len(),
        13 + usize::from(peers),
        "{sections:?} {:?}",
        report.skipped
    );
    // The wake-up latencies: every sample taken, none lost; pickup at half load of every task
    // created.
    let wakeups: Vec<_> = report
        .figures
        .iter()
        .filter(|f| f.section.starts_with("how soon waiting work starts"))
        .collect();
    assert_eq!(wakeups.len(), 3);
    for figure in wakeups {
        if figure.name.starts_with("pickup at half") {
            assert!(figure.ops > 0, "{figure:?}");
        } else {
            assert_eq!(figure.ops as usize, options.pickup_samples, "{figure:?}");
        }
        assert_eq!(figure.errors, 0, "{figure:?}");
    }
    // The cost model: every run (Leasehold's two, and the peer's two) metered, each task
    // writing WAL in some write transaction, and PostgreSQL working for it.
    assert_eq!(
        report.costs.len(),
        2 + 3 + 2 * usize::from(peers),
        "{:?}",
        report.costs
    );
    for cost in &report.costs {
        let ran = if cost.run.contains("per task") {
            options.work_tasks
        } else {
            options.e2e_tasks
        };
        assert_eq!(cost.tasks, ran, "{cost:?}");
        assert!(cost.wal_bytes_per_task > 0.0, "{cost:?}");
        assert!(cost.write_transactions_per_task > 0.0, "{cost:?}");
        assert!(cost.cpu_ms_per_1000[0].1 > 0.0, "{cost:?}");
    }
    // Where PostgreSQL's time went, statement by statement: Leasehold's runs spent some of it
    // on claims: `repo::take_lapsed`'s (whose text begins with the lapsed tasks it cancels),
    // which claims the due tasks of workers that name their process's lease, or
    // `repo::mark_claimed`'s, which records the others.
    if !report
        .skipped
        .iter()
        .any(|s| s.contains("pg_stat_statements"))
    {
        for cost in report.costs.iter().filter(|c| !c.run.contains("graphile")) {
            assert!(
                cost.statements.iter().any(|s| !s.nested
                    && (s.query.starts_with("WITH cancelled AS")
                        || s.query.contains("processor = c.claim_processor"))),
                "{cost:?}"
            );
            assert!(
                cost.statements
                    .iter()
                    .all(|s| s.exec_us_per_task > 0.0 && s.calls_per_task > 0.0),
                "{cost:?}"
            );
        }
    }
    if peers {
        let runs = report
            .figures
            .iter()
            .filter(|f| {
                f.section.starts_with("peers")
                    && f.name.contains('→')
                    && !f.name.contains("idle pickup")
            })
            .collect::<Vec<_>>();
        assert_eq!(runs.len(), 2, "{runs:?}");
        for figure in runs {
            assert_eq!(figure.ops, options.e2e_tasks, "{figure:?}");
        }
        // graphile-worker's idle pickup, every sample taken, beside ours.
        let pickup = report
            .figures
            .iter()
            .find(|f| f.name.starts_with("graphile-worker idle pickup"))
            .unwrap_or_else(|| panic!("no idle pickup of graphile-worker: {:?}", report.figures));
        assert_eq!(pickup.ops as usize, options.pickup_samples, "{pickup:?}");
        assert!(pickup.p99_ms > 0.0, "{pickup:?}");
    }
    // Work in any language: the in-process handler, a command and a push, each draining its
    // whole backlog, with the workers' CPU per task and the ratios to the in-process handler.
    let ways: Vec<_> = report
        .figures
        .iter()
        .filter(|f| f.section.starts_with("work in any language"))
        .collect();
    assert_eq!(ways.len(), 3, "{ways:?}");
    for figure in ways {
        assert_eq!(
            figure.ops, options.work_tasks,
            "every task done: {figure:?}"
        );
        assert_eq!(figure.errors, 0, "{figure:?}");
    }
    for ratio in [
        "push / in-process handler",
        "exec / in-process handler",
        "exec /bin/true: the workers' own CPU",
        "exec /bin/true: the commands' own CPU",
    ] {
        assert!(
            report
                .ratios
                .iter()
                .any(|r| r.name.starts_with(ratio) && r.value > 0.0),
            "{ratio}: {:?}",
            report.ratios
        );
    }
    // A queue limit and a key limit far above the load: each measured beside the unlimited
    // claim, with its ratio.
    for (figure, ratio) in [
        (
            "queue limited to 10,000",
            "limited (not binding) / unlimited",
        ),
        ("100 keys each limited", "keyed (not binding) / unlimited"),
    ] {
        let capped = report
            .figures
            .iter()
            .find(|f| f.name.contains(figure))
            .unwrap_or_else(|| panic!("the figure {figure:?}"));
        assert_eq!(capped.errors, 0, "{capped:?}");
        assert!(
            report.ratios.iter().any(|r| r.name.starts_with(ratio)),
            "{:?}",
            report.ratios
        );
    }
    for figure in &report.figures {
        assert!(figure.ops > 0, "a figure without operations: {figure:?}");
    }
    let e2e = report
        .figures
        .iter()
        .filter(|f| {
            f.name.contains("claim → complete") && !f.section.starts_with("work in any language")
        })
        .collect::<Vec<_>>();
    assert_eq!(e2e.len(), 2);
    for figure in e2e {
        assert_eq!(figure.ops, options.e2e_tasks, "every task done: {figure:?}");
    }
    // Both paths race for every number of shared resources at every client count above one.
    let contended = options.lease_concurrency.iter().filter(|c| **c > 1).count();
    for section in ["contention through HTTP", "contention as direct SQL"] {
        let cycles = report
            .figures
            .iter()
            .filter(|f| f.section == section && f.name.starts_with("acquire + release"))
            .count();
        assert_eq!(
            cycles,
            contended * options.contended_resources.len(),
            "{section}"
        );
    }
    // Per backlog: Leasehold's claim cycle, single and batched end to end, against the sample's;
    // and once each, the claims with a queue limit and with a key limit that do not bind
    // against the claim without.
    let expected_ratios = options.lease_concurrency.len() * 3
        + options.contended_resources.len() * contended
        + options.backlog_sizes.len() * 3
        + 2
        + (options.growth_sizes.len() - 1) * 2
        + 5 * usize::from(peers)
        + 3
        + 6;
    assert_eq!(report.ratios.len(), expected_ratios, "{:?}", report.ratios);
    // Claims beside the heavy reads, all served, and the reads all answered; the charts of a
    // day of history read through task-service, and the raw read they replaced.
    let reads: Vec<_> = report
        .figures
        .iter()
        .filter(|f| f.section.starts_with("claims while heavy reads run"))
        .collect();
    assert_eq!(reads.len(), 3, "{reads:?}");
    for figure in &reads {
        assert_eq!(figure.errors, 0, "{figure:?}");
    }
    let charts: Vec<_> = report
        .figures
        .iter()
        .filter(|f| f.section.starts_with("dashboard charts"))
        .collect();
    assert_eq!(charts.len(), 4, "{charts:?}");
    for figure in &charts {
        assert_eq!(figure.errors, 0, "{figure:?}");
        assert!(
            figure.rows.unwrap() >= options.chart_events / 2,
            "{figure:?}"
        );
    }
    // Every reader paged through every large task, twice.
    let memory = &report.memory[0];
    assert!(memory.rss_peak_mib > 0.0, "{memory:?}");
    let read_each = (options.memory_tasks * memory.task_kib) as f64 / 1024.0;
    assert!(
        memory.mib_read >= read_each * 2.0 * options.memory_readers as f64,
        "{memory:?}"
    );
    let json = serde_json::to_value(&report).unwrap();
    assert!(json["figures"].as_array().unwrap().len() > 10);
}
