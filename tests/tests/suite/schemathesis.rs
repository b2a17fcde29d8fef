//! Schemathesis, a fuzzer no one here wrote, against both services as real processes on a
//! private PostgreSQL: every check it has, stateful runs that follow the documents' links
//! included. It must find nothing, with auth on and a token for every role, and with auth off,
//! where the documents must not ask for a token the services never check.
//!
//! The budget per service is `SCHEMATHESIS_MAX_EXAMPLES` cases per operation and phase
//! (default 25 with auth on, about a minute a service on two cores; 10 with auth off, whose
//! handlers are the same and differ only in what they ask of a caller); the seed is `SCHEMATHESIS_SEED` (default
//! fixed, so a run repeats). A longer run: `SCHEMATHESIS_MAX_EXAMPLES=500 cargo test --workspace
//! --test suite schemathesis::`. `SCHEMATHESIS_CHECKS` runs only the checks it names, comma-separated
//! (`not_a_server_error`...), to chase one.
//!
//! Every check runs, but for the few `tests/schemathesis.toml` switches off on an operation,
//! each with why.
#![allow(clippy::unwrap_used)]

use tests::tools;

/// What the fuzzer presents: one token with every role of the service it tests.
const TOKEN: &str = "schemathesis-token-0123456789";
/// task-service's own token at lease-service.
const SERVICE_TOKEN: &str = "task-service-token-0123456789";

/// The version this test was written against (4.x; `pip install schemathesis==...`).
const SCHEMATHESIS: &str = "schemathesis==4.32.5";

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

#[tokio::test]
async fn schemathesis_finds_nothing_in_either_service_with_auth_on() {
    let stack = tests::Stack::with()
        .every_role(TOKEN, SERVICE_TOKEN)
        .start()
        .await;
    fuzz(&stack, Some(TOKEN), "25").await;
}

#[tokio::test]
async fn schemathesis_finds_nothing_in_either_service_with_auth_off() {
    fuzz(&tests::Stack::start(&[]).await, None, "10").await;
}

/// Runs schemathesis against each service of `stack`, presenting `token` if any, with
/// `examples` cases per operation and phase unless `SCHEMATHESIS_MAX_EXAMPLES` says otherwise.
async fn fuzz(stack: &tests::Stack, token: Option<&str>, examples: &str) {
    let (leases, tasks) = (&stack.leases, &stack.tasks);
    let bin = tools::python_tools("schemathesis", &[], &[SCHEMATHESIS]).join("schemathesis");
    let examples = env_or("SCHEMATHESIS_MAX_EXAMPLES", examples);
    let seed = env_or("SCHEMATHESIS_SEED", "20261128");
    let mut failed = Vec::new();
    for service in [leases, tasks] {
        let header = token
            .map(|token| {
                vec![
                    "--header".to_owned(),
                    format!("Authorization: Bearer {token}"),
                ]
            })
            .unwrap_or_default();
        let output = tokio::process::Command::new(&bin)
            .arg("--config-file")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/schemathesis.toml"))
            .arg("run")
            .arg(service.url("/api/openapi.json"))
            .args(
                std::env::var("SCHEMATHESIS_CHECKS")
                    .map(|checks| vec!["--checks".to_owned(), checks])
                    .unwrap_or_default(),
            )
            .args(["--phases", "examples,coverage,fuzzing,stateful"])
            .args(["--max-examples", &examples])
            .args(["--seed", &seed])
            .args(["--workers", "1"])
            .args(&header)
            .args(["--request-timeout", "40"])
            .arg("--no-color")
            .kill_on_drop(true)
            .output()
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
        let said = String::from_utf8_lossy(&output.stdout);
        eprintln!("{} (token: {}):\n{said}", service.name, token.is_some());
        if !output.status.success() {
            failed.push(format!(
                "{}:\n{said}\n{}",
                service.name,
                String::from_utf8_lossy(&output.stderr)
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "schemathesis found:\n{}",
        failed.join("\n")
    );
}
