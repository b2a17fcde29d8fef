//! Concurrency and rate limits, judged in the claim's transaction.
//!
//! A claim first locks the rows of the limited queues it may take from (one queue's row when it
//! names a queue, every limited queue's when it takes from any), then, in statements of their
//! own, counts their running tasks and refills their rate buckets: two claims of one limited
//! queue, on any replicas, thus judge its room one after the other, and the second sees what the
//! first committed.
//!
//! * Concurrency: a running task holds its slot until it stops running, even after its lease
//!   lapsed; a claim that takes the lapsed task again reuses the slot, and one that ends it
//!   (dead, cancelled) frees it. So at no instant are more than the limit's tasks running.
//! * Concurrency per key: the same, counted per `concurrency_key` of the queue's running tasks,
//!   in the statement that chooses the queue's tasks ([`repo::due_by_key`]), which also takes
//!   turns across the keys from where the queue's last claim stopped (its cursor, in the locked
//!   row): a key's backlog never keeps another key's tasks waiting.
//! * Rate: every start spends a token, a lapsed task's new claim included. The bucket is read
//!   when the claim holds the queue's lock (the statement's start, not the transaction's), so
//!   claims read it in the order they spend it, each after the one before committed; a task's
//!   start is recorded at that moment, or later when the claim counted running tasks after it
//!   ([`Limits::start_of`]: the bucket is then spent at that later moment, which only
//!   under-credits its refill), and no window of those moments holds more starts than
//!   `burst + per_second × its length`.
//!
//! The invariant checker proves each from the history (`tests/src/checker.rs`). Unlimited
//! queues are neither locked nor counted.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use leasehold::server::ApiError;

use crate::repo::{self, Db, TaskRow};

/// What a claim may still take from each limited queue it may take from.
#[derive(Debug, Default)]
pub struct Limits {
    /// Free slots of queues with a concurrency limit.
    rooms: BTreeMap<String, i64>,
    /// Starts left in the buckets of rate-limited queues, and what they held when read.
    tokens: BTreeMap<String, Bucket>,
    /// Queues with a concurrency limit per key: the limit, and the key their last claim served.
    keyed: BTreeMap<String, Keyed>,
    /// The tasks of key-limited queues this claim locked: their queue, key and place in the
    /// walk over the keys.
    walked: HashMap<i64, (String, Option<String>, i64)>,
    /// Per key-limited queue walked, the furthest key found at its limit.
    held_back: BTreeMap<String, String>,
    /// Queues whose limit kept this claim from taking what it asked for, and which limit.
    pub bound: Vec<(String, &'static str)>,
    /// Per queue with a concurrency limit (of the queue or per key), the database's clock read
    /// after the snapshot its running tasks were counted from ([`Limits::counted`]): in a
    /// statement after the queue's count, in the walk's own statement for its keys.
    counted_at: BTreeMap<String, DateTime<Utc>>,
}

#[derive(Debug)]
struct Keyed {
    limit: i32,
    cursor: Option<String>,
}

#[derive(Debug)]
struct Bucket {
    available: f64,
    per_second: f64,
    /// Whole tokens not yet given to a task this claim admitted.
    left: i64,
    /// When it was read: the start of the tasks this claim starts from it, as it counts them.
    at: DateTime<Utc>,
}

impl Limits {
    /// Locks the limited queues a claim of `queue` (or of any queue) may take from; their room
    /// is read by [`Locked::count`], in a statement after this one.
    pub async fn lock(conn: &mut Db, queue: Option<&str>) -> Result<Locked, ApiError> {
        Ok(Locked(repo::lock_limits(conn, queue).await?))
    }
}

/// The limited queues' rows a claim locked ([`Limits::lock`]), their room not yet read.
#[derive(Debug)]
pub struct Locked(Vec<repo::QueueLimit>);

impl Locked {
    /// Reads the locked queues' room: their running tasks and their buckets, each in a
    /// statement of its own after the lock (under READ COMMITTED only a later statement sees
    /// what a claim that held the lock before committed), and after whatever the claim's
    /// transaction ended first (the completions it carried), so that their slots are free.
    pub async fn count(self, conn: &mut Db) -> Result<Limits, ApiError> {
        let limits = self.0;
        let mut this = Limits::default();
        for limit in &limits {
            if let Some(most) = limit.key_concurrency_limit {
                this.keyed.insert(
                    limit.queue.clone(),
                    Keyed {
                        limit: most,
                        cursor: limit.key_cursor.clone(),
                    },
                );
            }
        }
        let counted: Vec<&str> = limits
            .iter()
            .filter(|l| l.concurrency_limit.is_some())
            .map(|l| l.queue.as_str())
            .collect();
        if !counted.is_empty() {
            let running: BTreeMap<String, i64> = repo::running_counts(conn, &counted)
                .await?
                .into_iter()
                .map(|r| (r.queue, r.running))
                .collect();
            for limit in &limits {
                if let Some(most) = limit.concurrency_limit {
                    let taken = running.get(&limit.queue).copied().unwrap_or(0);
                    let room = (i64::from(most) - taken).max(0);
                    this.rooms.insert(limit.queue.clone(), room);
                }
            }
            let at = repo::clock(conn).await?;
            for queue in counted {
                this.counted(queue, at);
            }
        }
        let paced: Vec<&str> = limits
            .iter()
            .filter(|l| l.rate_limited)
            .map(|l| l.queue.as_str())
            .collect();
        if !paced.is_empty() {
            for bucket in repo::tokens(conn, &paced).await? {
                // Whole tokens only; the float's floor of a non-negative value fits an i64.
                #[allow(clippy::cast_possible_truncation)]
                let left = bucket.available.floor().max(0.0) as i64;
                this.tokens.insert(
                    bucket.queue,
                    Bucket {
                        available: bucket.available,
                        per_second: bucket.per_second,
                        left,
                        at: bucket.at,
                    },
                );
            }
        }
        Ok(this)
    }
}

impl Limits {
    /// The limited queues with no room or no token: a claim of every queue steps over their
    /// tasks.
    pub fn full(&self) -> Vec<&str> {
        let mut full: Vec<&str> = self
            .rooms
            .iter()
            .filter(|(_, room)| **room == 0)
            .map(|(queue, _)| queue.as_str())
            .collect();
        full.extend(
            self.tokens
                .iter()
                .filter(|(_, bucket)| bucket.left == 0)
                .map(|(queue, _)| queue.as_str()),
        );
        full
    }

