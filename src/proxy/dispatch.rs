//! The request phase: refuse what cannot be framed or forwarded safely, classify the
//! path once with [`route::routes`], then hand the request to its handler: a view's REST
//! route (section-source or note-outline, enforced or shadowed), the MCP door, or
//! passthrough. A REST route whose view the policy passes is no route of the sidecar's.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body as _, Incoming};
use tracing::Instrument as _;

use super::answer::{
    close_after, finish_local, local_error, unread, BAD_REQUEST, HEADERS_TOO_LARGE,
    METHOD_NOT_ALLOWED,
};
use super::conn::{ConnState, Tracked};
use super::gateway::{forward, passthrough};
use super::mcp_post::mcp_post;
use super::mcp_session::mcp_other;
use super::{Generation, Peer, ProxyBody, Shared};
use crate::config::{Local, Mode};
use crate::extract::View;
use crate::mcp::ViewMode;
use crate::route::{self, Route};
use crate::shadow::{self, Observed, Own};
use crate::telemetry::{self, request_id, trace, Outcome, Shadow, Surface};
use crate::upstream;

/// One request, from classification to the answer the connection writes, counted for
/// the drain and for the connection's idle deadline.
pub(super) async fn handle(
    shared: Arc<Shared>,
    conn: Arc<ConnState>,
    peer: &Peer,
    req: Request<Incoming>,
) -> Response<Tracked> {
    let active = conn.begin_request();
    // A `GET /mcp` event stream waits for events, not for an answer: shutdown does not
    // wait for it, and ends it once every other request is done.
    // Classified once, here: the drain needs it before the answer, the request phase after.
    let generation = shared.live.load_local();
    let passed = |view| generation.rest.mode(view) == ViewMode::Pass;
    let span = trace::request_span(req.headers());
    let class = span.in_scope(|| {
        let _classify = tracing::trace_span!(target: trace::TARGET, "classify").entered();
        route::routes(req.uri())
            .without(passed(View::SectionSource), passed(View::NoteOutline))
            .for_method(req.method())
    });
    span.record("route", route_name(class));
    let stream = req.method() == Method::GET && class == Route::Mcp;
    let ordinary = (!stream).then(|| shared.drain.begin());
    let head = req.method() == Method::HEAD;
    let http2 = req.version() == Version::HTTP_2;
    // The id its access line carries and the gateway is told (`X-Request-Id`); with
    // tracing on and no id from the caller, the trace id.
    let id = request_id::from_caller(req.headers())
        .or_else(|| trace::trace_id(&span).and_then(|t| HeaderValue::from_str(&t).ok()))
        .unwrap_or_else(request_id::make);
    // Boxed: the request phase is the largest state of this future, which hyper moves
    // whole (twice) for each request it starts; wrapped in the id's scope and the span
    // as well, it was copied several times over, about 13,000 instructions a request.
    let routed = Box::pin(route(&shared, generation, &conn, peer, class, req));
    let mut response = request_id::scope(id, routed.instrument(span.clone())).await;
    span.record(
        "status_class",
        telemetry::status_class(response.status().as_u16()),
    );
    if head && !response.headers().contains_key(header::CONTENT_LENGTH) {
        // The length the GET answer would have (RFC 9110 §8.6), for the sidecar's own
        // answers; a gateway answer carries its own header.
        if let Some(n) = response.body().size_hint().exact().filter(|n| *n > 0) {
            response
                .headers_mut()
                .insert(header::CONTENT_LENGTH, HeaderValue::from(n));
        }
    }
    response.map(|body| {
        // A HEAD answer has no body (RFC 9110 §9.3.2). hyper drops one only on HTTP/1;
        // on HTTP/2 the sidecar's own error answers would carry theirs and clients reset
        // the stream.
        let body = if head {
            Full::new(Bytes::new())
                .map_err(|never| match never {})
                .boxed_unsync()
        } else if stream {
            shared.drain.endable(body).boxed_unsync()
        } else {
            body
        };
        Tracked::new(body, active, ordinary, http2)
    })
}

