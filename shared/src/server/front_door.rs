//! The front door both services share: what a request must be before any route sees it. A web
//! page of another origin may not write (nor get a CORS preflight answered) unless
//! `CORS_ALLOWED_ORIGINS` names it; a write's body must say it is JSON; a query string may not
//! carry NUL. And the last line of "every error is JSON": answers actix-web makes itself are
//! made again as `{error, code}`.

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{StatusCode, header};
use actix_web::middleware::Next;
use actix_web::{HttpResponse, ResponseError, web};

use super::body::{BodyLimit, BodyTimedOut};
use super::error::ApiError;
use crate::api::ErrorCode;

/// The origins other than its own whose web pages may call a service from a browser
/// (`CORS_ALLOWED_ORIGINS`): none unless configured. A web page of any other origin can still
/// send a browser to the service, but its writes are refused (403 `origin_not_allowed`), its
/// preflights too, and it cannot read the answers of its reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedOrigins {
    any: bool,
    /// `scheme://host[:port]`, lower case, without a default port.
    origins: Vec<String>,
}

impl AllowedOrigins {
    /// Comma-separated origins (`https://ops.example.com,http://localhost:3000`), or `*` for
    /// any; empty for none.
    pub fn parse(text: &str) -> Result<AllowedOrigins, String> {
        let mut allowed = AllowedOrigins::default();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            if entry == "*" {
                allowed.any = true;
                continue;
            }
            let origin = normalise_origin(entry).ok_or_else(|| {
                format!(
                    "{entry:?} is not an origin: write scheme://host[:port], e.g. https://ops.example.com"
                )
            })?;
            allowed.origins.push(origin);
        }
        Ok(allowed)
    }

    fn allows(&self, origin: &str) -> bool {
        self.any || normalise_origin(origin).is_some_and(|origin| self.origins.contains(&origin))
    }
}

/// `scheme://host[:port]` in lower case without its scheme's default port, or `None` when
/// `text` is not an http(s) origin (`null`, a path, a user name, ...).
fn normalise_origin(text: &str) -> Option<String> {
    let text = text.trim().trim_end_matches('/').to_ascii_lowercase();
    let (scheme, authority) = text.split_once("://")?;
    let default_port = match scheme {
        "http" => ":80",
        "https" => ":443",
        _ => return None,
    };
    let valid = |c: char| c.is_ascii_alphanumeric() || "-._:[]".contains(c);
    if authority.is_empty() || !authority.chars().all(valid) {
        return None;
    }
    let authority = authority.strip_suffix(default_port).unwrap_or(authority);
    Some(format!("{scheme}://{authority}"))
}

/// Where a browser request comes from, by its `Origin` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Provenance {
    /// No `Origin`: not a browser's cross-origin request (curl, the services' own clients, a
    /// page's own GETs).
    Unmarked,
    /// A page of the service's own origin (the dashboard).
    SameOrigin,
    /// A page of an origin `CORS_ALLOWED_ORIGINS` names.
    Allowed,
    /// A page of any other origin.
    Foreign,
}

fn provenance(request: &ServiceRequest) -> Provenance {
    let Some(origin) = request.headers().get(header::ORIGIN) else {
        return Provenance::Unmarked;
    };
    // A browser says so itself when a page writes to its own origin, and no page can forge the
    // header; it holds where the browser sends `Origin: null` (a page served with
    // `Referrer-Policy: no-referrer`, as hardening proxies add).
    if request
        .headers()
        .get("sec-fetch-site")
        .is_some_and(|site| site == "same-origin")
    {
        return Provenance::SameOrigin;
    }
    let origin = origin.to_str().unwrap_or_default();
    // The host the browser addressed (proxies' X-Forwarded-Host included); the scheme is left
    // out, as a TLS-terminating proxy may hide it.
    let own = format!("http://{}", request.connection_info().host());
    let authority = |origin: &str| {
        normalise_origin(origin).map(|o| {
            let (_, authority) = o.split_once("://").unwrap_or_default();
            authority
                .trim_end_matches(":80")
                .trim_end_matches(":443")
                .to_owned()
        })
    };
    if authority(origin).is_some_and(|theirs| Some(theirs) == authority(&own)) {
        return Provenance::SameOrigin;
    }
    let allowed = request
        .app_data::<web::Data<AllowedOrigins>>()
        .is_some_and(|allowed| allowed.allows(origin));
    if allowed {
        Provenance::Allowed
    } else {
        Provenance::Foreign
    }
}

/// Whether `method` changes anything (every route but a read).
fn is_write(method: &actix_web::http::Method) -> bool {
    use actix_web::http::Method;
    [Method::POST, Method::PUT, Method::DELETE, Method::PATCH].contains(method)
}

