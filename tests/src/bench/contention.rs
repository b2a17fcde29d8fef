//! Contention: clients racing for a few shared resources.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::leases::lease_connections;
use super::measure::{Samples, run_clients};
use super::{Bench, BenchOptions, Report};

/// For each number of shared resources and each client count above one: HTTP against direct
/// SQL, and their ratio.
pub(super) async fn contention(bench: &Bench, options: &BenchOptions, report: &mut Report) {
    for &resources in &options.contended_resources {
        for &clients in options.lease_concurrency.iter().filter(|c| **c > 1) {
            let http = contended(bench, options, clients, resources, Path::Http, report).await;
            let sql = contended(bench, options, clients, resources, Path::Sql, report).await;
            report.ratio(
                format!("contended cycles HTTP / SQL, {clients} clients, {resources} resources"),
                http,
                sql,
            );
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Http,
    Sql,
}

/// What one attempt on a shared resource came to.
enum Attempt {
    /// Acquired, then released.
    Cycle,
    /// Someone else held it.
    Refused,
    Failed,
}

/// `clients` racing for `resources` shared resources: each picks one at random, acquires it and,
/// if it won, releases it at once. Returns the cycles per second.
async fn contended(
    bench: &Bench,
    options: &BenchOptions,
    clients: usize,
    resources: u64,
    path: Path,
    report: &mut Report,
) -> f64 {
    use lease_service::repo::{self, AcquireProof, Acquired};
    let run = rand::random::<u32>();
    let phase = options.phase;
    let section = match path {
        Path::Http => "contention through HTTP",
        Path::Sql => "contention as direct SQL",
    };
    let client = bench.lease_client();
    let connections = match path {
        Path::Sql => lease_connections(bench, clients).await,
        Path::Http => Arc::new(Vec::new()),
    };
    let refusals = Arc::new(std::sync::Mutex::new(Samples::default()));
    let refused_store = refusals.clone();
    let (samples, elapsed) = run_clients(clients, |k| {
        let client = client.clone();
        let connections = connections.clone();
        let refused_store = refused_store.clone();
        async move {
            let mut conn = match connections.get(k) {
                Some(conn) => Some(conn.lock().await),
                None => None,
            };
            let holder = format!("client-{k}");
            let mut cycles = Samples::default();
            let mut refused = Samples::default();
            let deadline = Instant::now() + phase;
            while Instant::now() < deadline {
                let resource = format!("shared-{run}-{}", rand::random::<u64>() % resources.max(1));
                let started = Instant::now();
                let attempt = match conn.as_deref_mut() {
                    None => {
                        match client
                            .acquire(&resource, &holder, Some(Duration::from_secs(30)))
                            .await
                        {
                            Ok(lease) => {
                                match client.release(&resource, &holder, lease.proof()).await {
                                    Ok(_) => Attempt::Cycle,
                                    Err(_) => Attempt::Failed,
                                }
                            }
                            Err(leasehold::LeaseError::Held { .. }) => Attempt::Refused,
                            Err(_) => Attempt::Failed,
                        }
                    }
                    Some(conn) => {
                        let hash =
                            leasehold::server::sha256(&format!("{:064x}", rand::random::<u128>()));
                        let proof = AcquireProof {
                            new_secret_hash: &hash,
                            presented_hash: None,
                            require_secret: false,
                        };
                        match repo::acquire(conn, &resource, &holder, 30, proof, None).await {
                            Ok(Acquired::New(row)) => {
                                match repo::release(
                                    conn,
                                    &resource,
                                    &holder,
                                    Some(row.fence),
                                    Some(&hash),
                                    None,
                                )
                                .await
                                {
                                    Ok(Some(_)) => Attempt::Cycle,
                                    _ => Attempt::Failed,
                                }
                            }
                            Ok(Acquired::Held(_)) => Attempt::Refused,
                            _ => Attempt::Failed,
                        }
                    }
                };
                match attempt {
                    Attempt::Cycle => cycles.latencies.push(started.elapsed()),
                    Attempt::Refused => refused.latencies.push(started.elapsed()),
                    Attempt::Failed => cycles.errors += 1,
                }
            }
            refused_store.lock().unwrap().merge(refused);
            cycles
        }
    })
    .await;
    let plural = if resources == 1 { "" } else { "s" };
    let cycles = samples.figure(
        section,
        &format!("acquire + release, {resources} shared resource{plural}"),
        clients,
        None,
        elapsed,
    );
    let rate = cycles.per_second;
    report.figures.push(cycles);
    let refused = std::mem::take(&mut *refusals.lock().unwrap());
    report.figures.push(refused.figure(
        section,
        &format!("refused (held), {resources} shared resource{plural}"),
        clients,
        None,
        elapsed,
    ));
    rate
}
