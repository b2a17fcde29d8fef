//! `leasehold`, the operators' command line: leases (list, show, acquire, renew, release,
//! revoke), tasks (create, list, show, cancel, retry, tail) and the generator (status, start,
//! stop), against lease-service and task-service over their HTTP APIs.
//!
//! Every command prints a human table by default and the services' own JSON with `--json`, so
//! scripts read exactly what the API says. Commands that wait on work (`tasks create --wait`,
//! `tasks tail`) show a live count on standard error while standard output stays clean.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
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
    /// List leases (newest last).
    List {
        /// all, active, expired, renewed or released.
        #[arg(long, default_value = "all")]
        status: String,
        /// Only resources starting with this.
        #[arg(long)]
        prefix: Option<String>,
        /// At most this many (up to 1000).
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// One lease by id.
    Show { id: i64 },
    /// Acquire RESOURCE for --holder (prints the lease, with its secret).
    Acquire {
        resource: String,
        #[arg(long)]
        holder: String,
        /// Lease length in seconds (the service's default when absent).
        #[arg(long)]
        ttl: Option<i64>,
    },
    /// Renew RESOURCE for --holder.
    Renew {
        resource: String,
        #[command(flatten)]
        proof: ProofArgs,
        #[arg(long)]
        ttl: Option<i64>,
    },
    /// Release RESOURCE for --holder.
    Release {
        resource: String,
        #[command(flatten)]
        proof: ProofArgs,
    },
    /// Release lease ID whoever holds it (operator role).
    Revoke { id: i64 },
}

