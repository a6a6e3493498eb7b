//! STAND-IN for the REST choke point (wire contract §5), owned by the `rest` branch and
//! replaced at merge. It has the agreed signatures; it matches the route roughly and
//! answers every intercepted request like an unconfigured canister.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;

use crate::config::{Config, ConfigError};
use crate::telemetry::{HostedContextEvent, Intercepted, Metrics, Outcome, Surface};

/// The REST handler for `GET /api/v1/section-source`.
#[derive(Debug)]
pub struct RestService {
    _metrics: Arc<Metrics>,
}

impl RestService {
    /// Builds the handler from the config.
    pub fn new(_config: &Config, metrics: Arc<Metrics>) -> Result<RestService, ConfigError> {
        Ok(RestService { _metrics: metrics })
    }

    /// Whether the gateway would route `uri` to the section-source handler (§5).
    pub fn matches(uri: &http::Uri) -> bool {
        let path = uri.path();
        let path = strip_prefix_ci(path, "/.netlify/functions/gateway").unwrap_or(path);
        let path = path.strip_suffix('/').unwrap_or(path);
        path.eq_ignore_ascii_case("/api/v1/section-source")
    }

    /// Answers one intercepted request.
    pub async fn handle(
        &self,
        _parts: &http::request::Parts,
    ) -> (http::Response<Full<Bytes>>, Intercepted) {
        let body =
            r#"{"error":"Hosted SectionSource is not configured","code":"SERVICE_UNAVAILABLE"}"#;
        let mut response = http::Response::new(Full::new(Bytes::from_static(body.as_bytes())));
        *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json; charset=utf-8"),
        );
        let intercepted = Intercepted {
            surface: Surface::Rest,
            outcome: Outcome::NotConfigured,
            status: 503,
            upstream_status: None,
            sections: None,
            truncated: false,
            hosted_context: HostedContextEvent::None,
            elapsed: Duration::ZERO,
        };
        (response, intercepted)
    }
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    if head.eq_ignore_ascii_case(prefix) {
        s.get(prefix.len()..)
    } else {
        None
    }
}
