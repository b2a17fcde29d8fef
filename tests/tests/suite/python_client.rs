//! A client in a second language, generated from the documents alone: openapi-python-client
//! (PyPI, pinned, installed under `target/`) writes a Python package for each service from its
//! `GET /api/openapi.json`, and `tests/python/drive.py` drives one lease's life and one task's
//! life through them against both services, auth on. The documents are then enough to write a
//! worker in another language.
#![allow(clippy::unwrap_used)]

use tests::tools;

const TOKEN: &str = "python-client-token-0123456789";
const SERVICE_TOKEN: &str = "task-service-token-0123456789";

#[tokio::test]
async fn a_generated_python_client_drives_a_lease_and_a_task() {
    let stack = tests::Stack::with()
        .every_role(TOKEN, SERVICE_TOKEN)
        .start()
        .await;
    let (leases, tasks) = (&stack.leases, &stack.tasks);
    let bin = tools::python_tools(
        "python-client",
        &[],
        &[
            "openapi-python-client==0.29.1",
            "ruff==0.17.6",
            "python-dateutil",
        ],
    );
    // Generated under the test's own directory, removed when it passes.
    let dir = tests::log_dir().join(format!("python-client-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (package, service) in [("lease_client", leases), ("task_client", tasks)] {
        let document = reqwest::get(service.url("/api/openapi.json"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let path = dir.join(format!("{package}.json"));
        std::fs::write(&path, document).unwrap();
        let output = std::process::Command::new(bin.join("openapi-python-client"))
            .args(["generate", "--meta", "none", "--overwrite", "--path"])
            .arg(&path)
            .arg("--output-path")
            .arg(dir.join(package))
            .env("PATH", path_with(&bin))
            .output()
            .unwrap();
        // It warns, and leaves an operation out, where it cannot read a schema.
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            output.status.success() && !said.contains("Warning"),
            "openapi-python-client on {}'s document:\n{said}",
            service.name
        );
    }
    let output = tokio::process::Command::new(bin.join("python"))
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/python/drive.py"))
        .args([leases.base_url(), tasks.base_url(), TOKEN.to_owned()])
        .env("PYTHONPATH", &dir)
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "drive.py:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `PATH` with the tools' directory first, so that the generator finds its `ruff`.
fn path_with(bin: &std::path::Path) -> std::ffi::OsString {
    let mut paths = vec![bin.to_path_buf()];
    paths.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(paths).unwrap()
}
