//! Wake-ups: a claim that finds nothing due may wait for work (`wait_ms`), and is woken the
//! moment a task becomes pending instead of polling.
//!
//! The database tells: inserts, retries and requeues notify the channel [`CHANNEL`] (see the
//! migration `task_wakeups`) with, per queue, how many tasks became pending and in how many
//! milliseconds the earliest is due. [`listen`] holds one connection that LISTENs and hands each
//! notification to [`Wakeups::notified`], which wakes that many waiters of the queue, oldest
//! first (a notification of one task wakes one claim, not all of them), now or by a timer when
//! the task is due later.
//!
//! A notification can be lost: the listening connection drops, the database fails over, a
//! lapsed lease makes a task claimable without any statement. So a waiter also looks again on
//! its own every [`Wakeups::recheck`], and when the listener (re)connects every waiter looks at
//! once.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use futures_util::StreamExt;
use leasehold::retry::Backoff;
use serde::Deserialize;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// The channel task-service listens on.
pub const CHANNEL: &str = "leasehold_tasks";

/// How long a waiter waits without news before it looks again anyway, by default: the bound on
/// how late a lost notification, or a task whose lease lapsed, is picked up by a waiting claim
/// (`TASK_WAIT_RECHECK_MS`).
pub const RECHECK: Duration = Duration::from_secs(2);

/// The waiting claims of this replica, and the stop that releases them all.
#[derive(Clone)]
pub struct Wakeups {
    shared: Arc<Shared>,
}

struct Shared {
    /// In arrival order.
    waiting: Mutex<VecDeque<Waiter>>,
    stop: CancellationToken,
    recheck: Duration,
}

struct Waiter {
    /// `None`: a claim from every queue.
    queue: Option<String>,
    wake: oneshot::Sender<()>,
}

impl std::fmt::Debug for Wakeups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wakeups")
            .field("waiting", &self.lock().len())
            .finish()
    }
}

/// One entry of a notification: `count` tasks of `queue` became pending, the earliest due in
/// `due_in_ms` (by the database's clock, when it notified).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pending {
    pub queue: String,
    pub count: usize,
    pub due_in_ms: u64,
}

impl Wakeups {
    /// Waiters are released (to answer "nothing due") once `stop` is cancelled; without news
    /// they look again every `recheck`.
    pub fn new(stop: CancellationToken, recheck: Duration) -> Self {
        Self {
            shared: Arc::new(Shared {
                waiting: Mutex::new(VecDeque::new()),
                stop,
                recheck,
            }),
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

    /// Cancelled when the service stops: waiting claims answer at once.
    pub fn stopping(&self) -> &CancellationToken {
        &self.shared.stop
    }

    /// A place in line for news of `queue` (every queue for `None`). Taken *before* the claim
    /// that may find nothing, so a task that becomes pending meanwhile is not missed.
    pub fn ticket(&self, queue: Option<&str>) -> oneshot::Receiver<()> {
        let (wake, ticket) = oneshot::channel();
        let mut waiting = self.lock();
        // Waiters that gave up (answered, timed out, hung up) leave their place behind; sweep
        // them now and then so the line stays as long as the waiting claims.
        if waiting.len() >= 64 && waiting.len().is_power_of_two() {
            waiting.retain(|waiter| !waiter.wake.is_closed());
        }
        waiting.push_back(Waiter {
            queue: queue.map(str::to_owned),
            wake,
        });
        ticket
    }

    /// Wakes up to `count` waiters that claim from `queue`, oldest first.
    pub fn wake(&self, queue: &str, count: usize) {
        let mut waiting = self.lock();
        let mut woken = 0;
        let mut index = 0;
        while woken < count && index < waiting.len() {
            let wants = waiting
                .get(index)
                .is_some_and(|w| w.queue.as_deref().is_none_or(|q| q == queue));
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
    }

    /// Wakes every waiter: news may have been lost.
    pub fn wake_all(&self) {
        for waiter in self.lock().drain(..) {
            let _ = waiter.wake.send(());
        }
    }

    /// Acts on one notification's payload: wakes for what is due now, and sets a timer for what
    /// is due later. A payload that does not read wakes everyone.
    pub fn notified(&self, payload: &str) {
        let Ok(Some(pending)) = serde_json::from_str::<Option<Vec<Pending>>>(payload) else {
            self.wake_all();
            return;
        };
        for Pending {
            queue,
            count,
            due_in_ms,
        } in pending
        {
            if due_in_ms == 0 {
                self.wake(&queue, count);
            } else {
                let wakeups = self.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        () = wakeups.shared.stop.cancelled() => {}
                        () = tokio::time::sleep(Duration::from_millis(due_in_ms)) => {
                            wakeups.wake(&queue, count);
                        }
                    }
                });
            }
        }
    }
}

