//! How a service reaches PostgreSQL: every connection, pooled or listening, is made here, so
//! that a database that fails over, freezes or cannot commit costs a bounded wait and a 503,
//! never a hung service.
//!
//! `DATABASE_URL` may name several hosts (`postgres://h1:5432,h2:5432/db`), as a
//! high-availability formation's URL does. Connecting tries them in turn, each within
//! `DATABASE_CONNECT_TIMEOUT_MS` for the whole of it (TCP, log-in, and the question whether the
//! node takes writes), and keeps the first that takes writes unless the URL says
//! `target_session_attrs=any`, and is not on an older WAL timeline than one of its connections
//! has already found (a former primary that has not stepped down yet: the frozen primary
//! resumed, the crashed one restarted, still taking writes the new primary will never have).
//! libpq and tokio-postgres bound only the TCP connect: a frozen host, whose kernel accepts the
//! connection while PostgreSQL never answers, would hold every attempt forever, and the next
//! host would never be tried.
//!
//! What a session does with a write's reply matters as much: it is done only once the reply has
//! ended, after the commit ([`super::db::OneRow`]).
//!
//! Once connected, every reply is awaited for at most the statement timeout and one second
//! more (a `Watched` stream, below). PostgreSQL's own `statement_timeout` bounds a statement
//! that runs; it cannot bound a server that does not run at all (a paused VM, a partition), nor
//! a commit that waits for a synchronous standby that is gone (PostgreSQL deliberately leaves
//! the commit's wait out of `statement_timeout`). Then the connection is closed: its request
//! answers 503 (the write's outcome is unknown, never reported as done), the pool drops it, and
//! the host is moved behind the others, so the next connection tries another node first.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use diesel::ConnectionError;
use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_postgres::config::{Host, TargetSessionAttrs};
use tokio_postgres::{AsyncMessage, NoTls, Notification};
use tokio_util::sync::CancellationToken;

/// A node's WAL timeline as SQL: the first eight hex digits of its current WAL file's name, or
/// NULL on a standby (which refuses `pg_current_wal_lsn`). One text for the writer check here
/// and for `/readyz` ([`super::db::node`]).
macro_rules! timeline_sql {
    () => {
        "CASE WHEN pg_is_in_recovery() THEN NULL \
              ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint \
         END"
    };
}
pub(crate) use timeline_sql;

/// Whether a node takes writes, and if so its WAL timeline.
const WRITER_CHECK: &str = concat!(
    "SELECT current_setting('transaction_read_only'), ",
    timeline_sql!()
);

/// The waits that bound every connection, from the services' `DATABASE_*_TIMEOUT_MS` flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// One host's whole connection attempt.
    pub connect: Duration,
    /// PostgreSQL's `statement_timeout`; a reply is awaited one second longer.
    pub statement: Duration,
}

impl Timeouts {
    /// How long a sent message may go without any reply before the connection is closed: past
    /// the statement timeout, so that a slow statement is ended by the server (which keeps the
    /// connection) rather than by the client.
    pub fn reply(&self) -> Duration {
        self.statement + Duration::from_secs(1)
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(2),
            statement: Duration::from_secs(5),
        }
    }
}

/// A service's database: where it is, how long to wait for it, and what each session runs
/// first. Cheap to clone; the clones share which host is tried first.
#[derive(Clone)]
pub struct Database {
    inner: Arc<Inner>,
}

struct Inner {
    url: String,
    config: tokio_postgres::Config,
    /// The TCP hosts of the URL, in its order; empty when it names a Unix socket.
    hosts: Vec<(String, u16)>,
    read_write: bool,
    timeouts: Timeouts,
    /// SQL each new session runs (`SET` commands), after the statement timeout.
    session: String,
    /// The host tried first: the last that gave a connection, moved on when it stops answering.
    preferred: AtomicUsize,
    /// Per host, cancelled when it stops answering: every session on it then closes, idle
    /// pooled ones included, so that no later request is handed one to wait on in turn.
    dropped: Vec<Mutex<CancellationToken>>,
    /// The newest WAL timeline any connection has found its primary on: one more at each
    /// promotion, so a node that takes writes on an older one has been replaced.
    newest_timeline: AtomicU32,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database")
            .field("hosts", &self.inner.hosts)
            .field("read_write", &self.inner.read_write)
            .field("timeouts", &self.inner.timeouts)
            .finish_non_exhaustive()
    }
}

