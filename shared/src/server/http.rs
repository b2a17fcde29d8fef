//! HTTP plumbing both services mount: extractor configuration whose failures are JSON 4xx
//! answers, fallbacks for unknown routes and methods, request metrics, cursor paging.

use std::time::Instant;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::error::{JsonPayloadError, PathError, QueryPayloadError};
use actix_web::http::{StatusCode, header};
use actix_web::middleware::Next;
use actix_web::{HttpRequest, HttpResponse, ResponseError, web};
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};
use serde::Serialize;

use super::error::ApiError;

/// Starts a service's HTTP server on `listener`: `configure` mounts its routes and state, with
/// request tracing, request metrics, trailing-slash normalisation, JSON 404s, the front door
/// ([`front_door`]: browsers' cross-origin requests, content types, query strings) and JSON for
/// every error ([`json_errors`]) around them.
/// It stops gracefully (in-flight requests get `grace_seconds`) when `stop` is cancelled; the
/// caller awaits the returned server. `workers` 0 means one per core; a client that has not sent
/// its request headers within `client_request_timeout`, or then its body within as long again,
/// gets 408 and is disconnected, so slow clients cannot hold the service's connections.
pub fn serve(
    listener: std::net::TcpListener,
    workers: usize,
    grace_seconds: u64,
    client_request_timeout: std::time::Duration,
    metrics: HttpMetrics,
    stop: tokio_util::sync::CancellationToken,
    configure: impl Fn(&mut web::ServiceConfig) + Clone + Send + 'static,
) -> std::io::Result<actix_web::dev::Server> {
    use actix_web::middleware::{NormalizePath, TrailingSlash, from_fn};
    let metrics = web::Data::new(metrics);
    let body_timeout = web::Data::new(BodyTimeout(client_request_timeout));
    let mut server = actix_web::HttpServer::new(move || {
        actix_web::App::new()
            .app_data(metrics.clone())
            .app_data(body_timeout.clone())
            .wrap(from_fn(body_deadline))
            .wrap(from_fn(front_door))
            .wrap(NormalizePath::new(TrailingSlash::Trim))
            .wrap(from_fn(json_errors))
            .wrap(from_fn(record_metrics))
            .wrap(from_fn(trace_requests))
            .configure(configure.clone())
            .default_service(web::to(not_found))
    })
    .disable_signals()
    .shutdown_timeout(grace_seconds)
    .client_request_timeout(client_request_timeout)
    .listen(listener)?;
    if workers > 0 {
        server = server.workers(workers);
    }
    let server = server.run();
    let handle = server.handle();
    actix_web::rt::spawn(async move {
        stop.cancelled().await;
        tracing::info!("stopping: finishing in-flight requests");
        handle.stop(true).await;
    });
    Ok(server)
}

/// How long a client may take to send a request's body once its headers arrived.
#[derive(Debug, Clone, Copy)]
struct BodyTimeout(std::time::Duration);

/// Puts a deadline on the request's body: a read past it fails with a timed-out I/O error, which
/// the JSON extractor's error handler turns into 408 (see `json_error`). actix-web's own
/// `client_request_timeout` covers only the headers.
async fn body_deadline(
    mut request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    use actix_web::HttpMessage;
    use actix_web::dev::Payload;
    use actix_web::error::PayloadError;
    use futures_util::StreamExt;

    let timeout = request
        .app_data::<web::Data<BodyTimeout>>()
        .map(|t| t.0)
        .unwrap_or(std::time::Duration::from_secs(5));
    let deadline = tokio::time::Instant::now() + timeout;
    let payload = request.take_payload();
    let bounded = futures_util::stream::unfold(Some(payload), move |payload| async move {
        let mut payload = payload?;
        match tokio::time::timeout_at(deadline, payload.next()).await {
            Ok(Some(chunk)) => Some((chunk, Some(payload))),
            Ok(None) => None,
            Err(_) => {
                let late = std::io::Error::new(std::io::ErrorKind::TimedOut, BodyTimedOut(timeout));
                Some((Err(PayloadError::Io(late)), None))
            }
        }
    });
    request.set_payload(Payload::Stream {
        payload: Box::pin(bounded),
    });
    next.call(request).await
}

/// The error inside the I/O error of a body that came too slowly; it carries the timeout.
#[derive(Debug, thiserror::Error)]
#[error("request body not received within {0:?}")]
struct BodyTimedOut(std::time::Duration);

/// Registers the JSON, raw body, path and query extractor configurations on a service: a body
/// read as JSON or as bytes is bounded by `max_body_bytes` alike.
pub fn extractors(cfg: &mut web::ServiceConfig, max_body_bytes: usize) {
    cfg.app_data(json_config(max_body_bytes))
        .app_data(web::PayloadConfig::new(max_body_bytes))
        .app_data(BodyLimit(max_body_bytes))
        .app_data(path_config())
        .app_data(query_config());
}

