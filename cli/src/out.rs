//! What the CLI prints: JSON or tables on standard output, progress and hints on standard
//! error, and the tables for each wire type.

use std::io::{IsTerminal, Write};
use std::sync::{Mutex, PoisonError};

use chrono::{DateTime, Utc};
use leasehold::api::{Lease, LeaseStatus};
use leasehold::generator::GeneratorStatus;
use leasehold::queues::QueueState;
use leasehold::tasks::Task;
use serde::Serialize;
use serde_json::Value;

/// How reads are printed (`-o`), as kubectl's `-o` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// Columns for people.
    #[default]
    Table,
    /// The table with more columns (times, fences, keys, errors).
    Wide,
    /// The services' own JSON.
    Json,
    /// The services' own answer, as YAML.
    Yaml,
}

/// Where the output goes: JSON, YAML or tables on standard output, progress and hints on
/// standard error. Progress redraws one line in place only when standard error is a terminal;
/// anywhere else (a pipe, a file, CI's log) each new state is a plain line of its own, without
/// escapes.
pub(crate) struct Out {
    pub(crate) format: Format,
    /// Tables colour statuses: only on a terminal, and never with `NO_COLOR` set.
    pub(crate) colour: bool,
    /// Standard output is a terminal: `--watch` redraws the screen there.
    pub(crate) screen: bool,
    /// Standard error is a terminal: progress redraws its line there.
    pub(crate) terminal: bool,
    /// The last progress line written where lines are not redrawn: an unchanged state is not
    /// written again.
    pub(crate) last: Mutex<String>,
}

impl Out {
    pub(crate) fn new(format: Format) -> Out {
        let screen = std::io::stdout().is_terminal();
        Out {
            format,
            colour: colour_wanted(screen, std::env::var_os("NO_COLOR").as_deref()),
            screen,
            terminal: std::io::stderr().is_terminal(),
            last: Mutex::new(String::new()),
        }
    }

    /// Whether the output is for programs (JSON or YAML): no tables, no hints mixed in.
    pub(crate) fn machine(&self) -> bool {
        matches!(self.format, Format::Json | Format::Yaml)
    }

    /// How tables are drawn: wide (`-o wide`) or not, coloured or not.
    pub(crate) fn view(&self) -> View {
        View {
            wide: self.format == Format::Wide,
            colour: self.colour,
        }
    }

    /// Prints `value` as JSON or YAML (`-o json|yaml`), else as `table` renders it.
    pub(crate) fn value<T: Serialize>(
        &self,
        value: &T,
        table: impl FnOnce(&T) -> anyhow::Result<String>,
    ) -> anyhow::Result<()> {
        let text = self.render(value, table)?;
        self.line(&text)
    }

    /// What [`value`](Self::value) prints.
    pub(crate) fn render<T: Serialize>(
        &self,
        value: &T,
        table: impl FnOnce(&T) -> anyhow::Result<String>,
    ) -> anyhow::Result<String> {
        self.encode(value)?.map_or_else(|| table(value), Ok)
    }

    /// Prints what `read` renders, then the note it may have for standard error (what a
    /// listing left out); with `watch`, reads again every interval and prints it again whenever
    /// it changed, until interrupted (as `kubectl get --watch`). On a terminal each print
    /// replaces the screen; elsewhere each is appended (a JSON or YAML document each, a table
    /// after a blank line). A failed read ends the watch with its error.
    pub(crate) async fn watch<Fut: Future<Output = anyhow::Result<(String, Option<String>)>>>(
        &self,
        watch: &WatchArgs,
        mut read: impl FnMut() -> Fut,
    ) -> anyhow::Result<()> {
        let (text, note) = read().await?;
        self.line(&text)?;
        if !watch.watch {
            if let Some(note) = note {
                self.note(&note);
            }
            return Ok(());
        }
        let mut last = text;
        loop {
            tokio::time::sleep(std::time::Duration::from_secs_f64(watch.watch_interval)).await;
            let (text, _) = read().await?;
            if text == last {
                continue;
            }
            if self.screen {
                self.line(&format!("\x1b[H\x1b[2J{text}"))?;
            } else if self.format == Format::Yaml {
                self.line(&format!("---\n{text}"))?;
            } else if self.machine() {
                self.line(&text)?;
            } else {
                self.line(&format!("\n{text}"))?;
            }
            last = text;
        }
    }

    /// `value` as JSON or YAML, or `None` for the tables.
    pub(crate) fn encode<T: Serialize>(&self, value: &T) -> anyhow::Result<Option<String>> {
        // Through a `Value`, whose keys are in order: the JSON the CLI has always printed.
        let value = || serde_json::to_value(value);
        Ok(match self.format {
            Format::Json => Some(serde_json::to_string_pretty(&value()?)?),
            Format::Yaml => Some(yaml_serde::to_string(&value()?)?.trim_end().to_owned()),
            Format::Table | Format::Wide => None,
        })
    }

