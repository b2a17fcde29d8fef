//! The claim, completion and create groups: requests that arrive together are served together,
//! one transaction (a create group: one statement) and one lease-service batch per group (see
//! [`leasehold::server::coalesce`]). All are built here the same way, with
//! [`coalesce::grouped`], as lease-service builds its own; the operation modules supply only what
//! a group does ([`claim_group`], [`complete_group`], [`create_group`]) and how many waiting
//! requests form one ([`claims_per_group`], [`completions_per_group`], [`creates_per_group`]).

use leasehold::server::ApiError;
use leasehold::server::coalesce::{self, Coalescer};
use leasehold::server::db::Contended;

use super::Transition;
use super::claim::{Claimed, Want, claim_group, claims_per_group};
use super::complete::{Completion, complete_group, completions_per_group};
use super::create::{Created, create_group, creates_per_group};
use crate::context::Context;
use crate::db::{self, DbPool};
use crate::repo::NewTask;

/// Claim requests gathered by queue into [`claim_group`]s.
pub type ClaimGroups = Coalescer<Option<String>, Want, Result<Claimed, ApiError>>;

/// Single completions gathered into groups of [`complete_group`].
pub type CompletionGroups = Coalescer<(), Completion, Result<Transition, ApiError>>;

/// Single creates gathered into groups of [`create_group`].
pub type CreateGroups = Coalescer<(), NewTask, Result<Created, ApiError>>;

/// The claim groups: up to `in_flight` per queue at once, each on a connection of its own from
/// `pool`.
pub fn claim_groups(pool: &DbPool, engine: &Context, in_flight: usize) -> ClaimGroups {
    let (pool, engine) = (pool.clone(), engine.clone());
    coalesce::grouped(
        in_flight,
        claims_per_group,
        move |queue: Option<String>, wants: Vec<Want>| {
            let (pool, engine) = (pool.clone(), engine.clone());
            async move {
                let mut conn = db::connection(&pool).await?;
                let per_want = claim_group(&mut conn, &engine, queue.as_deref(), &wants).await?;
                Ok(per_want.into_iter().map(Ok).collect())
            }
        },
    )
}

/// The completion groups: up to `in_flight` at once, each on a connection of its own from `pool`.
pub fn completion_groups(pool: &DbPool, engine: &Context, in_flight: usize) -> CompletionGroups {
    let (pool, engine) = (pool.clone(), engine.clone());
    coalesce::grouped(
        in_flight,
        completions_per_group,
        move |(), completions: Vec<Completion>| {
            let (pool, engine) = (pool.clone(), engine.clone());
            async move {
                let mut conn = db::connection(&pool).await?;
                complete_group(&mut conn, &engine, &completions).await
            }
        },
    )
}

/// The create groups: up to `in_flight` at once, each on a connection of its own from `pool`.
pub fn create_groups(pool: &DbPool, in_flight: usize) -> CreateGroups {
    let pool = pool.clone();
    coalesce::grouped(
        in_flight,
        creates_per_group,
        move |(), tasks: Vec<NewTask>| {
            let pool = pool.clone();
            async move {
                let mut conn = db::connection(&pool).await?;
                let tasks: Vec<&NewTask> = tasks.iter().collect();
                let mut retry = Contended::default();
                loop {
                    let outcome = create_group(&mut conn, &tasks).await;
                    if !retry.again(&outcome).await {
                        return outcome;
                    }
                }
            }
        },
    )
}
