//! Building the binaries and running migrations: everything the runner does with a child it
//! runs to its end, rather than one it keeps running. These share [`run_to_end`], which puts
//! the child in a process group of its own so Ctrl-C during a build stops rustc and build
//! scripts too, which is why they live apart from the long-running service children.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context as _, bail, ensure};
use nix::sys::signal::Signal;

use crate::postgres::redact_url;
use crate::process::spawn_group_tied_to_process;

use super::config::{ServiceSpec, StackConfig};
use super::{CLI_PACKAGE, POLL_INTERVAL};

/// `cargo`'s arguments that build every binary the stack runs, in this binary's profile: what
/// [`build`] runs, and what the advice for a binary that is not built names, so that the two
/// cannot disagree.
pub fn build_args(services: &[ServiceSpec]) -> Vec<String> {
    let mut args = vec!["build".to_owned(), "--bins".to_owned()];
    for package in build_packages(services) {
        args.push("-p".to_owned());
        args.push(package.to_owned());
    }
    if !cfg!(debug_assertions) {
        args.push("--release".to_owned());
    }
    args
}

/// `$CARGO build --bins -p PKG...` in this binary's profile.
pub(super) async fn build(config: &StackConfig, services: &[ServiceSpec]) -> anyhow::Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let args = build_args(services);
    let shown = format!("cargo {}", args.join(" "));
    tracing::info!("building the services and the CLI: {shown}");
    let mut command = Command::new(&cargo);
    command
        .args(&args)
        .current_dir(&config.workspace_root)
        .stdin(Stdio::null());
    let status = run_to_end(command).await.with_context(|| {
        format!(
            "could not run `{shown}` (cargo: {})",
            cargo.to_string_lossy()
        )
    })?;
    ensure!(
        status.success(),
        "`{shown}` failed ({status}) in {}; fix the errors above (--no-build runs binaries built before, if there are any)",
        config.workspace_root.display()
    );
    Ok(())
}

/// The packages `leasehold-local` builds: every service's, and the CLI's.
pub fn build_packages(services: &[ServiceSpec]) -> BTreeSet<&'static str> {
    services
        .iter()
        .map(|service| service.package)
        .chain([CLI_PACKAGE])
        .collect()
}

/// Runs `binary MIGRATE_ARGS` once with the service's environment.
pub(super) async fn migrate(
    service: &ServiceSpec,
    binary: &Path,
    args: &[String],
) -> anyhow::Result<()> {
    let shown = format!("{} {}", service.binary, args.join(" "));
    tracing::info!("running `{shown}`");
    let mut command = Command::new(binary);
    command
        .args(args)
        .envs(service.env.iter().map(|(name, value)| (name, value)))
        .stdin(Stdio::null());
    let status = run_to_end(command)
        .await
        .with_context(|| format!("could not run {}", binary.display()))?;
    if !status.success() {
        let database = service
            .env
            .iter()
            .find(|(name, _)| *name == "DATABASE_URL")
            .map(|(_, url)| format!(" against {}", redact_url(url)))
            .unwrap_or_default();
        bail!("`{shown}` failed ({status}){database}; see its output above");
    }
    Ok(())
}

/// Runs `command` to its end, in a process group of its own that dies with this process, or as
/// soon as the returned future is dropped (Ctrl-C during the build): cargo passes no signal on
/// to rustc and build scripts, so killing cargo alone would leave them compiling.
pub(super) async fn run_to_end(command: Command) -> io::Result<std::process::ExitStatus> {
    let mut group = spawn_group_tied_to_process(command, Signal::SIGKILL)?;
    loop {
        if let Some(status) = group.try_wait()? {
            return Ok(status);
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stack::{CLI_BINARY, services};

    #[test]
    fn clients_stop_before_the_services_they_use_and_the_cli_is_built() {
        let config = StackConfig::new();
        let table = services(&config, &config.databases());
        let stage = |binary: &str| {
            table
                .iter()
                .find(|service| service.binary == binary)
                .map(|service| service.stop_stage)
                .expect("in the table")
        };
        assert!(stage("worker") < stage("task-service"));
        assert!(stage("task-generator") < stage("task-service"));
        assert!(stage("task-service") < stage("lease-service"));
        let packages = build_packages(&table);
        assert!(packages.contains(CLI_PACKAGE), "{packages:?}");
        for service in &table {
            assert!(packages.contains(service.package), "{packages:?}");
        }
    }

    /// A package renamed in its `Cargo.toml` but not here made the README's first command fail
    /// on a fresh clone (`package ID specification `worker` did not match any packages`), and
    /// only a build could tell: so ask cargo what the workspace holds, and which binaries.
    #[test]
    fn every_package_and_binary_the_stack_builds_is_in_the_workspace() {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
        let output = Command::new(cargo)
            .args([
                "metadata",
                "--no-deps",
                "--format-version",
                "1",
                "--offline",
            ])
            .current_dir(crate::stack::workspace_root())
            .output()
            .expect("cargo metadata runs");
        assert!(output.status.success(), "{output:?}");
        let metadata: serde_json::Value =
            serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON");
        let packages = metadata["packages"].as_array().expect("a package list");
        let binaries_of = |name: &str| -> Option<Vec<String>> {
            let package = packages.iter().find(|p| p["name"] == name)?;
            Some(
                package["targets"]
                    .as_array()?
                    .iter()
                    .filter(|t| {
                        t["kind"]
                            .as_array()
                            .is_some_and(|k| k.contains(&"bin".into()))
                    })
                    .filter_map(|t| t["name"].as_str().map(str::to_owned))
                    .collect(),
            )
        };
        let config = StackConfig::new();
        let table = services(&config, &config.databases());
        for package in build_packages(&table) {
            assert!(
                binaries_of(package).is_some(),
                "the stack builds `{package}`, which is no package of the workspace"
            );
        }
        for service in &table {
            let binaries = binaries_of(service.package).unwrap_or_default();
            assert!(
                binaries.iter().any(|b| b == service.binary),
                "the stack runs `{}`, which package `{}` does not build (it builds {binaries:?})",
                service.binary,
                service.package
            );
        }
        let cli = binaries_of(CLI_PACKAGE).unwrap_or_default();
        assert!(cli.iter().any(|b| b == CLI_BINARY), "{cli:?}");
    }
}
