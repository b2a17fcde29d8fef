//! Configuration: command-line flags, each also read from an environment variable.
//!
//! [`WorkerConfig`] is what clap parses (strings and numbers as given); [`WorkerConfig::validate`]
//! checks it and turns it into [`Settings`] (durations, a worker id, cleaned-up URLs), or says in
//! a sentence which setting is wrong and why.

use std::net::SocketAddr;
use std::time::Duration;

use std::sync::Arc;

use clap::{Args, Parser};

use crate::handler::{DynTaskHandler, SleepHandler};

/// The defaults, shared by the flags and by [`WorkerConfig::new`].
pub mod defaults {
    /// Tasks in flight per process.
    pub const CONCURRENCY: usize = 1;
    /// The sample's heartbeat interval.
    pub const HEARTBEAT_INTERVAL_SECONDS: f64 = 15.0;
    /// First idle wait.
    pub const POLL_MIN_MS: u64 = 100;
    /// Longest idle wait.
    pub const POLL_MAX_MS: u64 = 5_000;
    /// How long a claim waits in task-service for a task to become due.
    pub const CLAIM_WAIT_MS: u64 = 5_000;
    /// Time in-flight tasks get to finish after SIGTERM/SIGINT.
    pub const SHUTDOWN_GRACE_SECONDS: f64 = 30.0;
    /// How long a chaos heartbeat pause lasts (longer than task-service's default lease TTL of
    /// 30 s, so it loses the lease).
    pub const CHAOS_HEARTBEAT_PAUSE_SECONDS: f64 = 45.0;
}

/// Longest `WORKER_ID` accepted (task-service's limit on a processor name).
pub const MAX_NAME_CHARS: usize = leasehold::api::MAX_NAME_CHARS;
/// Longest `WORKER_QUEUE` accepted (task-service's limit on a queue name).
pub const MAX_QUEUE_CHARS: usize = leasehold::tasks::MAX_QUEUE_CHARS;
/// Shortest heartbeat interval accepted, in seconds.
pub const MIN_HEARTBEAT_INTERVAL_SECONDS: f64 = 0.01;
/// Longest heartbeat interval accepted, in seconds (lease-service's default longest TTL).
pub const MAX_HEARTBEAT_INTERVAL_SECONDS: f64 = 3_600.0;
/// Longest grace period accepted, in seconds.
pub const MAX_SHUTDOWN_GRACE_SECONDS: f64 = 86_400.0;
/// Most tasks in flight per process.
pub const MAX_CONCURRENCY: usize = 10_000;

/// Leasehold's task worker: claims tasks from task-service, heartbeats while it works on them,
/// and completes or fails them. Runs until SIGTERM or SIGINT, then stops claiming, lets
/// in-flight tasks finish within SHUTDOWN_GRACE_SECONDS, hands the rest back, and exits 0.
#[derive(Debug, Parser)]
#[command(
    name = "worker",
    version,
    after_help = "Logging: RUST_LOG filters (default info); LOG_FORMAT=json prints one JSON \
                  object per line. Logs go to stderr."
)]
pub struct Cli {
    #[command(flatten)]
    pub config: WorkerConfig,
    #[command(flatten)]
    pub exec: ExecArgs,
    #[command(flatten)]
    pub push: PushArgs,
}

impl Cli {
    /// The work these flags ask for: a command for each task, a push to an endpoint, or the
    /// built-in sleep. Checked here, so that a command that cannot start or a URL that does
    /// not parse stops the worker at startup.
    pub fn handler(&self) -> Result<Arc<dyn DynTaskHandler>, ConfigError> {
        if let Some(exec) = self.exec.handler()? {
            return Ok(Arc::new(exec));
        }
        if let Some(push) = self.push.handler()? {
            return Ok(Arc::new(push));
        }
        Ok(Arc::new(SleepHandler::default()))
    }
}

