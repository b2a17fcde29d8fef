//! `leasehold`, the operators' command line: leases (list, show, acquire, renew, release,
//! revoke), tasks (create, list, show, cancel, retry, tail) and the generator (status, start,
//! stop), against lease-service and task-service over their HTTP APIs.
//!
//! Every command prints a human table by default and the services' own JSON with `--json`, so
//! scripts read exactly what the API says. Commands that wait on work (`tasks create --wait`,
//! `tasks tail`) show a live count on standard error while standard output stays clean.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand};
use leasehold::api::{Lease, LeasePage, LeaseStatus};
use leasehold::generator::GeneratorStatus;
use leasehold::tasks::{Task, TaskPage, TaskStatus};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// Operate Leasehold: leases, tasks and the task generator.
#[derive(Debug, Parser)]
#[command(name = "leasehold", version)]
pub struct Cli {
    /// lease-service's base URL.
    #[arg(
        long,
        env = "LEASE_SERVICE_URL",
        default_value = "http://127.0.0.1:8081",
        global = true
    )]
    pub lease_url: String,
    /// task-service's base URL.
    #[arg(
        long,
        env = "TASK_SERVICE_URL",
        default_value = "http://127.0.0.1:8082",
        global = true
    )]
    pub task_url: String,
    /// Bearer token sent with every request (needed for writes when the services set
    /// AUTH_TOKENS: leaseholder or operator at lease-service, producer or operator at
    /// task-service).
    #[arg(long, env = "LEASEHOLD_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// Print the services' JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Leases in lease-service.
    #[command(subcommand)]
    Leases(LeaseCommand),
    /// Tasks in task-service.
    #[command(subcommand)]
    Tasks(TaskCommand),
    /// The task generator's desired state and leader.
    #[command(subcommand)]
    Generator(GeneratorCommand),
}

#[derive(Debug, Subcommand)]
pub enum LeaseCommand {
    /// List leases, newest first.
    List {
        /// Which leases.
        #[arg(long, default_value = "all",
              value_parser = ["all", "active", "expired", "renewed", "released"])]
        status: String,
        /// Only leases whose resource starts with this.
        #[arg(long)]
        prefix: Option<String>,
        /// At most this many (a page is at most 1000).
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Continue from an earlier page: the cursor its last line (or its `nextCursor`) gave.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// One lease by id.
    Show {
        /// The lease's id (the ID column of `leases list`).
        id: i64,
    },
    /// Acquire RESOURCE for --holder (prints the lease, with its secret).
    Acquire {
        /// The name of what is leased, e.g. `printer` or `task:42`.
        resource: String,
        /// Who holds the lease: the name renew and release must give.
        #[arg(long)]
        holder: String,
        /// Lease length in seconds (the service's default when absent).
        #[arg(long)]
        ttl: Option<i64>,
    },
    /// Renew RESOURCE for --holder.
    Renew {
        /// The leased resource.
        resource: String,
        #[command(flatten)]
        proof: ProofArgs,
        /// A new lease length in seconds (the lease's own when absent).
        #[arg(long)]
        ttl: Option<i64>,
    },
    /// Release RESOURCE for --holder.
    Release {
        /// The leased resource.
        resource: String,
        #[command(flatten)]
        proof: ProofArgs,
    },
    /// End lease ID whoever holds it (operator role); its holder is refused from then on.
    Revoke {
        /// The lease's id (the ID column of `leases list`).
        id: i64,
    },
}

#[derive(Debug, Args)]
pub struct ProofArgs {
    /// The holder named when the lease was acquired.
    #[arg(long)]
    holder: String,
    /// The lease's fence, refused unless current.
    #[arg(long)]
    fence: Option<i64>,
    /// The secret the acquire answered with.
    #[arg(long)]
    secret: Option<String>,
}

/// What `tasks create` asks for when given no `--data`: work the worker finishes, so that a
/// first try (`--count 50 --wait`) shows tasks succeeding.
pub const DEFAULT_TASK_DATA: &str = r#"{"sleep_duration_seconds": 1}"#;

