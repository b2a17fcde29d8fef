//! The real `leasehold-local` binary leaves nothing behind of the commands it runs to its end
//! before the services start (`cargo build`, the migrations), and neither of what those start,
//! however it is stopped while they run.

#![allow(clippy::unwrap_used)]

use std::fs::File;
use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use leasehold_local::postgres::PrivatePostgres;
use leasehold_local::process::{pid_alive, send_signal, spawn_tied_to_process};
use nix::sys::signal::Signal;

/// Stands in for cargo and for `lease-service migrate`: starts a process of its own, as cargo
/// starts rustc, reports both pids in `$PIDS_FILE` and waits.
const FAKE_COMMAND: &str = r#"#!/bin/sh
sleep 300 &
echo "$$ $!" > "$PIDS_FILE.tmp"
mv "$PIDS_FILE.tmp" "$PIDS_FILE"
wait
"#;

/// A scratch directory holding the fake command (as `cargo` and as `lease-service`), the pids
/// it reports and leasehold-local's log; killing on drop whatever the test found running.
struct Scratch {
    dir: PathBuf,
    pids: Vec<u32>,
}

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "leasehold-local-children-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for program in ["cargo", "lease-service"] {
            let path = dir.join(program);
            std::fs::write(&path, FAKE_COMMAND).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Scratch {
            dir,
            pids: Vec::new(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path("leasehold-local.log")).unwrap_or_default()
    }

    /// Starts leasehold-local with `args` and `env`, on ports of its own; it dies with this test
    /// process.
    fn start(&self, args: &[&str], env: &[(&str, &str)]) -> Runner {
        let log = File::create(self.path("leasehold-local.log")).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_leasehold-local"));
        command
            .args(own_ports())
            .args(args)
            .env("CARGO", self.path("cargo"))
            .env("PIDS_FILE", self.path("pids"))
            .env("LEASEHOLD_HOME", self.path("home"))
            .env("LEASEHOLD_BIN_DIR", &self.dir)
            .env_remove("DATABASE_URL")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        Runner(spawn_tied_to_process(command, Signal::SIGKILL).unwrap())
    }

    /// The fake command's pid and its child's, once it has reported them.
    fn wait_for_fake_command(&mut self) -> [u32; 2] {
        let file = self.path("pids");
        let deadline = Instant::now() + Duration::from_secs(60);
        let pids = loop {
            if let Ok(text) = std::fs::read_to_string(&file) {
                let pids: Vec<u32> = text
                    .split_whitespace()
                    .map(|pid| pid.parse().unwrap())
                    .collect();
                break [pids[0], pids[1]];
            }
            assert!(
                Instant::now() < deadline,
                "the fake command did not start; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        self.pids.extend(pids);
        pids
    }

    fn assert_gone(&self, pids: [u32; 2], when: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while pids.iter().any(|&pid| pid_alive(pid)) {
            assert!(
                Instant::now() < deadline,
                "{when}: still running: {:?} of {pids:?}; log:\n{}",
                pids.iter()
                    .filter(|&&pid| pid_alive(pid))
                    .collect::<Vec<_>>(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for &pid in &self.pids {
            if pid_alive(pid) {
                let _ = send_signal(pid, Signal::SIGKILL);
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Ports for every listener a stack would have, free when asked: leasehold-local refuses a taken
/// port before it runs anything, and on the default ports the tests of this file, running at
/// once, took them from each other (CI failed with "lease-service cannot listen on
/// 127.0.0.1:8081: another process holds the port"), as a developer's running stack would.
fn own_ports() -> Vec<String> {
    const SPAN: u16 = 40;
    loop {
        let base = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let Some(end) = base.checked_add(SPAN) else {
            continue;
        };
        if (base..end).all(|port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()) {
            return [
                ("--lease-service-port", base),
                ("--task-service-port", base + 1),
                // Worker i and generator replica i listen on their first port + i.
                ("--worker-metrics-port", base + 2),
                ("--generator-metrics-port", base + SPAN / 2),
            ]
            .into_iter()
            .flat_map(|(flag, port)| [flag.to_owned(), port.to_string()])
            .collect();
        }
    }
}

/// leasehold-local, killed when dropped.
struct Runner(Child);

impl Runner {
    fn signal(&self, signal: Signal) {
        send_signal(self.0.id(), signal).unwrap();
    }

    fn wait(&mut self) -> std::process::ExitStatus {
        self.0.wait().unwrap()
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn check_build(signal: Signal) {
    let mut scratch = Scratch::new(&format!("build-{signal}"));
    let mut runner = scratch.start(&[], &[]);
    let pids = scratch.wait_for_fake_command();
    runner.signal(signal);
    runner.wait();
    scratch.assert_gone(
        pids,
        &format!("leasehold-local got {signal} during the build"),
    );
}

#[test]
fn a_build_is_stopped_with_all_it_started_when_leasehold_local_is_stopped() {
    check_build(Signal::SIGTERM);
}

#[test]
fn a_build_dies_with_all_it_started_when_leasehold_local_is_killed() {
    check_build(Signal::SIGKILL);
}

#[test]
fn a_migration_dies_with_all_it_started_when_leasehold_local_is_killed() {
    let pg = PrivatePostgres::start_ephemeral().unwrap();
    let mut scratch = Scratch::new("migrate");
    let url = pg.url("postgres");
    let mut runner = scratch.start(&["--no-build"], &[("DATABASE_URL", &url)]);
    let pids = scratch.wait_for_fake_command();
    runner.signal(Signal::SIGKILL);
    runner.wait();
    scratch.assert_gone(pids, "leasehold-local was killed during the migration");
}
