//! The `leasehold` command line, run as the real binary against a real stack: its human tables,
//! its `--json` (parsed), its exit codes and messages, and the commands that wait on work.
#![allow(clippy::unwrap_used)]

use std::process::Output;
use std::time::Duration;

use leasehold::tasks::{CreateTask, TaskStatus};
use serde_json::{Value, json};
use tests::{Service, binary, create_new, eventually, fresh_database, new_task};
use tokio::io::AsyncBufReadExt as _;

const TOKEN: &str = "cli-operator-token-0123456789";

/// Runs `leasehold` with `args` against the given services.
async fn leasehold(lease_url: &str, task_url: &str, token: Option<&str>, args: &[&str]) -> Output {
    let mut command = tokio::process::Command::new(binary("leasehold"));
    command
        .args(args)
        .env("LEASE_SERVICE_URL", lease_url)
        .env("TASK_SERVICE_URL", task_url)
        .env_remove("LEASEHOLD_TOKEN")
        // A timed-out or failed test must not leave a `--wait` polling behind it.
        .kill_on_drop(true);
    if let Some(token) = token {
        command.env("LEASEHOLD_TOKEN", token);
    }
    tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .expect("leasehold finished")
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Every JSON document printed, in order.
fn documents(output: &Output) -> Vec<Value> {
    let text = stdout(output);
    serde_json::Deserializer::from_str(&text)
        .into_iter::<Value>()
        .map(|doc| doc.unwrap_or_else(|err| panic!("{err}: {text}")))
        .collect()
}

fn ok(output: &Output, what: &str) {
    assert!(
        output.status.success(),
        "{what}: {:?}\nstdout: {}\nstderr: {}",
        output.status,
        stdout(output),
        stderr(output)
    );
}

#[tokio::test]
async fn leases_acquire_list_show_renew_release_and_revoke_with_tables_and_json() {
    let db = fresh_database().await;
    let tokens = format!("leaseholder+operator:{TOKEN}");
    let leases = Service::lease_service(&db, &[("AUTH_TOKENS", tokens.as_str())]).await;
    let l = leases.base_url();
    let t = "http://127.0.0.1:1";

    let refused = leasehold(
        &l,
        t,
        None,
        &["leases", "acquire", "printer", "--holder", "alice"],
    )
    .await;
    // Exit 6: unauthorized (the statuses are listed in `leasehold --help`).
    assert_eq!(refused.status.code(), Some(6));
    assert!(stderr(&refused).contains("401"), "{}", stderr(&refused));
    assert!(stderr(&refused).contains("unauthorized"));

    let acquired = leasehold(
        &l,
        t,
        Some(TOKEN),
        &[
            "leases", "acquire", "printer", "--holder", "alice", "--ttl", "60", "--json",
        ],
    )
    .await;
    ok(&acquired, "acquire");
    let lease = documents(&acquired).remove(0);
    assert_eq!(lease["status"], "active");
    assert_eq!(lease["ttlSeconds"], 60);
    let secret = lease["secret"].as_str().unwrap().to_owned();
    let id = lease["id"].as_i64().unwrap().to_string();

    let table = leasehold(&l, t, None, &["leases", "list"]).await;
    ok(&table, "list");
    let text = stdout(&table);
    let header = text.lines().next().unwrap();
    for column in ["ID", "RESOURCE", "HOLDER", "FENCE", "STATUS", "LEFT"] {
        assert!(header.contains(column), "{text}");
    }
    assert!(text.contains("printer") && text.contains("alice") && text.contains("active"));

    let listed = leasehold(
        &l,
        t,
        None,
        &["leases", "list", "--status", "active", "--json"],
    )
    .await;
    assert_eq!(documents(&listed)[0]["leases"][0]["resource"], "printer");
    let id_arg = id.as_str();
    let shown = leasehold(&l, t, None, &["leases", "show", id_arg, "--json"]).await;
    assert_eq!(documents(&shown)[0]["lease"]["holder"], "alice");

    let secret_arg = secret.as_str();
    let renewed = leasehold(
        &l,
        t,
        Some(TOKEN),
        &[
            "leases", "renew", "printer", "--holder", "alice", "--secret", secret_arg, "--json",
        ],
    )
    .await;
    ok(&renewed, "renew");
    assert!(documents(&renewed)[0]["renewedAt"].is_string());

    let not_holder = leasehold(
        &l,
        t,
        Some(TOKEN),
        &["leases", "release", "printer", "--holder", "bob"],
    )
    .await;
    // Exit 4: a conflict, refused because of how things stand.
    assert_eq!(not_holder.status.code(), Some(4));
    assert!(
        stderr(&not_holder).contains("not_holder"),
        "{}",
        stderr(&not_holder)
    );

    let released = leasehold(
        &l,
        t,
        Some(TOKEN),
        &[
            "leases", "release", "printer", "--holder", "alice", "--secret", secret_arg, "--json",
        ],
    )
    .await;
    ok(&released, "release");
    assert_eq!(documents(&released)[0]["status"], "released");

    let other = leasehold(
        &l,
        t,
        Some(TOKEN),
        &[
            "leases", "acquire", "scanner", "--holder", "carol", "--json",
        ],
    )
    .await;
    let other_id = documents(&other)[0]["id"].as_i64().unwrap().to_string();
    let revoked = leasehold(
        &l,
        t,
        Some(TOKEN),
        &["leases", "revoke", &other_id, "--json"],
    )
    .await;
    ok(&revoked, "revoke");
    assert_eq!(documents(&revoked)[0]["status"], "revoked");

    // Newest first; an ended lease has no time left, rather than a zero that reads as one
    // about to run out.
    let table = leasehold(&l, t, None, &["leases", "list"]).await;
    let rows = table_rows(&table);
    assert_eq!(
        rows.iter().map(|r| r[1].as_str()).collect::<Vec<_>>(),
        ["scanner", "printer"],
        "{rows:?}"
    );
    assert_eq!((rows[0][4].as_str(), rows[0][5].as_str()), ("revoked", "-"));
    assert_eq!(
        (rows[1][4].as_str(), rows[1][5].as_str()),
        ("released", "-")
    );

    // A list cut short says so, and how to go on from where it stopped.
    let plotter = leasehold(
        &l,
        t,
        Some(TOKEN),
        &["leases", "acquire", "plotter", "--holder", "dave"],
    )
    .await;
    ok(&plotter, "acquire plotter");
    let first = leasehold(&l, t, None, &["leases", "list", "--limit", "2"]).await;
    ok(&first, "list --limit 2");
    let rows = table_rows(&first);
    assert_eq!(
        rows.iter().map(|r| r[1].as_str()).collect::<Vec<_>>(),
        ["plotter", "scanner"]
    );
    assert!(rows[0][5].ends_with('s') && rows[0][5] != "-", "{rows:?}");
    let hint = stderr(&first);
    assert!(hint.contains("showing 2 leases, newest first"), "{hint}");
    let cursor = hint
        .split("--cursor ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no cursor in {hint:?}"));
    let rest = leasehold(
        &l,
        t,
        None,
        &["leases", "list", "--limit", "2", "--cursor", cursor],
    )
    .await;
    ok(&rest, "list --cursor");
    let rows = table_rows(&rest);
    assert_eq!(
        rows.iter().map(|r| r[1].as_str()).collect::<Vec<_>>(),
        ["printer"]
    );
    assert!(
        !stderr(&rest).contains("--cursor"),
        "the last page: {}",
        stderr(&rest)
    );
}

