//! The binary's command line. (Having an integration test here also makes `cargo test
//! --workspace` build the `task-service` binary that the black-box tests in `tests/` run.)
#![allow(clippy::unwrap_used)]

use std::process::Command;

#[test]
fn help_documents_every_setting_with_its_environment_variable() {
    let output = Command::new(env!("CARGO_BIN_EXE_task-service"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    for env in [
        "DATABASE_URL",
        "LEASE_SERVICE_URL",
        "LISTEN_ADDR",
        "SKIP_MIGRATIONS",
        "DATABASE_POOL_SIZE",
        "READS_IN_FLIGHT",
        "HTTP_WORKERS",
        "TASK_LEASE_TTL_SECONDS",
        "LEASE_CALL_TIMEOUT_MS",
        "TASK_LEASE_PREFIX",
        "TASK_DEFAULT_MAX_ATTEMPTS",
        "TASK_RETRY_BASE_SECONDS",
        "TASK_RETRY_MAX_SECONDS",
        "TASK_RETENTION_SECONDS",
        "TASK_SWEEP_INTERVAL_SECONDS",
        "INSTANCE_ID",
        "SHUTDOWN_GRACE_SECONDS",
        "CLIENT_REQUEST_TIMEOUT_MS",
    ] {
        assert!(
            help.contains(&format!("env: {env}")),
            "--help lacks {env}:\n{help}"
        );
    }
}

#[test]
fn an_impossible_configuration_is_refused_before_anything_starts() {
    let output = Command::new(env!("CARGO_BIN_EXE_task-service"))
        .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
        .env("TASK_RETRY_BASE_SECONDS", "10")
        .env("TASK_RETRY_MAX_SECONDS", "5")
        .env("SKIP_MIGRATIONS", "true")
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("TASK_RETRY_BASE_SECONDS"));
}
