//! What a command's stdout or an endpoint's answer becomes as a task's output, for the exec and
//! push handlers alike: JSON when it parses, else text, and cut to the output limit; and the
//! snooze either asks for, kept within bounds.

use std::time::Duration;

use serde_json::Value;

use crate::handler::TaskFailure;

/// The shortest snooze a command or an endpoint gets: a snooze charges no attempt, so a zero
/// one (`Retry-After: 0`, a date gone by, `snooze_seconds: 0`) would run the task again and
/// again at once, for ever.
pub(crate) const MIN_SNOOZE: Duration = Duration::from_secs(1);
/// The longest: a later one is taken as this.
pub(crate) const MAX_SNOOZE: Duration = Duration::from_secs(365 * 24 * 3_600);

/// A snooze of `delay`, kept between [`MIN_SNOOZE`] and [`MAX_SNOOZE`].
pub(crate) fn snooze(delay: Duration) -> TaskFailure {
    TaskFailure::snooze(delay.clamp(MIN_SNOOZE, MAX_SNOOZE))
}

/// The most a task's output may take, task-service's limit: more is cut, and marked so.
pub(crate) use leasehold::tasks::MAX_DATA_BYTES as MAX_OUTPUT_BYTES;

/// The work's output (a command's stdout, an endpoint's answer body): its JSON when it parses
/// as JSON, else its text; when `cut`, what was kept of the text under `field` and marked so
/// (`{"stdout": "...", "truncated": true}`), within the output limit.
pub(crate) fn output_value(field: &str, stdout: &[u8], cut: bool) -> Value {
    if !cut && let Ok(value) = serde_json::from_slice::<Value>(stdout) {
        return value;
    }
    let text = String::from_utf8_lossy(stdout);
    let text = text.trim_end_matches('\n');
    if !cut {
        return Value::String(text.to_owned());
    }
    // Escaping can make the text longer than its bytes: halve until it fits.
    let mut keep = text.len();
    loop {
        let value = serde_json::json!({field: cut_to(text, keep), "truncated": true});
        if serde_json::to_vec(&value).map_or(0, |v| v.len()) <= MAX_OUTPUT_BYTES - 64 || keep == 0 {
            return value;
        }
        keep /= 2;
    }
}

/// `text` cut to at most `bytes` bytes, at a character boundary.
fn cut_to(text: &str, bytes: usize) -> &str {
    if text.len() <= bytes {
        return text;
    }
    let end = (0..=bytes)
        .rev()
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(0);
    &text[..end]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn output_is_json_when_it_parses_text_otherwise_and_cut_to_fit() {
        assert_eq!(
            output_value("stdout", b"{\"a\":1}\n", false),
            serde_json::json!({"a": 1})
        );
        assert_eq!(
            output_value("stdout", b"hello\n", false),
            Value::String("hello".to_owned())
        );
        let big = vec![b'\x01'; MAX_OUTPUT_BYTES];
        let value = output_value("stdout", &big, true);
        assert_eq!(value["truncated"], true);
        assert!(serde_json::to_vec(&value).unwrap().len() <= MAX_OUTPUT_BYTES);
    }
}
