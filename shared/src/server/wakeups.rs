//! Wake-ups: requests that wait for something the database will announce (a task becoming due,
//! a lease being released) are woken the moment it happens, instead of polling.
//!
//! The database tells: a trigger notifies a channel with a JSON list of [`Pending`] entries:
//! per key (a task queue, a lease resource), how many became available and in how many
//! milliseconds the earliest is due. [`listen`] holds one connection that LISTENs and hands each
//! notification to [`Wakeups::notified`], which wakes that many waiters of the key, oldest
//! first (news of one task wakes one claim, not all of them), now or by a timer when it is due
//! later.
//!
//! A notification can be lost: the listening connection drops, the database fails over, time
//! alone makes something available (a lease lapses) without any statement. So a waiter also
//! looks again on its own every [`Wakeups::recheck`], and when the listener (re)connects every
//! waiter looks at once.
//!
//! A service may bound how many requests wait at once ([`Wakeups::with_limit`]): each waits
//! only once [`Wakeups::admit`] lets it, and one past the bound answers at once, as if it had
//! not asked to wait. A waiting request holds memory (its connection, its buffers, its place in
//! line) for as long as it waits; without a bound, enough of them exhaust the replica.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::database::Database;
use crate::retry::Backoff;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio::sync::oneshot;
use tokio_postgres::Notification;
use tokio_util::sync::CancellationToken;

/// How long a waiter waits without news before it looks again anyway, by default: the bound on
/// how late a lost notification is made up for.
pub const RECHECK: Duration = Duration::from_secs(2);

/// The waiting requests of this replica, and the stop that releases them all.
#[derive(Clone)]
pub struct Wakeups {
    shared: Arc<Shared>,
}

struct Shared {
    /// In arrival order.
    waiting: Mutex<VecDeque<Waiter>>,
    stop: CancellationToken,
    recheck: Duration,
    /// The requests waiting now (a service's `*_waiting` gauge).
    gauge: prometheus::IntGauge,
    /// The requests [`Wakeups::admit`] let wait that have not finished yet.
    admitted: AtomicUsize,
    /// The most it lets wait at once.
    limit: usize,
    /// More than [`KEPT_CAPACITY`] waited at once since the line last emptied: when it empties,
    /// the heap they freed is given back ([`super::memory`]).
    burst: AtomicBool,
}

/// The bound on line length below which the line keeps its capacity when it empties: a line
/// that grew past it gives the memory back.
const KEPT_CAPACITY: usize = 64;

struct Waiter {
    /// `None`: any key (a claim from every queue).
    key: Option<String>,
    wake: oneshot::Sender<()>,
}

impl std::fmt::Debug for Wakeups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wakeups")
            .field("waiting", &self.lock().len())
            .finish()
    }
}

/// Counts a request as waiting for as long as it lives, however the wait ends (the request may
/// be dropped mid-wait when its client hangs up).
struct Counted<'g>(&'g prometheus::IntGauge);

impl<'g> Counted<'g> {
    fn new(gauge: &'g prometheus::IntGauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// One entry of a notification: `count` things of `key` became available, the earliest due in
/// `due_in_ms` (by the database's clock, when it notified).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pending {
    pub key: String,
    pub count: usize,
    pub due_in_ms: u64,
}

impl Wakeups {
    /// Waiters are released (to answer at once) once `stop` is cancelled; without news
    /// they look again every `recheck`.
    /// `gauge` counts the requests waiting.
    pub fn new(stop: CancellationToken, recheck: Duration, gauge: prometheus::IntGauge) -> Self {
        Self::with_limit(stop, recheck, gauge, usize::MAX)
    }

