//! `--watch`: one loop for every read command.

use super::{Format, Out};

/// `--watch`: every read command takes it.
#[derive(Debug, Clone, clap::Args)]
pub struct WatchArgs {
    /// Keep watching: read again every --watch-interval and print again on every change,
    /// until Ctrl-C (`tasks show`: until the task reaches a final status).
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

/// One read of a watched command: what to print, the note it may have for standard error (what
/// a listing left out), and whether it is the last worth making (a task in a final status
/// changes no more, so its watch ends there).
pub(crate) struct Shown {
    pub(crate) text: String,
    pub(crate) note: Option<String>,
    pub(crate) last: bool,
}

impl Shown {
    pub(crate) fn new(text: String) -> Shown {
        Shown::noted(text, None)
    }

    pub(crate) fn noted(text: String, note: Option<String>) -> Shown {
        Shown {
            text,
            note,
            last: false,
        }
    }

    /// Marks this read as the last: what it shows cannot change.
    pub(crate) fn last(self, last: bool) -> Shown {
        Shown { last, ..self }
    }
}

impl Out {
    /// Prints what `read` renders, then the note it may have for standard error; with `watch`,
    /// reads again every interval and prints it again whenever it changed, until interrupted
    /// (as `kubectl get --watch`) or until a read says it is the last. On a terminal each
    /// print replaces the screen; elsewhere each is appended (a JSON or YAML document each, a
    /// table after a blank line). A failed read ends the watch with its error.
    pub(crate) async fn watch<Fut: Future<Output = anyhow::Result<Shown>>>(
        &self,
        watch: &WatchArgs,
        mut read: impl FnMut() -> Fut,
    ) -> anyhow::Result<()> {
        let first = read().await?;
        self.line(&first.text)?;
        if !watch.watch {
            if let Some(note) = first.note {
                self.note(&note);
            }
            return Ok(());
        }
        let mut last = first.text;
        let mut over = first.last;
        while !over {
            tokio::time::sleep(std::time::Duration::from_secs_f64(watch.watch_interval)).await;
            let shown = read().await?;
            over = shown.last;
            if shown.text == last {
                continue;
            }
            let text = shown.text;
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
        Ok(())
    }
}