/// The data rows of a table printed on standard output, split into cells.
fn table_rows(output: &Output) -> Vec<Vec<String>> {
    ok(output, "a table");
    stdout(output)
        .lines()
        .skip(1)
        .map(|line| line.split_whitespace().map(str::to_owned).collect())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_are_created_watched_to_the_end_listed_shown_tailed_retried_and_cancelled() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let tasks = Service::task_service(&task_db, &leases.base_url(), &[]).await;
    // Polling, not waiting in task-service: the tail below pauses the worker to see a task
    // pending, and a paused worker's waiting claim would still take it (see `docs/src/queues.md`).
    let worker = Service::worker(
        &tasks.base_url(),
        &[
            ("WORKER_CONCURRENCY", "8"),
            ("POLL_MAX_MS", "100"),
            ("CLAIM_WAIT_MS", "0"),
        ],
    )
    .await;
    let (l, t) = (leases.base_url(), tasks.base_url());

    let created = leasehold(
        &l,
        &t,
        None,
        &[
            "tasks",
            "create",
            "--count",
            "40",
            "--queue",
            "cli",
            "--data",
            r#"{"sleep_duration_seconds": 0}"#,
            "--wait",
            "--json",
        ],
    )
    .await;
    ok(&created, "create --wait");
    let docs = documents(&created);
    assert_eq!(docs[0].as_array().unwrap().len(), 40, "the created tasks");
    assert_eq!(
        docs[1]["succeeded"], 40,
        "the queue's final counts: {}",
        docs[1]
    );
    let progress = stderr(&created);
    assert!(progress.contains("created 40/40"), "{progress}");
    assert!(progress.contains("succeeded 40"), "{progress}");
    // Neither output is a terminal here: plain lines, no escapes to redraw them.
    assert!(
        !progress.contains('\x1b') && !stdout(&created).contains('\x1b'),
        "{progress:?}"
    );

    // Without --data, what is created is work the worker finishes.
    let defaults = leasehold(
        &l,
        &t,
        None,
        &[
            "tasks", "create", "--count", "2", "--queue", "defaults", "--wait", "--json",
        ],
    )
    .await;
    ok(&defaults, "create with the defaults");
    let docs = documents(&defaults);
    assert_eq!(
        docs[1]["succeeded"], 2,
        "the defaults' final counts: {}",
        docs[1]
    );

    let listed = leasehold(&l, &t, None, &["tasks", "list", "--queue", "cli", "--json"]).await;
    let listed = documents(&listed).remove(0)["tasks"].take();
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 40);
    assert!(listed.iter().all(|t| t["status"] == "succeeded"));
    let ids: Vec<i64> = listed.iter().map(|t| t["id"].as_i64().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] > w[1]), "newest first: {ids:?}");
    let table = leasehold(
        &l,
        &t,
        None,
        &["tasks", "list", "--queue", "cli", "--limit", "5"],
    )
    .await;
    let text = stdout(&table);
    assert_eq!(text.lines().count(), 6, "a header and five rows: {text}");
    assert!(text.lines().next().unwrap().contains("PROCESSOR"));
    assert_eq!(table_rows(&table)[0][0], ids[0].to_string(), "{text}");
    let hint = stderr(&table);
    assert!(hint.contains("showing 5 of 40 tasks"), "{hint}");
    assert!(hint.contains(&format!("--cursor {}", ids[4])), "{hint}");
    assert!(hint.contains("--all"), "{hint}");
    // `--all` follows the cursors to the end, whatever the page; `--sort oldest` turns the
    // order round; `-o wide` adds columns; `-o yaml` is the same answer as `-o json`.
    let all = leasehold(
        &l,
        &t,
        None,
        &[
            "tasks", "list", "--queue", "cli", "--limit", "7", "--all", "--sort", "oldest", "-o",
            "json",
        ],
    )
    .await;
    let all = documents(&all).remove(0);
    let oldest_first: Vec<i64> = all["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_i64().unwrap())
        .collect();
    let mut expected = ids.clone();
    expected.reverse();
    assert_eq!(oldest_first, expected, "every task, oldest first");
    assert!(all["nextCursor"].is_null(), "{all}");
    let wide = leasehold(
        &l,
        &t,
        None,
        &[
            "tasks", "list", "--queue", "cli", "--limit", "1", "-o", "wide",
        ],
    )
    .await;
    let header = stdout(&wide).lines().next().unwrap_or_default().to_owned();
    for column in ["PROCESSOR", "FENCE", "STARTED AT", "PROCESSED AT"] {
        assert!(header.contains(column), "{header}");
    }
    let yaml = leasehold(
        &l,
        &t,
        None,
        &[
            "tasks", "list", "--queue", "cli", "--limit", "3", "-o", "yaml",
        ],
    )
    .await;
    ok(&yaml, "list as YAML");
    let yaml: Value = yaml_serde::from_str(&stdout(&yaml)).expect("YAML");
    let json = leasehold(
        &l,
        &t,
        None,
        &[
            "tasks", "list", "--queue", "cli", "--limit", "3", "-o", "json",
        ],
    )
    .await;
    assert_eq!(yaml, documents(&json).remove(0));
    // Colour only on a terminal (a pseudo-terminal from `script`), and not with NO_COLOR; the
    // runs above, through pipes, have none.
    assert!(!stdout(&table).contains('\x1b'), "{}", stdout(&table));
    let on_terminal = |no_color: Option<&'static str>| {
        let mut command = tokio::process::Command::new("script");
        let line = format!(
            "{} tasks list --queue cli --limit 3",
            binary("leasehold").display()
        );
        command
            .args(["-qec", line.as_str(), "/dev/null"])
            .env("TASK_SERVICE_URL", &t)
            .env_remove("NO_COLOR")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        if let Some(value) = no_color {
            command.env("NO_COLOR", value);
        }
        async move { command.output().await.unwrap() }
    };
    let coloured = on_terminal(None).await;
    ok(&coloured, "list on a terminal");
    assert!(
        stdout(&coloured).contains("\x1b[32msucceeded\x1b[0m"),
        "{:?}",
        stdout(&coloured)
    );
    let plain = on_terminal(Some("1")).await;
    ok(&plain, "list on a terminal with NO_COLOR");
    assert!(
        stdout(&plain).contains("succeeded") && !stdout(&plain).contains('\x1b'),
        "{:?}",
        stdout(&plain)
    );
    let id = ids[0].to_string();
    let shown = leasehold(&l, &t, None, &["tasks", "show", &id]).await;
    assert!(stdout(&shown).contains("succeeded"), "{}", stdout(&shown));
    // Scripts tell failures apart by the exit status `leasehold --help` lists: 3 for what does
    // not exist, 7 for a service that cannot be reached, 2 for a wrong command line.
    let help = leasehold(&l, &t, None, &["--help"]).await;
    assert!(
        stdout(&help).contains("3  not found (404)"),
        "{}",
        stdout(&help)
    );
    let missing = leasehold(&l, &t, None, &["tasks", "show", "999999999"]).await;
    assert_eq!(missing.status.code(), Some(3), "{}", stderr(&missing));
    let unreachable = leasehold(&l, "http://127.0.0.1:1", None, &["tasks", "show", &id]).await;
    assert_eq!(
        unreachable.status.code(),
        Some(7),
        "{}",
        stderr(&unreachable)
    );
    let usage = leasehold(&l, &t, None, &["tasks", "show", &id, "--no-such-flag"]).await;
    assert_eq!(usage.status.code(), Some(2), "{}", stderr(&usage));

    // A task that fails for good is dead; retry puts it back with fresh attempts.
    // The test's own setup goes through the typed client; what is under test is the CLI.
    let client = tasks.task_client();
    let doomed = CreateTask {
        queue: Some("doomed".to_owned()),
        ..new_task(json!({"sleep_duration_seconds": 0, "fail": "permanent"}))
    };
    let dead_id = create_new(&client, &doomed).await.id;
    eventually(Duration::from_secs(20), "the task dead", || async {
        client
            .task(dead_id)
            .await
            .is_ok_and(|task| task.status == TaskStatus::Dead)
    })
    .await;
    let retried = leasehold(
        &l,
        &t,
        None,
        &["tasks", "retry", &dead_id.to_string(), "--json"],
    )
    .await;
    ok(&retried, "retry");
    let retried = documents(&retried).remove(0);
    assert_eq!(
        (retried["status"].as_str(), retried["attempts"].as_i64()),
        (Some("pending"), Some(0))
    );
    let not_dead = leasehold(&l, &t, None, &["tasks", "retry", &id]).await;
    assert!(
        stderr(&not_dead).contains("not_dead"),
        "{}",
        stderr(&not_dead)
    );

    // Cancel a task due next year.
    let never = CreateTask {
        scheduled_at: Some("2099-01-01T00:00:00Z".parse().unwrap()),
        ..new_task(json!({}))
    };
    let later_id = create_new(&client, &never).await.id.to_string();
    let cancelled = leasehold(&l, &t, None, &["tasks", "cancel", &later_id, "--json"]).await;
    assert_eq!(documents(&cancelled)[0]["status"], "cancelled");

    // Tail: a task created while it runs shows up, then again when it has succeeded. Nothing
    // rests on timing: the tail is known to be watching once a task created after its start
    // shows up (it prints only what comes after it started), and the worker is held until the
    // tail has shown the new task pending.
    let mut tail = tokio::process::Command::new(binary("leasehold"))
        .args(["tasks", "tail", "--interval-ms", "200", "--json"])
        .env("LEASE_SERVICE_URL", &l)
        .env("TASK_SERVICE_URL", &t)
        .env_remove("LEASEHOLD_TOKEN")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(tail.stdout.take().unwrap()).lines();
    let mut tail_statuses = async |id: i64, timeout: Duration| -> Option<String> {
        let next = async {
            while let Some(line) = lines.next_line().await.unwrap() {
                let task: Value = serde_json::from_str(&line).unwrap();
                if task["id"].as_i64() == Some(id) {
                    return task["status"].as_str().map(str::to_owned);
                }
            }
            None
        };
        tokio::time::timeout(timeout, next).await.ok().flatten()
    };
    let mut watching = false;
    for _ in 0..30 {
        let marker = create_new(&client, &never).await.id;
        if tail_statuses(marker, Duration::from_secs(2))
            .await
            .is_some()
        {
            watching = true;
            break;
        }
    }
    assert!(watching, "the tail never showed a new task");
    worker.pause();
    let fresh_id = create_new(&client, &new_task(json!({"sleep_duration_seconds": 1})))
        .await
        .id;
    let mut seen = Vec::new();
    seen.extend(tail_statuses(fresh_id, Duration::from_secs(30)).await);
    worker.resume();
    while seen.last().is_none_or(|status| status != "succeeded") {
        match tail_statuses(fresh_id, Duration::from_secs(60)).await {
            Some(status) => seen.push(status),
            None => break,
        }
    }
    assert_eq!(
        seen.first().map(String::as_str),
        Some("pending"),
        "{seen:?}"
    );
    assert_eq!(
        seen.last().map(String::as_str),
        Some("succeeded"),
        "{seen:?}"
    );
    tail.kill().await.unwrap();

    // `tasks show --watch` prints the task again when it changes, and ends once it is final: a
    // task due in a year, cancelled while watched.
    let waiting = create_new(&client, &never).await.id;
    let mut watch = tokio::process::Command::new(binary("leasehold"))
        .args([
            "tasks",
            "show",
            &waiting.to_string(),
            "--watch",
            "--watch-interval",
            "0.2",
            "-o",
            "json",
        ])
        .env("TASK_SERVICE_URL", &t)
        .env_remove("LEASEHOLD_TOKEN")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut watched = tokio::io::BufReader::new(watch.stdout.take().unwrap()).lines();
    let mut read_until = async |needle: &str| {
        let found = async {
            while let Some(line) = watched.next_line().await.unwrap() {
                if line.contains(needle) {
                    return true;
                }
            }
            false
        };
        tokio::time::timeout(Duration::from_secs(30), found)
            .await
            .unwrap_or(false)
    };
    assert!(read_until("\"pending\"").await, "the first print");
    client.cancel(waiting).await.unwrap();
    assert!(
        read_until("\"cancelled\"").await,
        "printed again once cancelled"
    );
    // A final status changes no more: the watch ends by itself, as a success.
    let ended = tokio::time::timeout(Duration::from_secs(30), watch.wait()).await;
    assert!(
        matches!(&ended, Ok(Ok(status)) if status.success()),
        "the watch went on past the task's end: {ended:?}"
    );
}

