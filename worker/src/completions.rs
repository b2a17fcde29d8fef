//! Completions, gathered into batches the way a database gathers commits.
//!
//! Every runner hands its completion to one [`Completer`] and awaits its own answer. The
//! completer sends at once whatever has arrived: one completion alone goes to
//! `PUT /{id}/complete` as before; several that arrived while the previous request was in
//! flight go together to `PUT /api/tasks/complete`, which costs task-service one transaction and
//! lease-service one call for all of them. Under light load nothing waits; under heavy load the
//! batches grow by themselves. A runner's retry logic is unchanged: each answer is that task's
//! own, exactly what its single request would have got.

use std::sync::Arc;

use leasehold::tasks::{CompleteItem, Task};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use leasehold::task_client::{CallError, TaskClient};

/// Most completions in one request: task-service's limit.
pub const MAX_COMPLETION_BATCH: usize = leasehold::tasks::MAX_COMPLETE_BATCH;

type Answer = Result<Option<Task>, CallError>;

struct Pending {
    item: CompleteItem,
    reply: oneshot::Sender<Answer>,
}

/// The front of the batching loop; the loop ends when this is dropped.
#[derive(Debug, Clone)]
pub struct Completer {
    queue: mpsc::UnboundedSender<Pending>,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("id", &self.item.id)
            .finish()
    }
}

impl Completer {
    /// Starts the loop that sends `processor`'s completions through `client`.
    pub fn start(client: Arc<TaskClient>, processor: String) -> Completer {
        let (queue, incoming) = mpsc::unbounded_channel();
        tokio::spawn(send_batches(client, processor, incoming));
        Completer { queue }
    }

    /// Completes task `id` (with `fence`, if known), as `PUT /{id}/complete` would.
    pub async fn complete(&self, id: i64, fence: Option<i64>, task_output: Value) -> Answer {
        let (reply, answer) = oneshot::channel();
        let item = CompleteItem {
            id,
            task_output,
            fence,
        };
        if self.queue.send(Pending { item, reply }).is_err() {
            return Err(CallError::Transient(
                "the completion sender has stopped".to_owned(),
            ));
        }
        answer.await.unwrap_or_else(|_| {
            Err(CallError::Transient(
                "the completion was dropped unanswered".to_owned(),
            ))
        })
    }
}

async fn send_batches(
    client: Arc<TaskClient>,
    processor: String,
    mut incoming: mpsc::UnboundedReceiver<Pending>,
) {
    while let Some(first) = incoming.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_COMPLETION_BATCH
            && let Ok(more) = incoming.try_recv()
        {
            batch.push(more);
        }
        if batch.len() == 1 {
            for Pending { item, reply } in batch {
                let answer = client
                    .complete(item.id, &processor, item.fence, item.task_output)
                    .await;
                let _ = reply.send(answer);
            }
            continue;
        }
        let (items, replies): (Vec<CompleteItem>, Vec<oneshot::Sender<Answer>>) =
            batch.into_iter().map(|p| (p.item, p.reply)).unzip();
        let count = items.len();
        match client.complete_many(&processor, items).await {
            Ok(answers) if answers.len() == count => {
                for (reply, answer) in replies.into_iter().zip(answers) {
                    let _ = reply.send(answer);
                }
            }
            Ok(answers) => {
                let reason = format!(
                    "task-service answered {} results for {count} completions",
                    answers.len()
                );
                for reply in replies {
                    let _ = reply.send(Err(CallError::Transient(reason.clone())));
                }
            }
            Err(err) => {
                for reply in replies {
                    let _ = reply.send(Err(err.clone()));
                }
            }
        }
    }
}
