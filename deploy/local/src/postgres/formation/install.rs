//! Finding `pg_autoctl`, and installing it with apt when it is missing and this process is root.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::postgres::PgError;
use crate::postgres::binaries::find_server_binaries;

/// The command to run when `pg_autoctl` is missing and cannot be installed here.
pub fn install_command(major: &str) -> String {
    format!("sudo apt-get install -y postgresql-{major}-auto-failover")
}

/// Finds `pg_autoctl`, installing it with apt when missing and this process is root;
/// [`PgError::AutoFailoverMissing`] names the command to run otherwise.
pub fn ensure_installed() -> Result<PathBuf, PgError> {
    find_pg_autoctl(&find_server_binaries()?)
}

/// `pg_autoctl`, installed with apt when missing and this process is root.
pub(super) fn find_pg_autoctl(bindir: &Path) -> Result<PathBuf, PgError> {
    let major = bindir
        .parent()
        .and_then(Path::file_name)
        .and_then(|name| name.to_str())
        .unwrap_or("15")
        .to_owned();
    let candidates = [
        PathBuf::from("/usr/bin/pg_autoctl"),
        bindir.join("pg_autoctl"),
    ];
    let found = || candidates.iter().find(|path| path.is_file()).cloned();
    if let Some(path) = found() {
        return Ok(path);
    }
    let command = install_command(&major);
    if nix::unistd::geteuid().is_root() {
        tracing::warn!("pg_autoctl not found; installing it: {command}");
        let package = format!("postgresql-{major}-auto-failover");
        let apt = |args: &[&str]| {
            Command::new("apt-get")
                .args(args)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .stdin(Stdio::null())
                .status()
                .is_ok_and(|status| status.success())
        };
        // A fresh machine may have no package lists yet: update only when the install needs it.
        let installed = apt(&["install", "-y", &package])
            || (apt(&["update"]) && apt(&["install", "-y", &package]));
        if installed && let Some(path) = found() {
            return Ok(path);
        }
    }
    Err(PgError::AutoFailoverMissing { command })
}