/// The work: the built-in sleep, or a command for each task (`--exec -- CMD [ARGS...]`).
#[derive(Debug, Clone, Default, Args)]
pub struct ExecArgs {
    /// Run the command given after `--` for each task (see `leasehold_worker::exec` for the
    /// contract: the task on stdin, its outcome by exit code, stdout the output).
    #[arg(long = "exec", requires = "command")]
    pub exec: bool,
    /// The command as one line, split as a shell would split it (no shell is run); the
    /// environment form of `--exec -- CMD`.
    #[arg(long = "exec-line", env = "WORKER_EXEC", conflicts_with = "exec")]
    pub line: Option<String>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, id = "command")]
    pub command: Vec<String>,
    /// Seconds a task is snoozed when its command exits 75 without naming a delay.
    #[arg(long, env = "WORKER_EXEC_SNOOZE_SECONDS", default_value_t = 60.0)]
    pub exec_snooze_seconds: f64,
    /// Seconds between SIGTERM and SIGKILL to a command's process group when it is stopped.
    #[arg(long, env = "WORKER_EXEC_KILL_GRACE_SECONDS", default_value_t = 5.0)]
    pub exec_kill_grace_seconds: f64,
    /// Longest one attempt's command may run, in seconds (0: no limit); past it the attempt
    /// fails retryably.
    #[arg(long, env = "WORKER_EXEC_TIMEOUT_SECONDS", default_value_t = 0.0)]
    pub exec_timeout_seconds: f64,
    /// Exit codes whose outcome differs from the defaults (0 succeed, 75 snooze, 65 fail for
    /// good, others retry), as `CODE=OUTCOME` pairs: `3=snooze,4=fail` (outcomes: succeed,
    /// snooze, retry, fail).
    #[arg(long, env = "WORKER_EXEC_EXIT_CODES", default_value = "")]
    pub exec_exit_codes: String,
    /// Credentials of the worker the command sees all the same, comma-separated (by default it
    /// sees none of AUTH_TOKEN, LEASEHOLD_TOKEN, WORKER_PUSH_SECRET and the OTLP exporter's
    /// headers).
    #[arg(long, env = "WORKER_EXEC_PASS_ENV", value_delimiter = ',')]
    pub exec_pass_env: Vec<String>,
}

impl ExecArgs {
    /// The command handler these flags ask for, if any, checked: a command that cannot start
    /// is refused here, at startup.
    pub fn handler(&self) -> Result<Option<crate::exec::ExecHandler>, ConfigError> {
        let words = match &self.line {
            Some(line) if !self.exec => shlex::split(line).ok_or_else(|| {
                ConfigError(format!(
                    "{} ({line:?}) is not a command line",
                    setting("line")
                ))
            })?,
            _ if self.exec => self.command.clone(),
            _ => return Ok(None),
        };
        let Some((program, args)) = words.split_first() else {
            return Err(ConfigError("--exec needs a command after --".to_owned()));
        };
        // A day at most, each: past that a command is better a task of its own schedule.
        let day = 0.0..=86_400.0;
        let timeout = seconds_within(
            "exec_timeout_seconds",
            self.exec_timeout_seconds,
            day.clone(),
        )?;
        if let Some(unknown) = self
            .exec_pass_env
            .iter()
            .find(|name| !crate::exec::WITHHELD.contains(&name.as_str()))
        {
            return Err(ConfigError(format!(
                "{} names {unknown:?}, which is passed on anyway: only {} are withheld",
                setting("exec_pass_env"),
                crate::exec::WITHHELD.join(", ")
            )));
        }
        let handler = crate::exec::ExecHandler {
            program: program.clone(),
            args: args.to_vec(),
            snooze: seconds_within("exec_snooze_seconds", self.exec_snooze_seconds, day.clone())?,
            kill_grace: seconds_within(
                "exec_kill_grace_seconds",
                self.exec_kill_grace_seconds,
                day,
            )?,
            timeout: (!timeout.is_zero()).then_some(timeout),
            pass_on: self.exec_pass_env.clone(),
            exit_codes: crate::exec::exit_codes(&self.exec_exit_codes)
                .map_err(|why| ConfigError(format!("{}: {why}", setting("exec_exit_codes"))))?,
        };
        handler.check().map_err(ConfigError)?;
        Ok(Some(handler))
    }
}

