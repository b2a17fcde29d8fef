//! A typed client for lease-service.
//!
//! Transient failures (connection errors, timeouts, 5xx) are retried with capped, jittered
//! exponential backoff. That is safe because every call is idempotent on the server: a repeated
//! acquire by the same holder is a reentrant acquire that keeps the fence, a repeated renew just
//! renews again, and a repeated release by the same holder and fence succeeds without touching a
//! newer lease. A refusal (409, other 4xx) is an answer, never retried.

use std::time::Duration;

use reqwest::StatusCode;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::api::{
    AcquireLease, AcquireLeases, AcquiredLeases, CheckLeases, CheckedLeases, ErrorBody, ErrorCode,
    Lease, LeaseCheck, LeasePage, LeaseRef, Proof, ReleaseLease, ReleaseLeases, ReleasedLeases,
    RenewLease, Secret,
};
use crate::transport::{self, Call, Sent};

// The operators' calls (list, read by id, revoke), in a file of their own.
mod admin;
mod error;
mod wait;
pub use admin::{LeaseListing, LeaseSet};
pub use error::LeaseError;
use error::refusal;

pub use crate::retry::RetryPolicy;

/// A client of lease-service's `/api/leases`.
#[derive(Debug, Clone)]
pub struct LeaseClient {
    http: reqwest::Client,
    /// What bounds each request (`None`: reqwest's default); an acquire that waits gets its
    /// wait on top.
    timeout: Option<Duration>,
    base_url: String,
    retry: RetryPolicy,
    /// Sent as `Authorization: Bearer ...` when lease-service's write routes are locked.
    bearer: Option<Secret>,
}

/// How one HTTP exchange ended, before it is turned into a [`LeaseError`].
enum Outcome<T> {
    Ok(StatusCode, T),
    Refused(StatusCode, ErrorBody),
    Transient(String),
}

impl LeaseClient {
    /// A client for the lease-service at `base_url` (e.g. `http://127.0.0.1:8081`), with a
    /// 5-second request timeout and the default retry policy.
    pub fn new(base_url: impl Into<String>) -> Self {
        Self::from_parts(reqwest::Client::new(), base_url).with_timeout(Duration::from_secs(5))
    }

