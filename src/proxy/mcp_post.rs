//! `POST /mcp` (wire contract §6): the token, a slot, the body read within the budget,
//! then the sidecar's own answer, or its canonical bytes forwarded and the answer
//! watched (list rewriting, session learning, shadow comparison).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};

use super::answer::{
    boxed, close_after, finish_local, local_error, unread, BAD_REQUEST, GATEWAY_TIMEOUT,
};
use super::deadline::{self, Progress};
use super::dispatch::observe;
use super::gateway::{aim_at_gateway, gateway_failed, idle_bounded, Place};
use super::mcp_session::{settle, Settled};
use super::sanitize;
use super::{strip_hop_by_hop, Generation, Peer, ProxyBody, Shared};
use crate::budget::Reservation;
use crate::mcp::{self, Forward, McpError, Step, Watch};
use crate::shadow;
use crate::telemetry::{self, trace, Shadow, Surface};
use crate::upstream::{self, AnswerBody, Caller};
use tracing::Instrument as _;

/// Marks an answer head that came from the gateway (it carries the gateway's CORS).
#[derive(Clone, Copy)]
struct FromGateway;

/// How long an `initialize` answer waits for its session record to reach the disk.
const STORE_WAIT: Duration = Duration::from_secs(5);

/// `POST /mcp` (wire contract §6). Every answer the sidecar builds itself carries the
/// gateway's CORS headers (§5), as the gateway's own answers do.
pub(super) async fn mcp_post(
    shared: &Shared,
    generation: &Generation,
    peer: &Peer,
    req: Request<Incoming>,
    started: Instant,
) -> Response<ProxyBody> {
    let origin = req.headers().get(header::ORIGIN).cloned();
    let mut response = mcp_exchange(shared, generation, peer, req, started).await;
    if response.extensions().get::<FromGateway>().is_none() {
        generation.mcp.cors(response.headers_mut(), origin.as_ref());
    }
    response
}

