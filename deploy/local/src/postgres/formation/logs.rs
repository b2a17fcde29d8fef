//! A formation's logs for a failed test: its keepers' story in time order, and copies of every
//! log before the directory goes.

use std::path::Path;

use super::Formation;

impl Formation {
    /// What each node's keeper did, in time order: its state machine's transitions and the
    /// settings that decide which node takes writes and whether a commit waits for a standby.
    /// Lines as the logs have them (`HH:MM:SS`, local time of this machine), each after its
    /// node's name: for a failed test's report, where the logs themselves may be out of reach.
    pub fn story(&self) -> Vec<String> {
        const TOLD: [&str; 5] = [
            "FSM transition from",
            "Setting synchronous_standby_names",
            "Setting default_transaction_read_only",
            "network partition",
            "Failed to",
        ];
        let mut lines: Vec<(String, String)> = Vec::new();
        for node in &self.nodes {
            let Ok(text) = std::fs::read_to_string(&node.log) else {
                continue;
            };
            for line in text
                .lines()
                .filter(|line| TOLD.iter().any(|t| line.contains(t)))
            {
                let time = line
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                lines.push((time, format!("{} {line}", node.name)));
            }
        }
        // Stable: a node's lines of one second keep their order.
        lines.sort_by(|a, b| a.0.cmp(&b.0));
        lines.into_iter().map(|(_, line)| line).collect()
    }

    /// Copies the monitor's and each node's logs (pg_autoctl's, and PostgreSQL's own under
    /// `PGDATA/log`) into `dir`, named by node: the directory they live in goes with the
    /// formation, and a failed test needs them after.
    pub fn copy_logs_to(&self, dir: &Path) {
        for node in std::iter::once(&self.monitor).chain(&self.nodes) {
            let _ = std::fs::copy(&node.log, dir.join(format!("pg-{}.log", node.name)));
            let Ok(entries) = std::fs::read_dir(node.pgdata.join("log")) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = format!("pg-{}-{}", node.name, entry.file_name().to_string_lossy());
                let _ = std::fs::copy(entry.path(), dir.join(name));
            }
        }
    }
}
