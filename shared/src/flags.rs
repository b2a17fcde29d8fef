//! Parsers for the binaries' flags, each given as a flag's `value_parser`, so that a setting's
//! name, default, bounds and help are written once, in its attribute, and clap names the flag
//! and its environment variable when it refuses a value. Whole numbers use clap's own ranged
//! parsers (`value_parser!(u64).range(..)`); these are the rest:
//!
//! - [`service_url`], the one check of a Leasehold service's address (`TASK_SERVICE_URL`,
//!   `LEASE_SERVICE_URL`): a base URL the clients append paths to. Services talk plain HTTP
//!   inside a deployment (TLS ends at the load balancer), so this build speaks only `http://`.
//! - [`float_within`], a number with fractions within a range.
//!
//! Every binary parses its command line with [`parse`], which names each flag's value after its
//! environment variable ([`values_named_by_env`]): a refusal then reads
//! `invalid value '70000' for '--max-clock-skew-ms <LEASE_MAX_CLOCK_SKEW_MS>'`, naming the
//! variable a deployment sets, not the field it lands in.

/// `raw` checked as a service's base URL: an `http://` URL with a host and no query or
/// fragment. It comes back without its trailing slashes, so that a path appended to it starts
/// with one. A flag's `value_parser`: clap names the flag and its variable when it refuses one.
pub fn service_url(raw: &str) -> Result<String, String> {
    let raw = raw.trim();
    let parsed = reqwest::Url::parse(raw).map_err(|err| format!("{raw:?} is not a URL: {err}"))?;
    if parsed.scheme() != "http" {
        return Err(format!(
            "{raw:?} must start with http:// (this build has no TLS)"
        ));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(format!("{raw:?} names no host"));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(format!("{raw:?} must not have a query or fragment"));
    }
    Ok(raw.trim_end_matches('/').to_owned())
}

/// Names each flag's value after its environment variable, in `command` and its subcommands.
#[cfg(feature = "flags")]
pub fn values_named_by_env(command: clap::Command) -> clap::Command {
    command
        .mut_args(|arg| {
            let env = arg.get_env().map(|env| env.to_string_lossy().into_owned());
            match env {
                Some(env) if arg.get_action().takes_values() => arg.value_name(env),
                _ => arg,
            }
        })
        .mut_subcommands(values_named_by_env)
}

/// Parses `P` from the process's arguments and environment with [`values_named_by_env`],
/// exiting with clap's message (and status) on `--help`, `--version` or an error.
#[cfg(feature = "flags")]
pub fn parse<P: clap::Parser>() -> P {
    parse_from(std::env::args_os())
}

/// [`parse`] over the given arguments.
#[cfg(feature = "flags")]
pub fn parse_from<P, I, T>(args: I) -> P
where
    P: clap::Parser,
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let mut matches = values_named_by_env(P::command()).get_matches_from(args);
    P::from_arg_matches_mut(&mut matches).unwrap_or_else(|err| err.exit())
}

/// A number within `range` (fractions allowed), as a flag's `value_parser`: clap has ranged
/// parsers for whole numbers only. The bound is then written once, in the flag's attribute.
pub fn float_within(
    range: std::ops::RangeInclusive<f64>,
) -> impl Fn(&str) -> Result<f64, String> + Clone + Send + Sync + 'static {
    move |raw| {
        let value: f64 = raw
            .trim()
            .parse()
            .map_err(|_| format!("{raw:?} is not a number"))?;
        if range.contains(&value) {
            Ok(value)
        } else {
            Err(format!(
                "{value} is not in {}..={}",
                range.start(),
                range.end()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::service_url;

    #[test]
    fn a_base_url_is_http_with_a_host_and_nothing_after_its_path() {
        assert_eq!(service_url(" http://a:1/ ").as_deref(), Ok("http://a:1"));
        assert_eq!(
            service_url("http://a/prefix//").as_deref(),
            Ok("http://a/prefix")
        );
        for (bad, says) in [
            ("not a url", "is not a URL"),
            ("", "is not a URL"),
            ("https://a", "http://"),
            ("ftp://a", "http://"),
            ("http://a/?x=1", "query"),
            ("http://a/#top", "fragment"),
        ] {
            let error = service_url(bad).unwrap_err();
            assert!(error.contains(says), "{bad:?}: {error}");
        }
    }

    /// A refused value is reported under the variable a deployment sets, which is not the
    /// field's name.
    #[cfg(feature = "flags")]
    #[test]
    fn a_refusal_names_the_environment_variable() {
        use clap::{CommandFactory as _, Parser};
        #[derive(Debug, Parser)]
        struct Cli {
            #[arg(long, env = "LEASE_MAX_CLOCK_SKEW_MS",
                  value_parser = clap::value_parser!(u32).range(0..=60_000))]
            max_clock_skew_ms: u32,
            #[arg(long, env = "SKIP_MIGRATIONS")]
            skip_migrations: bool,
        }
        let refusal = super::values_named_by_env(Cli::command())
            .try_get_matches_from(["service", "--max-clock-skew-ms", "70000"])
            .unwrap_err()
            .to_string();
        assert!(
            refusal.contains("<LEASE_MAX_CLOCK_SKEW_MS>") && refusal.contains("0..=60000"),
            "{refusal}"
        );
        let parsed: Cli =
            super::parse_from(["service", "--max-clock-skew-ms", "5", "--skip-migrations"]);
        assert_eq!(
            (parsed.max_clock_skew_ms, parsed.skip_migrations),
            (5, true)
        );
    }

    #[test]
    fn a_float_flag_is_a_number_within_its_range() {
        let parse = super::float_within(0.0..=1.0);
        assert_eq!(parse(" 0.5 "), Ok(0.5));
        assert_eq!(parse("1"), Ok(1.0));
        for bad in ["1.5", "-0.1", "NaN", "inf", "x", ""] {
            assert!(parse(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