    /// Whether no limit binds the queues this claim locked: nothing to count, admit or settle,
    /// so its due tasks can be locked with its lapsed ones ([`repo::take_lapsed`]).
    pub fn is_unlimited(&self) -> bool {
        self.rooms.is_empty() && self.tokens.is_empty() && self.keyed.is_empty()
    }

    /// How many due tasks a claim that wants `wanted` may lock: for a claim of one limited
    /// queue, no more than its room and its tokens.
    pub fn cap(&mut self, queue: Option<&str>, wanted: i64) -> i64 {
        let Some(queue) = queue else {
            return wanted;
        };
        let mut cap = wanted;
        if let Some(room) = self.rooms.get(queue).copied()
            && room < cap
        {
            cap = room;
            self.bind(queue, "concurrency");
        }
        if let Some(left) = self.tokens.get(queue).map(|b| b.left)
            && left < cap
        {
            cap = left;
            self.bind(queue, "rate");
        }
        cap
    }

    /// Locks up to `room` due tasks for a claim of `queue` (or of any queue), in the order the
    /// claim takes them. Key-limited queues choose theirs fairly across keys
    /// ([`repo::due_by_key`]); a claim of any queue takes theirs first, each within what its
    /// queue has room for, then the other queues' by priority and schedule (skipping the full
    /// ones), and hands them out by priority.
    pub async fn lock_due(
        &mut self,
        conn: &mut Db,
        queue: Option<&str>,
        room: i64,
    ) -> Result<Vec<TaskRow>, ApiError> {
        if let Some(queue) = queue {
            if self.keyed.contains_key(queue) {
                return self.lock_due_by_key(conn, queue, room).await;
            }
            return Ok(repo::lock_due(conn, Some(queue), room, &[]).await?);
        }
        // A full queue has no room (`room_of` is 0), so the loop below steps over it.
        let keyed: Vec<(String, i64)> = self
            .keyed
            .keys()
            .map(|q| (q.clone(), room.min(self.room_of(q))))
            .collect();
        let mut skipped: Vec<&str> = self.full();
        skipped.extend(self.keyed.keys().map(String::as_str));
        let mut due = repo::lock_due(conn, None, room, &skipped).await?;
        let mut taken = Vec::new();
        for (queue, room) in keyed {
            if room > 0 {
                taken.extend(self.lock_due_by_key(conn, &queue, room).await?);
            }
        }
        if !taken.is_empty() {
            taken.append(&mut due);
            // Stable: each part keeps its order among equals.
            taken.sort_by_key(|task| std::cmp::Reverse(task.priority));
            due = taken;
        }
        Ok(due)
    }

