//! When a schedule ticks: its cron expression read in its time zone, and which ticks a round
//! of the ticker makes tasks for. Pure functions of the times the database gave, so they are
//! tested here without a clock.

use chrono::{DateTime, TimeDelta, Timelike, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use leasehold::ErrorCode;
use leasehold::schedules::CatchUp;
use leasehold::server::{ApiError, validate_name_within};

/// Longest cron expression accepted, in bytes.
const MAX_CRON_CHARS: usize = 200;

/// Most on-time ticks one schedule makes tasks for in one round; the rest wait for the next
/// round, which starts at once (a one-second schedule with an hour's grace could owe 3,600).
pub const MAX_TICKS_PER_ROUND: usize = 500;

/// Most missed ticks counted one by one for `schedule_ticks_total`; a longer outage counts this
/// many, so that a year-old one-second schedule does not cost a round millions of steps.
const MAX_COUNTED_MISSES: u64 = 10_000;

/// A cron expression and the time zone it is read in.
#[derive(Debug, Clone)]
pub struct Cadence {
    cron: Cron,
    zone: Tz,
}

impl Cadence {
    /// Parses a 5-field (minute first) or 6-field (seconds first) expression and an IANA zone.
    /// An expression that never fires (`0 0 30 2 *`) is refused like a malformed one.
    pub fn parse(cron: &str, timezone: &str) -> Result<Cadence, ApiError> {
        validate_name_within("cron", cron, MAX_CRON_CHARS)?;
        let zone: Tz = timezone.parse().map_err(|_| {
            ApiError::invalid(
                ErrorCode::InvalidTimezone,
                "timezone",
                format!("unknown time zone {timezone:?} (an IANA name such as \"Europe/Paris\")"),
            )
        })?;
        let parsed = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(cron)
            .map_err(|err| invalid_cron(cron, &err.to_string()))?;
        let cadence = Cadence { cron: parsed, zone };
        let epoch = DateTime::<Utc>::UNIX_EPOCH;
        if cadence.after(epoch).is_none() {
            return Err(invalid_cron(cron, "it never fires"));
        }
        Ok(cadence)
    }

    /// The first tick strictly after `at`.
    pub fn after(&self, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.find(at, false, true)
    }

    fn find(&self, at: DateTime<Utc>, inclusive: bool, forward: bool) -> Option<DateTime<Utc>> {
        let local = at.with_timezone(&self.zone);
        let found = if forward {
            self.cron.find_next_occurrence(&local, inclusive)
        } else {
            self.cron.find_previous_occurrence(&local, inclusive)
        };
        found.ok().map(|t| t.with_timezone(&Utc))
    }

    /// What a round at `now` does for a schedule due at `next_tick`: ticks late by more than
    /// `grace` are missed (one task for the latest of them, or none, as `catch_up` says); the
    /// others each make a task, at most [`MAX_TICKS_PER_ROUND`]; and the schedule's next tick.
    pub fn plan(
        &self,
        next_tick: DateTime<Utc>,
        now: DateTime<Utc>,
        grace: TimeDelta,
        catch_up: CatchUp,
    ) -> Plan {
        let cutoff = now - grace;
        let mut plan = Plan {
            on_time: Vec::new(),
            caught_up: None,
            skipped: 0,
            next: None,
        };
        let mut tick = Some(next_tick);
        if next_tick < cutoff {
            let mut missed = 0u64;
            let mut latest = next_tick;
            let mut t = Some(next_tick);
            while let Some(at) = t.filter(|at| *at < cutoff) {
                missed += 1;
                latest = at;
                if missed == MAX_COUNTED_MISSES {
                    // Too many to walk: the latest is the last tick before the cutoff. (Ticks
                    // fall on whole seconds, and the search ignores fractions of one.)
                    latest = self
                        .find(ceil_second(cutoff), false, false)
                        .unwrap_or(at)
                        .max(at);
                    break;
                }
                t = self.after(at);
            }
            match catch_up {
                CatchUp::One => {
                    plan.caught_up = Some(latest);
                    plan.skipped = missed - 1;
                }
                CatchUp::None => plan.skipped = missed,
            }
            tick = self.after(latest);
        }
        while let Some(at) = tick.filter(|at| *at <= now) {
            if plan.on_time.len() == MAX_TICKS_PER_ROUND {
                break;
            }
            plan.on_time.push(at);
            tick = self.after(at);
        }
        plan.next = tick;
        plan
    }
}

/// `at` rounded up to a whole second.
fn ceil_second(at: DateTime<Utc>) -> DateTime<Utc> {
    let floor = at.with_nanosecond(0).unwrap_or(at);
    if floor == at {
        at
    } else {
        floor + TimeDelta::seconds(1)
    }
}

fn invalid_cron(cron: &str, why: &str) -> ApiError {
    ApiError::invalid(
        ErrorCode::InvalidCron,
        "cron",
        format!(
            "invalid cron expression {cron:?}: {why} (5 fields, minute first, or 6, seconds first)"
        ),
    )
}

/// The ticks one round makes tasks for, and where the schedule goes on from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Ticks found within the grace: one task each, in order.
    pub on_time: Vec<DateTime<Utc>>,
    /// The latest missed tick, which makes the one catch-up task (`catch_up: "one"`).
    pub caught_up: Option<DateTime<Utc>>,
    /// Missed ticks that make no task.
    pub skipped: u64,
    /// The schedule's next tick; none if the expression never fires again.
    pub next: Option<DateTime<Utc>>,
}