#[tokio::test]
async fn the_generator_is_started_stopped_and_shown() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let tasks = Service::task_service(&task_db, &leases.base_url(), &[]).await;
    let _generator = Service::generator(
        &tasks.base_url(),
        &leases.base_url(),
        "cli-gen",
        &[
            ("GENERATOR_RETRY_INTERVAL_SECONDS", "0.2"),
            ("GENERATOR_SETTINGS_POLL_MS", "200"),
        ],
    )
    .await;
    let (l, t) = (leases.base_url(), tasks.base_url());
    let started = leasehold(
        &l,
        &t,
        None,
        &["generator", "start", "--rate", "4", "--json"],
    )
    .await;
    ok(&started, "start");
    let status = documents(&started).remove(0);
    assert_eq!(status["status"], "STARTED");
    assert_eq!(status["settings"]["ratePerSecond"], 4.0);
    eventually(
        Duration::from_secs(15),
        "the generator to lead and produce",
        || {
            let (l, t) = (l.clone(), t.clone());
            async move {
                let shown = leasehold(&l, &t, None, &["generator", "status", "--json"]).await;
                let status = documents(&shown).remove(0);
                status["leader"]["holder"] == "cli-gen" && status["produced"].as_i64() > Some(0)
            }
        },
    )
    .await;
    let table = leasehold(&l, &t, None, &["generator", "status"]).await;
    let text = stdout(&table);
    assert!(
        text.contains("STARTED") && text.contains("cli-gen"),
        "{text}"
    );
    let stopped = leasehold(&l, &t, None, &["generator", "stop", "--json"]).await;
    assert_eq!(documents(&stopped)[0]["status"], "STOPPED");
}

