//! Readiness (`/readyz`): the database answers, lease-service is healthy, and it accepts the
//! task lease TTL, all within one budget.

use std::time::Duration;

use leasehold::server::ApiError;
use leasehold::server::db::{self, DbPool};

use super::check_lease_ttl;
use crate::context::Context;

/// One budget for the whole check, within a Kubernetes readiness probe's `timeoutSeconds: 2`:
/// a probe that gives up before the answer learns nothing of why.
const BUDGET: Duration = Duration::from_secs(2);

/// The database node reached when this replica can serve; otherwise why not, naming what it
/// was still waiting for when the budget ran out.
pub async fn ready(pool: &DbPool, engine: &Context) -> Result<db::DatabaseNode, ApiError> {
    let waiting_on = std::cell::Cell::new("the database");
    let check =
        async {
            let database = async {
                let mut conn = db::connection(pool).await?;
                Ok::<_, ApiError>(db::node(&mut conn).await?)
            };
            let node = database
                .await
                .map_err(|err| ApiError::Unavailable(format!("database not ready: {err}")))?;
            waiting_on.set("lease-service's /healthz");
            engine.leases.healthy().await.map_err(|err| {
                ApiError::Unavailable(format!("lease-service not healthy: {err}"))
            })?;
            waiting_on.set("lease-service's verdict on the task lease TTL");
            // A TTL lease-service refuses would starve every claim while all looks healthy.
            check_lease_ttl(engine).await.map(|()| node)
        };
    match tokio::time::timeout(BUDGET, check).await {
        Ok(answer) => answer,
        Err(_) => Err(ApiError::Unavailable(format!(
            "not ready within {} s: still waiting for {}",
            BUDGET.as_secs(),
            waiting_on.get()
        ))),
    }
}
