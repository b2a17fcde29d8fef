//! A database host that accepts connections but never answers, or answers but cannot commit,
//! must cost its requests a bounded wait and a 503, never hang the service; and with a
//! formation's multi-host URL, the next host serves. These are the frozen primary and the
//! zombie primary of a failover, reproduced on plain servers so that every CI run has them:
//! [`tests::gate::Gate`] freezes a host, and a server whose commits wait for a synchronous
//! standby that does not exist is the zombie. (`failover.rs` runs the real formation.)
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use leasehold_local::postgres::PrivatePostgres;
use serde_json::{Value, json};
use tests::gate::Gate;
use tests::{Service, execute, fresh_database};

/// Short bounds, so each fault's cost is seconds: a reply is awaited 2 s at most.
const TIMEOUTS: [(&str, &str); 2] = [
    ("DATABASE_CONNECT_TIMEOUT_MS", "1000"),
    ("DATABASE_STATEMENT_TIMEOUT_MS", "1000"),
];

/// `url` (one host, `127.0.0.1:<port>`) naming the hosts at `ports` instead, in that order.
fn hosts(url: &str, ports: &[u16]) -> String {
    let (scheme_user, rest) = url.split_once("@127.0.0.1:").unwrap();
    let (_, path) = rest.split_once('/').unwrap();
    let list: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    format!("{scheme_user}@{}/{path}", list.join(","))
}

fn port_of(url: &str) -> u16 {
    let rest = url.split_once("@127.0.0.1:").unwrap().1;
    rest.split_once('/').unwrap().0.parse().unwrap()
}

fn lease(resource: &str) -> Value {
    json!({ "resource": resource, "holder": "h", "ttl_seconds": 30 })
}

/// Acquires until one succeeds, asserting that every failure on the way is a 503 (a write whose
/// outcome is unknown is never a success, and never a 500); returns how many failed.
async fn acquire_until_served(svc: &Service, resource: &str) -> usize {
    for failed in 0..20 {
        let answer = svc.post("/api/leases", &lease(resource)).await;
        match answer.status {
            200 | 201 => return failed,
            503 => {}
            other => panic!("acquire answered {other}: {}", answer.body),
        }
    }
    panic!(
        "20 acquires of {resource} in a row failed; log:\n{}",
        svc.log_tail()
    );
}

/// A private server of the test's own (one it may break), with `databases` on it.
async fn own_server(databases: &[&str]) -> PrivatePostgres {
    let server = tokio::task::spawn_blocking(PrivatePostgres::start_ephemeral_crash_safe)
        .await
        .unwrap()
        .unwrap();
    for database in databases {
        server.create_database(database).await.unwrap();
    }
    server
}

/// Makes the server at `url` a primary whose commits wait for a synchronous standby that does
/// not exist: every write commits locally and is never acknowledged, as on a zombie primary.
async fn strand_commits(url: &str) {
    execute(url, "CREATE TABLE stranded_probe (at timestamptz)").await;
    execute(
        url,
        "ALTER SYSTEM SET synchronous_standby_names = 'gone_standby'",
    )
    .await;
    execute(url, "SELECT pg_reload_conf()").await;
    // The checkpointer turns synchronous replication on some time after the reload: wait until
    // a commit of the test's own hangs.
    tests::eventually(
        Duration::from_secs(30),
        "commits to wait for the standby",
        || async {
            let commit = execute(url, "INSERT INTO stranded_probe VALUES (now())");
            tokio::time::timeout(Duration::from_secs(1), commit)
                .await
                .is_err()
        },
    )
    .await;
}

#[tokio::test]
async fn a_frozen_first_host_is_passed_over_at_start() {
    let db = fresh_database().await;
    let gate = Gate::start(port_of(&db)).await;
    gate.freeze();
    let url = hosts(&db, &[gate.port(), port_of(&db)]);
    // Migrations, the pool and the wake-up listener all get past the frozen host.
    let svc = Service::lease_service(&url, &TIMEOUTS).await;
    assert_eq!(acquire_until_served(&svc, "start").await, 0);
    let ready = svc.get("/readyz").await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    assert_eq!(
        ready.body["database"]["inRecovery"], false,
        "{}",
        ready.body
    );
    assert!(ready.body["database"]["timeline"].as_i64().unwrap() >= 1);
}

