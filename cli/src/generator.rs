//! `leasehold generator`: status, start and stop.

use clap::Subcommand;
use leasehold::generator::StartGenerator;

use crate::api::Api;
use crate::out::{Out, generator_table};

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
    let client = &api.tasks;
    match command {
        GeneratorCommand::Status => {}
        GeneratorCommand::Start {
            rate,
            min_sleep,
            max_sleep,
        } => {
            let change = StartGenerator {
                rate_per_second: rate,
                min_sleep_seconds: min_sleep,
                max_sleep_seconds: max_sleep,
            };
            client
                .start_generator(&change)
                .await
                .map_err(api.tasks_failed("POST", "/api/generator/start"))?;
        }
        GeneratorCommand::Stop => {
            client
                .stop_generator()
                .await
                .map_err(api.tasks_failed("POST", "/api/generator/stop"))?;
        }
    }
    // Read afresh after a change: the leader may have moved meanwhile.
    let status = client
        .generator_status()
        .await
        .map_err(api.tasks_failed("GET", "/api/generator/status"))?;
    out.value(&status, |status| Ok(generator_table(status)))
}