/// Whether the request says it carries a body.
fn carries_body(request: &ServiceRequest) -> bool {
    let headers = request.headers();
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .and_then(|length| length.to_str().ok())
            .and_then(|length| length.trim().parse::<u64>().ok())
            .is_some_and(|length| length > 0)
}

/// `application/json`, or a `+json` type, with any parameters.
fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// Why the front door turns `request` away, if it does.
fn refusal(request: &ServiceRequest, provenance: Provenance) -> Option<ApiError> {
    let write = is_write(request.method());
    if write && provenance == Provenance::Foreign {
        return Some(ApiError::OriginNotAllowed(format!(
            "a web page of another origin ({}) may not write to this service; CORS_ALLOWED_ORIGINS names those that may",
            request
                .headers()
                .get(header::ORIGIN)
                .and_then(|o| o.to_str().ok())
                .unwrap_or("unreadable")
        )));
    }
    // A body that is not declared JSON is refused rather than parsed as JSON: a web page can
    // send text/plain and form bodies anywhere without asking (no preflight). A body-less write
    // (the sample's generator start and stop, a cancel) needs no content type.
    if write && carries_body(request) {
        let content_type = request
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|value| value.to_str().unwrap_or("unreadable"));
        if !content_type.is_some_and(is_json) {
            return Some(ApiError::UnsupportedMediaType);
        }
    }
    // A path segment names a queue, a schedule, a lease's resource: text. actix decodes bytes
    // that are not UTF-8 lossily, so `%FF%FE` and `%FE%FF` would both land on the queue "��".
    if !path_is_text(request.path()) {
        return Some(ApiError::Invalid {
            code: ErrorCode::InvalidPath,
            field: None,
            message: "the path must percent-decode to UTF-8 text without NUL characters".to_owned(),
        });
    }
    // PostgreSQL text cannot hold NUL, and no parameter of any route has a use for it.
    if request.query_string().contains("%00") {
        return Some(ApiError::Invalid {
            code: ErrorCode::InvalidQuery,
            field: None,
            message: "the query string must not contain NUL characters (%00)".to_owned(),
        });
    }
    None
}

/// Whether the raw (still percent-encoded) `path` decodes to UTF-8 without NUL. An escape that
/// is not two hex digits is left as it is, as actix leaves it.
fn path_is_text(path: &str) -> bool {
    if !path.contains('%') {
        return true;
    }
    let raw = path.as_bytes();
    let mut decoded = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        if raw[i] == b'%'
            && let (Some(high), Some(low)) = (
                raw.get(i + 1).copied().and_then(hex),
                raw.get(i + 2).copied().and_then(hex),
            )
        {
            // Two hex digits make one byte.
            decoded.push(u8::try_from(high * 16 + low).unwrap_or(0));
            i += 3;
        } else {
            decoded.push(raw[i]);
            i += 1;
        }
    }
    !decoded.contains(&0) && std::str::from_utf8(&decoded).is_ok()
}

/// The answer to an allowed CORS preflight: the methods and headers the API uses.
fn preflight(origin: &header::HeaderValue) -> HttpResponse {
    HttpResponse::NoContent()
        .insert_header((header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone()))
        .insert_header((
            header::ACCESS_CONTROL_ALLOW_METHODS,
            "GET, POST, PUT, DELETE",
        ))
        .insert_header((
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            "authorization, content-type, traceparent, tracestate",
        ))
        .insert_header((header::ACCESS_CONTROL_MAX_AGE, "600"))
        .insert_header((
            header::VARY,
            "Origin, Access-Control-Request-Method, Access-Control-Request-Headers",
        ))
        .finish()
}

/// Middleware: what reaches the routes. A browser's request from a web page of another origin
/// may write only if `CORS_ALLOWED_ORIGINS` names that origin, and its CORS preflight is
/// answered accordingly (allowed: 204 with the CORS headers; otherwise 403 JSON and no
/// `Access-Control-Allow-Origin`). A write's body must be declared JSON (415 otherwise). A
/// query string may not carry NUL. Needs `web::Data<AllowedOrigins>` in the app data to allow
/// any other origin.
pub async fn front_door(
    request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    let provenance = provenance(&request);
    let origin = request.headers().get(header::ORIGIN).cloned();
    if request.method() == actix_web::http::Method::OPTIONS
        && request
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
        && let Some(origin) = &origin
    {
        let answer = match provenance {
            Provenance::Allowed | Provenance::SameOrigin => preflight(origin),
            Provenance::Foreign | Provenance::Unmarked => ApiError::OriginNotAllowed(format!(
                "web pages of {} may not call this service; CORS_ALLOWED_ORIGINS names the origins that may",
                origin.to_str().unwrap_or("that origin")
            ))
            .error_response(),
        };
        return Ok(request.into_response(answer).map_into_right_body());
    }
    if let Some(refused) = refusal(&request, provenance) {
        let mut answer = refused.error_response();
        if carries_body(&request) {
            // The unread body must not be taken for the next request on this connection.
            answer
                .head_mut()
                .set_connection_type(actix_web::http::ConnectionType::Close);
        }
        return Ok(request.into_response(answer).map_into_right_body());
    }
    let mut response = next.call(request).await?;
    if let (Provenance::Allowed, Some(origin)) = (provenance, origin) {
        let headers = response.headers_mut();
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        headers.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            header::HeaderValue::from_static("x-next-cursor, link, www-authenticate"),
        );
        headers.append(header::VARY, header::HeaderValue::from_static("Origin"));
    }
    Ok(response.map_into_left_body())
}

