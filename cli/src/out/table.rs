//! Drawing tables: columns padded to what shows, colour on a terminal only, and the cells
//! every table shares (times, dashes for nothing, wire names).

use chrono::{DateTime, Utc};
use serde::Serialize;

/// Whether to colour: on a terminal, unless `NO_COLOR` is set to anything but nothing
/// (no-color.org).
pub(crate) fn colour_wanted(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(std::ffi::OsStr::is_empty)
}

/// How a table is drawn.
#[derive(Debug, Clone, Copy, Default)]
pub struct View {
    /// With the wide columns (`-o wide`).
    pub wide: bool,
    /// With statuses coloured (a terminal without `NO_COLOR`).
    pub colour: bool,
}

/// What a colour says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tone {
    /// Done, or holding: green.
    Good,
    /// Dead, or ended against its holder: red.
    Bad,
    /// Waiting: yellow.
    Waiting,
    /// At work: cyan.
    Busy,
    /// Over and of no further interest: dim.
    Over,
}

impl View {
    /// A task's or a lease's status, in its colour.
    pub(crate) fn status(self, status: &str) -> String {
        let tone = match status {
            "succeeded" | "active" => Tone::Good,
            "dead" | "revoked" | "expired" => Tone::Bad,
            "pending" => Tone::Waiting,
            "running" => Tone::Busy,
            "cancelled" | "released" => Tone::Over,
            _ => return status.to_owned(),
        };
        self.paint(status, tone)
    }

    /// `text` in the colour of `tone`, when colouring.
    pub(crate) fn paint(self, text: &str, tone: Tone) -> String {
        if !self.colour {
            return text.to_owned();
        }
        let code = match tone {
            Tone::Good => "32",
            Tone::Bad => "31",
            Tone::Waiting => "33",
            Tone::Busy => "36",
            Tone::Over => "2",
        };
        format!("\x1b[{code}m{text}\x1b[0m")
    }
}

/// The width a cell takes on screen: its characters, less colour escapes.
fn visible_width(cell: &str) -> usize {
    let mut width = 0;
    let mut escape = false;
    for c in cell.chars() {
        match (escape, c) {
            (false, '\x1b') => escape = true,
            (true, 'm') => escape = false,
            (true, _) => {}
            (false, _) => width += 1,
        }
    }
    width
}

/// Columns padded to their widest cell.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| visible_width(h)).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(visible_width(cell));
        }
    }
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| {
                let pad = width.saturating_sub(visible_width(cell));
                format!("{cell}{}", " ".repeat(pad))
            })
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    let mut text = line(headers.to_vec());
    for row in rows {
        text.push('\n');
        text.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    text
}

/// A time as the services write it (RFC 3339, UTC), to the millisecond.
pub(crate) fn time(at: &DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

pub(crate) fn or_dash(value: Option<String>) -> String {
    value.unwrap_or_else(|| "-".to_owned())
}

/// A wire enum's name as the API writes it (`active`, `revoked`, ...).
pub(crate) fn wire_name<T: Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns_and_trim_trailing_space() {
        let text = table(
            &["ID", "NAME"],
            &[
                vec!["1".to_owned(), "a".to_owned()],
                vec!["100".to_owned(), "bb".to_owned()],
            ],
        );
        assert_eq!(text, "ID   NAME\n1    a\n100  bb");
    }

    #[test]
    fn colour_only_on_a_terminal_and_never_with_no_color() {
        use std::ffi::OsStr;
        assert!(colour_wanted(true, None));
        assert!(colour_wanted(true, Some(OsStr::new(""))));
        assert!(!colour_wanted(true, Some(OsStr::new("1"))));
        assert!(!colour_wanted(false, None));
        let plain = View::default();
        assert_eq!(plain.status("dead"), "dead");
        let coloured = View {
            wide: false,
            colour: true,
        };
        assert_eq!(coloured.status("dead"), "\x1b[31mdead\x1b[0m");
        // Columns line up by what shows, not by the escapes.
        let text = table(
            &["ID", "STATUS", "QUEUE"],
            &[
                vec!["1".to_owned(), coloured.status("dead"), "q".to_owned()],
                vec!["2".to_owned(), "succeeded".to_owned(), "q".to_owned()],
            ],
        );
        let queue_at: Vec<usize> = text
            .lines()
            .map(|line| {
                let mut width = 0;
                let mut shown = String::new();
                for c in line.chars() {
                    shown.push(c);
                    width = visible_width(&shown);
                    if c == 'q' || c == 'Q' {
                        break;
                    }
                }
                width
            })
            .collect();
        assert_eq!(queue_at, vec![queue_at[0]; 3], "{text:?}");
    }
}
