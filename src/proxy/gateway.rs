//! Forwarding to the gateway (wire contract §7): the upstream URI, the request headers
//! the gateway is owed, the answer-head deadline and the idle gap inside bodies.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::uri::{Authority, Scheme};
use http::{request, Request, Response, StatusCode, Uri, Version};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};

use super::answer::{
    busy, close_after, finish_local, local_error, overloaded, BAD_GATEWAY, BAD_REQUEST,
    GATEWAY_TIMEOUT,
};
use super::deadline::{self, IdleBody, Progress};
use super::{
    forward_request_headers, strip_hop_by_hop, Downstream, Generation, Peer, ProxyBody, Shared,
};
use crate::auth::{self, Keys};
use crate::budget::{Refusal, Slot};
use crate::config::ConfigError;
use crate::limits::Admitted;
use crate::telemetry::{request_id, trace};
use crate::upstream::{self, AnswerBody, Caller, ConnId};
use tracing::Instrument as _;

/// The gateway's base URL, split for building upstream URIs.
#[derive(Debug, Clone)]
pub(super) struct GatewayBase {
    scheme: Scheme,
    authority: Authority,
    /// The base path without its trailing `/` (usually empty).
    prefix: String,
    /// The base URL as configured.
    pub(super) uri: Uri,
    /// The `Host` every forwarded HTTP/1.1 request carries, when known up front.
    pub(super) host: Option<HeaderValue>,
}

impl GatewayBase {
    /// Reads `upstream.gateway_url`.
    pub(super) fn parse(url: &str) -> Result<GatewayBase, ConfigError> {
        const KEY: &str = "upstream.gateway_url";
        let invalid = |m: &str| ConfigError::new(KEY, m);
        let uri: Uri = url.trim().parse().map_err(|_| invalid("not a valid URL"))?;
        let scheme = uri
            .scheme()
            .cloned()
            .ok_or_else(|| invalid("needs a scheme"))?;
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| invalid("needs a host"))?;
        let prefix = uri.path().trim_end_matches('/').to_owned();
        Ok(GatewayBase {
            scheme,
            authority,
            prefix,
            host: upstream::http1_host(&uri),
            uri,
        })
    }

    /// The upstream URI: the base plus the original path and query bytes, unchanged.
    pub(super) fn uri_for(&self, original: &Uri) -> Option<Uri> {
        let pq = original.path_and_query().map_or("/", |pq| pq.as_str());
        let pq = if pq.is_empty() { "/" } else { pq };
        // `*` (OPTIONS *) has no form under a base path.
        if !pq.starts_with('/') {
            return None;
        }
        let builder = Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone());
        let builder = match original.path_and_query() {
            // No base path: the original bytes as they are, without a copy.
            Some(original) if self.prefix.is_empty() && !original.as_str().is_empty() => {
                builder.path_and_query(original.clone())
            }
            _ => builder.path_and_query(format!("{}{pq}", self.prefix)),
        };
        builder.build().ok()
    }
}

/// A gateway answer body that may pause at most `gap` between frames, unless it is an
/// event stream (a quiet `GET /mcp` stream is waiting for events, not stalled). It keeps
/// the request's place among the requests at the gateway until it ends or is dropped.
pub(super) fn idle_bounded(
    headers: &HeaderMap,
    body: AnswerBody,
    slot: Place,
    gap: Duration,
) -> ProxyBody {
    let gap = (!is_event_stream(headers)).then_some(gap);
    let body = Held {
        inner: body,
        _place: slot,
    };
    IdleBody::new(body, gap, None).boxed_unsync()
}

/// Whether an answer with `headers` is an event stream.
pub(super) fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .get(..17)
                .is_some_and(|t| t.eq_ignore_ascii_case("text/event-stream"))
        })
}

/// The place a request holds at the gateway until its answer ends, given back on drop.
pub(super) enum Place {
    /// In the identified callers' bound, counted for the caller's `sub` too.
    Identified { _slot: Slot },
    /// The same, for an answer that is an event stream, which also holds one of the
    /// event streams' places.
    Streaming { _slot: Slot, _stream: Admitted },
    /// In the bound for requests without a verified token.
    Anonymous { _slot: Admitted },
}

