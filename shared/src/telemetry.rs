//! Logging and tracing set-up shared by every binary.
//!
//! * Logs: human-readable lines by default, one JSON object per line with `LOG_FORMAT=json`;
//!   `RUST_LOG` filters (default `info`). When spans are exported, every line logged inside a
//!   span carries its OpenTelemetry `trace_id` and `span_id`, so logs and traces correlate.
//! * Traces: a `tracing-opentelemetry` layer turns spans (those at `INFO` and above: every span
//!   Leasehold makes) into OpenTelemetry spans, whatever `RUST_LOG` says: `RUST_LOG` filters the
//!   log lines only, so quieter logs never lose a trace or a `traceparent`; which traces are kept
//!   is `OTEL_TRACES_SAMPLER`'s to say. They are exported over OTLP/HTTP when
//!   `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//!   `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, configured by the standard variables
//!   (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`, `OTEL_BSP_*`, ...).
//!   Without an endpoint nothing is exported and nothing complains, and no OpenTelemetry span is
//!   made at all: spans nobody would see cost a third of task-service's CPU per task (the
//!   bench's cost model), so a process that does not export neither records nor passes on a
//!   `traceparent`. Export from every service of a deployment, or from none. Export runs on
//!   the batch processor's own thread: an unreachable collector never slows a request.
//! * Propagation: [`inject`] adds the current span's `traceparent` to an outgoing request;
//!   [`extract`] reads a caller's from an incoming one.

use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::{OpenTelemetrySpanExt, OtelData};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::{FilterExt, LevelFilter, filter_fn};
use tracing_subscriber::fmt::format::{Format, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::{Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

/// Keeps the tracer provider alive; dropping it flushes and shuts down span export.
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Flushes buffered spans and stops exporting (also done on drop).
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(err) = provider.shutdown()
        {
            tracing::debug!(error = %err, "span export did not shut down cleanly");
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether the standard variables ask for span export.
fn export_requested() -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    let disabled = std::env::var("OTEL_TRACES_EXPORTER").is_ok_and(|v| v.trim() == "none")
        || std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim() == "true");
    !disabled && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

/// Installs logging and tracing for `service_name` (the default `service.name`; the standard
/// variables override it). Safe to call more than once: later calls install nothing.
pub fn init(service_name: &'static str) -> Telemetry {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let mut resource = opentelemetry_sdk::Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name(service_name);
    }
    let mut builder = SdkTracerProvider::builder().with_resource(resource.build());
    let mut export_error = None;
    let requested = export_requested();
    if requested {
        match opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .build()
        {
            Ok(exporter) => builder = builder.with_batch_exporter(exporter),
            Err(err) => export_error = Some(err.to_string()),
        }
    }
    let provider = builder.build();
    let exporting = requested && export_error.is_none();
    // Only when exporting. Each layer filters for itself: a filter on the whole subscriber
    // would let RUST_LOG=warn disable the spans, and with them the traces and the
    // `traceparent` sent on.
    let otel = exporting.then(|| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer(service_name))
            .with_filter(LevelFilter::INFO)
    });
    // The log lines follow RUST_LOG. When exporting, the spans the traces keep stay visible to
    // the log layer too (printing nothing by themselves), so a line logged inside one still
    // carries its trace and span ids, at any level.
    let spans = filter_fn(move |metadata| {
        exporting && metadata.is_span() && *metadata.level() <= LevelFilter::INFO
    })
    .with_max_level_hint(if exporting {
        LevelFilter::INFO
    } else {
        LevelFilter::OFF
    });
    let log_filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info"))
        .or(spans);
    let json = std::env::var("LOG_FORMAT").is_ok_and(|v| v.eq_ignore_ascii_case("json"));
    // Colours only for a person at a terminal, never in files or collectors.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = if json {
        tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .event_format(WithTraceIds {
                json: true,
                inner: Format::default().json().with_current_span(true),
            })
            .boxed()
    } else {
        tracing_subscriber::fmt::layer()
            .with_ansi(ansi)
            .with_writer(std::io::stderr)
            .event_format(WithTraceIds {
                json: false,
                inner: Format::default().with_ansi(ansi),
            })
            .boxed()
    };
    let installed = tracing_subscriber::registry()
        .with(otel)
        .with(logs.with_filter(log_filter))
        .try_init()
        .is_ok();
    if !installed {
        return Telemetry { provider: None };
    }
    if let Some(err) = export_error {
        tracing::warn!(error = %err, "cannot export spans; continuing without");
    }
    tracing::debug!(service = service_name, exporting, "telemetry initialised");
    Telemetry {
        provider: Some(provider),
    }
}

