//! The pace the leader creates tasks at, read from the desired state.

use std::time::Duration;

use leasehold::generator::{
    GeneratorSettings, MAX_RATE_PER_SECOND, MAX_SLEEP_SECONDS, MIN_RATE_PER_SECOND,
};
use rand::Rng;

/// The pace the settings ask for, kept within [`leasehold::generator`]'s bounds whatever was read,
/// so that no value can make a duration overflow or a random range empty.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Pace {
    pub(crate) period: Duration,
    min_sleep: f64,
    max_sleep: f64,
}

impl Pace {
    pub(crate) fn of(settings: &GeneratorSettings) -> Self {
        Self::new(
            settings.rate_per_second,
            settings.min_sleep_seconds,
            settings.max_sleep_seconds,
        )
    }

    fn new(rate: f64, min_sleep: f64, max_sleep: f64) -> Self {
        let rate = if rate.is_nan() {
            MIN_RATE_PER_SECOND
        } else {
            rate.clamp(MIN_RATE_PER_SECOND, MAX_RATE_PER_SECOND)
        };
        let seconds = |value: f64| {
            if value.is_nan() {
                0.0
            } else {
                value.clamp(0.0, MAX_SLEEP_SECONDS)
            }
        };
        let (min, max) = (seconds(min_sleep), seconds(max_sleep));
        Self {
            period: Duration::try_from_secs_f64(1.0 / rate).unwrap_or(Duration::from_secs(1000)),
            min_sleep: min.min(max),
            max_sleep: max.max(min),
        }
    }

    /// A task's `sleep_duration_seconds`, to the millisecond.
    pub(crate) fn sleep(&self) -> f64 {
        let sleep = if self.max_sleep > self.min_sleep {
            rand::rng().random_range(self.min_sleep..=self.max_sleep)
        } else {
            self.min_sleep
        };
        (sleep * 1000.0).round() / 1000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_setting_makes_the_pace_panic_or_leave_its_bounds() {
        let odd = [
            0.0,
            -0.0,
            1e-300,
            -1.0,
            f64::MIN_POSITIVE,
            5e-324,
            1e300,
            f64::MAX,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            0.5,
        ];
        for rate in odd {
            for min in odd {
                for max in odd {
                    let pace = Pace::new(rate, min, max);
                    assert!(pace.period >= Duration::from_millis(1), "{rate}");
                    assert!(pace.period <= Duration::from_secs(1000), "{rate}");
                    let sleep = pace.sleep();
                    assert!((0.0..=MAX_SLEEP_SECONDS).contains(&sleep), "{min} {max}");
                }
            }
        }
        assert_eq!(
            Pace::new(1e-300, 1.0, 2.0).period,
            Duration::from_secs(1000)
        );
        assert_eq!(Pace::new(4.0, 1.0, 2.0).period, Duration::from_millis(250));
    }
}