    /// [`Wakeups::new`] that lets at most `limit` requests wait at once ([`Wakeups::admit`]).
    pub fn with_limit(
        stop: CancellationToken,
        recheck: Duration,
        gauge: prometheus::IntGauge,
        limit: usize,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                waiting: Mutex::new(VecDeque::new()),
                stop,
                recheck,
                gauge,
                admitted: AtomicUsize::new(0),
                limit,
                burst: AtomicBool::new(false),
            }),
        }
    }

    /// Lets one more request wait, if fewer than the limit do: it may wait (take tickets, wait
    /// for them) for as long as it keeps the [`Admission`]. `None`: the line is full, so the
    /// request answers at once, as if it had not asked to wait.
    pub fn admit(&self) -> Option<Admission> {
        let limit = self.shared.limit;
        self.shared
            .admitted
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|before| {
                if before >= KEPT_CAPACITY {
                    self.shared.burst.store(true, Ordering::Relaxed);
                }
                Admission {
                    wakeups: self.clone(),
                }
            })
    }

    /// Waits for `ticket`'s news, at most until `until` and never past [`Wakeups::recheck`],
    /// counted in the gauge meanwhile; `false` when the service is stopping (answer at once).
    pub async fn wait(&self, ticket: oneshot::Receiver<()>, until: tokio::time::Instant) -> bool {
        let until = until.min(tokio::time::Instant::now() + self.shared.recheck);
        let _counted = Counted::new(&self.shared.gauge);
        tokio::select! {
            () = self.shared.stop.cancelled() => false,
            _ = ticket => true,
            () = tokio::time::sleep_until(until) => true,
        }
    }

    /// How long a waiter waits without news before it looks again.
    pub fn recheck(&self) -> Duration {
        self.shared.recheck
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Waiter>> {
        self.shared
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Cancelled when the service stops: waiting requests answer at once.
    pub fn stopping(&self) -> &CancellationToken {
        &self.shared.stop
    }

    /// A place in line for news of `key` (of every key for `None`). Taken *before* the look
    /// that may find nothing, so what becomes available meanwhile is not missed.
    pub fn ticket(&self, key: Option<&str>) -> oneshot::Receiver<()> {
        let (wake, ticket) = oneshot::channel();
        let mut waiting = self.lock();
        // Waiters that gave up (answered, timed out, hung up) leave their place behind; sweep
        // them now and then so the line stays as long as the waiting claims.
        if waiting.len() >= 64 && waiting.len().is_power_of_two() {
            waiting.retain(|waiter| !waiter.wake.is_closed());
            give_back(&mut waiting);
        }
        waiting.push_back(Waiter {
            key: key.map(str::to_owned),
            wake,
        });
        ticket
    }

    /// Wakes up to `count` waiters for `key`, oldest first.
    pub fn wake(&self, key: &str, count: usize) {
        let mut waiting = self.lock();
        let mut woken = 0;
        let mut index = 0;
        while woken < count && index < waiting.len() {
            let wants = waiting
                .get(index)
                .is_some_and(|w| w.key.as_deref().is_none_or(|k| k == key));
            if !wants {
                index += 1;
                continue;
            }
            if let Some(waiter) = waiting.remove(index)
                && waiter.wake.send(()).is_ok()
            {
                woken += 1;
            }
        }
        give_back(&mut waiting);
    }

    /// Wakes every waiter: news may have been lost.
    pub fn wake_all(&self) {
        let mut waiting = self.lock();
        for waiter in waiting.drain(..) {
            let _ = waiter.wake.send(());
        }
        give_back(&mut waiting);
    }

    /// Drops the places of waiters that left, and gives back the memory of a line that grew
    /// long and emptied.
    fn tidy(&self) {
        let mut waiting = self.lock();
        waiting.retain(|waiter| !waiter.wake.is_closed());
        give_back(&mut waiting);
    }

    /// Acts on one notification's payload: wakes for what is due now, and sets a timer for what
    /// is due later. A payload that does not read wakes everyone.
    pub fn notified(&self, payload: &str) {
        let Ok(Some(pending)) = serde_json::from_str::<Option<Vec<Pending>>>(payload) else {
            self.wake_all();
            return;
        };
        for Pending {
            key,
            count,
            due_in_ms,
        } in pending
        {
            if due_in_ms == 0 {
                self.wake(&key, count);
            } else {
                let wakeups = self.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        () = wakeups.shared.stop.cancelled() => {}
                        () = tokio::time::sleep(Duration::from_millis(due_in_ms)) => {
                            wakeups.wake(&key, count);
                        }
                    }
                });
            }
        }
    }
}

/// A request's leave to wait ([`Wakeups::admit`]); it frees its place when dropped, however the
/// request ends. The last to leave tidies the line.
pub struct Admission {
    wakeups: Wakeups,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Admission")
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        if self.wakeups.shared.admitted.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.wakeups.tidy();
            if self.wakeups.shared.burst.swap(false, Ordering::Relaxed) {
                super::memory::give_back_after_a_burst();
            }
        }
    }
}

/// A line far shorter than it once grew (and than [`KEPT_CAPACITY`]) gives its memory back.
fn give_back(waiting: &mut VecDeque<Waiter>) {
    let room = KEPT_CAPACITY.max(2 * waiting.len());
    if waiting.capacity() > 2 * room {
        waiting.shrink_to(room);
    }
}

/// Listens on `channel` until `stop`, as `application_name` (so an operator can tell the
/// connection apart), reconnecting with backoff whenever the connection fails; after each
/// (re)connection every waiter looks again, since news may have been missed.
pub async fn listen(
    database: Database,
    channel: &'static str,
    application_name: &'static str,
    wakeups: Wakeups,
    stop: CancellationToken,
) {
    let mut retries = Backoff::new(Duration::from_millis(100), Duration::from_secs(5)).waits();
    loop {
        let session = async {
            let (mut conn, mut notifications) = database.connect_listening().await?;
            diesel::sql_query(format!("SET application_name = '{application_name}'"))
                .execute(&mut conn)
                .await?;
            diesel::sql_query(format!("LISTEN {channel}"))
                .execute(&mut conn)
                .await?;
            tracing::info!(channel, "listening for wake-ups");
            wakeups.wake_all();
            retries.reset();
            relay(&mut conn, &mut notifications, &wakeups).await
        };
        let ended = tokio::select! {
            () = stop.cancelled() => return,
            ended = session => ended,
        };
        let reason = match ended {
            Ok(()) => "the connection closed".to_owned(),
            Err(err) => err.to_string(),
        };
        tracing::warn!(channel, %reason, "the wake-up listener lost its connection; reconnecting");
        wakeups.wake_all();
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(retries.next_delay()) => {}
        }
    }
}

