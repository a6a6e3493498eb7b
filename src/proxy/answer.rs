//! The sidecar's own answers on the main listener: fixed error bodies, closing an HTTP/1
//! connection whose framing is spent, and the passthrough record of each answer.

use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body as _, Incoming};

use super::{ProxyBody, Shared};
use crate::telemetry;

pub(super) fn boxed(response: Response<Full<Bytes>>) -> Response<ProxyBody> {
    response.map(|body| body.map_err(|never| match never {}).boxed_unsync())
}

/// An answer sent without reading the request body: on HTTP/1 the connection is closed
/// after it when a body was announced, since the unread bytes would otherwise be parsed
/// as the next request (or have to be read for nothing).
pub(super) fn unread(
    parts: &http::request::Parts,
    body: &Incoming,
    response: Response<Full<Bytes>>,
) -> Response<ProxyBody> {
    let mut response = boxed(response);
    if parts.version < Version::HTTP_2 && !body.is_end_stream() {
        close_after(&mut response);
    }
    response
}

/// Ends an HTTP/1 connection after `response` (`Connection: close`).
pub(super) fn close_after<B>(response: &mut Response<B>) {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
}

/// Records and logs a passthrough-route answer.
pub(super) fn finish_local(
    shared: &Shared,
    started: Instant,
    response: Response<ProxyBody>,
) -> Response<ProxyBody> {
    let status = response.status().as_u16();
    let elapsed = started.elapsed();
    shared.metrics.record_passthrough(status, elapsed);
    telemetry::log_passthrough(status, elapsed);
    response
}

pub(super) const BAD_REQUEST: &str = r#"{"error":"Bad Request","code":"BAD_REQUEST"}"#;
pub(super) const HEADERS_TOO_LARGE: &str =
    r#"{"error":"Request Header Fields Too Large","code":"HEADERS_TOO_LARGE"}"#;
pub(super) const METHOD_NOT_ALLOWED: &str =
    r#"{"error":"Method Not Allowed","code":"METHOD_NOT_ALLOWED"}"#;
pub(super) const BAD_GATEWAY: &str = r#"{"error":"Bad Gateway","code":"BAD_GATEWAY"}"#;
pub(super) const GATEWAY_TIMEOUT: &str = r#"{"error":"Gateway Timeout","code":"GATEWAY_TIMEOUT"}"#;
const OVERLOADED: &str = r#"{"error":"Service overloaded","code":"SERVICE_UNAVAILABLE"}"#;

pub(super) fn local_error(status: StatusCode, body: &'static str) -> Response<ProxyBody> {
    let mut response = Response::new(
        Full::new(Bytes::from_static(body.as_bytes()))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// 503 with `Retry-After: 1`: no room at the gateway for one more request
/// (`listen.max_forwarded_in_flight`, or its bound for requests without a verified
/// token), in the body the intercepted surfaces use when their
/// budget is full. On HTTP/1 the connection closes after it when a request body was
/// announced: the unread bytes would otherwise be read as the next request.
pub(super) fn overloaded(parts: &http::request::Parts, body: &Incoming) -> Response<ProxyBody> {
    busy(parts.version < Version::HTTP_2 && !body.is_end_stream())
}

/// The answer of [`overloaded`]; the connection closes after it when `close`.
pub(super) fn busy(close: bool) -> Response<ProxyBody> {
    let mut response = local_error(StatusCode::SERVICE_UNAVAILABLE, OVERLOADED);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    if close {
        close_after(&mut response);
    }
    response
}