    /// What this claim may still take of `queue`: its room and its tokens, the least.
    fn room_of(&self, queue: &str) -> i64 {
        let room = self.rooms.get(queue).copied().unwrap_or(i64::MAX);
        let left = self.tokens.get(queue).map_or(i64::MAX, |b| b.left);
        room.min(left)
    }

    async fn lock_due_by_key(
        &mut self,
        conn: &mut Db,
        queue: &str,
        room: i64,
    ) -> Result<Vec<TaskRow>, ApiError> {
        let Some(keyed) = self.keyed.get(queue) else {
            return Ok(Vec::new());
        };
        repo::plan_generically(conn, true).await?;
        let candidates =
            repo::due_by_key(conn, queue, keyed.limit, keyed.cursor.as_deref(), room).await?;
        repo::plan_generically(conn, false).await?;
        if let Some(at) = candidates.iter().map(|c| c.counted_at).max() {
            self.counted(queue, at);
        }
        if let Some(full) = candidates.iter().find(|c| c.id.is_none()) {
            self.bind(queue, "key_concurrency");
            if let Some(key) = &full.concurrency_key {
                self.held_back.insert(queue.to_owned(), key.clone());
            }
        }
        let ids: Vec<i64> = candidates.iter().filter_map(|c| c.id).collect();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut locked: HashMap<i64, TaskRow> = repo::lock_candidates(conn, &ids)
            .await?
            .into_iter()
            .map(|row| (row.id, row))
            .collect();
        let mut due = Vec::with_capacity(locked.len());
        for candidate in candidates {
            if let Some(row) = candidate.id.and_then(|id| locked.remove(&id)) {
                self.walked.insert(
                    row.id,
                    (queue.to_owned(), candidate.concurrency_key, candidate.visit),
                );
                due.push(row);
            }
        }
        Ok(due)
    }

    /// Keeps, in order, the lapsed tasks a claim may start again: those of rate-limited queues
    /// spend a token each (their slots they hold already). Tasks whose attempts are used up are
    /// kept: they are not started, only ended.
    pub fn admit_lapsed(
        &mut self,
        lapsed: Vec<TaskRow>,
        exhausted: impl Fn(&TaskRow) -> bool,
    ) -> Vec<TaskRow> {
        let mut admitted = Vec::with_capacity(lapsed.len());
        for task in lapsed {
            if exhausted(&task) || self.take_token(&task.queue) {
                admitted.push(task);
            }
        }
        admitted
    }

    /// Keeps, in order, the due tasks within their queues' room and tokens, and takes them.
    /// Tasks left out stay locked until the claim commits and are never handed out by it.
    pub fn admit(&mut self, due: Vec<TaskRow>) -> Vec<TaskRow> {
        let mut admitted = Vec::with_capacity(due.len());
        for task in due {
            if self.rooms.get(&task.queue) == Some(&0) {
                self.bind(&task.queue, "concurrency");
                continue;
            }
            if !self.take_token(&task.queue) {
                continue;
            }
            if let Some(room) = self.rooms.get_mut(&task.queue) {
                *room -= 1;
            }
            admitted.push(task);
        }
        admitted
    }

    /// After the claim took its tasks: spends the rate-limited queues' tokens for the tasks it
    /// started, and, for those whose bucket kept a claim waiting, asks the waiting claims to
    /// look again when the next token is due.
    /// Key-limited queues move their cursor ([`Limits::next_cursors`]).
    pub async fn settle(&self, conn: &mut Db, started: &[&TaskRow]) -> Result<(), ApiError> {
        for (queue, key) in self.next_cursors(started) {
            repo::move_key_cursor(conn, queue, key).await?;
        }
        for (queue, bucket) in &self.tokens {
            let starts = started.iter().filter(|t| &t.queue == queue).count();
            if starts > 0 {
                #[allow(clippy::cast_precision_loss)]
                let left = bucket.available - starts as f64;
                repo::spend_tokens(conn, queue, left, self.start_of(queue).unwrap_or(bucket.at))
                    .await?;
            }
            // An empty bucket wakes its waiting claims at its next token even when this claim
            // took from other queues only (a claim of every queue steps over it).
            if bucket.available < 1.0
                || self
                    .bound
                    .iter()
                    .any(|(q, limit)| q == queue && *limit == "rate")
            {
                // The next whole token, from what is left (at least a millisecond away).
                #[allow(clippy::cast_precision_loss)]
                let left = bucket.available.max(0.0) - starts as f64;
                let missing = (1.0 - left.fract()).clamp(0.0, 1.0);
                #[allow(clippy::cast_possible_truncation)]
                let due_in_ms = ((missing / bucket.per_second) * 1000.0).ceil().max(1.0) as i64;
                repo::wake_later(conn, queue, due_in_ms).await?;
            }
        }
        Ok(())
    }

