//! The binary's command line. (Having an integration test here also makes `cargo test
//! --workspace` build the `task-generator` binary that the black-box tests in `tests/` run.)
#![allow(clippy::unwrap_used)]

use std::process::Command;

#[test]
fn help_documents_every_setting_with_its_environment_variable() {
    let output = Command::new(env!("CARGO_BIN_EXE_task-generator"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    for env in [
        "TASK_SERVICE_URL",
        "LEASE_SERVICE_URL",
        "GENERATOR_ID",
        "GENERATOR_LEASE_RESOURCE",
        "GENERATOR_LEASE_TTL_SECONDS",
        "GENERATOR_RETRY_INTERVAL_SECONDS",
        "GENERATOR_SETTINGS_POLL_MS",
        "GENERATOR_QUEUE",
        "METRICS_ADDR",
    ] {
        assert!(
            help.contains(&format!("env: {env}")),
            "--help lacks {env}:\n{help}"
        );
    }
}

#[test]
fn an_impossible_configuration_is_refused() {
    let output = Command::new(env!("CARGO_BIN_EXE_task-generator"))
        .env("TASK_SERVICE_URL", "http://127.0.0.1:1")
        .env("LEASE_SERVICE_URL", "http://127.0.0.1:1")
        .env("GENERATOR_LEASE_TTL_SECONDS", "0")
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("GENERATOR_LEASE_TTL_SECONDS"));
}
