//! Where a run's WAL goes, by kind of record (`pg_waldump --stats=record` over the run's range of
//! the log) and by table or index (each record's first block, from `pg_waldump`'s full listing).
//! The total alone says a task writes three times graphile-worker's bytes; the kinds say whether
//! those are heap rows, index entries, full-page images after a checkpoint, or commits, and the
//! relations say which table or index wrote them (the history's share, an index's), which is
//! what a change of design has to be chosen by.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// How many kinds of record [`by_kind`] keeps, the largest first.
const KINDS_KEPT: usize = 8;

/// One kind of WAL record's share of a run, per task.
#[derive(Debug, Clone, Serialize)]
pub struct WalKind {
    /// `pg_waldump`'s name: resource manager and record, as `Heap/HOT_UPDATE`.
    pub kind: String,
    pub records_per_task: f64,
    /// The records' own bytes and the full-page images they carried.
    pub bytes_per_task: f64,
    pub fpi_bytes_per_task: f64,
}

/// How many tables and indexes [`WalLog::by_relation`] keeps, the largest first.
const RELATIONS_KEPT: usize = 10;

/// One table's or index's share of a run's WAL, per task, images included.
#[derive(Debug, Clone, Serialize)]
pub struct WalRelation {
    /// `database.relation`, or for records that name no block (commits) their resource
    /// manager in parentheses.
    pub relation: String,
    pub records_per_task: f64,
    pub bytes_per_task: f64,
}

/// Where the log of a cluster can be read: its `pg_wal` and the `pg_waldump` beside its server.
#[derive(Debug, Clone)]
pub(super) struct WalLog {
    pub(super) waldump: PathBuf,
    pub(super) dir: PathBuf,
}

impl WalLog {
    /// The log of the cluster in `data_dir`, or none when `pg_waldump` is not beside `postgres`.
    pub(super) fn of(bindir: &Path, data_dir: &Path) -> Option<WalLog> {
        let waldump = bindir.join("pg_waldump");
        waldump.is_file().then(|| WalLog {
            waldump,
            dir: data_dir.join("pg_wal"),
        })
    }

    /// `pg_waldump`'s output between two positions of the log, with `options` before them
    /// (none: the listing of every record); none (and said on stderr) when the log cannot be
    /// read, as when a checkpoint recycled its first segment.
    fn dump(&self, options: &[&str], start: &str, end: &str) -> Option<String> {
        let output = std::process::Command::new(&self.waldump)
            .args(options)
            .arg("--path")
            .arg(&self.dir)
            .args(["--start", start, "--end", end])
            .output();
        match output {
            Ok(output) if output.status.success() => {
                Some(String::from_utf8_lossy(&output.stdout).into_owned())
            }
            Ok(output) => {
                eprintln!(
                    "pg_waldump could not read the run's WAL: {}",
                    String::from_utf8_lossy(&output.stderr).trim()
                );
                None
            }
            Err(err) => {
                eprintln!("pg_waldump could not run: {err}");
                None
            }
        }
    }

    /// The largest kinds of record between two positions of the log, per task; empty when the
    /// log cannot be read.
    pub(super) fn by_kind(&self, start: &str, end: &str, tasks: u64) -> Vec<WalKind> {
        let Some(stats) = self.dump(&["--stats=record"], start, end) else {
            return Vec::new();
        };
        let mut kinds = parse(&stats, tasks.max(1) as f64);
        kinds.sort_by(|a, b| {
            (b.bytes_per_task + b.fpi_bytes_per_task)
                .total_cmp(&(a.bytes_per_task + a.fpi_bytes_per_task))
        });
        kinds.truncate(KINDS_KEPT);
        kinds
    }

    /// The tables and indexes that wrote the most WAL between two positions, per task; `names`
    /// maps a block's `tablespace/database/filenode` to its name. Empty when the log cannot be
    /// read.
    pub(super) fn by_relation(
        &self,
        start: &str,
        end: &str,
        tasks: u64,
        names: &HashMap<String, String>,
    ) -> Vec<WalRelation> {
        let Some(listing) = self.dump(&[], start, end) else {
            return Vec::new();
        };
        let mut relations = by_relation(&listing, names, tasks.max(1) as f64);
        relations.truncate(RELATIONS_KEPT);
        relations
    }
}

