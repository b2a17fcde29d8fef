//! Work in any language: [`ExecHandler`] runs a command for each task (`worker --exec -- CMD`,
//! or `WORKER_EXEC`), with every guarantee of a Rust handler, since it is one: the runner
//! heartbeats while the command runs, and cancels it when the task is cancelled, its lease is
//! lost or the shutdown grace runs out.
//!
//! The contract, as Kubernetes Jobs' `onExitCodes` and sysexits.h have it:
//! - stdin: the task, as `GET /api/tasks/{id}` holds it under `task` (camelCase), then EOF;
//! - environment: `LEASEHOLD_TASK_ID`, `LEASEHOLD_QUEUE`, `LEASEHOLD_ATTEMPT`,
//!   `LEASEHOLD_MAX_ATTEMPTS`, `LEASEHOLD_DEADLINE` (when a lost heartbeat would end the work),
//!   `LEASEHOLD_RESULT` (a path for an optional `{"snooze_seconds": N, "message": "..."}`),
//!   `TRACEPARENT`; the worker's own secrets are not passed on;
//! - exit 0: succeeded, stdout the output (JSON when it parses, else a string; cut to the output
//!   limit and marked so); 75 (`EX_TEMPFAIL`): snoozed, attempt not charged; 65
//!   (`EX_DATAERR`): failed for good; any other, or a signal: failed retryably. The failure
//!   message is the result file's, else stderr's tail.
//!
//! The command runs in a process group of its own. Stopping it (cancel, lease lost, shutdown,
//! time limit) sends SIGTERM to the group, then SIGKILL after the kill grace; and when the
//! command ends, whatever it left running in its group is killed too. Stdin is written while
//! stdout and stderr are read, so a command that writes before it reads cannot deadlock.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use leasehold::tasks::Task;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio_util::sync::CancellationToken;

use crate::handler::{TaskFailure, TaskHandler, TaskResult};
use crate::output::{MAX_OUTPUT_BYTES, output_value, snooze};
use leasehold::tasks::MAX_ERROR_CHARS;

/// How much of stderr's end a failure message keeps, in characters: task-service keeps the
/// first [`MAX_ERROR_CHARS`] of a message, so the tail is made to fit before, with room for the
/// words put in front of it ("killed by SIGKILL: "), and the end survives.
const TAIL_CHARS: usize = MAX_ERROR_CHARS - 64;
/// How long a command's pipes may stay open after it exits: past that, they are held by a
/// process that left its group.
const PIPES_AFTER_EXIT: Duration = Duration::from_secs(5);
/// `EX_TEMPFAIL`: try again later.
pub const EXIT_SNOOZE: i32 = 75;
/// `EX_DATAERR`: the input was wrong; no attempt will do better.
pub const EXIT_PERMANENT: i32 = 65;

/// Environment variables of the worker that a command does not see unless the operator names
/// them ([`ExecHandler::pass_on`]): its credentials.
pub const WITHHELD: [&str; 5] = [
    "AUTH_TOKEN",
    "LEASEHOLD_TOKEN",
    "WORKER_PUSH_SECRET",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
];

/// What an exit code means (Kubernetes Jobs' `podFailurePolicy.onExitCodes`, in words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Succeeded: stdout is the output.
    Succeed,
    /// Not now: due again after the snooze, attempt not charged.
    Snooze,
    /// Failed, charging the attempt; tried again while attempts remain.
    Retry,
    /// Failed for good (`dead` at once).
    Fail,
}

impl std::str::FromStr for Outcome {
    type Err = String;

    fn from_str(word: &str) -> Result<Self, String> {
        match word.trim() {
            "succeed" => Ok(Outcome::Succeed),
            "snooze" => Ok(Outcome::Snooze),
            "retry" => Ok(Outcome::Retry),
            "fail" => Ok(Outcome::Fail),
            other => Err(format!(
                "{other:?} is not an outcome: succeed, snooze, retry or fail"
            )),
        }
    }
}