/// The work as an HTTP request for each task (`--push URL`).
#[derive(Debug, Clone, Default, Args)]
pub struct PushArgs {
    /// POST each task to this http:// URL (see `leasehold_worker::push` for the contract: the
    /// task as the body, its outcome by status, the answer the output).
    #[arg(long = "push", env = "WORKER_PUSH_URL", conflicts_with_all = ["exec", "line"])]
    pub url: Option<String>,
    /// Longest one push may take, in seconds (0: no limit); past it the attempt fails
    /// retryably. The default is Cloud Tasks' for HTTP targets.
    #[arg(long, env = "WORKER_PUSH_TIMEOUT_SECONDS", default_value_t = 600.0)]
    pub push_timeout_seconds: f64,
    /// Sign each push as Standard Webhooks do, with this secret (`whsec_` and the key in
    /// base64). Unset: pushes are not signed.
    #[arg(long, env = "WORKER_PUSH_SECRET", hide_env_values = true)]
    pub push_secret: Option<leasehold::api::Secret>,
}

impl PushArgs {
    /// The push handler these flags ask for, if any, its URL and secret checked.
    pub fn handler(&self) -> Result<Option<crate::push::PushHandler>, ConfigError> {
        let Some(url) = &self.url else {
            return Ok(None);
        };
        let timeout = seconds_within(
            "push_timeout_seconds",
            self.push_timeout_seconds,
            0.0..=86_400.0,
        )?;
        let secret = self
            .push_secret
            .as_ref()
            .map(|secret| {
                secret
                    .expose()
                    .parse::<crate::push::WebhookSecret>()
                    .map_err(|why| ConfigError(format!("{} {why}", setting("push_secret"))))
            })
            .transpose()?;
        crate::push::PushHandler::new(url, (!timeout.is_zero()).then_some(timeout), secret)
            .map(Some)
            .map_err(ConfigError)
    }
}

/// Every setting of the worker. Each is a flag and an environment variable.
#[derive(Debug, Clone, Args)]
pub struct WorkerConfig {
    /// Base URL of task-service; several may be given, comma-separated (connection errors and
    /// 5xx answers rotate to the next one). Only http:// URLs.
    #[arg(
        long = "task-service-url",
        env = "TASK_SERVICE_URL",
        value_delimiter = ',',
        required = true
    )]
    pub task_service_urls: Vec<String>,

    /// Bearer token sent to task-service (a token with the `worker` role, when task-service's
    /// `AUTH_TOKENS` is set). Unset: none is sent.
    #[arg(long, env = "AUTH_TOKEN", hide_env_values = true)]
    pub auth_token: Option<leasehold::api::Secret>,

    /// This worker's name, sent as `processor` with every call (default: host name, process id
    /// and a random hex suffix, unique per process).
    #[arg(long, env = "WORKER_ID")]
    pub worker_id: Option<String>,

    /// Claim only tasks of this queue (default: any queue).
    #[arg(long, env = "WORKER_QUEUE")]
    pub queue: Option<String>,

    /// Tasks in flight at once in this process.
    #[arg(long, env = "WORKER_CONCURRENCY", default_value_t = defaults::CONCURRENCY)]
    pub concurrency: usize,

    /// Under load (a claim came back with all it asked for), tasks claimed ahead of the free
    /// slots, at most WORKER_CONCURRENCY: each starts the moment a slot frees, without waiting
    /// for a claim, and is heartbeaten from its claim on like a running one. At shutdown those
    /// not started are handed back at once, their attempt not charged. 0 (the default) claims
    /// only for free slots: a task claimed ahead waits here while another worker might be idle.
    #[arg(long, env = "WORKER_PREFETCH", default_value_t = 0)]
    pub prefetch: usize,

    /// Seconds between heartbeats of a task (fractions allowed). A task whose lease is shorter
    /// than twice this (task-service's TASK_LEASE_TTL_SECONDS, which every claim answer
    /// carries) is heartbeaten every half TTL instead. The worker has no lease TTL setting of its
    /// own: work is abandoned when no claim or heartbeat has been confirmed for the TTL the last
    /// answer gave (minus a tenth of it, 100 ms to 2 s).
    #[arg(long, env = "HEARTBEAT_INTERVAL_SECONDS", default_value_t = defaults::HEARTBEAT_INTERVAL_SECONDS)]
    pub heartbeat_interval_seconds: f64,

    /// First wait in milliseconds before polling again when no task is due or task-service is
    /// unavailable; it doubles (jittered) up to POLL_MAX_MS.
    #[arg(long, env = "POLL_MIN_MS", default_value_t = defaults::POLL_MIN_MS)]
    pub poll_min_ms: u64,

    /// Longest wait in milliseconds between polls while idle.
    #[arg(long, env = "POLL_MAX_MS", default_value_t = defaults::POLL_MAX_MS)]
    pub poll_max_ms: u64,

    /// Milliseconds a claim waits in task-service for a task to become due (long polling: the
    /// worker starts a new task within milliseconds of its creation); 0 polls instead. A
    /// shutdown abandons a waiting claim rather than wait it out. At most 30000.
    #[arg(long, env = "CLAIM_WAIT_MS", default_value_t = defaults::CLAIM_WAIT_MS)]
    pub claim_wait_ms: u64,

    /// Seconds in-flight tasks get to finish after SIGTERM/SIGINT; the rest are cancelled and
    /// handed back to task-service (claimable at once).
    #[arg(long, env = "SHUTDOWN_GRACE_SECONDS", default_value_t = defaults::SHUTDOWN_GRACE_SECONDS)]
    pub shutdown_grace_seconds: f64,

    /// Chaos testing: probability (0..1) per task that the process kills itself (SIGKILL) at a
    /// random point while working on it.
    #[arg(long, env = "CHAOS_CRASH_PROBABILITY", default_value_t = 0.0)]
    pub chaos_crash_probability: f64,

    /// Chaos testing: probability (0..1) per task that its heartbeats stop for
    /// CHAOS_HEARTBEAT_PAUSE_SECONDS, starting with its first heartbeat.
    #[arg(long, env = "CHAOS_HEARTBEAT_PAUSE_PROBABILITY", default_value_t = 0.0)]
    pub chaos_heartbeat_pause_probability: f64,

    /// Chaos testing: how long a heartbeat pause lasts, in seconds.
    #[arg(long, env = "CHAOS_HEARTBEAT_PAUSE_SECONDS", default_value_t = defaults::CHAOS_HEARTBEAT_PAUSE_SECONDS)]
    pub chaos_heartbeat_pause_seconds: f64,

    /// Serve GET /healthz and GET /metrics (Prometheus text) on this address, e.g.
    /// 127.0.0.1:9100 (default: no metrics server).
    #[arg(long, env = "METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,
}

