//! task-service's resident memory while many readers page through large tasks at once.

use leasehold::task_client::Created;
use leasehold::tasks::CreateTask;
use serde_json::{Value, json};

use super::{Bench, BenchOptions, MemoryFigure, Report};

/// A process's resident set (`VmRSS`) or its peak (`VmHWM`), in MiB, from `/proc`.
fn resident_mib(pid: nix::unistd::Pid, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// The issue this answers: eight concurrent `GET /api/tasks?limit=1000` over 63 KiB tasks took
/// task-service from 42 MB to 1 GB. Stores `memory_tasks` tasks of 63 KiB in a queue of their
/// own, then `memory_readers` readers page through them all at once, twice; reports
/// task-service's resident memory before, at its peak (`VmHWM`, reset first through
/// `clear_refs`) and after.
pub(super) async fn memory(bench: &Bench, options: &BenchOptions, report: &mut Report) {
    const TASK_KIB: u64 = 63;
    const QUEUE: &str = "bench-memory";
    let pad = "m".repeat(usize::try_from(TASK_KIB * 1024 - 64).unwrap_or(0));
    let tasks = bench.task_client();
    let far_future = "2999-01-01T00:00:00Z".parse().unwrap();
    for n in 0..options.memory_tasks {
        let task = CreateTask {
            task_data: json!({"n": n, "pad": pad}),
            queue: Some(QUEUE.to_owned()),
            scheduled_at: Some(far_future),
            ..CreateTask::default()
        };
        let created = tasks.create(&task).await;
        assert!(matches!(created, Ok(Created::New(_))), "{created:?}");
    }
    let pid = bench.tasks.pid();
    let before = resident_mib(pid, "VmRSS");
    // Resets the peak to the current size: what follows is this section's own peak.
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
    // The readers stay raw HTTP: what this section measures is the bytes on the wire.
    let readers: Vec<_> = (0..options.memory_readers)
        .map(|_| {
            let http = bench.http.clone();
            let list = bench.tasks.url("/api/tasks");
            tokio::spawn(async move {
                let (mut pages, mut bytes) = (0u64, 0u64);
                for _ in 0..2 {
                    let mut cursor = String::new();
                    loop {
                        let url = format!("{list}?queue={QUEUE}&limit=1000&cursor={cursor}");
                        let Ok(answer) = http.get(&url).send().await else {
                            break;
                        };
                        let Ok(body) = answer.bytes().await else {
                            break;
                        };
                        pages += 1;
                        bytes += body.len() as u64;
                        let page: Value = serde_json::from_slice(&body).unwrap_or_default();
                        match page["nextCursor"].as_str() {
                            Some(next) => cursor = next.to_owned(),
                            None => break,
                        }
                    }
                }
                (pages, bytes)
            })
        })
        .collect();
    let (mut pages, mut bytes) = (0, 0);
    for reader in readers {
        if let Ok((p, b)) = reader.await {
            pages += p;
            bytes += b;
        }
    }
    let peak = resident_mib(pid, "VmHWM");
    report.memory.push(MemoryFigure {
        tasks: options.memory_tasks,
        task_kib: TASK_KIB,
        readers: options.memory_readers,
        pages,
        mib_read: bytes as f64 / (1024.0 * 1024.0),
        rss_before_mib: before,
        rss_peak_mib: peak,
        rss_after_mib: resident_mib(pid, "VmRSS"),
    });
}
