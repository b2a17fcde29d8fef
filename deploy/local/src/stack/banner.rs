//! The ready banner printed once every service answers. It is separate because it is output
//! that people and the black-box tests read ([`READY_BANNER`] is its first line), so its exact
//! text is a contract best kept where it cannot be changed by accident while editing the
//! process handling.

use crate::postgres::redact_url;

use super::config::StackConfig;
use super::{
    CLI_BINARY, DATABASES, DEFAULT_LEASE_SERVICE_PORT, DEFAULT_TASK_SERVICE_PORT,
    GENERATOR_DEFAULT_RATE_PER_SECOND, GENERATOR_DEFAULT_SLEEP_SECONDS, READY_BANNER, Stack,
};

impl Stack {
    #[allow(clippy::print_stdout)] // The point of this function.
    pub(super) fn print_summary(&self, config: &StackConfig) {
        let mut text = format!("\n{READY_BANNER}\n");
        match (&self.postgres, &config.database_url) {
            (Some(pg), _) => {
                text.push_str(&format!(
                    "  {:<16} {}  (data {}, log {})\n",
                    "PostgreSQL",
                    pg.url(""),
                    pg.data_dir().display(),
                    pg.log_path().display()
                ));
                for database in DATABASES {
                    text.push_str(&format!("  {:<16} {}\n", "", pg.url(database)));
                }
            }
            (None, Some(url)) => {
                text.push_str(&format!(
                    "  {:<16} {}  (DATABASE_URL)\n",
                    "PostgreSQL",
                    redact_url(url)
                ));
            }
            (None, None) => {}
        }
        if let Some(formation) = &self.formation {
            text.push_str(&format!(
                "  {:<16} pg_auto_failover formation, nodes on ports {}\n",
                "PostgreSQL (HA)",
                (0..formation.node_count())
                    .map(|i| formation.node_port(i).to_string())
                    .collect::<Vec<_>>()
                    .join(" and ")
            ));
            for database in DATABASES {
                text.push_str(&format!("  {:<16} {}\n", "", formation.url(database)));
            }
            text.push_str(&format!(
                "  {:<16} {}\n",
                "fail over with",
                formation.failover_command()
            ));
        }
        for endpoint in &self.endpoints {
            text.push_str(&format!("  {:<16} {}\n", endpoint.label, endpoint.url));
        }
        text.push_str(&format!(
            "  {:<16} http://127.0.0.1:{}/dashboard  (open it in a browser)\n",
            "dashboard", config.task_service_port
        ));
        // The CLI's defaults are the default ports; other ports need its URLs.
        let mut cli = String::new();
        if config.lease_service_port != DEFAULT_LEASE_SERVICE_PORT {
            cli.push_str(&format!(
                "LEASE_SERVICE_URL=http://127.0.0.1:{} ",
                config.lease_service_port
            ));
        }
        if config.task_service_port != DEFAULT_TASK_SERVICE_PORT {
            cli.push_str(&format!(
                "TASK_SERVICE_URL=http://127.0.0.1:{} ",
                config.task_service_port
            ));
        }
        text.push_str(&format!(
            "  {:<16} {cli}{} tasks list\n",
            "CLI",
            self.bin_dir.join(CLI_BINARY).display()
        ));
        let (shortest, longest) = GENERATOR_DEFAULT_SLEEP_SECONDS;
        text.push_str(&format!(
            "  {:<16} {} × {} slots; a started generator makes {} task/s of {}–{} s sleeps \
             (curl -X POST http://127.0.0.1:{}/api/generator/start)\n",
            "work",
            config.workers,
            config.worker_concurrency,
            GENERATOR_DEFAULT_RATE_PER_SECOND,
            shortest,
            longest,
            config.task_service_port
        ));
        for running in &self.children {
            if !self.endpoints.iter().any(|e| e.label == running.label) {
                text.push_str(&format!(
                    "  {:<16} (pid {})\n",
                    running.label,
                    running.child.id()
                ));
            }
        }
        text.push_str("Ctrl-C to stop.\n");
        println!("{text}");
    }
}
