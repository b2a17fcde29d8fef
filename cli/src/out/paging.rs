//! Listings: which page to print (`--limit`, `--all`, `--sort`, `--cursor`), the walk across
//! pages for `--all`, and the hint of what a page left out.

use super::WatchArgs;

/// Which page of a listing to print: the flags every `list` command takes.
#[derive(Debug, clap::Args)]
pub struct PageArgs {
    #[command(flatten)]
    pub watch: WatchArgs,
    /// At most this many (a page is at most 1000).
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
    /// Every one: page after page of --limit, until the last.
    #[arg(long, conflicts_with = "cursor")]
    pub all: bool,
    /// Which come first.
    #[arg(long, value_enum, default_value_t)]
    pub sort: Sort,
    /// Continue from an earlier page: the cursor its last line (or its `nextCursor`) gave.
    #[arg(long)]
    pub cursor: Option<String>,
}

/// The order of a listing, by id (the order things were made in).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Sort {
    /// The newest first.
    #[default]
    Newest,
    /// The oldest first.
    Oldest,
}

impl Sort {
    pub(crate) fn newest_first(self) -> bool {
        self == Sort::Newest
    }

    fn words(self) -> &'static str {
        match self {
            Sort::Newest => "newest first",
            Sort::Oldest => "oldest first",
        }
    }
}

/// A page of a listing, which `--all` joins to the pages after it.
pub(crate) trait Paged: Sized {
    /// The cursor of the next page, taken out of this one.
    fn take_cursor(&mut self) -> Option<String>;
    /// Appends the next page's rows, and takes its cursor.
    fn append(&mut self, next: Self);
}

impl Paged for leasehold::tasks::TaskPage {
    fn take_cursor(&mut self) -> Option<String> {
        self.next_cursor.take()
    }
    fn append(&mut self, next: Self) {
        self.tasks.extend(next.tasks);
        self.next_cursor = next.next_cursor;
    }
}

impl Paged for leasehold::queues::Queues {
    fn take_cursor(&mut self) -> Option<String> {
        self.next_cursor.take()
    }
    fn append(&mut self, next: Self) {
        self.queues.extend(next.queues);
        self.next_cursor = next.next_cursor;
    }
}

impl Paged for leasehold::api::LeasePage {
    fn take_cursor(&mut self) -> Option<String> {
        self.next_cursor.take()
    }
    fn append(&mut self, next: Self) {
        self.leases.extend(next.leases);
        self.next_cursor = next.next_cursor;
    }
}

/// The page at `cursor` (the first page when none), and with `all` every page after it, each
/// read by `fetch` from the cursor before it.
pub(crate) async fn pages<P: Paged, Fut: Future<Output = anyhow::Result<P>>>(
    cursor: Option<String>,
    all: bool,
    mut fetch: impl FnMut(Option<String>) -> Fut,
) -> anyhow::Result<P> {
    let mut first = fetch(cursor).await?;
    while all && let Some(cursor) = first.take_cursor() {
        let next = fetch(Some(cursor)).await?;
        first.append(next);
    }
    Ok(first)
}

/// `12345` as `12,345`.
pub(crate) fn thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    if n < 0 { format!("-{out}") } else { out }
}

/// Says how to get the rest when a listing stopped short of it (a page holds at most `limit`
/// rows, and the service may cut one short to bound its size).
pub(crate) fn more_hint(
    shown: usize,
    of: Option<i64>,
    what: &str,
    sort: Sort,
    next: Option<&str>,
) -> Option<String> {
    let next = next?;
    let of = of.map_or_else(String::new, |total| format!(" of {}", thousands(total)));
    Some(format!(
        "showing {shown}{of} {what}, {}; use --limit (up to 1000) or --all, or go on with \
         --cursor {next}",
        sort.words()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hint_says_how_to_get_more_only_when_there_is_more() {
        assert_eq!(more_hint(100, Some(250), "tasks", Sort::Newest, None), None);
        let hint = more_hint(100, Some(250), "tasks", Sort::Newest, Some("151")).expect("a hint");
        assert!(
            hint.starts_with("showing 100 of 250 tasks, newest first"),
            "{hint}"
        );
        assert!(
            hint.contains("--cursor 151") && hint.contains("--limit") && hint.contains("--all"),
            "{hint}"
        );
        let hint = more_hint(100, Some(12_345), "tasks", Sort::Newest, Some("7")).expect("a hint");
        assert!(hint.starts_with("showing 100 of 12,345 tasks"), "{hint}");
        assert_eq!(
            [
                thousands(0),
                thousands(999),
                thousands(1000),
                thousands(-1_234_567)
            ],
            ["0", "999", "1,000", "-1,234,567"]
        );
        let hint = more_hint(5, None, "leases", Sort::Oldest, Some("6")).expect("a hint");
        assert!(hint.starts_with("showing 5 leases, oldest first"), "{hint}");
    }
}
