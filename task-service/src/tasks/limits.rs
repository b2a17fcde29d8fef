//! Concurrency limits, judged in the claim's transaction.
//!
//! A claim first locks the rows of the limited queues it may take from (one queue's row when it
//! names a queue, every limited queue's when it takes from any), then counts their running
//! tasks: two claims of one limited queue, on any replicas, thus judge its room one after the
//! other, and the second counts what the first committed. A running task holds its slot until
//! it stops running, even after its lease lapsed: a claim that takes the lapsed task again
//! reuses the slot, and one that ends it (dead, cancelled) frees it. So at no instant are more
//! than the limit's tasks of a queue running, which the invariant checker proves from the
//! history (`tests/src/checker.rs`). Unlimited queues are neither locked nor counted.

use std::collections::BTreeMap;

use leasehold::server::ApiError;

use crate::repo::{self, Db, TaskRow};

/// The room left in each limited queue a claim may take from.
#[derive(Debug, Default)]
pub struct Limits {
    rooms: BTreeMap<String, i64>,
    /// Queues whose limit kept this claim from taking what it asked for.
    pub bound: Vec<String>,
}

impl Limits {
    /// Locks the limited queues a claim of `queue` (or of any queue) may take from, and reads
    /// their room.
    pub async fn lock(conn: &mut Db, queue: Option<&str>) -> Result<Limits, ApiError> {
        let named = queue.map(|q| [q]);
        let limits = repo::lock_limits(conn, named.as_ref().map(|q| &q[..])).await?;
        if limits.is_empty() {
            return Ok(Limits::default());
        }
        let names: Vec<&str> = limits.iter().map(|l| l.queue.as_str()).collect();
        let running: BTreeMap<String, i64> = repo::running_counts(conn, &names)
            .await?
            .into_iter()
            .map(|r| (r.queue, r.running))
            .collect();
        let rooms = limits
            .iter()
            .map(|l| {
                let taken = running.get(&l.queue).copied().unwrap_or(0);
                (
                    l.queue.clone(),
                    (i64::from(l.concurrency_limit) - taken).max(0),
                )
            })
            .collect();
        Ok(Limits {
            rooms,
            bound: Vec::new(),
        })
    }

    /// The limited queues with no room: a claim of every queue steps over their tasks.
    pub fn full(&self) -> Vec<&str> {
        self.rooms
            .iter()
            .filter(|(_, room)| **room == 0)
            .map(|(queue, _)| queue.as_str())
            .collect()
    }

    /// How many due tasks a claim that wants `wanted` may lock: for a claim of one limited
    /// queue, no more than its room.
    pub fn cap(&mut self, queue: Option<&str>, wanted: i64) -> i64 {
        match queue.and_then(|q| self.rooms.get(q)) {
            Some(room) if *room < wanted => {
                if let Some(queue) = queue {
                    self.bound.push(queue.to_owned());
                }
                *room
            }
            _ => wanted,
        }
    }

    /// Keeps, in order, the due tasks within their queues' room, and takes that room. Tasks
    /// left out stay locked until the claim commits and are never handed out by it.
    pub fn admit(&mut self, due: Vec<TaskRow>) -> Vec<TaskRow> {
        let mut admitted = Vec::with_capacity(due.len());
        for task in due {
            match self.rooms.get_mut(&task.queue) {
                Some(0) => {
                    if !self.bound.contains(&task.queue) {
                        self.bound.push(task.queue.clone());
                    }
                }
                Some(room) => {
                    *room -= 1;
                    admitted.push(task);
                }
                None => admitted.push(task),
            }
        }
        admitted
    }
}
