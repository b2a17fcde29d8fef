//! Where a run's WAL goes, by kind of record: `pg_waldump --stats=record` over the run's range of
//! the log. The total alone says a task writes three times graphile-worker's bytes; the kinds say
//! whether those are heap rows, index entries, full-page images after a checkpoint, or commits,
//! which is what a change of design has to be chosen by.

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

    /// The largest kinds of record between two positions of the log, per task; empty (and said
    /// on stderr) when the log cannot be read, as when a checkpoint recycled its first segment.
    pub(super) fn by_kind(&self, start: &str, end: &str, tasks: u64) -> Vec<WalKind> {
        let output = std::process::Command::new(&self.waldump)
            .arg("--stats=record")
            .arg("--path")
            .arg(&self.dir)
            .args(["--start", start, "--end", end])
            .output();
        let output = match output {
            Ok(output) if output.status.success() => output,
            Ok(output) => {
                eprintln!(
                    "pg_waldump could not read the run's WAL: {}",
                    String::from_utf8_lossy(&output.stderr).trim()
                );
                return Vec::new();
            }
            Err(err) => {
                eprintln!("pg_waldump could not run: {err}");
                return Vec::new();
            }
        };
        let mut kinds = parse(
            &String::from_utf8_lossy(&output.stdout),
            tasks.max(1) as f64,
        );
        kinds.sort_by(|a, b| {
            (b.bytes_per_task + b.fpi_bytes_per_task)
                .total_cmp(&(a.bytes_per_task + a.fpi_bytes_per_task))
        });
        kinds.truncate(KINDS_KEPT);
        kinds
    }
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
}
