//! The running stack: PostgreSQL, the replicas behind their proxies, the generators and the
//! workers (the last of them in exec mode, a shell command per task), started with the front
//! door locked; and which of them a fault may take.

use std::sync::{Arc, Mutex as StdMutex};

use leasehold_local::postgres::PrivatePostgres;
use tokio::sync::{Mutex, OwnedMutexGuard, RwLock};

use super::failover::Backing;
use super::{Fault, SoakOptions, TTL_SECONDS, tokens};
use crate::Service;
use crate::proxy::Proxy;

/// The sleep handler's work as a shell command, for the soak's exec worker: fails for good
/// (exit 65) at once on `"fail": "permanent"`, sleeps, then fails retryably half the time on
/// `"fail": 0.5`, as [`leasehold_worker::SleepHandler`] does.
const EXEC_SLEEP: &str = r#"input=$(cat)
case "$input" in *'"fail":"permanent"'*) echo "failing for good, as asked" >&2; exit 65 ;; esac
seconds=$(printf "%s" "$input" | sed -n 's/.*"sleep_duration_seconds":\([0-9.eE+-]*\).*/\1/p')
sleep "${seconds:-0}"
case "$input" in *'"fail":0.5'*)
  [ $(( $(od -An -N1 -tu1 /dev/urandom) % 2 )) -eq 0 ] && { echo "failing, as asked" >&2; exit 1; } ;;
esac
echo "{\"slept_seconds\": ${seconds:-0}, \"by\": \"sh\"}""#;

type Shared = Arc<Mutex<Service>>;

/// The running stack and what faults act on.
pub(super) struct Stack {
    /// `None` on a formation, whose faults are the failover soak's own.
    pub(super) postgres: Arc<StdMutex<Option<PrivatePostgres>>>,
    /// Held for writing while PostgreSQL restarts, for reading while a service starts: a
    /// service that starts while the database is down fails its migrations and exits, which is
    /// right for it but not a fault the soak means to inject.
    pub(super) restart_gate: Arc<RwLock<()>>,
    pub(super) lease_db: String,
    pub(super) task_db: String,
    pub(super) lease_replicas: Vec<Shared>,
    pub(super) task_replicas: Vec<Shared>,
    generators: Vec<Shared>,
    workers: Vec<Shared>,
    pub(super) lease_proxy: Proxy,
    pub(super) task_proxy: Proxy,
}

fn secs(seconds: f64) -> String {
    format!("{seconds}")
}