/// A place for a request with `headers`, and the `sub` of its token: in the identified
/// callers' bound when its bearer token verifies (§1: signature and time claims) and
/// names a `sub`, else in the anonymous bound. The gateway decides what the caller may
/// do; this only sorts the request into a bound (and its upstream connection).
fn place(
    shared: &Shared,
    headers: &HeaderMap,
    keys: &Keys,
) -> Result<(Place, Option<String>), Refusal> {
    let verified = match auth::authorization(headers) {
        Ok(Some(value)) => auth::verify_token(Some(value), keys, auth::now_unix()).ok(),
        _ => None,
    };
    match verified.as_ref().and_then(auth::VerifiedToken::sub) {
        Some(sub) => shared
            .forwarded
            .admit(sub)
            .map(|_slot| (Place::Identified { _slot }, Some(sub.to_owned()))),
        None => shared
            .forwarded_anonymous
            .try_admit()
            .map(|_slot| (Place::Anonymous { _slot }, None))
            .ok_or(Refusal::AnonymousForwarded),
    }
}

/// A gateway answer body and the place its request holds at the gateway.
struct Held {
    inner: AnswerBody,
    _place: Place,
}

impl Body for Held {
    type Data = Bytes;
    type Error = upstream::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, upstream::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

pub(super) async fn passthrough(
    shared: &Shared,
    generation: &Generation,
    peer: &Peer,
    conn: ConnId,
    req: Request<Incoming>,
    started: Instant,
) -> Response<ProxyBody> {
    // A REST note route's server error carries the canister's error body: replaced. The
    // path is read only for a server error, the rare answer, not for every request.
    let uri = generation
        .config
        .sanitize
        .rest_errors
        .then(|| req.uri().clone());
    let response = match forward(shared, generation, peer, conn, req).await {
        Ok(r)
            if r.status().is_server_error()
                && uri.as_ref().is_some_and(crate::route::is_note_route) =>
        {
            super::sanitize::rest_error(&shared.metrics, r)
        }
        Ok(r) | Err(r) => r,
    };
    finish_local(shared, started, response)
}

/// Points a client's request head at the gateway (wire contract §7): the upstream URI,
/// HTTP/1.1 (what the sidecar speaks to every upstream) and the request headers the
/// gateway is owed. `false` when the target has no form
/// under the gateway's base (`*`).
pub(super) fn aim_at_gateway(
    parts: &mut request::Parts,
    shared: &Shared,
    generation: &Generation,
    peer: &Peer,
) -> bool {
    // A gateway without a base path is sent the path and query as they came (the client
    // uses only those): the URI is rebuilt only when it must change.
    let as_is = generation.gateway.prefix.is_empty()
        && parts
            .uri
            .path_and_query()
            .is_some_and(|pq| pq.as_str().starts_with('/'));
    let uri = if as_is {
        None
    } else {
        let Some(uri) = generation.gateway.uri_for(&parts.uri) else {
            return false;
        };
        Some(uri)
    };
    parts.version = Version::HTTP_11;
    let from = Downstream {
        peer,
        tls: shared.tls,
        trust: &generation.trust,
    };
    // The client's authority (HTTP/2 carries it in the URI) before the URI is the
    // gateway's.
    forward_request_headers(
        &mut parts.headers,
        &from,
        parts.uri.authority(),
        generation.gateway.host.as_ref(),
    );
    // The request's id, the one its access line carries, replacing whatever came.
    if let Some(id) = request_id::current() {
        parts.headers.insert(request_id::HEADER, id);
    }
    // With tracing on, the gateway's work is a child of the forward span.
    trace::inject(&mut parts.headers);
    if let Some(uri) = uri {
        parts.uri = uri;
    }
    true
}

/// Sends `req`, which came on client connection `conn`, to the gateway (wire contract
/// §7): its answer, or the sidecar's own error answer when there is none. Traced as the
/// `forward` phase, up to the answer head.
pub(super) async fn forward(
    shared: &Shared,
    generation: &Generation,
    peer: &Peer,
    conn: ConnId,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Response<ProxyBody>> {
    // With tracing off, no span to enter: the exchange is awaited as it is rather than
    // moved once more into a wrapper, on every passed-through request.
    if !trace::enabled() {
        return send(shared, generation, peer, conn, req).await;
    }
    let span = tracing::trace_span!(
        target: trace::TARGET,
        "forward",
        upstream_status_class = tracing::field::Empty,
    );
    let answer = send(shared, generation, peer, conn, req)
        .instrument(span.clone())
        .await;
    if let Ok(response) = &answer {
        span.record(
            "upstream_status_class",
            crate::telemetry::status_class(response.status().as_u16()),
        );
    }
    answer
}

/// [`forward`] itself.
async fn send(
    shared: &Shared,
    generation: &Generation,
    peer: &Peer,
    conn: ConnId,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Response<ProxyBody>> {
    let (mut parts, body) = req.into_parts();
    let version = parts.version;
    // Nothing is read or sent before there is room: each request at the gateway holds an
    // upstream connection until its answer ends. Requests without a token that verifies
    // have a bound of their own, so that they cannot take the identified callers' room,
    // and one identified caller cannot take all of theirs.
    let (slot, sub) = match place(shared, &parts.headers, &generation.keys) {
        Ok(placed) => placed,
        Err(refusal) => {
            shared.metrics.admission_refused(refusal);
            return Err(overloaded(&parts, &body));
        }
    };
    // The gateway connection this request may use: one its caller's earlier exchanges
    // left, never another caller's.
    let caller = match &sub {
        Some(sub) => Caller::Principal {
            sub,
            scope: "",
            conn,
        },
        None => Caller::Anonymous(conn),
    };
    if !aim_at_gateway(&mut parts, shared, generation, peer) {
        return Err(local_error(StatusCode::BAD_REQUEST, BAD_REQUEST));
    }
    // No total deadline: the request body may pause at most the idle gap, and the answer
    // head is awaited for the head timeout after the last request byte went out.
    let sent = Progress::new();
    let body = IdleBody::new(body, Some(generation.gateway_idle), Some(sent.clone()));
    let upstream = generation
        .client
        .request(Request::from_parts(parts, body), caller);
    match deadline::await_head(upstream, generation.gateway_timeout, &sent).await {
        Some(Ok(response)) => {
            let (mut parts, body) = response.into_parts();
            // Connected clients keep event streams open for hours: they may hold only
            // their share of the identified callers' places, so that requests that end
            // always find room.
            let slot = match slot {
                Place::Identified { _slot } if is_event_stream(&parts.headers) => {
                    let Some(_stream) = shared.event_streams.try_admit() else {
                        shared.metrics.admission_refused(Refusal::EventStreams);
                        // The request body may not all have been read.
                        return Err(busy(version < Version::HTTP_2));
                    };
                    Place::Streaming { _slot, _stream }
                }
                other => other,
            };
            strip_hop_by_hop(&mut parts.headers);
            let body = idle_bounded(&parts.headers, body, slot, generation.gateway_idle);
            Ok(Response::from_parts(parts, body))
        }
        Some(Err(e)) if e.is_client_body() => {
            // The client's body broke (bad chunking, a stall past the idle gap): its
            // fault, not the gateway's, and the rest of the stream cannot be framed.
            let mut response = local_error(StatusCode::BAD_REQUEST, BAD_REQUEST);
            close_after(&mut response);
            Err(response)
        }
        Some(Err(e)) => Err(gateway_failed(&e)),
        None => Err(local_error(StatusCode::GATEWAY_TIMEOUT, GATEWAY_TIMEOUT)),
    }
}

/// The gateway could not be reached or broke off: 502, with only the error's kind logged.
pub(super) fn gateway_failed(e: &upstream::Error) -> Response<ProxyBody> {
    let kind = if e.is_connect() { "connect" } else { "other" };
    tracing::warn!(
        upstream = "gateway",
        error_kind = kind,
        "gateway request failed"
    );
    local_error(StatusCode::BAD_GATEWAY, BAD_GATEWAY)
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn upstream_uri_keeps_path_and_query_bytes() {
        let base = GatewayBase::parse("http://gw.internal:3000/").expect("base");
        let original: Uri = "/a/./b/../c//d%2f?x=%2F&y=a+b&z=%&w=%zz"
            .parse()
            .expect("uri");
        let uri = base.uri_for(&original).expect("upstream");
        assert_eq!(
            uri.to_string(),
            "http://gw.internal:3000/a/./b/../c//d%2f?x=%2F&y=a+b&z=%&w=%zz"
        );
        let prefixed = GatewayBase::parse("https://gw/base/").expect("base");
        let uri = prefixed
            .uri_for(&"/x?q".parse().expect("uri"))
            .expect("upstream");
        assert_eq!(uri.to_string(), "https://gw/base/x?q");
        assert!(base.uri_for(&"*".parse().expect("uri")).is_none());
    }
}
