//! The real `worker` binary: its help, its refusal of bad configuration, its exit status
//! after SIGTERM/SIGINT and its metrics endpoint. Its work against real services is tested in
//! `tests/tests/suite/workers.rs`.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tests::ChildGuard;

/// The worker binary with only `env` (and `RUST_LOG=info`) in its environment.
fn worker(env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_worker"));
    command
        .env_clear()
        .env("RUST_LOG", "info")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// A worker under test. The guard kills it when dropped (a failed assertion must not leave
/// behind a worker that polls forever) and the kernel kills it should the test process die
/// without unwinding (`SIGKILL`, abort). Threads drain its stdout and stderr from the start:
/// a worker that writes more than a pipe holds would otherwise block until killed.
struct Running {
    guard: ChildGuard,
    stdout: Option<JoinHandle<Vec<u8>>>,
    stderr: Option<JoinHandle<Vec<u8>>>,
    /// Each line of stderr as it arrives, for tests that wait for a log line.
    stderr_lines: mpsc::Receiver<String>,
}

/// Reads `pipe` to its end; each line also goes to `lines`, if given and still listened to.
fn drain(
    pipe: impl Read + Send + 'static,
    lines: Option<mpsc::Sender<String>>,
) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut all = Vec::new();
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            all.extend_from_slice(&line);
            if let Some(lines) = &lines {
                let _ = lines.send(String::from_utf8_lossy(&line).trim_end().to_owned());
            }
        }
        all
    })
}

impl Running {
    fn spawn(command: Command) -> Running {
        let mut guard = ChildGuard::spawn(command, Signal::SIGKILL).unwrap();
        let (sender, stderr_lines) = mpsc::channel();
        let stdout = guard.stdout.take().map(|pipe| drain(pipe, None));
        let stderr = guard.stderr.take().map(|pipe| drain(pipe, Some(sender)));
        Running {
            guard,
            stdout,
            stderr,
            stderr_lines,
        }
    }

    fn pid(&self) -> Pid {
        self.guard.pid()
    }

    fn signal(&self, signal: Signal) {
        self.guard.signal(signal);
    }

