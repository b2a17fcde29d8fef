//! What the monitor says of the nodes, and waiting until the formation is healthy: a primary
//! with a synchronous standby that has caught up.

use std::time::{Duration, Instant};

use super::Formation;
use crate::postgres::PgError;

/// What the monitor says of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    pub name: String,
    pub port: u16,
    pub reported: String,
    pub assigned: String,
    pub timeline: i32,
}

impl NodeState {
    /// Settled in `state`: it reports what it was assigned.
    pub fn is(&self, state: &str) -> bool {
        self.reported == state && self.assigned == state
    }
}

impl Formation {
    /// The monitor's view of the data nodes, in node order.
    pub async fn states(&self) -> Result<Vec<NodeState>, PgError> {
        let rows = simple_query(
            &self.monitor_url(),
            "SELECT nodename, nodeport, reportedstate, goalstate, reportedtli \
             FROM pgautofailover.node ORDER BY nodeid",
        )
        .await?;
        Ok(rows
            .into_iter()
            .map(|row| NodeState {
                name: row[0].clone(),
                port: row[1].parse().unwrap_or(0),
                reported: row[2].clone(),
                assigned: row[3].clone(),
                timeline: row[4].parse().unwrap_or(0),
            })
            .collect())
    }

    /// The monitor's database, as the keepers reach it: for a test that reads more of the
    /// monitor's view than [`Formation::states`] gives (its report and health-check times).
    pub fn monitor_url(&self) -> String {
        format!(
            "postgres://autoctl_node@127.0.0.1:{}/pg_auto_failover",
            self.monitor.port
        )
    }

    /// Index of the node the monitor has settled as primary, if one has.
    pub async fn primary(&self) -> Result<Option<usize>, PgError> {
        let states = self.states().await?;
        Ok(states.iter().position(|s| s.is("primary")))
    }

    /// Waits until `check` holds of the monitor's view.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        what: &str,
        check: impl Fn(&[NodeState]) -> bool,
    ) -> Result<Vec<NodeState>, PgError> {
        let deadline = Instant::now() + timeout;
        let mut last = Vec::new();
        loop {
            if let Ok(states) = self.states().await {
                if check(&states) {
                    return Ok(states);
                }
                last = states;
            }
            if Instant::now() > deadline {
                return Err(PgError::Formation(format!(
                    "timed out after {timeout:?} waiting for {what}; the monitor says {last:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until one node is primary and every other its secondary, and the primary's
    /// commits wait for that secondary again: healthy, able to lose a node without losing an
    /// acknowledged write. Returns the primary's index.
    ///
    /// The monitor's word alone is not enough: it reports a returning standby `secondary`, and
    /// turns synchronous replication back on, once it is within
    /// `pgautofailover.enable_sync_wal_log_threshold` (16 MB) of WAL, not once it has caught up.
    /// A planned failover started at that moment lost an acknowledged write (the failover
    /// soak's ledger saw it, three times in its first 35 faults), so this also waits until the
    /// primary's `pg_stat_replication` shows a synchronous standby that has flushed all the
    /// primary had flushed when asked.
    pub async fn wait_healthy(&self, timeout: Duration) -> Result<usize, PgError> {
        let deadline = Instant::now() + timeout;
        loop {
            let states = self
                .wait_until(timeout, "a primary and its secondary", |states| {
                    states.iter().filter(|s| s.is("primary")).count() == 1
                        && states.iter().all(|s| s.is("primary") || s.is("secondary"))
                })
                .await?;
            let primary = states.iter().position(|s| s.is("primary")).unwrap_or(0);
            let first_look = self.synchronous_and_caught_up(primary, false).await;
            if first_look.unwrap_or(false) {
                return Ok(primary);
            }
            self.early_healthy
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if self
                .synchronous_and_caught_up(primary, true)
                .await
                .unwrap_or(false)
            {
                return Ok(primary);
            }
            if Instant::now() > deadline {
                return Err(PgError::Formation(format!(
                    "timed out after {timeout:?} waiting for node {primary}'s standby to be \
                     synchronous and caught up"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// How often the monitor has called the formation healthy while the primary's standby was
    /// not yet synchronous and caught up.
    pub fn early_healthy_reports(&self) -> usize {
        self.early_healthy
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether node `primary` replicates synchronously to a standby that has flushed all it had
    /// flushed a moment ago; with `wait`, waiting up to 10 s for it.
    pub(super) async fn synchronous_and_caught_up(
        &self,
        primary: usize,
        wait: bool,
    ) -> Result<bool, PgError> {
        let url = self.node_url(primary, "postgres");
        let flushed = simple_query(&url, "SELECT pg_current_wal_flush_lsn()::text").await?;
        let Some(lsn) = flushed.first().and_then(|row| row.first()).cloned() else {
            return Ok(false);
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let rows = simple_query(
                &url,
                &format!(
                    "SELECT count(*) FROM pg_stat_replication \
                     WHERE sync_state IN ('sync', 'quorum') AND flush_lsn >= '{lsn}'::pg_lsn \
                       AND current_setting('synchronous_standby_names') <> ''"
                ),
            )
            .await?;
            if rows
                .first()
                .and_then(|row| row.first())
                .is_some_and(|n| n != "0")
            {
                return Ok(true);
            }
            if !wait {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(false)
    }
}

/// Runs `sql` (one or more statements) on a new connection; the rows of the last, as text.
pub(super) async fn simple_query(url: &str, sql: &str) -> Result<Vec<Vec<String>>, PgError> {
    let connect = tokio_postgres::connect(url, tokio_postgres::NoTls);
    let (client, connection) = tokio::time::timeout(Duration::from_secs(5), connect)
        .await
        .map_err(|_| PgError::Formation(format!("no answer from {url} within 5 s")))?
        .map_err(|err| PgError::Formation(format!("connecting to {url}: {err}")))?;
    let driver = tokio::spawn(connection);
    let messages = tokio::time::timeout(Duration::from_secs(10), client.simple_query(sql))
        .await
        .map_err(|_| PgError::Formation(format!("no answer to a query from {url} within 10 s")))?
        .map_err(|err| {
            let detail = err
                .as_db_error()
                .map_or_else(|| err.to_string(), |db| db.message().to_owned());
            PgError::Formation(format!("querying {url}: {detail}"))
        })?;
    drop(client);
    driver.abort();
    Ok(messages
        .into_iter()
        .filter_map(|message| match message {
            tokio_postgres::SimpleQueryMessage::Row(row) => Some(
                (0..row.len())
                    .map(|i| row.get(i).unwrap_or_default().to_owned())
                    .collect(),
            ),
            _ => None,
        })
        .collect())
}
