//! What the CLI prints: JSON or tables on standard output, progress and hints on standard
//! error. `Out` is where it goes; beside it are `--watch` (`watch`), listings' pages and hints
//! (`paging`), how a table is drawn (`table`), and one module per thing a table shows
//! (`leases`, `tasks`, `queues`, `generator`).

mod generator;
mod leases;
mod paging;
mod queues;
mod table;
mod tasks;
mod watch;

use std::io::{IsTerminal, Write};
use std::sync::{Mutex, PoisonError};

use serde::Serialize;

pub(crate) use generator::generator_table;
pub use leases::lease_table;
pub(crate) use paging::{PageArgs, more_hint, pages};
pub(crate) use queues::queue_table;
pub(crate) use table::{Tone, colour_wanted, or_dash, time, wire_name};
pub use table::{View, table};
pub(crate) use tasks::{task_detail, task_table};
pub(crate) use watch::Shown;
pub use watch::WatchArgs;

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
