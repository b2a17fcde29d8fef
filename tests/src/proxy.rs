//! A round-robin TCP proxy in front of a service's replicas, as nginx or a Kubernetes Service
//! would be: clients get one address, and a replica that is down is skipped.
//!
//! Like a plain L4 balancer it does not know whether a replica that accepts a connection will
//! answer: a SIGSTOPped replica's kernel still accepts, so its clients wait for their own
//! timeouts, exactly the fault the soak wants them to meet.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// How long the proxy tries one replica before it moves on to the next.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(300);

/// A running proxy; it stops when dropped.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    accept_loop: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and spreads connections over `upstreams` (ports on
    /// 127.0.0.1).
    pub async fn start(upstreams: Vec<u16>) -> Proxy {
        assert!(!upstreams.is_empty(), "a proxy needs at least one upstream");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let upstreams: Arc<[u16]> = upstreams.into();
        let next = Arc::new(AtomicUsize::new(0));
        let accept_loop = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let upstreams = Arc::clone(&upstreams);
                let first = next.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    let _ = client.set_nodelay(true);
                    // Try each replica once, starting with this connection's turn.
                    for offset in 0..upstreams.len() {
                        let port = upstreams[(first + offset) % upstreams.len()];
                        let connect = TcpStream::connect(("127.0.0.1", port));
                        if let Ok(Ok(upstream)) =
                            tokio::time::timeout(CONNECT_TIMEOUT, connect).await
                        {
                            let _ = upstream.set_nodelay(true);
                            let (mut client, mut upstream) = (client, upstream);
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                            return;
                        }
                    }
                    // Every replica is down: the client sees its connection closed.
                });
            }
        });
        Proxy { port, accept_loop }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept_loop.abort();
    }
}