    /// When this claim's tasks of `queue` are recorded to start, so that the history shows
    /// each start no earlier than what it was judged by: the latest of the moment its bucket
    /// was read (rate limits: the history shows the times the bucket was spent at, and the
    /// bucket is spent at that time) and the clock read after its running tasks were counted
    /// (concurrency limits, of the queue and per key). Each count is a statement of its own
    /// (under READ COMMITTED only a later statement sees what committed meanwhile), and a task
    /// of another claim may end between the lock and the count: its end is recorded at its
    /// transaction's start, so a start recorded at the lock could come before an end the count
    /// already saw, and the history would show one task too many running. None (the claim's
    /// `now()`) for queues without limits.
    pub fn start_of(&self, queue: &str) -> Option<DateTime<Utc>> {
        let bucket = self.tokens.get(queue).map(|bucket| bucket.at);
        bucket.max(self.counted_at.get(queue).copied())
    }

    /// `queue`'s running tasks were counted before `at`.
    fn counted(&mut self, queue: &str, at: DateTime<Utc>) {
        let latest = self.counted_at.entry(queue.to_owned()).or_insert(at);
        *latest = (*latest).max(at);
    }

    /// Where each key-limited queue's next claim starts its walk: after the key furthest along
    /// this claim's walk that it served; if it served only tasks without a key, after those
    /// (`""`: from the first key); if it served none of the queue's, after the furthest key it
    /// found at its limit, so that the next claim walks on past the keys that are full.
    ///
    /// Tasks without a key move the cursor only when no keyed task was served: they may be
    /// served on every claim (they come first when their priority is higher), and moving the
    /// cursor back to the first key each time would leave the later keys waiting.
    fn next_cursors<'a>(&'a self, started: &[&TaskRow]) -> BTreeMap<&'a str, &'a str> {
        let mut keyed: BTreeMap<&str, (i64, &str)> = BTreeMap::new();
        let mut keyless: Vec<&str> = Vec::new();
        for task in started {
            match self.walked.get(&task.id) {
                Some((queue, Some(key), visit)) => {
                    let furthest = keyed.entry(queue).or_insert((*visit, key));
                    if *visit > furthest.0 {
                        *furthest = (*visit, key);
                    }
                }
                Some((queue, None, _)) => keyless.push(queue),
                None => {}
            }
        }
        let mut cursors: BTreeMap<&str, &str> =
            keyed.into_iter().map(|(q, (_, key))| (q, key)).collect();
        for queue in keyless {
            cursors.entry(queue).or_insert("");
        }
        for (queue, key) in &self.held_back {
            cursors.entry(queue.as_str()).or_insert(key.as_str());
        }
        cursors
    }

    fn take_token(&mut self, queue: &str) -> bool {
        match self.tokens.get_mut(queue) {
            Some(bucket) if bucket.left == 0 => {
                self.bind(queue, "rate");
                false
            }
            Some(bucket) => {
                bucket.left -= 1;
                true
            }
            None => true,
        }
    }

    fn bind(&mut self, queue: &str, limit: &'static str) {
        if !self.bound.iter().any(|(q, l)| q == queue && *l == limit) {
            self.bound.push((queue.to_owned(), limit));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A start is recorded no earlier than what judged it: the clock read after the count of
    /// running tasks (of the queue, or the walk over its keys), when that is later than the
    /// bucket's read; the bucket's read when nothing was counted after it. The failover soak
    /// saw the difference: a key's task ending between the bucket's read and the walk over the
    /// keys, recorded at its transaction's start, showed three tasks of a key limited to two
    /// running at the start the claim had recorded.
    #[test]
    fn a_start_is_recorded_after_the_counts_it_was_judged_by() {
        let at = |ms: i64| DateTime::<Utc>::from_timestamp_millis(ms).unwrap_or_default();
        let mut limits = Limits::default();
        limits.tokens.insert(
            "paced".to_owned(),
            Bucket {
                available: 3.0,
                per_second: 1.0,
                left: 3,
                at: at(1_000),
            },
        );
        assert_eq!(limits.start_of("paced"), Some(at(1_000)));
        limits.counted("paced", at(1_005));
        limits.counted("paced", at(1_003));
        assert_eq!(
            limits.start_of("paced"),
            Some(at(1_005)),
            "the latest count"
        );
        limits.counted("keyed", at(2_000));
        assert_eq!(limits.start_of("keyed"), Some(at(2_000)));
        assert_eq!(
            limits.start_of("free"),
            None,
            "an unlimited queue's: the claim's own"
        );
    }
}