    /// The first stderr line for which `find` answers, within `timeout`.
    fn find_in_stderr<T>(&self, timeout: Duration, find: impl Fn(&str) -> Option<T>) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr_lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(found) = find(&line) {
                        return found;
                    }
                }
                Err(error) => {
                    panic!("no such line in the worker's stderr within {timeout:?}: {error}")
                }
            }
        }
    }

    /// Waits until the worker handles SIGTERM and SIGINT itself (before that, either signal
    /// would kill it), as `/proc/PID/status` tells.
    fn wait_for_signal_handlers(&self) {
        let pid = self.pid();
        let handled = |status: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("SigCgt:"))
                .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
                .is_some_and(|mask| {
                    [Signal::SIGTERM, Signal::SIGINT]
                        .iter()
                        .all(|signal| mask & (1 << (*signal as i32 - 1)) != 0)
                })
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !handled(&std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default())
        {
            assert!(
                Instant::now() < deadline,
                "the worker did not install its signal handlers"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Everything the worker wrote, once it has exited (or been killed).
    fn output(mut self, status: ExitStatus) -> Output {
        let join = |thread: Option<JoinHandle<Vec<u8>>>| {
            thread.map(|t| t.join().unwrap()).unwrap_or_default()
        };
        let stdout = join(self.stdout.take());
        let stderr = join(self.stderr.take());
        Output {
            status,
            stdout,
            stderr,
        }
    }
}

fn wait_with_timeout(mut running: Running, timeout: Duration) -> Output {
    let started = Instant::now();
    loop {
        if let Some(status) = running.guard.try_wait().unwrap() {
            return running.output(status);
        }
        if started.elapsed() > timeout {
            running.guard.kill_tree();
            let status = running.guard.try_wait().unwrap().unwrap();
            let output = running.output(status);
            panic!(
                "worker did not exit within {timeout:?}; stderr:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs the worker to its end, at most 10 s.
fn run(command: Command) -> Output {
    wait_with_timeout(Running::spawn(command), Duration::from_secs(10))
}

#[test]
fn help_lists_every_setting() {
    let mut command = worker(&[]);
    command.arg("--help");
    let output = run(command);
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    for name in [
        "TASK_SERVICE_URL",
        "WORKER_ID",
        "WORKER_QUEUE",
        "WORKER_CONCURRENCY",
        "HEARTBEAT_INTERVAL_SECONDS",
        "POLL_MIN_MS",
        "POLL_MAX_MS",
        "SHUTDOWN_GRACE_SECONDS",
        "CHAOS_CRASH_PROBABILITY",
        "CHAOS_HEARTBEAT_PAUSE_PROBABILITY",
        "CHAOS_HEARTBEAT_PAUSE_SECONDS",
        "METRICS_ADDR",
        "RUST_LOG",
        "LOG_FORMAT",
    ] {
        assert!(
            help.contains(name),
            "--help does not mention {name}:\n{help}"
        );
    }
}

#[test]
fn a_heartbeat_interval_that_is_no_time_is_refused() {
    let output = run(worker(&[
        ("TASK_SERVICE_URL", "http://127.0.0.1:1"),
        ("HEARTBEAT_INTERVAL_SECONDS", "0"),
    ]));
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("HEARTBEAT_INTERVAL_SECONDS"), "{stderr}");
}

#[test]
fn the_worker_has_no_lease_ttl_setting_of_its_own() {
    let mut command = worker(&[]);
    command.arg("--help");
    let output = run(command);
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(!help.contains("--lease-ttl"), "{help}");
    assert!(!help.contains("env: LEASE_TTL_SECONDS"), "{help}");
}

#[test]
fn other_bad_settings_are_refused_by_name() {
    for (name, value) in [
        ("WORKER_CONCURRENCY", "0"),
        ("CHAOS_CRASH_PROBABILITY", "2"),
        ("TASK_SERVICE_URL", "not a url"),
        ("POLL_MIN_MS", "0"),
    ] {
        let output = run(worker(&[
            ("TASK_SERVICE_URL", "http://127.0.0.1:1"),
            (name, value),
        ]));
        assert!(!output.status.success(), "{name}={value} accepted");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(name), "{name}={value}: {stderr}");
    }
    let output = run(worker(&[]));
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("TASK_SERVICE_URL"));
}

#[test]
fn sigterm_and_sigint_stop_it_with_status_zero() {
    for signal in [Signal::SIGTERM, Signal::SIGINT] {
        // Nothing listens on port 1: the worker keeps polling with backoff until signalled.
        let child = Running::spawn(worker(&[
            ("TASK_SERVICE_URL", "http://127.0.0.1:1"),
            ("POLL_MAX_MS", "200"),
        ]));
        child.wait_for_signal_handlers();
        child.signal(signal);
        let output = wait_with_timeout(child, Duration::from_secs(10));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "{signal}: {:?}\n{stderr}",
            output.status
        );
        assert!(stderr.contains("worker started"), "{stderr}");
        assert!(stderr.contains("worker stopped"), "{stderr}");
    }
}

/// `GET path` over plain HTTP/1.0: (status line, body).
fn get(address: &str, path: &str) -> (String, String) {
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer.lines().next().unwrap_or_default().to_owned();
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[test]
fn metrics_addr_serves_health_and_metrics() {
    let child = Running::spawn(worker(&[
        ("TASK_SERVICE_URL", "http://127.0.0.1:1"),
        ("METRICS_ADDR", "127.0.0.1:0"),
        ("LOG_FORMAT", "json"),
    ]));
    // The bound address is in the JSON log.
    let address = child.find_in_stderr(Duration::from_secs(10), |line| {
        let event = serde_json::from_str::<serde_json::Value>(line).ok()?;
        event["fields"]["message"]
            .as_str()?
            .starts_with("metrics listening")
            .then(|| event["fields"]["address"].as_str().map(str::to_owned))?
    });

    let (status, body) = get(&address, "/healthz");
    assert!(status.contains("200"), "{status}");
    assert!(body.contains("ok"), "{body}");
    let (status, body) = get(&address, "/metrics");
    assert!(status.contains("200"), "{status}");
    for name in [
        "worker_tasks_claimed_total",
        "worker_tasks_completed_total",
        "worker_tasks_failed_total",
        "worker_tasks_lost_total",
        "worker_tasks_in_flight",
        "worker_task_claim_to_complete_seconds_bucket",
        "worker_claim_requests_total{outcome=\"error\"}",
    ] {
        assert!(body.contains(name), "{name} missing:\n{body}");
    }

    child.wait_for_signal_handlers();
    child.signal(Signal::SIGTERM);
    let output = wait_with_timeout(child, Duration::from_secs(10));
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn a_worker_that_writes_more_than_a_pipe_holds_is_not_blocked() {
    // The refusal quotes the value: well over the 64 KiB a pipe holds.
    let value = format!("not a url {}", "a".repeat(100_000));
    let output = run(worker(&[("TASK_SERVICE_URL", &value)]));
    assert!(!output.status.success());
    assert!(output.stderr.len() > 100_000, "{}", output.stderr.len());
}

/// Set in the child process of `a_killed_test_process_leaves_no_worker_behind`.
const CHILD_MODE_ENV: &str = "WORKER_CLI_TEST_CHILD";
const CHILD_TEST: &str = "child_starts_a_worker_and_waits_to_be_killed";
/// The line on which the child reports its worker's pid.
const CHILD_REPORT: &str = "WORKER_CLI_TEST_CHILD_WORKER pid=";

/// Run only as the child of `a_killed_test_process_leaves_no_worker_behind`: starts a worker
/// as the other tests do, reports its pid and waits to be killed.
#[test]
#[ignore = "helper: run by a_killed_test_process_leaves_no_worker_behind in a child process"]
#[allow(clippy::print_stdout)] // Reports the worker to the parent process.
fn child_starts_a_worker_and_waits_to_be_killed() {
    if std::env::var_os(CHILD_MODE_ENV).is_none() {
        return;
    }
    let child = Running::spawn(worker(&[("TASK_SERVICE_URL", "http://127.0.0.1:1")]));
    // libtest prints "test NAME ... " before this, on the same line.
    println!("\n{CHILD_REPORT}{}", child.pid());
    loop {
        std::thread::park();
    }
}

/// Whether `pid` is a living process (not gone, not a zombie).
fn alive(pid: Pid) -> bool {
    leasehold_local::process::pid_alive(u32::try_from(pid.as_raw()).unwrap())
}

/// Kills a process that is not our child when dropped, so that this test leaves nothing behind
/// even when the code under test does.
struct KillOnDrop(Pid);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if alive(self.0) {
            let _ = nix::sys::signal::kill(self.0, Signal::SIGKILL);
        }
    }
}

#[test]
fn a_killed_test_process_leaves_no_worker_behind() {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([CHILD_TEST, "--exact", "--ignored", "--nocapture"])
        .env(CHILD_MODE_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut test_process = ChildGuard::spawn(command, Signal::SIGKILL).unwrap();
    let stdout = BufReader::new(test_process.stdout.take().unwrap());
    let worker = stdout
        .lines()
        .map_while(Result::ok)
        .find_map(|line| line.strip_prefix(CHILD_REPORT)?.parse::<i32>().ok())
        .map(Pid::from_raw)
        .expect("the child test process did not report its worker");
    let _cleanup = KillOnDrop(worker);
    assert!(alive(worker));

    // A test process killed outright runs no destructor: only the kernel can stop the worker.
    test_process.signal(Signal::SIGKILL);
    test_process.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(worker) {
        assert!(
            Instant::now() < deadline,
            "worker {worker} outlived its killed test process"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