#[derive(Debug, Subcommand)]
pub enum TaskCommand {
    /// Create tasks; with --wait, watch them until none is pending or running.
    Create {
        /// The task's data, as a JSON object (the worker sleeps `sleep_duration_seconds`).
        #[arg(long, default_value = DEFAULT_TASK_DATA)]
        data: String,
        /// How many tasks to create.
        #[arg(long, default_value_t = 1)]
        count: u32,
        /// The queue to put them in (`default` when absent).
        #[arg(long)]
        queue: Option<String>,
        /// Higher is claimed first, from -1000 to 1000 (0 when absent).
        #[arg(long)]
        priority: Option<i32>,
        /// Claims a failing task gets before it is dead (the service's default when absent).
        #[arg(long)]
        max_attempts: Option<i32>,
        /// Wait until the queue has no pending or running task, showing a live count.
        #[arg(long)]
        wait: bool,
        /// Give up waiting after this many seconds (exit 1).
        #[arg(long, default_value_t = 600)]
        timeout_seconds: u64,
    },
    /// List tasks, newest first.
    List {
        /// Comma-separated statuses: pending, running, succeeded, dead, cancelled.
        #[arg(long)]
        status: Option<String>,
        /// Only tasks of this queue.
        #[arg(long)]
        queue: Option<String>,
        /// At most this many (a page is at most 1000).
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Continue from an earlier page: the cursor its last line (or its `nextCursor`) gave.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// One task by id.
    Show {
        /// The task's id.
        id: i64,
    },
    /// Cancel a task (operator role).
    Cancel {
        /// The task's id.
        id: i64,
    },
    /// Put a dead task back in its queue (operator role).
    Retry {
        /// The task's id.
        id: i64,
    },
    /// Print tasks as they are created and change status, until Ctrl-C (or --seconds).
    Tail {
        /// Only tasks of this queue.
        #[arg(long)]
        queue: Option<String>,
        /// Stop after this many seconds.
        #[arg(long)]
        seconds: Option<u64>,
        /// How often to look, in milliseconds.
        #[arg(long, default_value_t = 500)]
        interval_ms: u64,
    },
}

#[derive(Debug, Subcommand)]
pub enum GeneratorCommand {
    /// Desired state, leader and production so far.
    Status,
    /// Start producing (operator role).
    Start {
        /// Tasks per second.
        #[arg(long)]
        rate: Option<f64>,
        /// The shortest `sleep_duration_seconds` a generated task asks for.
        #[arg(long)]
        min_sleep: Option<f64>,
        /// The longest `sleep_duration_seconds` a generated task asks for.
        #[arg(long)]
        max_sleep: Option<f64>,
    },
    /// Stop producing (operator role).
    Stop,
}

/// The two services, as the CLI talks to them.
#[derive(Debug)]
struct Api {
    http: reqwest::Client,
    leases: String,
    tasks: String,
}

impl Api {
    fn new(cli: &Cli) -> anyhow::Result<Api> {
        let token = cli.token.as_deref().map(leasehold::api::Secret::new);
        let http = reqwest::Client::builder()
            .default_headers(leasehold::api::Secret::bearer_headers(token.as_ref()))
            .timeout(Duration::from_secs(30))
            .build()
            .context("building the HTTP client")?;
        Ok(Api {
            http,
            leases: cli.lease_url.trim_end_matches('/').to_owned(),
            tasks: cli.task_url.trim_end_matches('/').to_owned(),
        })
    }

    /// Sends one request; a non-2xx answer becomes an error quoting the service's `error` and
    /// `code`.
    async fn call(
        &self,
        method: reqwest::Method,
        url: String,
        body: Option<&Value>,
    ) -> anyhow::Result<Value> {
        let mut request = self.http.request(method.clone(), &url);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("{method} {url}"))?;
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .with_context(|| format!("reading the answer to {method} {url}"))?;
        let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if !status.is_success() {
            let error = value["error"].as_str().unwrap_or("(no message)");
            let code = value["code"].as_str().unwrap_or("unknown");
            bail!("{method} {url} answered {status}: {error} ({code})");
        }
        Ok(value)
    }