    pub(crate) fn line(&self, text: &str) -> anyhow::Result<()> {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{text}")?;
        stdout.flush()?;
        Ok(())
    }

    /// A line for people, beside the output (never mixed into it).
    pub(crate) fn note(&self, text: &str) {
        let mut stderr = std::io::stderr().lock();
        let _ = writeln!(stderr, "{text}");
    }

    /// The current state of something under way; `done` when it is the last.
    pub(crate) fn progress(&self, text: &str, done: bool) {
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

/// `--watch`: every read command takes it.
#[derive(Debug, Clone, clap::Args)]
pub struct WatchArgs {
    /// Keep watching: read again every --watch-interval and print again on every change,
    /// until Ctrl-C.
    #[arg(long, short = 'w')]
    pub watch: bool,
    /// Seconds between two reads of --watch.
    #[arg(long, default_value_t = 2.0, value_parser = watch_interval)]
    pub watch_interval: f64,
}

fn watch_interval(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(seconds) if (0.1..=3600.0).contains(&seconds) => Ok(seconds),
        _ => Err("a number of seconds from 0.1 to 3600".to_owned()),
    }
}

/// Which page of a listing to print: the flags every `list` command takes.
#[derive(Debug, clap::Args)]
pub struct PageArgs {
    #[command(flatten)]
    pub watch: WatchArgs,
    /// At most this many (a page is at most 1000).
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
    /// Every one: page after page of --limit, until the last.
    #[arg(long, conflicts_with = "cursor")]
    pub all: bool,
    /// Which come first.
    #[arg(long, value_enum, default_value_t)]
    pub sort: Sort,
    /// Continue from an earlier page: the cursor its last line (or its `nextCursor`) gave.
    #[arg(long)]
    pub cursor: Option<String>,
}

/// The order of a listing, by id (the order things were made in).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Sort {
    /// The newest first.
    #[default]
    Newest,
    /// The oldest first.
    Oldest,
}

impl Sort {
    pub(crate) fn newest_first(self) -> bool {
        self == Sort::Newest
    }

    fn words(self) -> &'static str {
        match self {
            Sort::Newest => "newest first",
            Sort::Oldest => "oldest first",
        }
    }
}

/// A page of a listing, which `--all` joins to the pages after it.
pub(crate) trait Paged: Sized {
    /// The cursor of the next page, taken out of this one.
    fn take_cursor(&mut self) -> Option<String>;
    /// Appends the next page's rows, and takes its cursor.
    fn append(&mut self, next: Self);
}

impl Paged for leasehold::tasks::TaskPage {
    fn take_cursor(&mut self) -> Option<String> {
        self.next_cursor.take()
    }
    fn append(&mut self, next: Self) {
        self.tasks.extend(next.tasks);
        self.next_cursor = next.next_cursor;
    }
}

impl Paged for leasehold::queues::Queues {
    fn take_cursor(&mut self) -> Option<String> {
        self.next_cursor.take()
    }
    fn append(&mut self, next: Self) {
        self.queues.extend(next.queues);
        self.next_cursor = next.next_cursor;
    }
}

impl Paged for leasehold::api::LeasePage {
    fn take_cursor(&mut self) -> Option<String> {
        self.next_cursor.take()
    }
    fn append(&mut self, next: Self) {
        self.leases.extend(next.leases);
        self.next_cursor = next.next_cursor;
    }
}

/// `first`, and with `all` every page after it, each read by `fetch` from the cursor before it.
pub(crate) async fn pages<P: Paged, Fut: Future<Output = anyhow::Result<P>>>(
    mut first: P,
    all: bool,
    mut fetch: impl FnMut(String) -> Fut,
) -> anyhow::Result<P> {
    while all && let Some(cursor) = first.take_cursor() {
        let next = fetch(cursor).await?;
        first.append(next);
    }
    Ok(first)
}

/// `12345` as `12,345`.
pub(crate) fn thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    if n < 0 { format!("-{out}") } else { out }
}

/// Says how to get the rest when a listing stopped short of it (a page holds at most `limit`
/// rows, and the service may cut one short to bound its size).
pub(crate) fn more_hint(
    shown: usize,
    of: Option<i64>,
    what: &str,
    sort: Sort,
    next: Option<&str>,
) -> Option<String> {
    let next = next?;
    let of = of.map_or_else(String::new, |total| format!(" of {}", thousands(total)));
    Some(format!(
        "showing {shown}{of} {what}, {}; use --limit (up to 1000) or --all, or go on with \
         --cursor {next}",
        sort.words()
    ))
}

