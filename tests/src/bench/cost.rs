//! The cost model: what a run costs per task, so that a change is chosen by where the cost is,
//! not by guesses. For each end-to-end run (Leasehold's and its peers'), from just before the
//! backlog is created to the moment the last task is done:
//! - CPU time of each kind of process, from `/proc/<pid>/stat` (user + system): PostgreSQL (the
//!   postmaster, its living children, and the children it reaped in between), each service, the
//!   workers, and the bench itself;
//! - WAL bytes (`pg_current_wal_lsn()` before and after);
//! - write transactions (transaction ids handed out, `pg_snapshot_xmax`), commits of all kinds
//!   (`pg_stat_database.xact_commit`) and WAL fsyncs (`pg_stat_wal.wal_sync`): the fsyncs are
//!   what group commit shares, the write transactions what each waits for;
//! - where PostgreSQL's time goes: the statements that took the most execution time, per task,
//!   from `pg_stat_statements` (the bench's cluster loads it when installed). A trigger's
//!   statements are listed apart (nested) and are also counted in the statement that fired them;
//! - where the WAL goes: its largest kinds of record and the tables and indexes that wrote it,
//!   from `pg_waldump` ([`super::wal`]).

use std::collections::HashMap;
use std::time::Duration;

use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Double, Text};
use diesel_async::RunQueryDsl;
use leasehold::server::db::OneRow;
use serde::Serialize;

use super::connect;
use super::wal::{WalKind, WalLog, WalRelation};

/// Clock ticks per second of `/proc/<pid>/stat`'s times: Linux exposes them in `USER_HZ`, which
/// is 100 on every architecture it runs on, whatever the kernel's own tick rate.
const TICKS_PER_SECOND: f64 = 100.0;

/// A process's CPU time so far, in milliseconds, and (for a parent that reaps its children)
/// the time of the children it has reaped.
fn cpu_ms(pid: u32) -> (f64, f64) {
    let Some(stat) = crate::process::stat_after_comm(pid) else {
        return (0.0, 0.0);
    };
    // After the comm, utime is the 12th field, then stime, cutime, cstime.
    let fields: Vec<f64> = stat
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(|f| f.parse().unwrap_or(0.0))
        .collect();
    let ms = |ticks: f64| ticks * 1000.0 / TICKS_PER_SECOND;
    match fields.as_slice() {
        [utime, stime, cutime, cstime] => (ms(utime + stime), ms(cutime + cstime)),
        _ => (0.0, 0.0),
    }
}

/// CPU milliseconds of PostgreSQL as a whole: the postmaster, its living processes, and the
/// processes it has reaped (a backend that ends between two readings is counted once: alive in
/// the first, in the postmaster's reaped time in the second).
fn postgres_cpu_ms(postmaster: u32) -> f64 {
    let (own, reaped) = cpu_ms(postmaster);
    let living: f64 = crate::process::descendants(postmaster)
        .into_iter()
        .map(|pid| cpu_ms(pid).0)
        .sum();
    own + reaped + living
}

/// The CPU milliseconds of the children `pid` has reaped: an exec worker's commands.
pub(super) fn reaped_cpu_ms(pid: u32) -> f64 {
    cpu_ms(pid).1
}

/// The bench's own CPU milliseconds (every thread), not counting the children it reaped.
fn own_cpu_ms() -> f64 {
    cpu_ms(std::process::id()).0
}

#[derive(QueryableByName)]
struct Counters {
    #[diesel(sql_type = Text)]
    lsn: String,
    #[diesel(sql_type = BigInt)]
    next_xid: i64,
    #[diesel(sql_type = Double)]
    commits: f64,
    #[diesel(sql_type = BigInt)]
    wal_syncs: i64,
}

#[derive(QueryableByName)]
struct WalBytes {
    #[diesel(sql_type = Double)]
    bytes: f64,
}

async fn counters(url: &str) -> Counters {
    let mut conn = connect(url).await;
    diesel::sql_query(
        "SELECT pg_current_wal_lsn()::text AS lsn,
                pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next_xid,
                (SELECT sum(xact_commit) FROM pg_stat_database)::float8 AS commits,
                (SELECT wal_sync FROM pg_stat_wal) AS wal_syncs",
    )
    .get_one(&mut conn)
    .await
    .unwrap_or_else(|err| panic!("reading PostgreSQL's counters: {err}"))
}

