//! Worker processes: each makes itself known while it lives by a liveness lease of its own,
//! `worker:<id>` in lease-service, that this service acquires and renews for it at each beat
//! (`PUT /api/workers/{id}`), with what the process says about itself as the lease's metadata.
//! Leasehold's own primitive is the registry: a process that dies stops beating and its lease
//! lapses (judged by lease-service's clock), one that stops releases it, and the listing
//! (`GET /api/workers`) reads the leases, so every replica tells the same.

use std::time::Duration;

use leasehold::ErrorCode;
use leasehold::LeaseError;
use leasehold::api::{Lease, LeaseStatus, MIN_OWN_SECRET_CHARS, Proof, Secret};
use leasehold::lease_client::{LeaseListing, LeaseSet};
use leasehold::schema::MAX_WORKER_LABEL_CHARS;
use leasehold::server::{ApiError, validate_name, validate_name_within};
use leasehold::tasks::MAX_QUEUE_CHARS;
use leasehold::workers::{
    MAX_TTL_SECONDS, RESOURCE_PREFIX, WorkerBeat, WorkerGone, WorkerInfo, WorkerLease,
    WorkerLiveness, WorkerState, Workers, resource,
};

use crate::context::Context;
use crate::dashboard::passed_on;

/// Most worker processes listed (live first).
pub const MAX_LISTED: u32 = 1000;

/// `PUT /api/workers/{id}`: renews the process's lease with what it says now; takes the lease
/// anew when the process has none yet, or lost it (it lapsed: the process was paused or cut
/// off for longer than its TTL). The lease's holder is the process's run
/// ([`WorkerBeat::instance`]), so a second process under the same id while the first one's lease
/// is live is refused (409 `worker_id_in_use`), as any other holder would be.
///
/// A process that brings its own secret presents it at every beat, and every acquisition of its
/// lease keeps it: a beat whose answer was lost (its replica killed or paused mid-beat, the
/// answer timed out) leaves a lease the next beat still proves, so a lease-service that
/// requires proof never refuses the process its own lease. One that brings none (an older
/// worker) gets lease-service's secret in the answer to the beat that took the lease.
pub async fn beat(engine: &Context, id: &str, beat: &WorkerBeat) -> Result<WorkerLease, ApiError> {
    check_id(id)?;
    validate_name("instance", &beat.instance)?;
    check_info(&beat.info)?;
    if let Some(secret) = &beat.secret {
        check_secret(secret)?;
    }
    if !(1..=MAX_TTL_SECONDS).contains(&beat.ttl_seconds) {
        return Err(ApiError::invalid(
            ErrorCode::InvalidField,
            "ttl_seconds",
            format!("ttl_seconds must be between 1 and {MAX_TTL_SECONDS}"),
        ));
    }
    let resource = resource(id);
    let ttl = Duration::from_secs(beat.ttl_seconds.unsigned_abs());
    let registered = Registered {
        id: id.to_owned(),
        info: beat.info.clone(),
    };
    let metadata = serde_json::to_value(&registered)
        .map_err(|err| ApiError::Internal(format!("encoding a worker's info: {err}")))?;
    if let Some(fence) = beat.fence {
        let proof = Proof {
            fence: Some(fence),
            secret: beat.secret.as_ref().map(|s| s.expose()),
        };
        match engine
            .leases
            .renew_announcing(&resource, &beat.instance, proof, Some(ttl), Some(&metadata))
            .await
        {
            Ok(lease) => return Ok(answer(lease, None)),
            // Lapsed or ended: this beat takes the lease anew, under a new fence.
            Err(LeaseError::Lost { .. }) => {}
            Err(err) => return Err(passed_on(err)),
        }
    }
    let (lease, _) = engine
        .leases
        .acquire_announcing(
            &resource,
            &beat.instance,
            Some(ttl),
            beat.secret.as_ref(),
            &metadata,
        )
        .await
        .map_err(|err| match err {
            LeaseError::Held { holder, .. } => ApiError::Conflict {
                code: ErrorCode::WorkerIdInUse,
                message: format!("worker id {id} is in use by {holder}"),
            },
            err => passed_on(err),
        })?;
    // The process's own secret is not sent back: it has it.
    let secret = beat
        .secret
        .is_none()
        .then(|| lease.secret.clone())
        .flatten();
    Ok(answer(lease, secret))
}