/// The body limit [`extractors`] set, for the answer to a body past it.
#[derive(Debug, Clone, Copy)]
struct BodyLimit(usize);

/// A resource that answers `GET` with `handler` and 405 JSON to any other method.
pub fn get_only<F, Args>(path: &str, handler: F) -> actix_web::Resource
where
    F: actix_web::Handler<Args>,
    Args: actix_web::FromRequest + 'static,
    F::Output: actix_web::Responder + 'static,
{
    web::resource(path)
        .route(web::get().to(handler))
        .default_service(web::to(method_not_allowed))
}

/// `GET /healthz`: the process is alive and serving.
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({ "status": "ok" }))
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

/// The app's fallback for paths no route matches.
pub async fn not_found(request: HttpRequest) -> ApiError {
    ApiError::NotFound {
        code: "not_found",
        message: format!("no route for {} {}", request.method(), request.path()),
    }
}

fn json_config(limit: usize) -> web::JsonConfig {
    web::JsonConfig::default()
        .limit(limit)
        // `front_door` has already refused a body that does not say it is JSON; this takes
        // every type it let through (`application/json`, `application/*+json`).
        .content_type_required(false)
        .error_handler(move |err, _| json_error(err, limit).into())
}

fn json_error(err: JsonPayloadError, limit: usize) -> ApiError {
    match err {
        JsonPayloadError::OverflowKnownLength { .. } | JsonPayloadError::Overflow { .. } => {
            ApiError::PayloadTooLarge { limit }
        }
        JsonPayloadError::ContentType => ApiError::UnsupportedMediaType,
        JsonPayloadError::Payload(actix_web::error::PayloadError::Io(io))
            if io.kind() == std::io::ErrorKind::TimedOut =>
        {
            let timeout = io
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<BodyTimedOut>())
                .map_or(0, |late| late.0.as_millis());
            ApiError::BodyTimeout {
                timeout_ms: timeout,
            }
        }
        JsonPayloadError::Deserialize(err) if err.is_data() => {
            let message = err.to_string();
            let code = if message.starts_with("missing field") {
                "missing_field"
            } else {
                "invalid_field"
            };
            ApiError::Invalid {
                code,
                field: None,
                message: format!("invalid request body: {message}"),
            }
        }
        JsonPayloadError::Deserialize(err) => ApiError::Invalid {
            code: "malformed_json",
            field: None,
            message: format!("request body is not valid JSON: {err}"),
        },
        other => ApiError::Invalid {
            code: "malformed_json",
            field: None,
            message: format!("could not read the request body: {other}"),
        },
    }
}

fn path_config() -> web::PathConfig {
    web::PathConfig::default().error_handler(|err: PathError, _| {
        ApiError::invalid("invalid_id", "id", format!("invalid path: {err}")).into()
    })
}

fn query_config() -> web::QueryConfig {
    web::QueryConfig::default().error_handler(|err: QueryPayloadError, _| {
        ApiError::Invalid {
            code: "invalid_query",
            field: None,
            message: format!("invalid query string: {err}"),
        }
        .into()
    })
}

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
    // PostgreSQL text cannot hold NUL, and no parameter of any route has a use for it.
    if request.query_string().contains("%00") {
        return Some(ApiError::Invalid {
            code: "invalid_query",
            field: None,
            message: "the query string must not contain NUL characters (%00)".to_owned(),
        });
    }
    None
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
        401 => "unauthorized",
        403 => "forbidden",
        404 => "not_found",
        405 => "method_not_allowed",
        408 => "request_timeout",
        411 => "length_required",
        413 => "payload_too_large",
        414 => "uri_too_long",
        415 => "unsupported_media_type",
        431 => "headers_too_large",
        503 => "unavailable",
        500..=599 => "internal",
        _ => "bad_request",
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

/// Request counters and latency histograms, by route pattern.
#[derive(Debug, Clone)]
pub struct HttpMetrics {
    requests: IntCounterVec,
    duration: HistogramVec,
}