/// A configuration that cannot work, with the setting it is about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

/// Chaos knobs, all off by default.
#[derive(Debug, Clone, PartialEq)]
pub struct Chaos {
    pub crash_probability: f64,
    pub heartbeat_pause_probability: f64,
    pub heartbeat_pause: Duration,
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Base URLs without a trailing slash, in rotation order.
    pub task_service_urls: Vec<String>,
    /// Bearer token for task-service, if its write routes are locked.
    pub auth_token: Option<leasehold::api::Secret>,
    /// Sent as `processor`.
    pub worker_id: String,
    pub queue: Option<String>,
    pub concurrency: usize,
    /// Tasks claimed ahead of the free slots under load (at most `concurrency`).
    pub prefetch: usize,
    pub heartbeat_interval: Duration,
    /// Timeout of each HTTP request: min(5 s, heartbeat interval / 2).
    pub request_timeout: Duration,
    pub poll_min: Duration,
    pub poll_max: Duration,
    pub claim_wait: Duration,
    pub shutdown_grace: Duration,
    pub chaos: Chaos,
    pub metrics_addr: Option<SocketAddr>,
}

impl WorkerConfig {
    /// The defaults, talking to `task_service_urls` (for programs that embed the worker).
    pub fn new<I, S>(task_service_urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            task_service_urls: task_service_urls.into_iter().map(Into::into).collect(),
            auth_token: None,
            worker_id: None,
            queue: None,
            concurrency: defaults::CONCURRENCY,
            prefetch: 0,
            heartbeat_interval_seconds: defaults::HEARTBEAT_INTERVAL_SECONDS,
            poll_min_ms: defaults::POLL_MIN_MS,
            poll_max_ms: defaults::POLL_MAX_MS,
            claim_wait_ms: defaults::CLAIM_WAIT_MS,
            shutdown_grace_seconds: defaults::SHUTDOWN_GRACE_SECONDS,
            chaos_crash_probability: 0.0,
            chaos_heartbeat_pause_probability: 0.0,
            chaos_heartbeat_pause_seconds: defaults::CHAOS_HEARTBEAT_PAUSE_SECONDS,
            metrics_addr: None,
        }
    }

    /// Checks every setting and resolves the defaults that are computed (the worker id).
    pub fn validate(&self) -> Result<Settings, ConfigError> {
        let task_service_urls = self.urls()?;
        let worker_id = match &self.worker_id {
            Some(id) => {
                check_name("worker_id", id, MAX_NAME_CHARS)?;
                id.clone()
            }
            None => default_worker_id(),
        };
        if let Some(queue) = &self.queue {
            check_name("queue", queue, MAX_QUEUE_CHARS)?;
        }
        if self.concurrency == 0 || self.concurrency > MAX_CONCURRENCY {
            return Err(ConfigError(format!(
                "{} ({}) must be between 1 and {MAX_CONCURRENCY}",
                setting("concurrency"),
                self.concurrency
            )));
        }
        if self.prefetch > self.concurrency {
            return Err(ConfigError(format!(
                "{} ({}) must be at most {} ({})",
                setting("prefetch"),
                self.prefetch,
                setting("concurrency"),
                self.concurrency
            )));
        }
        let heartbeat_interval = seconds_within(
            "heartbeat_interval_seconds",
            self.heartbeat_interval_seconds,
            MIN_HEARTBEAT_INTERVAL_SECONDS..=MAX_HEARTBEAT_INTERVAL_SECONDS,
        )?;
        self.check_polling()?;
        let shutdown_grace = seconds_within(
            "shutdown_grace_seconds",
            self.shutdown_grace_seconds,
            0.0..=MAX_SHUTDOWN_GRACE_SECONDS,
        )?;
        probability("chaos_crash_probability", self.chaos_crash_probability)?;
        probability(
            "chaos_heartbeat_pause_probability",
            self.chaos_heartbeat_pause_probability,
        )?;
        let heartbeat_pause = seconds_within(
            "chaos_heartbeat_pause_seconds",
            self.chaos_heartbeat_pause_seconds,
            0.0..=MAX_SHUTDOWN_GRACE_SECONDS,
        )?;
        Ok(Settings {
            task_service_urls,
            auth_token: self.auth_token.clone(),
            worker_id,
            queue: self.queue.clone(),
            concurrency: self.concurrency,
            prefetch: self.prefetch,
            heartbeat_interval,
            request_timeout: (heartbeat_interval / 2).min(Duration::from_secs(5)),
            poll_min: Duration::from_millis(self.poll_min_ms),
            poll_max: Duration::from_millis(self.poll_max_ms),
            claim_wait: Duration::from_millis(self.claim_wait_ms),
            shutdown_grace,
            chaos: Chaos {
                crash_probability: self.chaos_crash_probability,
                heartbeat_pause_probability: self.chaos_heartbeat_pause_probability,
                heartbeat_pause,
            },
            metrics_addr: self.metrics_addr,
        })
    }

    /// The idle waits and the claim's wait.
    fn check_polling(&self) -> Result<(), ConfigError> {
        if self.poll_min_ms == 0 {
            return Err(ConfigError(format!(
                "{} must be at least 1",
                setting("poll_min_ms")
            )));
        }
        if self.claim_wait_ms > leasehold::tasks::MAX_CLAIM_WAIT_MS {
            return Err(ConfigError(format!(
                "{} must be at most {}",
                setting("claim_wait_ms"),
                leasehold::tasks::MAX_CLAIM_WAIT_MS
            )));
        }
        if self.poll_max_ms < self.poll_min_ms {
            return Err(ConfigError(format!(
                "{} ({}) must not be less than {} ({})",
                setting("poll_max_ms"),
                self.poll_max_ms,
                setting("poll_min_ms"),
                self.poll_min_ms
            )));
        }
        Ok(())
    }

    fn urls(&self) -> Result<Vec<String>, ConfigError> {
        let mut urls = Vec::new();
        for raw in &self.task_service_urls {
            let raw = raw.trim();
            if raw.is_empty() {
                continue;
            }
            let url = leasehold::service_url(raw)
                .map_err(|err| ConfigError(format!("{} {err}", setting("task_service_urls"))))?;
            urls.push(url);
        }
        if urls.is_empty() {
            return Err(ConfigError(format!(
                "{} must name at least one task-service URL",
                setting("task_service_urls")
            )));
        }
        Ok(urls)
    }
}