/// The exit codes' outcomes: 0 succeeds, 75 (`EX_TEMPFAIL`) snoozes, 65 (`EX_DATAERR`) fails
/// for good, any other retries; `remap` (`3=snooze,4=fail`, `WORKER_EXEC_EXIT_CODES`) changes
/// or adds some.
pub fn exit_codes(remap: &str) -> Result<std::collections::BTreeMap<i32, Outcome>, String> {
    let mut codes = std::collections::BTreeMap::from([
        (0, Outcome::Succeed),
        (EXIT_SNOOZE, Outcome::Snooze),
        (EXIT_PERMANENT, Outcome::Fail),
    ]);
    for pair in remap.split(',').filter(|pair| !pair.trim().is_empty()) {
        let (code, outcome) = pair
            .split_once('=')
            .ok_or_else(|| format!("{pair:?} is not CODE=OUTCOME"))?;
        let code: i32 = code
            .trim()
            .parse()
            .ok()
            .filter(|code| (0..=255).contains(code))
            .ok_or_else(|| format!("{code:?} is not an exit code (0 to 255)"))?;
        codes.insert(code, outcome.parse()?);
    }
    Ok(codes)
}

/// Runs a command for each task.
#[derive(Debug, Clone)]
pub struct ExecHandler {
    pub program: String,
    pub args: Vec<String>,
    /// A snooze's delay when the command exits 75 without naming one.
    pub snooze: Duration,
    /// Between SIGTERM and SIGKILL when the command is stopped.
    pub kill_grace: Duration,
    /// The longest one attempt may run; `None`: no limit.
    pub timeout: Option<Duration>,
    /// Each exit code's outcome ([`exit_codes`]); codes not listed retry.
    pub exit_codes: std::collections::BTreeMap<i32, Outcome>,
    /// Of the [`WITHHELD`] credentials, those the command sees all the same.
    pub pass_on: Vec<String>,
}

/// What a command may write at `LEASEHOLD_RESULT`.
#[derive(Debug, Default, serde::Deserialize)]
struct ResultFile {
    snooze_seconds: Option<f64>,
    message: Option<String>,
}

impl ExecHandler {
    /// Whether the command can start at all: a program that cannot be found or run stops the
    /// worker at startup rather than fail every task.
    pub fn check(&self) -> Result<(), String> {
        let found = if self.program.contains('/') {
            Some(PathBuf::from(&self.program))
        } else {
            std::env::var_os("PATH").and_then(|path| {
                std::env::split_paths(&path)
                    .map(|dir| dir.join(&self.program))
                    .find(|candidate| is_executable(candidate))
            })
        };
        match found {
            Some(path) if is_executable(&path) => Ok(()),
            Some(path) => Err(format!(
                "the command {:?} ({}) is not an executable file",
                self.program,
                path.display()
            )),
            None => Err(format!(
                "the command {:?} is not found on PATH",
                self.program
            )),
        }
    }

