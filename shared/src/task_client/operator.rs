//! The calls of producers and operators: create a task, read one, list a page, count by queue
//! and status, cancel, retry a dead task, read or change the generator's desired state, read,
//! pause or resume queues, and manage schedules.
//! The generator creates through here with its `generator_fence`; the command line uses all of
//! it.

use std::collections::BTreeMap;

use super::{CallError, TaskClient};
use crate::generator::{GeneratorSettings, GeneratorStatus, StartGenerator};
use crate::percent;
use crate::queues::{QueueSettings, QueueState, Queues};
use crate::schedules::{CreateSchedule, Schedule, ScheduleSpec, Schedules};
use crate::tasks::{
    BulkResult, BulkTasks, CreateResult, CreateTask, CreateTasks, CreatedTasks, OneTask, Task,
    TaskPage,
};
use crate::workers::Workers;

/// A bulk operation by filter ([`TaskClient::bulk`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bulk {
    /// Dead (or cancelled) tasks back to pending with fresh attempts.
    Retry,
    /// Pending tasks cancelled at once, running ones at their next heartbeat.
    Cancel,
    /// Finished tasks deleted.
    Delete,
}

impl Bulk {
    pub fn path(self) -> &'static str {
        match self {
            Bulk::Retry => "/api/tasks/retry",
            Bulk::Cancel => "/api/tasks/cancel",
            Bulk::Delete => "/api/tasks/delete",
        }
    }
}

/// What `POST /api/tasks` did with a create.
#[derive(Debug, Clone, PartialEq)]
pub enum Created {
    /// A new task (201).
    New(Task),
    /// The task an earlier create with the same idempotency key made (200): a retry whose first
    /// answer was lost.
    Existing(Task),
}

impl Created {
    pub fn task(&self) -> &Task {
        match self {
            Self::New(task) | Self::Existing(task) => task,
        }
    }

    pub fn into_task(self) -> Task {
        match self {
            Self::New(task) | Self::Existing(task) => task,
        }
    }
}

/// Where callers found it before it moved to the API types.
pub use crate::tasks::TaskCounts;

/// Which page of `GET /api/tasks` to read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskListing {
    /// Comma-separated statuses; all when `None`.
    pub status: Option<String>,
    pub queue: Option<String>,
    /// At most this many rows (the service's default when `None`).
    pub limit: Option<u32>,
    /// Go on from an earlier page's `nextCursor`.
    pub cursor: Option<String>,
    /// Newest first; oldest first when `false`.
    pub newest_first: bool,
    /// Only tasks last claimed by this processor.
    pub processor: Option<String>,
    /// Only tasks with this concurrency key.
    pub key: Option<String>,
    /// Only tasks created at or after this instant.
    pub created_after: Option<chrono::DateTime<chrono::Utc>>,
    /// Only tasks created before this instant.
    pub created_before: Option<chrono::DateTime<chrono::Utc>>,
}

/// Which page of `GET /api/queues` to read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueListing {
    /// At most this many queues (the service's default when `None`).
    pub limit: Option<u32>,
    /// Go on from an earlier page's `nextCursor`.
    pub cursor: Option<String>,
    /// By name from the end of the alphabet; from its start when `false`.
    pub descending: bool,
}

impl TaskListing {
    /// The query string, as task-service's listings read it.
    fn query(&self) -> Vec<(&'static str, String)> {
        let instant = |at: &Option<chrono::DateTime<chrono::Utc>>| {
            at.map(|at| at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true))
        };
        crate::api::page_query(
            self.limit,
            self.cursor.as_deref(),
            self.newest_first,
            [
                ("status", &self.status),
                ("queue", &self.queue),
                ("processor", &self.processor),
                ("key", &self.key),
                ("created_after", &instant(&self.created_after)),
                ("created_before", &instant(&self.created_before)),
            ],
        )
    }
}

impl TaskClient {
    /// `POST /api/tasks`. A create with an idempotency key may be repeated safely; task-service
    /// refuses one with a `generator_fence` that no longer holds the generator's lease (409)
    /// and any generator create once the generator is stopped (409 `generator_stopped`).
    pub async fn create(&self, task: &CreateTask) -> Result<Created, CallError> {
        let answer = self
            .send(reqwest::Method::POST, "/api/tasks", &[], Some(task))
            .await?;
        let created: Task = answer.read("a create")?;
        Ok(if answer.status == reqwest::StatusCode::CREATED {
            Created::New(created)
        } else {
            Created::Existing(created)
        })
    }

    /// `GET /api/tasks/{id}`.
    pub async fn task(&self, id: i64) -> Result<Task, CallError> {
        let answer: OneTask = self
            .send(
                reqwest::Method::GET,
                &format!("/api/tasks/{id}"),
                &[],
                None::<&()>,
            )
            .await?
            .read("a task's read")?;
        Ok(answer.task)
    }