/// `host:pid:random-hex`: unique per process (and per call), readable in the tasks table.
pub fn default_worker_id() -> String {
    leasehold::identity::instance_id("worker")
}

/// The environment variable of the flag whose field is `id`, as its attribute names it.
/// `validate` also checks configurations built in code ([`WorkerConfig::new`]), so it keeps the
/// worker's rules, and names each setting through this rather than writing its name again.
fn setting(id: &str) -> String {
    use clap::CommandFactory as _;
    Cli::command()
        .get_arguments()
        .find(|arg| arg.get_id() == id)
        .and_then(clap::Arg::get_env)
        .map_or_else(|| id.to_owned(), |env| env.to_string_lossy().into_owned())
}

/// The setting whose field is `id`, a name of at most `max_chars` characters, by the rule
/// task-service checks names by ([`leasehold::schema::name_problem`]).
fn check_name(id: &str, value: &str, max_chars: usize) -> Result<(), ConfigError> {
    match leasehold::schema::name_problem(value, max_chars) {
        Some(problem) => Err(ConfigError(format!("{} {problem}", setting(id)))),
        None => Ok(()),
    }
}

/// `value` seconds of the setting whose field is `id`, a finite number within `range`.
fn seconds_within(
    id: &str,
    value: f64,
    range: std::ops::RangeInclusive<f64>,
) -> Result<Duration, ConfigError> {
    if !value.is_finite() || !range.contains(&value) {
        return Err(ConfigError(format!(
            "{} ({value}) must be between {} and {} seconds",
            setting(id),
            range.start(),
            range.end()
        )));
    }
    Duration::try_from_secs_f64(value).map_err(|err| {
        ConfigError(format!(
            "{} ({value}) is not a usable duration: {err}",
            setting(id)
        ))
    })
}

