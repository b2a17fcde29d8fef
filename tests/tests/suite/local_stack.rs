//! The README's "run the stack" command, run for real: `leasehold-local` starts a private
//! PostgreSQL (or uses `DATABASE_URL`), migrates, starts lease-service, task-service, workers and
//! generators, says when all are ready, and stops everything on Ctrl-C, clients first.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use leasehold::generator::StartGenerator;
use leasehold::tasks::TaskStatus;
use leasehold_local::process::pid_alive;
use leasehold_local::stack::{
    GENERATOR_DEFAULT_RATE_PER_SECOND, GENERATOR_DEFAULT_SLEEP_SECONDS, READY_BANNER,
};
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tests::{
    ChildGuard, binary, create_new, eventually, free_port_block, fresh_database, lease_client,
    new_task, task_client,
};

/// The banner's last line: once it is there, the whole banner is.
const BANNER_END: &str = "Ctrl-C to stop.";

/// A running `leasehold-local`, its stdout and stderr (its children's too) in one file. Dropping
/// it kills it and everything it started.
struct Stack {
    child: ChildGuard,
    output: PathBuf,
}

impl Drop for Stack {
    fn drop(&mut self) {
        tests::discard_log(&self.output);
    }
}

impl Stack {
    fn start(env: &[(&str, String)]) -> Stack {
        let bin_dir = binary("lease-service").parent().unwrap().to_owned();
        let output = tests::log_dir().join(format!(
            "leasehold-local-{}-{}.log",
            port_of(env, "LEASE_SERVICE_PORT"),
            rand::random::<u32>()
        ));
        let file = tests::open_log(&output);
        let mut command = Command::new(binary("leasehold-local"));
        command
            .env("LEASEHOLD_NO_BUILD", "true")
            .env("LEASEHOLD_BIN_DIR", bin_dir)
            .env_remove("DATABASE_URL")
            .env_remove("RUST_LOG")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file);
        // Should this test process die, leasehold-local gets a Ctrl-C of its own.
        let child = ChildGuard::spawn(command, Signal::SIGTERM).unwrap();
        Stack { child, output }
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.output).unwrap_or_default()
    }

    fn tail(&self) -> String {
        let text = self.output();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }

    /// Waits until leasehold-local says that every service is ready; its banner.
    async fn wait_ready(&mut self) -> String {
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let text = self.output();
            if let Some(start) = text.find(READY_BANNER)
                && let Some(end) = text[start..].find(BANNER_END)
            {
                return text[start..start + end].to_owned();
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "leasehold-local exited ({status}) before it was ready:\n{}",
                    self.tail()
                );
            }
            assert!(
                Instant::now() < deadline,
                "the stack was not ready after 180 s:\n{}",
                self.tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Ctrl-C, and its exit code once it has stopped everything.
    async fn interrupt_and_wait(&mut self) -> i32 {
        self.child.signal(Signal::SIGINT);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // Its last line says it is done: a log ending at "stopping PostgreSQL" read
                // as a hang to a newcomer.
                assert!(
                    self.tail()
                        .contains("stopped; nothing of the stack is left running"),
                    "no final line:\n{}",
                    self.tail()
                );
                return status.code().unwrap_or(-1);
            }
            assert!(
                Instant::now() < deadline,
                "leasehold-local did not stop after Ctrl-C:\n{}",
                self.tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Ports for one stack, one block outside the ephemeral range: PostgreSQL, lease-service,
/// task-service, up to three workers' metrics and two generators' (replicas number their ports
/// from their kind's first).
fn ports(home: &Path) -> Vec<(&'static str, String)> {
    let base = free_port_block(8);
    vec![
        ("LEASEHOLD_HOME", home.display().to_string()),
        ("LEASEHOLD_PG_PORT", base.to_string()),
        ("LEASE_SERVICE_PORT", (base + 1).to_string()),
        ("TASK_SERVICE_PORT", (base + 2).to_string()),
        ("WORKER_METRICS_PORT", (base + 3).to_string()),
        ("LEASEHOLD_WORKERS", "1".to_owned()),
        ("GENERATOR_METRICS_PORT", (base + 6).to_string()),
        ("LEASEHOLD_GENERATORS", "2".to_owned()),
    ]
}

fn set(env: &mut Vec<(&'static str, String)>, name: &'static str, value: &str) {
    env.retain(|(k, _)| *k != name);
    env.push((name, value.to_owned()));
}

fn port_of(env: &[(&str, String)], name: &str) -> u16 {
    env.iter()
        .find(|(k, _)| *k == name)
        .unwrap()
        .1
        .parse()
        .unwrap()
}

/// Rows of `table` as JSON objects, in id order.
async fn rows(db: &str, table: &str) -> Vec<Value> {
    tests::snapshot(db, table)
        .await
        .iter()
        .map(|row| serde_json::from_str(row).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn runs_the_stack_on_a_private_postgres_and_stops_it_all_on_ctrl_c() {
    let home = std::env::temp_dir().join(format!("leasehold-stack-test-{}", std::process::id()));
    // Given an OTLP endpoint, every process of the stack exports its spans there.
    let receiver = tests::otlp::OtlpReceiver::start();
    let mut env = ports(&home);
    env.push(("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint()));
    env.push(("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()));
    let [pg_port, lease_port, task_port, worker_port] = [
        "LEASEHOLD_PG_PORT",
        "LEASE_SERVICE_PORT",
        "TASK_SERVICE_PORT",
        "WORKER_METRICS_PORT",
    ]
    .map(|name| port_of(&env, name));
    let mut stack = Stack::start(&env);
    stack.wait_ready().await;
    assert!(
        home.join("pg/data/PG_VERSION").exists(),
        "data kept under LEASEHOLD_HOME"
    );
    let leases = lease_client(&format!("http://127.0.0.1:{lease_port}"), None);
    let (_, new) = leases
        .acquire_proving("stack", "test", None, None)
        .await
        .unwrap();
    assert!(new, "a new lease (201)");
    let tasks = task_client(&format!("http://127.0.0.1:{task_port}"), None);

    // The stack's worker does a task created through the stack's task-service.
    let id = create_new(&tasks, &new_task(json!({"sleep_duration_seconds": 0})))
        .await
        .id;
    eventually(
        Duration::from_secs(60),
        "the stack's worker doing the task",
        || async { tasks.task(id).await.unwrap().status == TaskStatus::Succeeded },
    )
    .await;

    // One of the stack's two generator replicas produces once started.
    let started = tasks.start_generator(&StartGenerator::default()).await;
    assert!(started.unwrap().is_running);
    eventually(
        Duration::from_secs(60),
        "the stack's generator producing",
        || async {
            let status = tasks.generator_status().await.unwrap();
            status.produced > 0 && status.producing
        },
    )
    .await;

    assert_eq!(stack.interrupt_and_wait().await, 0, "{}", stack.tail());
    let services: std::collections::HashSet<String> = receiver
        .spans()
        .into_iter()
        .map(|span| span.service)
        .collect();
    for service in ["lease-service", "task-service", "worker", "task-generator"] {
        assert!(
            services.contains(service),
            "no spans from {service}: {services:?}"
        );
    }
    // Nothing it started is left listening.
    for port in [pg_port, lease_port, task_port, worker_port] {
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
            "port {port} still open"
        );
    }

    // Data is kept between runs: the lease taken in the first run is still there.
    let mut again = Stack::start(&env);
    again.wait_ready().await;
    let leases: Value = reqwest::get(format!("http://127.0.0.1:{lease_port}/api/leases"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        leases["leases"]
            .as_array()
            .unwrap()
            .iter()
            .any(|lease| lease["resource"] == "stack"),
        "{leases}"
    );

    // Killed with SIGKILL, it has no chance to stop anything; still nothing it started stays,
    // PostgreSQL included.
    let mut started = tests::descendants(again.child.id());
    let postmaster = std::fs::read_to_string(home.join("pg/data/postmaster.pid")).unwrap();
    started.push(postmaster.lines().next().unwrap().trim().parse().unwrap());
    again.child.kill().unwrap();
    again.child.wait().unwrap();
    eventually(
        Duration::from_secs(60),
        "every process of a killed leasehold-local to exit",
        || {
            let left: Vec<u32> = started.iter().copied().filter(|&p| pid_alive(p)).collect();
            async move { left.is_empty() }
        },
    )
    .await;
    let _ = std::fs::remove_dir_all(&home);
}

#[tokio::test]
async fn uses_database_url_when_given() {
    let db = fresh_database().await;
    let mut env = ports(Path::new("/nonexistent/never-created"));
    env.push(("DATABASE_URL", db.clone()));
    let lease_port = port_of(&env, "LEASE_SERVICE_PORT");
    let task_port = port_of(&env, "TASK_SERVICE_PORT");
    let mut stack = Stack::start(&env);
    stack.wait_ready().await;
    let leases = lease_client(&format!("http://127.0.0.1:{lease_port}"), None);
    let (_, new) = leases
        .acquire_proving("stack", "test", None, None)
        .await
        .unwrap();
    assert!(new, "a new lease (201)");
    let tasks = task_client(&format!("http://127.0.0.1:{task_port}"), None);
    let rows = tests::snapshot(&db, "leasehold_leases.leases").await;
    assert!(
        rows.iter().any(|row| row.contains(r#""resource":"stack""#)),
        "the lease landed in the given database: {rows:?}"
    );
    // task-service migrated its own schema of the same database, and works.
    create_new(&tasks, &new_task(json!({"sleep_duration_seconds": 0}))).await;
    assert_eq!(
        tests::snapshot(&db, "leasehold_tasks.tasks").await.len(),
        1,
        "the task landed in the given database"
    );
    assert_eq!(stack.interrupt_and_wait().await, 0, "{}", stack.tail());
}

/// A port another process holds, answering 200 to anything as a stranger's service would: the
/// launcher refuses at once, before it starts anything on it, and says how to free the port or
/// choose another. It used to spawn its own lease-service (which failed to bind), take the
/// stranger's 200 for its readiness, start task-service against the stranger and print the
/// banner.
#[tokio::test]
async fn a_port_another_process_holds_is_refused_before_anything_starts() {
    let db = fresh_database().await;
    let mut env = ports(Path::new("/nonexistent/never-created"));
    env.push(("DATABASE_URL", db));
    let lease_port = port_of(&env, "LEASE_SERVICE_PORT");
    let stranger = std::net::TcpListener::bind(("127.0.0.1", lease_port)).unwrap();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for mut socket in stranger.incoming().flatten() {
            let _ = socket.read(&mut [0_u8; 1024]);
            let body = r#"{"status":"ready"}"#;
            let _ = write!(
                socket,
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let mut stack = Stack::start(&env);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = stack.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "still running with its port taken:\n{}",
            stack.tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let output = stack.output();
    assert_eq!(status.code(), Some(1), "{output}");
    assert!(
        output.contains(&format!("sport = :{lease_port}"))
            && output.contains("--lease-service-port PORT"),
        "names how to free the port or choose another:\n{output}"
    );
    assert!(!output.contains(READY_BANNER), "{output}");
    assert!(
        !output.contains("starting lease-service") && !output.contains("starting task-service"),
        "nothing was started on a taken port:\n{output}"
    );
}

/// Once ready, leasehold-local says where the dashboard is and how to run the CLI it built;
/// written to a file, neither its log nor its children's carry terminal colours.
#[tokio::test]
async fn ready_banner_names_the_dashboard_and_the_cli_and_files_get_no_colours() {
    let db = fresh_database().await;
    let mut env = ports(Path::new("/nonexistent/never-created"));
    env.push(("DATABASE_URL", db.clone()));
    set(&mut env, "LEASEHOLD_GENERATORS", "1");
    let lease_port = port_of(&env, "LEASE_SERVICE_PORT");
    let task_port = port_of(&env, "TASK_SERVICE_PORT");
    let mut stack = Stack::start(&env);
    let banner = stack.wait_ready().await;

    let dashboard = format!("http://127.0.0.1:{task_port}/dashboard");
    assert!(banner.contains(&dashboard), "{banner}");
    let page = reqwest::get(&dashboard).await.unwrap();
    assert_eq!(page.status().as_u16(), 200, "{dashboard}");

    let cli = binary("leasehold");
    assert!(
        banner.contains(&format!("{} tasks list", cli.display())),
        "{banner}"
    );
    // The ports are not the defaults, so the banner's command names them.
    for url in [
        format!("LEASE_SERVICE_URL=http://127.0.0.1:{lease_port}"),
        format!("TASK_SERVICE_URL=http://127.0.0.1:{task_port}"),
    ] {
        assert!(banner.contains(&url), "{url} in {banner}");
    }
    let listed = Command::new(&cli)
        .args(["tasks", "list"])
        .env(
            "LEASE_SERVICE_URL",
            format!("http://127.0.0.1:{lease_port}"),
        )
        .env("TASK_SERVICE_URL", format!("http://127.0.0.1:{task_port}"))
        .env_remove("LEASEHOLD_TOKEN")
        .output()
        .unwrap();
    assert!(listed.status.success(), "{listed:?}");

    // The banner says what a started generator makes, and says it right: task-service's own
    // defaults, which the stack's workers are sized to keep up with.
    let settings = task_client(&format!("http://127.0.0.1:{task_port}"), None)
        .generator_status()
        .await
        .unwrap()
        .settings;
    let (shortest, longest) = GENERATOR_DEFAULT_SLEEP_SECONDS;
    assert_eq!(
        (
            settings.rate_per_second,
            settings.min_sleep_seconds,
            settings.max_sleep_seconds
        ),
        (GENERATOR_DEFAULT_RATE_PER_SECOND, shortest, longest)
    );
    let work =
        format!("makes {GENERATOR_DEFAULT_RATE_PER_SECOND} task/s of {shortest}–{longest} s");
    assert!(banner.contains(&work), "{work:?} in {banner}");

    assert_eq!(stack.interrupt_and_wait().await, 0, "{}", stack.tail());
    let output = stack.output();
    assert!(
        output.contains("stopping"),
        "its own log is in the file: {output}"
    );
    assert!(
        !output.contains("\x1b["),
        "terminal escapes in a file:\n{}",
        stack.tail()
    );
}

/// Ctrl-C stops clients before the services they use: workers finish (or hand back) the tasks
/// they hold and the generator releases its lease while task-service and lease-service still
/// answer. So no task is left running to be run again, as attempt 2, by the next start.
#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_stops_clients_first_so_no_task_runs_twice() {
    let db = fresh_database().await;
    let mut env = ports(Path::new("/nonexistent/never-created"));
    env.push(("DATABASE_URL", db.clone()));
    set(&mut env, "LEASEHOLD_WORKERS", "2");
    set(&mut env, "LEASEHOLD_WORKER_CONCURRENCY", "2");
    set(&mut env, "LEASEHOLD_GENERATORS", "1");
    let task_port = port_of(&env, "TASK_SERVICE_PORT");
    let mut stack = Stack::start(&env);
    stack.wait_ready().await;

    let client = task_client(&format!("http://127.0.0.1:{task_port}"), None);
    for _ in 0..8 {
        create_new(&client, &new_task(json!({"sleep_duration_seconds": 2}))).await;
    }
    // Every worker slot busy.
    eventually(Duration::from_secs(60), "4 tasks running", || async {
        let tasks = rows(&db, "leasehold_tasks.tasks").await;
        tasks.iter().filter(|t| t["status"] == "running").count() == 4
    })
    .await;

    assert_eq!(stack.interrupt_and_wait().await, 0, "{}", stack.tail());
    let tasks = rows(&db, "leasehold_tasks.tasks").await;
    let left_running: Vec<&Value> = tasks.iter().filter(|t| t["status"] == "running").collect();
    assert!(
        left_running.is_empty(),
        "tasks still running after the stop would run again on the next start: \
         {left_running:#?}\n{}",
        stack.tail()
    );
    assert!(
        tasks.iter().filter(|t| t["status"] == "succeeded").count() >= 4,
        "the tasks in flight were finished: {tasks:#?}"
    );
    let held: Vec<Value> = rows(&db, "leasehold_leases.leases")
        .await
        .into_iter()
        .filter(|lease| lease["released_at"].is_null())
        .collect();
    assert!(
        held.is_empty(),
        "leases still held after the stop: {held:#?}"
    );

    // The next start runs the rest, and nothing twice.
    let mut again = Stack::start(&env);
    again.wait_ready().await;
    eventually(Duration::from_secs(90), "every task to succeed", || async {
        let tasks = rows(&db, "leasehold_tasks.tasks").await;
        tasks.iter().all(|t| t["status"] == "succeeded")
    })
    .await;
    assert_eq!(again.interrupt_and_wait().await, 0, "{}", again.tail());
    let mut runs: HashMap<i64, usize> = HashMap::new();
    for event in rows(&db, "leasehold_tasks.task_transitions").await {
        if event["to_status"] == "running" {
            *runs.entry(event["task_id"].as_i64().unwrap()).or_default() += 1;
        }
    }
    let tasks = rows(&db, "leasehold_tasks.tasks").await;
    assert_eq!(tasks.len(), 8);
    for task in &tasks {
        let id = task["id"].as_i64().unwrap();
        assert_eq!(task["attempts"], 1, "{task}");
        assert_eq!(runs.get(&id), Some(&1), "task {id} ran more than once");
    }
}

/// `--ha`: the stack on a local pg_auto_failover formation. A failover by the command the
/// banner prints moves every service to the new primary without a restart, and Ctrl-C leaves
/// no node behind.
#[tokio::test(flavor = "multi_thread")]
async fn ha_runs_on_a_formation_and_follows_a_failover() {
    if !tests::pg_auto_failover_available().await {
        return;
    }
    // --ha keeps nothing in its home; the formation lives and dies in the test directory.
    let home = std::env::temp_dir().join(format!("leasehold-ha-test-{}", std::process::id()));
    let mut env = ports(&home);
    env.push(("LEASEHOLD_HA", "true".to_owned()));
    let lease_port = port_of(&env, "LEASE_SERVICE_PORT");
    let task_port = port_of(&env, "TASK_SERVICE_PORT");
    let mut stack = Stack::start(&env);
    let banner = stack.wait_ready().await;
    assert!(banner.contains("PostgreSQL (HA)"), "{banner}");
    let failover = banner
        .lines()
        .find_map(|line| line.trim().strip_prefix("fail over with"))
        .unwrap_or_else(|| panic!("no failover command in:\n{banner}"))
        .trim()
        .to_owned();
    let node = |port: u16| async move {
        let answer = reqwest::get(format!("http://127.0.0.1:{port}/readyz"))
            .await
            .ok()?
            .json::<Value>()
            .await
            .ok()?;
        Some((
            answer["database"]["server"].as_str()?.to_owned(),
            answer["database"]["timeline"].as_i64()?,
        ))
    };
    let (first, timeline) = node(lease_port).await.unwrap();

    let status = Command::new("sh")
        .args(["-c", &failover])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "`{failover}` failed");
    for port in [lease_port, task_port] {
        eventually(
            Duration::from_secs(60),
            "the new primary behind /readyz",
            || async {
                node(port)
                    .await
                    .is_some_and(|(server, now)| server != first && now > timeline)
            },
        )
        .await;
    }
    let leases = lease_client(&format!("http://127.0.0.1:{lease_port}"), None);
    leases
        .acquire("after-failover", "test", None)
        .await
        .unwrap();
    let tasks = task_client(&format!("http://127.0.0.1:{task_port}"), None);
    create_new(&tasks, &new_task(json!({"sleep_duration_seconds": 0}))).await;

    assert_eq!(stack.interrupt_and_wait().await, 0, "{}", stack.tail());
    let formation_dir = failover
        .split_whitespace()
        .last()
        .and_then(|monitor| Path::new(monitor).parent())
        .unwrap()
        .to_owned();
    assert!(
        !formation_dir.exists(),
        "{} was left",
        formation_dir.display()
    );
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| std::fs::read(entry.path().join("cmdline")).ok())
        .map(|cmdline| String::from_utf8_lossy(&cmdline).replace('\0', " "))
        .filter(|cmdline| cmdline.contains(&*formation_dir.to_string_lossy()))
        .collect();
    assert!(left.is_empty(), "left running: {left:?}");
}
