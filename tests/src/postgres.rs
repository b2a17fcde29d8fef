//! The test cluster: one private PostgreSQL per test process, and a fresh database per test.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use leasehold_local::postgres::PrivatePostgres;

/// The PostgreSQL server of this test process, started on first use. It dies with the process.
pub fn cluster() -> &'static PrivatePostgres {
    static CLUSTER: OnceLock<PrivatePostgres> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        PrivatePostgres::start_ephemeral()
            .unwrap_or_else(|err| panic!("cannot start the test PostgreSQL: {err}"))
    })
}

/// A new, empty database on the test cluster; returns its URL. Tests never share one.
pub async fn fresh_database() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let cluster = tokio::task::spawn_blocking(cluster).await.unwrap();
    let name = format!(
        "t_{}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        rand::random::<u16>()
    );
    cluster.create_database(&name).await.unwrap();
    cluster.url(&name)
}