    async fn run(&self, task: Task, cancel: CancellationToken) -> TaskResult {
        static RUNS: AtomicU64 = AtomicU64::new(0);
        let result_path = std::env::temp_dir().join(format!(
            "leasehold-result-{}-{}-{}.json",
            std::process::id(),
            task.id,
            RUNS.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_file(&result_path);
        let stdin_body = serde_json::to_vec(&task)
            .map_err(|err| TaskFailure::retryable(format!("cannot write the task: {err}")))?;
        let mut command = tokio::process::Command::new(&self.program);
        command
            .args(&self.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .env("LEASEHOLD_TASK_ID", task.id.to_string())
            .env("LEASEHOLD_QUEUE", &task.queue)
            .env("LEASEHOLD_ATTEMPT", task.attempts.to_string())
            .env("LEASEHOLD_MAX_ATTEMPTS", task.max_attempts.to_string())
            .env("LEASEHOLD_RESULT", &result_path);
        for name in WITHHELD
            .iter()
            .filter(|name| !self.pass_on.iter().any(|p| p == *name))
        {
            command.env_remove(name);
        }
        if let Some(deadline) = task.must_heart_beat_before {
            command.env("LEASEHOLD_DEADLINE", deadline.to_rfc3339());
        }
        if let Some(parent) = leasehold::telemetry::inject()
            .get("traceparent")
            .and_then(|value| value.to_str().ok())
        {
            command.env("TRACEPARENT", parent);
        }
        let mut child = command.spawn().map_err(|err| {
            TaskFailure::retryable(format!("cannot start {:?}: {err}", self.program))
        })?;
        let group = Group(child.id().and_then(|id| i32::try_from(id).ok()));
        let mut stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let task_id = task.id;
        let feed = async move {
            if let Some(stdin) = stdin.as_mut() {
                // A command that never reads its input gets a broken pipe here, not an error.
                let _ = stdin.write_all(&stdin_body).await;
                let _ = stdin.shutdown().await;
            }
        };
        let output = tokio::spawn(read_bounded(stdout));
        let tail = tokio::spawn(log_stderr(stderr, task_id));
        let limit = async {
            match self.timeout {
                Some(limit) => tokio::time::sleep(limit).await,
                None => std::future::pending().await,
            }
        };
        // Fed on its own: a command that exits without reading all of its input, while
        // something it started keeps stdin open, must not hold the wait.
        let feed = tokio::spawn(feed);
        let waited = tokio::select! {
            status = child.wait() => Ended::Exited(status),
            () = cancel.cancelled() => Ended::Stopped,
            () = limit => Ended::TimedOut,
        };
        let status = match waited {
            Ended::Exited(status) => status,
            stopped => {
                // Nothing of the stopped command is waited for past its end.
                feed.abort();
                output.abort();
                tail.abort();
                group.signal(Signal::SIGTERM);
                if tokio::time::timeout(self.kill_grace, child.wait())
                    .await
                    .is_err()
                {
                    group.signal(Signal::SIGKILL);
                    let _ = child.wait().await;
                }
                let _ = std::fs::remove_file(&result_path);
                return Err(match stopped {
                    Ended::TimedOut => TaskFailure::retryable(format!(
                        "timed out after {:?}",
                        self.timeout.unwrap_or_default()
                    )),
                    _ => TaskFailure::retryable("stopped: the task was cancelled or lost"),
                });
            }
        };
        // Whatever the command left running in its group goes with it.
        drop(group);
        feed.abort();
        // The pipes end with the group; one still open is held by a process that left it (a
        // daemon that called setsid), whose output is not the command's.
        let (stdout, cut) = match tokio::time::timeout(PIPES_AFTER_EXIT, output).await {
            Ok(read) => read.unwrap_or_default(),
            Err(_) => {
                let _ = std::fs::remove_file(&result_path);
                return Err(TaskFailure::retryable(
                    "the command exited, but a process it started outside its group keeps its \
                     stdout open",
                ));
            }
        };
        let tail = tokio::time::timeout(PIPES_AFTER_EXIT, tail)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        let written = read_result(&result_path);
        let _ = std::fs::remove_file(&result_path);
        let status = status
            .map_err(|err| TaskFailure::retryable(format!("waiting for the command: {err}")))?;
        let message = |fallback: String| {
            written
                .message
                .clone()
                .or_else(|| (!tail.trim().is_empty()).then(|| tail.clone()))
                .unwrap_or(fallback)
        };
        let outcome = status
            .code()
            .map(|code| (code, *self.exit_codes.get(&code).unwrap_or(&Outcome::Retry)));
        match outcome {
            Some((_, Outcome::Succeed)) => Ok(output_value("stdout", &stdout, cut)),
            Some((_, Outcome::Snooze)) => {
                let delay = written
                    .snooze_seconds
                    .filter(|s| s.is_finite() && *s >= 0.0)
                    .map_or(self.snooze, Duration::from_secs_f64);
                Err(snooze(delay))
            }
            Some((code, Outcome::Fail)) => Err(TaskFailure::permanent(message(format!(
                "exited with {code}, a failure for good"
            )))),
            Some((code, Outcome::Retry)) => Err(TaskFailure::retryable(message(format!(
                "exited with {code}"
            )))),
            None => {
                use std::os::unix::process::ExitStatusExt as _;
                let signal = status
                    .signal()
                    .and_then(|n| Signal::try_from(n).ok())
                    .map_or_else(|| "a signal".to_owned(), |s| s.as_str().to_owned());
                let said = message(String::new());
                Err(TaskFailure::retryable(if said.is_empty() {
                    format!("killed by {signal}")
                } else {
                    format!("killed by {signal}: {said}")
                }))
            }
        }
    }
}

impl TaskHandler for ExecHandler {
    fn handle(
        &self,
        task: Task,
        cancel: CancellationToken,
    ) -> impl Future<Output = TaskResult> + Send {
        self.run(task, cancel)
    }

    /// The kill grace, and a second for the command's end to be seen: a stop sends SIGTERM,
    /// waits, then SIGKILL, and only then is the future dropped.
    fn stop_grace(&self) -> Duration {
        self.kill_grace + Duration::from_secs(1)
    }
}

enum Ended {
    Exited(std::io::Result<std::process::ExitStatus>),
    Stopped,
    TimedOut,
}

/// A command's process group: killed when dropped, so that nothing it started outlives it.
/// The runner waits out [`TaskHandler::stop_grace`] before it drops a stopped command's future,
/// so a stop is SIGTERM first; this SIGKILL is what is left after that, or after a panic.
struct Group(Option<i32>);

impl Group {
    fn signal(&self, signal: Signal) {
        if let Some(id) = self.0 {
            // ESRCH: the group is gone already.
            let _ = killpg(Pid::from_raw(id), signal);
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.signal(Signal::SIGKILL);
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path)
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// Reads all of `pipe`, keeping its first [`MAX_OUTPUT_BYTES`] and draining the rest (a
/// command blocked on a full pipe would never end); whether anything was cut.
async fn read_bounded(pipe: Option<tokio::process::ChildStdout>) -> (Vec<u8>, bool) {
    let Some(mut pipe) = pipe else {
        return (Vec::new(), false);
    };
    let mut kept = Vec::new();
    let mut cut = false;
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        match pipe.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = MAX_OUTPUT_BYTES.saturating_sub(kept.len());
                kept.extend_from_slice(&buffer[..n.min(room)]);
                cut |= n > room;
            }
        }
    }
    (kept, cut)
}

/// Logs each stderr line with the task's id; returns the last [`TAIL_CHARS`] characters, for
/// the failure message.
async fn log_stderr(pipe: Option<tokio::process::ChildStderr>, task_id: i64) -> String {
    let Some(pipe) = pipe else {
        return String::new();
    };
    let mut lines = BufReader::new(pipe).lines();
    let mut tail = String::new();
    while let Ok(Some(line)) = lines.next_line().await {
        tracing::info!(task_id, stderr = %line, "command");
        tail.push_str(&line);
        tail.push('\n');
        // Trimmed now and then, not at every line: a chatty command stays linear.
        if tail.len() > 8 * TAIL_CHARS {
            tail = last_chars(&tail, TAIL_CHARS).to_owned();
        }
    }
    last_chars(tail.trim_end(), TAIL_CHARS).to_owned()
}

/// The last `n` characters of `text`.
fn last_chars(text: &str, n: usize) -> &str {
    match text.char_indices().rev().nth(n.saturating_sub(1)) {
        Some((start, _)) if n > 0 => &text[start..],
        Some(_) => "",
        None => text,
    }
}

fn read_result(path: &Path) -> ResultFile {
    std::fs::read(path)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_keeps_the_last_characters_and_fits_the_runners_bound() {
        assert_eq!(last_chars("héllo", 3), "llo");
        assert_eq!(last_chars("hé", 5), "hé");
        assert_eq!(last_chars("abc", 0), "");
        assert!(TAIL_CHARS + "killed by SIGKILL: ".len() <= MAX_ERROR_CHARS);
    }

    #[test]
    fn exit_codes_default_as_sysexits_and_a_remap_changes_or_adds_them() {
        let codes = exit_codes("").unwrap();
        assert_eq!(codes[&0], Outcome::Succeed);
        assert_eq!(codes[&75], Outcome::Snooze);
        assert_eq!(codes[&65], Outcome::Fail);
        let codes = exit_codes("3=snooze, 65=retry,4=fail").unwrap();
        assert_eq!(
            (codes[&3], codes[&65], codes[&4]),
            (Outcome::Snooze, Outcome::Retry, Outcome::Fail)
        );
        for bad in ["3", "x=fail", "256=fail", "3=later"] {
            assert!(exit_codes(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_missing_command_is_found_out_at_startup() {
        let handler = |program: &str| ExecHandler {
            program: program.to_owned(),
            args: Vec::new(),
            snooze: Duration::from_secs(60),
            kill_grace: Duration::from_secs(5),
            timeout: None,
            exit_codes: exit_codes("").unwrap(),
            pass_on: Vec::new(),
        };
        assert!(handler("sh").check().is_ok());
        assert!(handler("/bin/sh").check().is_ok());
        assert!(handler("no-such-command-leasehold").check().is_err());
        let not_executable = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
        assert!(handler(not_executable).check().is_err());
    }
}
