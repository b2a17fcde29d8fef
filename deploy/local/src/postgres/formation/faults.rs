//! What the failover tests do to a formation: a planned failover, a node killed with its
//! PostgreSQL, and a node started again.

use super::Formation;
use crate::postgres::server::run_checked;
use crate::postgres::{PgError, SUPERUSER};

impl Formation {
    /// `pg_autoctl perform failover`: the monitor has the secondary promoted and the primary
    /// demoted, and this waits for it.
    pub fn perform_failover(&self) -> Result<(), PgError> {
        let mut command = self.autoctl();
        command
            .args(["perform", "failover", "--wait", "60", "--pgdata"])
            .arg(&self.monitor.pgdata);
        run_checked(command, "pg_autoctl perform failover".to_owned()).map(|_| ())
    }

    /// The shell command a person runs to fail this formation over by hand.
    pub fn failover_command(&self) -> String {
        let user = if self.run_as.is_some() {
            format!("runuser -u {SUPERUSER} -- ")
        } else {
            String::new()
        };
        format!(
            "{user}env XDG_CONFIG_HOME={} XDG_DATA_HOME={} {} perform failover --pgdata {}",
            self.dir.join("config").display(),
            self.dir.join("share").display(),
            self.pg_autoctl.display(),
            self.monitor.pgdata.display()
        )
    }

    /// Starts node `index` again (after a kill), as its service manager would.
    pub fn restart(&mut self, index: usize) -> Result<(), PgError> {
        // The old tree, whatever is left of it, goes first.
        self.nodes[index].stop();
        let pgdata = self.nodes[index].pgdata.clone();
        let mut command = self.autoctl();
        command.arg("run").arg("--pgdata").arg(&pgdata);
        self.spawn(index, command)
    }

    /// Kills node `index`'s `pg_autoctl` and PostgreSQL, every process of it at once
    /// (`SIGKILL`), as a crash of its machine would.
    pub fn kill(&mut self, index: usize) {
        self.nodes[index].stop();
    }
}