/// Why one host gave no connection.
#[derive(Debug, thiserror::Error)]
enum HostError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[error("it takes no writes (a standby)")]
    ReadOnly,
    #[error("it is a former primary: on timeline {timeline}, and timeline {newest} has been seen")]
    Superseded { timeline: u32, newest: u32 },
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
    #[error("setting up the session: {0}")]
    Setup(diesel::result::Error),
}

impl Database {
    /// The database at `url` (a PostgreSQL URL or key-value string, one host or several).
    pub fn new(
        url: &str,
        timeouts: Timeouts,
        session: impl Into<String>,
    ) -> anyhow::Result<Database> {
        let config: tokio_postgres::Config = url.parse().context("parsing DATABASE_URL")?;
        let ports = config.get_ports();
        let mut hosts = Vec::new();
        for (i, host) in config.get_hosts().iter().enumerate() {
            let port = match ports.len() {
                0 => 5432,
                1 => ports[0],
                _ => ports[i],
            };
            match host {
                Host::Tcp(name) => hosts.push((name.clone(), port)),
                // A Unix socket is one local server: no failover to plan for.
                Host::Unix(_) => {
                    hosts.clear();
                    break;
                }
            }
        }
        // Leasehold only writes, so a standby is of no use to it; libpq's default (`any`)
        // would settle for the first host, whichever it is, only if asked to.
        let read_write = config.get_target_session_attrs() == TargetSessionAttrs::ReadWrite
            || !url.contains("target_session_attrs=");
        let dropped = hosts
            .iter()
            .map(|_| Mutex::new(CancellationToken::new()))
            .collect();
        Ok(Database {
            inner: Arc::new(Inner {
                url: url.to_owned(),
                config,
                dropped,
                newest_timeline: AtomicU32::new(0),
                hosts,
                read_write,
                timeouts,
                session: session.into(),
                preferred: AtomicUsize::new(0),
            }),
        })
    }

    /// The URL as given (the pool's manager is built with it, though it connects through
    /// [`connect`](Self::connect)).
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// A new session on a node that takes writes, set up with the statement timeout and the
    /// service's session SQL.
    pub async fn connect(&self) -> diesel::ConnectionResult<AsyncPgConnection> {
        self.open(None).await
    }

    /// [`connect`](Self::connect), with the session's notifications (for `LISTEN`) delivered
    /// to the returned channel.
    pub async fn connect_listening(
        &self,
    ) -> diesel::ConnectionResult<(AsyncPgConnection, mpsc::UnboundedReceiver<Notification>)> {
        let (sender, receiver) = mpsc::unbounded_channel();
        let conn = self.open(Some(sender)).await?;
        Ok((conn, receiver))
    }

    async fn open(
        &self,
        notifications: Option<mpsc::UnboundedSender<Notification>>,
    ) -> diesel::ConnectionResult<AsyncPgConnection> {
        let inner = &self.inner;
        if inner.hosts.is_empty() {
            // A Unix socket: tokio-postgres's own connect, with the session set up as usual.
            let (client, connection) = inner
                .config
                .connect(NoTls)
                .await
                .map_err(|err| ConnectionError::BadConnection(err.to_string()))?;
            tokio::spawn(drive(connection, notifications, CancellationToken::new()));
            return self.set_up(client).await.map_err(|err| match err {
                HostError::Setup(err) => ConnectionError::CouldntSetupConfiguration(err),
                other => ConnectionError::BadConnection(other.to_string()),
            });
        }
        let count = inner.hosts.len();
        let first = inner.preferred.load(Ordering::Relaxed) % count;
        let mut failures = Vec::new();
        for index in (0..count).map(|i| (first + i) % count) {
            let attempt = self.attempt(index, notifications.clone());
            let outcome = match tokio::time::timeout(inner.timeouts.connect, attempt).await {
                Ok(outcome) => outcome,
                Err(_) => Err(HostError::TimedOut(inner.timeouts.connect)),
            };
            match outcome {
                Ok(conn) => {
                    inner.preferred.store(index, Ordering::Relaxed);
                    return Ok(conn);
                }
                Err(err) => {
                    let (host, port) = &inner.hosts[index];
                    failures.push(format!("{host}:{port}: {err}"));
                }
            }
        }
        Err(ConnectionError::BadConnection(format!(
            "no database host took the connection: {}",
            failures.join("; ")
        )))
    }

