//! `leasehold`, the operators' command line: leases (list, show, acquire, renew, release,
//! revoke), tasks (create, list, show, cancel, retry, delete, tail), the generator (status,
//! start, stop), queues (list, show, pause, resume, limit), schedules (list, show, create,
//! delete, pause, resume) and worker processes (list), against lease-service and task-service
//! over their HTTP APIs.
//!
//! Every command prints a human table by default and the services' own JSON with `--json`, so
//! scripts read exactly what the API says. Commands that wait on work (`tasks create --wait`,
//! `tasks tail`) show a live count on standard error while standard output stays clean.
//!
//! Layout: one module per command group, as in tokio mini-redis's `src/cmd/`: `leases`,
//! `tasks`, `generator`, `queues`, `schedules` and `workers` each hold their clap subcommand
//! and the code that runs it (`leases` and `tasks`, the larger, one module per operation);
//! `api` holds the two services' clients (`leasehold::LeaseClient` and `leasehold::TaskClient`,
//! the typed clients every caller shares) and how a failed request is reported, `out` the
//! output (JSON, tables, progress). This file holds the top-level command line and `run`.

mod api;
mod generator;
mod leases;
mod out;
mod queues;
mod schedules;
mod tasks;
mod workers;

use clap::{Parser, Subcommand};

use crate::api::Api;
pub use crate::out::Format;
use crate::out::Out;

pub use api::{EXIT_CODES, Exit};
pub use generator::GeneratorCommand;
pub use leases::{LeaseCommand, ProofArgs};
pub use out::{lease_table, table};
pub use queues::QueueCommand;
pub use schedules::ScheduleCommand;
pub use tasks::{DEFAULT_TASK_DATA, TaskCommand};
pub use workers::WorkerCommand;

/// Operate Leasehold: leases, tasks, queues, schedules and the task generator.
#[derive(Debug, Parser)]
#[command(name = "leasehold", version, after_help = EXIT_CODES)]
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
    /// How to print what is read: table, wide (more columns), json (the services' own JSON)
    /// or yaml.
    #[arg(short = 'o', long, value_enum, default_value_t, global = true)]
    pub output: Format,
    /// Print the services' JSON: the same as `-o json`.
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
    /// Task queues: pause, resume, and their state.
    #[command(subcommand)]
    Queues(QueueCommand),
    /// Periodic tasks: one task per tick of a cron expression.
    #[command(subcommand)]
    Schedules(ScheduleCommand),
    /// Worker processes, live and gone.
    #[command(subcommand)]
    Workers(WorkerCommand),
    /// Print a shell completion script: `source <(leasehold completion bash)`.
    Completion {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
}

/// Runs one command.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    if let Command::Completion { shell } = cli.command {
        use clap::CommandFactory;
        let mut command = Cli::command();
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut command, "leasehold", &mut script);
        return Out::new(Format::Table).line(String::from_utf8_lossy(&script).trim_end());
    }
    let api = Api::new(&cli);
    let out = Out::new(if cli.json { Format::Json } else { cli.output });
    match cli.command {
        Command::Leases(command) => leases::leases(&api, &out, command).await,
        Command::Tasks(command) => tasks::tasks(&api, &out, command).await,
        Command::Generator(command) => generator::generator(&api, &out, command).await,
        Command::Queues(command) => queues::queues(&api, &out, command).await,
        Command::Schedules(command) => schedules::schedules(&api, &out, command).await,
        Command::Workers(command) => workers::workers(&api, &out, command).await,
        Command::Completion { .. } => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            vec!["leasehold", "queues", "pause", "mail"],
            vec!["leasehold", "queues", "list", "--json"],
            vec!["leasehold", "queues", "limit", "mail", "--concurrency", "3"],
            vec![
                "leasehold",
                "schedules",
                "create",
                "nightly",
                "--cron",
                "0 3 * * *",
            ],
            vec!["leasehold", "schedules", "pause", "nightly"],
            vec!["leasehold", "completion", "zsh"],
            vec!["leasehold", "workers", "list", "-o", "wide", "--watch"],
            vec!["leasehold", "tasks", "list", "-o", "yaml", "--all"],
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
}
