//! The book under `docs/` builds with mdBook (a pinned 0.4 release, installed under the target
//! directory on first use) without a warning; every internal link of its pages and of the
//! README leads to a file that exists and, with an anchor, to a heading of that page; every page
//! is in the book's summary; and the README stays one screen's worth.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use tests::tools;

/// mdBook's last 0.4 release: 0.5 changed the configuration and the renderer.
const MDBOOK_VERSION: &str = "0.4.52";

/// One screen's worth.
const README_MAX_LINES: usize = 250;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// The id mdBook gives a heading: its text lowercased, whitespace to `-`, and every other
/// character but letters, digits, `-` and `_` dropped (`normalize_id` in mdBook 0.4). The
/// emphasis and code marks around words are not part of the rendered text.
fn anchor(heading: &str) -> String {
    heading
        .chars()
        .filter(|ch| !matches!(ch, '`' | '*'))
        .filter_map(|ch| {
            if ch.is_alphanumeric() || ch == '_' || ch == '-' {
                Some(ch.to_ascii_lowercase())
            } else if ch.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// Whether `line` opens or closes a fenced code block; its fence (the mark's character).
fn fence(line: &str) -> Option<char> {
    let line = line.trim_start();
    ["```", "~~~"]
        .into_iter()
        .find(|mark| line.starts_with(mark))
        .and_then(|mark| mark.chars().next())
}

/// The markdown outside fenced code blocks, as paragraphs (a code span cannot cross one).
fn prose(markdown: &str) -> Vec<String> {
    let mut paragraphs = vec![String::new()];
    let mut open: Option<char> = None;
    for line in markdown.lines() {
        match (open, fence(line)) {
            (None, Some(mark)) => open = Some(mark),
            (Some(mark), Some(found)) if found == mark => open = None,
            (Some(_), _) => {}
            (None, None) if line.trim().is_empty() => paragraphs.push(String::new()),
            (None, None) => {
                let last = paragraphs.last_mut().unwrap();
                last.push_str(line);
                last.push('\n');
            }
        }
    }
    paragraphs.retain(|p| !p.is_empty());
    paragraphs
}

/// The ids of a page's headings, as mdBook makes them unique: a repeated one gets `-1`, `-2`...
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut ids = BTreeSet::new();
    for paragraph in prose(markdown) {
        for line in paragraph.lines() {
            let hashes = line.chars().take_while(|&ch| ch == '#').count();
            if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
                continue;
            }
            let id = anchor(line[hashes..].trim().trim_end_matches('#').trim());
            let count = seen.entry(id.clone()).or_insert(0);
            ids.insert(if *count == 0 {
                id
            } else {
                format!("{id}-{count}")
            });
            *count += 1;
        }
    }
    ids
}

/// A paragraph without its code spans (a run of backticks up to the next run as long).
fn without_code_spans(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let run = rest[start..].chars().take_while(|&ch| ch == '`').count();
        let ticks = "`".repeat(run);
        let after = &rest[start + run..];
        let close = (0..after.len())
            .filter(|&i| after.is_char_boundary(i))
            .find(|&i| {
                after[i..].starts_with(&ticks)
                    && !after[i + run..].starts_with('`')
                    && (i == 0 || !after[..i].ends_with('`'))
            });
        match close {
            Some(i) => rest = &after[i + run..],
            // An unmatched run is literal text.
            None => {
                out.push_str(&ticks);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The targets of a page's links and images (`[text](target)`, `[label]: target`), outside
/// code.
fn links(markdown: &str) -> Vec<String> {
    let mut found = Vec::new();
    for paragraph in prose(markdown) {
        let text = without_code_spans(&paragraph);
        let mut rest = text.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let target = rest.trim_start_matches('<');
            let end = target
                .find(|ch: char| ch == ')' || ch == '>' || ch.is_whitespace())
                .unwrap_or(target.len());
            found.push(target[..end].to_owned());
        }
        for line in text.lines() {
            let line = line.trim_start();
            if let Some(label_end) = line.find("]:")
                && line.starts_with('[')
                && let Some(target) = line[label_end + 2..].split_whitespace().next()
            {
                found.push(target.trim_matches(['<', '>']).to_owned());
            }
        }
    }
    found
}

/// Every internal link of `page` that leads nowhere: a file that does not exist, or an anchor
/// that is no heading of its page. Links with a scheme (`https:`, `mailto:`) are not followed.
fn broken_links(page: &Path) -> Vec<String> {
    let markdown = std::fs::read_to_string(page).unwrap();
    let dir = page.parent().unwrap();
    let mut broken = Vec::new();
    for link in links(&markdown) {
        let scheme = link.split_once(':').is_some_and(|(s, _)| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
        });
        if scheme {
            continue;
        }
        let (path, fragment) = link.split_once('#').unwrap_or((link.as_str(), ""));
        let target = if path.is_empty() {
            page.to_owned()
        } else {
            dir.join(path)
        };
        if !target.exists() {
            broken.push(format!(
                "{}: {link}: no file {}",
                page.display(),
                target.display()
            ));
            continue;
        }
        let is_page = target.extension().is_some_and(|e| e == "md");
        if fragment.is_empty() || !is_page {
            continue;
        }
        let headings = anchors(&std::fs::read_to_string(&target).unwrap());
        if !headings.contains(fragment) {
            broken.push(format!(
                "{}: {link}: no heading #{fragment} in {}",
                page.display(),
                target.display()
            ));
        }
    }
    broken
}

/// The pages the link check reads: the book's sources and the README.
fn pages() -> Vec<PathBuf> {
    let src = workspace().join("docs/src");
    let mut pages: Vec<PathBuf> = std::fs::read_dir(&src)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    pages.push(workspace().join("README.md"));
    pages
}

#[test]
fn the_book_builds_without_a_warning() {
    let mdbook = tools::cargo_tool(
        "mdbook",
        MDBOOK_VERSION,
        // Building is all this test does: no server, no file watcher to compile.
        &["--no-default-features", "--features", "search"],
    );
    let dest = tests::target_dir().join("docs-book");
    let output = Command::new(&mdbook)
        .arg("build")
        .arg(workspace().join("docs"))
        .arg("--dest-dir")
        .arg(&dest)
        .output()
        .unwrap();
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "mdbook build failed:\n{log}");
    let complaints: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("WARN") || line.contains("ERROR"))
        .collect();
    assert!(complaints.is_empty(), "mdbook build complained:\n{log}");
    assert!(dest.join("index.html").exists(), "{}", dest.display());
    eprintln!("the book is at {}", dest.join("index.html").display());
}

