//! Every answer the sidecar writes itself on `/mcp`: each refusal mapped to status, body
//! and content type in one place ([`McpError::wire`]), and the JSON and SSE answers in
//! the gateway's and the SDK's exact shapes.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::Full;

use super::SUPPORTED_PROTOCOL_VERSIONS;
use crate::auth::AuthError;
use crate::budget::Refusal;
use crate::telemetry::Outcome;

const GATEWAY_JSON: &str = "application/json; charset=utf-8";
const SDK_JSON: &str = "application/json";

/// Every refusal the sidecar answers on `/mcp`; [`McpError::wire`] is the one mapping
/// to status, body and content type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McpError {
    /// An `Origin` that is not allowed (DNS-rebinding protection), with the header as
    /// the SDK echoes it.
    InvalidOrigin(String),
    /// Body over `mcp.max_body_bytes` (door).
    PayloadTooLarge,
    /// `Content-Encoding` other than identity, or a charset other than UTF-8 (door).
    UnsupportedEncoding,
    /// Not UTF-8 or not JSON, or a `__proto__` key (door; the gateway's step 1).
    InvalidBody,
    /// The body did not arrive within `listen.body_read_timeout_ms` (door).
    BodyTimeout,
    /// No room in the in-flight or buffered-bytes budget (door).
    Overloaded(Refusal),
    /// A batch holding a call the sidecar answers or rewrites (§6 Deviation).
    BatchRefused,
    /// `Mcp-Method`/`Mcp-Name` disagree with the body (§6 Deviation).
    HeaderMismatch,
    /// `initialize` without a string or safe-integer `id`: the SDK would open a session
    /// and answer 202 without its id, so the sidecar could not learn it.
    InitializeWithoutId,
    /// `X-Vault-Id` outside the §1 pattern at `initialize`.
    InvalidVault,
    /// Step 2: the token was refused, and why.
    Unauthorized(AuthError),
    /// Step 3.
    RateLimited,
    /// Step 4.
    SessionNotFound,
    /// The hosted-context lookup failed at `initialize` (§2).
    NoHostedAccess,
    /// Step 5.
    NotAcceptable,
    /// Step 6.
    UnsupportedMediaType,
    /// Step 7.
    InvalidJsonRpc,
    /// Step 8, with the header value.
    UnsupportedProtocolVersion(String),
    /// A rewritten list answer could not be read or rewritten.
    BadGateway,
}