/// The route class as a span attribute.
fn route_name(class: Route) -> &'static str {
    match class {
        Route::SectionSource => "section_source",
        Route::NoteOutline => "note_outline",
        Route::Mcp => "mcp",
        Route::Passthrough => "passthrough",
    }
}

/// The request phase; `class` is the handler [`route::routes`] finds for the request's
/// path and method, computed once by [`handle`].
async fn route(
    shared: &Shared,
    generation: Local<Generation>,
    conn: &ConnState,
    peer: &Peer,
    class: Route,
    mut req: Request<Incoming>,
) -> Response<ProxyBody> {
    let started = Instant::now();
    let http1 = req.version() < Version::HTTP_2;
    let te = req.headers().contains_key(header::TRANSFER_ENCODING);
    if http1
        && te
        && (conn.ambiguous_framing() || req.headers().contains_key(header::CONTENT_LENGTH))
    {
        let mut response = local_error(StatusCode::BAD_REQUEST, BAD_REQUEST);
        // The rest of the stream cannot be trusted to be framed as hyper read it.
        close_after(&mut response);
        return finish_local(shared, started, response);
    }
    if req.headers().len() > shared.max_headers {
        return finish_local(
            shared,
            started,
            local_error(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                HEADERS_TOO_LARGE,
            ),
        );
    }
    if req.method() == Method::CONNECT {
        return finish_local(
            shared,
            started,
            local_error(StatusCode::METHOD_NOT_ALLOWED, METHOD_NOT_ALLOWED),
        );
    }
    // DNS-rebinding protection: an `Origin` the sidecar does not allow is refused before
    // anything else is decided about the request (see `McpService::check_origin`).
    if class == Route::Mcp {
        if let Err(e) = generation.mcp.check_origin(req.headers()) {
            let service = &generation.mcp;
            let (parts, body) = req.into_parts();
            let mut response = unread(&parts, &body, service.refuse(&e, started));
            service.cors(response.headers_mut(), parts.headers.get(header::ORIGIN));
            return response;
        }
    }
    // The two largest paths are boxed: every request's future is as large as its largest
    // path and is moved whole several times on its way into hyper, so without the boxes
    // each passthrough and REST request copied about 5 KB for the MCP and shadow states
    // it never uses.
    match (class, req.method()) {
        (
            Route::SectionSource | Route::NoteOutline,
            &Method::GET | &Method::HEAD | &Method::OPTIONS,
        ) => {
            let view = match class {
                Route::NoteOutline => View::NoteOutline,
                _ => View::SectionSource,
            };
            // The handlers' upstream exchanges are keyed on the client connection too.
            req.extensions_mut().insert(conn.id());
            // Shadow mode compares what the sidecar owns; a denied route is refused
            // whatever the mode, so that the gateway never runs it.
            if generation.config.intercept.mode == Mode::Shadow
                && generation.rest.mode(view) == ViewMode::Own
            {
                return Box::pin(shadow_intercept(
                    shared,
                    &generation,
                    peer,
                    req,
                    started,
                    view,
                ))
                .await;
            }
            return intercept(shared, &generation, req, started, view).await;
        }
        // Every POST is classified: a body the sidecar cannot read never passes (§6).
        (Route::Mcp, &Method::POST) => {
            req.extensions_mut().insert(conn.id());
            return Box::pin(mcp_post(shared, &generation, peer, req, started)).await;
        }
        // Only a POST body is read and re-serialized (§6). The SDK ignores a body on GET
        // and DELETE, and the gateway has no other method on `/mcp`, but bytes the
        // sidecar never read must not reach a gateway whose router might read them.
        (Route::Mcp, _)
            if !req.body().is_end_stream() && req.body().size_hint().exact() != Some(0) =>
        {
            let mut response = local_error(StatusCode::BAD_REQUEST, BAD_REQUEST);
            if req.version() < Version::HTTP_2 {
                close_after(&mut response);
            }
            return finish_local(shared, started, response);
        }
        (Route::Mcp, &Method::GET | &Method::HEAD | &Method::DELETE) => {
            return Box::pin(mcp_other(
                shared,
                &generation,
                peer,
                conn.id(),
                req,
                started,
            ))
            .await;
        }
        _ => {}
    }
    passthrough(shared, &generation, peer, conn.id(), req, started).await
}

