//! Requests that arrive together, served together: group commit for task-service's claims and
//! completions and for lease-service's single acquires, renewals and releases.
//!
//! Each such request costs a statement, a commit and its round trips (a claim also a call to
//! lease-service); a group of them costs the same once. A [`Coalescer`] keeps a few
//! groups per key in flight: a request arriving while one is free runs at once (nothing waits
//! under light load); once all are busy, arrivals queue up and go together as the next group,
//! as commits queue behind a WAL flush. Each request still gets its own answer, exactly what it
//! would have got alone; a failure of the group's work as a whole (the database gone, say)
//! is every member's answer.
//!
//! The driver runs as a task of its own, so a member whose client hangs up does not cancel the
//! others; a driver that is dropped unfinished (its runtime stopped) gives its place back, so a
//! key is never left waiting on a driver that will not come. The group's work runs in the span
//! of its first member's request, so a lone request (the common case under light load) keeps
//! one trace from worker to lease-service.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::FutureExt;
use tokio::sync::oneshot;
use tracing::Instrument;

/// The work of one group: the members' items, in arrival order, to their outcomes, one each in
/// the same order.
pub type GroupWork<K, I, O> =
    Box<dyn Fn(K, Vec<I>) -> Pin<Box<dyn Future<Output = Vec<O>> + Send>> + Send + Sync>;

/// How many of the waiting items, from the front, form the next group (at least one is taken).
pub type Choose<I> = fn(&[I]) -> usize;

/// How many of `keys`, from the front and at most `max`, are distinct: the [`Choose`] of a
/// group whose one statement may touch a row only once (a repeat waits for the next group).
pub fn distinct_prefix<T: Hash + Eq>(keys: impl IntoIterator<Item = T>, max: usize) -> usize {
    let mut seen = std::collections::HashSet::new();
    for key in keys.into_iter().take(max) {
        if !seen.insert(key) {
            break;
        }
    }
    seen.len()
}

/// A coalescer whose groups run `serve`: the one way both services build theirs. `serve`
/// answers each member, in order, or fails as a whole (no connection, a database error); then
/// that failure is every member's answer, since no member's statement ran alone.
pub fn grouped<K, I, T, E, F, Fut>(
    in_flight: usize,
    choose: Choose<I>,
    serve: F,
) -> Coalescer<K, I, Result<T, E>>
where
    K: Hash + Eq + Clone + Send + 'static,
    I: Send + 'static,
    T: Send + 'static,
    E: Clone + Send + 'static,
    F: Fn(K, Vec<I>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Vec<Result<T, E>>, E>> + Send + 'static,
{
    Coalescer::new(
        in_flight,
        choose,
        Box::new(move |key, items: Vec<I>| {
            let members = items.len();
            let served = serve(key, items);
            Box::pin(async move {
                served
                    .await
                    .unwrap_or_else(|err| (0..members).map(|_| Err(err.clone())).collect())
            })
        }),
    )
}

/// The members waiting for one key: their items (what [`Choose`] looks at) and, in the same
/// order, where their answers go.
struct Queue<I, O> {
    items: Vec<I>,
    members: Vec<(tracing::Span, oneshot::Sender<O>)>,
    /// Drivers serving this key now, each with at most one group in flight.
    drivers: usize,
}

struct Shared<K, I, O> {
    /// Members waiting, by key. A key is present exactly while a driver serves it.
    waiting: Mutex<HashMap<K, Queue<I, O>>>,
    /// Most groups of one key in flight at once.
    in_flight: usize,
    choose: Choose<I>,
    work: GroupWork<K, I, O>,
}

/// Gathers concurrent requests with the same key into groups; see the module docs.
pub struct Coalescer<K, I, O> {
    shared: Arc<Shared<K, I, O>>,
}

impl<K, I, O> Clone for Coalescer<K, I, O> {
    fn clone(&self) -> Self {
        Coalescer {
            shared: self.shared.clone(),
        }
    }
}

impl<K, I, O> std::fmt::Debug for Coalescer<K, I, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coalescer").finish_non_exhaustive()
    }
}

