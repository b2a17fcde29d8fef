//! The HTTP client for lease-service and task-service.

use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;

use crate::Cli;

/// The two services, as the CLI talks to them.
#[derive(Debug)]
pub(crate) struct Api {
    pub(crate) http: reqwest::Client,
    pub(crate) leases: String,
    pub(crate) tasks: String,
}

impl Api {
    pub(crate) fn new(cli: &Cli) -> anyhow::Result<Api> {
        let token = cli.token.as_deref().map(leasehold::api::Secret::new);
        let http = reqwest::Client::builder()
            .default_headers(leasehold::api::Secret::bearer_headers(token.as_ref()))
            .timeout(Duration::from_secs(30))
            .build()
            .context("building the HTTP client")?;
        Ok(Api {
            http,
            leases: cli.lease_url.trim_end_matches('/').to_owned(),
            tasks: cli.task_url.trim_end_matches('/').to_owned(),
        })
    }

    /// Sends one request; a non-2xx answer becomes an error quoting the service's `error` and
    /// `code`.
    pub(crate) async fn call(
        &self,
        method: reqwest::Method,
        url: String,
        body: Option<&Value>,
    ) -> anyhow::Result<Value> {
        let mut request = self.http.request(method.clone(), &url);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("{method} {url}"))?;
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .with_context(|| format!("reading the answer to {method} {url}"))?;
        let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if !status.is_success() {
            let error = value["error"].as_str().unwrap_or("(no message)");
            let code = value["code"].as_str().unwrap_or("unknown");
            bail!("{method} {url} answered {status}: {error} ({code})");
        }
        Ok(value)
    }

    pub(crate) async fn get(&self, url: String) -> anyhow::Result<Value> {
        self.call(reqwest::Method::GET, url, None).await
    }
}

/// A listing's URL: newest first, `limit` rows from `cursor` on.
pub(crate) fn listing_url(
    url: &str,
    limit: u32,
    cursor: Option<&str>,
    filters: &[(&str, Option<&str>)],
) -> anyhow::Result<String> {
    let mut url = reqwest::Url::parse(url)?;
    url.query_pairs_mut()
        .append_pair("order", "desc")
        .append_pair("limit", &limit.to_string());
    if let Some(cursor) = cursor {
        url.query_pairs_mut().append_pair("cursor", cursor);
    }
    for (name, value) in filters {
        if let Some(value) = value {
            url.query_pairs_mut().append_pair(name, value);
        }
    }
    Ok(url.to_string())
}
