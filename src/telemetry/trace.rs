//! Optional OpenTelemetry tracing (`[tracing]`, off by default): a span for each request
//! and its phases (classify, authenticate, hosted-context lookup, canister read,
//! extract, forward), exported over OTLP/HTTP (protobuf), with the W3C trace context
//! taken from the caller and passed to the gateway.
//!
//! The spans are `tracing` spans at [`TARGET`], level `TRACE`: with tracing off the log
//! filter leaves them disabled at their call sites, so they cost a request nothing.
//! Their attributes are the closed vocabulary of the metrics (route class, surface,
//! outcome, status classes, why a token was refused, where a hosted context came from),
//! never a path, query, header value, token, user id, vault, heading or body.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{HeaderExtractor, HeaderInjector, HttpClient, HttpError};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::config::{self, ConfigError};

/// The target of every span exported; the log filter enables it only with tracing on.
pub const TARGET: &str = "knowtation_sidecar::trace";

/// Whether spans are exported: read on every request, so a flag rather than a lock.
static ON: AtomicBool = AtomicBool::new(false);

/// Whether tracing is on in this process.
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// The running exporter: flush it with [`Exporter::shutdown`] before the runtime ends.
#[derive(Debug)]
pub struct Exporter {
    provider: SdkTracerProvider,
}

impl Exporter {
    /// Starts the exporter for `config`, its HTTP requests run on `runtime`; `None` when
    /// tracing is off.
    pub fn start(
        config: &config::Tracing,
        runtime: tokio::runtime::Handle,
    ) -> Result<Option<(Exporter, opentelemetry_sdk::trace::Tracer)>, ConfigError> {
        if !config.enabled {
            return Ok(None);
        }
        let timeout = Duration::from_millis(config.export_timeout_ms);
        let client = OnRuntime {
            inner: opentelemetry_http::hyper::HyperClient::with_default_connector(timeout, None),
            runtime,
        };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(config.endpoint.clone())
            .with_timeout(timeout)
            .build()
            .map_err(|e| ConfigError::new("tracing.endpoint", format!("cannot export: {e}")))?;
        let resource = opentelemetry_sdk::Resource::builder_empty()
            .with_service_name(config.service_name.clone())
            .with_attribute(opentelemetry::KeyValue::new(
                "service.version",
                env!("CARGO_PKG_VERSION"),
            ))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            // A caller's sampled flag decides for its own trace; new traces are kept at
            // the configured ratio.
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                config.sample_ratio,
            ))))
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("knowtation-sidecar");
        ON.store(true, Ordering::Relaxed);
        Ok(Some((Exporter { provider }, tracer)))
    }

    /// Sends the spans still buffered and stops. The export runs on the runtime, so this
    /// waits for it off the runtime's threads.
    pub async fn shutdown(self) {
        let provider = self.provider;
        let done = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        if let Ok(Err(e)) = done {
            tracing::warn!(error = %e, "trace export did not finish");
        }
    }
}

/// The exporter's HTTP client, run on the sidecar's runtime: the SDK exports from a
/// thread of its own, where hyper finds no runtime.
#[derive(Debug)]
struct OnRuntime {
    inner: opentelemetry_http::hyper::HyperClient,
    runtime: tokio::runtime::Handle,
}

impl HttpClient for OnRuntime {
    fn send_bytes<'life0, 'async_trait>(
        &'life0 self,
        request: Request<Bytes>,
    ) -> Pin<Box<dyn Future<Output = Result<Response<Bytes>, HttpError>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        let inner = self.inner.clone();
        let sent = self
            .runtime
            .spawn(async move { inner.send_bytes(request).await });
        Box::pin(async move { sent.await? })
    }
}

/// The span of one request, a child of the caller's trace when it sent a valid
/// `traceparent`. Its `route` is recorded once the request is classified
/// (`section_source`, `mcp` or `passthrough`).
pub fn request_span(headers: &HeaderMap) -> tracing::Span {
    let span = tracing::trace_span!(
        target: TARGET,
        "request",
        route = tracing::field::Empty,
        surface = tracing::field::Empty,
        outcome = tracing::field::Empty,
        status_class = tracing::field::Empty,
        auth_reason = tracing::field::Empty,
    );
    if enabled() && !span.is_disabled() {
        let parent = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
        // A span already started cannot take a parent; this one has just been made.
        let _ = span.set_parent(parent);
    }
    span
}

/// The trace id of `span`, 32 hex digits, when it is exported.
pub fn trace_id(span: &tracing::Span) -> Option<String> {
    if !enabled() || span.is_disabled() {
        return None;
    }
    use opentelemetry::trace::TraceContextExt as _;
    let cx = span.context();
    let id = cx.span().span_context().trace_id();
    (id != opentelemetry::trace::TraceId::INVALID).then(|| id.to_string())
}

/// Replaces the W3C trace context in `headers` with the current span's, for a request
/// to an upstream. With tracing off the caller's headers pass as they came.
pub fn inject(headers: &mut HeaderMap) {
    if !enabled() {
        return;
    }
    let span = tracing::Span::current();
    if span.is_disabled() {
        return;
    }
    headers.remove("traceparent");
    headers.remove("tracestate");
    TraceContextPropagator::new().inject_context(&span.context(), &mut HeaderInjector(headers));
}

/// Records the outcome of the request being answered on its span (the current one): the
/// labels of the access line, nothing else.
pub fn record_outcome(
    surface: &'static str,
    outcome: &'static str,
    auth_reason: Option<&'static str>,
) {
    if !enabled() {
        return;
    }
    let span = tracing::Span::current();
    span.record("surface", surface);
    span.record("outcome", outcome);
    if let Some(reason) = auth_reason {
        span.record("auth_reason", reason);
    }
}

/// A span of the extract phase (`step` is `parse` or `build`), made where the daemon calls
/// the extractor: the extractor itself is pure and knows nothing of tracing.
pub fn extract_span(step: &'static str) -> tracing::Span {
    tracing::trace_span!(target: TARGET, "extract", step = step)
}