impl<K, I, O> Coalescer<K, I, O>
where
    K: Hash + Eq + Clone + Send + 'static,
    I: Send + 'static,
    O: Send + 'static,
{
    /// `choose` says how many of the waiting members (a prefix) form the next group; `work`
    /// serves a group; up to `in_flight` groups of a key run at once (at least one). A request
    /// arriving while fewer are in flight starts a group of its own at once; only when all are
    /// busy do arrivals wait, and then they go together.
    pub fn new(in_flight: usize, choose: Choose<I>, work: GroupWork<K, I, O>) -> Self {
        Coalescer {
            shared: Arc::new(Shared {
                waiting: Mutex::new(HashMap::new()),
                in_flight: in_flight.max(1),
                choose,
                work,
            }),
        }
    }

    /// Serves `item` in the next group of `key`; `None` only if the group's work panicked.
    pub async fn submit(&self, key: K, item: I) -> Option<O> {
        let (reply, answer) = oneshot::channel();
        let member = (tracing::Span::current(), reply);
        let start_driver = {
            let mut waiting = self
                .shared
                .waiting
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let queue = waiting.entry(key.clone()).or_insert_with(|| Queue {
                items: Vec::new(),
                members: Vec::new(),
                drivers: 0,
            });
            queue.items.push(item);
            queue.members.push(member);
            let start = queue.drivers < self.shared.in_flight;
            if start {
                queue.drivers += 1;
            }
            start
        };
        if start_driver {
            tokio::spawn(drive(self.shared.clone(), key));
        }
        answer.await.ok()
    }
}

/// A driver's place in its key's count, given back when the driver ends however it ends. If
/// the last driver of a key is dropped unfinished, the members still waiting are dropped too:
/// their requests fail (and are retried by their workers) rather than wait forever.
struct Place<K: Hash + Eq, I, O> {
    shared: Arc<Shared<K, I, O>>,
    key: K,
}

impl<K: Hash + Eq, I, O> Drop for Place<K, I, O> {
    fn drop(&mut self) {
        let mut waiting = self
            .shared
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(queue) = waiting.get_mut(&self.key) {
            queue.drivers = queue.drivers.saturating_sub(1);
            if queue.drivers == 0 {
                waiting.remove(&self.key);
            }
        }
    }
}

