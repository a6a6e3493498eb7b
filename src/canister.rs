//! The one upstream read (wire contract §4): `GET {canister}/api/v1/notes/{path}`.
//!
//! Exactly one request per call, never a redirect followed (hyper's clients do not
//! follow them), a total deadline on a real tokio timer that covers the body too, and a
//! body cap: reading stops as soon as the cap is passed. Only a 2xx body is read; other
//! answers are reduced to their status and never looked at.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;

use crate::config::{self, ConfigError};
use crate::hosted::{endpoint, pooled_client};
use crate::path::VaultPath;
use crate::upstream::{self, Connector};

/// The canister's answer to the one read.
#[derive(Clone, PartialEq, Eq)]
pub enum NoteResponse {
    /// A 2xx status and its whole body (within the cap).
    Success {
        /// The status code.
        status: u16,
        /// The body.
        body: Bytes,
    },
    /// Any other status (3xx included); the body was not read.
    Status(u16),
}

impl fmt::Debug for NoteResponse {
    // A note body is never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoteResponse::Success { status, body } => f
                .debug_struct("Success")
                .field("status", status)
                .field("bytes", &body.len())
                .finish(),
            NoteResponse::Status(s) => f.debug_tuple("Status").field(s).finish(),
        }
    }
}

/// Why the read produced no usable answer. Never carries request or answer content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CanisterError {
    /// A header value (user id, vault) cannot be sent; no request was made.
    #[error("canister request headers are not valid")]
    InvalidHeader,
    /// The URL could not be built; no request was made.
    #[error("canister URL could not be built")]
    InvalidUri,
    /// Connection or protocol failure before a status arrived.
    #[error("canister request failed")]
    Transport,
    /// The deadline passed; `status` when the head had arrived.
    #[error("canister request timed out")]
    Timeout {
        /// Status of the answer, when it had arrived.
        status: Option<u16>,
    },
    /// The 2xx body was over the cap.
    #[error("canister note exceeds the size cap")]
    TooLarge {
        /// Status of the answer.
        status: u16,
    },
    /// The 2xx body could not be read.
    #[error("canister body could not be read")]
    Body {
        /// Status of the answer.
        status: u16,
    },
}

impl CanisterError {
    /// The canister's status, when one arrived.
    pub fn upstream_status(&self) -> Option<u16> {
        match *self {
            CanisterError::Timeout { status } => status,
            CanisterError::TooLarge { status } | CanisterError::Body { status } => Some(status),
            _ => None,
        }
    }
}

/// The canister client.
pub struct CanisterClient {
    base: String,
    client: Client<Connector, Empty<Bytes>>,
    timeout: Duration,
    max_bytes: usize,
    gateway_auth: Option<HeaderValue>,
    /// Computed once rather than formatted by the client on every read.
    host: Option<HeaderValue>,
}

impl fmt::Debug for CanisterClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CanisterClient")
            .field("timeout", &self.timeout)
            .field("max_bytes", &self.max_bytes)
            .field("gateway_auth", &self.gateway_auth.is_some())
            .finish_non_exhaustive()
    }
}

impl CanisterClient {
    /// A client for the configured canister; `Ok(None)` when none is configured.
    pub fn new(
        config: &config::Config,
        connector: Connector,
    ) -> Result<Option<CanisterClient>, ConfigError> {
        let up = &config.upstream;
        let Some(url) = up.canister_url.as_deref() else {
            return Ok(None);
        };
        let bad_url = || ConfigError {
            key: "upstream.canister_url".to_owned(),
            message: "must be an absolute http or https URL without query or fragment".to_owned(),
        };
        // Validated once here, so building a request URL later only appends.
        let probe = endpoint(url, "/api/v1/notes/x").ok_or_else(bad_url)?;
        let base = url.strip_suffix('/').unwrap_or(url).to_owned();
        let gateway_auth = match &up.gateway_secret {
            None => None,
            Some(s) => {
                let mut v = HeaderValue::from_str(s.expose()).map_err(|_| ConfigError {
                    key: "upstream.gateway_secret".to_owned(),
                    message: "is not a valid header value".to_owned(),
                })?;
                v.set_sensitive(true);
                Some(v)
            }
        };
        Ok(Some(CanisterClient {
            base,
            client: pooled_client(connector, up.pool_max_idle),
            timeout: Duration::from_millis(up.canister_timeout_ms),
            max_bytes: up.note_max_bytes,
            gateway_auth,
            host: upstream::http1_host(&probe),
        }))
    }

    /// The URL of the one read: `{canister}/api/v1/notes/{encodeURIComponent(path)}`.
    pub fn note_uri(&self, path: &VaultPath) -> Result<Uri, CanisterError> {
        const NOTES: &str = "/api/v1/notes/";
        // Built in one buffer the URI then owns: no formatting, no second copy.
        let mut uri =
            String::with_capacity(self.base.len() + NOTES.len() + path.as_str().len() * 3);
        uri.push_str(&self.base);
        uri.push_str(NOTES);
        path.encode_component_into(&mut uri);
        Uri::try_from(uri).map_err(|_| CanisterError::InvalidUri)
    }

