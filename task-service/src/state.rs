//! What every handler can reach: the pool, the claim, completion and create groups, the
//! [`Context`], and the turns of the heavy reads.

use std::sync::Arc;
use std::time::Duration;

use actix_web::{HttpResponse, web};
use leasehold::server::ApiError;
use leasehold::server::db::DbPool;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::context::Context;
use crate::tasks::{self, ClaimGroups, CompletionGroups, CreateGroups};

pub struct AppState {
    pub pool: DbPool,
    /// Claims and single completions, served in groups of those that arrive together.
    pub claims: ClaimGroups,
    pub completions: CompletionGroups,
    /// Single creates, stored in groups of those that arrive together.
    pub creates: CreateGroups,
    pub engine: Context,
    pub reads: Reads,
}

impl AppState {
    /// The groups run up to `in_flight` statements each at once (claims: per queue); up to
    /// `reads_in_flight` heavy reads run at once.
    pub fn new(pool: DbPool, engine: Context, in_flight: usize, reads_in_flight: usize) -> Self {
        Self {
            claims: tasks::claim_groups(&pool, &engine, in_flight),
            completions: tasks::completion_groups(&pool, &engine, in_flight),
            creates: tasks::create_groups(&pool, in_flight),
            pool,
            engine,
            reads: Reads::new(reads_in_flight),
        }
    }
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("pool", &self.pool.status())
            .finish_non_exhaustive()
    }
}

pub(crate) type State = web::Data<AppState>;

/// Most bytes of task JSON (`taskData`, `taskOutput`, `lastError`) in one listing page; past it
/// the page is cut and `nextCursor` continues it.
pub const LIST_MAX_BYTES: i64 = 4 * 1024 * 1024;

/// How long a heavy read waits for its turn before answering 503: readers that do not read
/// their answers hold the turns, and waiting on them for ever would hide that.
const READ_WAIT: Duration = Duration::from_secs(10);

/// The heavy reads that may run at once, each until its answer is sent: listings, counts, the
/// queues, the dashboard's overview and charts, and the gauges of `/metrics`. Each of them reads
/// many rows, so each holds a database connection for a while: without a bound, a few dozen
/// open readers took every connection of the pool, and claims and completions waited seconds
/// for one or got 503. With it, at most this many connections serve such reads, and the rest of
/// the pool (at least half of it, see `READS_IN_FLIGHT`) stays free for the claim and completion
/// path. Each heavy read also keeps a core of PostgreSQL busy, which is why the default is half
/// the cores: on two cores, with 60 readers, 4 turns took the claims' p99 from 11 to 196 ms and
/// 1 turn to 52 ms (the bench's `reads` section). With [`LIST_MAX_BYTES`] it also bounds the memory that open reads of large tasks can
/// take. Others wait their turn.
#[derive(Debug, Clone)]
pub struct Reads {
    turns: Arc<Semaphore>,
    in_flight: usize,
}

impl Reads {
    pub fn new(in_flight: usize) -> Self {
        Self {
            turns: Arc::new(Semaphore::new(in_flight)),
            in_flight,
        }
    }

    /// A turn, held until the read's answer is sent (see [`HoldingTurn`] and [`holding`]).
    pub async fn turn(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        tokio::time::timeout(READ_WAIT, self.turns.clone().acquire_owned())
            .await
            .map_err(|_| {
                ApiError::Unavailable(format!(
                    "{} heavy reads are being served; try again later",
                    self.in_flight
                ))
            })?
            .map_err(|_| ApiError::Unavailable("shutting down".to_owned()))
    }
}

/// `value` as a 200 JSON answer whose body holds `turn` until it is sent, serialized on a
/// blocking thread: a heavy read's answer runs to megabytes (the counts of 30,000 queues), and
/// an HTTP worker busy serializing it serves no claim meanwhile.
pub async fn json_holding<T: serde::Serialize + Send + 'static>(
    value: T,
    turn: OwnedSemaphorePermit,
) -> Result<HttpResponse, ApiError> {
    let body = web::block(move || serde_json::to_vec(&value))
        .await
        .map_err(|err| ApiError::Internal(format!("serializing an answer: {err}")))?
        .map_err(|err| ApiError::Internal(format!("serializing an answer: {err}")))?;
    Ok(holding(
        HttpResponse::Ok()
            .content_type(actix_web::http::header::ContentType::json())
            .body(body),
        turn,
    ))
}

/// `response` with its body holding `turn` until it is sent.
pub fn holding(response: HttpResponse, turn: OwnedSemaphorePermit) -> HttpResponse {
    response
        .map_body(|_, body| HoldingTurn { body, turn })
        .map_into_boxed_body()
}

/// An answer's body that holds its read's turn until it is sent. actix polls a body again only
/// once most of what it last gave is written to the socket, so a page stays counted against
/// the [`Reads`] bound for as long as its bytes are in this process, however slowly its reader
/// reads.
pub struct HoldingTurn {
    pub body: actix_web::body::BoxBody,
    pub turn: OwnedSemaphorePermit,
}

impl std::fmt::Debug for HoldingTurn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HoldingTurn").finish_non_exhaustive()
    }
}

impl actix_web::body::MessageBody for HoldingTurn {
    type Error = Box<dyn std::error::Error>;

    fn size(&self) -> actix_web::body::BodySize {
        self.body.size()
    }

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<web::Bytes, Self::Error>>> {
        std::pin::Pin::new(&mut self.get_mut().body).poll_next(cx)
    }
}