/// A process's own secret becomes its lease's, so it must be one lease-service accepts as such.
fn check_secret(secret: &Secret) -> Result<(), ApiError> {
    let chars = secret.expose().chars().count();
    if (MIN_OWN_SECRET_CHARS..=leasehold::api::MAX_NAME_CHARS).contains(&chars) {
        return Ok(());
    }
    Err(ApiError::invalid(
        ErrorCode::InvalidSecret,
        "secret",
        format!(
            "secret must be {MIN_OWN_SECRET_CHARS} to {} characters, got {chars}",
            leasehold::api::MAX_NAME_CHARS
        ),
    ))
}

/// `DELETE /api/workers/{id}`: the process stops; its lease is released, so it shows as stopped
/// at once rather than lost when its TTL runs out. A lease that already ended (it lapsed while
/// the process was paused) is as good as released: the process is gone either way.
pub async fn gone(engine: &Context, id: &str, gone: &WorkerGone) -> Result<(), ApiError> {
    check_id(id)?;
    validate_name("instance", &gone.instance)?;
    let proof = Proof {
        fence: Some(gone.fence),
        secret: gone.secret.as_ref().map(|s| s.expose()),
    };
    match engine
        .leases
        .release(&resource(id), &gone.instance, proof)
        .await
    {
        Ok(_) => Ok(()),
        Err(LeaseError::Lost {
            code: ErrorCode::LeaseExpired | ErrorCode::LeaseReleased | ErrorCode::LeaseNotFound,
            ..
        }) => Ok(()),
        Err(err) => Err(passed_on(err)),
    }
}

/// A worker id, whose lease's resource (`worker:<id>`) must be a valid resource name.
pub(crate) fn check_id(id: &str) -> Result<(), ApiError> {
    validate_name_within(
        "id",
        id,
        leasehold::api::MAX_NAME_CHARS - RESOURCE_PREFIX.len(),
    )
}

/// `GET /api/workers`: every live worker process (up to [`MAX_LISTED`]), then the newest of
/// those gone that lease-service remembers, to the same bound. The live ones are read apart, to
/// the end, so no number of ended leases can hide a live process.
pub async fn list(engine: &Context) -> Result<Workers, ApiError> {
    let listing = |set, cursor| LeaseListing {
        set,
        resource_prefix: Some(RESOURCE_PREFIX.to_owned()),
        limit: Some(MAX_LISTED),
        cursor,
        newest_first: true,
    };
    let mut leases = Vec::new();
    let mut cursor = None;
    loop {
        let page = engine
            .leases
            .list(&listing(LeaseSet::Active, cursor))
            .await
            .map_err(passed_on)?;
        leases.extend(page.leases);
        cursor = page.next_cursor;
        if cursor.is_none() || leases.len() >= MAX_LISTED as usize {
            break;
        }
    }
    leases.truncate(MAX_LISTED as usize);
    let ended = engine
        .leases
        .list(&listing(LeaseSet::All, None))
        .await
        .map_err(passed_on)?;
    let room = (MAX_LISTED as usize).saturating_sub(leases.len());
    // Those the first read did not list, by resource rather than by status: a process that
    // took its lease anew between the two reads is active in the second, and filtered by
    // status it was listed by neither.
    let listed: std::collections::HashSet<String> =
        leases.iter().map(|lease| lease.resource.clone()).collect();
    leases.extend(
        ended
            .leases
            .into_iter()
            .filter(|lease| !listed.contains(&lease.resource))
            .take(room),
    );
    let mut workers: Vec<WorkerState> = leases.into_iter().filter_map(state).collect();
    workers.sort_by(|a, b| {
        let live =
            |w: &WorkerState| matches!(w.liveness, WorkerLiveness::Alive | WorkerLiveness::Late);
        (!live(a))
            .cmp(&!live(b))
            .then(b.last_beat_at.cmp(&a.last_beat_at))
    });
    Ok(Workers { workers })
}