    async fn get(&self, url: String) -> anyhow::Result<Value> {
        self.call(reqwest::Method::GET, url, None).await
    }
}

/// Where the output goes: JSON or tables on standard output, progress and hints on standard
/// error. Progress redraws one line in place only when standard error is a terminal; anywhere
/// else (a pipe, a file, CI's log) each new state is a plain line of its own, without escapes.
struct Out {
    json: bool,
    terminal: bool,
    /// The last progress line written where lines are not redrawn: an unchanged state is not
    /// written again.
    last: Mutex<String>,
}

impl Out {
    fn new(json: bool) -> Out {
        Out {
            json,
            terminal: std::io::stderr().is_terminal(),
            last: Mutex::new(String::new()),
        }
    }

    /// Prints `value` as JSON with `--json`, else as `table` renders it.
    fn value(
        &self,
        value: &Value,
        table: impl FnOnce(&Value) -> anyhow::Result<String>,
    ) -> anyhow::Result<()> {
        let text = if self.json {
            serde_json::to_string_pretty(value)?
        } else {
            table(value)?
        };
        self.line(&text)
    }

    fn line(&self, text: &str) -> anyhow::Result<()> {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{text}")?;
        stdout.flush()?;
        Ok(())
    }

    /// A line for people, beside the output (never mixed into it).
    fn note(&self, text: &str) {
        let mut stderr = std::io::stderr().lock();
        let _ = writeln!(stderr, "{text}");
    }

    /// The current state of something under way; `done` when it is the last.
    fn progress(&self, text: &str, done: bool) {
        let mut stderr = std::io::stderr().lock();
        if self.terminal {
            let end = if done { "\n" } else { "" };
            let _ = write!(stderr, "\r{text}\x1b[K{end}");
        } else {
            let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
            if *last != text {
                let _ = writeln!(stderr, "{text}");
                text.clone_into(&mut last);
            }
        }
        let _ = stderr.flush();
    }
}

/// `value` read as the wire type `T`: the tables render the services' own types, so they
/// follow the API's field names.
fn typed<T: DeserializeOwned>(value: &Value) -> anyhow::Result<T> {
    T::deserialize(value).with_context(|| format!("unexpected answer: {value}"))
}

/// Runs one command.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let api = Api::new(&cli)?;
    let out = Out::new(cli.json);
    match cli.command {
        Command::Leases(command) => leases(&api, &out, command).await,
        Command::Tasks(command) => tasks(&api, &out, command).await,
        Command::Generator(command) => generator(&api, &out, command).await,
    }
}

/// A listing's URL: newest first, `limit` rows from `cursor` on.
fn listing_url(
    url: &str,
    limit: u32,
    cursor: Option<&str>,
    filters: &[(&str, Option<&str>)],
) -> anyhow::Result<String> {
    let mut url = reqwest::Url::parse(url)?;
    url.query_pairs_mut()
        .append_pair("order", "desc")
        .append_pair("limit", &limit.to_string());
    if let Some(cursor) = cursor {
        url.query_pairs_mut().append_pair("cursor", cursor);
    }
    for (name, value) in filters {
        if let Some(value) = value {
            url.query_pairs_mut().append_pair(name, value);
        }
    }
    Ok(url.to_string())
}

/// Says how to get the rest when a listing stopped short of it (a page holds at most `limit`
/// rows, and the service may cut one short to bound its size).
fn more_hint(shown: usize, of: Option<i64>, what: &str, next: Option<&str>) -> Option<String> {
    let next = next?;
    let of = of.map_or_else(String::new, |total| format!(" of {total}"));
    Some(format!(
        "showing {shown}{of} {what}, newest first; more with --cursor {next} (or a larger \
         --limit, up to 1000)"
    ))
}

