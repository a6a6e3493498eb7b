//! Sessions the sidecar and the gateway agree on (wire contract §6): `GET`, `HEAD` and
//! `DELETE` on `/mcp`, answered here on a session the caller does not hold and passed
//! through otherwise, and the reading of the gateway's answer to any request on a live
//! session, which says whether the gateway still knows it. An event stream the gateway
//! answers a `GET` with is read as it passes, and the list answers it replays are
//! rewritten as the answers of the list calls themselves are ([`Rewritten`]).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderValue};
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};

use super::answer::{boxed, finish_local, local_error, BAD_GATEWAY};
use super::gateway::{forward, is_event_stream};
use super::{BoxError, Generation, Peer, ProxyBody, Shared};
use crate::budget::{Refusal, Reservation};
use crate::mcp::sanitize::Sanitizer;
use crate::mcp::{
    Gate, McpError, McpService, OnSession, Passed, Rewrite, Rewriter, SseError,
    MAX_DROPPED_ANSWER_BYTES, MAX_LIST_ANSWER_BYTES,
};
use crate::upstream::ConnId;

/// `GET`, `HEAD` or `DELETE` on `/mcp` without a body ([`McpService::gate`]).
pub(super) async fn mcp_other(
    shared: &Shared,
    generation: &Generation,
    peer: &Peer,
    conn: ConnId,
    req: Request<Incoming>,
    started: Instant,
) -> Response<ProxyBody> {
    let service = &generation.mcp;
    let origin = req.headers().get(header::ORIGIN).cloned();
    let head = req.method() == Method::HEAD;
    let get = req.method() == Method::GET;
    let Passed {
        on,
        stream,
        owner,
        sanitize,
    } = match service.gate(req.method(), req.headers(), started) {
        Gate::Answer(r) => return local(service, r, origin.as_ref()),
        Gate::Forward(passed) => passed,
    };
    let sent = Instant::now();
    let response = match forward(shared, generation, peer, conn, req).await {
        Ok(response) => response,
        Err(local) => return finish_local(shared, started, local),
    };
    // A `HEAD` answer has no body to tell a dropped session by: it settles nothing
    // when it could be one.
    let settled = match on {
        Some(on) if !(head && service.must_read(response.status(), response.headers())) => {
            settle(service, &on, sent, response, generation.gateway_timeout).await
        }
        _ => Settled::Kept(response),
    };
    match settled {
        Settled::Kept(response) => {
            let response = match stream {
                Some(rewrite) if get => rewritten(shared, response, rewrite, sanitize, owner),
                _ => response,
            };
            finish_local(shared, started, response)
        }
        Settled::Dropped => local(
            service,
            service.refuse(&McpError::SessionNotFound, started),
            origin.as_ref(),
        ),
        Settled::Broken => finish_local(
            shared,
            started,
            local_error(http::StatusCode::BAD_GATEWAY, BAD_GATEWAY),
        ),
    }
}

/// The gateway's answer to a `GET`, its event stream rewritten as it passes when it is
/// one (a 200 `text/event-stream`): each event is held, from its first `data` line to
/// its end, within `owner`'s buffered-bytes budget (a caller the sidecar cannot name
/// shares one, keyed by the empty `sub`).
fn rewritten(
    shared: &Shared,
    response: Response<ProxyBody>,
    rewrite: Rewrite,
    sanitize: Option<Sanitizer>,
    owner: Option<String>,
) -> Response<ProxyBody> {
    if response.status() != http::StatusCode::OK || !is_event_stream(response.headers()) {
        return response;
    }
    let held = shared.budget.reservation(owner.as_deref().unwrap_or(""));
    let (mut parts, body) = response.into_parts();
    // The length changes with the rewrite; the server frames the stream itself.
    parts.headers.remove(header::CONTENT_LENGTH);
    let mut rewriter = Rewriter::new(rewrite, MAX_LIST_ANSWER_BYTES);
    if let Some(s) = sanitize {
        rewriter = rewriter.and_sanitize(s);
    }
    let body = Rewritten {
        inner: body,
        rewriter,
        held,
        ended: false,
        metrics: std::sync::Arc::clone(&shared.metrics),
    };
    Response::from_parts(parts, body.boxed_unsync())
}

/// Why a rewritten event stream was cut.
#[derive(Debug)]
struct StreamCut(&'static str);

impl std::fmt::Display for StreamCut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "event stream cut: {}", self.0)
    }
}

impl std::error::Error for StreamCut {}

/// An event stream from the gateway with its message events rewritten
/// ([`Rewriter`]). A message that cannot be read, an event over
/// [`MAX_LIST_ANSWER_BYTES`] or one the budget has no room for cuts the stream: an
/// error frame, which ends the client's connection (HTTP/1) or stream (HTTP/2) without
/// the event. The client may resume from the last event it had.
struct Rewritten {
    inner: ProxyBody,
    rewriter: Rewriter,
    /// The bytes the rewriter holds, in the caller's budget.
    held: Reservation,
    ended: bool,
    /// Where what the sanitizer rewrote is counted, when the stream ends.
    metrics: std::sync::Arc<crate::telemetry::Metrics>,
}

