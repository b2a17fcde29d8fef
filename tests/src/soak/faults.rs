//! The faults: their kinds and weights, drawing the schedule, and injecting one fault into the
//! processes (or PostgreSQL) it acts on.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use leasehold_local::postgres::{PrivatePostgres, ShutdownMode};
use rand::Rng;
use rand::rngs::StdRng;
use tokio::sync::{OwnedMutexGuard, RwLock};

use super::TTL_SECONDS;
use crate::Service;

/// The kinds of fault the schedule draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// kill -9 of a worker, started again after a moment.
    WorkerKill,
    /// SIGSTOP of a worker for up to twice the TTL, then SIGCONT.
    WorkerPause,
    /// SIGTERM of a worker (it hands its tasks back), started again.
    WorkerTerminate,
    GeneratorKill,
    GeneratorPause,
    /// kill -9 of one lease-service replica, started again after a moment.
    LeaseReplicaKill,
    LeaseReplicaPause,
    /// SIGTERM of one lease-service replica and a start: a rolling restart.
    LeaseServiceRestart,
    TaskReplicaKill,
    TaskReplicaPause,
    TaskServiceRestart,
    /// Every lease-service replica paused for longer than the TTL: every lease lapses unseen.
    LeaseServicePauseBeyondTtl,
    /// `pg_ctl restart -m fast`: connections dropped, transactions rolled back.
    PostgresFastRestart,
    /// `pg_ctl restart -m immediate`: a crash, then recovery.
    PostgresImmediateRestart,
    /// On a formation: `pg_autoctl perform failover`, the planned switch of primary.
    Failover,
    /// On a formation: kill -9 of the primary's pg_autoctl and PostgreSQL, started again later
    /// to rejoin as a secondary.
    PrimaryKill,
    /// On a formation: SIGSTOP of the primary's every process until the other node has been
    /// promoted and a while longer, then SIGCONT: it must step down and rejoin.
    PrimaryFreeze,
}

impl Fault {
    pub const ALL: [Fault; 14] = [
        Fault::WorkerKill,
        Fault::WorkerPause,
        Fault::WorkerTerminate,
        Fault::GeneratorKill,
        Fault::GeneratorPause,
        Fault::LeaseReplicaKill,
        Fault::LeaseReplicaPause,
        Fault::LeaseServiceRestart,
        Fault::TaskReplicaKill,
        Fault::TaskReplicaPause,
        Fault::TaskServiceRestart,
        Fault::LeaseServicePauseBeyondTtl,
        Fault::PostgresFastRestart,
        Fault::PostgresImmediateRestart,
    ];

    /// Relative frequency in the schedule.
    fn weight(self) -> u32 {
        match self {
            Self::WorkerKill | Self::WorkerPause => 10,
            Self::GeneratorKill | Self::GeneratorPause => 5,
            Self::LeaseReplicaKill
            | Self::LeaseReplicaPause
            | Self::TaskReplicaKill
            | Self::TaskReplicaPause => 4,
            Self::WorkerTerminate | Self::LeaseServiceRestart | Self::TaskServiceRestart => 2,
            Self::LeaseServicePauseBeyondTtl
            | Self::PostgresFastRestart
            | Self::PostgresImmediateRestart => 1,
            // Never drawn by the random schedule: the failover soak injects them itself.
            Self::Failover | Self::PrimaryKill | Self::PrimaryFreeze => 0,
        }
    }
}

/// One scheduled fault with everything random about it already drawn.
pub(super) struct Injection {
    pub(super) fault: Fault,
    pub(super) targets: Vec<OwnedMutexGuard<Service>>,
    /// How long the process stays down or paused.
    pub(super) hold: Duration,
}

