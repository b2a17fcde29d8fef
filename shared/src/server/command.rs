//! The command line both services share: `serve` (the default, so the bare binary serves) and
//! `migrate`. Each service brings its own serve configuration, name and description.

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

/// `<service> [serve] [flags]` or `<service> migrate --database-url ...`.
#[derive(Debug, Parser)]
#[command(version, args_conflicts_with_subcommands = true)]
pub struct ServiceCli<S: Args> {
    #[command(subcommand)]
    command: Option<ServiceCommand<S>>,
    #[command(flatten)]
    serve: S,
}

#[derive(Debug, Subcommand)]
pub enum ServiceCommand<S: Args> {
    /// Serve the HTTP API (the default).
    Serve(Box<S>),
    /// Apply pending database migrations and exit.
    Migrate(MigrateArgs),
}

#[derive(Debug, Clone, Args)]
pub struct MigrateArgs {
    /// PostgreSQL URL of the service's database.
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: String,
}

impl<S: Args> ServiceCli<S> {
    /// Parses the process's arguments under the service's `name` and one-line `about`, exiting
    /// with clap's message (and status) on `--help`, `--version` or an error.
    pub fn parse_as(name: &'static str, about: &'static str) -> ServiceCommand<S> {
        Self::parse_from_as(name, about, std::env::args_os())
    }

    /// [`parse_as`](Self::parse_as) over the given arguments.
    pub fn parse_from_as<I, T>(
        name: &'static str,
        about: &'static str,
        args: I,
    ) -> ServiceCommand<S>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        Self::try_parse_from_as(name, about, args).unwrap_or_else(|err| err.exit())
    }

    /// [`parse_from_as`](Self::parse_from_as), returning clap's refusal (which names the
    /// environment variable of the value it refused) instead of exiting with it.
    pub fn try_parse_from_as<I, T>(
        name: &'static str,
        about: &'static str,
        args: I,
    ) -> Result<ServiceCommand<S>, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let mut matches = crate::flags::values_named_by_env(Self::command())
            .name(name)
            .bin_name(name)
            .about(about)
            .try_get_matches_from(args)?;
        let cli = Self::from_arg_matches_mut(&mut matches)?;
        Ok(cli
            .command
            .unwrap_or_else(|| ServiceCommand::Serve(Box::new(cli.serve))))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Args)]
    struct Serve {
        #[arg(long, default_value_t = 1)]
        size: u32,
    }

    fn parse(args: &[&str]) -> ServiceCommand<Serve> {
        ServiceCli::<Serve>::parse_from_as("svc", "a service", args)
    }

    #[test]
    fn bare_flags_serve_and_migrate_is_a_subcommand() {
        assert!(matches!(parse(&["svc", "--size", "3"]), ServiceCommand::Serve(s) if s.size == 3));
        assert!(
            matches!(parse(&["svc", "serve", "--size", "4"]), ServiceCommand::Serve(s) if s.size == 4)
        );
        assert!(matches!(
            parse(&["svc", "migrate", "--database-url", "postgres://x"]),
            ServiceCommand::Migrate(m) if m.database_url == "postgres://x"
        ));
    }

    #[test]
    fn help_names_the_service() {
        let help = ServiceCli::<Serve>::command()
            .name("svc")
            .about("a service")
            .render_help()
            .to_string();
        assert!(help.contains("a service"), "{help}");
        assert!(help.contains("migrate"), "{help}");
    }
}
