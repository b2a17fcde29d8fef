//! Child processes that cannot outlive this process.
//!
//! Linux's `PR_SET_PDEATHSIG` makes the kernel send a signal to a child when
//! its parent dies. "Parent" means the *thread* that forked the child, not
//! the whole process, so children are spawned from one dedicated thread that
//! lives until the process exits. When the process exits for any reason
//! (normal return, `std::process::exit` without destructors, a panic abort,
//! `SIGKILL`), that thread dies with it and the kernel signals the children.
//!
//! The signal reaches only the child itself, not the processes it starts (cargo does not pass
//! a signal on to rustc or build scripts), so [`spawn_group_tied_to_process`] runs a command
//! in a process group of its own that is killed as a whole.

use std::io;
use std::os::unix::process::CommandExt as _;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;

use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

struct SpawnRequest {
    command: Command,
    reply: mpsc::Sender<io::Result<Child>>,
}

static SPAWNER: OnceLock<Option<mpsc::Sender<SpawnRequest>>> = OnceLock::new();

fn start_spawner_thread() -> Option<mpsc::Sender<SpawnRequest>> {
    let (tx, rx) = mpsc::channel::<SpawnRequest>();
    let spawned = std::thread::Builder::new()
        .name("leasehold-child-spawner".to_owned())
        .spawn(move || {
            // The sender lives in a static, so this loop only ends if the
            // process is going away anyway. Either way the thread must not
            // exit: its exit would fire the parent-death signal of every
            // child it spawned.
            for mut request in rx.iter() {
                let result = request.command.spawn();
                // The requester may have given up waiting; then the child is
                // dropped here and keeps running, tied to this thread.
                let _ = request.reply.send(result);
            }
            loop {
                std::thread::park();
            }
        });
    match spawned {
        Ok(_detached) => Some(tx),
        Err(error) => {
            tracing::error!(%error, "could not start the child-spawner thread");
            None
        }
    }
}

/// Spawns `command` so that the kernel sends it `death_signal` as soon as
/// this process exits, even if the process exits without running any
/// destructors (as test binaries do for statics) or is killed with
/// `SIGKILL`.
///
/// The child is forked from a dedicated thread that lives for the rest of
/// the process. Credentials set with
/// [`std::os::unix::process::CommandExt::uid`]/`gid` are compatible: std
/// switches user before it runs the closure that arms the signal (a change
/// of credentials would otherwise clear it).
///
/// Do not add other `pre_exec` hooks that change credentials to `command`.
pub fn spawn_tied_to_process(mut command: Command, death_signal: Signal) -> io::Result<Child> {
    arm_parent_death_signal(&mut command, death_signal);
    let spawner = SPAWNER
        .get_or_init(start_spawner_thread)
        .as_ref()
        .ok_or_else(|| io::Error::other("the child-spawner thread could not be started"))?;
    let (reply, answer) = mpsc::channel();
    spawner
        .send(SpawnRequest { command, reply })
        .map_err(|_| io::Error::other("the child-spawner thread is gone"))?;
    answer
        .recv()
        .map_err(|_| io::Error::other("the child-spawner thread did not answer"))?
}

/// A command running in a process group of its own, with everything it started: killed as a
/// whole (`SIGKILL`) when dropped, and when this process dies, however it dies.
#[derive(Debug)]
pub struct TiedGroup {
    /// The command's process.
    leader: Child,
    /// `sh`, the group's first member, blocked reading `keeper_stdin`. This process holds the
    /// only copy of the write end, so the read returns once this process is gone, and the
    /// keeper then kills its own group. Being in the group, it also keeps the group's id from
    /// being reused, so the group can be killed by id without a race.
    keeper: Child,
    keeper_stdin: Option<ChildStdin>,
}