    /// Makes the one read with `headers` (the surface's set) plus `Accept` and, when
    /// configured, `X-Gateway-Auth`.
    pub async fn get_note(
        &self,
        path: &VaultPath,
        headers: HeaderMap,
    ) -> Result<NoteResponse, CanisterError> {
        let mut request = Request::builder()
            .method(Method::GET)
            .uri(self.note_uri(path)?)
            .body(Empty::<Bytes>::new())
            .map_err(|_| CanisterError::InvalidUri)?;
        let h = request.headers_mut();
        *h = headers;
        h.insert(
            http::header::ACCEPT,
            HeaderValue::from_static("application/json"),
        );
        if let Some(auth) = &self.gateway_auth {
            h.insert(HeaderName::from_static("x-gateway-auth"), auth.clone());
        }
        if let Some(host) = &self.host {
            h.insert(http::header::HOST, host.clone());
        }

        let mut status_seen = None;
        let call = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|_| CanisterError::Transport)?;
            let status = response.status().as_u16();
            status_seen = Some(status);
            if !response.status().is_success() {
                return Ok(NoteResponse::Status(status));
            }
            // Refuse before reading when the length is announced and too large.
            let announced = response
                .headers()
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            if announced.is_some_and(|n| n > self.max_bytes as u64) {
                return Err(CanisterError::TooLarge { status });
            }
            let body = Limited::new(response.into_body(), self.max_bytes)
                .collect()
                .await
                .map_err(|e| {
                    if e.is::<http_body_util::LengthLimitError>() {
                        CanisterError::TooLarge { status }
                    } else {
                        CanisterError::Body { status }
                    }
                })?
                .to_bytes();
            Ok(NoteResponse::Success { status, body })
        };
        // Bound to a statement of its own so the borrow of `status_seen` ends here.
        let outcome = tokio::time::timeout(self.timeout, call).await;
        match outcome {
            Ok(result) => result,
            Err(_) => Err(CanisterError::Timeout {
                status: status_seen,
            }),
        }
    }
}

/// The REST header set of §4 (besides `Accept` and `X-Gateway-Auth`, which
/// [`CanisterClient::get_note`] adds): `X-Vault-Id`, `X-User-Id` = effective user,
/// `X-Actor-Id` = JWT `sub`. No `Authorization`, no `Content-Type`.
///
/// Values must be printable ASCII: the gateway's `fetch` sends a character up to U+00FF
/// as one Latin-1 byte and throws on anything above, so there is no UTF-8 spelling both
/// sides would agree on; such a value makes no request at all.
pub fn rest_headers(vault: &str, user: &str, actor: &str) -> Result<HeaderMap, CanisterError> {
    let mut h = HeaderMap::with_capacity(5);
    h.insert(HeaderName::from_static("x-vault-id"), header_value(vault)?);
    h.insert(HeaderName::from_static("x-user-id"), header_value(user)?);
    h.insert(HeaderName::from_static("x-actor-id"), header_value(actor)?);
    Ok(h)
}

/// The MCP header set of §4 (besides `Accept` and `X-Gateway-Auth`):
/// `Content-Type: application/json`, `Authorization` = the `initialize` request's header
/// (`token`, frozen with the session), `X-Vault-Id` = the session's vault, `X-User-Id` =
/// the session's effective user. No `X-Actor-Id`. Same value rule as [`rest_headers`].
pub fn mcp_headers(vault: &str, user: &str, token: &str) -> Result<HeaderMap, CanisterError> {
    let mut h = HeaderMap::with_capacity(6);
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let mut authorization = header_value(token)?;
    authorization.set_sensitive(true);
    h.insert(http::header::AUTHORIZATION, authorization);
    h.insert(HeaderName::from_static("x-vault-id"), header_value(vault)?);
    h.insert(HeaderName::from_static("x-user-id"), header_value(user)?);
    Ok(h)
}

/// A printable-ASCII header value (see [`rest_headers`] for why).
fn header_value(s: &str) -> Result<HeaderValue, CanisterError> {
    if !s
        .bytes()
        .all(|b| b == b' ' || b == b'\t' || b.is_ascii_graphic())
    {
        return Err(CanisterError::InvalidHeader);
    }
    HeaderValue::from_str(s).map_err(|_| CanisterError::InvalidHeader)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn s4_rest_headers_are_exactly_the_three_identity_headers() {
        let h = rest_headers("vault-rest", "google:owner", "google:actor").unwrap();
        assert_eq!(h.len(), 3);
        assert_eq!(h["x-vault-id"], "vault-rest");
        assert_eq!(h["x-user-id"], "google:owner");
        assert_eq!(h["x-actor-id"], "google:actor");
        assert!(h.get("authorization").is_none());
        assert!(h.get("content-type").is_none());
    }

    #[test]
    fn s4_mcp_headers_carry_the_frozen_token_and_no_actor() {
        let h = mcp_headers("vault-mcp", "google:owner", "Bearer tok").unwrap();
        assert_eq!(h.len(), 4);
        assert_eq!(h["authorization"], "Bearer tok");
        assert_eq!(h["content-type"], "application/json");
        assert_eq!(h["x-vault-id"], "vault-mcp");
        assert_eq!(h["x-user-id"], "google:owner");
        assert!(h.get("x-actor-id").is_none());
    }

    #[test]
    fn s4_unsendable_header_values_make_no_request() {
        assert_eq!(
            rest_headers("v", "line\nbreak", "a").err(),
            Some(CanisterError::InvalidHeader)
        );
        assert_eq!(
            rest_headers("v", "u", "caf\u{e9}").err(),
            Some(CanisterError::InvalidHeader)
        );
    }

    #[test]
    fn s4_error_statuses_are_kept_for_the_record() {
        assert_eq!(
            CanisterError::TooLarge { status: 200 }.upstream_status(),
            Some(200)
        );
        assert_eq!(
            CanisterError::Timeout { status: None }.upstream_status(),
            None
        );
        assert_eq!(CanisterError::Transport.upstream_status(), None);
    }
}
