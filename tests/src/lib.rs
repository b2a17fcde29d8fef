//! The black-box test harness: a private PostgreSQL per test process, a fresh database per test,
//! and Leasehold's services started as real processes and spoken to over HTTP.
//!
//! ```no_run
//! # async fn example() {
//! let db = tests::fresh_database().await;
//! let leases = tests::Service::lease_service(&db, &[]).await;
//! let answer = leases.post("/api/leases", &serde_json::json!({"resource": "r", "holder": "h"})).await;
//! assert_eq!(answer.status, 201);
//! # }
//! ```
#![allow(clippy::unwrap_used, clippy::print_stdout)]

pub mod bench;
pub mod browser;
pub mod checker;
pub mod otlp;
pub mod proxy;
pub mod soak;
pub mod tools;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use diesel::QueryableByName;
use diesel::sql_types::Text;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use leasehold_local::postgres::PrivatePostgres;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use serde_json::Value;

/// The PostgreSQL server of this test process, started on first use. It dies with the process.
pub fn cluster() -> &'static PrivatePostgres {
    static CLUSTER: OnceLock<PrivatePostgres> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        PrivatePostgres::start_ephemeral()
            .unwrap_or_else(|err| panic!("cannot start the test PostgreSQL: {err}"))
    })
}

/// A new, empty database on the test cluster; returns its URL. Tests never share one.
pub async fn fresh_database() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let cluster = tokio::task::spawn_blocking(cluster).await.unwrap();
    let name = format!(
        "t_{}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        rand::random::<u16>()
    );
    cluster.create_database(&name).await.unwrap();
    cluster.url(&name)
}

/// Where cargo put the workspace's binaries: beside the `deps` folder this test runs from.
/// `LEASEHOLD_BIN_DIR` overrides it.
pub fn binary(name: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("LEASEHOLD_BIN_DIR") {
        return PathBuf::from(dir).join(name);
    }
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe
        .ancestors()
        .find(|dir| dir.file_name().is_some_and(|n| n == "deps"))
        .and_then(Path::parent)
        .unwrap_or_else(|| exe.parent().unwrap());
    let path = profile_dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: run the tests with `cargo test --workspace` (it builds every binary)",
        path.display()
    );
    path
}

/// Polls `check` every 100 ms until it holds; panics naming `what` after `timeout`.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A free TCP port on loopback (free when asked; the service binds it right after).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A folder for this run's service logs, so a failing test can point at them.
pub fn log_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("leasehold-test-logs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A child process that cannot outlive its test. Dropping the guard (also while a panic
/// unwinds) kills the process and every process it started; and should the test process die
/// without running destructors (a `SIGKILL`, an abort), the kernel sends the child
/// `death_signal` (`PR_SET_PDEATHSIG`, see [`leasehold_local::process`]).
///
/// It derefs to the [`Child`], to wait for it or read its pipes.
#[derive(Debug)]
pub struct ChildGuard {
    child: Child,
}

impl ChildGuard {
    /// Spawns `command` under a guard.
    pub fn spawn(command: Command, death_signal: Signal) -> std::io::Result<ChildGuard> {
        let child = leasehold_local::process::spawn_tied_to_process(command, death_signal)?;
        Ok(ChildGuard { child })
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).unwrap())
    }

    /// Sends `signal` to the process (not to its descendants).
    pub fn signal(&self, signal: Signal) {
        nix::sys::signal::kill(self.pid(), signal).unwrap();
    }

    /// Kills the process and all its descendants, and reaps it.
    pub fn kill_tree(&mut self) {
        // Once reaped, its pid may belong to someone else; a zombie's may not.
        if let Ok(None) = self.child.try_wait() {
            kill_process_tree(self.child.id());
        }
        let _ = self.child.wait();
    }
}

impl std::ops::Deref for ChildGuard {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.child
    }
}

impl std::ops::DerefMut for ChildGuard {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.child
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill_tree();
    }
}

