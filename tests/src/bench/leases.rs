//! Leases: HTTP against the same statements run directly.

use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel_async::AsyncPgConnection;
use leasehold::Lease;

use super::measure::{Samples, run_clients};
use super::{Bench, BenchOptions, Report};

pub(super) async fn leases(bench: &Bench, options: &BenchOptions, report: &mut Report) {
    for &clients in &options.lease_concurrency {
        let held = lease_http(bench, options, clients, false, report).await;
        let raw = lease_sql(bench, options, clients, report).await;
        for (operation, http_rate, sql_rate) in [
            ("acquire", held[0], raw[0]),
            ("renew", held[1], raw[1]),
            ("release", held[2], raw[2]),
        ] {
            report.ratio(
                format!("lease {operation} HTTP / SQL, {clients} clients"),
                http_rate,
                sql_rate,
            );
        }
    }
}

/// Acquire (each client its own fresh resources), renew and release them, through HTTP.
/// Returns the three rates.
pub(super) async fn lease_http(
    bench: &Bench,
    options: &BenchOptions,
    clients: usize,
    growth: bool,
    report: &mut Report,
) -> [f64; 3] {
    let run = rand::random::<u32>();
    let phase = options.phase;
    let section = if growth {
        "growth: leases through HTTP".to_owned()
    } else {
        "leases through HTTP".to_owned()
    };
    let acquired: Arc<std::sync::Mutex<Vec<Vec<Lease>>>> =
        Arc::new(std::sync::Mutex::new(vec![Vec::new(); clients]));
    let client = bench.lease_client();
    let store = acquired.clone();
    let (samples, elapsed) = run_clients(clients, |k| {
        let client = client.clone();
        let store = store.clone();
        async move {
            let mut samples = Samples::default();
            let mut mine = Vec::new();
            let deadline = Instant::now() + phase;
            let mut i = 0u64;
            while Instant::now() < deadline {
                let resource = format!("http-{run}-{k}-{i}");
                i += 1;
                let started = Instant::now();
                match client
                    .acquire(
                        &resource,
                        &format!("client-{k}"),
                        Some(Duration::from_secs(3600)),
                    )
                    .await
                {
                    Ok(lease) => {
                        samples.latencies.push(started.elapsed());
                        mine.push(lease);
                    }
                    Err(_) => samples.errors += 1,
                }
            }
            store.lock().unwrap()[k] = mine;
            samples
        }
    })
    .await;
    let acquire = samples.figure(&section, "acquire", clients, None, elapsed);
    let rates_acquire = acquire.per_second;
    report.figures.push(acquire);

    let held: Arc<Vec<Vec<Lease>>> = Arc::new(std::mem::take(&mut *acquired.lock().unwrap()));
    let leases = held.clone();
    let (samples, elapsed) = run_clients(clients, |k| {
        let client = client.clone();
        let leases = leases.clone();
        async move {
            let mut samples = Samples::default();
            let mine = &leases[k];
            let deadline = Instant::now() + phase;
            let mut i = 0usize;
            while Instant::now() < deadline && !mine.is_empty() {
                let lease = &mine[i % mine.len()];
                i += 1;
                let started = Instant::now();
                match client
                    .renew(&lease.resource, &lease.holder, lease.proof(), None)
                    .await
                {
                    Ok(_) => samples.latencies.push(started.elapsed()),
                    Err(_) => samples.errors += 1,
                }
            }
            samples
        }
    })
    .await;
    let renew = samples.figure(&section, "renew", clients, None, elapsed);
    let rates_renew = renew.per_second;
    report.figures.push(renew);

    let leases = held.clone();
    let (samples, elapsed) = run_clients(clients, |k| {
        let client = client.clone();
        let leases = leases.clone();
        async move {
            let mut samples = Samples::default();
            let deadline = Instant::now() + phase;
            for lease in &leases[k] {
                if Instant::now() >= deadline {
                    break;
                }
                let started = Instant::now();
                match client
                    .release(&lease.resource, &lease.holder, lease.proof())
                    .await
                {
                    Ok(_) => samples.latencies.push(started.elapsed()),
                    Err(_) => samples.errors += 1,
                }
            }
            samples
        }
    })
    .await;
    let release = samples.figure(&section, "release", clients, None, elapsed);
    let rates_release = release.per_second;
    report.figures.push(release);
    [rates_acquire, rates_renew, rates_release]
}

