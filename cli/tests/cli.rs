//! The binary's command line. (Having an integration test here also makes `cargo test
//! --workspace` build the `leasehold` binary that the black-box tests in `tests/` run: cargo
//! builds a package's binaries for a test run only when the package has integration tests of
//! its own, and without this one a fresh clone's `cargo test --workspace` failed ten tests.)
#![allow(clippy::unwrap_used)]

use std::process::Command;

fn leasehold() -> Command {
    Command::new(env!("CARGO_BIN_EXE_leasehold"))
}

#[test]
fn help_lists_every_command_group() {
    let output = leasehold().arg("--help").output().unwrap();
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    for group in [
        "leases",
        "tasks",
        "queues",
        "schedules",
        "workers",
        "generator",
    ] {
        assert!(help.contains(group), "--help lacks {group}:\n{help}");
    }
}

#[test]
fn an_unknown_command_is_refused_with_usage() {
    let output = leasehold().arg("no-such-command").output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("Usage"));
}