/// The pids of `root`'s living descendants (children, their children, ...), from `/proc`.
pub fn descendants(root: u32) -> Vec<u32> {
    let mut children: std::collections::HashMap<u32, Vec<u32>> = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        let mut fields = stat[stat.rfind(')').map_or(0, |end| end + 1)..].split_whitespace();
        let (Some(state), Some(Ok(ppid))) = (fields.next(), fields.next().map(str::parse::<u32>))
        else {
            continue;
        };
        if state != "Z" && state != "X" {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut found = Vec::new();
    let mut next = vec![root];
    while let Some(pid) = next.pop() {
        for &child in children.get(&pid).map_or(&[][..], Vec::as_slice) {
            found.push(child);
            next.push(child);
        }
    }
    found
}

/// Kills `root` and every descendant with `SIGKILL`, and waits until the descendants are gone
/// (`root`, the caller's child, is the caller's to reap). Each is stopped first, so that none
/// can start another process or be reparented out of sight while the tree is read.
pub fn kill_process_tree(root: u32) {
    let signal = |pid: u32, signal: Signal| {
        if let Ok(pid) = i32::try_from(pid) {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), signal);
        }
    };
    signal(root, Signal::SIGSTOP);
    let mut stopped = vec![root];
    loop {
        let mut new = descendants(root);
        new.retain(|pid| !stopped.contains(pid));
        if new.is_empty() {
            break;
        }
        for pid in new {
            signal(pid, Signal::SIGSTOP);
            stopped.push(pid);
        }
    }
    for &pid in &stopped {
        signal(pid, Signal::SIGKILL);
    }
    // A signal is delivered asynchronously: wait, so that nothing is left once this returns.
    let deadline = Instant::now() + Duration::from_secs(10);
    while stopped
        .iter()
        .any(|&pid| pid != root && leasehold_local::process::pid_alive(pid))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One of Leasehold's binaries running as a child process, listening on a known port.
#[derive(Debug)]
pub struct Service {
    pub name: String,
    pub port: u16,
    /// The environment variable that tells the binary where to listen.
    listen_env: &'static str,
    args: Vec<String>,
    env: Vec<(String, String)>,
    child: Option<ChildGuard>,
    pub log: PathBuf,
    http: reqwest::Client,
}

/// An HTTP answer: status and parsed JSON body (`Value::Null` when the body is not JSON).
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
    pub headers: reqwest::header::HeaderMap,
}

impl Answer {
    /// The `code` of an error body.
    pub fn code(&self) -> &str {
        self.body["code"].as_str().unwrap_or("")
    }
}

impl Service {
    /// Starts lease-service on `database_url` with test-friendly settings (a sweeper that does
    /// not run during the test unless `env` says otherwise), and waits until it is healthy.
    pub async fn lease_service(database_url: &str, env: &[(&str, &str)]) -> Service {
        let mut all = vec![
            ("DATABASE_URL", database_url),
            ("LEASE_SWEEP_INTERVAL_SECONDS", "3600"),
            ("HTTP_WORKERS", "2"),
            ("DATABASE_POOL_SIZE", "8"),
            ("SHUTDOWN_GRACE_SECONDS", "5"),
            ("RUST_LOG", "info"),
        ];
        for (key, value) in env {
            all.retain(|(k, _)| k != key);
            all.push((key, value));
        }
        Service::start("lease-service", &[], &all).await
    }

    /// Starts task-service on `database_url`, talking to the lease-service at `lease_url`.
    pub async fn task_service(
        database_url: &str,
        lease_url: &str,
        env: &[(&str, &str)],
    ) -> Service {
        let mut all = vec![
            ("DATABASE_URL", database_url),
            ("LEASE_SERVICE_URL", lease_url),
            ("TASK_SWEEP_INTERVAL_SECONDS", "3600"),
            ("HTTP_WORKERS", "2"),
            ("DATABASE_POOL_SIZE", "16"),
            ("SHUTDOWN_GRACE_SECONDS", "5"),
            ("RUST_LOG", "info"),
        ];
        for (key, value) in env {
            all.retain(|(k, _)| k != key);
            all.push((key, value));
        }
        Service::start("task-service", &[], &all).await
    }

