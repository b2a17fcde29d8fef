//! Child processes that cannot outlive their test: where cargo put the binaries, the
//! [`ChildGuard`] that owns a child, and killing a whole process tree read from `/proc`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;

/// Where cargo put the workspace's binaries: beside the `deps` folder this test runs from.
/// `LEASEHOLD_BIN_DIR` overrides it.
pub fn binary(name: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("LEASEHOLD_BIN_DIR") {
        return PathBuf::from(dir).join(name);
    }
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe
        .ancestors()
        .find(|dir| dir.file_name().is_some_and(|n| n == "deps"))
        .and_then(Path::parent)
        .unwrap_or_else(|| exe.parent().unwrap());
    let path = profile_dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: run the tests with `cargo test --workspace` (it builds every binary)",
        path.display()
    );
    path
}

/// The cargo target directory this test, the bench or the soak runs from: where tests keep what
/// they install and log. Not derived from the binaries under test, which `LEASEHOLD_BIN_DIR` may
/// put anywhere (a run against other builds' binaries would otherwise log beside them).
pub fn target_dir() -> PathBuf {
    leasehold_local::postgres::cargo_target_dir().unwrap_or_else(|| {
        binary("lease-service")
            .parent()
            .and_then(Path::parent)
            .map_or_else(std::env::temp_dir, Path::to_owned)
    })
}

/// A child process that cannot outlive its test. Dropping the guard (also while a panic
/// unwinds) kills the process and every process it started; and should the test process die
/// without running destructors (a `SIGKILL`, an abort), the kernel sends the child
/// `death_signal` (`PR_SET_PDEATHSIG`, see [`leasehold_local::process`]).
///
/// It derefs to the [`Child`], to wait for it or read its pipes.
#[derive(Debug)]
pub struct ChildGuard {
    child: Child,
}

impl ChildGuard {
    /// Spawns `command` under a guard.
    pub fn spawn(command: Command, death_signal: Signal) -> std::io::Result<ChildGuard> {
        let child = leasehold_local::process::spawn_tied_to_process(command, death_signal)?;
        Ok(ChildGuard { child })
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).unwrap())
    }

    /// Sends `signal` to the process (not to its descendants).
    pub fn signal(&self, signal: Signal) {
        nix::sys::signal::kill(self.pid(), signal).unwrap();
    }

    /// Kills the process and all its descendants, and reaps it.
    pub fn kill_tree(&mut self) {
        // Once reaped, its pid may belong to someone else; a zombie's may not.
        if let Ok(None) = self.child.try_wait() {
            kill_process_tree(self.child.id());
        }
        let _ = self.child.wait();
    }
}

impl std::ops::Deref for ChildGuard {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.child
    }
}

impl std::ops::DerefMut for ChildGuard {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.child
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill_tree();
    }
}

pub use leasehold_local::process::{descendants, stat_after_comm};

/// Kills `root` and every descendant with `SIGKILL`, and waits until the descendants are gone
/// (`root`, the caller's child, is the caller's to reap). Each is stopped first, so that none
/// can start another process or be reparented out of sight while the tree is read.
pub fn kill_process_tree(root: u32) {
    let signal = |pid: u32, signal: Signal| {
        if let Ok(pid) = i32::try_from(pid) {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), signal);
        }
    };
    signal(root, Signal::SIGSTOP);
    let mut stopped = vec![root];
    loop {
        let mut new = descendants(root);
        new.retain(|pid| !stopped.contains(pid));
        if new.is_empty() {
            break;
        }
        for pid in new {
            signal(pid, Signal::SIGSTOP);
            stopped.push(pid);
        }
    }
    for &pid in &stopped {
        signal(pid, Signal::SIGKILL);
    }
    // A signal is delivered asynchronously: wait, so that nothing is left once this returns.
    let deadline = Instant::now() + Duration::from_secs(10);
    while stopped
        .iter()
        .any(|&pid| pid != root && leasehold_local::process::pid_alive(pid))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use std::process::Stdio;

    use super::*;

    /// A test that panics with a process tree running leaves none of it behind.
    #[test]
    fn a_guard_kills_its_whole_tree_when_its_test_panics() {
        let mut command = Command::new("sh");
        command
            .args(["-c", "sleep 300 & sleep 300 & wait"])
            .stdin(Stdio::null());
        let guard = ChildGuard::spawn(command, Signal::SIGKILL).unwrap();
        let root = guard.id();
        let deadline = Instant::now() + Duration::from_secs(30);
        let tree = loop {
            let children = descendants(root);
            if children.len() == 2 {
                break children;
            }
            assert!(Instant::now() < deadline, "the shell started {children:?}");
            std::thread::sleep(Duration::from_millis(20));
        };
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _guard = guard;
            panic!("a failing test");
        }));
        assert!(panicked.is_err());
        for pid in tree.into_iter().chain([root]) {
            assert!(
                !leasehold_local::process::pid_alive(pid),
                "{pid} outlived its test"
            );
        }
    }

    /// Logs and tools stay under the target directory the test runs from, even when
    /// `LEASEHOLD_BIN_DIR` names binaries elsewhere (as the bench's A/B runs do).
    #[test]
    fn tests_keep_their_files_in_the_target_directory_they_run_from() {
        let exe = std::env::current_exe().unwrap();
        assert!(
            exe.starts_with(target_dir()),
            "{} is not under {}",
            exe.display(),
            target_dir().display()
        );
    }
}