/// Spawns `command` in a new process group that dies with this process (see [`TiedGroup`]).
/// The command's own process also gets `death_signal`, as with [`spawn_tied_to_process`].
pub fn spawn_group_tied_to_process(
    mut command: Command,
    death_signal: Signal,
) -> io::Result<TiedGroup> {
    let mut keeper = Command::new("/bin/sh")
        .args(["-c", "read _; kill -KILL 0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()?;
    let keeper_stdin = keeper.stdin.take();
    let pgid = keeper.id();
    command.process_group(i32::try_from(pgid).map_err(io::Error::other)?);
    match spawn_tied_to_process(command, death_signal) {
        Ok(leader) => Ok(TiedGroup {
            leader,
            keeper,
            keeper_stdin,
        }),
        Err(error) => {
            let _ = keeper.kill();
            let _ = keeper.wait();
            Err(error)
        }
    }
}

impl TiedGroup {
    /// The pid of the command's process.
    pub fn id(&self) -> u32 {
        self.leader.id()
    }

    /// The command's exit status, if it has exited (what it started may still run until the
    /// group is dropped).
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        self.leader.try_wait()
    }
}

impl Drop for TiedGroup {
    fn drop(&mut self) {
        // The keeper is not reaped yet, so the group id is still this group's.
        if let Ok(pgid) = i32::try_from(self.keeper.id()) {
            let _ = nix::sys::signal::killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        }
        drop(self.keeper_stdin.take());
        let _ = self.keeper.wait();
        let _ = self.leader.wait();
    }
}

/// Makes the child ask the kernel for `signal` when its parent thread dies.
#[allow(unsafe_code)]
fn arm_parent_death_signal(command: &mut Command, signal: Signal) {
    use std::os::unix::process::CommandExt as _;

    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before `exec`, where only
    // async-signal-safe operations are allowed. It only makes the prctl(2)
    // and getppid(2) system calls and builds `io::Error`s from raw errno
    // values, which does not allocate. std runs `pre_exec` closures after
    // applying `CommandExt::gid`/`uid`, so the credential change (which
    // clears the parent-death signal) happens before the signal is armed.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(signal)
                .map_err(|errno| io::Error::from_raw_os_error(errno as i32))?;
            // The parent may have died between fork and prctl; then the
            // signal would never come, so refuse to start.
            if nix::unistd::getppid().as_raw() as u32 != parent {
                return Err(io::Error::from_raw_os_error(Errno::ESRCH as i32));
            }
            Ok(())
        });
    }
}

/// Whether a process with this pid exists and is not a zombie.
pub fn pid_alive(pid: u32) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    match nix::sys::signal::kill(Pid::from_raw(raw), None) {
        Ok(()) | Err(Errno::EPERM) => {}
        Err(_) => return false,
    }
    // A zombie (exited, not yet reaped by its parent) is not alive.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // Format: "pid (comm) state ...". comm may contain spaces and
            // parentheses, so look after the last ')'.
            let state = stat
                .rfind(')')
                .and_then(|end| stat[end + 1..].split_whitespace().next());
            !matches!(state, Some("Z" | "X"))
        }
        Err(_) => true,
    }
}

/// Sends `signal` to process `pid`.
pub fn send_signal(pid: u32, signal: Signal) -> io::Result<()> {
    let raw = i32::try_from(pid).map_err(|_| io::Error::other(format!("invalid pid {pid}")))?;
    nix::sys::signal::kill(Pid::from_raw(raw), signal).map_err(io::Error::from)
}

/// `/proc/<pid>/stat` from the field after the command's name (the state, then the parent's
/// pid, ...): the name is skipped whole, since it may hold spaces and parentheses.
pub fn stat_after_comm(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat[stat.rfind(')').map_or(0, |end| end + 1)..].to_owned())
}

/// The pids of `root`'s living descendants (children, their children, ...), from `/proc`.
pub fn descendants(root: u32) -> Vec<u32> {
    let mut children: std::collections::HashMap<u32, Vec<u32>> = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Some(stat) = stat_after_comm(pid) else {
            continue;
        };
        let mut fields = stat.split_whitespace();
        let (Some(state), Some(Ok(ppid))) = (fields.next(), fields.next().map(str::parse::<u32>))
        else {
            continue;
        };
        if state != "Z" && state != "X" {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut found = Vec::new();
    let mut next = vec![root];
    while let Some(pid) = next.pop() {
        for &child in children.get(&pid).map_or(&[][..], Vec::as_slice) {
            found.push(child);
            next.push(child);
        }
    }
    found
}

/// Sends `signal` to `root` and every process under it at once, as a whole machine's crash or
/// pause would: a tree whose parent is stopped or gone cannot tend to its own children.
pub fn signal_tree(root: u32, signal: Signal) {
    let mut pids = vec![root];
    pids.extend(descendants(root));
    for pid in pids {
        if let Ok(pid) = i32::try_from(pid) {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), signal);
        }
    }
}