#[tokio::test]
async fn queues_are_paused_resumed_listed_and_shown() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let tasks = Service::task_service(&task_db, &leases.base_url(), &[]).await;
    let (l, t) = (leases.base_url(), tasks.base_url());
    let created = leasehold(
        &l,
        &t,
        None,
        &[
            "tasks", "create", "--queue", "mail b", "--key", "acme", "--json",
        ],
    )
    .await;
    ok(&created, "create");
    assert_eq!(documents(&created)[0][0]["concurrencyKey"], "acme");

    let paused = leasehold(&l, &t, None, &["queues", "pause", "mail b", "--json"]).await;
    ok(&paused, "pause");
    let state = documents(&paused).remove(0);
    assert_eq!(
        (
            &state["queue"],
            &state["paused"],
            &state["counts"]["pending"]
        ),
        (&json!("mail b"), &json!(true), &json!(1)),
        "{state}"
    );
    let listed = leasehold(&l, &t, None, &["queues", "list"]).await;
    ok(&listed, "list");
    let text = stdout(&listed);
    assert!(text.contains("mail b") && text.contains("paused"), "{text}");
    let claim = tasks
        .post(
            "/api/tasks/next",
            &json!({"processor": "w", "queue": "mail b"}),
        )
        .await;
    assert_eq!(
        claim.status, 200,
        "nothing claimed while paused: {:?}",
        claim.body
    );

    let limited = leasehold(
        &l,
        &t,
        None,
        &[
            "queues",
            "limit",
            "mail b",
            "--concurrency",
            "2",
            "--key-concurrency",
            "1",
            "--json",
        ],
    )
    .await;
    ok(&limited, "limit");
    assert_eq!(documents(&limited)[0]["concurrencyLimit"], 2);
    assert_eq!(documents(&limited)[0]["keyConcurrencyLimit"], 1);
    let listed = leasehold(&l, &t, None, &["queues", "list"]).await;
    assert!(
        stdout(&listed).contains("LIMIT") && stdout(&listed).contains("KEY LIMIT"),
        "{}",
        stdout(&listed)
    );
    // Queues page by name: one at a time with a hint to go on, or every page with --all.
    ok(
        &leasehold(&l, &t, None, &["queues", "pause", "alpha"]).await,
        "pause alpha",
    );
    let one = leasehold(&l, &t, None, &["queues", "list", "--limit", "1"]).await;
    ok(&one, "list --limit 1");
    let hint = stderr(&one);
    assert!(
        stdout(&one).contains("alpha") && !stdout(&one).contains("mail b"),
        "{}",
        stdout(&one)
    );
    assert!(
        hint.contains("--cursor alpha") && hint.contains("--all"),
        "{hint}"
    );
    let rest = leasehold(
        &l,
        &t,
        None,
        &["queues", "list", "--limit", "1", "--cursor", "alpha"],
    )
    .await;
    assert!(stdout(&rest).contains("mail b"), "{}", stdout(&rest));
    let all = leasehold(
        &l,
        &t,
        None,
        &["queues", "list", "--limit", "1", "--all", "--json"],
    )
    .await;
    ok(&all, "list --all");
    let names: Vec<Value> = documents(&all)[0]["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["queue"].clone())
        .collect();
    assert_eq!(names, [json!("alpha"), json!("mail b")]);
    assert_eq!(documents(&all)[0]["nextCursor"], Value::Null);
    let resumed = leasehold(&l, &t, None, &["queues", "resume", "mail b", "--json"]).await;
    ok(&resumed, "resume");
    assert_eq!(documents(&resumed)[0]["paused"], false);
    let shown = leasehold(&l, &t, None, &["queues", "show", "mail b", "--json"]).await;
    assert_eq!(documents(&shown)[0]["paused"], false);
    let claim = tasks
        .post(
            "/api/tasks/next",
            &json!({"processor": "w", "queue": "mail b"}),
        )
        .await;
    assert_eq!(claim.status, 202, "{:?}", claim.body);
}