    /// Starts a task-generator replica named `id`; it serves `/healthz` on its metrics port.
    pub async fn generator(
        task_url: &str,
        lease_url: &str,
        id: &str,
        env: &[(&str, &str)],
    ) -> Service {
        let mut all = vec![
            ("TASK_SERVICE_URL", task_url),
            ("LEASE_SERVICE_URL", lease_url),
            ("GENERATOR_ID", id),
            ("RUST_LOG", "info"),
        ];
        for (key, value) in env {
            all.retain(|(k, _)| k != key);
            all.push((key, value));
        }
        Service::start_with("task-generator", &[], &all, "METRICS_ADDR").await
    }

    /// Starts a worker process against `task_url`; it serves `/healthz` on its metrics port.
    pub async fn worker(task_url: &str, env: &[(&str, &str)]) -> Service {
        let mut all = vec![("TASK_SERVICE_URL", task_url), ("RUST_LOG", "info")];
        for (key, value) in env {
            all.retain(|(k, _)| k != key);
            all.push((key, value));
        }
        Service::start_with("worker", &[], &all, "METRICS_ADDR").await
    }

    /// Starts `name` with `args` and `env` (plus `LISTEN_ADDR` on a fresh port) and waits for
    /// its `/healthz`.
    pub async fn start(name: &str, args: &[&str], env: &[(&str, &str)]) -> Service {
        Service::start_with(name, args, env, "LISTEN_ADDR").await
    }

    /// Like [`Service::start`], telling the binary its address in `listen_env`.
    pub async fn start_with(
        name: &str,
        args: &[&str],
        env: &[(&str, &str)],
        listen_env: &'static str,
    ) -> Service {
        let port = free_port();
        let mut service = Service {
            name: name.to_owned(),
            port,
            listen_env,
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            child: None,
            log: log_dir().join(format!("{name}-{port}.log")),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
        };
        service.spawn();
        service.wait_healthy(Duration::from_secs(30)).await;
        service
    }

    fn spawn(&mut self) {
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut command = Command::new(binary(&self.name));
        command
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env(self.listen_env, format!("127.0.0.1:{}", self.port))
            .env_remove("RUST_BACKTRACE")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let child = ChildGuard::spawn(command, Signal::SIGKILL)
            .unwrap_or_else(|err| panic!("cannot start {}: {err}", self.name));
        self.child = Some(child);
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }

    pub fn base_url(&self) -> String {
        self.url("")
    }

    pub fn pid(&self) -> Pid {
        self.child.as_ref().expect("service is not running").pid()
    }