    /// `POST /api/tasks/batch`: up to [`crate::tasks::MAX_CREATE_BATCH`] creates in one
    /// statement and one commit; one result per create, in order (each with its own status:
    /// 201 new, 200 a repeated idempotency key, or its refusal). Safe to repeat when every
    /// create carries an idempotency key.
    pub async fn create_many(&self, tasks: &[CreateTask]) -> Result<Vec<CreateResult>, CallError> {
        let body = CreateTasks {
            tasks: tasks.to_vec(),
        };
        let answer: CreatedTasks = self
            .send(reqwest::Method::POST, "/api/tasks/batch", &[], Some(&body))
            .await?
            .read("a batch create")?;
        Ok(answer.results)
    }

    /// `GET /api/tasks`: one page of the listing.
    pub async fn list(&self, listing: &TaskListing) -> Result<TaskPage, CallError> {
        self.send(
            reqwest::Method::GET,
            "/api/tasks",
            &listing.query(),
            None::<&()>,
        )
        .await?
        .read("a listing")
    }

    /// `GET /api/tasks/counts`: the first page of queues, and the total over every queue.
    pub async fn counts(&self) -> Result<TaskCounts, CallError> {
        self.counts_page(None).await
    }

    /// `GET /api/tasks/counts?cursor=`: the page of queues after `cursor` (a previous page's
    /// `next_cursor`), and the total over every queue.
    pub async fn counts_page(&self, cursor: Option<&str>) -> Result<TaskCounts, CallError> {
        let query: Vec<(&str, String)> = cursor
            .map(|cursor| ("cursor", cursor.to_owned()))
            .into_iter()
            .collect();
        self.send(
            reqwest::Method::GET,
            "/api/tasks/counts",
            &query,
            None::<&()>,
        )
        .await?
        .read("the counts")
    }

    /// `GET /api/tasks/counts?queue=`: one queue's counts (zeros for a queue with no task).
    pub async fn queue_counts(&self, queue: &str) -> Result<BTreeMap<String, i64>, CallError> {
        let query = [("queue", queue.to_owned())];
        let counts: TaskCounts = self
            .send(
                reqwest::Method::GET,
                "/api/tasks/counts",
                &query,
                None::<&()>,
            )
            .await?
            .read("the counts")?;
        Ok(counts.total)
    }

    /// `POST /api/tasks/{id}/cancel`: a pending task ends now, a running one at its next
    /// heartbeat.
    pub async fn cancel(&self, id: i64) -> Result<Task, CallError> {
        let path = format!("/api/tasks/{id}/cancel");
        self.send(reqwest::Method::POST, &path, &[], None::<&()>)
            .await?
            .read("a cancel")
    }

    /// `POST /api/tasks/{id}/retry`: a dead task goes back to its queue with fresh attempts.
    pub async fn retry(&self, id: i64) -> Result<Task, CallError> {
        let path = format!("/api/tasks/{id}/retry");
        self.send(reqwest::Method::POST, &path, &[], None::<&()>)
            .await?
            .read("a retry")
    }

    /// `POST /api/tasks/retry`, `/cancel` or `/delete`: up to the filter's limit of matching
    /// tasks, in one call; repeat until it touches none.
    pub async fn bulk(&self, operation: Bulk, filter: &BulkTasks) -> Result<BulkResult, CallError> {
        self.send(reqwest::Method::POST, operation.path(), &[], Some(filter))
            .await?
            .read("a bulk operation")
    }

    /// `GET /api/generator/status`: desired state, leader and production so far.
    pub async fn generator_status(&self) -> Result<GeneratorStatus, CallError> {
        self.send(
            reqwest::Method::GET,
            "/api/generator/status",
            &[],
            None::<&()>,
        )
        .await?
        .read("the generator's status")
    }

    /// `GET /api/generator/settings`: the desired state alone, what generator replicas poll.
    pub async fn generator_settings(&self) -> Result<GeneratorSettings, CallError> {
        self.send(
            reqwest::Method::GET,
            "/api/generator/settings",
            &[],
            None::<&()>,
        )
        .await?
        .read("the generator's settings")
    }

    /// `POST /api/generator/start`, changing the settings `change` names.
    pub async fn start_generator(
        &self,
        change: &StartGenerator,
    ) -> Result<GeneratorStatus, CallError> {
        self.send(
            reqwest::Method::POST,
            "/api/generator/start",
            &[],
            Some(change),
        )
        .await?
        .read("a generator start")
    }

    /// `POST /api/generator/stop`.
    pub async fn stop_generator(&self) -> Result<GeneratorStatus, CallError> {
        let nothing = serde_json::Map::new();
        self.send(
            reqwest::Method::POST,
            "/api/generator/stop",
            &[],
            Some(&nothing),
        )
        .await?
        .read("a generator stop")
    }

    /// `GET /api/workers`: the worker processes, live and gone.
    pub async fn workers(&self) -> Result<Workers, CallError> {
        self.send(reqwest::Method::GET, "/api/workers", &[], None::<&()>)
            .await?
            .read("the workers")
    }