/// How many statements of a run [`Cost::statements`] lists.
const TOP_STATEMENTS: i64 = 12;

#[derive(QueryableByName)]
struct StatementRow {
    #[diesel(sql_type = Text)]
    query: String,
    #[diesel(sql_type = diesel::sql_types::Bool)]
    toplevel: bool,
    #[diesel(sql_type = Double)]
    calls: f64,
    #[diesel(sql_type = Double)]
    exec_ms: f64,
    #[diesel(sql_type = Double)]
    plan_ms: f64,
    #[diesel(sql_type = Double)]
    plans: f64,
}

/// One statement's share of a run: execution time and calls per task.
#[derive(Debug, Clone, Serialize)]
pub struct StatementCost {
    /// The normalised statement, whitespace collapsed, cut to 120 characters.
    pub query: String,
    /// Run by a trigger or a function, not sent by a client: its time is counted in its
    /// caller's too.
    pub nested: bool,
    pub calls_per_task: f64,
    pub exec_us_per_task: f64,
    /// Planning, apart from execution: a statement not kept prepared is planned at every call.
    pub plan_us_per_task: f64,
    /// How often a call was planned: 1 for a statement planned at every call (not kept
    /// prepared, or kept with a custom plan each time), near 0 once a kept statement runs its
    /// generic plan.
    pub plans_per_call: f64,
}

/// What the report says when the cluster cannot tell where its time goes.
pub const STATEMENTS_SKIPPED: &str = "where PostgreSQL's time goes: skipped, the server has no \
     pg_stat_statements module (Debian's postgresql-15 package ships it)";

#[derive(QueryableByName)]
struct Setting {
    #[diesel(sql_type = Text)]
    value: String,
}

/// Whether the cluster loaded `pg_stat_statements`.
pub(super) async fn statements_tracked(url: &str) -> bool {
    let mut conn = connect(url).await;
    diesel::sql_query("SELECT current_setting('shared_preload_libraries') AS value")
        .get_one::<Setting>(&mut conn)
        .await
        .is_ok_and(|setting| setting.value.contains("pg_stat_statements"))
}

/// Empties the statement statistics, so that the next reading is one run's. `false` when the
/// cluster does not have `pg_stat_statements` loaded.
async fn reset_statements(url: &str) -> bool {
    let mut conn = connect(url).await;
    diesel::sql_query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&mut conn)
        .await
        .is_ok()
        && diesel::sql_query("SELECT pg_stat_statements_reset()")
            .execute(&mut conn)
            .await
            .is_ok()
}

/// The statements that took the most planning and execution time since [`reset_statements`], in all the
/// cluster's databases, less the meter's own readings.
async fn top_statements(url: &str, tasks: u64) -> Vec<StatementCost> {
    let mut conn = connect(url).await;
    let rows: Vec<StatementRow> = diesel::sql_query(
        "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 120) AS query, toplevel,
                calls::float8 AS calls, total_exec_time AS exec_ms, total_plan_time AS plan_ms,
                plans::float8 AS plans
         FROM pg_stat_statements
         WHERE query NOT LIKE '%pg_stat_statements%' AND query NOT LIKE '%pg_current_wal_lsn%'
         ORDER BY total_exec_time + total_plan_time DESC LIMIT $1",
    )
    .bind::<BigInt, _>(TOP_STATEMENTS)
    .load(&mut conn)
    .await
    .unwrap_or_else(|err| {
        // Said, not hidden: a report without the table would read as "nothing to show".
        #[allow(clippy::print_stderr)]
        {
            eprintln!("bench: could not read pg_stat_statements: {err}");
        }
        Vec::new()
    });
    let tasks = tasks.max(1) as f64;
    rows.into_iter()
        .map(|row| StatementCost {
            query: row.query,
            nested: !row.toplevel,
            calls_per_task: row.calls / tasks,
            exec_us_per_task: row.exec_ms * 1000.0 / tasks,
            plan_us_per_task: row.plan_ms * 1000.0 / tasks,
            plans_per_call: row.plans / row.calls.max(1.0),
        })
        .collect()
}