/// Middleware: the last line of "every error is JSON `{error, code}`". Answers that actix-web
/// makes itself (an extractor without an error handler, a body past its limit or too slow, a
/// missing piece of app data) are plain text; each is answered again in JSON with its status
/// (or, for a body too slow, 408 like the JSON extractor's).
pub async fn json_errors(
    request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    let response = match next.call(request).await {
        Ok(response) => response,
        Err(err) => {
            let answer = as_json(Some(&err), err.as_response_error().status_code(), None);
            return Err(actix_web::error::InternalError::from_response(err, answer).into());
        }
    };
    let status = response.status();
    let json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(is_json);
    if !(status.is_client_error() || status.is_server_error()) || json {
        return Ok(response.map_into_left_body());
    }
    let limit = response
        .request()
        .app_data::<BodyLimit>()
        .map(|limit| limit.0);
    let answer = as_json(response.response().error(), status, limit);
    let (request, _) = response.into_parts();
    Ok(ServiceResponse::new(request, answer).map_into_right_body())
}

/// The JSON answer for an error actix-web answered (`err`, if it kept it) with `status`.
fn as_json(
    err: Option<&actix_web::Error>,
    status: StatusCode,
    limit: Option<usize>,
) -> HttpResponse {
    use actix_web::error::PayloadError;
    if let Some(payload) = err.and_then(|err| err.as_error::<PayloadError>()) {
        let known = match payload {
            PayloadError::Overflow => Some(ApiError::PayloadTooLarge {
                limit: limit.unwrap_or_default(),
            }),
            PayloadError::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => {
                Some(ApiError::BodyTimeout {
                    timeout_ms: io
                        .get_ref()
                        .and_then(|inner| inner.downcast_ref::<BodyTimedOut>())
                        .map_or(0, |late| late.0.as_millis()),
                })
            }
            _ => None,
        };
        if let Some(known) = known {
            return known.error_response();
        }
    }
    let code = match status.as_u16() {
        401 => ErrorCode::Unauthorized,
        403 => ErrorCode::Forbidden,
        404 => ErrorCode::NotFound,
        405 => ErrorCode::MethodNotAllowed,
        408 => ErrorCode::RequestTimeout,
        411 => ErrorCode::LengthRequired,
        413 => ErrorCode::PayloadTooLarge,
        414 => ErrorCode::UriTooLong,
        415 => ErrorCode::UnsupportedMediaType,
        431 => ErrorCode::HeadersTooLarge,
        503 => ErrorCode::Unavailable,
        500..=599 => ErrorCode::Internal,
        _ => ErrorCode::BadRequest,
    };
    let message = err.map_or_else(
        || status.canonical_reason().unwrap_or("error").to_owned(),
        ToString::to_string,
    );
    if status.is_server_error() {
        tracing::error!(%status, error = %message, "answered an error outside the API's errors");
    }
    let mut answer = HttpResponse::build(status);
    if status == StatusCode::REQUEST_TIMEOUT {
        answer.force_close();
    }
    answer.json(crate::api::ErrorBody::new(code, message))
}

#[cfg(test)]
mod path_tests {
    use super::path_is_text;

    #[test]
    fn a_path_is_text_when_its_escapes_decode_to_utf8_without_nul() {
        for path in [
            "/api/queues/mail",
            "/api/queues/%C3%A9t%C3%A9",
            "/a/%zz",
            "/a/%4",
            "/a%2Fb",
        ] {
            assert!(path_is_text(path), "{path}");
        }
        for path in [
            "/api/queues/%FF%FE/pause",
            "/api/queues/%C3",
            "/a/%00",
            "/a/%c3%28",
        ] {
            assert!(!path_is_text(path), "{path}");
        }
    }
}