    /// `GET /api/queues`: one page of the queues with tasks or settings, by name.
    pub async fn queues(&self, listing: &QueueListing) -> Result<Queues, CallError> {
        let query = crate::api::page_query(
            listing.limit,
            listing.cursor.as_deref(),
            listing.descending,
            [],
        );
        self.send(reqwest::Method::GET, "/api/queues", &query, None::<&()>)
            .await?
            .read("the queues")
    }

    /// `GET /api/queues/{queue}`.
    pub async fn queue(&self, queue: &str) -> Result<QueueState, CallError> {
        let path = format!("/api/queues/{}", percent::encode(queue));
        self.send(reqwest::Method::GET, &path, &[], None::<&()>)
            .await?
            .read("a queue")
    }

    /// `POST /api/queues/{queue}/pause` (`paused`) or `/resume`: the queue's state after.
    pub async fn set_queue_paused(
        &self,
        queue: &str,
        paused: bool,
    ) -> Result<QueueState, CallError> {
        let action = if paused { "pause" } else { "resume" };
        let path = format!("/api/queues/{}/{action}", percent::encode(queue));
        self.send(reqwest::Method::POST, &path, &[], None::<&()>)
            .await?
            .read("a queue's pause or resume")
    }

    /// `PUT /api/queues/{queue}`: sets the queue's limits (one left out is lifted).
    pub async fn set_queue_limits(
        &self,
        queue: &str,
        settings: &QueueSettings,
    ) -> Result<QueueState, CallError> {
        let path = format!("/api/queues/{}", percent::encode(queue));
        self.send(reqwest::Method::PUT, &path, &[], Some(settings))
            .await?
            .read("a queue's limits")
    }

    /// `GET /api/schedules`.
    pub async fn schedules(&self) -> Result<Schedules, CallError> {
        self.send(reqwest::Method::GET, "/api/schedules", &[], None::<&()>)
            .await?
            .read("the schedules")
    }

    /// `GET /api/schedules/{name}`.
    pub async fn schedule(&self, name: &str) -> Result<Schedule, CallError> {
        self.send(
            reqwest::Method::GET,
            &schedule_path(name, ""),
            &[],
            None::<&()>,
        )
        .await?
        .read("a schedule")
    }

    /// `POST /api/schedules`: refused with `schedule_exists` if the name is taken.
    pub async fn create_schedule(&self, request: &CreateSchedule) -> Result<Schedule, CallError> {
        self.send(reqwest::Method::POST, "/api/schedules", &[], Some(request))
            .await?
            .read("a schedule create")
    }

    /// `PUT /api/schedules/{name}`: creates or replaces it.
    pub async fn put_schedule(
        &self,
        name: &str,
        spec: &ScheduleSpec,
    ) -> Result<Schedule, CallError> {
        self.send(
            reqwest::Method::PUT,
            &schedule_path(name, ""),
            &[],
            Some(spec),
        )
        .await?
        .read("a schedule replace")
    }

    /// `DELETE /api/schedules/{name}`: the schedule as it was.
    pub async fn delete_schedule(&self, name: &str) -> Result<Schedule, CallError> {
        self.send(
            reqwest::Method::DELETE,
            &schedule_path(name, ""),
            &[],
            None::<&()>,
        )
        .await?
        .read("a schedule delete")
    }

    /// `POST /api/schedules/{name}/pause` (`paused`) or `/resume`: the schedule after.
    pub async fn set_schedule_paused(
        &self,
        name: &str,
        paused: bool,
    ) -> Result<Schedule, CallError> {
        let action = if paused { "/pause" } else { "/resume" };
        self.send(
            reqwest::Method::POST,
            &schedule_path(name, action),
            &[],
            None::<&()>,
        )
        .await?
        .read("a schedule's pause or resume")
    }
}

fn schedule_path(name: &str, action: &str) -> String {
    format!("/api/schedules/{}{action}", percent::encode(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_asks_only_for_what_it_names() {
        assert!(TaskListing::default().query().is_empty());
        let listing = TaskListing {
            status: Some("pending,dead".to_owned()),
            queue: None,
            limit: Some(5),
            cursor: Some("42".to_owned()),
            newest_first: true,
            ..TaskListing::default()
        };
        let query = listing.query();
        let query: Vec<(&str, &str)> = query
            .iter()
            .map(|(name, value)| (*name, value.as_str()))
            .collect();
        assert_eq!(
            query,
            [
                ("order", "desc"),
                ("limit", "5"),
                ("cursor", "42"),
                ("status", "pending,dead")
            ]
        );
    }

    #[test]
    fn counts_read_as_task_service_writes_them() {
        let counts: TaskCounts = serde_json::from_str(
            r#"{"queues":{"cli":{"pending":1,"running":0}},"total":{"pending":1,"running":0}}"#,
        )
        .expect("counts");
        assert_eq!(counts.queues["cli"]["pending"], 1);
        assert_eq!(counts.total["running"], 0);
    }
}
