//! The one check of a Leasehold service's address, as every binary reads one from its
//! environment (`TASK_SERVICE_URL`, `LEASE_SERVICE_URL`): a base URL the clients append paths
//! to. Services talk plain HTTP inside a deployment (TLS ends at the load balancer), so this
//! build speaks only `http://`.

/// `raw`, the value of setting `name`, checked as a service's base URL: an `http://` URL with a
/// host and no query or fragment. It comes back without its trailing slashes, so that a path
/// appended to it starts with one.
pub fn service_url(name: &str, raw: &str) -> Result<String, String> {
    let raw = raw.trim();
    let parsed =
        reqwest::Url::parse(raw).map_err(|err| format!("{name} {raw:?} is not a URL: {err}"))?;
    if parsed.scheme() != "http" {
        return Err(format!(
            "{name} {raw:?} must start with http:// (this build has no TLS)"
        ));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(format!("{name} {raw:?} names no host"));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(format!("{name} {raw:?} must not have a query or fragment"));
    }
    Ok(raw.trim_end_matches('/').to_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::service_url;

    #[test]
    fn a_base_url_is_http_with_a_host_and_nothing_after_its_path() {
        assert_eq!(
            service_url("U", " http://a:1/ ").as_deref(),
            Ok("http://a:1")
        );
        assert_eq!(
            service_url("U", "http://a/prefix//").as_deref(),
            Ok("http://a/prefix")
        );
        for (bad, says) in [
            ("not a url", "is not a URL"),
            ("", "is not a URL"),
            ("https://a", "http://"),
            ("ftp://a", "http://"),
            ("http://a/?x=1", "query"),
            ("http://a/#top", "fragment"),
        ] {
            let error = service_url("LEASE_SERVICE_URL", bad).unwrap_err();
            assert!(
                error.starts_with("LEASE_SERVICE_URL") && error.contains(says),
                "{bad:?}: {error}"
            );
        }
    }
}