/// Listens on [`CHANNEL`] until `stop`, reconnecting with backoff whenever the connection fails;
/// after each (re)connection every waiter looks again, since news may have been missed.
pub async fn listen(database_url: String, wakeups: Wakeups, stop: CancellationToken) {
    let mut retries = Backoff::new(Duration::from_millis(100), Duration::from_secs(5)).waits();
    loop {
        let session = async {
            let mut conn = AsyncPgConnection::establish(&database_url).await?;
            diesel::sql_query("SET application_name = 'task-service wake-ups'")
                .execute(&mut conn)
                .await?;
            diesel::sql_query(format!("LISTEN {CHANNEL}"))
                .execute(&mut conn)
                .await?;
            tracing::info!(channel = CHANNEL, "listening for tasks that become pending");
            wakeups.wake_all();
            retries.reset();
            relay(&mut conn, &wakeups).await
        };
        let ended = tokio::select! {
            () = stop.cancelled() => return,
            ended = session => ended,
        };
        let reason = match ended {
            Ok(()) => "the connection closed".to_owned(),
            Err(err) => err.to_string(),
        };
        tracing::warn!(%reason, "the wake-up listener lost its connection; reconnecting");
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
    wakeups: &Wakeups,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    loop {
        let news = {
            let mut notifications = std::pin::pin!(conn.notifications_stream());
            tokio::time::timeout(wakeups.recheck(), notifications.next()).await
        };
        match news {
            Ok(Some(Ok(notification))) => wakeups.notified(&notification.payload),
            Ok(Some(Err(err))) => return Err(err.into()),
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

    fn woken(ticket: &mut oneshot::Receiver<()>) -> bool {
        ticket.try_recv().is_ok()
    }

    #[tokio::test]
    async fn a_notification_wakes_as_many_waiters_as_tasks_oldest_first() {
        let wakeups = Wakeups::new(CancellationToken::new(), RECHECK);
        let mut a1 = wakeups.ticket(Some("a"));
        let mut any = wakeups.ticket(None);
        let mut b = wakeups.ticket(Some("b"));
        let mut a2 = wakeups.ticket(Some("a"));
        wakeups.notified(r#"[{"queue":"a","count":1,"dueInMs":0}]"#);
        assert!(woken(&mut a1));
        assert!(!woken(&mut any) && !woken(&mut b) && !woken(&mut a2));
        wakeups.wake("a", 5);
        assert!(woken(&mut any) && woken(&mut a2));
        assert!(!woken(&mut b), "another queue's waiter sleeps on");
    }

    #[tokio::test]
    async fn a_waiter_that_left_takes_no_wake_up() {
        let wakeups = Wakeups::new(CancellationToken::new(), RECHECK);
        drop(wakeups.ticket(Some("a")));
        let mut second = wakeups.ticket(Some("a"));
        wakeups.wake("a", 1);
        assert!(woken(&mut second));
    }

    #[tokio::test]
    async fn unreadable_news_wakes_everyone_and_later_tasks_wake_when_due() {
        let wakeups = Wakeups::new(CancellationToken::new(), RECHECK);
        let mut first = wakeups.ticket(Some("a"));
        let mut second = wakeups.ticket(None);
        wakeups.notified("null");
        assert!(woken(&mut first) && woken(&mut second));

        tokio::time::pause();
        let mut later = wakeups.ticket(Some("a"));
        wakeups.notified(r#"[{"queue":"a","count":1,"dueInMs":5000}]"#);
        tokio::task::yield_now().await;
        assert!(!woken(&mut later));
        tokio::time::advance(Duration::from_millis(5001)).await;
        tokio::task::yield_now().await;
        assert!(woken(&mut later));
    }
}