/// Hands notifications to `wakeups` until the connection fails. A ping after each quiet
/// [`Wakeups::recheck`] finds a connection that died without a word.
async fn relay(
    conn: &mut AsyncPgConnection,
    notifications: &mut mpsc::UnboundedReceiver<Notification>,
    wakeups: &Wakeups,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    loop {
        let news = tokio::time::timeout(wakeups.recheck(), notifications.recv()).await;
        match news {
            Ok(Some(notification)) => wakeups.notified(notification.payload()),
            // The connection ended: its driver dropped the sender.
            Ok(None) => return Ok(()),
            Err(_quiet) => {
                diesel::sql_query("SELECT 1").execute(conn).await?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn gauge() -> prometheus::IntGauge {
        prometheus::IntGauge::new("waiting", "waiting").unwrap()
    }

    fn woken(ticket: &mut oneshot::Receiver<()>) -> bool {
        ticket.try_recv().is_ok()
    }

    #[tokio::test]
    async fn a_notification_wakes_as_many_waiters_as_tasks_oldest_first() {
        let wakeups = Wakeups::new(CancellationToken::new(), RECHECK, gauge());
        let mut a1 = wakeups.ticket(Some("a"));
        let mut any = wakeups.ticket(None);
        let mut b = wakeups.ticket(Some("b"));
        let mut a2 = wakeups.ticket(Some("a"));
        wakeups.notified(r#"[{"key":"a","count":1,"dueInMs":0}]"#);
        assert!(woken(&mut a1));
        assert!(!woken(&mut any) && !woken(&mut b) && !woken(&mut a2));
        wakeups.wake("a", 5);
        assert!(woken(&mut any) && woken(&mut a2));
        assert!(!woken(&mut b), "another queue's waiter sleeps on");
    }

    #[tokio::test]
    async fn a_waiter_that_left_takes_no_wake_up() {
        let wakeups = Wakeups::new(CancellationToken::new(), RECHECK, gauge());
        drop(wakeups.ticket(Some("a")));
        let mut second = wakeups.ticket(Some("a"));
        wakeups.wake("a", 1);
        assert!(woken(&mut second));
    }

    #[tokio::test]
    async fn past_the_limit_a_request_is_not_let_wait_until_one_leaves() {
        let wakeups = Wakeups::with_limit(CancellationToken::new(), RECHECK, gauge(), 2);
        let first = wakeups.admit().unwrap();
        let second = wakeups.admit().unwrap();
        assert!(wakeups.admit().is_none());
        drop(first);
        let third = wakeups.admit().unwrap();
        assert!(wakeups.admit().is_none());
        drop((second, third));
        assert!(
            Wakeups::new(CancellationToken::new(), RECHECK, gauge())
                .admit()
                .is_some()
        );
    }

    #[tokio::test]
    async fn a_line_that_grew_long_gives_its_memory_back_once_it_empties() {
        let wakeups = Wakeups::with_limit(CancellationToken::new(), RECHECK, gauge(), 5000);
        let admissions: Vec<Admission> = (0..2000).map(|_| wakeups.admit().unwrap()).collect();
        let tickets: Vec<_> = (0..2000)
            .map(|i| wakeups.ticket(Some(&format!("r{i}"))))
            .collect();
        assert!(wakeups.lock().capacity() >= 2000);
        // They give up (time out, hang up) without news: the last to leave tidies the line.
        drop(tickets);
        drop(admissions);
        assert!(wakeups.lock().is_empty());
        assert!(wakeups.lock().capacity() <= 2 * KEPT_CAPACITY);
        // Woken, the same.
        let tickets: Vec<_> = (0..2000).map(|_| wakeups.ticket(Some("r"))).collect();
        wakeups.wake("r", 2000);
        assert!(wakeups.lock().capacity() <= 2 * KEPT_CAPACITY);
        drop(tickets);
    }

    #[tokio::test]
    async fn unreadable_news_wakes_everyone_and_later_tasks_wake_when_due() {
        let wakeups = Wakeups::new(CancellationToken::new(), RECHECK, gauge());
        let mut first = wakeups.ticket(Some("a"));
        let mut second = wakeups.ticket(None);
        wakeups.notified("null");
        assert!(woken(&mut first) && woken(&mut second));

        tokio::time::pause();
        let mut later = wakeups.ticket(Some("a"));
        wakeups.notified(r#"[{"key":"a","count":1,"dueInMs":5000}]"#);
        tokio::task::yield_now().await;
        assert!(!woken(&mut later));
        tokio::time::advance(Duration::from_millis(5001)).await;
        tokio::task::yield_now().await;
        assert!(woken(&mut later));
    }
}