#[tokio::test]
async fn schedules_are_created_listed_paused_resumed_and_deleted() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let tasks = Service::task_service(&task_db, &leases.base_url(), &[]).await;
    let (l, t) = (leases.base_url(), tasks.base_url());
    let create = [
        "schedules",
        "create",
        "nightly report",
        "--cron",
        "0 3 * * *",
        "--timezone",
        "Europe/Paris",
        "--data",
        r#"{"report": true}"#,
        "--queue",
        "reports",
        "--catch-up",
        "none",
        "--json",
    ];
    let created = leasehold(&l, &t, None, &create).await;
    ok(&created, "create");
    let schedule = documents(&created).remove(0);
    assert_eq!(
        (
            &schedule["name"],
            &schedule["timezone"],
            &schedule["taskData"],
            &schedule["catchUp"]
        ),
        (
            &json!("nightly report"),
            &json!("Europe/Paris"),
            &json!({"report": true}),
            &json!("none")
        ),
        "{schedule}"
    );
    let again = leasehold(&l, &t, None, &create).await;
    assert!(!again.status.success(), "a taken name is refused");
    assert!(
        stderr(&again).contains("schedule_exists"),
        "{}",
        stderr(&again)
    );
    // Without --data, a schedule's tasks carry what `tasks create` sends, which the local
    // stack's workers run; `{}` made every tick a dead task.
    let plain = leasehold(
        &l,
        &t,
        None,
        &[
            "schedules",
            "create",
            "plain",
            "--cron",
            "0 3 * * *",
            "--json",
        ],
    )
    .await;
    ok(&plain, "create without --data");
    assert_eq!(
        documents(&plain)[0]["taskData"],
        json!({"sleep_duration_seconds": 1})
    );
    let mut replace = create.to_vec();
    replace[4] = "30 4 * * *";
    replace.push("--replace");
    let replaced = leasehold(&l, &t, None, &replace).await;
    ok(&replaced, "replace");
    assert_eq!(documents(&replaced)[0]["cron"], "30 4 * * *");

    let listed = leasehold(&l, &t, None, &["schedules", "list"]).await;
    ok(&listed, "list");
    let text = stdout(&listed);
    assert!(
        text.contains("nightly report") && text.contains("30 4 * * *") && text.contains("running"),
        "{text}"
    );
    let paused = leasehold(&l, &t, None, &["schedules", "pause", "nightly report"]).await;
    ok(&paused, "pause");
    assert!(stdout(&paused).contains("paused"), "{}", stdout(&paused));
    let resumed = leasehold(
        &l,
        &t,
        None,
        &["schedules", "resume", "nightly report", "--json"],
    )
    .await;
    ok(&resumed, "resume");
    assert!(documents(&resumed)[0]["nextTickAt"].is_string());
    let bad = leasehold(
        &l,
        &t,
        None,
        &["schedules", "create", "bad", "--cron", "every day"],
    )
    .await;
    assert!(stderr(&bad).contains("invalid_cron"), "{}", stderr(&bad));
    let deleted = leasehold(&l, &t, None, &["schedules", "delete", "nightly report"]).await;
    ok(&deleted, "delete");
    let shown = leasehold(&l, &t, None, &["schedules", "show", "nightly report"]).await;
    assert!(
        stderr(&shown).contains("schedule_not_found"),
        "{}",
        stderr(&shown)
    );
}

