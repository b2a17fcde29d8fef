//! The `leasehold` binary: parses the command line and runs it.

use std::process::ExitCode;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli: leasehold_cli::Cli = leasehold::flags::parse();
    match leasehold_cli::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("leasehold: {err:#}");
            }
            ExitCode::from(leasehold_cli::Exit::of(&err) as u8)
        }
    }
}