    /// One host, whole: TCP, log-in, the read-write check, the session's set-up.
    async fn attempt(
        &self,
        index: usize,
        notifications: Option<mpsc::UnboundedSender<Notification>>,
    ) -> Result<AsyncPgConnection, HostError> {
        let inner = &self.inner;
        let (host, port) = &inner.hosts[index];
        let stream = TcpStream::connect((host.as_str(), *port)).await?;
        stream.set_nodelay(true)?;
        let demote = {
            let database = self.clone();
            Box::new(move || database.move_past(index)) as Box<dyn FnOnce() + Send>
        };
        let watched = Watched::new(stream, inner.timeouts.reply(), demote);
        let (client, connection) = inner.config.connect_raw(watched, NoTls).await?;
        let dropped = lock(&inner.dropped[index]).clone();
        tokio::spawn(drive(connection, notifications, dropped));
        if inner.read_write {
            let rows = client.simple_query(WRITER_CHECK).await?;
            let row = rows.iter().find_map(|message| match message {
                tokio_postgres::SimpleQueryMessage::Row(row) => Some(row),
                _ => None,
            });
            let read_only = row.and_then(|row| row.get(0)) != Some("off");
            if read_only {
                return Err(HostError::ReadOnly);
            }
            let timeline: u32 = row
                .and_then(|row| row.get(1))
                .and_then(|text| text.parse().ok())
                .unwrap_or(0);
            // A primary on an older timeline than one already seen is a former primary that
            // has not stepped down yet (a frozen node resumed, a crashed one restarted): it
            // still takes writes, which the new primary will never have.
            let newest = inner.newest_timeline.fetch_max(timeline, Ordering::Relaxed);
            if timeline < newest {
                return Err(HostError::Superseded { timeline, newest });
            }
            // Which node each session writes to, for the story of a failover afterwards.
            tracing::info!(%host, port, timeline, "database session opened on a writable node");
        }
        self.set_up(client).await
    }

    async fn set_up(&self, client: tokio_postgres::Client) -> Result<AsyncPgConnection, HostError> {
        let mut conn = AsyncPgConnection::try_from(client)
            .await
            .map_err(|err| match err {
                ConnectionError::CouldntSetupConfiguration(err) => HostError::Setup(err),
                other => HostError::Setup(diesel::result::Error::QueryBuilderError(
                    other.to_string().into(),
                )),
            })?;
        // One round trip for the timeout and the service's own settings.
        let statement_ms = self.inner.timeouts.statement.as_millis();
        conn.batch_execute(&format!(
            "SET statement_timeout = {statement_ms}; {}",
            self.inner.session
        ))
        .await
        .map_err(HostError::Setup)?;
        Ok(conn)
    }

