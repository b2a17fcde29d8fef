//! `leasehold schedules`: list, show, create (or replace), delete, pause and resume.

use anyhow::Context;
use clap::Subcommand;
use leasehold::schedules::{CatchUp, CreateSchedule, Schedule, ScheduleSpec};
use serde_json::Value;

use crate::api::Api;
use crate::out::{Out, Shown, WatchArgs, or_dash, table, time};

#[derive(Debug, Subcommand)]
pub enum ScheduleCommand {
    /// Every schedule: its cron expression, state, next tick and last task.
    List {
        #[command(flatten)]
        watch: WatchArgs,
    },
    /// One schedule.
    Show {
        /// The schedule's name.
        name: String,
    },
    /// Create a schedule; with --replace, create or replace it (operator role).
    Create {
        /// The schedule's name.
        name: String,
        /// A cron expression: 5 fields (minute first) or 6 (seconds first), e.g. "*/5 * * * *".
        #[arg(long)]
        cron: String,
        /// The data of every task it makes, as a JSON object (by default what `tasks create`
        /// sends: the bundled worker's one-second sleep, so that the local stack runs it).
        #[arg(long, default_value = crate::tasks::DEFAULT_TASK_DATA)]
        data: String,
        /// The queue its tasks go to (default: "default").
        #[arg(long)]
        queue: Option<String>,
        /// Its tasks' priority, -1000..1000, higher first (default: 0).
        #[arg(long)]
        priority: Option<i32>,
        /// Attempts each of its tasks gets (default: task-service's DEFAULT_MAX_ATTEMPTS).
        #[arg(long)]
        max_attempts: Option<i32>,
        /// The concurrency key of its tasks (held by the queue's limit per key).
        #[arg(long)]
        key: Option<String>,
        /// The IANA time zone the cron expression is read in (default: UTC).
        #[arg(long)]
        timezone: Option<String>,
        /// Ticks missed while no replica ran: one task for the latest, or none.
        #[arg(long, value_parser = ["one", "none"])]
        catch_up: Option<String>,
        /// How late a tick may be made and still count as on time (default: 60).
        #[arg(long)]
        misfire_grace_seconds: Option<i32>,
        /// Replace a schedule of that name instead of refusing.
        #[arg(long)]
        replace: bool,
    },
    /// Delete a schedule; the tasks it made stay (operator role).
    Delete {
        /// The schedule's name.
        name: String,
    },
    /// Stop a schedule making tasks (operator role).
    Pause {
        /// The schedule's name.
        name: String,
    },
    /// Let a schedule make tasks again, from its next tick (operator role).
    Resume {
        /// The schedule's name.
        name: String,
    },
}

pub(crate) async fn schedules(
    api: &Api,
    out: &Out,
    command: ScheduleCommand,
) -> anyhow::Result<()> {
    let client = &api.tasks;
    let path = |name: &str, action: &str| format!("/api/schedules/{name}{action}");
    let schedule = match command {
        ScheduleCommand::List { watch } => {
            return out
                .watch(&watch, || async {
                    let listed = client
                        .schedules()
                        .await
                        .map_err(api.tasks_failed("GET", "/api/schedules"))?;
                    let text =
                        out.render(&listed, |listed| Ok(schedule_table(&listed.schedules)))?;
                    Ok(Shown::new(text))
                })
                .await;
        }
        ScheduleCommand::Show { name } => client
            .schedule(&name)
            .await
            .map_err(api.tasks_failed("GET", &path(&name, "")))?,
        ScheduleCommand::Create {
            name,
            cron,
            data,
            queue,
            priority,
            max_attempts,
            key,
            timezone,
            catch_up,
            misfire_grace_seconds,
            replace,
        } => {
            let task_data: Value =
                serde_json::from_str(&data).context("--data is not valid JSON")?;
            let catch_up = catch_up
                .map(|c| c.parse::<CatchUp>())
                .transpose()
                .map_err(anyhow::Error::msg)?;
            let spec = ScheduleSpec {
                cron,
                task_data,
                queue,
                priority,
                max_attempts,
                concurrency_key: key,
                timezone,
                catch_up,
                misfire_grace_seconds,
            };
            if replace {
                client
                    .put_schedule(&name, &spec)
                    .await
                    .map_err(api.tasks_failed("PUT", &path(&name, "")))?
            } else {
                client
                    .create_schedule(&CreateSchedule { name, spec })
                    .await
                    .map_err(api.tasks_failed("POST", "/api/schedules"))?
            }
        }
        ScheduleCommand::Delete { name } => client
            .delete_schedule(&name)
            .await
            .map_err(api.tasks_failed("DELETE", &path(&name, "")))?,
        ScheduleCommand::Pause { name } => client
            .set_schedule_paused(&name, true)
            .await
            .map_err(api.tasks_failed("POST", &path(&name, "/pause")))?,
        ScheduleCommand::Resume { name } => client
            .set_schedule_paused(&name, false)
            .await
            .map_err(api.tasks_failed("POST", &path(&name, "/resume")))?,
    };
    out.value(&schedule, |schedule| {
        Ok(schedule_table(std::slice::from_ref(schedule)))
    })
}

fn schedule_table(schedules: &[Schedule]) -> String {
    let rows: Vec<Vec<String>> = schedules
        .iter()
        .map(|s| {
            vec![
                s.name.clone(),
                s.cron.clone(),
                s.timezone.clone(),
                s.queue.clone(),
                if s.paused { "paused" } else { "running" }.to_owned(),
                or_dash(s.next_tick_at.as_ref().map(time)),
                or_dash(s.last_tick_at.as_ref().map(time)),
                or_dash(s.last_task_id.map(|id| id.to_string())),
            ]
        })
        .collect();
    table(
        &[
            "NAME",
            "CRON",
            "ZONE",
            "QUEUE",
            "STATE",
            "NEXT TICK",
            "LAST TICK",
            "LAST TASK",
        ],
        &rows,
    )
}
