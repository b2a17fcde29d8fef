//! The run's figures, ratios and memory figures, and their markdown tables.

use std::fmt::Write as _;

use serde::Serialize;

use super::cost::{Cost, KINDS};

/// One measured figure.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    pub section: String,
    pub name: String,
    /// Concurrent clients (or worker slots).
    pub concurrency: usize,
    /// Rows present in the table the figure depends on, where that is the point.
    pub rows: Option<u64>,
    pub ops: u64,
    pub errors: u64,
    pub seconds: f64,
    pub per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// A ratio between two figures of the same run.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    pub name: String,
    pub value: f64,
}

/// task-service's resident memory while readers page through large tasks at once.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryFigure {
    pub tasks: u64,
    pub task_kib: u64,
    pub readers: usize,
    /// Pages read (all readers together) and the bytes they carried.
    pub pages: u64,
    pub mib_read: f64,
    pub rss_before_mib: f64,
    pub rss_peak_mib: f64,
    pub rss_after_mib: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub figures: Vec<Figure>,
    pub ratios: Vec<Ratio>,
    pub memory: Vec<MemoryFigure>,
    pub costs: Vec<Cost>,
    /// Sections that could not run here, and why.
    pub skipped: Vec<String>,
}

impl Report {
    pub fn find(&self, section: &str, name: &str, concurrency: usize) -> Option<&Figure> {
        self.figures
            .iter()
            .find(|f| f.section == section && f.name == name && f.concurrency == concurrency)
    }

    pub(super) fn ratio(&mut self, name: impl Into<String>, numerator: f64, denominator: f64) {
        let value = if denominator > 0.0 {
            numerator / denominator
        } else {
            0.0
        };
        self.ratios.push(Ratio {
            name: name.into(),
            value,
        });
    }

    /// The report as markdown tables, one per section, then the ratios.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let mut sections: Vec<&str> = Vec::new();
        for figure in &self.figures {
            if !sections.contains(&figure.section.as_str()) {
                sections.push(&figure.section);
            }
        }
        for section in sections {
            let _ = writeln!(out, "\n### {section}\n");
            let _ = writeln!(
                out,
                "| what | clients | rows present | ops | errors | per second | p50 ms | p99 ms |"
            );
            let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|");
            for f in self.figures.iter().filter(|f| f.section == section) {
                let rows = f.rows.map_or(String::new(), |r| r.to_string());
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {:.0} | {:.2} | {:.2} |",
                    f.name, f.concurrency, rows, f.ops, f.errors, f.per_second, f.p50_ms, f.p99_ms
                );
            }
        }
        if !self.memory.is_empty() {
            let _ = writeln!(out, "\n### memory: open reads of large tasks\n");
            let _ = writeln!(
                out,
                "| tasks | KiB each | readers | pages read | MiB read | RSS before MiB | RSS peak MiB | RSS after MiB |"
            );
            let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|");
            for m in &self.memory {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} |",
                    m.tasks,
                    m.task_kib,
                    m.readers,
                    m.pages,
                    m.mib_read,
                    m.rss_before_mib,
                    m.rss_peak_mib,
                    m.rss_after_mib
                );
            }
        }
        if !self.costs.is_empty() {
            let _ = writeln!(
                out,
                "\n### cost (create → claim → complete): CPU ms per 1,000 tasks by process; WAL bytes, write transactions, commits and WAL fsyncs per task\n"
            );
            let kinds: Vec<String> = KINDS.iter().map(|k| format!("{k} CPU")).collect();
            let _ = writeln!(
                out,
                "| run | tasks | {} | total | tasks per PostgreSQL CPU-second | WAL bytes | write xacts | commits | WAL fsyncs |",
                kinds.join(" | ")
            );
            let _ = writeln!(
                out,
                "|---|---:|{}---:|---:|---:|---:|---:|---:|",
                "---:|".repeat(KINDS.len())
            );
            for c in &self.costs {
                let cpu: Vec<String> = c
                    .cpu_ms_per_1000
                    .iter()
                    .map(|(_, ms)| format!("{ms:.0}"))
                    .collect();
                let total: f64 = c.cpu_ms_per_1000.iter().map(|(_, ms)| ms).sum();
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {:.3} |",
                    c.run,
                    c.tasks,
                    cpu.join(" | "),
                    total,
                    c.tasks_per_postgres_cpu_second(),
                    c.wal_bytes_per_task,
                    c.write_transactions_per_task,
                    c.commits_per_task,
                    c.wal_fsyncs_per_task
                );
            }
        }
        let profiled: Vec<&Cost> = self
            .costs
            .iter()
            .filter(|c| !c.statements.is_empty())
            .collect();
        if !profiled.is_empty() {
            let _ = writeln!(
                out,
                "\n### where PostgreSQL's time goes: the statements that took the most, per task (pg_stat_statements; nested: run by a trigger, and counted in its statement too)\n"
            );
            let _ = writeln!(
                out,
                "| run | statement | µs per task | planning µs per task | calls per task | plans per call |"
            );
            let _ = writeln!(out, "|---|---|---:|---:|---:|---:|");
            for c in profiled {
                for s in &c.statements {
                    let _ = writeln!(
                        out,
                        "| {} | {}`{}` | {:.1} | {:.1} | {:.3} | {:.2} |",
                        c.run,
                        if s.nested { "(nested) " } else { "" },
                        s.query.replace('|', "\\|").replace('`', "'"),
                        s.exec_us_per_task,
                        s.plan_us_per_task,
                        s.calls_per_task,
                        s.plans_per_call
                    );
                }
            }
        }
        let dumped: Vec<&Cost> = self
            .costs
            .iter()
            .filter(|c| !c.wal_by_kind.is_empty())
            .collect();
        if !dumped.is_empty() {
            let _ = writeln!(
                out,
                "\n### where the WAL goes: the largest kinds of record, per task (pg_waldump; images: full pages written after a checkpoint)\n"
            );
            let _ = writeln!(
                out,
                "| run | record | records per task | bytes per task | image bytes per task |"
            );
            let _ = writeln!(out, "|---|---|---:|---:|---:|");
            for c in dumped {
                for k in &c.wal_by_kind {
                    let _ = writeln!(
                        out,
                        "| {} | {} | {:.2} | {:.0} | {:.0} |",
                        c.run, k.kind, k.records_per_task, k.bytes_per_task, k.fpi_bytes_per_task
                    );
                }
            }
        }
        let listed: Vec<&Cost> = self
            .costs
            .iter()
            .filter(|c| !c.wal_by_relation.is_empty())
            .collect();
        if !listed.is_empty() {
            let _ = writeln!(
                out,
                "\n### where the WAL goes: the tables and indexes that wrote it, per task (pg_waldump; a record counted at its first block, images included)\n"
            );
            let _ = writeln!(
                out,
                "| run | table or index | records per task | bytes per task |"
            );
            let _ = writeln!(out, "|---|---|---:|---:|");
            for c in listed {
                for r in &c.wal_by_relation {
                    let _ = writeln!(
                        out,
                        "| {} | {} | {:.2} | {:.0} |",
                        c.run, r.relation, r.records_per_task, r.bytes_per_task
                    );
                }
            }
        }
        for skipped in &self.skipped {
            let _ = writeln!(out, "\n{skipped}");
        }
        let _ = writeln!(out, "\n### ratios (same run)\n");
        let _ = writeln!(out, "| ratio | value |");
        let _ = writeln!(out, "|---|---:|");
        for ratio in &self.ratios {
            let _ = writeln!(out, "| {} | {:.2} |", ratio.name, ratio.value);
        }
        out
    }
}