    /// Polls `/healthz` until it answers 200; panics with the log's tail otherwise.
    pub async fn wait_healthy(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(response) = self.http.get(self.url("/healthz")).send().await
                && response.status().is_success()
            {
                return;
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "{} exited with {status} before becoming healthy; log:\n{}",
                    self.name,
                    self.log_tail()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} not healthy after {timeout:?}; log:\n{}",
                self.name,
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    pub fn signal(&self, signal: Signal) {
        nix::sys::signal::kill(self.pid(), signal).unwrap();
    }

    /// SIGSTOP: the process stays alive but answers nothing, as in a long GC pause.
    pub fn pause(&self) {
        self.signal(Signal::SIGSTOP);
    }

    pub fn resume(&self) {
        self.signal(Signal::SIGCONT);
    }

    /// kill -9, and reap it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill_tree();
        }
    }

    /// SIGTERM, then waits up to `timeout` for the exit; returns the exit code.
    pub async fn terminate(&mut self, timeout: Duration) -> Option<i32> {
        self.signal(Signal::SIGTERM);
        let mut child = self.child.take()?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{} ignored SIGTERM for {timeout:?}", self.name);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts the process again on the same port with the same settings.
    pub async fn restart(&mut self) {
        self.kill();
        self.start_again().await;
    }

    /// Starts the process again after it was killed or terminated.
    pub async fn start_again(&mut self) {
        self.spawn();
        self.wait_healthy(Duration::from_secs(30)).await;
    }

    /// Waits up to `timeout` for the process to exit by itself; its exit status, if it did.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    /// The service's metrics, in Prometheus's text format.
    pub async fn metrics(&self) -> String {
        reqwest::get(self.url("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// The whole log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub async fn get(&self, path: &str) -> Answer {
        self.send(self.http.get(self.url(path))).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Answer {
        self.send(self.http.post(self.url(path)).json(body)).await
    }

    pub async fn put(&self, path: &str, body: &Value) -> Answer {
        self.send(self.http.put(self.url(path)).json(body)).await
    }

    pub async fn delete(&self, path: &str, body: &Value) -> Answer {
        self.send(self.http.delete(self.url(path)).json(body)).await
    }

    /// `method path` with `body` as JSON (if any) and `token` as a bearer token (if any).
    pub async fn send_as(
        &self,
        token: Option<&str>,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Answer {
        let mut request = self.http.request(
            reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
            self.url(path),
        );
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        self.send(request).await
    }

    /// Sends anything: for requests the helpers above cannot express (bad bodies, odd methods).
    pub async fn raw(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: impl Into<reqwest::Body>,
    ) -> Answer {
        let mut request = self
            .http
            .request(
                reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
                self.url(path),
            )
            .body(body);
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        self.send(request).await
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Answer {
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = response.bytes().await.unwrap();
        Answer {
            status,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            headers,
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            // SIGKILL ends a stopped process too; SIGCONT first so that, should the kill fail,
            // nothing is left stopped behind the test.
            let _ = nix::sys::signal::kill(
                Pid::from_raw(i32::try_from(child.id()).unwrap_or(0)),
                Signal::SIGCONT,
            );
        }
        self.kill();
    }
}

#[derive(QueryableByName)]
struct JsonRow {
    #[diesel(sql_type = Text)]
    json: String,
}

/// Every row of `table` as JSON text, in id order: compare before and after to prove that a
/// refused request wrote nothing.
pub async fn snapshot(database_url: &str, table: &str) -> Vec<String> {
    let mut conn = AsyncPgConnection::establish(database_url).await.unwrap();
    let rows: Vec<JsonRow> = diesel::sql_query(format!(
        "SELECT row_to_json(t)::text AS json FROM {table} t ORDER BY id"
    ))
    .load(&mut conn)
    .await
    .unwrap();
    rows.into_iter().map(|r| r.json).collect()
}

/// Runs one SQL statement on the database (to age rows, corrupt state on purpose, ...).
pub async fn execute(database_url: &str, sql: &str) -> usize {
    let mut conn = AsyncPgConnection::establish(database_url).await.unwrap();
    diesel::sql_query(sql).execute(&mut conn).await.unwrap()
}

/// The sum of the samples in Prometheus text `metrics` whose line starts with `prefix` (a name,
/// or a name with `{` and leading labels, to pick series).
pub fn metric_sum(metrics: &str, prefix: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Each item of a batch answer's `results`: its status and its error code (`""` when none).
pub fn verdicts(results: &Value) -> Vec<(i64, &str)> {
    results
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["status"].as_i64().unwrap(),
                r["error"]["code"].as_str().unwrap_or(""),
            )
        })
        .collect()
}

#[cfg(test)]
mod guard_tests {
    use super::*;

    /// A test that panics with a process tree running leaves none of it behind.
    #[test]
    fn a_guard_kills_its_whole_tree_when_its_test_panics() {
        let mut command = Command::new("sh");
        command
            .args(["-c", "sleep 300 & sleep 300 & wait"])
            .stdin(Stdio::null());
        let guard = ChildGuard::spawn(command, Signal::SIGKILL).unwrap();
        let root = guard.id();
        let deadline = Instant::now() + Duration::from_secs(30);
        let tree = loop {
            let children = descendants(root);
            if children.len() == 2 {
                break children;
            }
            assert!(Instant::now() < deadline, "the shell started {children:?}");
            std::thread::sleep(Duration::from_millis(20));
        };
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _guard = guard;
            panic!("a failing test");
        }));
        assert!(panicked.is_err());
        for pid in tree.into_iter().chain([root]) {
            assert!(
                !leasehold_local::process::pid_alive(pid),
                "{pid} outlived its test"
            );
        }
    }
}