    /// Host `index` stopped answering: unless another host has been preferred since, the next
    /// connection tries the host after it first.
    fn move_past(&self, index: usize) {
        let count = self.inner.hosts.len().max(1);
        let mut dropped = lock(&self.inner.dropped[index]);
        dropped.cancel();
        *dropped = CancellationToken::new();
        drop(dropped);
        let _ = self.inner.preferred.compare_exchange(
            index,
            (index + 1) % count,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        let (host, port) = &self.inner.hosts[index];
        tracing::warn!(
            host = %host,
            port,
            "a database host stopped answering; its connection is closed and other hosts go first"
        );
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs one connection's protocol until it ends or its host is `dropped`, handing
/// notifications on if asked. Its client sees it closed then, and the pool discards it.
async fn drive<S, T>(
    mut connection: tokio_postgres::Connection<S, T>,
    notifications: Option<mpsc::UnboundedSender<Notification>>,
    dropped: CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Unpin,
    T: AsyncRead + AsyncWrite + Unpin,
{
    loop {
        let message = tokio::select! {
            message = std::future::poll_fn(|cx| connection.poll_message(cx)) => message,
            () = dropped.cancelled() => return,
        };
        match message {
            Some(Ok(AsyncMessage::Notification(notification))) => {
                if let Some(sender) = &notifications {
                    // The listener may have stopped listening; nothing is owed to it then.
                    let _ = sender.send(notification);
                }
            }
            Some(Ok(_notice)) => {}
            Some(Err(err)) => {
                tracing::debug!(%err, "a database connection ended");
                return;
            }
            None => return,
        }
    }
}

/// A TCP stream that fails its reads once something was sent and nothing at all has come back
/// for `reply`: the bound on a server that accepted a connection and then stopped answering.
struct Watched {
    stream: TcpStream,
    reply: Duration,
    /// Armed by a write while none is armed, disarmed by any byte read.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    on_timeout: Option<Box<dyn FnOnce() + Send>>,
}

impl Watched {
    fn new(stream: TcpStream, reply: Duration, on_timeout: Box<dyn FnOnce() + Send>) -> Self {
        Watched {
            stream,
            reply,
            deadline: None,
            on_timeout: Some(on_timeout),
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.deadline = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(err)) => Poll::Ready(Err(err)),
            Poll::Pending => {
                let expired = self
                    .deadline
                    .as_mut()
                    .is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready());
                if !expired {
                    return Poll::Pending;
                }
                self.deadline = None;
                if let Some(on_timeout) = self.on_timeout.take() {
                    on_timeout();
                }
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the database sent nothing for {} ms after a request",
                        self.reply.as_millis()
                    ),
                )))
            }
        }
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.stream).poll_write(cx, data);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) && self.deadline.is_none() {
            let mut deadline = Box::pin(tokio::time::sleep(self.reply));
            // Registers this task with the timer now: the connection may not read again until
            // the socket wakes it, which a silent server never does.
            let _ = deadline.as_mut().poll(cx);
            self.deadline = Some(deadline);
        }
        written
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_host_of_a_formation_url_is_kept_in_order() {
        let database = Database::new(
            "postgres://u@10.0.0.1:6001,10.0.0.2:6002/app?sslmode=disable",
            Timeouts::default(),
            "",
        )
        .unwrap();
        assert_eq!(
            database.inner.hosts,
            vec![("10.0.0.1".to_owned(), 6001), ("10.0.0.2".to_owned(), 6002)]
        );
        assert!(database.inner.read_write);
        let any = Database::new(
            "postgres://u@h/app?target_session_attrs=any",
            Timeouts::default(),
            "",
        )
        .unwrap();
        assert!(!any.inner.read_write);
        assert_eq!(any.inner.hosts, vec![("h".to_owned(), 5432)]);
    }

    #[test]
    fn a_host_that_stops_answering_goes_behind_the_others() {
        let database =
            Database::new("postgres://u@a:1,b:2,c:3/app", Timeouts::default(), "").unwrap();
        database.move_past(0);
        assert_eq!(database.inner.preferred.load(Ordering::Relaxed), 1);
        // A stale report about a host no longer preferred changes nothing.
        database.move_past(0);
        assert_eq!(database.inner.preferred.load(Ordering::Relaxed), 1);
        database.move_past(1);
        database.move_past(2);
        assert_eq!(database.inner.preferred.load(Ordering::Relaxed), 0);
    }
}