async fn intercept(
    shared: &Shared,
    generation: &Generation,
    req: Request<Incoming>,
    started: Instant,
    view: View,
) -> Response<ProxyBody> {
    let gauge = shared.metrics.in_flight();
    // The body, if any, is never read: the route takes none. The REST table takes its
    // in-flight slot from the budget only once the token has verified.
    let (parts, body) = req.into_parts();
    let (response, mut i) = generation.rest.handle(&parts, &shared.budget, view).await;
    drop(gauge);
    i.elapsed = started.elapsed();
    shared.metrics.record(&i);
    telemetry::log_intercepted(&i);
    unread(&parts, &body, response)
}

/// Shadow mode on the REST route: the request passes to the gateway as it would without
/// the sidecar, the sidecar's own answer is computed beside it, and the gateway's answer
/// goes back to the client, compared on its way ([`shadow`]).
async fn shadow_intercept(
    shared: &Shared,
    generation: &Generation,
    peer: &Peer,
    req: Request<Incoming>,
    started: Instant,
    view: View,
) -> Response<ProxyBody> {
    let mut own_parts = Request::new(()).into_parts().0;
    own_parts.method = req.method().clone();
    own_parts.uri = req.uri().clone();
    own_parts.version = req.version();
    own_parts.headers = req.headers().clone();
    own_parts
        .extensions
        .insert(upstream::conn_of(req.extensions()));
    let own = async {
        let _gauge = shared.metrics.in_flight();
        let (response, mut i, witness) = generation
            .rest
            .handle_shadow(&own_parts, &shared.budget, view)
            .await;
        i.elapsed = started.elapsed();
        shared.metrics.record(&i);
        telemetry::log_intercepted(&i);
        let limited = matches!(i.outcome, Outcome::RateLimited | Outcome::Overloaded);
        let mut own = Own::from_response(response, limited, witness).await;
        own.compare_body = own_parts.method == Method::GET;
        own
    };
    let conn = upstream::conn_of(req.extensions());
    let (own, gateway) = tokio::join!(own, forward(shared, generation, peer, conn, req));
    let response = match gateway {
        Ok(response) => observe(shared, response, Surface::Rest, own),
        Err(local) => {
            shadow::record(&shared.metrics, Surface::Rest, Shadow::GatewayFailed);
            local
        }
    };
    finish_local(shared, started, response)
}

/// The gateway's answer, compared with `own` once its body has passed.
pub(super) fn observe(
    shared: &Shared,
    response: Response<ProxyBody>,
    surface: Surface,
    own: Own,
) -> Response<ProxyBody> {
    let (parts, body) = response.into_parts();
    let status = parts.status;
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let compare = move |body: Option<&[u8]>| {
        let gateway = shadow::Gateway {
            status,
            content_type: content_type.as_deref(),
            body,
        };
        match surface {
            Surface::Rest => shadow::compare_rest(&own, &gateway),
            Surface::Mcp => shadow::compare_mcp(&own, &gateway),
        }
    };
    let body = Observed::new(body, surface, Arc::clone(&shared.metrics), compare);
    Response::from_parts(parts, body.boxed_unsync())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future `f` returns, without calling it.
    fn future_size<'a, F: std::future::Future>(
        _: impl Fn(Arc<Shared>, Arc<ConnState>, &'a Peer, Request<Incoming>) -> F,
    ) -> usize {
        std::mem::size_of::<F>()
    }

    #[test]
    fn a_request_future_stays_small() {
        // hyper moves the future of each request it starts whole, twice: the request
        // phase, which holds every upstream exchange, is boxed, so that what is moved
        // is only what is held around it.
        let size = future_size(handle);
        assert!(size <= 1024, "{size}");
    }
}
