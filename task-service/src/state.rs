//! What every handler can reach: the pool, the claim and completion groups, the [`Engine`],
//! and the turns of the listings.

use std::sync::Arc;
use std::time::Duration;

use actix_web::web;
use leasehold::server::ApiError;
use leasehold::server::db::DbPool;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::tasks::{self, ClaimGroups, CompletionGroups, Engine};

pub struct AppState {
    pub pool: DbPool,
    /// Claims and single completions, served in groups of those that arrive together.
    pub claims: ClaimGroups,
    pub completions: CompletionGroups,
    pub engine: Engine,
    pub listings: Listings,
}

impl AppState {
    /// The groups run up to `in_flight` statements each at once (claims: per queue).
    pub fn new(pool: DbPool, engine: Engine, in_flight: usize) -> Self {
        Self {
            claims: tasks::claim_groups(&pool, &engine, in_flight),
            completions: tasks::completion_groups(&pool, &engine, in_flight),
            pool,
            engine,
            listings: Listings::default(),
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

/// Listings served at once by one replica.
pub const LISTINGS_IN_FLIGHT: usize = 4;

/// How long a listing waits for its turn before answering 503: readers that do not read their
/// answers hold the turns, and waiting on them for ever would hide that.
const LISTING_WAIT: Duration = Duration::from_secs(10);

/// The listings that may run at once, each until its answer is sent: with [`LIST_MAX_BYTES`],
/// what bounds the memory that open reads of large tasks can take. Others wait their turn.
#[derive(Debug, Clone)]
pub struct Listings(Arc<Semaphore>);

impl Default for Listings {
    fn default() -> Self {
        Self(Arc::new(Semaphore::new(LISTINGS_IN_FLIGHT)))
    }
}

impl Listings {
    /// A turn, held until the listing's answer is sent (see [`HoldingTurn`]).
    pub async fn turn(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        tokio::time::timeout(LISTING_WAIT, self.0.clone().acquire_owned())
            .await
            .map_err(|_| {
                ApiError::Unavailable(format!(
                    "{LISTINGS_IN_FLIGHT} listings are being sent; try again later"
                ))
            })?
            .map_err(|_| ApiError::Unavailable("shutting down".to_owned()))
    }
}

/// An answer's body that holds its listing's turn until it is sent. actix polls a body again
/// only once most of what it last gave is written to the socket, so a page stays counted
/// against [`LISTINGS_IN_FLIGHT`] for as long as its bytes are in this process, however slowly
/// its reader reads.
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