/// One connection to the leases database per client, set up as lease-service's own sessions are,
/// made before a measurement starts so that connecting is not timed.
pub(super) async fn lease_connections(
    bench: &Bench,
    clients: usize,
) -> Arc<Vec<Arc<tokio::sync::Mutex<AsyncPgConnection>>>> {
    let mut connections = Vec::new();
    for _ in 0..clients {
        let conn = lease_service::db::establish(&bench.lease_db)
            .await
            .unwrap_or_else(|err| panic!("connecting to the leases database: {err}"));
        connections.push(Arc::new(tokio::sync::Mutex::new(conn)));
    }
    Arc::new(connections)
}

/// A lease the direct-SQL benchmark holds: resource, holder, fence, secret digest.
type SqlLease = (String, String, i64, [u8; 32]);

/// The same three operations through lease-service's own repository functions (the same SQL
/// statements, the same digest work), one database connection per client.
async fn lease_sql(
    bench: &Bench,
    options: &BenchOptions,
    clients: usize,
    report: &mut Report,
) -> [f64; 3] {
    use lease_service::repo::{self, AcquireProof, Acquired};
    let run = rand::random::<u32>();
    let phase = options.phase;
    let section = "leases as direct SQL (the physical limit)";
    let connections = lease_connections(bench, clients).await;
    let acquired: Arc<std::sync::Mutex<Vec<Vec<SqlLease>>>> =
        Arc::new(std::sync::Mutex::new(vec![Vec::new(); clients]));
    let store = acquired.clone();
    let conns = connections.clone();
    let (samples, elapsed) = run_clients(clients, |k| {
        let conns = conns.clone();
        let store = store.clone();
        async move {
            let mut conn = conns[k].lock().await;
            let mut samples = Samples::default();
            let mut mine = Vec::new();
            let deadline = Instant::now() + phase;
            let mut i = 0u64;
            while Instant::now() < deadline {
                let resource = format!("sql-{run}-{k}-{i}");
                let holder = format!("client-{k}");
                i += 1;
                let started = Instant::now();
                let secret = format!("{:064x}", rand::random::<u128>());
                let hash = leasehold::server::sha256(&secret);
                let proof = AcquireProof {
                    new_secret_hash: &hash,
                    presented_hash: None,
                    require_secret: false,
                };
                match repo::acquire(&mut conn, &resource, &holder, 3600, proof, None).await {
                    Ok(Acquired::New(row)) => {
                        samples.latencies.push(started.elapsed());
                        mine.push((resource, holder, row.fence, hash));
                    }
                    _ => samples.errors += 1,
                }
            }
            store.lock().unwrap()[k] = mine;
            samples
        }
    })
    .await;
    let acquire = samples.figure(section, "acquire", clients, None, elapsed);
    let rates_acquire = acquire.per_second;
    report.figures.push(acquire);

    let held = Arc::new(std::mem::take(&mut *acquired.lock().unwrap()));
    let leases = held.clone();
    let conns = connections.clone();
    let (samples, elapsed) = run_clients(clients, |k| {
        let conns = conns.clone();
        let leases = leases.clone();
        async move {
            let mut conn = conns[k].lock().await;
            let mut samples = Samples::default();
            let mine = &leases[k];
            let deadline = Instant::now() + phase;
            let mut i = 0usize;
            while Instant::now() < deadline && !mine.is_empty() {
                let (resource, holder, fence, hash) = &mine[i % mine.len()];
                i += 1;
                let started = Instant::now();
                match repo::renew(
                    &mut conn,
                    resource,
                    holder,
                    Some(*fence),
                    Some(hash),
                    None,
                    None,
                )
                .await
                {
                    Ok(Some(_)) => samples.latencies.push(started.elapsed()),
                    _ => samples.errors += 1,
                }
            }
            samples
        }
    })
    .await;
    let renew = samples.figure(section, "renew", clients, None, elapsed);
    let rates_renew = renew.per_second;
    report.figures.push(renew);

    let leases = held.clone();
    let conns = connections.clone();
    let (samples, elapsed) = run_clients(clients, |k| {
        let conns = conns.clone();
        let leases = leases.clone();
        async move {
            let mut conn = conns[k].lock().await;
            let mut samples = Samples::default();
            let deadline = Instant::now() + phase;
            for (resource, holder, fence, hash) in &leases[k] {
                if Instant::now() >= deadline {
                    break;
                }
                let started = Instant::now();
                match repo::release(&mut conn, resource, holder, Some(*fence), Some(hash), None)
                    .await
                {
                    Ok(Some(_)) => samples.latencies.push(started.elapsed()),
                    _ => samples.errors += 1,
                }
            }
            samples
        }
    })
    .await;
    let release = samples.figure(section, "release", clients, None, elapsed);
    let rates_release = release.per_second;
    report.figures.push(release);
    [rates_acquire, rates_renew, rates_release]
}