#[tokio::test]
async fn completions_load_into_bash_and_name_every_command() {
    let script = leasehold(
        "http://127.0.0.1:1",
        "http://127.0.0.1:1",
        None,
        &["completion", "bash"],
    )
    .await;
    ok(&script, "completion bash");
    let script = stdout(&script);
    for command in [
        "leases",
        "tasks",
        "queues",
        "schedules",
        "generator",
        "--output",
    ] {
        assert!(script.contains(command), "{command} is not completed");
    }
    // Bash itself loads it and registers the completion (no service is needed).
    let mut loaded = tokio::process::Command::new("bash")
        .args(["--norc", "-c", "source /dev/stdin && complete -p leasehold"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    {
        use tokio::io::AsyncWriteExt as _;
        let mut input = loaded.stdin.take().unwrap();
        input.write_all(script.as_bytes()).await.unwrap();
    }
    let loaded = loaded.wait_with_output().await.unwrap();
    let registered = String::from_utf8_lossy(&loaded.stdout);
    assert!(
        loaded.status.success() && registered.contains("leasehold"),
        "{registered} {}",
        String::from_utf8_lossy(&loaded.stderr)
    );
    for shell in ["zsh", "fish"] {
        let script = leasehold(
            "http://127.0.0.1:1",
            "http://127.0.0.1:1",
            None,
            &["completion", shell],
        )
        .await;
        ok(&script, shell);
        assert!(stdout(&script).contains("schedules"), "{shell}");
    }
}
