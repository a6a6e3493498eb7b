//! The one upstream read (wire contract §4): `GET {canister}/api/v1/notes/{path}`.
//!
//! Exactly one request per call, never a redirect followed (hyper's clients do not
//! follow them), a total deadline on a real tokio timer that covers the body too, and a
//! body cap: reading stops as soon as the cap is passed. Only a 2xx body is read; other
//! answers are reduced to their status and never looked at. The memory the body takes is
//! charged to the caller before it is taken, as it arrives, so a note is never held
//! uncounted.

use std::fmt;
use std::time::Duration;
use tracing::Instrument as _;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri};
use http_body_util::{BodyExt, Empty};
use hyper::body::Body;

use crate::config::{self, ConfigError};
use crate::hosted::{endpoint, pooled_client};
use crate::path::VaultPath;
use crate::upstream::{self, Caller, Connector, Observer};

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
    /// The caller's charge refused the memory the body needs.
    #[error("canister note does not fit the caller's budget")]
    Refused {
        /// Status of the answer.
        status: u16,
    },
}

impl CanisterError {
    /// The canister's status, when one arrived.
    pub fn upstream_status(&self) -> Option<u16> {
        match *self {
            CanisterError::Timeout { status } => status,
            CanisterError::TooLarge { status }
            | CanisterError::Body { status }
            | CanisterError::Refused { status } => Some(status),
            _ => None,
        }
    }
}

/// The canister client.
pub struct CanisterClient {
    base: String,
    client: upstream::Client,
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
    /// A client for the configured canister, its framing faults told to `observer`;
    /// `Ok(None)` when none is configured.
    pub fn new(
        config: &config::Config,
        connector: &Connector,
        observer: Observer,
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
            client: pooled_client(&probe, connector, config, observer, "upstream.canister_url")?,
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

    /// Makes the one read for `caller` with `headers` (the surface's set) plus `Accept`
    /// and, when configured, `X-Gateway-Auth`. `charge` is asked for every byte of buffer the body
    /// takes before it is taken ([`read_charged`]); what it granted stays granted, for the
    /// caller to give back.
    pub async fn get_note(
        &self,
        path: &VaultPath,
        headers: HeaderMap,
        caller: Caller<'_>,
        charge: &mut (dyn FnMut(usize) -> bool + Send),
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
        // The canister-read phase; its answer's status class is its only attribute.
        let span = tracing::trace_span!(
            target: crate::telemetry::trace::TARGET,
            "canister_read",
            upstream_status_class = tracing::field::Empty,
        );
        let call = async {
            let response = self
                .client
                .request(request, caller)
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
            let body = read_charged(response.into_body(), announced, self.max_bytes, charge)
                .await
                .map_err(|e| match e {
                    ReadError::TooLarge => CanisterError::TooLarge { status },
                    ReadError::Refused => CanisterError::Refused { status },
                    ReadError::Body => CanisterError::Body { status },
                })?;
            Ok(NoteResponse::Success { status, body })
        };
        // Bound to a statement of its own so the borrow of `status_seen` ends here.
        let outcome = tokio::time::timeout(self.timeout, call)
            .instrument(span.clone())
            .await;
        if let Some(status) = status_seen {
            span.record(
                "upstream_status_class",
                crate::telemetry::status_class(status),
            );
        }
        match outcome {
            Ok(result) => result,
            Err(_) => Err(CanisterError::Timeout {
                status: status_seen,
            }),
        }
    }
}

/// Why [`read_charged`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadError {
    /// More than the cap.
    TooLarge,
    /// The charge said no.
    Refused,
    /// The body failed.
    Body,
}

