//! The leases client and its guard against a real lease-service process, including the service
//! dying (kill -9) and pausing (SIGSTOP) under a held lease.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use leasehold::lease_client::{LeaseListing, LeaseSet};
use leasehold::{GuardConfig, LeaseClient, LeaseError, LeaseGuard, LeaseLost, with_lease};
use tests::{Service, eventually, execute, fresh_database};

fn config(resource: &str, holder: &str, ttl_seconds: u64) -> GuardConfig {
    GuardConfig::new(resource, holder).ttl(Duration::from_secs(ttl_seconds))
}

#[tokio::test]
async fn the_guard_keeps_its_lease_across_five_ttls_then_releases_it() {
    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[]).await;
    let client = LeaseClient::new(svc.base_url());
    let guard = LeaseGuard::acquire(&client, config("kept", "keeper", 2))
        .await
        .unwrap();
    let fence = guard.fence();
    let rival = svc.lease_client();

    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(11) {
        let tried = rival.acquire("kept", "rival", None).await;
        // Held is lease-service's 409 `lease_held`.
        assert!(
            matches!(&tried, Err(LeaseError::Held { holder, .. }) if holder == "keeper"),
            "after {:?}: {tried:?}",
            started.elapsed()
        );
        assert!(!guard.is_lost());
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert_eq!(guard.fence(), fence, "renewals keep the fence");
    assert!(guard.lease().renewed_at.is_some());

    let released = guard.release().await.unwrap();
    assert_eq!(released.status, leasehold::LeaseStatus::Released);
    let (_, new) = rival
        .acquire_proving("kept", "rival", None, None)
        .await
        .unwrap();
    assert!(new, "released means acquirable at once (201)");
}

#[tokio::test]
async fn the_guard_signals_loss_within_one_ttl_when_lease_service_dies() {
    let db = fresh_database().await;
    let mut svc = Service::lease_service(&db, &[]).await;
    let client = LeaseClient::new(svc.base_url());
    let ttl = Duration::from_secs(3);
    let guard = LeaseGuard::acquire(&client, config("doomed", "holder", 3))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!guard.is_lost());

    let killed = Instant::now();
    svc.kill();
    let why = tokio::time::timeout(ttl, guard.lost())
        .await
        .expect("loss must be signalled within one TTL of the last renewal");
    assert!(
        killed.elapsed() < ttl,
        "signalled after {:?}",
        killed.elapsed()
    );
    assert!(matches!(why, LeaseLost::Unconfirmed { .. }), "{why:?}");
    assert!(guard.is_lost());
}

#[tokio::test]
async fn a_pause_past_the_ttl_cancels_the_work_under_with_lease() {
    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[]).await;
    let client = LeaseClient::new(svc.base_url());
    let ticks = Arc::new(AtomicU64::new(0));
    let dropped = Arc::new(AtomicBool::new(false));

    struct SetOnDrop(Arc<AtomicBool>);
    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    let work_ticks = ticks.clone();
    let work_dropped = dropped.clone();
    let scoped = tokio::spawn(async move {
        with_lease(
            &client,
            config("scoped", "worker", 3),
            Duration::from_secs(5),
            |scope| async move {
                let _flag = SetOnDrop(work_dropped);
                assert!(scope.fence > 0);
                loop {
                    work_ticks.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        )
        .await
    });
    eventually(
        Duration::from_secs(30),
        "the work running while the lease is held",
        || {
            let ticks = ticks.load(Ordering::SeqCst);
            async move { ticks > 10 }
        },
    )
    .await;

    let paused = Instant::now();
    svc.pause();
    let result = tokio::time::timeout(Duration::from_secs(3), scoped)
        .await
        .expect("with_lease must give up within one TTL of the pause")
        .unwrap();
    let waited = paused.elapsed();
    svc.resume();
    assert!(matches!(result, Err(LeaseError::Lost { .. })), "{result:?}");
    assert!(
        dropped.load(Ordering::SeqCst),
        "the work's future was dropped"
    );
    assert!(waited < Duration::from_secs(3), "{waited:?}");
    let after = ticks.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        ticks.load(Ordering::SeqCst),
        after,
        "no work after the loss"
    );
}