pub(super) async fn inject(
    injection: Injection,
    postgres: Arc<StdMutex<Option<PrivatePostgres>>>,
    gate: Arc<RwLock<()>>,
) -> Result<(), String> {
    let Injection {
        fault,
        mut targets,
        hold,
    } = injection;
    match fault {
        Fault::WorkerPause
        | Fault::GeneratorPause
        | Fault::LeaseReplicaPause
        | Fault::TaskReplicaPause
        | Fault::LeaseServicePauseBeyondTtl => {
            for target in &targets {
                target.pause();
            }
            tokio::time::sleep(hold).await;
            for target in &targets {
                target.resume();
            }
        }
        Fault::WorkerKill
        | Fault::GeneratorKill
        | Fault::LeaseReplicaKill
        | Fault::TaskReplicaKill => {
            let target = &mut targets[0];
            target.kill();
            tokio::time::sleep(hold).await;
            start_again(target, &gate).await?;
        }
        Fault::WorkerTerminate | Fault::LeaseServiceRestart | Fault::TaskServiceRestart => {
            let target = &mut targets[0];
            let code = target.terminate(Duration::from_secs(20)).await;
            if code != Some(0) {
                return Err(format!(
                    "{} on port {} exited with {code:?} on SIGTERM",
                    target.name, target.port
                ));
            }
            tokio::time::sleep(hold).await;
            start_again(target, &gate).await?;
        }
        Fault::Failover | Fault::PrimaryKill | Fault::PrimaryFreeze => {
            return Err(format!("{fault:?} is injected by the failover soak only"));
        }
        Fault::PostgresFastRestart | Fault::PostgresImmediateRestart => {
            let mode = if fault == Fault::PostgresFastRestart {
                ShutdownMode::Fast
            } else {
                ShutdownMode::Immediate
            };
            let _exclusive = gate.write().await;
            tokio::task::spawn_blocking(move || {
                postgres
                    .lock()
                    .map_err(|_| "the PostgreSQL handle is poisoned".to_owned())?
                    .as_mut()
                    .ok_or_else(|| "no private PostgreSQL to restart".to_owned())?
                    .restart(mode)
                    .map_err(|err| format!("PostgreSQL did not restart ({mode:?}): {err}"))
            })
            .await
            .map_err(|err| err.to_string())??;
        }
    }
    Ok(())
}

/// Starts a stopped process again (not while PostgreSQL restarts); an error if it will not
/// come up.
async fn start_again(target: &mut Service, gate: &RwLock<()>) -> Result<(), String> {
    let _shared = gate.read().await;
    let name = format!("{} on port {}", target.name, target.port);
    // `start_again` panics with the log's tail when the process will not come up; keep that
    // message as the error.
    let outcome =
        futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(target.start_again()))
            .await;
    outcome.map_err(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default();
        format!("{name} did not come back: {message}")
    })
}

/// Picks a fault kind by weight.
pub(super) fn draw_fault(rng: &mut StdRng) -> Fault {
    let total: u32 = Fault::ALL.iter().map(|f| f.weight()).sum();
    let mut ticket = rng.random_range(0..total);
    for fault in Fault::ALL {
        if ticket < fault.weight() {
            return fault;
        }
        ticket -= fault.weight();
    }
    Fault::WorkerKill
}

/// How long a fault holds its target down or paused.
pub(super) fn draw_hold(fault: Fault, rng: &mut StdRng) -> Duration {
    let seconds = match fault {
        // Up to twice the TTL: some pauses end within the lease, some well after it.
        Fault::WorkerPause | Fault::GeneratorPause => rng.random_range(0.2..2.0 * TTL_SECONDS),
        Fault::LeaseReplicaPause | Fault::TaskReplicaPause => rng.random_range(0.2..TTL_SECONDS),
        Fault::LeaseServicePauseBeyondTtl => TTL_SECONDS + rng.random_range(0.5..1.5),
        Fault::PostgresFastRestart | Fault::PostgresImmediateRestart => 0.0,
        _ => rng.random_range(0.1..1.5),
    };
    Duration::from_secs_f64(seconds)
}
