//! HTTP plumbing both services mount: the server with its middleware, extractor configuration
//! whose failures are JSON 4xx answers, fallbacks for unknown routes and methods, request
//! metrics and tracing. The front door's checks are in [`super::front_door`], listing pages in
//! [`super::paging`]; both are re-exported here, where the services have always found them.

use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::error::{JsonPayloadError, PathError, QueryPayloadError};
use actix_web::middleware::Next;
use actix_web::{HttpRequest, HttpResponse, web};
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

use super::body::{BodyLimit, BodyTimedOut};
use super::error::ApiError;
pub use super::front_door::{AllowedOrigins, front_door, json_errors};
pub use super::paging::{DEFAULT_PAGE, MAX_PAGE, NamePage, Order, Page};
use crate::api::ErrorCode;

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
    .on_connect(super::peer::on_connect)
    .disable_signals()
    .shutdown_timeout(grace_seconds)
    .keep_alive(crate::keep_alive::SERVER_IDLE)
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

/// Registers the JSON, raw body, path and query extractor configurations on a service: a body
/// read as JSON or as bytes is bounded by `max_body_bytes` alike.
pub fn extractors(cfg: &mut web::ServiceConfig, max_body_bytes: usize) {
    cfg.app_data(json_config(max_body_bytes))
        .app_data(web::PayloadConfig::new(max_body_bytes))
        .app_data(BodyLimit(max_body_bytes))
        .app_data(path_config())
        .app_data(query_config());
}

/// `resource` with a body limit of its own, for a batch route whose bodies are larger than the
/// service's other routes take (the limit [`extractors`] set for the rest).
pub fn with_body_limit(
    resource: actix_web::Resource,
    max_body_bytes: usize,
) -> actix_web::Resource {
    resource
        .app_data(json_config(max_body_bytes))
        .app_data(web::PayloadConfig::new(max_body_bytes))
        .app_data(BodyLimit(max_body_bytes))
}

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

/// The answer of `GET /healthz` (`ok`) and `GET /readyz` (`ready`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Probe {
    pub status: String,
    /// The id of the process that answers. Whoever started it can tell its own child's answer
    /// from another process's on the same port (the local stack's launcher checks it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// `/readyz` only: the database node this replica reaches, which takes its writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database: Option<super::db::DatabaseNode>,
}

/// Liveness
///
/// The process is alive and serving; it asks nothing of the database.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    responses((status = 200, description = "Alive", body = Probe))
)]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(Probe {
        status: "ok".to_owned(),
        pid: Some(std::process::id()),
        database: None,
    })
}

/// The answer of a `GET /readyz` whose checks passed, naming the database node they reached.
pub fn ready(node: super::db::DatabaseNode) -> HttpResponse {
    HttpResponse::Ok().json(Probe {
        status: "ready".to_owned(),
        pid: Some(std::process::id()),
        database: Some(node),
    })
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

/// The app's fallback for paths no route matches.
pub async fn not_found(request: HttpRequest) -> ApiError {
    ApiError::NotFound {
        code: ErrorCode::NotFound,
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

/// The refusal of a body that is JSON but not the request's shape (a field missing, or of the
/// wrong type or range). Also what one item of a batch gets, so that it is refused as it would
/// be alone.
pub fn invalid_body(err: &serde_json::Error) -> ApiError {
    let message = err.to_string();
    let code = if message.starts_with("missing field") {
        ErrorCode::MissingField
    } else {
        ErrorCode::InvalidField
    };
    ApiError::Invalid {
        code,
        field: None,
        message: format!("invalid request body: {message}"),
    }
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
        JsonPayloadError::Deserialize(err) if err.is_data() => invalid_body(&err),
        JsonPayloadError::Deserialize(err) => ApiError::Invalid {
            code: ErrorCode::MalformedJson,
            field: None,
            message: format!("request body is not valid JSON: {err}"),
        },
        other => ApiError::Invalid {
            code: ErrorCode::MalformedJson,
            field: None,
            message: format!("could not read the request body: {other}"),
        },
    }
}

fn path_config() -> web::PathConfig {
    web::PathConfig::default().error_handler(|err: PathError, _| {
        ApiError::invalid(ErrorCode::InvalidId, "id", format!("invalid path: {err}")).into()
    })
}

fn query_config() -> web::QueryConfig {
    web::QueryConfig::default().error_handler(|err: QueryPayloadError, _| {
        ApiError::Invalid {
            code: ErrorCode::InvalidQuery,
            field: None,
            message: format!("invalid query string: {err}"),
        }
        .into()
    })
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