/// What a worker process's lease carries as metadata: the process's id, which the listing reads
/// here rather than cut out of the lease's resource name, and what the process says of itself.
#[derive(serde::Serialize, serde::Deserialize)]
struct Registered {
    id: String,
    #[serde(flatten)]
    info: WorkerInfo,
}

/// A worker process as its lease shows it; none for a lease its beats did not take.
fn state(lease: Lease) -> Option<WorkerState> {
    let Registered { id, info } = serde_json::from_value(lease.metadata?).ok()?;
    let liveness = match lease.status {
        // A process beats at least three times per TTL (`worker::presence`): half a TTL
        // without a beat is more than one beat missed.
        LeaseStatus::Active if lease.expires_in_ms * 2 < i64::from(lease.ttl_seconds) * 1000 => {
            WorkerLiveness::Late
        }
        LeaseStatus::Active => WorkerLiveness::Alive,
        LeaseStatus::Released | LeaseStatus::Revoked => WorkerLiveness::Stopped,
        LeaseStatus::Expired => WorkerLiveness::Lost,
    };
    Some(WorkerState {
        id,
        liveness,
        info: Some(info),
        since: lease.created_at,
        last_beat_at: lease.renewed_at.unwrap_or(lease.created_at),
        until: lease.released_at.unwrap_or(lease.expires_at),
    })
}

fn answer(lease: Lease, secret: Option<Secret>) -> WorkerLease {
    WorkerLease {
        fence: lease.fence,
        secret,
        expires_in_ms: lease.expires_in_ms,
    }
}

fn check_info(info: &WorkerInfo) -> Result<(), ApiError> {
    validate_name_within("info.host", &info.host, MAX_WORKER_LABEL_CHARS)?;
    validate_name_within("info.version", &info.version, MAX_WORKER_LABEL_CHARS)?;
    if let Some(queue) = &info.queue {
        validate_name_within("info.queue", queue, MAX_QUEUE_CHARS)?;
    }
    if info.busy > info.concurrency {
        return Err(ApiError::invalid(
            ErrorCode::InvalidField,
            "info.busy",
            "info.busy cannot exceed info.concurrency",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use leasehold::api::{MAX_LEASE_METADATA_BYTES, MAX_NAME_CHARS};

    use super::*;

    /// What a beat may say and what lease-service keeps compose: a beat with every field at its
    /// documented longest, each character four bytes of UTF-8 and each number at its largest,
    /// makes metadata lease-service accepts.
    #[test]
    fn the_longest_beat_makes_metadata_lease_service_keeps() {
        let longest = |chars: usize| "𝄞".repeat(chars);
        let info = WorkerInfo {
            host: longest(MAX_WORKER_LABEL_CHARS),
            version: longest(MAX_WORKER_LABEL_CHARS),
            queue: Some(longest(MAX_QUEUE_CHARS)),
            concurrency: u32::MAX,
            busy: u32::MAX,
            done: u64::MAX,
        };
        check_info(&info).unwrap();
        let id = longest(MAX_NAME_CHARS - RESOURCE_PREFIX.len());
        check_id(&id).unwrap();
        let metadata = serde_json::to_value(&Registered { id, info }).unwrap();
        let bytes = serde_json::to_string(&metadata).unwrap().len();
        assert!(
            bytes <= MAX_LEASE_METADATA_BYTES,
            "{bytes} bytes of metadata; lease-service keeps {MAX_LEASE_METADATA_BYTES}"
        );
    }
}
