//! `--watch`: one loop for every read command.

use super::{Format, Out};

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

impl Out {
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
}