#[tokio::test]
async fn a_host_that_freezes_mid_flight_costs_503s_then_the_next_host_serves() {
    let db = fresh_database().await;
    let gate = Gate::start(port_of(&db)).await;
    let url = hosts(&db, &[gate.port(), port_of(&db)]);
    let svc = Service::lease_service(&url, &TIMEOUTS).await;
    // Warm the pool on the gated host, the first of the URL.
    for i in 0..8 {
        assert_eq!(acquire_until_served(&svc, &format!("warm-{i}")).await, 0);
    }
    gate.freeze();
    // The pooled connections are all on the frozen host: the first request waits out the reply
    // bound and fails; that closes every session there, so at most a few more fail.
    let failed = acquire_until_served(&svc, "after-freeze").await;
    assert!(
        (1..=3).contains(&failed),
        "{failed} acquires failed before the next host served"
    );
    // From then on the other host serves every request.
    for i in 0..10 {
        assert_eq!(acquire_until_served(&svc, &format!("later-{i}")).await, 0);
    }
    assert!(
        svc.log_text().contains("a database host stopped answering"),
        "the frozen host was not reported; log:\n{}",
        svc.log_tail()
    );
}

#[tokio::test]
async fn a_primary_that_cannot_commit_answers_503_and_the_next_host_serves() {
    // The zombie: a server of its own, whose commits wait for a standby that never comes
    // (`synchronous_commit=on`, as a formation's primary has it).
    // Both hosts hold a database of one name, as a formation's nodes do.
    let healthy_url = fresh_database().await;
    let name = healthy_url.rsplit_once('/').unwrap().1;
    let zombie = own_server(&[name]).await;
    let zombie_url = zombie.url(name);
    let url = hosts(&healthy_url, &[zombie.port(), port_of(&healthy_url)]);
    // The service migrates the first; the second is as a promoted standby would be.
    lease_service::db::migrate(&healthy_url).await.unwrap();
    let svc = Service::lease_service(&url, &TIMEOUTS).await;
    assert_eq!(acquire_until_served(&svc, "before").await, 0);

    strand_commits(&zombie_url).await;
    // Every write now commits locally and is never acknowledged: each must be answered 503,
    // never a success. The first one also closes every session there; the next host serves
    // from then on.
    let hung = svc.post("/api/leases", &lease("during")).await;
    assert_eq!(
        hung.status, 503,
        "a write the database never acknowledged: {}",
        hung.body
    );
    assert_eq!(hung.code(), "unavailable");
    // It says when to try again, as the document states for every 503.
    assert_eq!(hung.headers["retry-after"], "1");
    assert_eq!(acquire_until_served(&svc, "after").await, 0);
    let ready = svc.get("/readyz").await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    assert_eq!(
        ready.body["database"]["server"],
        format!("127.0.0.1:{}", port_of(&healthy_url)),
        "{}",
        ready.body
    );
}

/// Acquires `resource` for `holder` until it is granted; the grant's `createdAt`, by the
/// database's clock.
async fn take_over(svc: &Service, resource: &str, holder: &str) -> chrono::DateTime<chrono::Utc> {
    let body = json!({ "resource": resource, "holder": holder, "ttl_seconds": 30 });
    for _ in 0..300 {
        let answer = svc.post("/api/leases", &body).await;
        match answer.status {
            201 => return answer.body["createdAt"].as_str().unwrap().parse().unwrap(),
            409 => tokio::time::sleep(Duration::from_millis(50)).await,
            other => panic!("acquire answered {other}: {}", answer.body),
        }
    }
    panic!("{resource} was never taken over");
}

#[tokio::test]
async fn a_lease_set_by_an_earlier_primary_is_taken_over_only_after_the_skew_bound() {
    let db = fresh_database().await;
    let svc = Service::lease_service(&db, &[("LEASE_MAX_CLOCK_SKEW_MS", "3000")]).await;
    let short =
        |resource: &str| json!({ "resource": resource, "holder": "alice", "ttl_seconds": 1 });
    let before = svc.post("/api/leases", &short("set-before-failover")).await;
    let after = svc.post("/api/leases", &short("set-on-this-primary")).await;
    assert_eq!((before.status, after.status), (201, 201));
    let expiry = |answer: &tests::Answer| -> chrono::DateTime<chrono::Utc> {
        answer.body["expiresAt"].as_str().unwrap().parse().unwrap()
    };
    // As if the first had been granted by the primary before a failover: an earlier timeline.
    execute(
        &db,
        "UPDATE leases SET timeline = timeline - 1 WHERE resource = 'set-before-failover'",
    )
    .await;
    let bound = chrono::Duration::milliseconds(3000);
    // A lease this primary set is taken over as soon as it expires (well within the bound)...
    let taken = take_over(&svc, "set-on-this-primary", "bob").await;
    assert!(
        taken >= expiry(&after) && taken < expiry(&after) + bound,
        "{taken}"
    );
    // ...one an earlier primary set only once the skew bound has passed as well.
    let taken = take_over(&svc, "set-before-failover", "bob").await;
    assert!(
        taken >= expiry(&before) + bound,
        "{taken} < {} + 3 s",
        expiry(&before)
    );
    // Renewed or taken on this primary, a lease carries this primary's timeline.
    let rows = tests::query(
        &db,
        "SELECT count(*) AS n FROM leases WHERE timeline <> leasehold_timeline()",
    )
    .await;
    assert_eq!(rows[0]["n"], 0);
}

