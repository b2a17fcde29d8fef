//! Reading a closed set (an enum stored as one of a few words in a text column) from
//! PostgreSQL, for the wire types that are also rows ([`crate::tasks::TaskStatus`],
//! [`crate::schedules::CatchUp`]). Below both the wire types and the server plumbing, so that
//! neither imports the other for it.

use diesel::pg::Pg;

/// A closed set's value read from a text column: `parse` knows every word the column's CHECK
/// constraint allows, and one it does not know is an error naming `what`, never a guess.
pub fn from_sql<T>(
    value: diesel::pg::PgValue<'_>,
    what: &str,
    parse: impl FnOnce(&str) -> Option<T>,
) -> diesel::deserialize::Result<T> {
    let text =
        <String as diesel::deserialize::FromSql<diesel::sql_types::Text, Pg>>::from_sql(value)?;
    parse(&text).ok_or_else(|| format!("unknown {what} {text:?}").into())
}
