//! `leasehold generator`: status, start and stop.

use clap::Subcommand;
use serde_json::json;

use crate::api::Api;
use crate::out::{Out, generator_table, typed};

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

pub(crate) async fn generator(
    api: &Api,
    out: &Out,
    command: GeneratorCommand,
) -> anyhow::Result<()> {
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