#[tokio::test]
async fn a_refused_renewal_is_a_loss_at_once() {
    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[]).await;
    let client = LeaseClient::new(svc.base_url());
    let guard = LeaseGuard::acquire(
        &client,
        config("stolen", "holder", 30).renew_interval(Duration::from_millis(500)),
    )
    .await
    .unwrap();
    // Someone (an operator, a bug) hands the lease to another holder behind our back.
    execute(
        &db,
        "UPDATE leases SET holder = 'thief' WHERE resource = 'stolen'",
    )
    .await;
    let why = tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .unwrap();
    let LeaseLost::Refused { code, reason } = why else {
        panic!("not refused: {why:?}");
    };
    assert_eq!(
        (code.as_str(), reason.as_str()),
        ("not_holder", "cannot renew: the lease is held by \"thief\"")
    );
    let _ = svc; // keep the service up until here
}

#[tokio::test]
async fn acquire_with_timeout_waits_for_the_holder_to_expire_or_gives_up() {
    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[]).await;
    let client = LeaseClient::new(svc.base_url());
    let first = client
        .acquire("queue", "first", Some(Duration::from_secs(2)))
        .await
        .unwrap();

    let impatient = client
        .acquire_with_timeout("queue", "second", None, Duration::from_millis(500))
        .await;
    match impatient {
        Err(LeaseError::AcquireTimeout { last_holder, .. }) => {
            assert_eq!(last_holder.as_deref(), Some("first"));
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    let started = Instant::now();
    let patient = LeaseGuard::acquire_with_timeout(
        &client,
        config("queue", "second", 5),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    assert!(started.elapsed() < Duration::from_secs(4));
    assert!(patient.fence() > first.fence);
    patient.release().await.unwrap();
}

#[tokio::test]
async fn a_dropped_guard_releases_its_lease_and_errors_are_typed() {
    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[]).await;
    let client = LeaseClient::new(svc.base_url());
    let guard = LeaseGuard::acquire(&client, config("dropped", "h", 30))
        .await
        .unwrap();
    match LeaseGuard::acquire(&client, config("dropped", "other", 30)).await {
        Err(LeaseError::Held {
            holder, expires_in, ..
        }) => {
            assert_eq!(holder, "h");
            assert!(expires_in.is_some_and(|left| left > Duration::from_secs(25)));
        }
        other => panic!("expected Held, got {other:?}"),
    }
    drop(guard);
    let mut released = false;
    let listing = LeaseListing {
        set: LeaseSet::Released,
        ..LeaseListing::default()
    };
    for _ in 0..50 {
        if client
            .list(&listing)
            .await
            .is_ok_and(|page| page.leases.len() == 1)
        {
            released = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        released,
        "a dropped guard releases its lease in the background"
    );

    match client.renew("dropped", "h", Default::default(), None).await {
        Err(LeaseError::Lost { code, .. }) => assert_eq!(code.as_str(), "lease_released"),
        other => panic!("expected Lost, got {other:?}"),
    }
    match client.acquire("", "h", None).await {
        Err(LeaseError::Rejected { status, code, .. }) => {
            assert_eq!((status, code.as_str()), (400, "invalid_field"))
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
    let nowhere = LeaseClient::new(format!("http://127.0.0.1:{}", tests::free_port()));
    match nowhere.acquire("r", "h", None).await {
        Err(LeaseError::Unavailable(_)) => {}
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(matches!(
        LeaseGuard::acquire(
            &client,
            config("r", "h", 3).renew_interval(Duration::from_secs(3))
        )
        .await,
        Err(LeaseError::InvalidConfig(_))
    ));
}

#[tokio::test]
async fn renewal_errors_are_not_a_loss_while_there_is_time_left() {
    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[]).await;
    let client = LeaseClient::new(svc.base_url())
        .with_timeout(Duration::from_millis(300))
        .with_retry(leasehold::RetryPolicy::none());
    let guard = LeaseGuard::acquire(
        &client,
        config("patient", "holder", 6).renew_interval(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let fence = guard.fence();
    // A pause shorter than the TTL: renewals time out, but the lease is never in doubt.
    svc.pause();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    svc.resume();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!guard.is_lost(), "{:?}", guard.loss_reason());
    assert_eq!(guard.fence(), fence);
    let current = svc
        .lease_client()
        .current("patient")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(current.holder, "holder");
    assert!(
        current.expires_in_ms > 3000,
        "renewed again after the pause"
    );
}

#[tokio::test]
async fn transient_failures_are_retried_and_refusals_are_not() {
    let db = fresh_database().await;
    let mut svc = Service::lease_service(&db, &[]).await;
    let patient = LeaseClient::new(svc.base_url()).with_retry(leasehold::RetryPolicy {
        max_attempts: 40,
        backoff: leasehold::Backoff::new(Duration::from_millis(50), Duration::from_millis(250)),
    });

    // The service is down when the call starts and comes back a moment later.
    svc.kill();
    let call = tokio::spawn({
        let patient = patient.clone();
        async move { patient.acquire("retried", "h", None).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    svc.restart().await;
    let lease = call.await.unwrap().unwrap();
    assert_eq!(lease.holder, "h");

    // A conflict is an answer: asked once, never again.
    let refused = patient.acquire("retried", "other", None).await;
    assert!(
        matches!(refused, Err(LeaseError::Held { .. })),
        "{refused:?}"
    );
    let metrics = svc.metrics().await;
    assert!(
        metrics.contains(r#"lease_conflicts_total{code="lease_held",operation="acquire"} 1"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_periodic_singleton_ticks_on_one_replica_and_hands_over_on_shutdown() {
    use std::sync::Mutex;
    use tokio_util::sync::CancellationToken;

    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[]).await;
    let ticks: Arc<Mutex<Vec<(String, i64, Instant)>>> = Arc::default();
    let replica = |name: &'static str, stop: CancellationToken| {
        let client = LeaseClient::new(svc.base_url());
        let ticks = ticks.clone();
        tokio::spawn(async move {
            leasehold::Singleton::new(
                client,
                config("nightly-report", name, 2),
                Duration::from_millis(300),
            )
            .run_periodic(stop, Duration::from_millis(100), move |lease| {
                let ticks = ticks.clone();
                async move {
                    ticks
                        .lock()
                        .unwrap()
                        .push((name.to_owned(), lease.fence(), Instant::now()));
                }
            })
            .await
        })
    };
    let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
    let ticked = |name: &'static str, at_least: usize| {
        let ticks = ticks.clone();
        move || {
            let n = ticks.lock().unwrap().iter().filter(|t| t.0 == name).count();
            async move { n >= at_least }
        }
    };
    let a = replica("a", stop_a.clone());
    // a leads before b starts.
    eventually(Duration::from_secs(30), "a leading", ticked("a", 1)).await;
    let b = replica("b", stop_b.clone());
    eventually(
        Duration::from_secs(30),
        "a ticking 15 times",
        ticked("a", 15),
    )
    .await;
    {
        let ticks = ticks.lock().unwrap();
        assert!(ticks.len() >= 15, "{}", ticks.len());
        assert!(
            ticks.iter().all(|(name, _, _)| name == "a"),
            "only the leader ticks"
        );
    }
    let stopped = Instant::now();
    stop_a.cancel();
    a.await.unwrap().unwrap();
    eventually(Duration::from_secs(30), "b taking over", ticked("b", 1)).await;
    stop_b.cancel();
    b.await.unwrap().unwrap();
    let ticks = ticks.lock().unwrap();
    let first_b = ticks
        .iter()
        .find(|(name, _, _)| name == "b")
        .expect("b took over");
    // A released lease is taken at b's next retry (300 ms); one left to expire would wait out
    // the 2 s TTL. The bound sits between the two, with room for a slow machine.
    assert!(
        first_b.2.duration_since(stopped) < Duration::from_millis(1500),
        "hand-over at the next retry, not at expiry"
    );
    let last_a = ticks
        .iter()
        .filter(|(name, _, _)| name == "a")
        .map(|t| t.2)
        .max()
        .unwrap();
    assert!(last_a <= stopped, "a never ticked after it stopped");
    let fence_a = ticks.iter().find(|(name, _, _)| name == "a").unwrap().1;
    assert!(first_b.1 > fence_a);
}

/// A lease an operator revokes is lost to its guard at its next renewal, with the reason, and
/// the guard's release reports the loss rather than a release it never made.
#[tokio::test]
async fn a_revoked_lease_is_lost_to_its_guard_and_not_released_by_it() {
    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[]).await;
    let client = LeaseClient::new(svc.base_url());
    let guard = LeaseGuard::acquire(&client, config("evicted", "h", 3))
        .await
        .unwrap();
    let revoked = svc.lease_client().revoke(guard.lease().id).await;
    assert!(revoked.is_ok(), "{revoked:?}");
    // A renewal is due within a second; ten is a bound for a slow machine, not a wait.
    let why = tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the guard noticed the revoke");
    assert!(
        matches!(&why, LeaseLost::Refused { code, .. } if code.as_str() == "lease_revoked"),
        "{why:?}"
    );
    match guard.release().await {
        Err(LeaseError::Lost { code, .. }) => assert_eq!(code.as_str(), "lease_revoked"),
        other => panic!("expected Lost, got {other:?}"),
    }
}