/// The setting whose field is `id`, a probability.
fn probability(id: &str, value: f64) -> Result<(), ConfigError> {
    if value.is_finite() && (0.0..=1.0).contains(&value) {
        Ok(())
    } else {
        Err(ConfigError(format!(
            "{} ({value}) must be a probability between 0 and 1",
            setting(id)
        )))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use clap::Parser;

    use super::*;

    fn config() -> WorkerConfig {
        WorkerConfig::new(["http://127.0.0.1:8082"])
    }

    fn error(config: &WorkerConfig) -> String {
        config.validate().unwrap_err().to_string()
    }

    #[test]
    fn defaults_are_valid_and_match_the_sample() {
        let settings = config().validate().unwrap();
        assert_eq!(settings.concurrency, 1);
        assert_eq!(settings.heartbeat_interval, Duration::from_secs(15));
        assert_eq!(settings.request_timeout, Duration::from_secs(5));
        assert_eq!(settings.poll_min, Duration::from_millis(100));
        assert_eq!(settings.poll_max, Duration::from_secs(5));
        assert_eq!(settings.shutdown_grace, Duration::from_secs(30));
        assert_eq!(settings.chaos.crash_probability, 0.0);
        assert_eq!(settings.chaos.heartbeat_pause_probability, 0.0);
        assert!(settings.metrics_addr.is_none());
    }

    #[test]
    fn clap_defaults_equal_the_programmatic_ones() {
        let cli = Cli::try_parse_from(["worker", "--task-service-url", "http://a:1,http://b:2/"])
            .unwrap();
        let parsed = cli.config;
        let built = WorkerConfig::new(["http://a:1", "http://b:2/"]);
        assert_eq!(format!("{parsed:?}"), format!("{built:?}"));
        let settings = parsed.validate().unwrap();
        assert_eq!(settings.task_service_urls, ["http://a:1", "http://b:2"]);
    }

    #[test]
    fn the_heartbeat_interval_must_be_a_positive_time() {
        let mut config = config();
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 3_600.5, 0.001] {
            config.heartbeat_interval_seconds = bad;
            assert!(
                error(&config).contains("HEARTBEAT_INTERVAL_SECONDS"),
                "{bad}"
            );
        }
        // Longer than half of any TTL is accepted: each task's lease sets its own pace.
        config.heartbeat_interval_seconds = 60.0;
        assert!(config.validate().is_ok());
    }

    #[test]
    fn concurrency_zero_is_refused() {
        let mut config = config();
        config.concurrency = 0;
        assert!(error(&config).contains("WORKER_CONCURRENCY"));
    }

    #[test]
    fn prefetch_is_bounded_by_the_slots() {
        let mut config = config();
        config.concurrency = 4;
        config.prefetch = 4;
        assert!(config.validate().is_ok());
        config.prefetch = 5;
        assert!(error(&config).contains("WORKER_PREFETCH"));
    }

    #[test]
    fn other_settings_are_checked() {
        let mut bad = config();
        bad.task_service_urls = vec![" ".to_owned(), String::new()];
        assert!(error(&bad).contains("TASK_SERVICE_URL"));
        bad.task_service_urls = vec!["not a url".to_owned()];
        assert!(error(&bad).contains("TASK_SERVICE_URL"));
        bad.task_service_urls = vec!["ftp://host".to_owned()];
        assert!(error(&bad).contains("http://"));

        let mut bad = config();
        bad.poll_min_ms = 0;
        assert!(error(&bad).contains("POLL_MIN_MS"));
        bad.poll_min_ms = 500;
        bad.poll_max_ms = 100;
        assert!(error(&bad).contains("POLL_MAX_MS"));

        let mut bad = config();
        bad.chaos_crash_probability = 1.5;
        assert!(error(&bad).contains("CHAOS_CRASH_PROBABILITY"));
        let mut bad = config();
        bad.chaos_heartbeat_pause_probability = -0.1;
        assert!(error(&bad).contains("CHAOS_HEARTBEAT_PAUSE_PROBABILITY"));
        let mut bad = config();
        bad.chaos_heartbeat_pause_seconds = -1.0;
        assert!(error(&bad).contains("CHAOS_HEARTBEAT_PAUSE_SECONDS"));
        let mut bad = config();
        bad.shutdown_grace_seconds = -1.0;
        assert!(error(&bad).contains("SHUTDOWN_GRACE_SECONDS"));

        let mut bad = config();
        bad.worker_id = Some(String::new());
        assert!(error(&bad).contains("WORKER_ID"));
        bad.worker_id = Some("a\nb".to_owned());
        assert!(error(&bad).contains("WORKER_ID"));
        bad.worker_id = Some("x".repeat(MAX_NAME_CHARS + 1));
        assert!(error(&bad).contains("WORKER_ID"));
        let mut bad = config();
        bad.queue = Some(String::new());
        assert!(error(&bad).contains("WORKER_QUEUE"));
        // The services' rule: a name of spaces is a name (`leasehold::schema::name_problem`).
        bad.queue = Some("  ".to_owned());
        assert!(bad.validate().is_ok());
        bad.queue = Some("q".repeat(MAX_QUEUE_CHARS + 1));
        assert!(error(&bad).contains("WORKER_QUEUE"));
        bad.queue = Some("q".repeat(MAX_QUEUE_CHARS));
        assert!(bad.validate().is_ok());
    }

    #[test]
    fn short_intervals_shorten_the_request_timeout() {
        let mut config = config();
        config.heartbeat_interval_seconds = 0.5;
        let settings = config.validate().unwrap();
        assert_eq!(settings.request_timeout, Duration::from_millis(250));
    }

    #[test]
    fn default_worker_id_is_unique_and_names_the_process() {
        let a = config().validate().unwrap().worker_id;
        let b = config().validate().unwrap().worker_id;
        assert_ne!(a, b, "two default ids are never the same");
        for id in [&a, &b] {
            assert!(id.contains(&format!(":{}:", std::process::id())), "{id}");
            let suffix = id.rsplit(':').next().unwrap();
            assert_eq!(suffix.len(), 16);
            assert!(suffix.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
        }
        let mut named = config();
        named.worker_id = Some("worker-7".to_owned());
        assert_eq!(named.validate().unwrap().worker_id, "worker-7");
    }
}