async fn leases(api: &Api, out: &Out, command: LeaseCommand) -> anyhow::Result<()> {
    let base = format!("{}/api/leases", api.leases);
    match command {
        LeaseCommand::List {
            status,
            prefix,
            limit,
            cursor,
        } => {
            let path = if status == "all" {
                String::new()
            } else {
                format!("/{status}")
            };
            let url = listing_url(
                &format!("{base}{path}"),
                limit,
                cursor.as_deref(),
                &[("resource_prefix", prefix.as_deref())],
            )?;
            let answer = api.get(url).await?;
            let page: LeasePage = typed(&answer)?;
            out.value(&answer, |_| Ok(lease_table(&page.leases)))?;
            if !out.json
                && let Some(hint) = more_hint(
                    page.leases.len(),
                    None,
                    "leases",
                    page.next_cursor.as_deref(),
                )
            {
                out.note(&hint);
            }
            Ok(())
        }
        LeaseCommand::Show { id } => {
            let answer = api.get(format!("{base}/{id}")).await?;
            out.value(&answer, |a| Ok(lease_table(&[typed(&a["lease"])?])))
        }
        LeaseCommand::Acquire {
            resource,
            holder,
            ttl,
        } => {
            let body = json!({"resource": resource, "holder": holder, "ttl_seconds": ttl});
            let lease = api.call(reqwest::Method::POST, base, Some(&body)).await?;
            out.value(&lease, |l| {
                let lease: Lease = typed(l)?;
                let mut text = lease_table(std::slice::from_ref(&lease));
                if let Some(secret) = &lease.secret {
                    text.push_str(&format!("\nsecret: {}", secret.expose()));
                }
                Ok(text)
            })
        }
        LeaseCommand::Renew {
            resource,
            proof,
            ttl,
        } => {
            let body = json!({"resource": resource, "holder": proof.holder, "fence": proof.fence,
                              "secret": proof.secret, "ttl_seconds": ttl});
            let lease = api
                .call(reqwest::Method::PUT, format!("{base}/renew"), Some(&body))
                .await?;
            out.value(&lease, |l| Ok(lease_table(&[typed(l)?])))
        }
        LeaseCommand::Release { resource, proof } => {
            let body = json!({"resource": resource, "holder": proof.holder, "fence": proof.fence,
                              "secret": proof.secret});
            let lease = api
                .call(
                    reqwest::Method::DELETE,
                    format!("{base}/release"),
                    Some(&body),
                )
                .await?;
            out.value(&lease, |l| Ok(lease_table(&[typed(l)?])))
        }
        LeaseCommand::Revoke { id } => {
            let lease = api
                .call(reqwest::Method::POST, format!("{base}/{id}/revoke"), None)
                .await?;
            out.value(&lease, |l| Ok(lease_table(&[typed(l)?])))
        }
    }
}