impl McpError {
    /// Status, exact body, content type and outcome label.
    pub fn wire(&self) -> (StatusCode, String, &'static str, Outcome) {
        let gateway = |status, code: i32, message: &str, outcome| {
            (
                status,
                format!(r#"{{"jsonrpc":"2.0","error":{{"code":{code},"message":"{message}"}}}}"#),
                GATEWAY_JSON,
                outcome,
            )
        };
        let sdk = |status, code: i32, message: &str, outcome| {
            let message = serde_json::to_string(message).unwrap_or_default();
            (
                status,
                format!(
                    r#"{{"jsonrpc":"2.0","error":{{"code":{code},"message":{message}}},"id":null}}"#
                ),
                SDK_JSON,
                outcome,
            )
        };
        let plain = |status, error: &str, code: &str, outcome| {
            (
                status,
                format!(r#"{{"error":"{error}","code":"{code}"}}"#),
                GATEWAY_JSON,
                outcome,
            )
        };
        match self {
            // The SDK's answer when its DNS-rebinding protection refuses an origin.
            McpError::InvalidOrigin(origin) => sdk(
                StatusCode::FORBIDDEN,
                -32000,
                &format!("Invalid Origin header: {origin}"),
                Outcome::OriginRefused,
            ),
            McpError::PayloadTooLarge => plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                "Payload Too Large",
                "PAYLOAD_TOO_LARGE",
                Outcome::PayloadTooLarge,
            ),
            McpError::UnsupportedEncoding => plain(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "Unsupported content encoding or charset",
                "UNSUPPORTED_MEDIA_TYPE",
                Outcome::UnsupportedMediaType,
            ),
            McpError::InvalidBody => plain(
                StatusCode::BAD_REQUEST,
                "Invalid JSON body",
                "INTERNAL_ERROR",
                Outcome::InvalidRequest,
            ),
            McpError::BodyTimeout => plain(
                StatusCode::REQUEST_TIMEOUT,
                "Request Timeout",
                "REQUEST_TIMEOUT",
                Outcome::BodyTimeout,
            ),
            McpError::Overloaded(_) => plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "Service overloaded",
                "SERVICE_UNAVAILABLE",
                Outcome::Overloaded,
            ),
            McpError::BatchRefused => sdk(
                StatusCode::BAD_REQUEST,
                -32600,
                "Invalid Request: batches may not contain this method",
                Outcome::InvalidRequest,
            ),
            McpError::HeaderMismatch => sdk(
                StatusCode::BAD_REQUEST,
                -32600,
                "Invalid Request: Mcp-Method or Mcp-Name header does not match the body",
                Outcome::InvalidRequest,
            ),
            McpError::InitializeWithoutId => sdk(
                StatusCode::BAD_REQUEST,
                -32600,
                "Invalid Request: initialize must be a request with an id",
                Outcome::InvalidRequest,
            ),
            McpError::InvalidVault => gateway(
                StatusCode::BAD_REQUEST,
                -32600,
                "Invalid vault",
                Outcome::InvalidVault,
            ),
            McpError::Unauthorized(_) => gateway(
                StatusCode::UNAUTHORIZED,
                -32600,
                "Unauthorized",
                Outcome::Unauthorized,
            ),
            McpError::RateLimited => gateway(
                StatusCode::TOO_MANY_REQUESTS,
                -32600,
                "Rate limit exceeded",
                Outcome::RateLimited,
            ),
            McpError::SessionNotFound => gateway(
                StatusCode::NOT_FOUND,
                -32600,
                "Session not found",
                Outcome::SessionNotFound,
            ),
            McpError::NoHostedAccess => gateway(
                StatusCode::FORBIDDEN,
                -32600,
                "No hosted access",
                Outcome::NoHostedAccess,
            ),
            McpError::NotAcceptable => sdk(
                StatusCode::NOT_ACCEPTABLE,
                -32000,
                "Not Acceptable: Client must accept both application/json and text/event-stream",
                Outcome::NotAcceptable,
            ),
            McpError::UnsupportedMediaType => sdk(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                -32000,
                "Unsupported Media Type: Content-Type must be application/json",
                Outcome::UnsupportedMediaType,
            ),
            McpError::InvalidJsonRpc => sdk(
                StatusCode::BAD_REQUEST,
                -32700,
                "Parse error: Invalid JSON-RPC message",
                Outcome::InvalidRequest,
            ),
            McpError::UnsupportedProtocolVersion(v) => sdk(
                StatusCode::BAD_REQUEST,
                -32000,
                &format!(
                    "Bad Request: Unsupported protocol version: {v} (supported versions: {})",
                    SUPPORTED_PROTOCOL_VERSIONS.join(", ")
                ),
                Outcome::UnsupportedProtocolVersion,
            ),
            McpError::BadGateway => plain(
                StatusCode::BAD_GATEWAY,
                "Bad Gateway",
                "BAD_GATEWAY",
                Outcome::BadGateway,
            ),
        }
    }
}

pub(super) fn json_response(
    status: StatusCode,
    body: String,
    content_type: &'static str,
) -> Response<Full<Bytes>> {
    let length = body.len();
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    r
}

/// The gateway's answer to a `DELETE /mcp` (§6): 200 `{"ok":true}`, whatever the
/// session. The sidecar gives it for a session the caller does not hold, which the
/// gateway would leave as it is.
pub(super) fn deleted() -> Response<Full<Bytes>> {
    json_response(StatusCode::OK, r#"{"ok":true}"#.to_owned(), GATEWAY_JSON)
}

/// The SDK's SSE answer (§6): 200, `text/event-stream`, `no-cache`, `keep-alive`, the
/// session id.
pub(super) fn sse_response(body: String, session_id: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
    // Recorded only when valid (visible ASCII), so this cannot fail.
    if let Ok(v) = HeaderValue::from_str(session_id) {
        h.insert("mcp-session-id", v);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s6_sdk_error_bodies_are_exact() {
        let (s, b, ct, _) = McpError::NotAcceptable.wire();
        assert_eq!(s, 406);
        assert_eq!(ct, "application/json");
        assert_eq!(
            b,
            r#"{"jsonrpc":"2.0","error":{"code":-32000,"message":"Not Acceptable: Client must accept both application/json and text/event-stream"},"id":null}"#
        );
        let (_, b, ct, _) = McpError::SessionNotFound.wire();
        assert_eq!(ct, "application/json; charset=utf-8");
        assert_eq!(
            b,
            r#"{"jsonrpc":"2.0","error":{"code":-32600,"message":"Session not found"}}"#
        );
        let (s, b, ct, o) = McpError::InvalidOrigin("http://evil.example".into()).wire();
        assert_eq!(
            (s.as_u16(), ct, o),
            (403, "application/json", Outcome::OriginRefused)
        );
        assert_eq!(
            b,
            r#"{"jsonrpc":"2.0","error":{"code":-32000,"message":"Invalid Origin header: http://evil.example"},"id":null}"#
        );
        let (_, b, _, _) = McpError::UnsupportedProtocolVersion("x\"y".into()).wire();
        assert_eq!(
            b,
            r#"{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: Unsupported protocol version: x\"y (supported versions: 2025-11-25, 2025-06-18, 2025-03-26, 2024-11-05, 2024-10-07)"},"id":null}"#
        );
    }
}
