//! Listing pages: `limit`, `order` and `cursor` parsed once, and a page answered as the sample's
//! pages read it (`{"<name>": [...], "nextCursor": ...}`, also in `X-Next-Cursor` and `Link`).

use actix_web::{HttpRequest, HttpResponse};
use serde::Serialize;

use super::error::ApiError;
use crate::api::ErrorCode;

/// Page size when a listing names no `limit`, and the most one page may hold.
pub const DEFAULT_PAGE: i64 = 100;
pub const MAX_PAGE: i64 = 1000;

/// Which end of a listing comes first. Oldest first (id order) is the sample's and the default;
/// `order=desc` gives newest first, as an operator reading recent work wants.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Order {
    #[default]
    Asc,
    Desc,
}

impl Order {
    /// The SQL for this order over `id`, and the comparison that continues after `cursor`.
    pub fn sql(self) -> (&'static str, &'static str) {
        match self {
            Order::Asc => ("ORDER BY id", ">"),
            Order::Desc => ("ORDER BY id DESC", "<"),
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Order::Asc => "asc",
            Order::Desc => "desc",
        }
    }
}

/// The most digits of an id cursor: 10^18 ids are more than any table here will hold.
pub const CURSOR_DIGITS: usize = 18;

/// A listing page's size, order and position, parsed from `limit`, `order` and `cursor`. The
/// cursor is the last id of the previous page; the next page continues past it in the same order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page {
    pub limit: i64,
    pub order: Order,
    /// The previous page's last id; `None` for the first page.
    pub cursor: Option<i64>,
}

impl Page {
    /// `limit` defaults to [`DEFAULT_PAGE`] and is capped at [`MAX_PAGE`]; below 1 it is refused.
    pub fn parse(
        limit: Option<i64>,
        cursor: Option<&str>,
        order: Option<Order>,
    ) -> Result<Self, ApiError> {
        let limit = parse_limit(limit)?;
        let cursor = match cursor {
            None | Some("") => None,
            // Digits only (no sign, at most 18: every id fits), as the documents state it.
            Some(cursor)
                if cursor.len() <= CURSOR_DIGITS && cursor.bytes().all(|b| b.is_ascii_digit()) =>
            {
                Some(cursor.parse::<i64>().map_err(|_| invalid_cursor())?)
            }
            Some(_) => return Err(invalid_cursor()),
        };
        Ok(Self {
            limit,
            order: order.unwrap_or_default(),
            cursor,
        })
    }

    /// The id this page continues past: the cursor, or the start of the listing in its order.
    pub fn past_id(self) -> i64 {
        self.cursor.unwrap_or(match self.order {
            Order::Asc => 0,
            Order::Desc => i64::MAX,
        })
    }

    /// How many rows to fetch: one more than the page, to know whether another page follows.
    pub fn fetch(self) -> i64 {
        self.limit + 1
    }

    /// Answers `rows` (fetched with [`Page::fetch`]) as `{"<key>": [...], "nextCursor": ...}`:
    /// the sample's pages read the listing under its key (`data.leases`, `data.tasks`), and the
    /// cursor of the next page travels beside it (`null` on the last page), also in
    /// `X-Next-Cursor` and `Link: <...>; rel="next"`. `cut` says the rows stop short of the
    /// page for another reason (a size bound), so another page follows. `query` holds the other
    /// query parameters to carry into the link.
    pub fn respond<T: Serialize>(
        self,
        request: &HttpRequest,
        key: &str,
        rows: Vec<T>,
        cut: bool,
        id_of: impl Fn(&T) -> i64,
        query: &[(&str, Option<&str>)],
    ) -> HttpResponse {
        self.respond_beside(
            request,
            (key, rows),
            cut,
            id_of,
            query,
            serde_json::Map::new(),
        )
    }

    /// [`Page::respond`] with more fields in the answer, beside the rows and the cursor: what
    /// a reader needs to read the rows by (the clock they were judged by, say).
    pub fn respond_beside<T: Serialize>(
        self,
        request: &HttpRequest,
        (key, mut rows): (&str, Vec<T>),
        cut: bool,
        id_of: impl Fn(&T) -> i64,
        query: &[(&str, Option<&str>)],
        body: serde_json::Map<String, serde_json::Value>,
    ) -> HttpResponse {
        let limit = usize::try_from(self.limit).unwrap_or(usize::MAX);
        let more = rows.len() > limit || cut;
        rows.truncate(limit);
        let next = rows
            .last()
            .filter(|_| more)
            .map(|row| id_of(row).to_string());
        answer(
            request,
            (key, &rows),
            next,
            self.limit,
            self.order,
            query,
            body,
        )
    }
}

/// A listing page ordered by a name rather than an id (the queues): `limit` and `order` as
/// [`Page`]'s; the cursor is the previous page's last name, percent-encoded, so that any name
/// travels in a header and a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamePage {
    pub limit: i64,
    pub order: Order,
    /// The previous page's last name; `None` for the first page.
    pub cursor: Option<String>,
}

impl NamePage {
    /// As [`Page::parse`]; a cursor that does not decode to a name is refused.
    pub fn parse(
        limit: Option<i64>,
        cursor: Option<&str>,
        order: Option<Order>,
    ) -> Result<Self, ApiError> {
        let cursor = match cursor {
            None | Some("") => None,
            Some(cursor) => Some(
                crate::percent::decode(cursor)
                    .filter(|name| !name.chars().any(char::is_control))
                    .ok_or_else(invalid_cursor)?,
            ),
        };
        Ok(Self {
            limit: parse_limit(limit)?,
            order: order.unwrap_or_default(),
            cursor,
        })
    }