async fn tasks(api: &Api, out: &Out, command: TaskCommand) -> anyhow::Result<()> {
    let base = format!("{}/api/tasks", api.tasks);
    match command {
        TaskCommand::Create {
            data,
            count,
            queue,
            priority,
            max_attempts,
            wait,
            timeout_seconds,
        } => {
            let task_data: Value =
                serde_json::from_str(&data).context("--data is not valid JSON")?;
            let body = json!({"task_data": task_data, "queue": queue, "priority": priority,
                              "max_attempts": max_attempts});
            let created = create_many(api, out, &base, &body, count).await?;
            let list = Value::Array(created.clone());
            if out.json || created.len() <= 20 {
                out.value(&list, |_| {
                    let tasks: Vec<Task> = typed(&list)?;
                    Ok(task_table(&tasks))
                })?;
            } else {
                out.line(&format!("created {} tasks", created.len()))?;
            }
            if wait {
                let queue = created
                    .first()
                    .and_then(|t| t["queue"].as_str())
                    .unwrap_or("default")
                    .to_owned();
                wait_for_queue(
                    api,
                    out,
                    &base,
                    &queue,
                    Duration::from_secs(timeout_seconds),
                )
                .await?;
            }
            Ok(())
        }
        TaskCommand::List {
            status,
            queue,
            limit,
            cursor,
        } => {
            let url = listing_url(
                &base,
                limit,
                cursor.as_deref(),
                &[("status", status.as_deref()), ("queue", queue.as_deref())],
            )?;
            let answer = api.get(url).await?;
            let page: TaskPage = typed(&answer)?;
            out.value(&answer, |_| Ok(task_table(&page.tasks)))?;
            if !out.json && page.next_cursor.is_some() {
                // Only to say how many there are: a failure here costs the count, not the list.
                let total = count_tasks(api, &base, status.as_deref(), queue.as_deref())
                    .await
                    .ok();
                let hint = more_hint(
                    page.tasks.len(),
                    total,
                    "tasks",
                    page.next_cursor.as_deref(),
                );
                if let Some(hint) = hint {
                    out.note(&hint);
                }
            }
            Ok(())
        }
        TaskCommand::Show { id } => {
            let answer = api.get(format!("{base}/{id}")).await?;
            out.value(&answer, |a| Ok(task_detail(&typed(&a["task"])?)))
        }
        TaskCommand::Cancel { id } => {
            let task = api
                .call(reqwest::Method::POST, format!("{base}/{id}/cancel"), None)
                .await?;
            out.value(&task, |t| Ok(task_table(&[typed(t)?])))
        }
        TaskCommand::Retry { id } => {
            let task = api
                .call(reqwest::Method::POST, format!("{base}/{id}/retry"), None)
                .await?;
            out.value(&task, |t| Ok(task_table(&[typed(t)?])))
        }
        TaskCommand::Tail {
            queue,
            seconds,
            interval_ms,
        } => tail(api, out, &base, queue.as_deref(), seconds, interval_ms).await,
    }
}

/// How many tasks a listing with these filters covers, from the queues' counts.
async fn count_tasks(
    api: &Api,
    base: &str,
    status: Option<&str>,
    queue: Option<&str>,
) -> anyhow::Result<i64> {
    let counts = api.get(format!("{base}/counts")).await?;
    let by_status = match queue {
        Some(queue) => &counts["queues"][queue],
        None => &counts["total"],
    };
    let wanted: Vec<&str> = status.map_or_else(Vec::new, |s| s.split(',').map(str::trim).collect());
    let by_status = by_status.as_object().context("counts without statuses")?;
    Ok(by_status
        .iter()
        .filter(|(status, _)| wanted.is_empty() || wanted.contains(&status.as_str()))
        .filter_map(|(_, n)| n.as_i64())
        .sum())
}

/// Creates `count` tasks, 16 requests at a time, showing the count on standard error.
async fn create_many(
    api: &Api,
    out: &Out,
    base: &str,
    body: &Value,
    count: u32,
) -> anyhow::Result<Vec<Value>> {
    let mut created = Vec::with_capacity(usize::try_from(count).unwrap_or(0));
    let mut remaining = count;
    while remaining > 0 {
        let wave = remaining.min(16);
        let requests =
            (0..wave).map(|_| api.call(reqwest::Method::POST, base.to_owned(), Some(body)));
        for answer in futures_util::future::join_all(requests).await {
            created.push(answer?);
        }
        remaining -= wave;
        if count > 1 {
            out.progress(
                &format!("created {}/{count}", created.len()),
                remaining == 0,
            );
        }
    }
    Ok(created)
}

