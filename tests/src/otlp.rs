//! A real OTLP/HTTP trace receiver for tests: it accepts `POST /v1/traces` with
//! protobuf-encoded `ExportTraceServiceRequest`s (what Jaeger's OTLP port accepts) and keeps
//! every span, flattened, for assertions.

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use actix_web::{App, HttpResponse, HttpServer, web};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message;

/// One received span.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// `service.name` of the resource that sent it.
    pub service: String,
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    /// OTLP span kind: 1 internal, 2 server, 3 client, 4 producer, 5 consumer (0 unspecified).
    pub kind: i32,
    pub attributes: HashMap<String, String>,
    /// 0 unset, 1 ok, 2 error.
    pub status_code: i32,
}

#[derive(Debug)]
pub struct OtlpReceiver {
    pub port: u16,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    handle: actix_web::dev::ServerHandle,
}

impl OtlpReceiver {
    pub fn start() -> OtlpReceiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind: {e}"));
        let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
        let spans: Arc<Mutex<Vec<ReceivedSpan>>> = Arc::default();
        let store = web::Data::new(spans.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(store.clone())
                .app_data(web::PayloadConfig::new(64 * 1024 * 1024))
                .route("/v1/traces", web::post().to(receive))
        })
        .workers(1)
        .disable_signals()
        .listen(listener)
        .unwrap_or_else(|e| panic!("listen: {e}"))
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        OtlpReceiver {
            port,
            spans,
            handle,
        }
    }

    /// The endpoint to give the services as `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub async fn stop(self) {
        self.handle.stop(false).await;
    }
}

async fn receive(
    store: web::Data<Arc<Mutex<Vec<ReceivedSpan>>>>,
    body: web::Bytes,
) -> HttpResponse {
    let Ok(request) = ExportTraceServiceRequest::decode(body.as_ref()) else {
        return HttpResponse::BadRequest().finish();
    };
    let mut received = Vec::new();
    for resource_spans in request.resource_spans {
        let service = resource_spans
            .resource
            .as_ref()
            .and_then(|r| attribute(&r.attributes, "service.name"))
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                received.push(ReceivedSpan {
                    service: service.clone(),
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    kind: span.kind,
                    attributes: span
                        .attributes
                        .iter()
                        .filter_map(|kv| Some((kv.key.clone(), render(kv)?)))
                        .collect(),
                    status_code: span.status.map(|s| s.code).unwrap_or_default(),
                });
            }
        }
    }
    if let Ok(mut spans) = store.lock() {
        spans.extend(received);
    }
    HttpResponse::Ok()
        .content_type("application/x-protobuf")
        .body(ExportTraceServiceResponse::default().encode_to_vec())
}

fn attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
    attributes.iter().find(|kv| kv.key == key).and_then(render)
}

fn render(kv: &KeyValue) -> Option<String> {
    Some(match kv.value.as_ref()?.value.as_ref()? {
        AnyValue::StringValue(s) => s.clone(),
        AnyValue::IntValue(i) => i.to_string(),
        AnyValue::DoubleValue(d) => d.to_string(),
        AnyValue::BoolValue(b) => b.to_string(),
        other => format!("{other:?}"),
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
