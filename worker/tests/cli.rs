//! The real `worker` binary: its help, its refusal of bad configuration, its exit status
//! after SIGTERM/SIGINT and its metrics endpoint. Its work against real services is tested in
//! `tests/tests/workers.rs`.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

fn worker() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_worker"));
    command
        .env_clear()
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// A worker under test, killed when dropped: a failed assertion must not leave behind a worker
/// that polls forever.
struct Running(Option<Child>);

impl Running {
    fn spawn(command: &mut Command) -> Running {
        Running(Some(command.spawn().unwrap()))
    }

    fn child(&mut self) -> &mut Child {
        self.0.as_mut().unwrap()
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.0.as_ref().unwrap().id()).unwrap())
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
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn wait_with_timeout(mut running: Running, timeout: Duration) -> Output {
    let started = Instant::now();
    let child = running.child();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > timeout {
            let _ = child.kill();
            let output = running.0.take().unwrap().wait_with_output().unwrap();
            panic!(
                "worker did not exit within {timeout:?}; stderr:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    running.0.take().unwrap().wait_with_output().unwrap()
}

#[test]
fn help_lists_every_setting() {
    let output = worker().arg("--help").output().unwrap();
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    for name in [
        "TASK_SERVICE_URL",
        "WORKER_ID",
        "WORKER_QUEUE",
        "WORKER_CONCURRENCY",
        "HEARTBEAT_INTERVAL_SECONDS",
        "LEASE_TTL_SECONDS",
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
fn a_heartbeat_interval_over_half_the_ttl_is_refused() {
    let child = Running::spawn(
        worker()
            .env("TASK_SERVICE_URL", "http://127.0.0.1:1")
            .env("HEARTBEAT_INTERVAL_SECONDS", "20")
            .env("LEASE_TTL_SECONDS", "30"),
    );
    let output = wait_with_timeout(child, Duration::from_secs(10));
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("HEARTBEAT_INTERVAL_SECONDS") && stderr.contains("LEASE_TTL_SECONDS"),
        "{stderr}"
    );
}

#[test]
fn other_bad_settings_are_refused_by_name() {
    for (name, value) in [
        ("WORKER_CONCURRENCY", "0"),
        ("CHAOS_CRASH_PROBABILITY", "2"),
        ("TASK_SERVICE_URL", "not a url"),
        ("POLL_MIN_MS", "0"),
    ] {
        let child = Running::spawn(
            worker()
                .env("TASK_SERVICE_URL", "http://127.0.0.1:1")
                .env(name, value),
        );
        let output = wait_with_timeout(child, Duration::from_secs(10));
        assert!(!output.status.success(), "{name}={value} accepted");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(name), "{name}={value}: {stderr}");
    }
    let output = worker().output().unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("TASK_SERVICE_URL"));
}

#[test]
fn sigterm_and_sigint_stop_it_with_status_zero() {
    for signal in [Signal::SIGTERM, Signal::SIGINT] {
        // Nothing listens on port 1: the worker keeps polling with backoff until signalled.
        let child = Running::spawn(
            worker()
                .env("TASK_SERVICE_URL", "http://127.0.0.1:1")
                .env("POLL_MAX_MS", "200"),
        );
        child.wait_for_signal_handlers();
        kill(child.pid(), signal).unwrap();
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
    let mut child = Running::spawn(
        worker()
            .env("TASK_SERVICE_URL", "http://127.0.0.1:1")
            .env("METRICS_ADDR", "127.0.0.1:0")
            .env("LOG_FORMAT", "json"),
    );
    // Find the bound address in the JSON log, and keep draining stderr afterwards.
    let stderr = child.child().stderr.take().unwrap();
    let (found, address) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(stderr).lines() {
            let line = line.unwrap();
            if let Ok(event) = serde_json::from_str::<serde_json::Value>(&line)
                && event["fields"]["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("metrics listening"))
            {
                let _ = found.send(event["fields"]["address"].as_str().unwrap().to_owned());
            }
            lines.push(line);
        }
        lines
    });
    let address = address.recv_timeout(Duration::from_secs(10)).unwrap();

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
    kill(child.pid(), Signal::SIGTERM).unwrap();
    let output = wait_with_timeout(child, Duration::from_secs(10));
    let lines = reader.join().unwrap();
    assert!(output.status.success(), "{}", lines.join("\n"));
}
