//! [`Service`]: one of Leasehold's binaries started as a real process on a free port, with the
//! HTTP helpers the tests speak to it with: the typed clients for ordinary traffic, raw requests
//! ([`Answer`]) for tests of the wire itself, and the signals they hit it with.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use serde_json::Value;

use crate::{ChildGuard, binary};

/// A free TCP port on loopback (free when asked; the service binds it right after).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The first of `count` consecutive free TCP ports on loopback, below the kernel's ephemeral
/// range: a stack that numbers its replicas' ports from a base needs the ports after it free
/// too, and in the ephemeral range any outgoing connection of a parallel test may take them
/// (as one did, failing a generator's bind).
pub fn free_port_block(count: u16) -> u16 {
    use rand::Rng;
    let mut rng = rand::rng();
    loop {
        let base: u16 = rng.random_range(20_000..32_000 - count);
        let free = (base..base + count)
            .all(|port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok());
        if free {
            return base;
        }
    }
}

/// A folder for this process's service logs, under the target directory
/// (`target/test-logs/<pid>/`), so a failing test can point at them. Each [`Service`] removes
/// its own log when it ends unless a panic is unwinding (a failed assertion): what stays
/// behind is the logs of failed tests, and [`keep_logs`] keeps them all (the soak's).
pub fn log_dir() -> PathBuf {
    let dir = crate::target_dir()
        .join("test-logs")
        .join(std::process::id().to_string());
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Opens `log` for appending, creating it and its folder. The folder is made here, where the file
/// is opened, and made again should it vanish first: [`discard_log`] removes it once it is
/// empty, and another test of this process that passes between the folder's creation and this
/// open empties it (the suite failed at random that way, "No such file or directory").
pub fn open_log(log: &Path) -> File {
    let mut tries = 0;
    loop {
        if let Some(dir) = log.parent() {
            std::fs::create_dir_all(dir).unwrap_or_else(|err| panic!("{}: {err}", dir.display()));
        }
        match File::options().create(true).append(true).open(log) {
            Ok(file) => return file,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound && tries < 100 => tries += 1,
            Err(err) => panic!("{}: {err}", log.display()),
        }
    }
}

/// Whether logs outlive their services even when nothing failed.
static KEEP_LOGS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Keeps every log of this process, not only those of failed tests: for a run whose verdict is
/// not a panic (the soak reports its own).
pub fn keep_logs() {
    KEEP_LOGS.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Removes a log once its test is known to pass this far (no panic unwinding), and its folder
/// once empty.
pub fn discard_log(log: &Path) {
    if std::thread::panicking() || KEEP_LOGS.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let _ = std::fs::remove_file(log);
    if let Some(dir) = log.parent() {
        // Fails while other logs are in it: the last one out removes it.
        let _ = std::fs::remove_dir(dir);
    }
}

/// A typed client of the task-service (or proxy) at `base_url`, with a 10-second timeout and
/// `token`, if any, as its bearer token.
pub fn task_client(base_url: &str, token: Option<&str>) -> leasehold::TaskClient {
    leasehold::TaskClient::new([base_url])
        .with_timeout(Duration::from_secs(10))
        .with_bearer_token(token)
}

/// A typed client of the lease-service (or proxy) at `base_url` that tries each call once, with
/// a 10-second timeout and `token`, if any, as its bearer token.
pub fn lease_client(base_url: &str, token: Option<&str>) -> leasehold::LeaseClient {
    leasehold::LeaseClient::new(base_url)
        .with_timeout(Duration::from_secs(10))
        .with_retry(leasehold::RetryPolicy::none())
        .with_bearer_token(token)
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
            http: leasehold::keep_alive::client_builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
        };
        service.spawn();
        service.wait_healthy(Duration::from_secs(30)).await;
        service
    }

    fn spawn(&mut self) {
        let log = open_log(&self.log);
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

    /// The pid as `/proc` names it.
    pub fn pid_u32(&self) -> u32 {
        u32::try_from(self.pid().as_raw()).unwrap_or(0)
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
                panic!(
                    "{} ignored SIGTERM for {timeout:?}\n{}",
                    self.name,
                    self.log_tail()
                );
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

    /// A typed client of this task-service ([`leasehold::TaskClient`]), for the tests' ordinary
    /// traffic. It sends no token; see [`Service::task_client_as`] for a locked front door.
    pub fn task_client(&self) -> leasehold::TaskClient {
        self.task_client_as(None)
    }

    /// Like [`Service::task_client`], sending `token` (one of the service's `AUTH_TOKENS`) as a
    /// bearer token with every request.
    pub fn task_client_as(&self, token: Option<&str>) -> leasehold::TaskClient {
        task_client(&self.base_url(), token)
    }

    /// A typed client of this lease-service ([`leasehold::LeaseClient`]) that never retries, so
    /// the test sees every answer. It sends no token; see [`Service::lease_client_as`].
    pub fn lease_client(&self) -> leasehold::LeaseClient {
        self.lease_client_as(None)
    }

    /// Like [`Service::lease_client`], sending `token` as a bearer token with every request.
    pub fn lease_client_as(&self, token: Option<&str>) -> leasehold::LeaseClient {
        lease_client(&self.base_url(), token)
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
        discard_log(&self.log);
    }
}
