//! lease-service's HTTP API against a real PostgreSQL, with the service as a real process.
//! Most tests here pin the wire (each route's status, `code` and body) and send raw requests;
//! those about what the leases do (one winner, rising fences) speak through the typed
//! [`leasehold::LeaseClient`], as every other caller does.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::time::Duration;

use leasehold::LeaseError;
use leasehold::api::Proof;
use serde_json::{Value, json};
use tests::{Answer, Service, eventually, execute, fresh_database, metric_sum, snapshot, verdicts};

fn lease(resource: &str, holder: &str) -> Value {
    json!({ "resource": resource, "holder": holder })
}

#[tokio::test]
async fn every_route_answers_with_its_success_and_error_codes() {
    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[]).await;

    // Acquire: 201 new, 200 reentrant (same fence), 409 for another holder with who and until when.
    let first = svc.post("/api/leases", &lease("printer", "alice")).await;
    assert_eq!(first.status, 201, "{:?}", first.body);
    assert_eq!(first.body["holder"], "alice");
    assert_eq!(first.body["status"], "active");
    assert_eq!(first.body["ttlSeconds"], 30);
    let fence = first.body["fence"].as_i64().unwrap();
    let id = first.body["id"].as_i64().unwrap();
    let again = svc.post("/api/leases", &lease("printer", "alice")).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.body["fence"].as_i64(), Some(fence));
    assert!(again.body["renewedAt"].is_string());
    let other = svc.post("/api/leases", &lease("printer", "bob")).await;
    assert_eq!(other.status, 409);
    assert_eq!(other.code(), "lease_held");
    assert_eq!(other.body["holder"], "alice");
    assert!(other.body["expiresAt"].is_string());
    assert!(other.body["error"].is_string());

    // Renew: 200 by the holder; 409 by another; 404 for an unknown resource.
    let renewed = svc
        .put("/api/leases/renew", &lease("printer", "alice"))
        .await;
    assert_eq!(renewed.status, 200);
    assert_eq!(renewed.body["fence"].as_i64(), Some(fence));
    let renewed_fenced = svc
        .put(
            "/api/leases/renew",
            &json!({"resource": "printer", "holder": "alice", "fence": fence, "ttl_seconds": 60}),
        )
        .await;
    assert_eq!(renewed_fenced.status, 200);
    assert_eq!(renewed_fenced.body["ttlSeconds"], 60);
    let by_other = svc.put("/api/leases/renew", &lease("printer", "bob")).await;
    assert_eq!((by_other.status, by_other.code()), (409, "not_holder"));
    let unknown = svc
        .put("/api/leases/renew", &lease("nothing", "alice"))
        .await;
    assert_eq!((unknown.status, unknown.code()), (404, "lease_not_found"));

    // Reads.
    let by_id = svc.get(&format!("/api/leases/{id}")).await;
    assert_eq!(by_id.status, 200);
    assert_eq!(by_id.body["lease"]["resource"], "printer");
    assert_eq!(
        svc.get("/api/leases/987654").await.code(),
        "lease_not_found"
    );
    assert_eq!(svc.get("/api/leases/987654").await.status, 404);
    assert_eq!(svc.get("/api/leases/not-a-number").await.status, 400);
    let all = svc.get("/api/leases").await;
    assert_eq!(all.status, 200);
    assert_eq!(all.body["leases"].as_array().unwrap().len(), 1);
    assert_eq!(
        svc.get("/api/leases/active").await.body["leases"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        svc.get("/api/leases/renewed").await.body["leases"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        svc.get("/api/leases/released").await.body["leases"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
    assert_eq!(
        svc.get("/api/leases/expired").await.body["leases"]
            .as_array()
            .unwrap()
            .len(),
        0
    );

    // Release: 409 by another holder, 200 by the holder, 200 again when retried.
    let wrong = svc
        .delete("/api/leases/release", &lease("printer", "bob"))
        .await;
    assert_eq!((wrong.status, wrong.code()), (409, "not_holder"));
    let released = svc
        .delete("/api/leases/release", &lease("printer", "alice"))
        .await;
    assert_eq!(released.status, 200);
    assert_eq!(released.body["status"], "released");
    let retried = svc
        .delete("/api/leases/release", &lease("printer", "alice"))
        .await;
    assert_eq!(retried.status, 200);
    assert_eq!(
        svc.get("/api/leases/released").await.body["leases"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        svc.get("/api/leases/active").await.body["leases"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
    let renew_released = svc
        .put("/api/leases/renew", &lease("printer", "alice"))
        .await;
    assert_eq!(
        (renew_released.status, renew_released.code()),
        (409, "lease_released")
    );

    // Release by id: 200; a wrong id for the resource is 404; an unknown resource is 404.
    let taken = svc.post("/api/leases", &lease("scanner", "carol")).await;
    let scanner_id = taken.body["id"].as_i64().unwrap();
    let wrong_id = svc
        .delete(&format!("/api/leases/{id}"), &lease("scanner", "carol"))
        .await;
    assert_eq!((wrong_id.status, wrong_id.code()), (404, "lease_not_found"));
    let gone = svc
        .delete(
            &format!("/api/leases/{scanner_id}"),
            &lease("nothing", "carol"),
        )
        .await;
    assert_eq!(gone.status, 404);
    let by_id = svc
        .delete(
            &format!("/api/leases/{scanner_id}"),
            &lease("scanner", "carol"),
        )
        .await;
    assert_eq!(by_id.status, 200);
    assert_eq!(by_id.body["status"], "released");

    // Operations.
    assert_eq!(svc.get("/healthz").await.status, 200);
    assert_eq!(svc.get("/readyz").await.status, 200);
    let metrics = svc.metrics().await;
    for name in [
        "http_requests_total",
        "http_request_duration_seconds_bucket",
        "lease_acquisitions_total",
        "lease_renewals_total",
        "lease_releases_total",
        "lease_conflicts_total",
    ] {
        assert!(metrics.contains(name), "metrics lack {name}:\n{metrics}");
    }
    assert!(metrics.contains(r#"lease_acquisitions_total{kind="reentrant"} 1"#));
    assert!(
        metrics.contains(r#"route="/api/leases/{id}""#),
        "routes are patterns, not paths"
    );
}

#[tokio::test]
async fn of_64_concurrent_acquirers_exactly_one_wins() {
    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[("DATABASE_POOL_SIZE", "32")]).await;
    let client = svc.lease_client();
    let attempts = (0..64).map(|i| {
        let client = &client;
        async move {
            client
                .acquire_proving("contended", &format!("worker-{i}"), None, None)
                .await
        }
    });
    let answers = futures_util::future::join_all(attempts).await;
    // A new lease is a 201; Held is a 409 `lease_held`, and names the current holder.
    let created: Vec<_> = answers
        .iter()
        .filter_map(|a| match a {
            Ok((lease, true)) => Some(lease),
            _ => None,
        })
        .collect();
    let told: Vec<&str> = answers
        .iter()
        .filter_map(|a| match a {
            Err(LeaseError::Held { holder, .. }) => Some(holder.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(created.len(), 1, "{answers:?}");
    assert_eq!(told.len(), 63, "{answers:?}");
    let winner = created[0].holder.as_str();
    assert!(
        told.iter().all(|holder| *holder == winner),
        "every loser is told the one winner: {told:?}"
    );
    let rows = snapshot(&db, "leases").await;
    assert_eq!(rows.len(), 1);
}

#[tokio::test]
async fn fence_strictly_increases_across_expiry_and_release_cycles() {
    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[]).await;
    let client = svc.lease_client();
    let mut fences = Vec::new();
    // 20 release / re-acquire cycles, alternating holders and sometimes the same holder.
    for cycle in 0..20 {
        let holder = if cycle % 3 == 0 { "a" } else { "b" };
        let (got, new) = client
            .acquire_proving("fenced", holder, None, None)
            .await
            .unwrap();
        assert!(new, "cycle {cycle}: a new lease (201): {got:?}");
        fences.push(got.fence);
        client
            .release("fenced", holder, Proof::default())
            .await
            .unwrap();
    }
    // 20 expire / re-acquire cycles with the shortest TTL.
    for cycle in 0..20 {
        let holder = if cycle % 2 == 0 { "c" } else { "d" };
        let ttl = Some(Duration::from_secs(1));
        let (got, new) = client
            .acquire_proving("fenced", holder, ttl, None)
            .await
            .unwrap();
        assert!(new, "cycle {cycle}: a new lease (201): {got:?}");
        fences.push(got.fence);
        let held = client.acquire("fenced", "intruder", None).await;
        assert!(matches!(held, Err(LeaseError::Held { .. })), "{held:?}");
        tokio::time::sleep(Duration::from_millis(1050)).await;
    }
    assert_eq!(fences.len(), 40);
    for pair in fences.windows(2) {
        assert!(pair[1] > pair[0], "fences must rise: {fences:?}");
    }
}

#[tokio::test]
async fn refused_renewals_and_releases_change_nothing() {
    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[]).await;
    let got = svc
        .post(
            "/api/leases",
            &json!({"resource": "r", "holder": "owner", "ttl_seconds": 1}),
        )
        .await;
    let fence = got.body["fence"].as_i64().unwrap();
    let before = snapshot(&db, "leases").await;

    let cases = [
        (
            "PUT",
            "/api/leases/renew",
            json!({"resource": "r", "holder": "thief"}),
            "not_holder",
        ),
        (
            "DELETE",
            "/api/leases/release",
            json!({"resource": "r", "holder": "thief"}),
            "not_holder",
        ),
        (
            "PUT",
            "/api/leases/renew",
            json!({"resource": "r", "holder": "owner", "fence": fence - 1}),
            "stale_fence",
        ),
        (
            "DELETE",
            "/api/leases/release",
            json!({"resource": "r", "holder": "owner", "fence": fence + 1}),
            "stale_fence",
        ),
    ];
    for (method, path, body, code) in &cases {
        let answer = match *method {
            "PUT" => svc.put(path, body).await,
            _ => svc.delete(path, body).await,
        };
        assert_eq!(
            (answer.status, answer.code()),
            (409, *code),
            "{method} {path} {body}"
        );
        assert!(answer.body["error"].as_str().is_some_and(|e| !e.is_empty()));
    }
    assert_eq!(
        snapshot(&db, "leases").await,
        before,
        "refusals wrote nothing"
    );

    // After expiry the holder can neither renew nor release, and the lease stays expired.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let expired = snapshot(&db, "leases").await;
    let renew = svc.put("/api/leases/renew", &lease("r", "owner")).await;
    assert_eq!((renew.status, renew.code()), (409, "lease_expired"));
    let release = svc
        .delete("/api/leases/release", &lease("r", "owner"))
        .await;
    assert_eq!((release.status, release.code()), (409, "lease_expired"));
    assert_eq!(snapshot(&db, "leases").await, expired);
    let listed = svc.get("/api/leases/expired").await;
    assert_eq!(listed.body["leases"].as_array().unwrap().len(), 1);
    assert_eq!(listed.body["leases"][0]["status"], "expired");

    // And anyone may take it now, with a higher fence.
    let taken = svc.post("/api/leases", &lease("r", "next")).await;
    assert_eq!(taken.status, 201);
    assert!(taken.body["fence"].as_i64().unwrap() > fence);
}

#[tokio::test]
async fn a_released_lease_is_acquirable_at_once_and_a_retried_release_never_touches_a_newer_lease()
{
    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[]).await;
    let first = svc.post("/api/leases", &lease("job", "a")).await;
    let first_fence = first.body["fence"].as_i64().unwrap();
    let release = json!({"resource": "job", "holder": "a", "fence": first_fence});
    assert_eq!(
        svc.delete("/api/leases/release", &release).await.status,
        200
    );
    // Retried (its first answer lost): succeeds again, same lease.
    let retried = svc.delete("/api/leases/release", &release).await;
    assert_eq!(retried.status, 200);
    assert_eq!(retried.body["fence"].as_i64(), Some(first_fence));

    // Acquirable at once by anyone.
    let second = svc.post("/api/leases", &lease("job", "b")).await;
    assert_eq!(second.status, 201);
    let before = snapshot(&db, "leases").await;
    // A late retry of a's release does not release b's lease.
    let late = svc.delete("/api/leases/release", &release).await;
    assert_eq!((late.status, late.code()), (409, "not_holder"));
    assert_eq!(snapshot(&db, "leases").await, before);
    assert_eq!(
        svc.get("/api/leases/active").await.body["leases"][0]["holder"],
        "b"
    );

    // Nor a newer lease of the same holder: the stale fence protects it.
    assert_eq!(
        svc.delete("/api/leases/release", &lease("job", "b"))
            .await
            .status,
        200
    );
    let third = svc.post("/api/leases", &lease("job", "a")).await;
    assert_eq!(third.status, 201);
    let before = snapshot(&db, "leases").await;
    let late = svc.delete("/api/leases/release", &release).await;
    assert_eq!((late.status, late.code()), (409, "stale_fence"));
    assert_eq!(snapshot(&db, "leases").await, before);
}

#[tokio::test]
async fn ttl_is_per_request_within_configurable_bounds() {
    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[]).await;
    for (ttl, status) in [(0, 400), (-5, 400), (3601, 400), (1, 201), (3600, 201)] {
        let body = json!({"resource": format!("ttl-{ttl}"), "holder": "h", "ttl_seconds": ttl});
        let answer = svc.post("/api/leases", &body).await;
        assert_eq!(answer.status, status, "ttl {ttl}: {:?}", answer.body);
        if status == 400 {
            assert_eq!(answer.code(), "invalid_ttl");
            assert_eq!(answer.body["field"], "ttl_seconds");
        } else {
            assert_eq!(answer.body["ttlSeconds"], ttl);
            let left = answer.body["expiresInMs"].as_i64().unwrap();
            assert!(left > (ttl - 1) * 1000 && left <= ttl * 1000, "{left}");
        }
    }
    let renew = json!({"resource": "ttl-1", "holder": "h", "ttl_seconds": 4000});
    assert_eq!(
        svc.put("/api/leases/renew", &renew).await.code(),
        "invalid_ttl"
    );

    let narrow = Service::lease_service(
        &db,
        &[
            ("LEASE_MIN_TTL_SECONDS", "5"),
            ("LEASE_MAX_TTL_SECONDS", "60"),
            ("LEASE_DEFAULT_TTL_SECONDS", "10"),
        ],
    )
    .await;
    let default = narrow.post("/api/leases", &lease("narrow", "h")).await;
    assert_eq!(default.body["ttlSeconds"], 10);
    for ttl in [4, 61] {
        let body = json!({"resource": "narrow-x", "holder": "h", "ttl_seconds": ttl});
        assert_eq!(narrow.post("/api/leases", &body).await.status, 400);
    }
}

#[tokio::test]
async fn listings_paginate_in_a_stable_order() {
    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[]).await;
    for i in 0..25 {
        let answer = svc
            .post("/api/leases", &lease(&format!("page-{i:02}"), "h"))
            .await;
        assert_eq!(answer.status, 201);
    }
    let mut seen = Vec::new();
    let mut path = "/api/leases?limit=10".to_owned();
    let mut pages = 0;
    loop {
        let page = svc.get(&path).await;
        assert_eq!(page.status, 200);
        pages += 1;
        for item in page.body["leases"].as_array().unwrap() {
            seen.push(item["id"].as_i64().unwrap());
        }
        match page.headers.get("x-next-cursor") {
            Some(cursor) => {
                let link = page.headers.get("link").unwrap().to_str().unwrap();
                assert!(link.contains("rel=\"next\""));
                path = format!("/api/leases?limit=10&cursor={}", cursor.to_str().unwrap());
            }
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(seen.len(), 25);
    let mut sorted = seen.clone();
    sorted.sort_unstable();
    assert_eq!(seen, sorted, "pages come in id order");
    assert_eq!(
        seen.iter().collect::<HashSet<_>>().len(),
        25,
        "no lease twice"
    );

    let prefixed = svc.get("/api/leases/active?resource_prefix=page-1").await;
    assert_eq!(prefixed.body["leases"].as_array().unwrap().len(), 10);

    for bad in [
        "limit=0",
        "limit=-1",
        "limit=abc",
        "cursor=xyz",
        "cursor=-4",
    ] {
        let answer = svc.get(&format!("/api/leases?{bad}")).await;
        assert_eq!(answer.status, 400, "{bad}");
        assert!(!answer.code().is_empty());
    }

    // The page size is capped at 1000 whatever is asked.
    execute(
        &db,
        "INSERT INTO leases (resource, holder, fence, ttl_seconds, expires_at) \
         SELECT 'bulk-' || g, 'h', nextval('leases_fence_seq'), 30, now() + interval '30 seconds' \
         FROM generate_series(1, 1100) g",
    )
    .await;
    let capped = svc.get("/api/leases?limit=5000").await;
    assert_eq!(capped.body["leases"].as_array().unwrap().len(), 1000);
    assert!(capped.headers.contains_key("x-next-cursor"));
}

#[tokio::test]
async fn the_retention_sweeper_deletes_only_old_ended_leases_on_one_replica() {
    let db = fresh_database().await;
    let env = [
        ("LEASE_RETENTION_SECONDS", "60"),
        ("LEASE_SWEEP_INTERVAL_SECONDS", "1"),
    ];
    let one = Service::lease_service(&db, &env).await;
    let two = Service::lease_service(&db, &env).await;
    for resource in [
        "old-released",
        "old-expired",
        "new-released",
        "new-expired",
        "active",
        "old-but-renewed",
    ] {
        assert_eq!(
            one.post("/api/leases", &lease(resource, "h")).await.status,
            201
        );
    }
    for resource in ["old-released", "new-released"] {
        assert_eq!(
            one.delete("/api/leases/release", &lease(resource, "h"))
                .await
                .status,
            200
        );
    }
    // Age the rows by rewriting their times: ended two minutes ago, or just now.
    execute(&db, "UPDATE leases SET released_at = now() - interval '2 minutes' WHERE resource = 'old-released'").await;
    execute(&db, "UPDATE leases SET expires_at = now() - interval '2 minutes' WHERE resource = 'old-expired'").await;
    execute(
        &db,
        "UPDATE leases SET expires_at = now() - interval '1 second' WHERE resource = 'new-expired'",
    )
    .await;
    execute(&db, "UPDATE leases SET created_at = now() - interval '1 day' WHERE resource = 'old-but-renewed'").await;

    // Only one replica swept; the other stood by.
    let swept = |text: &str| {
        text.lines()
            .find(|l| l.starts_with(r#"lease_retention_runs_total{outcome="swept"}"#))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // Judge after two rounds that deleted, however slow the machine.
    eventually(
        Duration::from_secs(60),
        "two sweeps and two deletions",
        || async {
            let (m1, m2) = (one.metrics().await, two.metrics().await);
            swept(&m1).max(swept(&m2)) >= 2
                && (m1.contains("lease_retention_deleted_total 2")
                    || m2.contains("lease_retention_deleted_total 2"))
        },
    )
    .await;
    let remaining: HashSet<String> = one.get("/api/leases").await.body["leases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["resource"].as_str().unwrap().to_owned())
        .collect();
    let expected: HashSet<String> = [
        "new-released",
        "new-expired",
        "active",
        "old-but-renewed",
        "leasehold:lease-retention-sweeper",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    assert_eq!(remaining, expected);

    let m1 = one.metrics().await;
    let m2 = two.metrics().await;
    let (s1, s2) = (swept(&m1), swept(&m2));
    assert!(
        s1.min(s2) == 0 && s1.max(s2) >= 2,
        "one sweeper, many rounds: {s1} vs {s2}"
    );
    assert!(
        m1.contains("lease_retention_deleted_total 2")
            || m2.contains("lease_retention_deleted_total 2")
    );
}

#[tokio::test]
async fn sigterm_stops_gracefully_and_hands_the_sweeper_lease_over() {
    let db = fresh_database().await;
    let mut svc = Service::lease_service(&db, &[("LEASE_SWEEP_INTERVAL_SECONDS", "1")]).await;
    eventually(Duration::from_secs(30), "the sweeper's lease", || async {
        let sweeper = svc.get("/api/leases?resource_prefix=leasehold:").await;
        sweeper.body["leases"][0]["status"] == "active"
    })
    .await;
    assert_eq!(svc.terminate(Duration::from_secs(10)).await, Some(0));
    let after = snapshot(&db, "leases").await;
    assert!(
        after[0].contains("\"released_at\":\"20"),
        "sweeper lease released: {after:?}"
    );
}

#[tokio::test]
async fn migrations_run_by_subcommand_and_can_be_skipped_at_start() {
    let db = fresh_database().await;
    let status = std::process::Command::new(tests::binary("lease-service"))
        .arg("migrate")
        .env("DATABASE_URL", &db)
        .status()
        .unwrap();
    assert!(status.success());
    // Running it again is a no-op.
    let status = std::process::Command::new(tests::binary("lease-service"))
        .arg("migrate")
        .env("DATABASE_URL", &db)
        .status()
        .unwrap();
    assert!(status.success());
    let svc = Service::lease_service(&db, &[("SKIP_MIGRATIONS", "true")]).await;
    assert_eq!(svc.post("/api/leases", &lease("m", "h")).await.status, 201);

    // Skipping them on an empty database leaves the table missing: requests fail, not succeed.
    let empty = fresh_database().await;
    let bare = Service::lease_service(&empty, &[("SKIP_MIGRATIONS", "true")]).await;
    let answer = bare.post("/api/leases", &lease("m", "h")).await;
    assert_eq!(answer.status, 500);
    assert_eq!(answer.code(), "internal");
}

#[tokio::test]
async fn a_batch_acquires_each_free_resource_extends_its_own_and_reports_the_held() {
    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[]).await;
    assert_eq!(
        svc.post("/api/leases", &lease("b", "other")).await.status,
        201
    );
    let mine = svc.post("/api/leases", &lease("c", "me")).await;
    let batch = json!({"resources": ["a", "b", "c"], "holder": "me", "ttl_seconds": 60});
    let answer = svc.post("/api/leases/batch", &batch).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let acquired = answer.body["acquired"].as_array().unwrap();
    assert_eq!(acquired.len(), 1);
    assert_eq!(acquired[0]["resource"], "a");
    assert_eq!(acquired[0]["ttlSeconds"], 60);
    assert_eq!(acquired[0]["secret"].as_str().map(str::len), Some(64));
    let extended = answer.body["extended"].as_array().unwrap();
    assert_eq!(extended.len(), 1);
    assert_eq!(
        extended[0]["fence"], mine.body["fence"],
        "reentrant keeps the fence"
    );
    let held = answer.body["held"].as_array().unwrap();
    assert_eq!(held.len(), 1);
    assert_eq!(
        (held[0]["resource"].as_str(), held[0]["holder"].as_str()),
        (Some("b"), Some("other"))
    );
    assert!(held[0]["expiresInMs"].as_i64().unwrap() > 0);

    // The acquired lease is an ordinary lease: its secret renews and releases it.
    let proven = json!({"resource": "a", "holder": "me", "secret": acquired[0]["secret"]});
    assert_eq!(svc.put("/api/leases/renew", &proven).await.status, 200);
    assert_eq!(svc.delete("/api/leases/release", &proven).await.status, 200);

    // Bad batches write nothing.
    let before = snapshot(&db, "leases").await;
    let too_many: Vec<String> = (0..101).map(|i| format!("r{i}")).collect();
    for (body, code) in [
        (json!({"resources": [], "holder": "me"}), "invalid_batch"),
        (
            json!({"resources": too_many, "holder": "me"}),
            "invalid_batch",
        ),
        (
            json!({"resources": ["x", "x"], "holder": "me"}),
            "duplicate_resource",
        ),
        (
            json!({"resources": ["x", ""], "holder": "me"}),
            "invalid_field",
        ),
        (
            json!({"resources": ["x"], "holder": "me", "ttl_seconds": 0}),
            "invalid_ttl",
        ),
    ] {
        let refused = svc.post("/api/leases/batch", &body).await;
        assert_eq!((refused.status, refused.code()), (400, code), "{body}");
    }
    assert_eq!(before, snapshot(&db, "leases").await);
}

#[tokio::test]
async fn with_secrets_required_a_batch_does_not_extend_a_lease_it_cannot_prove() {
    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[("LEASE_REQUIRE_SECRET", "true")]).await;
    assert_eq!(svc.post("/api/leases", &lease("c", "me")).await.status, 201);
    let answer = svc
        .post(
            "/api/leases/batch",
            &json!({"resources": ["c"], "holder": "me"}),
        )
        .await;
    assert_eq!(answer.status, 200);
    assert!(answer.body["extended"].as_array().unwrap().is_empty());
    assert_eq!(answer.body["held"][0]["holder"], "me");
}

#[tokio::test]
async fn concurrent_overlapping_batches_never_deadlock_and_give_each_resource_one_holder() {
    use rand::seq::SliceRandom;
    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[]).await;
    let resources: Vec<String> = (0..60).map(|i| format!("shared-{i}")).collect();
    let answers = futures_util::future::join_all((0..12).map(|k| {
        let mut mine = resources.clone();
        mine.shuffle(&mut rand::rng());
        mine.truncate(40);
        let svc = &svc;
        async move {
            svc.post(
                "/api/leases/batch",
                &json!({"resources": mine, "holder": format!("h{k}")}),
            )
            .await
        }
    }))
    .await;
    let mut winners = std::collections::HashMap::new();
    for answer in &answers {
        assert_eq!(answer.status, 200, "{:?}", answer.body);
        for lease in answer.body["acquired"].as_array().unwrap() {
            let previous = winners.insert(
                lease["resource"].as_str().unwrap().to_owned(),
                lease["holder"].as_str().unwrap().to_owned(),
            );
            assert!(previous.is_none(), "{lease} acquired twice");
        }
    }
    let active = svc.get("/api/leases/active?limit=1000").await.body["leases"].clone();
    for lease in active.as_array().unwrap() {
        let resource = lease["resource"].as_str().unwrap();
        assert_eq!(
            winners.get(resource).map(String::as_str),
            lease["holder"].as_str()
        );
    }
    assert_eq!(active.as_array().unwrap().len(), winners.len());
}

#[tokio::test]
async fn a_batch_release_answers_each_release_as_alone_in_one_transaction() {
    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[]).await;
    let mine = svc.post("/api/leases", &lease("mine", "me")).await;
    assert_eq!(
        svc.post("/api/leases", &lease("theirs", "other"))
            .await
            .status,
        201
    );
    let body = json!({"leases": [
        {"resource": "mine", "holder": "me", "fence": mine.body["fence"], "secret": mine.body["secret"]},
        {"resource": "theirs", "holder": "me"},
        {"resource": "nowhere", "holder": "me"},
    ]});
    let answer = svc.post("/api/leases/batch/release", &body).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert_eq!(
        verdicts(&answer.body["results"]),
        vec![(200, ""), (409, "not_holder"), (404, "lease_not_found")]
    );
    assert_eq!(answer.body["results"][0]["lease"]["status"], "released");
    let active = svc.get("/api/leases/active").await.body["leases"].clone();
    assert_eq!(active.as_array().unwrap().len(), 1);
    assert_eq!(active[0]["resource"], "theirs");
    let empty = svc
        .post("/api/leases/batch/release", &json!({"leases": []}))
        .await;
    assert_eq!((empty.status, empty.code()), (400, "invalid_batch"));

    // One lease named twice, first with a wrong secret and a stale fence, then rightly: the
    // release goes to the right one, and the wrong ones are refused as they would be alone.
    let twice = svc.post("/api/leases", &lease("twice", "me")).await;
    let right = json!({"resource": "twice", "holder": "me", "fence": twice.body["fence"],
                       "secret": twice.body["secret"]});
    let body = json!({"leases": [
        {"resource": "twice", "holder": "me", "secret": "0".repeat(64)},
        {"resource": "twice", "holder": "me", "fence": twice.body["fence"].as_i64().unwrap() + 1},
        right,
        right,
    ]});
    let answer = svc.post("/api/leases/batch/release", &body).await;
    assert_eq!(
        verdicts(&answer.body["results"]),
        vec![
            (409, "wrong_secret"),
            (409, "stale_fence"),
            (200, ""),
            (200, "")
        ],
        "{:?}",
        answer.body
    );
}

#[tokio::test]
async fn a_batch_may_name_a_holder_per_resource() {
    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[]).await;
    assert_eq!(
        svc.post("/api/leases", &lease("held", "other"))
            .await
            .status,
        201
    );
    let answer = svc
        .post(
            "/api/leases/batch",
            &json!({"resources": ["a", "b", "held"], "holders": ["w1", "w2", "w3"]}),
        )
        .await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let acquired = answer.body["acquired"].as_array().unwrap();
    let holder_of = |resource: &str| {
        acquired
            .iter()
            .find(|l| l["resource"] == resource)
            .map(|l| l["holder"].clone())
    };
    assert_eq!(holder_of("a"), Some(json!("w1")));
    assert_eq!(holder_of("b"), Some(json!("w2")));
    assert_eq!(answer.body["held"][0]["holder"], "other");
    // Each holder's lease is its own: w2 cannot release w1's.
    let refused = svc.delete("/api/leases/release", &lease("a", "w2")).await;
    assert_eq!(refused.status, 409, "{:?}", refused.body);

    let before = snapshot(&db, "leases").await;
    for (body, code) in [
        (
            json!({"resources": ["x", "y"], "holders": ["w1"]}),
            "invalid_batch",
        ),
        (
            json!({"resources": ["x"], "holder": "w", "holders": ["w1"]}),
            "invalid_batch",
        ),
        (json!({"resources": ["x"]}), "missing_field"),
        (
            json!({"resources": ["x"], "holders": [""]}),
            "invalid_field",
        ),
    ] {
        let refused = svc.post("/api/leases/batch", &body).await;
        assert_eq!((refused.status, refused.code()), (400, code), "{body}");
    }
    assert_eq!(before, snapshot(&db, "leases").await);
}

#[derive(diesel::QueryableByName)]
struct Event {
    #[diesel(sql_type = diesel::sql_types::Text)]
    kind: String,
    #[diesel(sql_type = diesel::sql_types::Timestamptz)]
    at: chrono::DateTime<chrono::Utc>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Timestamptz>)]
    released_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// The soak once found two generators' terms "overlapping" by 1.3 ms: a takeover whose statement
/// started before the old holder's release, and waited for it, was recorded at its start.
#[tokio::test]
async fn a_takeover_that_began_before_a_release_is_recorded_after_it() {
    use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
    use lease_service::repo::{self, AcquireProof, Acquired};

    let db = fresh_database().await;
    lease_service::db::migrate(&db).await.unwrap();
    let mut old = AsyncPgConnection::establish(&db).await.unwrap();
    let mut newcomer = AsyncPgConnection::establish(&db).await.unwrap();
    let hash = [1u8; 32];
    let proof = AcquireProof {
        new_secret_hash: &hash,
        presented_hash: None,
        require_secret: false,
    };
    let first = repo::acquire(&mut old, "r", "old", 30, proof, None)
        .await
        .unwrap();
    assert!(matches!(first, Acquired::New(_)));
    // The newcomer's transaction (its `now()`) starts first; the release starts and commits
    // after it; only then does the newcomer take the row.
    let taken = newcomer
        .transaction::<_, diesel::result::Error, _>(async |conn| {
            diesel::sql_query("SELECT 1").execute(conn).await?;
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            let released = repo::release(&mut old, "r", "old", None, None, None).await?;
            assert!(released.is_some());
            repo::acquire(conn, "r", "new", 30, proof, None).await
        })
        .await
        .unwrap();
    assert!(matches!(taken, Acquired::New(_)));
    let events: Vec<Event> =
        diesel::sql_query("SELECT kind, at, released_at FROM lease_events ORDER BY id")
            .load(&mut old)
            .await
            .unwrap();
    let released_at = events
        .iter()
        .find_map(|e| (e.kind == "released").then_some(e.released_at).flatten())
        .unwrap();
    let acquired_at = events.iter().rfind(|e| e.kind == "acquired").unwrap().at;
    assert!(
        acquired_at >= released_at,
        "the new term is recorded at {acquired_at}, before the old one ended at {released_at}"
    );
}

/// Each answer's status and error code.
fn outcomes(answers: &[Answer]) -> Vec<(u16, &str)> {
    answers.iter().map(|a| (a.status, a.code())).collect()
}

/// Members of lease-service's groups, and the groups, for `operation`.
async fn grouped(svc: &Service, operation: &str) -> (f64, f64) {
    let metrics = svc.metrics().await;
    let series = |part: &str| format!("lease_group_size_{part}{{operation=\"{operation}\"}}");
    (
        metric_sum(&metrics, &series("sum")),
        metric_sum(&metrics, &series("count")),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_single_requests_are_served_in_groups_each_as_alone() {
    const HOLDERS: usize = 40;
    let db = fresh_database().await;
    let svc = Service::lease_service(
        &db,
        &[("GROUPS_IN_FLIGHT", "1"), ("DATABASE_POOL_SIZE", "8")],
    )
    .await;
    let holder = |i: usize| format!("holder-{i}");

    // 40 holders acquire a resource each while 8 more contend for one: each of the 40 gets its
    // own lease, fence and secret; of the 8, one wins and seven are told who.
    let acquires = futures_util::future::join_all(
        (0..HOLDERS)
            .map(|i| (format!("own-{i}"), holder(i)))
            .chain((0..8).map(|i| ("contended".to_owned(), format!("contender-{i}"))))
            .map(|(resource, holder)| {
                let svc = &svc;
                async move { svc.post("/api/leases", &lease(&resource, &holder)).await }
            }),
    )
    .await;
    let mut fences = HashSet::new();
    let mut secrets = HashSet::new();
    for (i, answer) in acquires.iter().take(HOLDERS).enumerate() {
        assert_eq!(answer.status, 201, "{:?}", answer.body);
        assert_eq!(answer.body["resource"], format!("own-{i}"));
        assert_eq!(answer.body["holder"], holder(i));
        assert!(fences.insert(answer.body["fence"].as_i64().unwrap()));
        assert!(secrets.insert(answer.body["secret"].as_str().unwrap().to_owned()));
    }
    let contended = &acquires[HOLDERS..];
    let winners: Vec<_> = contended.iter().filter(|a| a.status == 201).collect();
    assert_eq!(winners.len(), 1, "{:?}", outcomes(contended));
    for answer in contended.iter().filter(|a| a.status != 201) {
        assert_eq!((answer.status, answer.code()), (409, "lease_held"));
        assert_eq!(answer.body["holder"], winners[0].body["holder"]);
    }
    let (members, groups) = grouped(&svc, "acquire").await;
    assert_eq!(members, 48.0, "every single acquire went through a group");
    assert!(
        groups < 48.0,
        "{groups} groups for 48 acquires: none grouped"
    );

    // Renewals: each with its own fence and secret, beside a stale fence, a stranger, and a
    // reentrant acquire without a secret (this service does not require one).
    let proof = |i: usize| {
        let answer = &acquires[i];
        json!({
            "resource": answer.body["resource"],
            "holder": answer.body["holder"],
            "fence": answer.body["fence"],
            "secret": answer.body["secret"],
        })
    };
    let stale = json!({"resource": "own-0", "holder": holder(0), "fence": 999_999});
    let stranger = lease("own-1", "stranger");
    let renewals =
        futures_util::future::join_all((0..HOLDERS).map(proof).chain([stale, stranger]).map(
            |body| {
                let svc = &svc;
                async move { svc.put("/api/leases/renew", &body).await }
            },
        ))
        .await;
    for (i, answer) in renewals.iter().take(HOLDERS).enumerate() {
        assert_eq!(answer.status, 200, "{:?}", answer.body);
        assert_eq!(answer.body["fence"], acquires[i].body["fence"]);
        assert!(answer.body["renewedAt"].is_string());
    }
    assert_eq!(
        outcomes(&renewals[HOLDERS..]),
        [(409, "stale_fence"), (409, "not_holder")]
    );
    let reentrant = svc.post("/api/leases", &lease("own-2", &holder(2))).await;
    assert_eq!(reentrant.status, 200, "{:?}", reentrant.body);
    assert_eq!(reentrant.body["fence"], acquires[2].body["fence"]);
    let (_, renewal_groups) = grouped(&svc, "renew").await;
    assert!(
        renewal_groups < 42.0,
        "{renewal_groups} groups for 42 renewals"
    );

    // Releases, with a repeat of one (answered as the first, whichever of the two goes first)
    // and a release by a stranger.
    let releases = futures_util::future::join_all(
        (0..HOLDERS)
            .map(proof)
            .chain([proof(3), lease("own-4", "stranger")])
            .map(|body| {
                let svc = &svc;
                async move { svc.delete("/api/leases/release", &body).await }
            }),
    )
    .await;
    for (i, answer) in releases.iter().take(HOLDERS).enumerate() {
        assert_eq!(answer.status, 200, "{:?}", answer.body);
        assert_eq!(answer.body["status"], "released");
        assert_eq!(answer.body["holder"], holder(i));
    }
    assert_eq!(
        releases[HOLDERS].status, 200,
        "{:?}",
        releases[HOLDERS].body
    );
    assert_eq!(releases[HOLDERS].body["fence"], acquires[3].body["fence"]);
    assert_eq!(outcomes(&releases[HOLDERS + 1..]), [(409, "not_holder")]);
    let (_, release_groups) = grouped(&svc, "release").await;
    assert!(
        release_groups < 42.0,
        "{release_groups} groups for 42 releases"
    );
    let active = svc.get("/api/leases/active").await;
    assert_eq!(
        active.body["leases"].as_array().map(Vec::len),
        Some(1),
        "only the contended lease is left: {:?}",
        active.body
    );
}

/// An operator's revoke is not its holder's release: the holder is refused (`lease_revoked`) on
/// renew and on every kind of release, even with its own fence and secret, where a release it
/// repeats is answered 200. Anyone may then acquire at once, with a greater fence.
#[tokio::test(flavor = "multi_thread")]
async fn a_revoked_lease_is_refused_to_its_holder_on_renew_and_every_release() {
    const HOLDERS: usize = 8;
    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[("GROUPS_IN_FLIGHT", "1")]).await;
    let (mut ids, mut proofs) = (Vec::new(), Vec::new());
    for i in 0..HOLDERS {
        let got = svc
            .post("/api/leases", &lease(&format!("r-{i}"), &format!("h-{i}")))
            .await;
        assert_eq!(got.status, 201, "{:?}", got.body);
        let revoked = svc
            .post(
                &format!("/api/leases/{}/revoke", got.body["id"]),
                &json!({}),
            )
            .await;
        assert_eq!(revoked.status, 200, "{:?}", revoked.body);
        assert_eq!(revoked.body["status"], "revoked");
        assert!(revoked.body["releasedAt"].is_string(), "{:?}", revoked.body);
        ids.push(got.body["id"].as_i64().unwrap());
        proofs.push(json!({
            "resource": got.body["resource"],
            "holder": got.body["holder"],
            "fence": got.body["fence"],
            "secret": got.body["secret"],
        }));
    }
    let before = snapshot(&db, "leases").await;

    // Alone, by id, in a batch, and concurrently (served in groups): each one refused.
    let renew = svc.put("/api/leases/renew", &proofs[0]).await;
    assert_eq!((renew.status, renew.code()), (409, "lease_revoked"));
    let release = svc.delete("/api/leases/release", &proofs[0]).await;
    assert_eq!((release.status, release.code()), (409, "lease_revoked"));
    let by_id = svc
        .delete(&format!("/api/leases/{}", ids[1]), &proofs[1])
        .await;
    assert_eq!((by_id.status, by_id.code()), (409, "lease_revoked"));
    let batch = svc
        .post(
            "/api/leases/batch/release",
            &json!({"leases": [proofs[2], proofs[3]]}),
        )
        .await;
    assert_eq!(batch.status, 200, "{:?}", batch.body);
    assert_eq!(
        verdicts(&batch.body["results"]),
        [(409, "lease_revoked"), (409, "lease_revoked")]
    );
    let renewals = futures_util::future::join_all(proofs.iter().map(|proof| {
        let svc = &svc;
        async move { svc.put("/api/leases/renew", proof).await }
    }))
    .await;
    assert!(
        outcomes(&renewals)
            .iter()
            .all(|o| *o == (409, "lease_revoked")),
        "{:?}",
        outcomes(&renewals)
    );
    let releases = futures_util::future::join_all(proofs.iter().map(|proof| {
        let svc = &svc;
        async move { svc.delete("/api/leases/release", proof).await }
    }))
    .await;
    assert!(
        outcomes(&releases)
            .iter()
            .all(|o| *o == (409, "lease_revoked")),
        "{:?}",
        outcomes(&releases)
    );
    assert_eq!(
        snapshot(&db, "leases").await,
        before,
        "refusals wrote nothing"
    );

    // The history says who ended the term.
    let events = snapshot(&db, "lease_events").await;
    let revoked = events
        .iter()
        .filter(|e| e.contains(r#""kind":"revoked""#))
        .count();
    assert_eq!(revoked, HOLDERS, "{events:?}");

    // A new holder takes it at once; the old holder's late release cannot touch the new lease.
    let next = svc.post("/api/leases", &lease("r-0", "next")).await;
    assert_eq!(next.status, 201, "{:?}", next.body);
    assert!(next.body["fence"].as_i64() > proofs[0]["fence"].as_i64());
    assert_eq!(next.body["status"], "active");
    let late = svc.delete("/api/leases/release", &proofs[0]).await;
    assert_eq!((late.status, late.code()), (409, "not_holder"));
    // And the same holder acquiring again gets a new term of its own, not the revoked one.
    let again = svc.post("/api/leases", &lease("r-4", "h-4")).await;
    assert_eq!(again.status, 201, "{:?}", again.body);
    assert_eq!(again.body["status"], "active");
    assert!(again.body["fence"].as_i64() > proofs[4]["fence"].as_i64());
}

/// A holder's metadata (what it says about itself) is stored by its acquisition, replaced by
/// the renewals and reentrant acquires that carry some, kept by those that carry none, and gone
/// with the holder: a new holder, alone or in a batch, never inherits it. Anything but a JSON
/// object of at most 4 KiB is refused, and writes nothing.
#[tokio::test]
async fn metadata_belongs_to_the_holder_that_set_it() {
    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[]).await;
    let about = |slots: i64| json!({"host": "box-1", "slots": slots});

    let first = svc
        .post(
            "/api/leases",
            &json!({"resource": "worker:a", "holder": "a", "metadata": about(4)}),
        )
        .await;
    assert_eq!(first.status, 201, "{:?}", first.body);
    assert_eq!(first.body["metadata"], about(4));
    let id = first.body["id"].as_i64().unwrap();
    let fence = first.body["fence"].as_i64().unwrap();
    assert_eq!(
        svc.get(&format!("/api/leases/{id}")).await.body["lease"]["metadata"],
        about(4)
    );
    let listed = svc.get("/api/leases?resource_prefix=worker:").await;
    assert_eq!(listed.body["leases"][0]["metadata"], about(4));

    // Renewals: with metadata it is replaced, without it is kept.
    let renewed = svc
        .put(
            "/api/leases/renew",
            &json!({"resource": "worker:a", "holder": "a", "fence": fence, "metadata": about(3)}),
        )
        .await;
    assert_eq!(renewed.body["metadata"], about(3), "{:?}", renewed.body);
    let renewed = svc
        .put(
            "/api/leases/renew",
            &json!({"resource": "worker:a", "holder": "a"}),
        )
        .await;
    assert_eq!(renewed.body["metadata"], about(3), "{:?}", renewed.body);
    // A reentrant acquire: with metadata it is replaced, without (the grouped statement) kept.
    let again = svc
        .post(
            "/api/leases",
            &json!({"resource": "worker:a", "holder": "a", "metadata": about(2)}),
        )
        .await;
    assert_eq!((again.status, &again.body["metadata"]), (200, &about(2)));
    let again = svc.post("/api/leases", &lease("worker:a", "a")).await;
    assert_eq!((again.status, &again.body["metadata"]), (200, &about(2)));

    // Refused: not an object, or too large; nothing written.
    let before = snapshot(&db, "leases").await;
    let huge = json!({"pad": "x".repeat(5000)});
    for metadata in [
        json!([1, 2]),
        json!("text"),
        json!(7),
        huge,
        json!({"host": "a\u{0}b"}),
        json!({"a\u{0}": 1}),
    ] {
        for (method, path) in [("POST", "/api/leases"), ("PUT", "/api/leases/renew")] {
            let body = json!({"resource": "worker:a", "holder": "a", "metadata": metadata});
            let answer = if method == "POST" {
                svc.post(path, &body).await
            } else {
                svc.put(path, &body).await
            };
            assert_eq!(
                (answer.status, answer.code()),
                (400, "invalid_metadata"),
                "{method} {path} {:?}",
                answer.body
            );
        }
    }
    assert_eq!(snapshot(&db, "leases").await, before);

    // Gone with the holder: a new holder after the release has none, alone or in a batch.
    let released = svc
        .delete(
            "/api/leases/release",
            &json!({"resource": "worker:a", "holder": "a"}),
        )
        .await;
    assert_eq!(released.status, 200, "{:?}", released.body);
    let next = svc.post("/api/leases", &lease("worker:a", "b")).await;
    assert_eq!(next.status, 201);
    assert!(next.body.get("metadata").is_none(), "{:?}", next.body);
    svc.post(
        "/api/leases",
        &json!({"resource": "worker:c", "holder": "c", "metadata": about(1), "ttl_seconds": 1}),
    )
    .await;
    svc.delete(
        "/api/leases/release",
        &json!({"resource": "worker:c", "holder": "c"}),
    )
    .await;
    let batch = svc
        .post(
            "/api/leases/batch",
            &json!({"resources": ["worker:c", "worker:d"], "holder": "e"}),
        )
        .await;
    assert_eq!(batch.status, 200, "{:?}", batch.body);
    let acquired = batch.body["acquired"].as_array().unwrap();
    assert_eq!(acquired.len(), 2, "{:?}", batch.body);
    assert!(
        acquired.iter().all(|l| l.get("metadata").is_none()),
        "{acquired:?}"
    );
}

/// A batch acquire's metadata is stored on every lease it takes, as a single acquire stores
/// its own: replacing a reentrant holder's when given, kept when not, and refused above 4 KiB
/// (or when not an object) with the single acquire's code, writing nothing.
#[tokio::test]
async fn a_batch_acquire_stores_its_metadata_as_a_single_acquire_does() {
    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[]).await;
    let about = |slots: i64| json!({"host": "box-1", "slots": slots});

    let batch = svc
        .post(
            "/api/leases/batch",
            &json!({"resources": ["m-1", "m-2"], "holder": "h", "metadata": about(2)}),
        )
        .await;
    assert_eq!(batch.status, 200, "{:?}", batch.body);
    let acquired = batch.body["acquired"].as_array().unwrap();
    assert_eq!(acquired.len(), 2, "{:?}", batch.body);
    for lease in acquired {
        assert_eq!(lease["metadata"], about(2), "{lease:?}");
        let id = lease["id"].as_i64().unwrap();
        let stored = svc.get(&format!("/api/leases/{id}")).await;
        assert_eq!(
            stored.body["lease"]["metadata"],
            about(2),
            "{:?}",
            stored.body
        );
    }
    // One resource alone takes the single statement's path; it stores it too.
    let alone = svc
        .post(
            "/api/leases/batch",
            &json!({"resources": ["m-3"], "holder": "h", "metadata": about(1)}),
        )
        .await;
    assert_eq!(
        alone.body["acquired"][0]["metadata"],
        about(1),
        "{:?}",
        alone.body
    );

    // Reentrant (secrets not required here): replaced when given, kept when not.
    let again = svc
        .post(
            "/api/leases/batch",
            &json!({"resources": ["m-1", "m-2"], "holder": "h", "metadata": about(5)}),
        )
        .await;
    let extended = again.body["extended"].as_array().unwrap();
    assert_eq!(extended.len(), 2, "{:?}", again.body);
    assert!(
        extended.iter().all(|l| l["metadata"] == about(5)),
        "{extended:?}"
    );
    let kept = svc
        .post(
            "/api/leases/batch",
            &json!({"resources": ["m-1", "m-2"], "holder": "h"}),
        )
        .await;
    let extended = kept.body["extended"].as_array().unwrap();
    assert!(
        extended.iter().all(|l| l["metadata"] == about(5)),
        "{extended:?}"
    );

    // Refused as the single acquire refuses it, and nothing written.
    let before = snapshot(&db, "leases").await;
    for metadata in [
        json!({"pad": "x".repeat(5000)}),
        json!([1, 2]),
        json!({"host": "a\u{0}b"}),
    ] {
        for resources in [json!(["m-1", "m-9"]), json!(["m-9"])] {
            let refused = svc
                .post(
                    "/api/leases/batch",
                    &json!({"resources": resources, "holder": "h", "metadata": metadata}),
                )
                .await;
            assert_eq!(
                (refused.status, refused.code()),
                (400, "invalid_metadata"),
                "{:?}",
                refused.body
            );
            assert_eq!(refused.body["field"], "metadata");
        }
    }
    assert_eq!(snapshot(&db, "leases").await, before);
}

/// A check reads where each acquisition stands, by resource and fence, and writes nothing: held
/// while it lives, then released, revoked, superseded, expired or missing, each told apart.
#[tokio::test]
async fn a_batch_check_tells_where_each_acquisition_stands_and_writes_nothing() {
    use leasehold::api::LeaseStanding;
    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[]).await;
    let client = leasehold::LeaseClient::new(svc.base_url());
    let acquire = |resource: &'static str, ttl: u64| {
        let client = client.clone();
        async move {
            client
                .acquire(resource, "h", Some(Duration::from_secs(ttl)))
                .await
                .unwrap()
        }
    };
    let held = acquire("held", 60).await;
    let released = acquire("released", 60).await;
    client
        .release("released", "h", released.proof())
        .await
        .unwrap();
    let revoked = acquire("revoked", 60).await;
    let answer = svc
        .post(&format!("/api/leases/{}/revoke", revoked.id), &json!({}))
        .await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let old = acquire("taken", 1).await;
    let expired = acquire("expired", 1).await;
    eventually(
        Duration::from_secs(10),
        "the short leases to expire",
        || {
            let client = client.clone();
            async move { client.current("expired").await.unwrap().is_none() }
        },
    )
    .await;
    let newer = client
        .acquire("taken", "other", Some(Duration::from_secs(60)))
        .await
        .unwrap();
    assert!(newer.fence > old.fence);

    let before = snapshot(&db, "leases").await;
    let events = snapshot(&db, "lease_events").await;
    let checks = client
        .check_many(&[
            ("held", held.fence),
            ("released", released.fence),
            ("revoked", revoked.fence),
            ("taken", old.fence),
            ("taken", newer.fence),
            ("expired", expired.fence),
            ("nothing", 1),
        ])
        .await
        .unwrap();
    let standings: Vec<(&str, LeaseStanding)> = checks
        .iter()
        .map(|c| (c.resource.as_str(), c.standing))
        .collect();
    assert_eq!(
        standings,
        vec![
            ("held", LeaseStanding::Held),
            ("released", LeaseStanding::Released),
            ("revoked", LeaseStanding::Revoked),
            ("taken", LeaseStanding::Superseded),
            ("taken", LeaseStanding::Held),
            ("expired", LeaseStanding::Expired),
            ("nothing", LeaseStanding::Missing),
        ]
    );
    assert_eq!(checks[0].expires_at, Some(held.expires_at));
    assert_eq!(checks[0].takeover_at, Some(held.expires_at));
    assert_eq!(checks[3].takeover_at, None);
    assert_eq!(
        snapshot(&db, "leases").await,
        before,
        "a check wrote a lease"
    );
    assert_eq!(snapshot(&db, "lease_events").await, events);

    // Refused as a whole: no leases, too many, a bad name, a field it does not know.
    let too_many: Vec<Value> = (0..101)
        .map(|i| json!({"resource": format!("r{i}"), "fence": 1}))
        .collect();
    for (body, code) in [
        (json!({"leases": []}), "invalid_batch"),
        (json!({"leases": too_many}), "invalid_batch"),
        (
            json!({"leases": [{"resource": "", "fence": 1}]}),
            "invalid_field",
        ),
        (
            json!({"leases": [{"resource": "a", "fence": 1, "holder": "h"}]}),
            "invalid_field",
        ),
    ] {
        let refused = svc.post("/api/leases/batch/check", &body).await;
        assert_eq!((refused.status, refused.code()), (400, code), "{body}");
    }
}
