//! The worker binary: parses its configuration and runs the library with the work it names (a
//! command, a push, or the built-in sleep) until SIGTERM or SIGINT (then exits 0 after the
//! graceful shutdown).
//!
//! On one thread: the sleep handler waits and never computes, so all a worker does is I/O, and
//! a second runtime thread only hands each wake-up across threads. The bench's cost model
//! measured the multi-threaded runtime at twice the CPU per task (single claims: 324 → 171 ms
//! per 1,000 tasks; batched: 47 → 22). A handler that computes belongs in a program of its own
//! on the multi-threaded runtime (or `spawn_blocking`), as the library leaves that choice to it.

use leasehold_worker::Cli;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli: Cli = leasehold::flags::parse();
    // A command that cannot start or a push URL that does not parse stops the worker here,
    // with usage's exit status, rather than fail every task it claims.
    let handler = match cli.handler() {
        Ok(handler) => handler,
        Err(err) => {
            eprintln!("worker: {err}");
            std::process::exit(2);
        }
    };
    // Flushes buffered spans when main returns.
    let _telemetry = leasehold::telemetry::init("worker");
    leasehold_worker::run(cli.config, handler, leasehold::shutdown::signal()).await
}
