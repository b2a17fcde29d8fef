//! Whether a request's client is still there. A long-poll claim may wait 30 s, and a client that
//! timed out or died meanwhile must not be handed a task it will never run: the task would sit
//! `running` for a lease's TTL, and one with `max_attempts: 1` would end `dead` untried.
//!
//! actix-http keeps a handler running after its client closes the connection (it accepts
//! half-closed HTTP/1 connections since 3.11.2, and actix-web does not expose the switch), and
//! a handler that is dropped mid-claim is no better: the claim group commits regardless. So a
//! handler that is about to hand out work asks the connection itself. [`serve`] keeps a
//! duplicate of every connection's socket in the connection's data, and [`Peer`] watches it:
//! the kernel reports the client's FIN or RST on the socket whatever the dispatcher does.
//!
//! [`serve`]: super::http::serve

use std::any::Any;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use actix_web::dev::{Extensions, Payload};
use actix_web::{FromRequest, HttpRequest};
use tokio::io::Interest;

/// A duplicate of a connection's socket, shared by the requests that arrive on it.
#[derive(Debug, Clone)]
struct Socket(Arc<OwnedFd>);

/// The server's `on_connect`: keeps a duplicate of a TCP connection's socket for [`Peer`].
/// A connection whose socket cannot be duplicated (out of descriptors) goes without: its
/// client then counts as present, as every client did before.
pub fn on_connect(connection: &dyn Any, data: &mut Extensions) {
    let Some(stream) = connection.downcast_ref::<actix_web::rt::net::TcpStream>() else {
        return;
    };
    if let Ok(fd) = stream.as_fd().try_clone_to_owned() {
        data.insert(Socket(Arc::new(fd)));
    }
}

/// The client at the other end of a request's connection (an extractor; it never fails).
#[derive(Debug, Clone, Default)]
pub struct Peer(Option<Socket>);

impl Peer {
    /// Whether the client has closed or reset its connection, by now. A request pipelined
    /// behind this one counts as a present client, since the bytes ahead hide whether a FIN
    /// follows them.
    pub fn is_gone(&self) -> bool {
        self.0
            .as_ref()
            .is_some_and(|socket| closed(socket.0.as_ref()))
    }

    /// Resolves once the client has closed or reset its connection; never, for a request whose
    /// connection could not be watched.
    pub async fn gone(&self) {
        let watched = self.0.as_ref().and_then(|socket| {
            let fd = socket.0.try_clone().ok()?;
            tokio::net::TcpStream::from_std(std::net::TcpStream::from(fd)).ok()
        });
        let Some(watched) = watched else {
            return std::future::pending().await;
        };
        loop {
            let Ok(ready) = watched.ready(Interest::READABLE).await else {
                return std::future::pending().await;
            };
            // EPOLLRDHUP: the client shut its side, whether or not bytes are still unread.
            if ready.is_read_closed() || closed(&watched) {
                return;
            }
            // Bytes of a pipelined request are the dispatcher's to read: look again later.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

/// Peeks at the socket without taking anything the dispatcher has yet to read: end of stream,
/// or an error such as a reset, means the client is gone; bytes or nothing to read yet mean it
/// is still there.
fn closed(socket: &impl AsFd) -> bool {
    let mut byte = [MaybeUninit::<u8>::uninit(); 1];
    match socket2::SockRef::from(socket)
        .recv_with_flags(&mut byte, libc::MSG_PEEK | libc::MSG_DONTWAIT)
    {
        Ok(0) => true,
        Ok(_) => false,
        Err(err) => err.kind() != std::io::ErrorKind::WouldBlock,
    }
}

impl FromRequest for Peer {
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Self, Self::Error>>;

    fn from_request(request: &HttpRequest, _: &mut Payload) -> Self::Future {
        std::future::ready(Ok(Peer(request.conn_data::<Socket>().cloned())))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn peer_of(stream: &std::net::TcpStream) -> Peer {
        Peer(Some(Socket(Arc::new(
            stream.as_fd().try_clone_to_owned().unwrap(),
        ))))
    }

    #[tokio::test]
    async fn a_client_that_closes_is_gone_and_one_that_sends_is_not() {
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        let peer = peer_of(&server);
        assert!(!peer.is_gone(), "a connected client is there");
        client.write_all(b"GET / HTTP/1.1\r\n").unwrap();
        assert!(
            !peer.is_gone(),
            "bytes waiting to be read are not a departure"
        );
        let watching = tokio::spawn({
            let peer = peer.clone();
            async move { peer.gone().await }
        });
        drop(client);
        tokio::time::timeout(std::time::Duration::from_secs(10), watching)
            .await
            .expect("the departure is seen")
            .unwrap();
        // The data ahead of the FIN hides it from a peek; the watcher saw it (EPOLLRDHUP).
        let (server2, client2) = {
            let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (server, _) = listener.accept().unwrap();
            server.set_nonblocking(true).unwrap();
            (server, client)
        };
        let peer2 = peer_of(&server2);
        drop(client2);
        tokio::time::timeout(std::time::Duration::from_secs(10), peer2.gone())
            .await
            .expect("the departure is seen");
        assert!(
            peer2.is_gone(),
            "a client that closed, with nothing unread, is gone"
        );
    }
}