/// Whether to colour: on a terminal, unless `NO_COLOR` is set to anything but nothing
/// (no-color.org).
pub(crate) fn colour_wanted(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(std::ffi::OsStr::is_empty)
}

/// How a table is drawn.
#[derive(Debug, Clone, Copy, Default)]
pub struct View {
    /// With the wide columns (`-o wide`).
    pub wide: bool,
    /// With statuses coloured (a terminal without `NO_COLOR`).
    pub colour: bool,
}

/// What a colour says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tone {
    /// Done, or holding: green.
    Good,
    /// Dead, or ended against its holder: red.
    Bad,
    /// Waiting: yellow.
    Waiting,
    /// At work: cyan.
    Busy,
    /// Over and of no further interest: dim.
    Over,
}

impl View {
    /// A task's or a lease's status, in its colour.
    pub(crate) fn status(self, status: &str) -> String {
        let tone = match status {
            "succeeded" | "active" => Tone::Good,
            "dead" | "revoked" | "expired" => Tone::Bad,
            "pending" => Tone::Waiting,
            "running" => Tone::Busy,
            "cancelled" | "released" => Tone::Over,
            _ => return status.to_owned(),
        };
        self.paint(status, tone)
    }

    /// `text` in the colour of `tone`, when colouring.
    pub(crate) fn paint(self, text: &str, tone: Tone) -> String {
        if !self.colour {
            return text.to_owned();
        }
        let code = match tone {
            Tone::Good => "32",
            Tone::Bad => "31",
            Tone::Waiting => "33",
            Tone::Busy => "36",
            Tone::Over => "2",
        };
        format!("\x1b[{code}m{text}\x1b[0m")
    }
}

/// The width a cell takes on screen: its characters, less colour escapes.
fn visible_width(cell: &str) -> usize {
    let mut width = 0;
    let mut escape = false;
    for c in cell.chars() {
        match (escape, c) {
            (false, '\x1b') => escape = true,
            (true, 'm') => escape = false,
            (true, _) => {}
            (false, _) => width += 1,
        }
    }
    width
}