#[derive(diesel::QueryableByName)]
struct Written {
    #[diesel(sql_type = diesel::sql_types::Integer)]
    x: i32,
}

/// Awaits `write` while ending, as the fast shutdown of a demoted primary does (`pg_ctl stop
/// -m fast` sends each backend the same SIGTERM), every session of `url`'s database whose
/// commit waits for the synchronous standby, until `write` is answered. [`strand_commits`]'s
/// own probes are left waiting.
async fn with_waiting_commits_ended<T>(url: &str, write: impl Future<Output = T>) -> T {
    let answered = tokio_util::sync::CancellationToken::new();
    let end_waits = async {
        while !answered.is_cancelled() {
            tests::query(
                url,
                "SELECT pg_terminate_backend(pid) AS ended FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event = 'SyncRep' \
                   AND query NOT LIKE '%stranded_probe%'",
            )
            .await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let (answer, ()) = tokio::join!(
        async {
            let answer = write.await;
            answered.cancel();
            answer
        },
        end_waits
    );
    answer
}

/// A server that cannot commit, whose waiting commit is then ended by a fast shutdown, as a
/// demoted primary's is in every failover. PostgreSQL has by then sent the statement's rows
/// and its CommandComplete (an autocommit statement commits at Sync, after them) and flushes
/// them with its warning: `get_result`, which stops reading at the first row, reports a write
/// done that no standby has. [`leasehold::server::db::OneRow::get_one`] reads to the end of the
/// reply, which a terminated session never sends. `load` and `execute` do too.
#[tokio::test]
async fn a_write_whose_commit_is_ended_by_a_shutdown_is_not_reported_done() {
    use diesel_async::{AsyncConnection, AsyncPgConnection};
    use leasehold::server::db::OneRow;
    let server = own_server(&["writes"]).await;
    let url = server.url("writes");
    execute(&url, "CREATE TABLE t (x integer)").await;
    let insert = || diesel::sql_query("INSERT INTO t VALUES (1) RETURNING x");
    let mut conn = AsyncPgConnection::establish(&url).await.unwrap();
    let written: Written = insert().get_one(&mut conn).await.unwrap();
    assert_eq!(written.x, 1);

    strand_commits(&url).await;
    // Never answered while the commit waits...
    let mut conn = AsyncPgConnection::establish(&url).await.unwrap();
    let pending = tokio::time::timeout(
        Duration::from_secs(2),
        insert().get_one::<Written>(&mut conn),
    )
    .await;
    assert!(pending.is_err(), "a write was answered before its commit");
    // ...and an error, never a row, once the shutdown ends the session.
    let mut conn = AsyncPgConnection::establish(&url).await.unwrap();
    let outcome = with_waiting_commits_ended(&url, insert().get_one::<Written>(&mut conn)).await;
    assert!(
        outcome.is_err(),
        "a write whose commit was ended was reported done: {:?}",
        outcome.map(|w| w.x)
    );
}

/// The same through the services: a lease acquisition and a task's creation whose commits
/// are ended by a shutdown are answered 503, never as done.
#[tokio::test]
async fn the_services_answer_503_for_a_write_whose_commit_is_ended() {
    let zombie = own_server(&["leases", "tasks"]).await;
    let (lease_url, task_url) = (zombie.url("leases"), zombie.url("tasks"));
    // A reply deadline (31 s) past the test client's patience (10 s): an answer can only come
    // from the session's end.
    let patient = [
        ("DATABASE_CONNECT_TIMEOUT_MS", "5000"),
        ("DATABASE_STATEMENT_TIMEOUT_MS", "30000"),
    ];
    let leases = Service::lease_service(&lease_url, &patient).await;
    let tasks = Service::task_service(&task_url, &leases.base_url(), &patient).await;
    // The setting is the server's: both databases' commits wait from here on.
    strand_commits(&lease_url).await;

    let acquired =
        with_waiting_commits_ended(&lease_url, leases.post("/api/leases", &lease("ended"))).await;
    assert_eq!(
        acquired.status, 503,
        "an acquisition whose commit was ended: {}",
        acquired.body
    );

    let create = json!({"task_data": {"sleep_duration_seconds": 0}});
    let created = with_waiting_commits_ended(&task_url, tasks.post("/api/tasks", &create)).await;
    assert_eq!(
        created.status, 503,
        "a create whose commit was ended: {}",
        created.body
    );
}

/// A command run as the server's user (`postgres` when this test runs as root, as the private
/// servers are).
fn as_server_user(program: std::path::PathBuf) -> std::process::Command {
    use std::os::unix::process::CommandExt as _;
    let mut command = std::process::Command::new(program);
    if nix::unistd::geteuid().is_root() {
        let user = nix::unistd::User::from_name("postgres").unwrap().unwrap();
        command.uid(user.uid.as_raw()).gid(user.gid.as_raw());
    }
    command.stdin(std::process::Stdio::null());
    command
}

/// The zombie of a failover, for real: a primary, a standby copied from it and promoted (a new
/// timeline), and the old primary still taking writes. A service's connections, having seen
/// the new primary, refuse the old one, though it answers and takes writes: what it commits,
/// the new primary never has.
#[tokio::test]
async fn a_former_primary_is_refused_once_its_successor_has_been_seen() {
    use leasehold::server::database::{Database, Timeouts};
    use leasehold_local::postgres::find_server_binaries;
    let old = own_server(&["app"]).await;
    let bindir = find_server_binaries().unwrap();
    let standby_dir = old
        .data_dir()
        .parent()
        .unwrap()
        .join(format!("standby-{}", rand::random::<u32>()));
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::create_dir_all(&standby_dir).unwrap();
        std::fs::set_permissions(&standby_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        if nix::unistd::geteuid().is_root() {
            let user = nix::unistd::User::from_name("postgres").unwrap().unwrap();
            std::os::unix::fs::chown(
                &standby_dir,
                Some(user.uid.as_raw()),
                Some(user.gid.as_raw()),
            )
            .unwrap();
        }
    }
    let copied = as_server_user(bindir.join("pg_basebackup"))
        .args([
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-R",
            "-X",
            "stream",
            // At once, not after a spread checkpoint; a throw-away copy needs no fsync.
            "--checkpoint=fast",
            "--no-sync",
            "-p",
        ])
        .arg(old.port().to_string())
        .arg("-D")
        .arg(&standby_dir)
        .status()
        .unwrap();
    assert!(copied.success(), "pg_basebackup failed");
    let port = tests::free_port();
    let standby_log = tests::log_dir().join(format!("standby-{port}.log"));
    let mut start = as_server_user(bindir.join("postgres"));
    start
        .arg("-D")
        .arg(&standby_dir)
        .args(["-p", &port.to_string()])
        .args([
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "unix_socket_directories=",
        ])
        // A standby needs at least the primary's max_connections (the test servers' 400).
        .args(["-c", "max_connections=400"])
        .current_dir(&standby_dir)
        .stdout(std::process::Stdio::null())
        .stderr(tests::open_log(&standby_log));
    let standby = tests::ChildGuard::spawn(start, nix::sys::signal::Signal::SIGKILL).unwrap();
    let new_url = format!("postgres://postgres@127.0.0.1:{port}/app");
    tests::eventually(Duration::from_secs(30), "the standby to accept", || async {
        <diesel_async::AsyncPgConnection as diesel_async::AsyncConnection>::establish(&new_url)
            .await
            .is_ok()
    })
    .await;
    execute(&new_url, "SELECT pg_promote()").await;

    let url = format!(
        "postgres://postgres@127.0.0.1:{port},127.0.0.1:{}/app",
        old.port()
    );
    let database = Database::new(&url, Timeouts::default(), "").unwrap();
    let mut conn = database.connect().await.unwrap();
    let node = leasehold::server::db::node(&mut conn).await.unwrap();
    assert_eq!(node.server, format!("127.0.0.1:{port}"));
    assert_eq!(node.timeline, Some(2));
    drop(conn);
    // The new primary goes away; the old one answers, takes writes, and is refused.
    drop(standby);
    let refused = database.connect().await.map(drop);
    let message = format!("{refused:?}");
    assert!(message.contains("former primary"), "{message}");
    // A process that has seen nothing newer cannot tell: the fence is what a replica has seen.
    let fresh = Database::new(&url, Timeouts::default(), "").unwrap();
    let mut conn = fresh.connect().await.unwrap();
    let node = leasehold::server::db::node(&mut conn).await.unwrap();
    assert_eq!(node.timeline, Some(1));
    let _ = std::fs::remove_dir_all(&standby_dir);
    tests::discard_log(&standby_log);
}