impl Drop for Rewritten {
    fn drop(&mut self) {
        use crate::telemetry::Sanitized;
        let c = self.rewriter.counts();
        let m = &self.metrics;
        m.sanitized(Sanitized::ToolError, c.tool_errors);
        m.sanitized(Sanitized::PromptError, c.prompt_errors);
        m.sanitized(Sanitized::RpcError, c.rpc_errors);
        m.sanitized(Sanitized::PathReplaced, c.paths_replaced);
        m.sanitized(Sanitized::PathDropped, c.paths_dropped);
    }
}

impl Rewritten {
    fn cut(&mut self, why: &'static str) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.ended = true;
        self.held.release();
        tracing::warn!(
            upstream = "gateway",
            reason = why,
            "gateway event stream cut"
        );
        Poll::Ready(Some(Err(Box::new(StreamCut(why)))))
    }

    /// Keeps the reservation at least at what the rewriter holds; all of it goes back
    /// once nothing is held (at the end of every event).
    fn account(&mut self) -> Result<(), Refusal> {
        let held = self.rewriter.held_bytes();
        if held == 0 {
            self.held.release();
        } else if held > self.held.bytes() {
            self.held.reserve(held - self.held.bytes())?;
        }
        Ok(())
    }
}

fn reason(e: SseError) -> &'static str {
    match e {
        SseError::NotJson | SseError::NotUtf8 => "not_json",
        SseError::TooLarge => "too_large",
    }
}

impl Body for Rewritten {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if this.ended {
                return Poll::Ready(None);
            }
            let mut out = Vec::new();
            match std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    let data = match frame.into_data() {
                        Ok(data) => data,
                        Err(other) => return Poll::Ready(Some(Ok(other))),
                    };
                    if let Err(e) = this.rewriter.feed(&data, &mut out) {
                        return this.cut(reason(e));
                    }
                    if this.account().is_err() {
                        return this.cut("over_budget");
                    }
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => {
                    this.ended = true;
                    let finished = this.rewriter.finish(&mut out);
                    this.held.release();
                    if let Err(e) = finished {
                        return this.cut(reason(e));
                    }
                }
            }
            if !out.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        // The length changes with the rewrite.
        SizeHint::default()
    }
}

/// An answer the sidecar built, with the gateway's CORS headers (§5).
fn local(
    service: &McpService,
    response: Response<Full<Bytes>>,
    origin: Option<&HeaderValue>,
) -> Response<ProxyBody> {
    let mut response = boxed(response);
    service.cors(response.headers_mut(), origin);
    response
}

/// What became of a request's session once the gateway answered.
pub(super) enum Settled {
    /// The gateway still knows the session: pass its answer on.
    Kept(Response<ProxyBody>),
    /// The gateway no longer knows the session, and neither does the sidecar now: the
    /// client gets 404 `Session not found`, which makes it initialize again.
    Dropped,
    /// The answer broke off or stalled while it was read.
    Broken,
}

/// Reads the gateway's answer to a request on `on`, which left at `sent`, as far as
/// needed to tell whether the gateway dropped the session: the body of an answer that
/// could say so, at most [`MAX_DROPPED_ANSWER_BYTES`] of it within `timeout`; any other
/// answer is passed on unread.
pub(super) async fn settle(
    service: &McpService,
    on: &OnSession,
    sent: Instant,
    response: Response<ProxyBody>,
    timeout: Duration,
) -> Settled {
    let (parts, body) = response.into_parts();
    if !service.must_read(parts.status, &parts.headers) {
        service.settle(on, sent, parts.status, &parts.headers, None);
        return Settled::Kept(Response::from_parts(parts, body));
    }
    let peeked = match tokio::time::timeout(timeout, peek(body, MAX_DROPPED_ANSWER_BYTES)).await {
        Ok(Ok(p)) => p,
        Ok(Err(_)) | Err(_) => return Settled::Broken,
    };
    let body = match peeked {
        Peeked::Whole(bytes) => {
            if service.settle(on, sent, parts.status, &parts.headers, Some(&bytes)) {
                return Settled::Dropped;
            }
            Full::new(bytes)
                .map_err(|never| match never {})
                .boxed_unsync()
        }
        Peeked::Longer(prefix, rest) => {
            // Longer than either answer: an ordinary one.
            service.settle(on, sent, parts.status, &parts.headers, None);
            Prefixed {
                prefix: Some(prefix),
                rest,
            }
            .boxed_unsync()
        }
    };
    Settled::Kept(Response::from_parts(parts, body))
}

/// The start of an answer body.
enum Peeked {
    /// All of it.
    Whole(Bytes),
    /// More than the limit: what was read, and the rest still to come.
    Longer(Bytes, ProxyBody),
}

/// Reads `body` until it ends or more than `limit` bytes have come.
async fn peek(mut body: ProxyBody, limit: usize) -> Result<Peeked, BoxError> {
    let mut read = BytesMut::new();
    while read.len() <= limit {
        match body.frame().await {
            None => return Ok(Peeked::Whole(read.freeze())),
            Some(frame) => {
                if let Ok(data) = frame?.into_data() {
                    read.extend_from_slice(&data);
                }
            }
        }
    }
    Ok(Peeked::Longer(read.freeze(), body))
}

/// An answer body whose first bytes were already read.
struct Prefixed {
    prefix: Option<Bytes>,
    rest: ProxyBody,
}

impl Body for Prefixed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(prefix) = this.prefix.take() {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        Pin::new(&mut this.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let n = self.prefix.as_ref().map_or(0, |p| p.len() as u64);
        let rest = self.rest.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower().saturating_add(n));
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper.saturating_add(n));
        }
        hint
    }
}