impl Plan {
    /// Every tick that makes a task, oldest first.
    pub fn ticks(&self) -> impl Iterator<Item = DateTime<Utc>> + '_ {
        self.caught_up
            .iter()
            .copied()
            .chain(self.on_time.iter().copied())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn code(cron: &str, zone: &str) -> Result<(), ErrorCode> {
        Cadence::parse(cron, zone).map(drop).map_err(|e| e.code())
    }

    #[test]
    fn five_and_six_fields_are_read_and_nonsense_is_refused() {
        assert_eq!(code("*/5 * * * *", "UTC"), Ok(()));
        assert_eq!(code("*/10 * * * * *", "UTC"), Ok(()));
        assert_eq!(code("0 3 * * MON-FRI", "Europe/Paris"), Ok(()));
        assert_eq!(code("61 * * * *", "UTC"), Err(ErrorCode::InvalidCron));
        assert_eq!(code("* * *", "UTC"), Err(ErrorCode::InvalidCron));
        assert_eq!(
            code("0 0 30 2 *", "UTC"),
            Err(ErrorCode::InvalidCron),
            "never fires"
        );
        assert_eq!(
            code("0 0 * * * * 2030", "UTC"),
            Err(ErrorCode::InvalidCron),
            "no years"
        );
        assert_eq!(code("", "UTC"), Err(ErrorCode::InvalidField));
        assert_eq!(
            code("* * * * *", "Mars/Olympus_Mons"),
            Err(ErrorCode::InvalidTimezone)
        );
    }

    #[test]
    fn the_zone_decides_when_a_daily_tick_falls() {
        let paris = Cadence::parse("0 3 * * *", "Europe/Paris").unwrap();
        // 03:00 in Paris is 02:00 UTC in winter.
        assert_eq!(
            paris.after(at("2026-11-25T12:00:00Z")),
            Some(at("2026-11-26T02:00:00Z"))
        );
    }

    #[test]
    fn a_round_on_time_makes_each_due_tick_and_moves_past_now() {
        let every_second = Cadence::parse("* * * * * *", "UTC").unwrap();
        let plan = every_second.plan(
            at("2026-11-25T12:00:00Z"),
            at("2026-11-25T12:00:02.5Z"),
            TimeDelta::seconds(60),
            CatchUp::One,
        );
        assert_eq!(
            plan.on_time,
            vec![
                at("2026-11-25T12:00:00Z"),
                at("2026-11-25T12:00:01Z"),
                at("2026-11-25T12:00:02Z")
            ]
        );
        assert_eq!(plan.caught_up, None);
        assert_eq!(plan.skipped, 0);
        assert_eq!(plan.next, Some(at("2026-11-25T12:00:03Z")));
    }

    #[test]
    fn missed_ticks_make_one_task_or_none_never_one_each() {
        let every_second = Cadence::parse("* * * * * *", "UTC").unwrap();
        let (due, now) = (at("2026-11-25T12:00:00Z"), at("2026-11-25T12:00:10.5Z"));
        let one = every_second.plan(due, now, TimeDelta::seconds(2), CatchUp::One);
        // 12:00:00 ..= 12:00:08 are more than 2 s late at 12:00:10.5: nine missed ticks.
        assert_eq!(one.caught_up, Some(at("2026-11-25T12:00:08Z")));
        assert_eq!(one.skipped, 8);
        assert_eq!(
            one.on_time,
            vec![at("2026-11-25T12:00:09Z"), at("2026-11-25T12:00:10Z")]
        );
        assert_eq!(one.ticks().count(), 3);
        let none = every_second.plan(due, now, TimeDelta::seconds(2), CatchUp::None);
        assert_eq!(none.caught_up, None);
        assert_eq!(none.skipped, 9);
        assert_eq!(none.on_time, one.on_time);
        assert_eq!(none.next, Some(at("2026-11-25T12:00:11Z")));
    }

    #[test]
    fn a_year_long_outage_is_not_walked_tick_by_tick() {
        let every_second = Cadence::parse("* * * * * *", "UTC").unwrap();
        let plan = every_second.plan(
            at("2025-11-25T12:00:00Z"),
            at("2026-11-25T12:00:00.5Z"),
            TimeDelta::seconds(1),
            CatchUp::One,
        );
        assert_eq!(plan.caught_up, Some(at("2026-11-25T11:59:59Z")));
        assert_eq!(plan.skipped, MAX_COUNTED_MISSES - 1);
        assert_eq!(plan.on_time, vec![at("2026-11-25T12:00:00Z")]);
    }

    #[test]
    fn a_round_makes_at_most_its_bound_and_leaves_the_rest_due() {
        let every_second = Cadence::parse("* * * * * *", "UTC").unwrap();
        let due = at("2026-11-25T12:00:00Z");
        let plan = every_second.plan(
            due,
            due + TimeDelta::seconds(3600),
            TimeDelta::seconds(7200),
            CatchUp::One,
        );
        assert_eq!(plan.on_time.len(), MAX_TICKS_PER_ROUND);
        assert_eq!(
            plan.next,
            Some(due + TimeDelta::seconds(MAX_TICKS_PER_ROUND as i64))
        );
    }
}
