//! Every write PostgreSQL acknowledged through the services' own connection code survives each
//! database fault. Four writers insert rows as fast as they are answered, through
//! [`Database`] (the services' connections: hosts in turn, the writer check, the reply
//! deadline) and `get_one` (how the services read a write's reply), while the primary of a
//! pg_auto_failover formation is failed over, killed with kill -9 and frozen with SIGSTOP, once
//! each, as the failover soak injects them. Then every acknowledged row must be on the primary.
//!
//! Thousands of writes are in flight around each fault, against the failover soak's dozens: the
//! finer sieve for a write reported done that a failover then lost. It found one: read with
//! `get_result`, a planned failover lost 13,001 acknowledged writes (`OneRow`'s comment says how).
//!
//! `FAILOVER_WRITES_FAULTS=30 cargo test -p tests --test failover_writes -- --nocapture` runs
//! ten of each kind.
#![allow(clippy::unwrap_used, clippy::print_stdout)]

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::sql_types::{BigInt, Integer};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use leasehold::server::database::{Database, Timeouts};
use leasehold::server::db::OneRow;
use leasehold_local::postgres::formation::Formation;
use tests::soak::{DATABASE_FAULTS, fault_timeline, inject_database_fault};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

const WRITERS: i64 = 4;

#[derive(diesel::QueryableByName)]
struct Row {
    #[diesel(sql_type = BigInt)]
    writer: i64,
    #[diesel(sql_type = BigInt)]
    seq: i64,
}

/// An acknowledged write: by whom, which, when, and the port of the node that answered.
#[derive(diesel::QueryableByName)]
struct Written {
    #[diesel(sql_type = BigInt)]
    seq: i64,
    #[diesel(sql_type = Integer)]
    port: i32,
}

struct Ack {
    seq: i64,
    port: i32,
    at: Instant,
}

/// Inserts `(writer, 1)`, `(writer, 2)`, ... until `stop`, each once answered, reconnecting
/// after a failure; returns the inserts that were acknowledged.
async fn write(database: Database, writer: i64, stop: CancellationToken) -> Vec<Ack> {
    let mut acknowledged = Vec::new();
    let mut conn: Option<AsyncPgConnection> = None;
    let mut seq = 0;
    while !stop.is_cancelled() {
        let session = match conn.as_mut() {
            Some(session) => session,
            None => match database.connect().await {
                Ok(session) => conn.insert(session),
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        seq += 1;
        let written = diesel::sql_query(
            "INSERT INTO ledger (writer, seq) VALUES ($1, $2) \
             RETURNING seq, inet_server_port() AS port",
        )
        .bind::<BigInt, _>(writer)
        .bind::<BigInt, _>(seq)
        .get_one::<Written>(session)
        .await;
        match written {
            Ok(row) => acknowledged.push(Ack {
                seq: row.seq,
                port: row.port,
                at: Instant::now(),
            }),
            // Its outcome is unknown: not counted either way.
            Err(_) => {
                conn = None;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    acknowledged
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_write_survives_a_failover_a_kill_and_a_freeze_of_the_primary() {
    if !tests::pg_auto_failover_available().await {
        return;
    }
    let formation = Formation::start("ledger").await.unwrap();
    let url = formation.url("ledger");
    AsyncPgConnection::establish(&url)
        .await
        .unwrap()
        .batch_execute("CREATE TABLE ledger (writer bigint, seq bigint, PRIMARY KEY (writer, seq))")
        .await
        .unwrap();
    let formation = Arc::new(Mutex::new(formation));
    let database = Database::new(&url, Timeouts::default(), "").unwrap();
    let stop = CancellationToken::new();
    let writers: Vec<_> = (0..WRITERS)
        .map(|writer| tokio::spawn(write(database.clone(), writer, stop.clone())))
        .collect();

    // The three kinds in turn, each once unless `FAILOVER_WRITES_FAULTS` asks for more.
    let faults = std::env::var("FAILOVER_WRITES_FAULTS")
        .ok()
        .and_then(|count| count.parse().ok())
        .unwrap_or(DATABASE_FAULTS.len());
    let mut injected = Vec::new();
    for &fault in DATABASE_FAULTS.iter().cycle().take(faults) {
        injected.push(
            inject_database_fault(fault, &formation, Duration::from_secs(1))
                .await
                .unwrap_or_else(|err| panic!("{fault:?}: {err}")),
        );
    }
    stop.cancel();
    let mut acknowledged = Vec::new();
    for (writer, handle) in writers.into_iter().enumerate() {
        let writer = i64::try_from(writer).unwrap();
        acknowledged.extend(handle.await.unwrap().into_iter().map(|ack| (writer, ack)));
    }

    let mut reader = AsyncPgConnection::establish(&url).await.unwrap();
    let read_from = diesel::sql_query("SELECT 0::bigint AS seq, inet_server_port() AS port")
        .get_one::<Written>(&mut reader)
        .await
        .unwrap()
        .port;
    let present: HashSet<(i64, i64)> = diesel::sql_query("SELECT writer, seq FROM ledger")
        .load::<Row>(&mut reader)
        .await
        .unwrap()
        .into_iter()
        .map(|row| (row.writer, row.seq))
        .collect();
    let lost: Vec<&(i64, Ack)> = acknowledged
        .iter()
        .filter(|(writer, ack)| !present.contains(&(*writer, ack.seq)))
        .collect();
    println!(
        "{} writes acknowledged across {} faults, {} lost",
        acknowledged.len(),
        faults,
        lost.len()
    );
    assert!(
        acknowledged.len() > 1000,
        "too few writes to judge: {}",
        acknowledged.len()
    );
    assert!(
        lost.is_empty(),
        "{} acknowledged writes are not on the primary (port {read_from}); by writer and \
         answering node, beside the faults:\n{}",
        lost.len(),
        fault_timeline(&injected, &runs(&lost)).join("\n")
    );
}

/// Lost writes cut into runs of one writer's consecutive acknowledgements from one node, each
/// told by its first and its last write: thousands of lines would hide the story.
fn runs(lost: &[&(i64, Ack)]) -> Vec<(String, Instant)> {
    let mut runs: Vec<(i64, &Ack, &Ack, usize)> = Vec::new();
    for (writer, ack) in lost {
        match runs.last_mut() {
            Some((w, _, last, count)) if w == writer && last.port == ack.port => {
                *last = ack;
                *count += 1;
            }
            _ => runs.push((*writer, ack, ack, 1)),
        }
    }
    let mut said = Vec::new();
    for (writer, first, last, count) in runs {
        let node = first.port;
        said.push((
            format!(
                "writer {writer} seq {} on port {node}: first of {count} acknowledged",
                first.seq
            ),
            first.at,
        ));
        if count > 1 {
            said.push((
                format!(
                    "writer {writer} seq {} on port {node}: last of {count} acknowledged",
                    last.seq
                ),
                last.at,
            ));
        }
    }
    said
}