/// Sums `pg_waldump`'s listing by the relation of each record's first block, the largest
/// first. A line reads `rmgr: Btree len (rec/tot): 64/ 64, tx: ..., desc: INSERT_LEAF off 5,
/// blkref #0: rel 1663/16384/16423 blk 1`; the total length counts the record's images.
fn by_relation(listing: &str, names: &HashMap<String, String>, tasks: f64) -> Vec<WalRelation> {
    let mut sums: HashMap<String, (f64, f64)> = HashMap::new();
    for line in listing.lines() {
        let Some(rmgr) = line
            .strip_prefix("rmgr:")
            .and_then(|rest| rest.split_whitespace().next())
        else {
            continue;
        };
        let Some(total) = line
            .split_once("len (rec/tot):")
            .and_then(|(_, rest)| rest.split(',').next())
            .and_then(|lengths| lengths.split('/').nth(1))
            .and_then(|total| total.trim().parse::<f64>().ok())
        else {
            continue;
        };
        let relation = match line
            .split_once("blkref #0: rel ")
            .and_then(|(_, rest)| rest.split_whitespace().next())
        {
            Some(node) => names.get(node).cloned().unwrap_or_else(|| node.to_owned()),
            None => format!("({rmgr})"),
        };
        let sum = sums.entry(relation).or_default();
        sum.0 += 1.0;
        sum.1 += total;
    }
    let mut relations: Vec<WalRelation> = sums
        .into_iter()
        .map(|(relation, (records, bytes))| WalRelation {
            relation,
            records_per_task: records / tasks,
            bytes_per_task: bytes / tasks,
        })
        .collect();
    relations.sort_by(|a, b| b.bytes_per_task.total_cmp(&a.bytes_per_task));
    relations
}

/// Reads `pg_waldump --stats=record`'s table: a name, then the count, the records' bytes, the
/// images' bytes and their sum, each followed by its share in parentheses.
fn parse(stats: &str, tasks: f64) -> Vec<WalKind> {
    stats
        .lines()
        .filter_map(|line| {
            let mut plain = String::with_capacity(line.len());
            let mut depth = 0_u32;
            for c in line.chars() {
                match c {
                    '(' => depth += 1,
                    ')' => depth = depth.saturating_sub(1),
                    _ if depth == 0 => plain.push(c),
                    _ => {}
                }
            }
            let fields: Vec<&str> = plain.split_whitespace().collect();
            let [kind, count, bytes, fpi, _combined] = fields.as_slice() else {
                return None;
            };
            let number = |field: &str| field.parse::<f64>().ok();
            Some(WalKind {
                kind: (*kind).to_owned(),
                records_per_task: number(count)? / tasks,
                bytes_per_task: number(bytes)? / tasks,
                fpi_bytes_per_task: number(fpi)? / tasks,
            })
        })
        .filter(|kind| kind.kind.contains('/') && kind.records_per_task > 0.0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_records_table_is_read_without_its_shares_and_totals() {
        let stats = "\
Type                                           N      (%)          Record size      (%)             FPI size      (%)        Combined size      (%)
----                                           -      ---          -----------      ---             --------      ---        -------------      ---
XLOG/CHECKPOINT_ONLINE                         1 (  0.00)                  114 (  0.00)                    0 (  0.00)                  114 (  0.00)
Heap/INSERT                                 2000 ( 40.00)               200000 ( 50.00)                 8192 (  9.00)               208192 ( 48.00)
Btree/INSERT_LEAF                           3000 ( 60.00)               192000 ( 50.00)                    0 (  0.00)               192000 ( 52.00)
                                        --------                      --------                      --------                      --------
Total                                       5001                        392114 [95.00%]                 8192 [5.00%]                400306 [100%]
";
        let kinds = parse(stats, 1000.0);
        let names: Vec<&str> = kinds.iter().map(|k| k.kind.as_str()).collect();
        assert_eq!(
            names,
            ["XLOG/CHECKPOINT_ONLINE", "Heap/INSERT", "Btree/INSERT_LEAF"]
        );
        assert_eq!(kinds[1].records_per_task, 2.0);
        assert_eq!(kinds[1].bytes_per_task, 200.0);
        assert_eq!(kinds[1].fpi_bytes_per_task, 8.192);
    }

    #[test]
    fn the_listing_is_summed_by_the_relation_of_each_first_block() {
        let listing = "\
rmgr: Heap        len (rec/tot):     79/    79, tx:        750, lsn: 0/0155A0F8, prev 0/0155A0C0, desc: INSERT off 3 flags 0x00, blkref #0: rel 1663/16384/16390 blk 0
rmgr: Btree       len (rec/tot):     64/  8256, tx:        750, lsn: 0/0155A148, prev 0/0155A0F8, desc: INSERT_LEAF off 2, blkref #0: rel 1663/16384/16395 blk 1 FPW
rmgr: Heap        len (rec/tot):     81/    81, tx:        751, lsn: 0/0155C1A0, prev 0/0155A148, desc: INSERT off 4 flags 0x00, blkref #0: rel 1663/16384/16390 blk 0
rmgr: Transaction len (rec/tot):     34/    34, tx:        750, lsn: 0/0155C1F8, prev 0/0155C1A0, desc: COMMIT 2026-12-07 23:50:00.000000 UTC
";
        let names = HashMap::from([("1663/16384/16390".to_owned(), "tasks.tasks".to_owned())]);
        let relations = by_relation(listing, &names, 2.0);
        let summed: Vec<(&str, f64, f64)> = relations
            .iter()
            .map(|r| (r.relation.as_str(), r.records_per_task, r.bytes_per_task))
            .collect();
        assert_eq!(
            summed,
            [
                ("1663/16384/16395", 0.5, 4128.0),
                ("tasks.tasks", 1.0, 80.0),
                ("(Transaction)", 0.5, 17.0),
            ]
        );
    }
}
