//! The `code` of every refusal ([`super::ErrorBody`]): one enum, so that a service answers only
//! codes that exist and a client matches variants, not text; renaming a code breaks every match
//! on it at compile time instead of silently never matching again.
//!
//! The wire strings are the variants' names in snake_case (serde's `rename_all`), and
//! [`ErrorCode::as_str`] spells each one out once more for logs and messages; the tests below
//! hold both to a written table, so a renamed variant cannot change the wire unnoticed.

use serde::{Deserialize, Serialize};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};

/// A code that this build does not know: what a newer service may answer. It can only be read
/// off the wire, never made, so that no caller writes `Other` for a code that has a variant.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct UnknownCode(String);

impl UnknownCode {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

macro_rules! error_codes {
    ($($(#[$about:meta])* $variant:ident => $wire:literal,)+) => {
        /// For programs: why a request was refused, a stable identifier.
        #[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum ErrorCode {
            $($(#[$about])* $variant,)+
            /// A code this build does not know, kept as it came. A client of this version may
            /// talk to a newer service while a deployment rolls over: failing to read its
            /// refusal would turn a clear "no" into an unreadable answer, and a retry.
            #[serde(untagged)]
            Other(UnknownCode),
        }

        impl ErrorCode {
            /// Every code this build knows, in the order the API document lists them.
            pub const KNOWN: &'static [ErrorCode] = &[$(ErrorCode::$variant,)+];

            /// The code as it is on the wire.
            pub fn as_str(&self) -> &str {
                match self {
                    $(ErrorCode::$variant => $wire,)+
                    ErrorCode::Other(code) => code.as_str(),
                }
            }
        }
    };
}

error_codes! {
    // What any route of any service may answer.
    /// No bearer token, a malformed one, or one the service does not know.
    Unauthorized => "unauthorized",
    /// A known token without the role the route needs.
    Forbidden => "forbidden",
    /// A browser's write from an origin `CORS_ALLOWED_ORIGINS` does not name.
    OriginNotAllowed => "origin_not_allowed",
    NotFound => "not_found",
    MethodNotAllowed => "method_not_allowed",
    /// The body did not arrive in time.
    RequestTimeout => "request_timeout",
    LengthRequired => "length_required",
    PayloadTooLarge => "payload_too_large",
    UriTooLong => "uri_too_long",
    UnsupportedMediaType => "unsupported_media_type",
    HeadersTooLarge => "headers_too_large",
    /// A request the HTTP layer refused before any route saw it.
    BadRequest => "bad_request",
    /// A dependency (the database, lease-service) is out of reach; retrying later may work.
    Unavailable => "unavailable",
    Internal => "internal",
    // A request's shape and bounds.
    MalformedJson => "malformed_json",
    MissingField => "missing_field",
    InvalidField => "invalid_field",
    InvalidPath => "invalid_path",
    InvalidQuery => "invalid_query",
    InvalidId => "invalid_id",
    InvalidBatch => "invalid_batch",
    InvalidLimit => "invalid_limit",
    InvalidCursor => "invalid_cursor",
    InvalidWait => "invalid_wait",
    // Leases.
    /// Another holder has an unexpired lease on the resource.
    LeaseHeld => "lease_held",
    LeaseNotFound => "lease_not_found",
    NotHolder => "not_holder",
    StaleFence => "stale_fence",
    WrongSecret => "wrong_secret",
    SecretRequired => "secret_required",
    InvalidSecret => "invalid_secret",
    LeaseRevoked => "lease_revoked",
    LeaseReleased => "lease_released",
    LeaseExpired => "lease_expired",
    InvalidTtl => "invalid_ttl",
    InvalidMetadata => "invalid_metadata",
    DuplicateResource => "duplicate_resource",
    // Tasks.
    TaskNotFound => "task_not_found",
    TaskFinished => "task_finished",
    /// The lease that covers the task's claim is no longer the claimant's.
    LeaseLost => "lease_lost",
    NotOwner => "not_owner",
    /// The task was cancelled while its worker held it: the worker should stop.
    Cancelled => "cancelled",
    NotDead => "not_dead",
    InvalidSnooze => "invalid_snooze",
    InvalidFence => "invalid_fence",
    InvalidStatus => "invalid_status",
    TooLarge => "too_large",
    TooManyIds => "too_many_ids",
    DuplicateTask => "duplicate_task",
    IdempotencyKeyReused => "idempotency_key_reused",
    DuplicateIdempotencyKey => "duplicate_idempotency_key",
    GeneratorStopped => "generator_stopped",
    StaleGenerator => "stale_generator",
    /// lease-service refuses the TTL task-service asks its task leases for.
    TaskLeaseTtlRejected => "task_lease_ttl_rejected",
    WorkerIdInUse => "worker_id_in_use",
    // Schedules.
    ScheduleExists => "schedule_exists",
    ScheduleNotFound => "schedule_not_found",
    NameMismatch => "name_mismatch",
    InvalidCron => "invalid_cron",
    InvalidTimezone => "invalid_timezone",
    // A client's own names, for what no service said in words it could read.
    /// A refusal whose body was not a readable [`super::ErrorBody`]; task-service passes on
    /// lease-service's refusals as they came, this one included.
    Unknown => "unknown",
    /// A lease guard could not confirm a renewal before its deadline.
    LeaseUnconfirmed => "lease_unconfirmed",
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl utoipa::PartialSchema for ErrorCode {
    fn schema() -> RefOr<Schema> {
        let mut schema = ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(Self::KNOWN.iter().map(Self::as_str)))
            .build();
        schema.description = Some(
            "For programs: why the request was refused, a stable identifier. A newer service \
             may add codes; a client should treat one it does not know by the answer's status"
                .to_owned(),
        );
        RefOr::T(Schema::Object(schema))
    }
}

impl utoipa::ToSchema for ErrorCode {}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Every code and its wire string, written out: a renamed variant (or a new one without
    /// its row) fails here instead of changing what clients read.
    const TABLE: &[(ErrorCode, &str)] = &[
        (ErrorCode::Unauthorized, "unauthorized"),
        (ErrorCode::Forbidden, "forbidden"),
        (ErrorCode::OriginNotAllowed, "origin_not_allowed"),
        (ErrorCode::NotFound, "not_found"),
        (ErrorCode::MethodNotAllowed, "method_not_allowed"),
        (ErrorCode::RequestTimeout, "request_timeout"),
        (ErrorCode::LengthRequired, "length_required"),
        (ErrorCode::PayloadTooLarge, "payload_too_large"),
        (ErrorCode::UriTooLong, "uri_too_long"),
        (ErrorCode::UnsupportedMediaType, "unsupported_media_type"),
        (ErrorCode::HeadersTooLarge, "headers_too_large"),
        (ErrorCode::BadRequest, "bad_request"),
        (ErrorCode::Unavailable, "unavailable"),
        (ErrorCode::Internal, "internal"),
        (ErrorCode::MalformedJson, "malformed_json"),
        (ErrorCode::MissingField, "missing_field"),
        (ErrorCode::InvalidField, "invalid_field"),
        (ErrorCode::InvalidPath, "invalid_path"),
        (ErrorCode::InvalidQuery, "invalid_query"),
        (ErrorCode::InvalidId, "invalid_id"),
        (ErrorCode::InvalidBatch, "invalid_batch"),
        (ErrorCode::InvalidLimit, "invalid_limit"),
        (ErrorCode::InvalidCursor, "invalid_cursor"),
        (ErrorCode::InvalidWait, "invalid_wait"),
        (ErrorCode::LeaseHeld, "lease_held"),
        (ErrorCode::LeaseNotFound, "lease_not_found"),
        (ErrorCode::NotHolder, "not_holder"),
        (ErrorCode::StaleFence, "stale_fence"),
        (ErrorCode::WrongSecret, "wrong_secret"),
        (ErrorCode::SecretRequired, "secret_required"),
        (ErrorCode::InvalidSecret, "invalid_secret"),
        (ErrorCode::LeaseRevoked, "lease_revoked"),
        (ErrorCode::LeaseReleased, "lease_released"),
        (ErrorCode::LeaseExpired, "lease_expired"),
        (ErrorCode::InvalidTtl, "invalid_ttl"),
        (ErrorCode::InvalidMetadata, "invalid_metadata"),
        (ErrorCode::DuplicateResource, "duplicate_resource"),
        (ErrorCode::TaskNotFound, "task_not_found"),
        (ErrorCode::TaskFinished, "task_finished"),
        (ErrorCode::LeaseLost, "lease_lost"),
        (ErrorCode::NotOwner, "not_owner"),
        (ErrorCode::Cancelled, "cancelled"),
        (ErrorCode::NotDead, "not_dead"),
        (ErrorCode::InvalidSnooze, "invalid_snooze"),
        (ErrorCode::InvalidFence, "invalid_fence"),
        (ErrorCode::InvalidStatus, "invalid_status"),
        (ErrorCode::TooLarge, "too_large"),
        (ErrorCode::TooManyIds, "too_many_ids"),
        (ErrorCode::DuplicateTask, "duplicate_task"),
        (ErrorCode::IdempotencyKeyReused, "idempotency_key_reused"),
        (
            ErrorCode::DuplicateIdempotencyKey,
            "duplicate_idempotency_key",
        ),
        (ErrorCode::GeneratorStopped, "generator_stopped"),
        (ErrorCode::StaleGenerator, "stale_generator"),
        (ErrorCode::TaskLeaseTtlRejected, "task_lease_ttl_rejected"),
        (ErrorCode::WorkerIdInUse, "worker_id_in_use"),
        (ErrorCode::ScheduleExists, "schedule_exists"),
        (ErrorCode::ScheduleNotFound, "schedule_not_found"),
        (ErrorCode::NameMismatch, "name_mismatch"),
        (ErrorCode::InvalidCron, "invalid_cron"),
        (ErrorCode::InvalidTimezone, "invalid_timezone"),
        (ErrorCode::Unknown, "unknown"),
        (ErrorCode::LeaseUnconfirmed, "lease_unconfirmed"),
    ];

    #[test]
    fn every_code_is_its_wire_string_both_ways() {
        for (code, wire) in TABLE {
            let json = serde_json::Value::String((*wire).to_owned());
            assert_eq!(serde_json::to_value(code).unwrap(), json, "{code:?}");
            assert_eq!(
                &serde_json::from_value::<ErrorCode>(json).unwrap(),
                code,
                "{wire}"
            );
            assert_eq!(code.as_str(), *wire, "{code:?}");
            assert_eq!(code.to_string(), *wire, "{code:?}");
        }
        let table: Vec<&ErrorCode> = TABLE.iter().map(|(code, _)| code).collect();
        let known: Vec<&ErrorCode> = ErrorCode::KNOWN.iter().collect();
        assert_eq!(table, known, "the table lists every known code, in order");
    }

    #[test]
    fn a_code_this_build_does_not_know_is_kept_as_it_came() {
        let newer: ErrorCode = serde_json::from_str(r#""quota_exceeded""#).unwrap();
        assert_eq!(newer.as_str(), "quota_exceeded");
        assert!(matches!(&newer, ErrorCode::Other(code) if code.as_str() == "quota_exceeded"));
        assert_eq!(
            serde_json::to_string(&newer).unwrap(),
            r#""quota_exceeded""#
        );
        let body: super::super::ErrorBody =
            serde_json::from_str(r#"{"error":"slow down","code":"quota_exceeded"}"#).unwrap();
        assert_eq!(body.code, newer);
        assert!(serde_json::from_str::<ErrorCode>("7").is_err());
    }

    #[test]
    fn the_api_document_lists_every_known_code() {
        let schema = serde_json::to_value(<ErrorCode as utoipa::PartialSchema>::schema()).unwrap();
        assert_eq!(schema["type"], "string");
        let listed: Vec<&str> = schema["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|value| value.as_str().unwrap())
            .collect();
        let wires: Vec<&str> = TABLE.iter().map(|(_, wire)| *wire).collect();
        assert_eq!(listed, wires);
    }
}