/// What a run cost, per task.
#[derive(Debug, Clone, Serialize)]
pub struct Cost {
    pub run: String,
    pub tasks: u64,
    /// CPU milliseconds per 1,000 tasks, by kind of process, in the order of [`KINDS`].
    pub cpu_ms_per_1000: Vec<(String, f64)>,
    pub wal_bytes_per_task: f64,
    pub write_transactions_per_task: f64,
    pub commits_per_task: f64,
    pub wal_fsyncs_per_task: f64,
    /// The statements PostgreSQL spent the most time executing; empty without
    /// `pg_stat_statements`.
    pub statements: Vec<StatementCost>,
    /// The largest kinds of WAL record; empty without `pg_waldump`.
    pub wal_by_kind: Vec<WalKind>,
    /// The tables and indexes that wrote the most WAL; empty without `pg_waldump`.
    pub wal_by_relation: Vec<WalRelation>,
}

impl Cost {
    /// The CPU milliseconds per 1,000 tasks of one kind of process ([`KINDS`]); 0 if unknown.
    pub fn cpu_ms_per_1000_of(&self, kind: &str) -> f64 {
        self.cpu_ms_per_1000
            .iter()
            .find(|(k, _)| k == kind)
            .map_or(0.0, |(_, ms)| *ms)
    }

    /// How many tasks one second of PostgreSQL's CPU carries: what decides how far one primary
    /// scales.
    pub fn tasks_per_postgres_cpu_second(&self) -> f64 {
        let postgres_ms = self.cpu_ms_per_1000_of("postgres");
        if postgres_ms > 0.0 {
            1_000_000.0 / postgres_ms
        } else {
            0.0
        }
    }
}

/// The kinds of process a cost is told by, as columns.
pub const KINDS: [&str; 5] = [
    "postgres",
    "task-service",
    "lease-service",
    "workers",
    "bench",
];

