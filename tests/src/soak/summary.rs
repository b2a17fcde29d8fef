//! What a soak did and found, and how it reads for a person.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::{Fault, SoakOptions};
use crate::checker::Report;

/// What a soak did and found.
#[derive(Debug)]
pub struct Summary {
    pub seed: u64,
    pub options: SoakOptions,
    /// Faults injected, by kind.
    pub faults: BTreeMap<Fault, usize>,
    /// Faults the stack did not recover from (a process that would not come back, ...).
    pub fault_errors: Vec<String>,
    /// Tasks the producer's requests created (the generator's are in the report).
    pub produced: usize,
    /// Tasks the exec worker (a shell command per task) completed.
    pub by_exec: usize,
    /// Tasks whose creation was acknowledged but that are not in the table: lost.
    pub lost: Vec<i64>,
    /// How long the stack took to finish every task once the faults stopped, if it did.
    pub drained_in: Option<Duration>,
    /// What the tasks table held when a drain ran out.
    pub left: Option<String>,
    pub report: Report,
    /// On a formation: the ledger's findings and each fault's cost.
    pub failover: Option<super::FailoverReport>,
    /// Where the services' logs are.
    pub log_dir: String,
    /// A failed run on a formation: what its keepers did and which node each service session
    /// wrote to, in time order (CI shows a failed test's output, not its logs).
    pub story: Vec<String>,
}

impl Summary {
    pub fn faults_total(&self) -> usize {
        self.faults.values().sum()
    }

    /// No violation, every task finished, every fault recovered from.
    pub fn passed(&self) -> bool {
        self.report.violations.is_empty()
            && self.lost.is_empty()
            && self.fault_errors.is_empty()
            && self.drained_in.is_some()
            && self
                .failover
                .as_ref()
                .is_none_or(|failover| failover.missing.is_empty())
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.passed() { "PASSED" } else { "FAILED" };
        writeln!(
            f,
            "soak {verdict}: seed {} ({:?} of faults; replay with --seed {} or SOAK_SEED={})",
            self.seed, self.options.duration, self.seed, self.seed
        )?;
        writeln!(f, "faults injected: {}", self.faults_total())?;
        for (fault, count) in &self.faults {
            writeln!(f, "  {:<28} {count:>5}", format!("{fault:?}"))?;
        }
        for error in &self.fault_errors {
            writeln!(f, "  not recovered: {error}")?;
        }
        let statuses: Vec<String> = self
            .report
            .tasks_by_status
            .iter()
            .map(|(status, count)| format!("{status} {count}"))
            .collect();
        writeln!(
            f,
            "tasks: {} ({} generated, {} from the producer); {}",
            self.report.tasks,
            self.report.generated_tasks,
            self.produced,
            statuses.join(", ")
        )?;
        writeln!(
            f,
            "the exec worker's shell command completed {} of them",
            self.by_exec
        )?;
        if self.lost.is_empty() {
            writeln!(f, "every acknowledged create is in the table")?;
        } else {
            writeln!(
                f,
                "LOST: {} acknowledged tasks are missing: {:?}",
                self.lost.len(),
                self.lost
            )?;
        }
        match self.drained_in {
            Some(took) => writeln!(f, "drained {took:.1?} after the faults stopped")?,
            None => writeln!(
                f,
                "NOT drained after the faults stopped (no task ended for {:?}, or the drain \
                 outlasted the faults): {}",
                self.options.drain_timeout,
                self.left.as_deref().unwrap_or("(nothing read)")
            )?,
        }
        if !self.story.is_empty() {
            writeln!(
                f,
                "the formation's story (keepers' transitions, services' sessions):"
            )?;
            for line in &self.story {
                writeln!(f, "  {line}")?;
            }
        }
        if let Some(failover) = &self.failover {
            write!(f, "{failover}")?;
        }
        writeln!(f, "invariants:")?;
        write!(f, "{}", self.report)?;
        writeln!(f, "service logs: {}", self.log_dir)
    }
}