#[derive(Debug, Args)]
pub struct ProofArgs {
    #[arg(long)]
    holder: String,
    /// The lease's fence, refused unless current.
    #[arg(long)]
    fence: Option<i64>,
    /// The secret the acquire answered with.
    #[arg(long)]
    secret: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum TaskCommand {
    /// Create tasks; with --wait, watch them until none is pending or running.
    Create {
        /// The task's data, as JSON.
        #[arg(long, default_value = "{}")]
        data: String,
        /// How many tasks to create.
        #[arg(long, default_value_t = 1)]
        count: u32,
        #[arg(long)]
        queue: Option<String>,
        #[arg(long)]
        priority: Option<i32>,
        #[arg(long)]
        max_attempts: Option<i32>,
        /// Wait until the queue has no pending or running task, showing a live count.
        #[arg(long)]
        wait: bool,
        /// Give up waiting after this many seconds (exit 1).
        #[arg(long, default_value_t = 600)]
        timeout_seconds: u64,
    },
    /// List tasks (oldest first).
    List {
        /// Comma-separated statuses: pending, running, succeeded, dead, cancelled.
        #[arg(long)]
        status: Option<String>,
        #[arg(long)]
        queue: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// One task by id.
    Show { id: i64 },
    /// Cancel a task (operator role).
    Cancel { id: i64 },
    /// Put a dead task back in its queue (operator role).
    Retry { id: i64 },
    /// Print tasks as they are created and change status, until Ctrl-C (or --seconds).
    Tail {
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
        #[arg(long)]
        min_sleep: Option<f64>,
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
        let token = cli.token.as_deref().map(shared::api::Secret::new);
        let http = reqwest::Client::builder()
            .default_headers(shared::api::Secret::bearer_headers(token.as_ref()))
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

/// Where the output goes: JSON or tables on standard output, progress on standard error.
struct Out {
    json: bool,
}

impl Out {
    fn value(&self, value: &Value, table: impl FnOnce(&Value) -> String) -> anyhow::Result<()> {
        let text = if self.json {
            serde_json::to_string_pretty(value)?
        } else {
            table(value)
        };
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{text}")?;
        Ok(())
    }

    fn line(&self, text: &str) -> anyhow::Result<()> {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{text}")?;
        stdout.flush()?;
        Ok(())
    }

    fn progress(&self, text: &str) {
        let mut stderr = std::io::stderr().lock();
        let _ = write!(stderr, "\r{text}\x1b[K");
        let _ = stderr.flush();
    }
}

/// Runs one command.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let api = Api::new(&cli)?;
    let out = Out { json: cli.json };
    match cli.command {
        Command::Leases(command) => leases(&api, &out, command).await,
        Command::Tasks(command) => tasks(&api, &out, command).await,
        Command::Generator(command) => generator(&api, &out, command).await,
    }
}

async fn leases(api: &Api, out: &Out, command: LeaseCommand) -> anyhow::Result<()> {
    let base = format!("{}/api/leases", api.leases);
    match command {
        LeaseCommand::List {
            status,
            prefix,
            limit,
        } => {
            let path = match status.as_str() {
                "all" => String::new(),
                "active" | "expired" | "renewed" | "released" => format!("/{status}"),
                other => bail!(
                    "unknown lease status {other:?}: use all, active, expired, renewed or released"
                ),
            };
            let mut url = reqwest::Url::parse(&format!("{base}{path}"))?;
            url.query_pairs_mut()
                .append_pair("limit", &limit.to_string());
            if let Some(prefix) = &prefix {
                url.query_pairs_mut().append_pair("resource_prefix", prefix);
            }
            let leases = api.get(url.to_string()).await?;
            out.value(&leases, lease_table)
        }
        LeaseCommand::Show { id } => {
            let lease = api.get(format!("{base}/{id}")).await?;
            out.value(&lease, |l| lease_table(&json!([l])))
        }
        LeaseCommand::Acquire {
            resource,
            holder,
            ttl,
        } => {
            let body = json!({"resource": resource, "holder": holder, "ttl_seconds": ttl});
            let lease = api.call(reqwest::Method::POST, base, Some(&body)).await?;
            out.value(&lease, |l| {
                let mut text = lease_table(&json!([l]));
                if let Some(secret) = l["secret"].as_str() {
                    text.push_str(&format!("\nsecret: {secret}"));
                }
                text
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
            out.value(&lease, |l| lease_table(&json!([l])))
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
            out.value(&lease, |l| lease_table(&json!([l])))
        }
        LeaseCommand::Revoke { id } => {
            let lease = api
                .call(reqwest::Method::POST, format!("{base}/{id}/revoke"), None)
                .await?;
            out.value(&lease, |l| lease_table(&json!([l])))
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
            if out.json {
                out.value(&Value::Array(created.clone()), |_| String::new())?;
            } else if created.len() <= 20 {
                out.value(&Value::Array(created.clone()), task_table)?;
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
        } => {
            let mut url = reqwest::Url::parse(&base)?;
            url.query_pairs_mut()
                .append_pair("limit", &limit.to_string());
            if let Some(status) = &status {
                url.query_pairs_mut().append_pair("status", status);
            }
            if let Some(queue) = &queue {
                url.query_pairs_mut().append_pair("queue", queue);
            }
            let tasks = api.get(url.to_string()).await?;
            out.value(&tasks, task_table)
        }
        TaskCommand::Show { id } => {
            let task = api.get(format!("{base}/{id}")).await?;
            out.value(&task, task_detail)
        }
        TaskCommand::Cancel { id } => {
            let task = api
                .call(reqwest::Method::POST, format!("{base}/{id}/cancel"), None)
                .await?;
            out.value(&task, |t| task_table(&json!([t])))
        }
        TaskCommand::Retry { id } => {
            let task = api
                .call(reqwest::Method::POST, format!("{base}/{id}/retry"), None)
                .await?;
            out.value(&task, |t| task_table(&json!([t])))
        }
        TaskCommand::Tail {
            queue,
            seconds,
            interval_ms,
        } => tail(api, out, &base, queue.as_deref(), seconds, interval_ms).await,
    }
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
            out.progress(&format!("created {}/{count}", created.len()));
        }
    }
    if count > 1 {
        out.progress(&format!("created {count}/{count}\n"));
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
        out.progress(&line);
        if of("pending") == 0 && of("running") == 0 {
            out.progress(&format!("{line}\n"));
            if out.json {
                out.value(&counts["queues"][queue], |_| String::new())?;
            }
            return Ok(());
        }
        if Instant::now() > deadline {
            out.progress(&format!("{line}\n"));
            bail!("tasks in {queue} still pending or running after {timeout:?}");
        }
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
    let mut watching: BTreeMap<i64, String> = BTreeMap::new();
    // Start from the newest task: only what happens from now on is printed.
    let mut cursor = newest_id(api, base).await?;
    loop {
        loop {
            let mut url = reqwest::Url::parse(base)?;
            url.query_pairs_mut()
                .append_pair("limit", "1000")
                .append_pair("cursor", &cursor.to_string());
            if let Some(queue) = queue {
                url.query_pairs_mut().append_pair("queue", queue);
            }
            let page = api.get(url.to_string()).await?;
            let tasks = page.as_array().cloned().unwrap_or_default();
            if tasks.is_empty() {
                break;
            }
            for task in &tasks {
                let id = task["id"].as_i64().unwrap_or(0);
                cursor = cursor.max(id);
                report(out, task)?;
                let status = task["status"].as_str().unwrap_or("").to_owned();
                if !is_final(&status) {
                    watching.insert(id, status);
                }
            }
            if tasks.len() < 1000 {
                break;
            }
        }
        let ids: Vec<i64> = watching.keys().copied().take(500).collect();
        for id in ids {
            let task = api.get(format!("{base}/{id}")).await?;
            let status = task["status"].as_str().unwrap_or("").to_owned();
            if watching.get(&id) != Some(&status) {
                report(out, &task)?;
            }
            if is_final(&status) {
                watching.remove(&id);
            } else {
                watching.insert(id, status);
            }
        }
        if stop.is_some_and(|stop| Instant::now() >= stop) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(interval_ms)).await;
    }
}

/// The highest task id there is (0 when there is none): where `tail` starts.
async fn newest_id(api: &Api, base: &str) -> anyhow::Result<i64> {
    let mut cursor = 0i64;
    loop {
        let page = api
            .get(format!("{base}?limit=1000&cursor={cursor}"))
            .await?;
        let tasks = page.as_array().cloned().unwrap_or_default();
        match tasks.last().and_then(|t| t["id"].as_i64()) {
            Some(id) if tasks.len() == 1000 => cursor = id,
            Some(id) => return Ok(id),
            None => return Ok(cursor),
        }
    }
}

fn is_final(status: &str) -> bool {
    matches!(status, "succeeded" | "dead" | "cancelled")
}

/// One line of `tail`: a JSON object per line with --json.
fn report(out: &Out, task: &Value) -> anyhow::Result<()> {
    if out.json {
        return out.line(&task.to_string());
    }
    out.line(&format!(
        "{}  task {:<8} {:<10} queue={} processor={} attempts={}",
        task["updatedAt"].as_str().unwrap_or(""),
        task["id"],
        task["status"].as_str().unwrap_or(""),
        task["queue"].as_str().unwrap_or(""),
        task["processor"].as_str().unwrap_or("-"),
        task["attempts"]
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
    out.value(&status, generator_table)
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

fn cell(value: &Value) -> String {
    match value {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn lease_table(leases: &Value) -> String {
    let rows: Vec<Vec<String>> = leases
        .as_array()
        .map(|list| {
            list.iter()
                .map(|l| {
                    let left = l["expires_in_ms"].as_i64().unwrap_or(0);
                    vec![
                        cell(&l["id"]),
                        cell(&l["resource"]),
                        cell(&l["holder"]),
                        cell(&l["fence"]),
                        cell(&l["status"]),
                        format!("{:.1}s", left as f64 / 1000.0),
                        cell(&l["expires_at"]),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
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

fn task_table(tasks: &Value) -> String {
    let rows: Vec<Vec<String>> = tasks
        .as_array()
        .map(|list| {
            list.iter()
                .map(|t| {
                    vec![
                        cell(&t["id"]),
                        cell(&t["status"]),
                        cell(&t["queue"]),
                        cell(&t["priority"]),
                        format!("{}/{}", cell(&t["attempts"]), cell(&t["maxAttempts"])),
                        cell(&t["processor"]),
                        cell(&t["scheduledAt"]),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
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

fn task_detail(task: &Value) -> String {
    let fields = [
        ("id", "id"),
        ("status", "status"),
        ("queue", "queue"),
        ("priority", "priority"),
        ("attempts", "attempts"),
        ("max attempts", "maxAttempts"),
        ("processor", "processor"),
        ("fence", "fence"),
        ("scheduled at", "scheduledAt"),
        ("started at", "startedAt"),
        ("last heartbeat", "lastHeartBeatAt"),
        ("heartbeat before", "mustHeartBeatBefore"),
        ("processed at", "processedAt"),
        ("last error", "lastError"),
        ("cancel requested", "cancelRequested"),
        ("idempotency key", "idempotencyKey"),
        ("data", "taskData"),
        ("output", "taskOutput"),
    ];
    let rows: Vec<Vec<String>> = fields
        .iter()
        .map(|(label, key)| vec![(*label).to_owned(), cell(&task[*key])])
        .collect();
    table(&["FIELD", "VALUE"], &rows)
}

fn generator_table(status: &Value) -> String {
    let leader = &status["leader"];
    let rows = vec![
        vec!["desired".to_owned(), cell(&status["status"])],
        vec!["producing".to_owned(), cell(&status["producing"])],
        vec![
            "rate per second".to_owned(),
            cell(&status["settings"]["rate_per_second"]),
        ],
        vec!["produced".to_owned(), cell(&status["produced"])],
        vec!["leader".to_owned(), cell(&leader["holder"])],
        vec!["leader fence".to_owned(), cell(&leader["fence"])],
        vec!["leading since".to_owned(), cell(&leader["since"])],
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
    fn every_command_parses_and_has_help() {
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
            vec!["leasehold", "tasks", "tail", "--seconds", "1"],
            vec!["leasehold", "generator", "start", "--rate", "2"],
        ] {
            assert!(Cli::try_parse_from(&args).is_ok(), "{args:?}");
        }
    }
}