impl HttpMetrics {
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let requests = IntCounterVec::new(
            Opts::new(
                "http_requests_total",
                "HTTP requests answered, by route and status.",
            ),
            &["method", "route", "status"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "http_request_duration_seconds",
                "Time to answer an HTTP request, by route.",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
            &["method", "route"],
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        Ok(Self { requests, duration })
    }
}

/// Middleware: counts and times every request by its route pattern (never the raw path, which
/// would make a metric series per id). Needs `web::Data<HttpMetrics>` in the app data.
pub async fn record_metrics(
    request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let started = Instant::now();
    let method = request.method().to_string();
    let metrics = request.app_data::<web::Data<HttpMetrics>>().cloned();
    let response = next.call(request).await?;
    if let Some(metrics) = metrics {
        let route = response
            .request()
            .match_pattern()
            .unwrap_or_else(|| "unmatched".to_owned());
        let status = response.status().as_u16().to_string();
        metrics
            .requests
            .with_label_values(&[method.as_str(), route.as_str(), status.as_str()])
            .inc();
        metrics
            .duration
            .with_label_values(&[method.as_str(), route.as_str()])
            .observe(started.elapsed().as_secs_f64());
    }
    Ok(response)
}

/// Middleware: one server span per request, continuing the caller's trace (W3C `traceparent`),
/// named and tagged by OpenTelemetry's HTTP conventions (`http.request.method`, `http.route`,
/// `http.response.status_code`); a 5xx marks it as an error. Handlers and the database calls
/// they make run inside it.
pub async fn trace_requests(
    request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    use tracing::Instrument;
    use tracing::field::Empty;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    let parent = crate::telemetry::extract(|name| {
        request
            .headers()
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    });
    let method = request.method().to_string();
    let span = tracing::info_span!(
        "HTTP request",
        otel.name = %method,
        otel.kind = "server",
        otel.status_code = Empty,
        http.request.method = %method,
        url.path = %request.path(),
        http.route = Empty,
        http.response.status_code = Empty,
        error.type = Empty,
    );
    // A malformed `traceparent` only means a new trace.
    let _ = span.set_parent(parent);
    let response = next.call(request).instrument(span.clone()).await?;
    if let Some(route) = response.request().match_pattern() {
        span.record("http.route", route.as_str());
        span.record("otel.name", format!("{method} {route}"));
    }
    let status = response.status().as_u16();
    span.record("http.response.status_code", status);
    if status >= 500 {
        span.record("otel.status_code", "ERROR");
        span.record("error.type", status.to_string());
    }
    Ok(response)
}

/// `GET /metrics`: the registry in Prometheus text format.
pub fn metrics_response(registry: &Registry) -> Result<HttpResponse, ApiError> {
    use prometheus::Encoder;
    let mut buffer = Vec::new();
    prometheus::TextEncoder::new()
        .encode(&registry.gather(), &mut buffer)
        .map_err(|err| ApiError::Internal(err.to_string()))?;
    Ok(HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(buffer))
}

/// Page size when a listing names no `limit`, and the most one page may hold.
pub const DEFAULT_PAGE: i64 = 100;
pub const MAX_PAGE: i64 = 1000;

/// Which end of a listing comes first. Oldest first (id order) is the sample's and the default;
/// `order=desc` gives newest first, as an operator reading recent work wants.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
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
        let limit = match limit {
            None => DEFAULT_PAGE,
            Some(limit) if limit >= 1 => limit.min(MAX_PAGE),
            Some(limit) => {
                return Err(ApiError::invalid(
                    "invalid_limit",
                    "limit",
                    format!("limit must be at least 1, got {limit}"),
                ));
            }
        };
        let cursor = match cursor {
            None | Some("") => None,
            Some(cursor) => Some(
                cursor
                    .parse::<i64>()
                    .ok()
                    .filter(|after| *after >= 0)
                    .ok_or_else(|| {
                        ApiError::invalid(
                            "invalid_cursor",
                            "cursor",
                            "cursor is not one this service gave",
                        )
                    })?,
            ),
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
        mut rows: Vec<T>,
        cut: bool,
        id_of: impl Fn(&T) -> i64,
        query: &[(&str, Option<&str>)],
    ) -> HttpResponse {
        let limit = usize::try_from(self.limit).unwrap_or(usize::MAX);
        let more = rows.len() > limit || cut;
        rows.truncate(limit);
        let mut response = HttpResponse::Ok();
        let next = rows.last().filter(|_| more).map(id_of);
        if let Some(next) = next {
            let mut link = format!("{}?cursor={next}&limit={}", request.path(), self.limit);
            if self.order != Order::Asc {
                link.push_str(&format!("&order={}", self.order.as_str()));
            }
            for (name, value) in query {
                if let Some(value) = value {
                    link.push_str(&format!("&{name}={}", percent_encode(value)));
                }
            }
            response.insert_header(("X-Next-Cursor", next.to_string()));
            response.insert_header(("Link", format!("<{link}>; rel=\"next\"")));
        }
        let mut body = serde_json::Map::new();
        body.insert(
            key.to_owned(),
            serde_json::to_value(&rows).unwrap_or_default(),
        );
        body.insert(
            "nextCursor".to_owned(),
            next.map_or(serde_json::Value::Null, |next| next.to_string().into()),
        );
        response.json(body)
    }
}

fn percent_encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
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
        assert_eq!(percent_encode("a b/é"), "a%20b%2F%C3%A9");
    }
}
