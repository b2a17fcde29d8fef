//! Wire types of periodic tasks (`/api/schedules`, served by task-service): a schedule makes
//! one task per tick of its cron expression, by the database's clock, whatever the number of
//! task-service replicas.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub use crate::schema::MAX_SCHEDULE_NAME_CHARS;

/// What happens to ticks that no replica reached in time (every replica was down, or the
/// schedule's replica could not reach the database, for longer than the misfire grace).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CatchUp {
    /// All the missed ticks together make one task, for the latest of them (as a Kubernetes
    /// CronJob without a starting deadline runs its last missed schedule once).
    #[default]
    One,
    /// Missed ticks make no task; the schedule goes on from the next tick.
    None,
}

impl CatchUp {
    pub fn as_str(self) -> &'static str {
        match self {
            CatchUp::One => "one",
            CatchUp::None => "none",
        }
    }
}

impl std::str::FromStr for CatchUp {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "one" => Ok(CatchUp::One),
            "none" => Ok(CatchUp::None),
            other => Err(format!(
                "catch_up must be \"one\" or \"none\", got {other:?}"
            )),
        }
    }
}

/// A `catch_up` read from task-service's schedules table. A word this enum does not know is an
/// error, never a guess: the column's CHECK constraint allows only these two.
#[cfg(feature = "server")]
impl diesel::deserialize::FromSql<diesel::sql_types::Text, diesel::pg::Pg> for CatchUp {
    fn from_sql(value: diesel::pg::PgValue<'_>) -> diesel::deserialize::Result<Self> {
        crate::closed_set::from_sql(value, "catch_up", |text| text.parse().ok())
    }
}

/// `PUT /api/schedules/{name}` (the whole definition, replacing any before), and, with its
/// name, `POST /api/schedules` ([`CreateSchedule`]). A field it does not take (a task's
/// `idempotency_key` or `scheduled_at`, a typo) is refused, not dropped: the schedule would
/// not do what its author wrote.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleSpec {
    /// A cron expression of 5 fields (minute, hour, day of month, month, day of week) or 6
    /// (seconds first).
    pub cron: String,
    /// The `task_data` of every task the schedule makes: a JSON object.
    pub task_data: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "crate::integers::optional")]
    pub priority: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "crate::integers::optional")]
    pub max_attempts: Option<i32>,
    /// The `concurrency_key` of every task the schedule makes (see the queue's
    /// `key_concurrency_limit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<String>,
    /// An IANA time zone (`Europe/Paris`) the cron expression is read in; UTC when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catch_up: Option<CatchUp>,
    /// How late a tick may be made and still count as on time (default 60): a tick found later
    /// than this is missed, and `catch_up` says what becomes of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "crate::integers::optional")]
    pub misfire_grace_seconds: Option<i32>,
}

/// `POST /api/schedules`: a new schedule (409 `schedule_exists` if the name is taken).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CreateSchedule {
    pub name: String,
    #[serde(flatten)]
    pub spec: ScheduleSpec,
}

/// The body of `PUT /api/schedules/{name}` as task-service reads it: the definition, and the
/// name if the body states one too, which must then be the path's (a body naming another
/// schedule is refused rather than written under the path's name).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplaceSchedule {
    pub name: Option<String>,
    pub spec: ScheduleSpec,
}

/// The schema of a definition with its name beside it, one object: what [`named_spec`] reads.
/// (A `ScheduleSpec` flattened beside `name` would be an `allOf` whose first part refuses the
/// name as an unknown field.)
fn named_spec_schema(
    name_required: bool,
) -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    use utoipa::openapi::RefOr;
    use utoipa::openapi::schema::{Object, ObjectBuilder, Schema, Type};
    let mut spec = match <ScheduleSpec as utoipa::PartialSchema>::schema() {
        RefOr::T(Schema::Object(object)) => object,
        _ => Object::new(),
    };
    let name = ObjectBuilder::new()
        .schema_type(Type::String)
        .description(Some(if name_required {
            "The schedule's name, unique"
        } else {
            "When given, the path's name"
        }))
        .build();
    spec.properties
        .insert("name".to_owned(), RefOr::T(Schema::Object(name)));
    if name_required {
        spec.required.insert(0, "name".to_owned());
    }
    RefOr::T(Schema::Object(spec))
}

/// Each body's schema: [`named_spec_schema`], whose parts are [`ScheduleSpec`]'s.
macro_rules! named_spec_schema {
    ($body:ty, $name_required:expr) => {
        impl utoipa::PartialSchema for $body {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                named_spec_schema($name_required)
            }
        }

        impl utoipa::ToSchema for $body {
            fn schemas(
                schemas: &mut Vec<(
                    String,
                    utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
                )>,
            ) {
                <ScheduleSpec as utoipa::ToSchema>::schemas(schemas);
            }
        }
    };
}

