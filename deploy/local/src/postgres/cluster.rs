//! Setting up a cluster on disk: the data directory (created private and owned by the server's
//! user), `initdb`, and where ephemeral clusters live and how stale ones are cleared away.
//! This is the file-system half of [`PrivatePostgres`]; it runs before any server exists, so
//! it is kept apart from the code that starts and stops one.

use std::fs::{self, DirBuilder};
use std::io;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use nix::sys::signal::Signal;

use super::error::PgError;
use crate::process::{pid_alive, send_signal};

use super::server::{read_postmaster_pid, run_checked, serves_data_dir};
use super::{EPHEMERAL_DIR_ENV, EPHEMERAL_DIR_NAME, PrivatePostgres, RunAs, SUPERUSER};

impl PrivatePostgres {
    pub(super) fn initdb(&self, fast: bool) -> Result<(), PgError> {
        let mut command = self.pg_command("initdb");
        command.arg("-D").arg(&self.data_dir).args([
            "-U",
            SUPERUSER,
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
        ]);
        if fast {
            command.arg("--no-sync");
        }
        run_checked(command, format!("initdb -D {}", self.data_dir.display()))?;
        Ok(())
    }
}

/// Creates `dir` and missing parents, world-traversable (0755).
pub(super) fn create_dirs(dir: &Path) -> Result<(), PgError> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(|source| PgError::io(format!("could not create {}", dir.display()), source))
}

pub(super) fn chown_to(path: &Path, run_as: Option<&RunAs>) -> Result<(), PgError> {
    let Some(user) = run_as else {
        return Ok(());
    };
    std::os::unix::fs::chown(path, Some(user.uid.as_raw()), Some(user.gid.as_raw())).map_err(
        |source| {
            PgError::io(
                format!(
                    "could not give {} to the `{}` user",
                    path.display(),
                    user.name
                ),
                source,
            )
        },
    )
}

/// Makes sure `data_dir` exists, is private and belongs to the server's
/// user. Returns whether it already holds a cluster.
pub(super) fn prepare_data_dir(data_dir: &Path, run_as: Option<&RunAs>) -> Result<bool, PgError> {
    let io_error =
        |what: &str, source| PgError::io(format!("{what} {}", data_dir.display()), source);
    match fs::metadata(data_dir) {
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            DirBuilder::new()
                .mode(0o700)
                .create(data_dir)
                .map_err(|source| io_error("could not create", source))?;
            chown_to(data_dir, run_as)?;
            Ok(false)
        }
        Err(source) => Err(io_error("could not inspect", source)),
        Ok(meta) => {
            if data_dir.join("PG_VERSION").is_file() {
                if let Some(user) = run_as
                    && meta.uid() != user.uid.as_raw()
                {
                    return Err(PgError::WrongOwner {
                        path: data_dir.to_path_buf(),
                        user: user.name.clone(),
                        expected: user.uid.as_raw(),
                        found: meta.uid(),
                    });
                }
                return Ok(true);
            }
            let empty = fs::read_dir(data_dir)
                .map_err(|source| io_error("could not read", source))?
                .next()
                .is_none();
            if !empty {
                return Err(PgError::DataDirNotEmpty(data_dir.to_path_buf()));
            }
            chown_to(data_dir, run_as)?;
            fs::set_permissions(data_dir, fs::Permissions::from_mode(0o700))
                .map_err(|source| io_error("could not set permissions of", source))?;
            Ok(false)
        }
    }
}

/// Checks that `user` can traverse every ancestor of `path`.
pub(super) fn check_traversable(path: &Path, user: &RunAs) -> Result<(), PgError> {
    for dir in path.ancestors().skip(1) {
        let Ok(meta) = fs::metadata(dir) else {
            continue;
        };
        let mode = meta.mode();
        let ok = mode & 0o001 != 0
            || (meta.uid() == user.uid.as_raw() && mode & 0o100 != 0)
            || (meta.gid() == user.gid.as_raw() && mode & 0o010 != 0);
        if !ok {
            return Err(PgError::NotTraversable {
                path: dir.to_path_buf(),
                user: user.name.clone(),
            });
        }
    }
    Ok(())
}

/// The cargo target directory of the running executable, if any:
/// `$CARGO_TARGET_DIR` when absolute, else the nearest ancestor of the
/// executable that looks like one (has `CACHEDIR.TAG`, `debug/` or
/// `release/`).
pub fn cargo_target_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .filter(|dir| dir.is_absolute())
    {
        return Some(dir);
    }
    let exe = std::env::current_exe().ok()?;
    exe.ancestors()
        .skip(1)
        .find(|dir| {
            dir.join("CACHEDIR.TAG").is_file()
                || dir.join("debug").is_dir()
                || dir.join("release").is_dir()
        })
        .map(Path::to_path_buf)
}

/// The first usable parent directory for ephemeral clusters.
pub(super) fn ephemeral_base_dir(run_as: Option<&RunAs>) -> Result<PathBuf, PgError> {
    let mut candidates = Vec::new();
    if let Some(dir) = std::env::var_os(EPHEMERAL_DIR_ENV).filter(|dir| !dir.is_empty()) {
        candidates.push(PathBuf::from(dir));
    }
    if let Some(target) = cargo_target_dir() {
        candidates.push(target.join(EPHEMERAL_DIR_NAME));
    }
    candidates.push(std::env::temp_dir().join(EPHEMERAL_DIR_NAME));
    let mut problems = Vec::new();
    for base in candidates {
        let usable = create_dirs(&base).and_then(|()| match run_as {
            // `join` so that `base` itself is checked too.
            Some(user) => check_traversable(&base.join("instance"), user),
            None => Ok(()),
        });
        match usable {
            Ok(()) => return Ok(base),
            Err(error) => {
                tracing::debug!(%error, "not using {} for test clusters", base.display());
                problems.push(error);
            }
        }
    }
    // The temp dir is always a candidate, so there is at least one problem.
    Err(problems
        .pop()
        .unwrap_or_else(|| PgError::io("no directory for test clusters", io::Error::other("none"))))
}

/// Removes cluster directories of processes that no longer exist (and
/// kills a server still running in one, which should not happen thanks to
/// the parent-death signal).
pub(super) fn remove_stale_instances(base: &Path) {
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(owner) = name
            .to_str()
            .and_then(|name| name.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if owner == std::process::id() || pid_alive(owner) {
            continue;
        }
        let dir = entry.path();
        let data_dir = dir.join("data");
        if let Some(pid) = read_postmaster_pid(&data_dir)
            && pid_alive(pid)
            && serves_data_dir(pid, &data_dir)
        {
            tracing::warn!(pid, dir = %dir.display(), "killing a leftover test PostgreSQL");
            let _ = send_signal(pid, Signal::SIGKILL);
        }
        tracing::debug!(dir = %dir.display(), "removing a stale test cluster");
        let _ = fs::remove_dir_all(&dir);
    }
}