/// The `traceparent` (and `tracestate`) of the current span, to send with an outgoing request.
pub fn inject() -> reqwest::header::HeaderMap {
    struct Headers(reqwest::header::HeaderMap);
    impl Injector for Headers {
        fn set(&mut self, key: &str, value: String) {
            if let (Ok(name), Ok(value)) = (
                reqwest::header::HeaderName::from_bytes(key.as_bytes()),
                reqwest::header::HeaderValue::from_str(&value),
            ) {
                self.0.insert(name, value);
            }
        }
    }
    let mut headers = Headers(reqwest::header::HeaderMap::new());
    let context = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&context, &mut headers);
    });
    headers.0
}

/// A client span for one outgoing HTTP request, by OpenTelemetry's HTTP conventions. Send the
/// request inside it, with the headers of [`inject`], and finish it with [`record_response`].
pub fn client_span(method: &str, url: &str) -> tracing::Span {
    tracing::info_span!(
        "HTTP client request",
        otel.name = %method,
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        http.request.method = %method,
        url.full = %url,
        http.response.status_code = tracing::field::Empty,
        error.type = tracing::field::Empty,
    )
}

/// Records the answer (or the failure) of a request on its [`client_span`]: a transport
/// failure or a 5xx marks the span as an error.
pub fn record_response(span: &tracing::Span, outcome: Result<u16, &str>) {
    match outcome {
        Ok(status) => {
            span.record("http.response.status_code", status);
            if status >= 500 {
                span.record("otel.status_code", "ERROR");
                span.record("error.type", status.to_string());
            }
        }
        Err(reason) => {
            span.record("otel.status_code", "ERROR");
            span.record("error.type", reason);
        }
    }
}

/// The caller's trace context from an incoming request's headers (`traceparent`,
/// `tracestate`), looked up by `header`, to parent a server span with
/// [`OpenTelemetrySpanExt::set_parent`].
pub fn extract(header: impl Fn(&str) -> Option<String>) -> opentelemetry::Context {
    struct Headers(Vec<(&'static str, String)>);
    impl Extractor for Headers {
        fn get(&self, key: &str) -> Option<&str> {
            self.0
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case(key))
                .map(|(_, value)| value.as_str())
        }
        fn keys(&self) -> Vec<&str> {
            self.0.iter().map(|(name, _)| *name).collect()
        }
    }
    let headers = Headers(
        ["traceparent", "tracestate"]
            .into_iter()
            .filter_map(|name| Some((name, header(name)?)))
            .collect(),
    );
    opentelemetry::global::get_text_map_propagator(|propagator| propagator.extract(&headers))
}

/// Formats each event with the standard text or JSON format, adding the `trace_id` and
/// `span_id` of the span it happened in.
struct WithTraceIds<F> {
    json: bool,
    inner: F,
}

impl<S, N, F> FormatEvent<S, N> for WithTraceIds<F>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        // The innermost span the traces know (a DEBUG span shown by RUST_LOG is not one).
        let ids = ctx.lookup_current().and_then(|current| {
            current.scope().find_map(|span| {
                let extensions = span.extensions();
                let data = extensions.get::<OtelData>()?;
                Some((data.trace_id()?, data.span_id()?))
            })
        });
        let mut line = String::new();
        self.inner
            .format_event(ctx, Writer::new(&mut line), event)?;
        let Some((trace_id, span_id)) = ids else {
            return writer.write_str(&line);
        };
        let line = line.trim_end_matches('\n');
        if self.json
            && let Ok(serde_json::Value::Object(mut object)) = serde_json::from_str(line)
        {
            object.insert("trace_id".to_owned(), trace_id.to_string().into());
            object.insert("span_id".to_owned(), span_id.to_string().into());
            return writeln!(writer, "{}", serde_json::Value::Object(object));
        }
        writeln!(writer, "{line} trace_id={trace_id} span_id={span_id}")
    }
}