    /// What bounds each request (an acquire that waits gets its wait on top).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.http = crate::keep_alive::client_builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(2)))
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        self.timeout = Some(timeout);
        self
    }

    /// Uses an existing reqwest client (so callers can share its pool and middleware).
    pub fn from_parts(http: reqwest::Client, base_url: impl Into<String>) -> Self {
        let base_url = base_url.into().trim_end_matches('/').to_owned();
        Self {
            http,
            timeout: None,
            base_url,
            retry: RetryPolicy::default(),
            bearer: None,
        }
    }

    /// Sends `token` as a bearer token on every call (a token with the `leaseholder` role, when
    /// lease-service's `AUTH_TOKENS` is set). `None` or an empty token sends none.
    pub fn with_bearer_token(mut self, token: Option<&str>) -> Self {
        self.bearer = token.filter(|t| !t.is_empty()).map(Secret::new);
        self
    }

    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Acquires `resource` for `holder` (reentrant: the current holder extends its lease and
    /// keeps its fence). `ttl` defaults to the service's default (30 s).
    pub async fn acquire(
        &self,
        resource: &str,
        holder: &str,
        ttl: Option<Duration>,
    ) -> Result<Lease, LeaseError> {
        self.acquire_proving(resource, holder, ttl, None)
            .await
            .map(|(lease, _)| lease)
    }

    /// Like [`LeaseClient::acquire`], but says whether the acquisition is new (`true`, 201) or
    /// reentrant (`false`, 200: `holder` already held the lease, which was extended with its
    /// fence kept), and presents the secret of the lease `holder` already has, if any: a
    /// reentrant acquire needs it when lease-service requires proof.
    pub async fn acquire_proving(
        &self,
        resource: &str,
        holder: &str,
        ttl: Option<Duration>,
        secret: Option<&Secret>,
    ) -> Result<(Lease, bool), LeaseError> {
        self.acquire_waiting(resource, holder, ttl, secret, Duration::ZERO)
            .await
    }

    /// [`LeaseClient::acquire_proving`] that, when another holder has the lease, waits up to
    /// `wait` (at most [`crate::api::MAX_ACQUIRE_WAIT_MS`]) in lease-service for it to be
    /// released or to expire, as etcd's `Lock` blocks. Waiters get the lease in arrival order
    /// where lease-service can tell. A lease-service that does not know `wait_ms` answers at
    /// once.
    pub async fn acquire_waiting(
        &self,
        resource: &str,
        holder: &str,
        ttl: Option<Duration>,
        secret: Option<&Secret>,
        wait: Duration,
    ) -> Result<(Lease, bool), LeaseError> {
        let wait = wait.min(Duration::from_millis(crate::api::MAX_ACQUIRE_WAIT_MS));
        let body = AcquireLease {
            resource: resource.to_owned(),
            holder: holder.to_owned(),
            ttl_seconds: ttl.map(ttl_seconds),
            secret: secret.cloned(),
            wait_ms: (!wait.is_zero()).then(|| u64::try_from(wait.as_millis()).unwrap_or(0)),
            metadata: None,
        };
        self.post_acquire(&body, wait).await
    }

    /// [`LeaseClient::acquire_proving`] that stores `metadata` (a JSON object) with the lease,
    /// as what the holder says about itself ([`Lease::metadata`]); a reentrant acquire replaces
    /// it. `secret`, the holder's own, is kept by a new acquisition ([`AcquireLease::secret`]).
    pub async fn acquire_announcing(
        &self,
        resource: &str,
        holder: &str,
        ttl: Option<Duration>,
        secret: Option<&Secret>,
        metadata: &serde_json::Value,
    ) -> Result<(Lease, bool), LeaseError> {
        let body = AcquireLease {
            resource: resource.to_owned(),
            holder: holder.to_owned(),
            ttl_seconds: ttl.map(ttl_seconds),
            secret: secret.cloned(),
            wait_ms: None,
            metadata: Some(metadata.clone()),
        };
        self.post_acquire(&body, Duration::ZERO).await
    }

    async fn post_acquire(
        &self,
        body: &AcquireLease,
        wait: Duration,
    ) -> Result<(Lease, bool), LeaseError> {
        self.call_waiting(reqwest::Method::POST, "/api/leases", &[], Some(body), wait)
            .await
            .map(|(status, lease)| (lease, status == StatusCode::CREATED))
            .map_err(|(status, err)| refusal(&body.resource, status, err))
    }

    /// Acquires many resources with one call and one commit (at most
    /// [`crate::api::MAX_BATCH_RESOURCES`], all distinct), `resources[i]` for `holders[i]`: each
    /// is acquired, extended (its holder had it) or reported held, independently of the others.
    pub async fn acquire_each(
        &self,
        resources: &[String],
        holders: &[String],
        ttl: Option<Duration>,
    ) -> Result<AcquiredLeases, LeaseError> {
        let body = AcquireLeases {
            resources: resources.to_vec(),
            holder: None,
            holders: Some(holders.to_vec()),
            ttl_seconds: ttl.map(ttl_seconds),
            metadata: None,
        };
        self.call(reqwest::Method::POST, "/api/leases/batch", &[], Some(&body))
            .await
            .map(|(_, answer)| answer)
            .map_err(|(status, err)| refusal("(batch)", status, err))
    }

    /// Renews the lease. The proof's fence, when given, must be the current fence, and its
    /// secret the lease's ([`Lease::proof`] gives both). `ttl`, when given, becomes the
    /// lease's TTL.
    pub async fn renew(
        &self,
        resource: &str,
        holder: &str,
        proof: Proof<'_>,
        ttl: Option<Duration>,
    ) -> Result<Lease, LeaseError> {
        self.renew_announcing(resource, holder, proof, ttl, None)
            .await
    }

    /// [`LeaseClient::renew`] that also replaces the lease's [`Lease::metadata`], when given.
    pub async fn renew_announcing(
        &self,
        resource: &str,
        holder: &str,
        proof: Proof<'_>,
        ttl: Option<Duration>,
        metadata: Option<&serde_json::Value>,
    ) -> Result<Lease, LeaseError> {
        let body = RenewLease {
            resource: resource.to_owned(),
            holder: holder.to_owned(),
            fence: proof.fence,
            ttl_seconds: ttl.map(ttl_seconds),
            secret: proof.secret_field(),
            metadata: metadata.cloned(),
        };
        self.call(reqwest::Method::PUT, "/api/leases/renew", &[], Some(&body))
            .await
            .map(|(_, lease)| lease)
            .map_err(|(status, err)| refusal(resource, status, err))
    }

    /// Releases the lease so that the resource can be acquired at once.
    pub async fn release(
        &self,
        resource: &str,
        holder: &str,
        proof: Proof<'_>,
    ) -> Result<Lease, LeaseError> {
        let body = ReleaseLease {
            resource: resource.to_owned(),
            holder: holder.to_owned(),
            fence: proof.fence,
            secret: proof.secret_field(),
        };
        self.call(
            reqwest::Method::DELETE,
            "/api/leases/release",
            &[],
            Some(&body),
        )
        .await
        .map(|(_, lease)| lease)
        .map_err(|(status, err)| refusal(resource, status, err))
    }

    /// Releases many leases of one or more holders in one call and one commit (at most
    /// [`crate::api::MAX_BATCH_RESOURCES`]): one outcome per `(resource, holder, proof)`, in
    /// order, each as [`LeaseClient::release`] would have had it alone.
    pub async fn release_many(
        &self,
        leases: &[(String, String, Proof<'_>)],
    ) -> Result<Vec<Result<Lease, LeaseError>>, LeaseError> {
        let body = ReleaseLeases {
            leases: leases
                .iter()
                .map(|(resource, holder, proof)| ReleaseLease {
                    resource: resource.clone(),
                    holder: holder.clone(),
                    fence: proof.fence,
                    secret: proof.secret_field(),
                })
                .collect(),
        };
        let (_, answer): (_, ReleasedLeases) = self
            .call(
                reqwest::Method::POST,
                "/api/leases/batch/release",
                &[],
                Some(&body),
            )
            .await
            .map_err(|(status, err)| refusal("(batch)", status, err))?;
        Ok(answer
            .results
            .into_iter()
            .map(|result| match (result.lease, result.error) {
                (Some(lease), _) => Ok(lease),
                (None, error) => Err(refusal(
                    &result.resource,
                    StatusCode::from_u16(result.status).ok(),
                    Ok(error.unwrap_or_else(|| ErrorBody::new(ErrorCode::Unknown, "no answer"))),
                )),
            })
            .collect())
    }

    /// Where each acquisition `(resource, fence)` stands, in one read
    /// (`POST /api/leases/batch/check`, at most [`crate::api::MAX_BATCH_RESOURCES`]), in order.
    pub async fn check_many(&self, leases: &[(&str, i64)]) -> Result<Vec<LeaseCheck>, LeaseError> {
        let body = CheckLeases {
            leases: leases
                .iter()
                .map(|(resource, fence)| LeaseRef {
                    resource: (*resource).to_owned(),
                    fence: *fence,
                })
                .collect(),
        };
        let (_, answer): (_, CheckedLeases) = self
            .call(
                reqwest::Method::POST,
                "/api/leases/batch/check",
                &[],
                Some(&body),
            )
            .await
            .map_err(|(status, err)| refusal("(batch)", status, err))?;
        Ok(answer.results)
    }

    /// The unexpired, unreleased lease on `resource`, if any.
    pub async fn current(&self, resource: &str) -> Result<Option<Lease>, LeaseError> {
        // By its exact name: a prefix page could be filled by other resources sharing it.
        let query = [("resource", resource), ("limit", "1")];
        let (_, page): (_, LeasePage) = self
            .call(
                reqwest::Method::GET,
                "/api/leases/active",
                &query,
                None::<&()>,
            )
            .await
            .map_err(|(status, err)| refusal(resource, status, err))?;
        Ok(page
            .leases
            .into_iter()
            .find(|lease| lease.resource == resource))
    }

    /// Sends one request, retrying transient failures; a refusal comes back as `Err(Some(..))`,
    /// unavailability as `Err(None)`.
    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<&B>,
    ) -> Result<(StatusCode, T), (Option<StatusCode>, Result<ErrorBody, String>)> {
        self.call_waiting(method, path, query, body, Duration::ZERO)
            .await
    }

    /// [`LeaseClient::call`] of a request lease-service may hold up to `wait` before answering:
    /// its timeout is longer by `wait`.
    async fn call_waiting<B: Serialize, T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<&B>,
        wait: Duration,
    ) -> Result<(StatusCode, T), (Option<StatusCode>, Result<ErrorBody, String>)> {
        let url = format!("{}{}", self.base_url, path);
        let mut attempt = 0u32;
        loop {
            attempt = attempt.saturating_add(1);
            match self.exchange(method.clone(), &url, query, body, wait).await {
                Outcome::Ok(status, value) => return Ok((status, value)),
                Outcome::Refused(status, err) => return Err((Some(status), Ok(err))),
                Outcome::Transient(reason) => {
                    if attempt >= self.retry.max_attempts {
                        return Err((None, Err(reason)));
                    }
                    tracing::debug!(%url, attempt, %reason, "lease-service call failed; retrying");
                    tokio::time::sleep(self.retry.delay(attempt)).await;
                }
            }
        }
    }

    async fn exchange<B: Serialize, T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        url: &str,
        query: &[(&str, &str)],
        body: Option<&B>,
        wait: Duration,
    ) -> Outcome<T> {
        let call = Call {
            method,
            url,
            query,
            body,
            bearer: self.bearer.as_ref(),
            timeout: (!wait.is_zero()).then(|| {
                self.timeout
                    .unwrap_or(Duration::from_secs(30))
                    .saturating_add(wait)
            }),
        };
        match transport::exchange(&self.http, "lease-service", call).await {
            Sent::Answer { status, body } => match serde_json::from_slice(&body) {
                Ok(value) => Outcome::Ok(status, value),
                Err(err) => {
                    Outcome::Transient(format!("unreadable answer from lease-service: {err}"))
                }
            },
            Sent::Refused { status, body } => Outcome::Refused(status, body),
            Sent::Transient(reason) => Outcome::Transient(reason),
        }
    }
}

/// Whole seconds, at least 1: lease-service counts TTLs in seconds.
fn ttl_seconds(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX).max(1)
}
