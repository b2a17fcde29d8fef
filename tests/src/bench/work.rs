//! Work in any language: the same backlog drained by the same workers and slots three ways, the
//! built-in handler in the worker's process, a command per task (`WORKER_EXEC=/bin/true`), and
//! an HTTP request per task to an endpoint that does nothing (`WORKER_PUSH_URL`), each metered.
//! The figures say what each way costs beside the in-process handler: tasks per second and the
//! workers' own CPU per task (a command's own CPU is apart, in what the workers reaped).

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use super::e2e::{backlog, drained, start_workers, wait_done};
use super::{Bench, BenchOptions, Report};
use crate::Service;

/// The section's name.
pub(super) const SECTION: &str = "work in any language (same workers and slots, no-op work)";

/// The three ways, each with what bounds it beyond the claim and the completion.
const WAYS: [(&str, &str); 3] = [
    ("in-process handler", "no I/O of its own per task"),
    ("exec /bin/true", "a process spawned and reaped per task"),
    ("push to a no-op endpoint", "one HTTP round trip per task"),
];

pub(super) async fn any_language(bench: &Bench, options: &BenchOptions, report: &mut Report) {
    let endpoint = NoOpEndpoint::start().await;
    let push_url = format!("http://127.0.0.1:{}/tasks", endpoint.port);
    let mut rates = Vec::new();
    for (way, bound) in WAYS {
        let queue = format!("work-{}", way.split_whitespace().next().unwrap_or(way));
        let handler = match way {
            "exec /bin/true" => Some(("WORKER_EXEC", "/bin/true")),
            "push to a no-op endpoint" => Some(("WORKER_PUSH_URL", push_url.as_str())),
            _ => None,
        };
        let meter = bench.meter().await;
        let (created, _) = backlog(bench, &queue, options.work_tasks).await;
        assert_eq!(created.errors, 0, "the {way} backlog was not all created");
        let slots = options.batch_concurrency;
        let workers = start_workers(
            bench,
            &queue,
            options.workers,
            slots,
            slots,
            handler.as_slice(),
        )
        .await;
        wait_done(&bench.task_db, &queue, options.work_tasks).await;
        let drain = drained(&bench.task_db, &queue).await;
        let pids: Vec<u32> = workers.iter().map(Service::pid_u32).collect();
        let commands_ms: f64 = pids
            .iter()
            .map(|pid| super::cost::reaped_cpu_ms(*pid))
            .sum();
        let run = format!("{way} ({bound})");
        let cost = meter.finish(&run, drain.done as u64, &pids, 0.0).await;
        let workers_ms = cost.cpu_ms_per_1000_of("workers");
        report.costs.push(cost);
        let figure = drain.figure(
            SECTION,
            &format!("{run}: claim → complete"),
            options.workers * slots,
            options.work_tasks,
        );
        let per_second = figure.per_second;
        report.figures.push(figure);
        // The workers' own CPU per task, outside any command (target for exec: at most 1 ms),
        // and the commands' own, which the workers reaped.
        report.ratio(
            format!("{way}: the workers' own CPU ms per task (CPU-bound)"),
            workers_ms,
            1000.0,
        );
        if way.starts_with("exec") {
            report.ratio(
                format!("{way}: the commands' own CPU ms per task"),
                commands_ms,
                drain.done.max(1) as f64,
            );
        }
        rates.push(per_second);
        drop(workers);
    }
    if let [in_process, exec, push] = rates[..] {
        report.ratio(
            "push / in-process handler, tasks/s (target ≥ 0.5)",
            push,
            in_process,
        );
        report.ratio("exec / in-process handler, tasks/s", exec, in_process);
    }
    endpoint.stop();
}

/// An HTTP/1.1 endpoint that answers every request `200 {}` on a kept-alive connection, in the
/// bench's own process: the least an application behind `WORKER_PUSH_URL` can do.
struct NoOpEndpoint {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl NoOpEndpoint {
    async fn start() -> NoOpEndpoint {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream));
            }
        });
        NoOpEndpoint { port, task }
    }

    fn stop(self) {
        self.task.abort();
    }
}

/// Answers each request of one connection, reading its headers and its body.
async fn serve(stream: tokio::net::TcpStream) {
    let (reader, mut writer) = stream.into_split();
    let mut reader = BufReader::new(reader);
    let mut line = String::new();
    loop {
        let mut length = 0usize;
        loop {
            line.clear();
            match reader.read_line(&mut line).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).await.is_err() {
            return;
        }
        let answer =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
        if writer.write_all(answer).await.is_err() {
            return;
        }
    }
}