/// The door, the decision, then either the sidecar's own answer or the buffered bytes
/// forwarded and the answer watched.
async fn mcp_exchange(
    shared: &Shared,
    generation: &Generation,
    peer: &Peer,
    req: Request<Incoming>,
    started: Instant,
) -> Response<ProxyBody> {
    let service = &generation.mcp;
    let (mut parts, body) = req.into_parts();
    // The token first, from the headers alone: an unauthenticated caller gets its 401
    // before it holds a slot or a buffered byte (§6 door).
    let identity = match service.authenticate(&parts.headers) {
        Ok(identity) => identity,
        Err(e) => return unread(&parts, &body, service.refuse(&e, started)),
    };
    let mut slot = match shared.budget.admit(&identity.sub) {
        Ok(slot) => slot,
        Err(r) => {
            return unread(
                &parts,
                &body,
                service.refuse(&McpError::Overloaded(r), started),
            )
        }
    };
    let gauge = shared.metrics.in_flight();
    let canonical = match service.read_body(&parts.headers, body, &mut slot).await {
        Ok(c) => c,
        Err(e) => {
            let mut response = service.refuse(&e, started);
            if parts.version < Version::HTTP_2 {
                // The body may be half read: this connection's framing is spent.
                close_after(&mut response);
            }
            return boxed(response);
        }
    };
    let sub = identity.sub.clone();
    let forward = match service
        .post(&parts, identity, &canonical.value, &mut slot, started)
        .await
    {
        Step::Answer(r) => return boxed(r),
        Step::Forward(f) => f,
    };
    drop(gauge);
    // A place at the gateway first: the forwarded call holds an upstream connection until
    // its answer (an event stream, perhaps) ends.
    let forwarded = match shared.forwarded.admit(&sub) {
        Ok(_slot) => Place::Identified { _slot },
        Err(refusal) => {
            shadow_failed(shared, &forward.watch);
            return boxed(service.refuse(&McpError::Overloaded(refusal), started));
        }
    };
    // What leaves is the sidecar's own serialization, never the client's bytes (§6).
    let body = Bytes::from(canonical.text);
    // What the answer's messages are read against: the requests they answer.
    let sanitizer = service.sanitizer_for(&canonical.value);
    drop(canonical.value);
    slot.unreserve(canonical.parse_cost);
    // The slot is free once classified; the forwarded bytes stay counted until the
    // gateway's answer head shows it has taken them.
    let mut reservation = slot.into_reservation();

    // The forward phase: from aiming the request (the trace context it carries names
    // this span) to the gateway's answer head.
    let forward_span = tracing::trace_span!(
        target: trace::TARGET,
        "forward",
        upstream_status_class = tracing::field::Empty,
    );
    if !forward_span.in_scope(|| aim_at_gateway(&mut parts, shared, generation, peer)) {
        return finish_local(
            shared,
            started,
            local_error(StatusCode::BAD_REQUEST, BAD_REQUEST),
        );
    }
    parts.headers.remove(header::CONTENT_ENCODING);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    parts
        .headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    let conn = upstream::conn_of(&parts.extensions);
    let caller = Caller::Principal {
        sub: &sub,
        scope: "",
        conn,
    };
    let sent = service.sending(&forward);
    let upstream = generation
        .client
        .request(Request::from_parts(parts, Full::new(body)), caller);
    let head = deadline::await_head(upstream, generation.gateway_timeout, &Progress::new())
        .instrument(forward_span.clone())
        .await;
    if let Some(Ok(response)) = &head {
        forward_span.record(
            "upstream_status_class",
            telemetry::status_class(response.status().as_u16()),
        );
    }
    // The gateway has taken the request's bytes (or never will); the reservation stays
    // for a list answer read into memory.
    reservation.release();
    let response = match head {
        Some(Ok(response)) => {
            let (mut parts, body) = response.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            parts.extensions.insert(FromGateway);
            if let Some(durable) = service.learn(&forward, &parts) {
                // A store that cannot keep up delays the answer a little, never forever;
                // the session stays in memory either way.
                let _ = tokio::time::timeout(STORE_WAIT, durable).await;
            }
            let Forward { watch, on, .. } = forward;
            // In a live session, an answer other than a success may be the gateway saying
            // it no longer knows the session: then the client gets 404 (§6).
            if let (Some(on), false) = (&on, parts.status.is_success()) {
                let body = idle_bounded(&parts.headers, body, forwarded, generation.gateway_idle);
                let response = Response::from_parts(parts, body);
                let response =
                    match settle(service, on, sent, response, generation.gateway_timeout).await {
                        Settled::Kept(response) => response,
                        Settled::Dropped => {
                            if matches!(watch, Watch::Shadow(_)) {
                                shadow::record(&shared.metrics, Surface::Mcp, Shadow::NotCompared);
                            }
                            return boxed(service.refuse(&McpError::SessionNotFound, started));
                        }
                        Settled::Broken => {
                            shadow_failed(shared, &watch);
                            return boxed(service.refuse(&McpError::BadGateway, started));
                        }
                    };
                let response = match watch {
                    Watch::Shadow(own) => observe(shared, response, Surface::Mcp, *own),
                    _ => response,
                };
                let response = match sanitizer {
                    Some(s) => sanitize::mcp_answer(shared, response, s, &sub),
                    None => response,
                };
                return finish_local(shared, started, response);
            }
            if let Some(on) = &on {
                // A success is never one of the answers that drop a session.
                service.settle(on, sent, parts.status, &parts.headers, None);
            }
            match watch {
                Watch::Rewrite(rewrite) if parts.status.is_success() => {
                    let read = collect_list(body, &mut reservation);
                    let original =
                        match tokio::time::timeout(generation.gateway_timeout, read).await {
                            Ok(Ok(bytes)) => bytes,
                            Ok(Err(e)) => return boxed(service.refuse(&e, started)),
                            Err(_) => return boxed(service.refuse(&McpError::BadGateway, started)),
                        };
                    // Every value, joined as a fetch client reads a repeated header: with
                    // only the first, a `text/html` ahead of `application/json` left a list
                    // unrewritten that clients parse as JSON.
                    let content_type = parts
                        .headers
                        .get_all(header::CONTENT_TYPE)
                        .iter()
                        .map(|v| String::from_utf8_lossy(v.as_bytes()))
                        .collect::<Vec<_>>()
                        .join(", ");
                    let content_type = (!content_type.is_empty()).then_some(content_type);
                    let body = match service.rewrite(rewrite, content_type.as_deref(), &original) {
                        Ok(new) => new,
                        Err(e) => return boxed(service.refuse(&e, started)),
                    };
                    drop(original);
                    // The answer stays in memory until the client has taken it: its bytes
                    // stay counted in the caller's budget until then.
                    let grown = body.len().saturating_sub(reservation.bytes());
                    if let Err(r) = reservation.reserve(grown) {
                        return boxed(service.refuse(&McpError::Overloaded(r), started));
                    }
                    // The length changed; the server frames the new body itself.
                    parts.headers.remove(header::CONTENT_LENGTH);
                    let body = Sliced {
                        rest: body,
                        _held: reservation,
                    };
                    Response::from_parts(parts, body.map_err(Into::into).boxed_unsync())
                }
                Watch::Shadow(own) => {
                    let body =
                        idle_bounded(&parts.headers, body, forwarded, generation.gateway_idle);
                    // The comparison reads the gateway's own bytes; the client gets them
                    // sanitized.
                    let observed = observe(
                        shared,
                        Response::from_parts(parts, body),
                        Surface::Mcp,
                        *own,
                    );
                    match sanitizer {
                        Some(s) => sanitize::mcp_answer(shared, observed, s, &sub),
                        None => observed,
                    }
                }
                _ => {
                    let body =
                        idle_bounded(&parts.headers, body, forwarded, generation.gateway_idle);
                    let response = Response::from_parts(parts, body);
                    match sanitizer {
                        Some(s) => sanitize::mcp_answer(shared, response, s, &sub),
                        None => response,
                    }
                }
            }
        }
        Some(Err(e)) => {
            shadow_failed(shared, &forward.watch);
            gateway_failed(&e)
        }
        None => {
            shadow_failed(shared, &forward.watch);
            local_error(StatusCode::GATEWAY_TIMEOUT, GATEWAY_TIMEOUT)
        }
    };
    finish_local(shared, started, response)
}