/// Columns padded to their widest cell.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| visible_width(h)).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(visible_width(cell));
        }
    }
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| {
                let pad = width.saturating_sub(visible_width(cell));
                format!("{cell}{}", " ".repeat(pad))
            })
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
pub(crate) fn time(at: &DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

pub(crate) fn or_dash(value: Option<String>) -> String {
    value.unwrap_or_else(|| "-".to_owned())
}

/// A wire enum's name as the API writes it (`active`, `revoked`, ...).
pub(crate) fn wire_name<T: Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// Time left on a lease: only an active lease has any; an ended one shows `-`, not a zero
/// that reads like a lease about to run out.
pub(crate) fn time_left(lease: &Lease) -> String {
    if lease.status == LeaseStatus::Active {
        format!("{:.1}s", lease.expires_in_ms as f64 / 1000.0)
    } else {
        "-".to_owned()
    }
}

pub fn lease_table(leases: &[Lease], view: View) -> String {
    let wide = view.wide;
    let rows: Vec<Vec<String>> = leases
        .iter()
        .map(|l| {
            let mut row = vec![
                l.id.to_string(),
                l.resource.clone(),
                l.holder.clone(),
                l.fence.to_string(),
                view.status(&wire_name(&l.status)),
                time_left(l),
                time(&l.expires_at),
            ];
            if wide {
                row.extend([
                    l.ttl_seconds.to_string(),
                    time(&l.created_at),
                    or_dash(l.renewed_at.as_ref().map(time)),
                    or_dash(l.released_at.as_ref().map(time)),
                ]);
            }
            row
        })
        .collect();
    let mut headers = vec![
        "ID",
        "RESOURCE",
        "HOLDER",
        "FENCE",
        "STATUS",
        "LEFT",
        "EXPIRES AT",
    ];
    if wide {
        headers.extend(["TTL", "CREATED AT", "RENEWED AT", "RELEASED AT"]);
    }
    table(&headers, &rows)
}

pub(crate) fn task_table(tasks: &[Task], view: View) -> String {
    let wide = view.wide;
    let at = |at: &Option<DateTime<Utc>>| or_dash(at.as_ref().map(time));
    let rows: Vec<Vec<String>> = tasks
        .iter()
        .map(|t| {
            let mut row = vec![
                t.id.to_string(),
                view.status(t.status.as_str()),
                t.queue.clone(),
                t.priority.to_string(),
                format!("{}/{}", t.attempts, t.max_attempts),
                or_dash(t.processor.clone()),
                time(&t.scheduled_at),
            ];
            if wide {
                row.extend([
                    or_dash(t.concurrency_key.clone()),
                    or_dash(t.fence.map(|f| f.to_string())),
                    time(&t.created_at),
                    at(&t.started_at),
                    at(&t.processed_at),
                    or_dash(t.last_error.clone()),
                ]);
            }
            row
        })
        .collect();
    let mut headers = vec![
        "ID",
        "STATUS",
        "QUEUE",
        "PRIORITY",
        "ATTEMPTS",
        "PROCESSOR",
        "SCHEDULED AT",
    ];
    if wide {
        headers.extend([
            "KEY",
            "FENCE",
            "CREATED AT",
            "STARTED AT",
            "PROCESSED AT",
            "LAST ERROR",
        ]);
    }
    table(&headers, &rows)
}

pub(crate) fn task_detail(task: &Task) -> String {
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
        ("concurrency key", or_dash(task.concurrency_key.clone())),
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

pub(crate) fn queue_table(queues: &[QueueState], view: View) -> String {
    let wide = view.wide;
    let count =
        |q: &QueueState, status: &str| q.counts.get(status).copied().unwrap_or(0).to_string();
    let rows: Vec<Vec<String>> = queues
        .iter()
        .map(|q| {
            let mut row = vec![
                q.queue.clone(),
                if q.paused {
                    view.paint("paused", Tone::Waiting)
                } else {
                    view.paint("running", Tone::Good)
                },
                or_dash(q.concurrency_limit.map(|l| l.to_string())),
                or_dash(q.key_concurrency_limit.map(|l| l.to_string())),
                count(q, "pending"),
                count(q, "running"),
                count(q, "succeeded"),
                count(q, "dead"),
                or_dash(q.oldest_due_age_seconds.map(|s| format!("{s:.1} s"))),
            ];
            if wide {
                row.extend([
                    or_dash(q.rate_limit.as_ref().map(|r| r.per_second.to_string())),
                    or_dash(q.rate_limit.as_ref().map(|r| r.burst.to_string())),
                    count(q, "cancelled"),
                ]);
            }
            row
        })
        .collect();
    let mut headers = vec![
        "QUEUE",
        "STATE",
        "LIMIT",
        "KEY LIMIT",
        "PENDING",
        "RUNNING",
        "SUCCEEDED",
        "DEAD",
        "OLDEST DUE",
    ];
    if wide {
        headers.extend(["RATE/S", "BURST", "CANCELLED"]);
    }
    table(&headers, &rows)
}

pub(crate) fn generator_table(status: &GeneratorStatus) -> String {
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
    fn colour_only_on_a_terminal_and_never_with_no_color() {
        use std::ffi::OsStr;
        assert!(colour_wanted(true, None));
        assert!(colour_wanted(true, Some(OsStr::new(""))));
        assert!(!colour_wanted(true, Some(OsStr::new("1"))));
        assert!(!colour_wanted(false, None));
        let plain = View::default();
        assert_eq!(plain.status("dead"), "dead");
        let coloured = View {
            wide: false,
            colour: true,
        };
        assert_eq!(coloured.status("dead"), "\x1b[31mdead\x1b[0m");
        // Columns line up by what shows, not by the escapes.
        let text = table(
            &["ID", "STATUS", "QUEUE"],
            &[
                vec!["1".to_owned(), coloured.status("dead"), "q".to_owned()],
                vec!["2".to_owned(), "succeeded".to_owned(), "q".to_owned()],
            ],
        );
        let queue_at: Vec<usize> = text
            .lines()
            .map(|line| {
                let mut width = 0;
                let mut shown = String::new();
                for c in line.chars() {
                    shown.push(c);
                    width = visible_width(&shown);
                    if c == 'q' || c == 'Q' {
                        break;
                    }
                }
                width
            })
            .collect();
        assert_eq!(queue_at, vec![queue_at[0]; 3], "{text:?}");
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
            metadata: None,
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
        assert_eq!(more_hint(100, Some(250), "tasks", Sort::Newest, None), None);
        let hint = more_hint(100, Some(250), "tasks", Sort::Newest, Some("151")).expect("a hint");
        assert!(
            hint.starts_with("showing 100 of 250 tasks, newest first"),
            "{hint}"
        );
        assert!(
            hint.contains("--cursor 151") && hint.contains("--limit") && hint.contains("--all"),
            "{hint}"
        );
        let hint = more_hint(100, Some(12_345), "tasks", Sort::Newest, Some("7")).expect("a hint");
        assert!(hint.starts_with("showing 100 of 12,345 tasks"), "{hint}");
        assert_eq!(
            [
                thousands(0),
                thousands(999),
                thousands(1000),
                thousands(-1_234_567)
            ],
            ["0", "999", "1,000", "-1,234,567"]
        );
        let hint = more_hint(5, None, "leases", Sort::Oldest, Some("6")).expect("a hint");
        assert!(hint.starts_with("showing 5 leases, oldest first"), "{hint}");
    }
}