/// Reads `body` (at most `max` bytes), asking `charge` for the memory it will hold before
/// holding it: all of an `announced` length at once (a length that lies only makes the
/// body fail or grow as below), otherwise a first buffer, then doubling. A body of one
/// frame, the usual note, is kept as it came; later frames are copied into one buffer
/// the size of what was granted, so besides it only the frame in hand is held.
async fn read_charged<B>(
    body: B,
    announced: Option<u64>,
    max: usize,
    charge: &mut (dyn FnMut(usize) -> bool + Send),
) -> Result<Bytes, ReadError>
where
    B: Body<Data = Bytes>,
{
    /// The first grant when no length is announced: a typical note fits.
    const FIRST: usize = 16 * 1024;
    // What `charge` has granted; the allocator may round a capacity up.
    let mut granted = 0usize;
    let mut grant = |granted: &mut usize, to: usize| {
        if to > *granted {
            if !charge(to - *granted) {
                return Err(ReadError::Refused);
            }
            *granted = to;
        }
        Ok(())
    };
    if let Some(n) = announced {
        grant(&mut granted, usize::try_from(n).unwrap_or(max).min(max))?;
    }
    let mut first: Option<Bytes> = None;
    let mut buf: Vec<u8> = Vec::new();
    let mut body = std::pin::pin!(body);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| ReadError::Body)?;
        // Trailers are not part of the note.
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if data.is_empty() {
            continue;
        }
        let held = first.as_ref().map_or(buf.len(), Bytes::len);
        let need = held.saturating_add(data.len());
        if need > max {
            return Err(ReadError::TooLarge);
        }
        if need > granted {
            let to = need.max(granted.saturating_mul(2)).max(FIRST).min(max);
            grant(&mut granted, to)?;
        }
        if held == 0 {
            first = Some(data);
            continue;
        }
        buf.reserve_exact(granted - buf.len());
        if let Some(f) = first.take() {
            buf.extend_from_slice(&f);
        }
        buf.extend_from_slice(&data);
    }
    Ok(first.unwrap_or_else(|| Bytes::from(buf)))
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

    /// Reads `frames` through [`read_charged`], answering each charge with `grant`;
    /// the result and every charge asked.
    async fn read_frames(
        frames: &[usize],
        announced: Option<u64>,
        max: usize,
        grant: impl Fn(usize, usize) -> bool + Send + Sync,
    ) -> (Result<Bytes, ReadError>, Vec<usize>) {
        use knowtation_mock_upstream::body::MockBody;
        let (tx, body) = MockBody::channel(None);
        let frames: Vec<Bytes> = frames.iter().map(|&n| Bytes::from(vec![b'x'; n])).collect();
        tokio::spawn(async move {
            for f in frames {
                if tx.send(f).await.is_err() {
                    return;
                }
            }
        });
        let mut asked = Vec::new();
        let mut total = 0;
        let mut charge = |n: usize| {
            asked.push(n);
            total += n;
            grant(n, total)
        };
        let read = read_charged(body, announced, max, &mut charge).await;
        (read, asked)
    }

    #[tokio::test]
    async fn a_body_is_charged_before_the_buffer_grows() {
        let (read, asked) =
            read_frames(&[10_000, 10_000, 50_000], None, 1 << 20, |_, _| true).await;
        assert_eq!(read.unwrap().len(), 70_000);
        // A first buffer, then doubling, then exactly what the last frame needs.
        assert_eq!(asked, [16_384, 16_384, 70_000 - 32_768]);

        // An announced length is asked for once, before any frame is read.
        let (read, asked) = read_frames(&[300, 700], Some(1_000), 1 << 20, |_, _| true).await;
        assert_eq!(read.unwrap().len(), 1_000);
        assert_eq!(asked, [1_000]);

        // A length that understates the body only makes it grow as without one.
        let (read, asked) = read_frames(&[600, 40_000], Some(1_000), 1 << 20, |_, _| true).await;
        assert_eq!(read.unwrap().len(), 40_600);
        assert_eq!(asked, [1_000, 40_600 - 1_000]);
        // One that overstates it is held to the cap.
        let (read, asked) = read_frames(&[10], Some(u64::MAX), 4_096, |_, _| true).await;
        assert_eq!(read.unwrap().len(), 10);
        assert_eq!(asked, [4_096]);
    }

    #[tokio::test]
    async fn a_body_of_one_frame_is_kept_as_it_came() {
        let note = Bytes::from(vec![b'n'; 3_000]);
        let body = knowtation_mock_upstream::body::MockBody::full(note.clone());
        let mut asked = Vec::new();
        let read = read_charged(body, Some(3_000), 1 << 20, &mut |n| {
            asked.push(n);
            true
        })
        .await
        .unwrap();
        assert_eq!(read.as_ptr(), note.as_ptr());
        assert_eq!(asked, [3_000]);
    }

    #[tokio::test]
    async fn a_refused_charge_or_the_cap_stops_the_read() {
        // The budget runs out at 20,000 bytes: the read stops at the frame that would
        // need more, having held no byte it was not granted.
        let (read, asked) = read_frames(&[10_000, 10_000, 50_000], None, 1 << 20, |_, total| {
            total <= 20_000
        })
        .await;
        assert_eq!(read, Err(ReadError::Refused));
        assert_eq!(asked, [16_384, 16_384]);
        let (read, asked) = read_frames(&[100], Some(100), 1 << 20, |_, _| false).await;
        assert_eq!(read, Err(ReadError::Refused));
        assert_eq!(asked, [100]);

        // Over the cap: refused at the frame that passes it, never charged beyond it.
        let (read, asked) = read_frames(&[3_000, 3_000], None, 5_000, |_, _| true).await;
        assert_eq!(read, Err(ReadError::TooLarge));
        assert!(asked.iter().sum::<usize>() <= 5_000, "{asked:?}");
    }

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
