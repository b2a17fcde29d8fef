//! A TCP forwarder in front of one PostgreSQL that can freeze: the database host that accepts
//! connections and then never answers (a paused VM, a SIGSTOPped node, a partition). Frozen, it
//! still accepts connections and reads what clients send, but passes nothing on either way,
//! as a stopped process behind a live kernel does.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running gate; it stops, with every connection through it, when dropped.
#[derive(Debug)]
pub struct Gate {
    port: u16,
    frozen: watch::Sender<bool>,
    accept_loop: JoinHandle<()>,
}

impl Gate {
    /// Listens on a free loopback port and forwards each connection to `127.0.0.1:upstream`.
    pub async fn start(upstream: u16) -> Gate {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (frozen, watching) = watch::channel(false);
        let accept_loop = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let watching = watching.clone();
                connections.spawn(async move {
                    // A frozen host's kernel completes the handshake; its server says nothing.
                    let mut thawed = watching.clone();
                    if thawed.wait_for(|frozen| !frozen).await.is_err() {
                        return;
                    }
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::select! {
                        () = pass(client_read, server_write, watching.clone()) => {}
                        () = pass(server_read, client_write, watching) => {}
                    }
                });
                while connections.try_join_next().is_some() {}
            }
        });
        Gate {
            port,
            frozen,
            accept_loop,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// From now on nothing passes, either way, until [`thaw`](Self::thaw).
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.accept_loop.abort();
    }
}

/// Copies `from` to `to`, holding each chunk while the gate is frozen.
async fn pass(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: watch::Receiver<bool>,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        // What arrives while frozen is held here, as a stopped process's socket buffer would.
        let Ok(count) = from.read(&mut buffer).await else {
            return;
        };
        if count == 0 {
            return;
        }
        if frozen.wait_for(|frozen| !frozen).await.is_err() {
            return;
        }
        if to.write_all(&buffer[..count]).await.is_err() {
            return;
        }
    }
}

/// How long a test waits for an answer that a hung service would never give: far beyond any
/// timeout under test, so that only a hang reaches it.
pub const HANG: Duration = Duration::from_secs(60);