/// Serves `key`'s groups one after another until none is waiting.
async fn drive<K, I, O>(shared: Arc<Shared<K, I, O>>, key: K)
where
    K: Hash + Eq + Clone + Send + 'static,
    I: Send + 'static,
    O: Send + 'static,
{
    let _place = Place {
        shared: shared.clone(),
        key: key.clone(),
    };
    loop {
        let (items, members) = {
            let mut waiting = shared
                .waiting
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let Some(queue) = waiting.get_mut(&key) else {
                return;
            };
            if queue.items.is_empty() {
                // `_place` gives the driver's place back.
                return;
            }
            let count = (shared.choose)(&queue.items).clamp(1, queue.items.len());
            let items: Vec<I> = queue.items.drain(..count).collect();
            let members: Vec<_> = queue.members.drain(..count).collect();
            (items, members)
        };
        let span = members
            .first()
            .map_or_else(tracing::Span::none, |(span, _)| span.clone());
        let work = (shared.work)(key.clone(), items).instrument(span);
        // A panic fails this group's members (their answers are dropped), not the key.
        if let Ok(outcomes) = AssertUnwindSafe(work).catch_unwind().await {
            for ((_, reply), outcome) in members.into_iter().zip(outcomes) {
                // The member may have given up waiting; its outcome stands all the same.
                let _ = reply.send(outcome);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    /// A coalescer whose work records each group's size, answers each item doubled, sleeps
    /// a little (so that arrivals pile up behind it) and panics on the item 1000.
    fn doubler(in_flight: usize, groups: Arc<Mutex<Vec<usize>>>) -> Coalescer<u8, u32, u32> {
        let running: Arc<[AtomicUsize; 2]> = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
        Coalescer::new(
            in_flight,
            |items: &[u32]| items.len().min(10),
            Box::new(move |key: u8, items: Vec<u32>| {
                let groups = groups.clone();
                let running = running.clone();
                Box::pin(async move {
                    /// Counts a group out however it ends, even dropped mid-sleep.
                    struct Running<'a>(&'a AtomicUsize);
                    impl Drop for Running<'_> {
                        fn drop(&mut self) {
                            self.0.fetch_sub(1, Ordering::SeqCst);
                        }
                    }
                    let running = &running[usize::from(key)];
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    let _running = Running(running);
                    assert!(now <= in_flight, "{now} groups of one key in flight");
                    groups.lock().unwrap().push(items.len());
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    assert!(!items.contains(&1000), "the item 1000");
                    items.into_iter().map(|i| i * 2).collect()
                })
            }),
        )
    }

    #[tokio::test]
    async fn concurrent_requests_go_in_groups_and_each_gets_its_own_answer() {
        let groups = Arc::new(Mutex::new(Vec::new()));
        let coalescer = doubler(1, groups.clone());
        let answers = futures_util::future::join_all((0..40u32).map(|i| {
            let coalescer = coalescer.clone();
            async move { (i, coalescer.submit(0, i).await) }
        }))
        .await;
        for (i, answer) in answers {
            assert_eq!(answer, Some(i * 2));
        }
        let groups = groups.lock().unwrap().clone();
        assert_eq!(groups.iter().sum::<usize>(), 40);
        assert!(groups.iter().all(|size| *size <= 10), "{groups:?}");
        // Requests that waited went together, at most ten at a time as `choose` says.
        assert!(groups.len() <= 6, "{groups:?}");
        assert!(coalescer.shared.waiting.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn groups_in_flight_are_bounded_per_key_and_keys_do_not_wait_on_each_other() {
        let groups = Arc::new(Mutex::new(Vec::new()));
        let coalescer = doubler(2, groups.clone());
        let answers = futures_util::future::join_all((0..30u32).map(|i| {
            let coalescer = coalescer.clone();
            // Keys 0 and 1: the bound holds for each (asserted inside the work).
            async move { coalescer.submit(u8::from(i % 2 == 0), i).await }
        }))
        .await;
        assert!(answers.iter().all(Option::is_some));
        assert_eq!(groups.lock().unwrap().iter().sum::<usize>(), 30);
    }

    #[tokio::test]
    async fn a_driver_dropped_with_its_runtime_leaves_the_key_servable() {
        let groups = Arc::new(Mutex::new(Vec::new()));
        let coalescer = doubler(1, groups);
        // A runtime that stops while its driver's group is at work, as an HTTP worker's
        // runtime does at shutdown.
        let stranded = coalescer.clone();
        std::thread::spawn(move || {
            let doomed = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            doomed.block_on(async move {
                tokio::spawn(async move { stranded.submit(0, 1).await });
                tokio::time::sleep(Duration::from_millis(5)).await;
            });
        })
        .join()
        .unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(5), coalescer.submit(0, 2)).await;
        assert_eq!(
            answer,
            Ok(Some(4)),
            "the key waits on a driver that is gone"
        );
    }

    #[test]
    fn a_group_stops_before_its_first_repeat() {
        assert_eq!(distinct_prefix([1, 2, 3, 2, 4], 10), 3);
        assert_eq!(distinct_prefix([1, 2, 3, 4], 2), 2);
        assert_eq!(distinct_prefix([7, 7], 10), 1);
        assert_eq!(distinct_prefix(Vec::<u8>::new(), 10), 0);
    }

    #[tokio::test]
    async fn a_panicking_group_fails_its_members_only() {
        let groups = Arc::new(Mutex::new(Vec::new()));
        let coalescer = doubler(1, groups);
        assert_eq!(coalescer.submit(0, 1000).await, None);
        assert_eq!(coalescer.submit(0, 4).await, Some(8));
    }
}