    /// How many names to fetch: one more than the page, to know whether another page follows.
    pub fn fetch(&self) -> i64 {
        self.limit + 1
    }

    /// Answers `rows` as [`Page::respond`] does, the cursor of the next page being the last
    /// row's name. `more` says another page follows.
    pub fn respond<T: Serialize>(
        &self,
        request: &HttpRequest,
        key: &str,
        mut rows: Vec<T>,
        more: bool,
        name_of: impl Fn(&T) -> &str,
        query: &[(&str, Option<&str>)],
    ) -> HttpResponse {
        let limit = usize::try_from(self.limit).unwrap_or(usize::MAX);
        let more = rows.len() > limit || more;
        rows.truncate(limit);
        let next = rows
            .last()
            .filter(|_| more)
            .map(|row| crate::percent::encode(name_of(row)));
        answer(
            request,
            (key, &rows),
            next,
            self.limit,
            self.order,
            query,
            serde_json::Map::new(),
        )
    }

    /// Answers a page whose rows are keyed by name (a map, as the counts per queue are) beside
    /// `body`'s fields; `last` is the page's last name when another page follows, the next
    /// page's cursor.
    pub fn respond_keyed<T: Serialize>(
        &self,
        request: &HttpRequest,
        (key, rows): (&str, &T),
        last: Option<&str>,
        query: &[(&str, Option<&str>)],
        body: serde_json::Map<String, serde_json::Value>,
    ) -> HttpResponse {
        answer(
            request,
            (key, rows),
            last.map(crate::percent::encode),
            self.limit,
            self.order,
            query,
            body,
        )
    }
}

/// `limit` defaults to [`DEFAULT_PAGE`] and is capped at [`MAX_PAGE`]; below 1 it is refused.
fn parse_limit(limit: Option<i64>) -> Result<i64, ApiError> {
    match limit {
        None => Ok(DEFAULT_PAGE),
        Some(limit) if limit >= 1 => Ok(limit.min(MAX_PAGE)),
        Some(limit) => Err(ApiError::invalid(
            ErrorCode::InvalidLimit,
            "limit",
            format!("limit must be at least 1, got {limit}"),
        )),
    }
}

fn invalid_cursor() -> ApiError {
    ApiError::invalid(
        ErrorCode::InvalidCursor,
        "cursor",
        "cursor is not one this service gave",
    )
}

/// `{"<key>": rows, "nextCursor": next}`, with `next` also in `X-Next-Cursor` and `Link`.
fn answer<T: Serialize + ?Sized>(
    request: &HttpRequest,
    (key, rows): (&str, &T),
    next: Option<String>,
    limit: i64,
    order: Order,
    query: &[(&str, Option<&str>)],
    mut body: serde_json::Map<String, serde_json::Value>,
) -> HttpResponse {
    let mut response = HttpResponse::Ok();
    if let Some(next) = &next {
        // Encoded again: a name's cursor holds `%`, which the link's reader decodes once.
        let mut link = format!(
            "{}?cursor={}&limit={limit}",
            request.path(),
            crate::percent::encode(next)
        );
        if order != Order::Asc {
            link.push_str(&format!("&order={}", order.as_str()));
        }
        for (name, value) in query {
            if let Some(value) = value {
                link.push_str(&format!("&{name}={}", crate::percent::encode(value)));
            }
        }
        response.insert_header(("X-Next-Cursor", next.clone()));
        response.insert_header(("Link", format!("<{link}>; rel=\"next\"")));
    }
    body.insert(
        key.to_owned(),
        serde_json::to_value(rows).unwrap_or_default(),
    );
    body.insert(
        "nextCursor".to_owned(),
        next.map_or(serde_json::Value::Null, serde_json::Value::String),
    );
    response.json(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_limits_default_cap_and_refuse() {
        assert_eq!(
            Page::parse(None, None, None).ok(),
            Some(Page {
                limit: 100,
                order: Order::Asc,
                cursor: None
            })
        );
        assert_eq!(
            Page::parse(Some(5000), Some("42"), Some(Order::Desc)).ok(),
            Some(Page {
                limit: 1000,
                order: Order::Desc,
                cursor: Some(42)
            })
        );
        assert!(Page::parse(Some(0), None, None).is_err());
        assert!(Page::parse(None, Some("-1"), None).is_err());
        assert!(Page::parse(None, Some("abc"), None).is_err());
    }

    #[test]
    fn a_name_cursor_is_a_percent_encoded_name() {
        let page = NamePage::parse(Some(5), Some("mail%20b%25"), Some(Order::Desc)).ok();
        assert_eq!(
            page,
            Some(NamePage {
                limit: 5,
                order: Order::Desc,
                cursor: Some("mail b%".to_owned())
            })
        );
        assert_eq!(
            NamePage::parse(None, Some(""), None)
                .ok()
                .map(|page| page.cursor),
            Some(None)
        );
        for bad in ["%", "%4", "%zz", "%00", "%FF"] {
            assert!(NamePage::parse(None, Some(bad), None).is_err(), "{bad}");
        }
        assert!(NamePage::parse(Some(0), None, None).is_err());
    }
}
