//! The operators' calls: list leases, read one by id, and revoke one whoever holds it. These
//! are reads and an operator's decision, not a holder's: a refusal is always
//! [`LeaseError::Rejected`] with lease-service's status and code, never "held" or "lost".

use reqwest::StatusCode;

use super::{LeaseClient, LeaseError};
use crate::api::{ErrorBody, Lease, LeasePage, OneLease};

/// Which of lease-service's listings to read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LeaseSet {
    /// Every lease (`GET /api/leases`).
    #[default]
    All,
    Active,
    Expired,
    Renewed,
    Released,
}

impl LeaseSet {
    pub const ALL: [LeaseSet; 5] = [
        LeaseSet::All,
        LeaseSet::Active,
        LeaseSet::Expired,
        LeaseSet::Renewed,
        LeaseSet::Released,
    ];

    /// The name lease-service's listing goes by (`all` for every lease).
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseSet::All => "all",
            LeaseSet::Active => "active",
            LeaseSet::Expired => "expired",
            LeaseSet::Renewed => "renewed",
            LeaseSet::Released => "released",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|set| set.as_str() == text)
    }

    /// The listing's path.
    pub fn path(self) -> String {
        match self {
            LeaseSet::All => "/api/leases".to_owned(),
            other => format!("/api/leases/{}", other.as_str()),
        }
    }
}

/// Which page of a lease listing to read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseListing {
    pub set: LeaseSet,
    /// Only leases whose resource starts with this.
    pub resource_prefix: Option<String>,
    /// At most this many rows (the service's default when `None`).
    pub limit: Option<u32>,
    /// Go on from an earlier page's `nextCursor`.
    pub cursor: Option<String>,
    /// Newest first; oldest first when `false`.
    pub newest_first: bool,
}

impl LeaseListing {
    fn query(&self) -> Vec<(&'static str, String)> {
        crate::api::page_query(
            self.limit,
            self.cursor.as_deref(),
            self.newest_first,
            [("resource_prefix", &self.resource_prefix)],
        )
    }
}

impl LeaseClient {
    /// One page of a lease listing.
    pub async fn list(&self, listing: &LeaseListing) -> Result<LeasePage, LeaseError> {
        let query = listing.query();
        let query: Vec<(&str, &str)> = query
            .iter()
            .map(|(name, value)| (*name, value.as_str()))
            .collect();
        self.call(
            reqwest::Method::GET,
            &listing.set.path(),
            &query,
            None::<&()>,
        )
        .await
        .map(|(_, page)| page)
        .map_err(rejected)
    }

    /// The lease with this id, whatever its status.
    pub async fn lease(&self, id: i64) -> Result<Lease, LeaseError> {
        let path = format!("/api/leases/{id}");
        self.call(reqwest::Method::GET, &path, &[], None::<&()>)
            .await
            .map(|(_, answer): (_, OneLease)| answer.lease)
            .map_err(rejected)
    }

    /// `GET /healthz`: whether lease-service is up and serving.
    pub async fn healthy(&self) -> Result<(), LeaseError> {
        self.call(reqwest::Method::GET, "/healthz", &[], None::<&()>)
            .await
            .map(|(_, _): (_, serde_json::Value)| ())
            .map_err(rejected)
    }

    /// Ends lease `id` whoever holds it (a token with the `operator` role); its holder is
    /// refused from then on.
    pub async fn revoke(&self, id: i64) -> Result<Lease, LeaseError> {
        let path = format!("/api/leases/{id}/revoke");
        self.call(reqwest::Method::POST, &path, &[], None::<&()>)
            .await
            .map(|(_, lease)| lease)
            .map_err(rejected)
    }
}

/// A failed operator call: unavailable when lease-service did not answer, else rejected with
/// its status and code.
fn rejected((status, answer): (Option<StatusCode>, Result<ErrorBody, String>)) -> LeaseError {
    match (status, answer) {
        (Some(status), Ok(body)) => LeaseError::Rejected {
            status: status.as_u16(),
            code: body.code,
            error: body.error,
        },
        (_, Err(reason)) | (None, Ok(ErrorBody { error: reason, .. })) => {
            LeaseError::Unavailable(reason)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ErrorCode;

    #[test]
    fn every_set_has_its_listing() {
        for set in LeaseSet::ALL {
            assert_eq!(LeaseSet::parse(set.as_str()), Some(set));
        }
        assert_eq!(LeaseSet::All.path(), "/api/leases");
        assert_eq!(LeaseSet::Released.path(), "/api/leases/released");
        assert_eq!(LeaseSet::parse("revoked"), None);
    }

    #[test]
    fn a_listing_asks_only_for_what_it_names() {
        assert!(LeaseListing::default().query().is_empty());
        let listing = LeaseListing {
            set: LeaseSet::Active,
            resource_prefix: Some("task:".to_owned()),
            limit: Some(2),
            cursor: None,
            newest_first: true,
        };
        let query = listing.query();
        let names: Vec<&str> = query.iter().map(|(name, _)| *name).collect();
        assert_eq!(names, ["order", "limit", "resource_prefix"]);
    }

    #[test]
    fn an_operator_call_is_rejected_or_unavailable_never_lost() {
        let refused = rejected((
            Some(StatusCode::NOT_FOUND),
            Ok(ErrorBody::new(ErrorCode::NotFound, "no lease 9")),
        ));
        assert!(
            matches!(
                &refused,
                LeaseError::Rejected {
                    status: 404,
                    code: ErrorCode::NotFound,
                    ..
                }
            ),
            "{refused}"
        );
        assert!(matches!(
            rejected((None, Err("cannot connect".to_owned()))),
            LeaseError::Unavailable(_)
        ));
    }
}
