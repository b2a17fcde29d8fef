//! Finding (and, as root on Debian/Ubuntu, installing) the PostgreSQL server binaries.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use super::error::PgError;

/// Where PostgreSQL packages for Debian/Ubuntu put their versioned binaries.
const DEBIAN_PG_ROOT: &str = "/usr/lib/postgresql";

/// Programs a usable bin directory must contain.
const REQUIRED: [&str; 3] = ["postgres", "initdb", "pg_ctl"];

static FOUND: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Finds the directory holding the PostgreSQL server binaries (`postgres`,
/// `initdb`, `pg_ctl`).
///
/// Looks, in order, at `$PG_BINDIR` (an error if it is set but wrong),
/// `pg_config --bindir`, the highest `/usr/lib/postgresql/<version>/bin`, and
/// `$PATH`. When nothing is found and this process runs as root on a system
/// with `apt-get`, it runs `apt-get update` and `apt-get install -y
/// postgresql` (output shown on this terminal) and looks again. Otherwise the
/// error names the command to run ([`super::INSTALL_COMMAND`]).
///
/// The answer is cached for the life of the process.
pub fn find_server_binaries() -> Result<PathBuf, PgError> {
    // Serialises concurrent callers, so parallel tests install at most once.
    let mut found = FOUND
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(dir) = found.as_ref() {
        return Ok(dir.clone());
    }
    let dir = match locate()? {
        Some(dir) => dir,
        None if nix::unistd::geteuid().is_root() && find_in_path("apt-get").is_some() => {
            install_with_apt()?;
            locate()?.ok_or(PgError::BinariesNotFound)?
        }
        None => return Err(PgError::BinariesNotFound),
    };
    tracing::debug!(bindir = %dir.display(), "found the PostgreSQL server binaries");
    *found = Some(dir.clone());
    Ok(dir)
}

fn locate() -> Result<Option<PathBuf>, PgError> {
    if let Some(dir) = std::env::var_os("PG_BINDIR").filter(|dir| !dir.is_empty()) {
        let dir = PathBuf::from(dir);
        return if has_server_binaries(&dir) {
            Ok(Some(dir))
        } else {
            Err(PgError::InvalidBinDir(dir))
        };
    }
    if let Some(dir) = pg_config_bindir().filter(|dir| has_server_binaries(dir)) {
        return Ok(Some(dir));
    }
    if let Some(dir) = highest_debian_bindir() {
        return Ok(Some(dir));
    }
    Ok(bindir_from_path())
}

fn pg_config_bindir() -> Option<PathBuf> {
    let output = Command::new("pg_config")
        .arg("--bindir")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let dir = String::from_utf8(output.stdout).ok()?;
    let dir = dir.trim();
    (!dir.is_empty()).then(|| PathBuf::from(dir))
}

fn highest_debian_bindir() -> Option<PathBuf> {
    let entries = std::fs::read_dir(DEBIAN_PG_ROOT).ok()?;
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = version_key(entry.file_name().to_str()?)?;
            let bindir = entry.path().join("bin");
            has_server_binaries(&bindir).then_some((version, bindir))
        })
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, bindir)| bindir)
}

/// "15" → [15], "9.6" → [9, 6]; anything else is not a version directory.
fn version_key(name: &str) -> Option<Vec<u32>> {
    name.split('.').map(|part| part.parse().ok()).collect()
}

fn bindir_from_path() -> Option<PathBuf> {
    let postgres = find_in_path("postgres")?;
    // Prefer the real directory: /usr/local/bin/postgres may be a symlink
    // into /usr/lib/postgresql/<version>/bin.
    if let Some(dir) = std::fs::canonicalize(&postgres)
        .ok()
        .and_then(|real| real.parent().map(Path::to_path_buf))
        .filter(|dir| has_server_binaries(dir))
    {
        return Some(dir);
    }
    postgres
        .parent()
        .map(Path::to_path_buf)
        .filter(|dir| has_server_binaries(dir))
}

pub(crate) fn find_in_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
}

fn has_server_binaries(dir: &Path) -> bool {
    REQUIRED
        .iter()
        .all(|program| is_executable(&dir.join(program)))
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

fn install_with_apt() -> Result<(), PgError> {
    tracing::warn!(
        "PostgreSQL server binaries not found; installing them: apt-get update && apt-get install -y postgresql"
    );
    for args in [&["update"][..], &["install", "-y", "postgresql"][..]] {
        let command = format!("apt-get {}", args.join(" "));
        tracing::info!("running `{command}`");
        let status = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .status()
            .map_err(|source| PgError::io(format!("could not run `{command}`"), source))?;
        if !status.success() {
            return Err(PgError::InstallFailed {
                command,
                status: status.to_string(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::version_key;

    #[test]
    fn version_keys_order_numerically() {
        assert!(version_key("15") > version_key("9.6"));
        assert!(version_key("16") > version_key("15"));
        assert_eq!(version_key("main"), None);
    }
}