#[test]
fn every_internal_link_resolves() {
    let broken: Vec<String> = pages()
        .iter()
        .flat_map(|page| broken_links(page.as_path()))
        .collect();
    assert!(
        broken.is_empty(),
        "{} broken links:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn every_page_is_in_the_summary() {
    let src = workspace().join("docs/src");
    let summary = std::fs::read_to_string(src.join("SUMMARY.md")).unwrap();
    let listed: BTreeSet<String> = links(&summary).into_iter().collect();
    // A page left out is not rendered, so a link to it would lead nowhere in the book.
    let missing: Vec<String> = pages()
        .iter()
        .filter(|page| page.parent() == Some(src.as_path()))
        .filter_map(|page| Some(page.file_name()?.to_str()?.to_owned()))
        .filter(|name| name != "SUMMARY.md" && !listed.contains(name))
        .collect();
    assert!(missing.is_empty(), "not in SUMMARY.md: {missing:?}");
}

#[test]
fn the_readme_is_one_screen() {
    let readme = std::fs::read_to_string(workspace().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: move the rest into docs/src/"
    );
}

#[test]
fn anchors_follow_mdbooks_rule() {
    assert_eq!(
        anchor("Against graphile-worker, and where a task's cost goes"),
        "against-graphile-worker-and-where-a-tasks-cost-goes"
    );
    assert_eq!(
        anchor("lease-service (`/api/leases`)"),
        "lease-service-apileases"
    );
    assert_eq!(
        anchor("The redesign of a task (issue 32), lever by lever"),
        "the-redesign-of-a-task-issue-32-lever-by-lever"
    );
    let page = "# Title\n\n## Twice\n\n```sh\n# not a heading\n```\n\n## Twice\n";
    let ids: Vec<String> = anchors(page).into_iter().collect();
    assert_eq!(ids, ["title", "twice", "twice-1"]);
}

/// The checker itself: a page with good links and broken ones must be judged exactly so.
#[test]
fn the_link_check_catches_a_broken_link() {
    let dir = std::env::temp_dir().join(format!("docs-book-check-{}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("other.md"), "# Other\n\n## Where it goes\n").unwrap();
    let page = dir.join("page.md");
    std::fs::write(
        &page,
        "# Page\n\n## Here\n\n\
         Good: [a](other.md), [b](other.md#where-it-goes), [c](#here), [d](https://example.com/x.md),\n\
         and one over two lines: [a link\nsplit](other.md#other).\n\n\
         Broken: [e](missing.md), [f](other.md#nowhere), [g](#not-here).\n\n\
         Code is not read: `[h](missing-in-code.md)` and\n\n\
         ```md\n[i](missing-in-a-block.md)\n```\n\n\
         [label]: gone.md\n",
    )
    .unwrap();
    let broken = broken_links(&page);
    std::fs::remove_dir_all(&dir).unwrap();
    let targets: Vec<&str> = broken
        .iter()
        .map(|line| line.split(": ").nth(1).unwrap())
        .collect();
    assert_eq!(
        targets,
        ["missing.md", "other.md#nowhere", "#not-here", "gone.md"],
        "{broken:#?}"
    );
}
