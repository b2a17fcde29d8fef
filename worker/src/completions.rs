//! Completions, gathered into batches the way a database gathers commits, and carried by the
//! next claim when one is about to be sent.
//!
//! Every runner hands its completion to one [`Completer`] and awaits its own answer. Where it
//! goes depends on what the claim loop is doing:
//! - waiting for a free slot, or idle between claims: the completion frees a slot, so the claim
//!   loop takes it ([`Riders`]) and sends it with its claim of the next tasks, in one
//!   `PUT /api/tasks/complete` with `next`: one request and one transaction in task-service
//!   where a completion and a claim took two of each;
//! - with a claim in flight (which may wait for work), or stopping: it is sent on its own, at
//!   once. One completion alone goes to `PUT /{id}/complete`; several that arrived while the
//!   previous request was in flight go together to `PUT /api/tasks/complete`.
//!
//! Under light load nothing waits; under heavy load the batches grow by themselves. A runner's
//! retry logic is unchanged: each answer is that task's own, exactly what its single request
//! would have got.

use std::sync::{Arc, Mutex, PoisonError};

use leasehold::tasks::{ClaimNext, CompleteItem, Task};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use leasehold::task_client::{CallError, TaskClient};

/// Most completions in one request: task-service's limit.
pub const MAX_COMPLETION_BATCH: usize = leasehold::tasks::MAX_COMPLETE_BATCH;

type Answer = Result<Option<Task>, CallError>;

/// One completion waiting to be sent, and where its answer goes.
pub(crate) struct Pending {
    item: CompleteItem,
    reply: oneshot::Sender<Answer>,
}

/// Where completions go while the claim loop takes them: closed (`None`) once it stops.
type Gate = Arc<Mutex<Option<mpsc::UnboundedSender<Pending>>>>;

/// The front of the completion paths; the standalone loop ends when every clone is dropped.
#[derive(Debug, Clone)]
pub struct Completer {
    alone: mpsc::UnboundedSender<Pending>,
    riders: Gate,
}

/// The claim loop's end of the completions: those that ride its next claim.
pub(crate) struct Riders {
    incoming: mpsc::UnboundedReceiver<Pending>,
    gate: Gate,
    alone: mpsc::UnboundedSender<Pending>,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("id", &self.item.id)
            .finish()
    }
}

impl Completer {
    /// Starts the loop that sends `processor`'s completions on their own through `client`;
    /// the [`Riders`] are the claim loop's.
    pub(crate) fn start(client: Arc<TaskClient>, processor: String) -> (Completer, Riders) {
        let (alone, incoming) = mpsc::unbounded_channel();
        tokio::spawn(send_batches(client, processor, incoming));
        let (to_claims, riding) = mpsc::unbounded_channel();
        let gate = Arc::new(Mutex::new(Some(to_claims)));
        let riders = Riders {
            incoming: riding,
            gate: gate.clone(),
            alone: alone.clone(),
        };
        (
            Completer {
                alone,
                riders: gate,
            },
            riders,
        )
    }

    /// Completes task `id` (with `fence`, if known), as `PUT /{id}/complete` would.
    pub async fn complete(&self, id: i64, fence: Option<i64>, task_output: Value) -> Answer {
        let (reply, answer) = oneshot::channel();
        let item = CompleteItem {
            id,
            task_output,
            fence,
        };
        let pending = Pending { item, reply };
        // Under the gate's lock, so that the claim loop, closing it, sees every rider it let in.
        let unsent = {
            let gate = self.riders.lock().unwrap_or_else(PoisonError::into_inner);
            match gate.as_ref() {
                Some(claims) => claims.send(pending).err().map(|returned| returned.0),
                None => Some(pending),
            }
        };
        if let Some(pending) = unsent
            && self.alone.send(pending).is_err()
        {
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

impl Riders {
    /// The next completion handed in; never resolves once none can come.
    pub(crate) async fn next(&mut self) -> Pending {
        match self.incoming.recv().await {
            Some(pending) => pending,
            None => std::future::pending().await,
        }
    }

    /// A completion already handed in, if any.
    pub(crate) fn try_next(&mut self) -> Option<Pending> {
        self.incoming.try_recv().ok()
    }

    /// `first` and the completions waiting behind it, up to one request's worth.
    pub(crate) fn gather(&mut self, first: Pending) -> Vec<Pending> {
        gather(first, &mut self.incoming)
    }

    /// Sends a completion on its own, now: no claim can take it soon.
    pub(crate) fn send_alone(&self, pending: Pending) {
        if let Err(returned) = self.alone.send(pending) {
            let _ = returned.0.reply.send(Err(CallError::Transient(
                "the completion sender has stopped".to_owned(),
            )));
        }
    }

    /// Stops taking completions: those already handed in, and every later one, go on their own.
    pub(crate) fn close(mut self) {
        self.gate
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        while let Ok(pending) = self.incoming.try_recv() {
            self.send_alone(pending);
        }
    }

    /// Sends `riders` with a claim of the next tasks (`next`) in one request, and answers each
    /// rider. The claimed tasks; `None` when nothing was claimed for want of an answer: the
    /// caller then claims as usual. Should the exchange fail as a whole (a refusal of the claim
    /// it carried as much as a timeout), the completions go on their own at once, so that
    /// nothing about the claim can turn into a verdict on them.
    pub(crate) async fn carry(
        &self,
        client: &TaskClient,
        processor: &str,
        riders: Vec<Pending>,
        next: ClaimNext,
    ) -> Option<Result<Vec<Task>, CallError>> {
        let items: Vec<CompleteItem> = riders.iter().map(|p| p.item.clone()).collect();
        match client
            .complete_then_claim(processor, items, Some(next))
            .await
        {
            Ok((answers, claimed)) => {
                let replies = riders.into_iter().map(|p| p.reply).collect();
                reply_each(replies, Ok(answers))
                    .then_some(claimed)
                    .flatten()
            }
            Err(err) => {
                tracing::debug!(error = %err, "a completion carrying a claim failed; sending it alone");
                for rider in riders {
                    self.send_alone(rider);
                }
                None
            }
        }
    }
}

/// Answers each completion of a batch with its result, in order, or all with the failure of the
/// whole exchange. False when the batch was not answered item by item.
fn reply_each(
    replies: Vec<oneshot::Sender<Answer>>,
    answers: Result<Vec<Answer>, CallError>,
) -> bool {
    let count = replies.len();
    let failure = match answers {
        Ok(answers) if answers.len() == count => {
            for (reply, answer) in replies.into_iter().zip(answers) {
                let _ = reply.send(answer);
            }
            return true;
        }
        Ok(answers) => CallError::Transient(format!(
            "task-service answered {} results for {count} completions",
            answers.len()
        )),
        Err(err) => err,
    };
    for reply in replies {
        let _ = reply.send(Err(failure.clone()));
    }
    false
}

/// `first` and what waits behind it in `incoming`, up to one request's worth.
fn gather(first: Pending, incoming: &mut mpsc::UnboundedReceiver<Pending>) -> Vec<Pending> {
    let mut batch = vec![first];
    while batch.len() < MAX_COMPLETION_BATCH
        && let Ok(more) = incoming.try_recv()
    {
        batch.push(more);
    }
    batch
}

async fn send_batches(
    client: Arc<TaskClient>,
    processor: String,
    mut incoming: mpsc::UnboundedReceiver<Pending>,
) {
    while let Some(first) = incoming.recv().await {
        let batch = gather(first, &mut incoming);
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
        reply_each(replies, client.complete_many(&processor, items).await);
    }
}