impl Stack {
    /// Starts the stack on `formation`'s databases, or on a private server of its own.
    pub(super) async fn start(options: &SoakOptions, formation: Option<&Backing>) -> Stack {
        let (postgres, lease_db, task_db) = match formation {
            Some(backing) => (None, backing.lease_db.clone(), backing.task_db.clone()),
            None => {
                // Crash-safe commits: the soak crashes PostgreSQL and then counts what survived.
                let postgres =
                    tokio::task::spawn_blocking(PrivatePostgres::start_ephemeral_crash_safe)
                        .await
                        .unwrap()
                        .unwrap_or_else(|err| panic!("cannot start the soak's PostgreSQL: {err}"));
                postgres.create_database("leases").await.unwrap();
                postgres.create_database("tasks").await.unwrap();
                let (lease_db, task_db) = (postgres.url("leases"), postgres.url("tasks"));
                (Some(postgres), lease_db, task_db)
            }
        };
        let ttl = secs(TTL_SECONDS);

        let lease_tokens = format!(
            "leaseholder:{},leaseholder:{}",
            tokens::SERVICE,
            tokens::GENERATOR
        );
        let mut lease_env = vec![
            ("AUTH_TOKENS", lease_tokens.as_str()),
            ("LEASE_REQUIRE_SECRET", "true"),
            ("LEASE_SWEEP_INTERVAL_SECONDS", "5"),
            ("LEASE_RETENTION_SECONDS", "604800"),
            ("SHUTDOWN_GRACE_SECONDS", "2"),
        ];
        if options.break_acquire {
            lease_env.push(("LEASEHOLD_TEST_BREAK_ACQUIRE", "true"));
        }
        let mut lease_replicas = Vec::new();
        for _ in 0..2 {
            let replica = Service::lease_service(&lease_db, &lease_env).await;
            lease_replicas.push(replica);
        }
        let lease_proxy = Proxy::start(lease_replicas.iter().map(|s| s.port).collect()).await;

        let task_tokens = format!(
            "producer:{},worker:{},operator:{},producer:{}",
            tokens::PRODUCER,
            tokens::WORKER,
            tokens::OPERATOR,
            tokens::GENERATOR
        );
        let task_env = [
            ("AUTH_TOKENS", task_tokens.as_str()),
            ("LEASE_SERVICE_TOKEN", tokens::SERVICE),
            ("TASK_LEASE_TTL_SECONDS", ttl.as_str()),
            ("LEASE_CALL_TIMEOUT_MS", "1000"),
            ("TASK_SWEEP_INTERVAL_SECONDS", "5"),
            ("TASK_RETENTION_SECONDS", "604800"),
            ("TASK_RETRY_BASE_SECONDS", "0.2"),
            ("TASK_RETRY_MAX_SECONDS", "2"),
            ("SHUTDOWN_GRACE_SECONDS", "2"),
        ];
        let mut task_replicas = Vec::new();
        for _ in 0..2 {
            let replica = Service::task_service(&task_db, &lease_proxy.base_url(), &task_env).await;
            task_replicas.push(replica);
        }
        let task_proxy = Proxy::start(task_replicas.iter().map(|s| s.port).collect()).await;

        let worker_env = [
            ("AUTH_TOKEN", tokens::WORKER),
            ("HEARTBEAT_INTERVAL_SECONDS", "0.5"),
            ("POLL_MAX_MS", "200"),
            ("WORKER_CONCURRENCY", "3"),
            ("SHUTDOWN_GRACE_SECONDS", "3"),
        ];
        let exec_line = format!("sh -c '{}'", EXEC_SLEEP.replace('\'', r"'\''"));
        let mut workers = Vec::new();
        for n in 0..options.workers {
            // Every second worker claims ahead under load (its tasks wait for a slot, heartbeaten,
            // and go back unstarted when it stops), so the faults meet both kinds.
            let mut env = worker_env.to_vec();
            if n % 2 == 1 {
                env.push(("WORKER_PREFETCH", "3"));
            }
            // The last one does the work in another language: a shell command per task.
            if n + 1 == options.workers && n > 0 {
                env.push(("WORKER_EXEC", &exec_line));
            }
            workers.push(Service::worker(&task_proxy.base_url(), &env).await);
        }
        let generator_env = [
            ("AUTH_TOKEN", tokens::GENERATOR),
            ("GENERATOR_LEASE_TTL_SECONDS", ttl.as_str()),
            ("GENERATOR_RETRY_INTERVAL_SECONDS", "0.5"),
            ("GENERATOR_SETTINGS_POLL_MS", "200"),
        ];
        let mut generators = Vec::new();
        for i in 0..options.generators {
            generators.push(
                Service::generator(
                    &task_proxy.base_url(),
                    &lease_proxy.base_url(),
                    &format!("soak-generator-{i}"),
                    &generator_env,
                )
                .await,
            );
        }
        let shared = |list: Vec<Service>| -> Vec<Shared> {
            list.into_iter().map(|s| Arc::new(Mutex::new(s))).collect()
        };
        Stack {
            postgres: Arc::new(StdMutex::new(postgres)),
            restart_gate: Arc::new(RwLock::new(())),
            lease_db,
            task_db,
            lease_replicas: shared(lease_replicas),
            task_replicas: shared(task_replicas),
            generators: shared(generators),
            workers: shared(workers),
            lease_proxy,
            task_proxy,
        }
    }

    /// The group of processes a fault acts on, if it acts on one.
    fn targets(&self, fault: Fault) -> &[Shared] {
        match fault {
            Fault::WorkerKill | Fault::WorkerPause | Fault::WorkerTerminate => &self.workers,
            Fault::GeneratorKill | Fault::GeneratorPause => &self.generators,
            Fault::LeaseReplicaKill
            | Fault::LeaseReplicaPause
            | Fault::LeaseServiceRestart
            | Fault::LeaseServicePauseBeyondTtl => &self.lease_replicas,
            Fault::TaskReplicaKill | Fault::TaskReplicaPause | Fault::TaskServiceRestart => {
                &self.task_replicas
            }
            Fault::PostgresFastRestart
            | Fault::PostgresImmediateRestart
            | Fault::Failover
            | Fault::PrimaryKill
            | Fault::PrimaryFreeze => &[],
        }
    }

    /// Locks what `fault` needs without waiting: one idle process of its group (chosen by
    /// `pick`), or the whole group for the lease-service-wide pause. `None` if it is busy.
    pub(super) fn claim(&self, fault: Fault, pick: usize) -> Option<Vec<OwnedMutexGuard<Service>>> {
        let group = self.targets(fault);
        if fault == Fault::LeaseServicePauseBeyondTtl {
            return group
                .iter()
                .map(|s| Arc::clone(s).try_lock_owned().ok())
                .collect();
        }
        if group.is_empty() {
            return Some(Vec::new());
        }
        (0..group.len())
            .map(|i| &group[(pick + i) % group.len()])
            .find_map(|s| Arc::clone(s).try_lock_owned().ok())
            .map(|guard| vec![guard])
    }
}