/// The readings at the start of a run.
pub(super) struct Meter {
    url: String,
    postmaster: u32,
    services: Vec<(&'static str, u32)>,
    postgres_ms: f64,
    services_ms: Vec<f64>,
    bench_ms: f64,
    start: Counters,
    /// Whether `pg_stat_statements` was reset for this run.
    statements: bool,
    wal_log: Option<WalLog>,
}

impl Meter {
    /// Starts metering: `url` reaches the server (any database), `services` are the long-lived
    /// processes to count by kind.
    pub(super) async fn start(
        url: &str,
        postmaster: u32,
        services: Vec<(&'static str, u32)>,
        wal_log: Option<WalLog>,
    ) -> Meter {
        let statements = reset_statements(url).await;
        let start = counters(url).await;
        Meter {
            url: url.to_owned(),
            postmaster,
            services_ms: services.iter().map(|(_, pid)| cpu_ms(*pid).0).collect(),
            services,
            postgres_ms: postgres_cpu_ms(postmaster),
            bench_ms: own_cpu_ms(),
            start,
            statements,
            wal_log,
        }
    }

    /// Ends the run: `workers` are the processes started for it (counted whole), `extra_ms`
    /// CPU reported by a process that is gone (a peer's worker reports its own). Reads the CPU
    /// at once, then gives the servers' statistics a moment to reach the shared counters
    /// (PostgreSQL flushes an idle backend's within a second) before reading them.
    pub(super) async fn finish(
        self,
        run: &str,
        tasks: u64,
        workers: &[u32],
        extra_workers_ms: f64,
    ) -> Cost {
        let postgres_ms = postgres_cpu_ms(self.postmaster) - self.postgres_ms;
        let bench_ms = own_cpu_ms() - self.bench_ms;
        let workers_ms: f64 =
            workers.iter().map(|pid| cpu_ms(*pid).0).sum::<f64>() + extra_workers_ms;
        let services: Vec<(&str, f64)> = self
            .services
            .iter()
            .zip(&self.services_ms)
            .map(|((kind, pid), before)| (*kind, cpu_ms(*pid).0 - before))
            .collect();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let end = counters(&self.url).await;
        let mut conn = connect(&self.url).await;
        let wal: WalBytes =
            diesel::sql_query("SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::float8 AS bytes")
                .bind::<Text, _>(&end.lsn)
                .bind::<Text, _>(&self.start.lsn)
                .get_one(&mut conn)
                .await
                .unwrap_or_else(|err| panic!("measuring WAL: {err}"));
        let per_task = |value: f64| value / tasks.max(1) as f64;
        let cpu = KINDS
            .iter()
            .map(|kind| {
                let ms = match *kind {
                    "postgres" => postgres_ms,
                    "workers" => workers_ms,
                    "bench" => bench_ms,
                    service => services
                        .iter()
                        .filter(|(k, _)| *k == service)
                        .map(|(_, ms)| ms)
                        .sum(),
                };
                ((*kind).to_owned(), per_task(ms) * 1000.0)
            })
            .collect();
        Cost {
            run: run.to_owned(),
            tasks,
            cpu_ms_per_1000: cpu,
            wal_bytes_per_task: per_task(wal.bytes),
            write_transactions_per_task: per_task((end.next_xid - self.start.next_xid) as f64),
            commits_per_task: per_task(end.commits - self.start.commits),
            wal_fsyncs_per_task: per_task((end.wal_syncs - self.start.wal_syncs) as f64),
            statements: if self.statements {
                top_statements(&self.url, tasks).await
            } else {
                Vec::new()
            },
            wal_by_kind: self.wal_log.as_ref().map_or_else(Vec::new, |log| {
                log.by_kind(&self.start.lsn, &end.lsn, tasks)
            }),
            wal_by_relation: match &self.wal_log {
                Some(log) => {
                    let names = relation_names(&self.url).await;
                    log.by_relation(&self.start.lsn, &end.lsn, tasks, &names)
                }
                None => Vec::new(),
            },
        }
    }
}

#[derive(QueryableByName)]
struct Named {
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Text)]
    node: String,
}

/// The name (`database.relation`) of every table and index of the cluster `url` reaches, by the
/// `tablespace/database/filenode` a WAL record's block names it by.
async fn relation_names(url: &str) -> HashMap<String, String> {
    let mut names = HashMap::new();
    let databases: Vec<Named> = diesel::sql_query(
        "SELECT datname AS name, oid::text AS node FROM pg_database WHERE datallowconn",
    )
    .load(&mut connect(url).await)
    .await
    .unwrap_or_default();
    for database in databases {
        let Ok(mut conn) =
            <diesel_async::AsyncPgConnection as diesel_async::AsyncConnection>::establish(
                &with_database(url, &database.name),
            )
            .await
        else {
            continue;
        };
        let relations: Vec<Named> = diesel::sql_query(
            "SELECT current_database() || '.' || c.relname AS name,
                    (CASE c.reltablespace WHEN 0 THEN d.dattablespace ELSE c.reltablespace END)::text
                    || '/' || d.oid::text || '/' || pg_relation_filenode(c.oid)::text AS node
             FROM pg_class c, pg_database d
             WHERE d.datname = current_database() AND pg_relation_filenode(c.oid) IS NOT NULL",
        )
        .load::<Named>(&mut conn)
        .await
        .unwrap_or_default();
        names.extend(relations.into_iter().map(|r| (r.node, r.name)));
    }
    names
}

/// `url` naming `database` instead of its own.
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let authority_end = base.find("://").map_or(0, |at| at + 3);
    let server = match base[authority_end..].find('/') {
        Some(slash) => &base[..authority_end + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{server}/{database}?{query}"),
        None => format!("{server}/{database}"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_url_names_another_database_with_its_options_kept() {
        assert_eq!(
            super::with_database("postgres://u@h:5/tasks?sslmode=disable", "leases"),
            "postgres://u@h:5/leases?sslmode=disable"
        );
        assert_eq!(
            super::with_database("postgres://h:5", "x"),
            "postgres://h:5/x"
        );
    }
}
