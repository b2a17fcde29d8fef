//! Small async helpers that talk to a PostgreSQL server through diesel-async.

use diesel::sql_types::{Bool, Text};
use diesel_async::{AsyncConnection as _, AsyncPgConnection, RunQueryDsl as _};

use super::error::PgError;

/// Connects to `url` and runs `SELECT 1`.
pub async fn ping(url: &str) -> Result<(), PgError> {
    let mut conn = connect(url).await?;
    diesel::sql_query("SELECT 1")
        .execute(&mut conn)
        .await
        .map_err(|source| PgError::Query {
            what: "SELECT 1".to_owned(),
            url: redact_url(url),
            source,
        })?;
    Ok(())
}

/// Connects to `url`, runs `SELECT 1` and returns the server's data
/// directory (requires a superuser or `pg_read_all_settings`).
pub(crate) async fn probe_data_directory(url: &str) -> Result<String, PgError> {
    let mut conn = connect(url).await?;
    let query_error = |what: &str, source| PgError::Query {
        what: what.to_owned(),
        url: redact_url(url),
        source,
    };
    diesel::sql_query("SELECT 1")
        .execute(&mut conn)
        .await
        .map_err(|source| query_error("SELECT 1", source))?;
    diesel::sql_query("SELECT current_setting('data_directory') AS data_directory")
        // `load`, not `get_result`, as everywhere (clippy.toml): one row, read to the end.
        .load::<DataDirectory>(&mut conn)
        .await
        .and_then(|rows| {
            rows.into_iter()
                .next()
                .ok_or(diesel::result::Error::NotFound)
        })
        .map(|row| row.data_directory)
        .map_err(|source| query_error("SHOW data_directory", source))
}

/// Creates schema `name` in the database at `url`, unless it exists. `name` must match
/// `[a-z0-9_]+`.
pub async fn create_schema(url: &str, name: &str) -> Result<(), PgError> {
    validate_database_name(name)?;
    let mut conn = connect(url).await?;
    // The name was validated above, so quoting it is safe.
    let sql = format!("CREATE SCHEMA IF NOT EXISTS \"{name}\"");
    diesel::sql_query(&sql)
        .execute(&mut conn)
        .await
        .map_err(|source| PgError::Query {
            what: sql.clone(),
            url: redact_url(url),
            source,
        })?;
    Ok(())
}

/// Creates database `name` on the server reached through `server_url` (a URL
/// of any existing database on that server, usually `.../postgres`). Does
/// nothing if the database already exists, also when another process creates
/// it at the same moment.
///
/// `name` must match `[a-z0-9_]+` (at most 63 bytes).
pub async fn create_database_at(server_url: &str, name: &str) -> Result<(), PgError> {
    validate_database_name(name)?;
    let mut conn = connect(server_url).await?;
    if database_exists(&mut conn, server_url, name).await? {
        tracing::debug!(database = name, "database already exists");
        return Ok(());
    }
    // The name was validated above, so quoting it is safe.
    let created = diesel::sql_query(format!("CREATE DATABASE \"{name}\""))
        .execute(&mut conn)
        .await;
    match created {
        Ok(_) => {
            tracing::info!(database = name, "created database");
            Ok(())
        }
        // "already exists" (SQLSTATE 42P04) or a unique violation on
        // pg_database when someone else created it concurrently. diesel-async
        // does not expose SQLSTATE, so check for the database instead.
        Err(source) => {
            if database_exists(&mut conn, server_url, name).await? {
                Ok(())
            } else {
                Err(PgError::Query {
                    what: format!("CREATE DATABASE \"{name}\""),
                    url: redact_url(server_url),
                    source,
                })
            }
        }
    }
}

/// Accepts `[a-z0-9_]+`, at most 63 bytes (PostgreSQL's identifier limit).
pub fn validate_database_name(name: &str) -> Result<(), PgError> {
    let valid = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if valid {
        Ok(())
    } else {
        Err(PgError::InvalidDatabaseName(name.to_owned()))
    }
}

/// Hides the password of a `postgres://user:password@host/...` URL.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let Some(at) = authority.rfind('@') else {
        return url.to_owned();
    };
    match authority[..at].find(':') {
        Some(colon) => format!(
            "{}{}:***{}",
            &url[..scheme_end],
            &authority[..colon],
            &rest[at..]
        ),
        None => url.to_owned(),
    }
}

async fn connect(url: &str) -> Result<AsyncPgConnection, PgError> {
    AsyncPgConnection::establish(url)
        .await
        .map_err(|source| PgError::Connect {
            url: redact_url(url),
            source,
        })
}

#[derive(diesel::QueryableByName)]
struct Exists {
    #[diesel(sql_type = Bool)]
    exists: bool,
}

#[derive(diesel::QueryableByName)]
struct DataDirectory {
    #[diesel(sql_type = Text)]
    data_directory: String,
}

async fn database_exists(
    conn: &mut AsyncPgConnection,
    url: &str,
    name: &str,
) -> Result<bool, PgError> {
    diesel::sql_query("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1) AS exists")
        .bind::<Text, _>(name)
        .load::<Exists>(conn)
        .await
        .map(|rows| rows.iter().any(|row| row.exists))
        .map_err(|source| PgError::Query {
            what: "looking up pg_database".to_owned(),
            url: redact_url(url),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::{redact_url, validate_database_name};

    #[test]
    fn database_names() {
        assert!(validate_database_name("leasehold_leases").is_ok());
        assert!(validate_database_name("db2").is_ok());
        for bad in ["", "Leases", "a-b", "a\"b", "a b", &"x".repeat(64)] {
            assert!(validate_database_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact_url("postgres://u:secret@h:5432/db?x=1"),
            "postgres://u:***@h:5432/db?x=1"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("postgres://h/db"), "postgres://h/db");
    }
}
