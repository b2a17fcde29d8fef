//! A small HTTP server for processes that are not HTTP services themselves (worker,
//! task-generator): `GET /healthz` and `GET /metrics` (Prometheus text of a registry).

use std::net::{SocketAddr, TcpListener};

use actix_web::{App, HttpResponse, HttpServer, web};
use anyhow::Context;
use prometheus::{Encoder, Registry, TextEncoder};

use crate::api::ErrorCode;

/// The running server; [`MetricsServer::stop`] ends it.
pub struct MetricsServer {
    address: SocketAddr,
    handle: actix_web::dev::ServerHandle,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl std::fmt::Debug for MetricsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsServer")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl MetricsServer {
    /// Listens on `address` (port 0 picks a free port; see [`MetricsServer::address`]).
    pub fn start(address: SocketAddr, registry: Registry) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(address)
            .with_context(|| format!("binding METRICS_ADDR {address}"))?;
        let address = listener
            .local_addr()
            .context("reading the metrics address")?;
        let registry = web::Data::new(registry);
        let server = HttpServer::new(move || {
            App::new()
                .app_data(registry.clone())
                .route("/healthz", web::get().to(healthz))
                .route("/metrics", web::get().to(render))
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(1)
        .keep_alive(crate::keep_alive::SERVER_IDLE)
        .listen(listener)
        .context("serving metrics")?
        .run();
        let handle = server.handle();
        let task = tokio::spawn(server);
        tracing::info!(%address, "metrics listening (GET /metrics, GET /healthz)");
        Ok(Self {
            address,
            handle,
            task,
        })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    pub async fn stop(self) {
        self.handle.stop(true).await;
        if let Ok(Err(err)) = self.task.await {
            tracing::warn!(error = %err, "metrics server failed");
        }
    }
}

/// A service's `GET /healthz` answer (`server::http::Probe`, in a feature this one does not
/// need): alive, and which process answers, so that whoever started it can tell its own child
/// from another process on the same port.
async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({ "status": "ok", "pid": std::process::id() }))
}

async fn render(registry: web::Data<Registry>) -> HttpResponse {
    let mut buffer = Vec::new();
    match TextEncoder::new().encode(&registry.gather(), &mut buffer) {
        Ok(()) => HttpResponse::Ok()
            .content_type("text/plain; version=0.0.4; charset=utf-8")
            .body(buffer),
        Err(err) => HttpResponse::InternalServerError().json(crate::ErrorBody::new(
            ErrorCode::Internal,
            format!("cannot render metrics: {err}"),
        )),
    }
}
