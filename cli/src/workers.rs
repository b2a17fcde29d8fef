//! `leasehold workers`: the worker processes, live and gone, as their liveness leases show them.

use clap::Subcommand;
use leasehold::workers::{WorkerLiveness, WorkerState};

use crate::api::Api;
use crate::out::{Out, Shown, Tone, View, WatchArgs, or_dash, table, time};

#[derive(Debug, Subcommand)]
pub enum WorkerCommand {
    /// Every worker process: live ones (busy and idle slots, tasks done, last beat) first, then
    /// those that stopped or were lost (their lease lapsed) while lease-service remembers them.
    List {
        #[command(flatten)]
        watch: WatchArgs,
    },
}

pub(crate) async fn workers(api: &Api, out: &Out, command: WorkerCommand) -> anyhow::Result<()> {
    match command {
        WorkerCommand::List { watch } => {
            out.watch(&watch, || async {
                let listed = api
                    .tasks
                    .workers()
                    .await
                    .map_err(api.tasks_failed("GET", "/api/workers"))?;
                let text = out.render(&listed, |listed| {
                    Ok(worker_table(&listed.workers, out.view()))
                })?;
                Ok(Shown::new(text))
            })
            .await
        }
    }
}

fn worker_table(workers: &[WorkerState], view: View) -> String {
    let rows: Vec<Vec<String>> = workers
        .iter()
        .map(|w| {
            let info = w.info.as_ref();
            let (state, tone) = match w.liveness {
                WorkerLiveness::Alive => ("alive", Tone::Good),
                WorkerLiveness::Late => ("late", Tone::Waiting),
                WorkerLiveness::Stopped => ("stopped", Tone::Over),
                WorkerLiveness::Lost => ("lost", Tone::Bad),
            };
            let mut row = vec![
                w.id.clone(),
                view.paint(state, tone),
                or_dash(info.map(|i| i.host.clone())),
                or_dash(info.map(|i| i.queue.clone().unwrap_or_else(|| "(any)".to_owned()))),
                or_dash(info.map(|i| format!("{}/{}", i.busy, i.concurrency))),
                or_dash(info.map(|i| i.done.to_string())),
                time(&w.last_beat_at),
            ];
            if view.wide {
                row.extend([
                    or_dash(info.map(|i| i.version.clone())),
                    time(&w.since),
                    time(&w.until),
                ]);
            }
            row
        })
        .collect();
    let mut headers = vec!["ID", "STATE", "HOST", "QUEUE", "BUSY", "DONE", "LAST BEAT"];
    if view.wide {
        headers.extend(["VERSION", "SINCE", "UNTIL"]);
    }
    table(&headers, &rows)
}
