//! The binary's command line. (Having an integration test here also makes `cargo test
//! --workspace` build the `lease-service` binary that the black-box tests in `tests/` run.)
#![allow(clippy::unwrap_used)]

use std::process::Command;

fn lease_service() -> Command {
    Command::new(env!("CARGO_BIN_EXE_lease-service"))
}

#[test]
fn help_documents_every_setting_with_its_environment_variable() {
    let output = lease_service().arg("--help").output().unwrap();
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    for env in [
        "DATABASE_URL",
        "LISTEN_ADDR",
        "SKIP_MIGRATIONS",
        "DATABASE_POOL_SIZE",
        "HTTP_WORKERS",
        "LEASE_DEFAULT_TTL_SECONDS",
        "LEASE_MIN_TTL_SECONDS",
        "LEASE_MAX_TTL_SECONDS",
        "LEASE_RETENTION_SECONDS",
        "LEASE_SWEEP_INTERVAL_SECONDS",
        "INSTANCE_ID",
        "SHUTDOWN_GRACE_SECONDS",
        "CLIENT_REQUEST_TIMEOUT_MS",
    ] {
        assert!(
            help.contains(&format!("env: {env}")),
            "--help lacks {env}:\n{help}"
        );
    }
    assert!(help.contains("migrate"));
}

#[test]
fn an_impossible_configuration_is_refused_before_anything_starts() {
    let output = lease_service()
        .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
        .env("LEASE_MIN_TTL_SECONDS", "10")
        .env("LEASE_MAX_TTL_SECONDS", "5")
        .env("SKIP_MIGRATIONS", "true")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("LEASE_MIN_TTL_SECONDS"), "{stderr}");
}

#[test]
fn without_a_database_url_it_says_so() {
    let output = lease_service()
        .env_remove("DATABASE_URL")
        .arg("migrate")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("DATABASE_URL"));
}