/// Shows the queue's counts until nothing in it is pending or running.
async fn wait_for_queue(
    api: &Api,
    out: &Out,
    base: &str,
    queue: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let counts = api.get(format!("{base}/counts")).await?;
        let of = |status: &str| counts["queues"][queue][status].as_i64().unwrap_or(0);
        let line = format!(
            "{queue}: pending {}, running {}, succeeded {}, dead {}, cancelled {}",
            of("pending"),
            of("running"),
            of("succeeded"),
            of("dead"),
            of("cancelled")
        );
        if of("pending") == 0 && of("running") == 0 {
            out.progress(&line, true);
            if out.json {
                out.value(&counts["queues"][queue], |_| Ok(String::new()))?;
            }
            return Ok(());
        }
        if Instant::now() > deadline {
            out.progress(&line, true);
            bail!("tasks in {queue} still pending or running after {timeout:?}");
        }
        out.progress(&line, false);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Prints each task as it appears and each change of its status.
async fn tail(
    api: &Api,
    out: &Out,
    base: &str,
    queue: Option<&str>,
    seconds: Option<u64>,
    interval_ms: u64,
) -> anyhow::Result<()> {
    let stop = seconds.map(|s| Instant::now() + Duration::from_secs(s));
    // Tasks not yet final, by id, with the status last printed.
    let mut watching: BTreeMap<i64, TaskStatus> = BTreeMap::new();
    // Start from the newest task: only what happens from now on is printed.
    let newest: TaskPage = typed(&api.get(format!("{base}?order=desc&limit=1")).await?)?;
    let mut cursor = newest.tasks.first().map_or(0, |task| task.id);
    loop {
        loop {
            let mut url = reqwest::Url::parse(base)?;
            url.query_pairs_mut()
                .append_pair("limit", "1000")
                .append_pair("cursor", &cursor.to_string());
            if let Some(queue) = queue {
                url.query_pairs_mut().append_pair("queue", queue);
            }
            let page: TaskPage = typed(&api.get(url.to_string()).await?)?;
            for task in &page.tasks {
                cursor = cursor.max(task.id);
                report(out, task)?;
                if !task.status.is_final() {
                    watching.insert(task.id, task.status);
                }
            }
            if page.next_cursor.is_none() || page.tasks.is_empty() {
                break;
            }
        }
        let ids: Vec<i64> = watching.keys().copied().take(500).collect();
        for id in ids {
            let answer = api.get(format!("{base}/{id}")).await?;
            let task: Task = typed(&answer["task"])?;
            if watching.get(&id) != Some(&task.status) {
                report(out, &task)?;
            }
            if task.status.is_final() {
                watching.remove(&id);
            } else {
                watching.insert(id, task.status);
            }
        }
        if stop.is_some_and(|stop| Instant::now() >= stop) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(interval_ms)).await;
    }
}

/// One line of `tail`: a JSON object per line with --json.
fn report(out: &Out, task: &Task) -> anyhow::Result<()> {
    if out.json {
        return out.line(&serde_json::to_string(task)?);
    }
    out.line(&format!(
        "{}  task {:<8} {:<10} queue={} processor={} attempts={}",
        time(&task.updated_at),
        task.id,
        task.status.as_str(),
        task.queue,
        task.processor.as_deref().unwrap_or("-"),
        task.attempts
    ))
}

async fn generator(api: &Api, out: &Out, command: GeneratorCommand) -> anyhow::Result<()> {
    let base = format!("{}/api/generator", api.tasks);
    let status = match command {
        GeneratorCommand::Status => api.get(format!("{base}/status")).await?,
        GeneratorCommand::Start {
            rate,
            min_sleep,
            max_sleep,
        } => {
            let body = json!({"rate_per_second": rate, "min_sleep_seconds": min_sleep,
                              "max_sleep_seconds": max_sleep});
            api.call(reqwest::Method::POST, format!("{base}/start"), Some(&body))
                .await?;
            api.get(format!("{base}/status")).await?
        }
        GeneratorCommand::Stop => {
            api.call(
                reqwest::Method::POST,
                format!("{base}/stop"),
                Some(&json!({})),
            )
            .await?;
            api.get(format!("{base}/status")).await?
        }
    };
    out.value(&status, |s| Ok(generator_table(&typed(s)?)))
}

/// Columns padded to their widest cell.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    let mut text = line(headers.to_vec());
    for row in rows {
        text.push('\n');
        text.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    text
}