/// A rewritten answer handed to the connection a slice at a time, holding its budget
/// bytes until the last slice is taken: hyper drops a body once it has its last frame,
/// so one frame of the whole answer would give the bytes back before any was written.
struct Sliced {
    rest: Bytes,
    _held: Reservation,
}

/// How much of a rewritten answer the connection takes at once.
const SLICE: usize = 64 * 1024;

impl Body for Sliced {
    type Data = Bytes;
    // Never produced; the type the other answer bodies carry.
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        if this.rest.is_empty() {
            return Poll::Ready(None);
        }
        let n = this.rest.len().min(SLICE);
        Poll::Ready(Some(Ok(Frame::data(this.rest.split_to(n)))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.rest.len() as u64)
    }
}

/// Reads a list answer whole, at most [`mcp::MAX_LIST_ANSWER_BYTES`], each piece
/// counted in the caller's budget before it is kept.
async fn collect_list(
    mut body: AnswerBody,
    reservation: &mut Reservation,
) -> Result<Bytes, McpError> {
    let mut out = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| McpError::BadGateway)?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if out.len() + data.len() > mcp::MAX_LIST_ANSWER_BYTES {
            return Err(McpError::BadGateway);
        }
        reservation
            .reserve(data.len())
            .map_err(McpError::Overloaded)?;
        out.extend_from_slice(&data);
    }
    Ok(out.freeze())
}

/// Counts a shadowed call whose gateway answer never came.
fn shadow_failed(shared: &Shared, watch: &Watch) {
    if matches!(watch, Watch::Shadow(_)) {
        shadow::record(&shared.metrics, Surface::Mcp, Shadow::GatewayFailed);
    }
}