named_spec_schema!(CreateSchedule, true);
named_spec_schema!(ReplaceSchedule, false);

/// A definition beside its name: serde cannot refuse unknown fields through `flatten`, so the
/// name is taken out first and the rest must be exactly a [`ScheduleSpec`].
fn named_spec<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<(Option<String>, ScheduleSpec), D::Error> {
    use serde::de::Error as _;
    let mut fields = serde_json::Map::deserialize(deserializer)?;
    let name = fields
        .remove("name")
        .map(String::deserialize)
        .transpose()
        .map_err(D::Error::custom)?;
    let spec =
        ScheduleSpec::deserialize(serde_json::Value::Object(fields)).map_err(D::Error::custom)?;
    Ok((name, spec))
}

impl<'de> Deserialize<'de> for CreateSchedule {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let (name, spec) = named_spec(deserializer)?;
        let name = name.ok_or_else(|| serde::de::Error::missing_field("name"))?;
        Ok(CreateSchedule { name, spec })
    }
}

impl<'de> Deserialize<'de> for ReplaceSchedule {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let (name, spec) = named_spec(deserializer)?;
        Ok(ReplaceSchedule { name, spec })
    }
}

/// A schedule as task-service has it (an answer, so camelCase like every other).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Schedule {
    pub name: String,
    pub cron: String,
    pub timezone: String,
    pub task_data: serde_json::Value,
    pub queue: String,
    #[serde(deserialize_with = "crate::integers::integer")]
    pub priority: i32,
    #[serde(deserialize_with = "crate::integers::integer")]
    pub max_attempts: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<String>,
    pub catch_up: CatchUp,
    #[serde(deserialize_with = "crate::integers::integer")]
    pub misfire_grace_seconds: i32,
    /// A paused schedule makes no tasks; on resume it goes on from the next tick after the
    /// resume (the ticks while paused are not missed, they were not wanted).
    pub paused: bool,
    /// The next tick the schedule will make a task for (none while paused).
    pub next_tick_at: Option<DateTime<Utc>>,
    /// The latest tick that made a task, and that task.
    pub last_tick_at: Option<DateTime<Utc>>,
    #[serde(default, deserialize_with = "crate::integers::optional")]
    pub last_task_id: Option<i64>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// `GET /api/schedules`: every schedule, by name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Schedules {
    pub schedules: Vec<Schedule>,
}

/// The idempotency key of the task a schedule's tick makes: no tick makes two tasks, even if
/// two replicas somehow made the same tick (the key is unique in the tasks table).
pub fn tick_key(name: &str, tick: DateTime<Utc>) -> String {
    format!(
        "schedule:{name}:{}",
        tick.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_create_is_the_name_beside_the_spec() {
        let create: CreateSchedule = serde_json::from_str(
            r#"{"name":"nightly","cron":"0 3 * * *","task_data":{},"catch_up":"none"}"#,
        )
        .unwrap();
        assert_eq!(create.name, "nightly");
        assert_eq!(create.spec.cron, "0 3 * * *");
        assert_eq!(create.spec.catch_up, Some(CatchUp::None));
    }

    #[test]
    fn a_definition_refuses_fields_it_does_not_take() {
        for body in [
            r#"{"name":"n","cron":"* * * * *","task_data":{},"idempotency_key":"k"}"#,
            r#"{"name":"n","cron":"* * * * *","task_data":{},"scheduled_at":"2026-01-01T00:00:00Z"}"#,
            r#"{"name":"n","cron":"* * * * *","task_data":{},"extra":1}"#,
        ] {
            let err = serde_json::from_str::<CreateSchedule>(body).unwrap_err();
            assert!(err.to_string().contains("unknown field"), "{body}: {err}");
            let err = serde_json::from_str::<ReplaceSchedule>(body).unwrap_err();
            assert!(err.to_string().contains("unknown field"), "{body}: {err}");
        }
        let err = serde_json::from_str::<CreateSchedule>(r#"{"cron":"* * * * *","task_data":{}}"#)
            .unwrap_err();
        assert!(err.to_string().contains("missing field `name`"), "{err}");
        let replace: ReplaceSchedule =
            serde_json::from_str(r#"{"name":"b","cron":"* * * * *","task_data":{}}"#).unwrap();
        assert_eq!(replace.name.as_deref(), Some("b"));
    }

    #[test]
    fn tick_keys_name_the_schedule_and_the_instant() {
        let tick = DateTime::parse_from_rfc3339("2026-11-25T03:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(
            tick_key("nightly", tick),
            "schedule:nightly:2026-11-25T03:00:00.000Z"
        );
    }
}