/// A time as the services write it (RFC 3339, UTC), to the millisecond.
fn time(at: &DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn or_dash(value: Option<String>) -> String {
    value.unwrap_or_else(|| "-".to_owned())
}

/// A wire enum's name as the API writes it (`active`, `revoked`, ...).
fn wire_name<T: Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// Time left on a lease: only an active lease has any; an ended one shows `-`, not a zero
/// that reads like a lease about to run out.
fn time_left(lease: &Lease) -> String {
    if lease.status == LeaseStatus::Active {
        format!("{:.1}s", lease.expires_in_ms as f64 / 1000.0)
    } else {
        "-".to_owned()
    }
}

pub fn lease_table(leases: &[Lease]) -> String {
    let rows: Vec<Vec<String>> = leases
        .iter()
        .map(|l| {
            vec![
                l.id.to_string(),
                l.resource.clone(),
                l.holder.clone(),
                l.fence.to_string(),
                wire_name(&l.status),
                time_left(l),
                time(&l.expires_at),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "RESOURCE",
            "HOLDER",
            "FENCE",
            "STATUS",
            "LEFT",
            "EXPIRES AT",
        ],
        &rows,
    )
}

fn task_table(tasks: &[Task]) -> String {
    let rows: Vec<Vec<String>> = tasks
        .iter()
        .map(|t| {
            vec![
                t.id.to_string(),
                t.status.as_str().to_owned(),
                t.queue.clone(),
                t.priority.to_string(),
                format!("{}/{}", t.attempts, t.max_attempts),
                or_dash(t.processor.clone()),
                time(&t.scheduled_at),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "STATUS",
            "QUEUE",
            "PRIORITY",
            "ATTEMPTS",
            "PROCESSOR",
            "SCHEDULED AT",
        ],
        &rows,
    )
}

fn task_detail(task: &Task) -> String {
    let at = |at: &Option<DateTime<Utc>>| or_dash(at.as_ref().map(time));
    let rows: Vec<Vec<String>> = [
        ("id", task.id.to_string()),
        ("status", task.status.as_str().to_owned()),
        ("queue", task.queue.clone()),
        ("priority", task.priority.to_string()),
        ("attempts", task.attempts.to_string()),
        ("max attempts", task.max_attempts.to_string()),
        ("processor", or_dash(task.processor.clone())),
        ("fence", or_dash(task.fence.map(|f| f.to_string()))),
        ("scheduled at", time(&task.scheduled_at)),
        ("started at", at(&task.started_at)),
        ("last heartbeat", at(&task.last_heart_beat_at)),
        ("heartbeat before", at(&task.must_heart_beat_before)),
        ("processed at", at(&task.processed_at)),
        ("last error", or_dash(task.last_error.clone())),
        ("cancel requested", task.cancel_requested.to_string()),
        ("idempotency key", or_dash(task.idempotency_key.clone())),
        ("data", task.task_data.to_string()),
        (
            "output",
            or_dash(task.task_output.as_ref().map(Value::to_string)),
        ),
    ]
    .into_iter()
    .map(|(label, value)| vec![label.to_owned(), value])
    .collect();
    table(&["FIELD", "VALUE"], &rows)
}

fn generator_table(status: &GeneratorStatus) -> String {
    let leader = status.leader.as_ref();
    let rows = vec![
        vec!["desired".to_owned(), status.status.clone()],
        vec!["producing".to_owned(), status.producing.to_string()],
        vec![
            "rate per second".to_owned(),
            status.settings.rate_per_second.to_string(),
        ],
        vec!["produced".to_owned(), status.produced.to_string()],
        vec![
            "leader".to_owned(),
            or_dash(leader.map(|l| l.holder.clone())),
        ],
        vec![
            "leader fence".to_owned(),
            or_dash(leader.map(|l| l.fence.to_string())),
        ],
        vec![
            "leading since".to_owned(),
            or_dash(leader.map(|l| time(&l.since))),
        ],
    ];
    table(&["GENERATOR", "VALUE"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns_and_trim_trailing_space() {
        let text = table(
            &["ID", "NAME"],
            &[
                vec!["1".to_owned(), "a".to_owned()],
                vec!["100".to_owned(), "bb".to_owned()],
            ],
        );
        assert_eq!(text, "ID   NAME\n1    a\n100  bb");
    }

    #[test]
    fn every_command_parses() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        for args in [
            vec![
                "leasehold",
                "leases",
                "list",
                "--status",
                "active",
                "--json",
            ],
            vec!["leasehold", "leases", "list", "--cursor", "42"],
            vec![
                "leasehold",
                "leases",
                "acquire",
                "r",
                "--holder",
                "h",
                "--ttl",
                "5",
            ],
            vec![
                "leasehold",
                "leases",
                "release",
                "r",
                "--holder",
                "h",
                "--secret",
                "s",
            ],
            vec!["leasehold", "tasks", "create", "--count", "3", "--wait"],
            vec![
                "leasehold",
                "tasks",
                "list",
                "--limit",
                "5",
                "--cursor",
                "9",
            ],
            vec!["leasehold", "tasks", "tail", "--seconds", "1"],
            vec!["leasehold", "generator", "start", "--rate", "2"],
        ] {
            assert!(Cli::try_parse_from(&args).is_ok(), "{args:?}");
        }
        assert!(Cli::try_parse_from(["leasehold", "leases", "list", "--status", "x"]).is_err());
    }

    #[test]
    fn every_argument_and_subcommand_has_help() {
        use clap::CommandFactory;
        fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in command.get_arguments() {
                if arg
                    .get_help()
                    .is_none_or(|h| h.to_string().trim().is_empty())
                {
                    missing.push(format!("{path} {}", arg.get_id()));
                }
            }
            for sub in command.get_subcommands() {
                let path = format!("{path} {}", sub.get_name());
                if sub
                    .get_about()
                    .is_none_or(|h| h.to_string().trim().is_empty())
                {
                    missing.push(path.clone());
                }
                walk(sub, &path, missing);
            }
        }
        let mut command = Cli::command();
        command.build();
        let mut missing = Vec::new();
        walk(&command, "leasehold", &mut missing);
        assert!(missing.is_empty(), "without help: {missing:?}");
    }

    #[test]
    fn default_task_data_is_work_the_worker_finishes() {
        let data: Value = serde_json::from_str(DEFAULT_TASK_DATA).expect("JSON");
        assert!(
            data["sleep_duration_seconds"]
                .as_f64()
                .is_some_and(|s| s >= 0.0)
        );
    }

    #[test]
    fn only_an_active_lease_has_time_left() {
        let now = Utc::now();
        let lease = |status: LeaseStatus, expires_in_ms: i64| Lease {
            id: 1,
            resource: "r".to_owned(),
            holder: "h".to_owned(),
            fence: 1,
            ttl_seconds: 30,
            status,
            created_at: now,
            renewed_at: None,
            released_at: None,
            expires_at: now,
            expires_in_ms,
            secret: None,
        };
        assert_eq!(time_left(&lease(LeaseStatus::Active, 1500)), "1.5s");
        for ended in [
            LeaseStatus::Released,
            LeaseStatus::Revoked,
            LeaseStatus::Expired,
        ] {
            assert_eq!(time_left(&lease(ended, 0)), "-");
        }
    }

    #[test]
    fn the_hint_says_how_to_get_more_only_when_there_is_more() {
        assert_eq!(more_hint(100, Some(250), "tasks", None), None);
        let hint = more_hint(100, Some(250), "tasks", Some("151")).expect("a hint");
        assert!(
            hint.starts_with("showing 100 of 250 tasks, newest first"),
            "{hint}"
        );
        assert!(
            hint.contains("--cursor 151") && hint.contains("--limit"),
            "{hint}"
        );
    }
}
