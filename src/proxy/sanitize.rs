//! The gateway's answers to what the sidecar passes through, sanitized on their way
//! (`[sanitize]`): MCP answers read message by message ([`crate::mcp::sanitize`]), and a
//! REST note route's 5xx body replaced.
//!
//! An MCP answer is read as it streams: an event stream event by event (each held from
//! its first `data` line to its end, [`Rewriter`]), a JSON answer whole. At most
//! `sanitize.max_message_bytes` of it is held, within the caller's buffered-bytes
//! budget; an answer with a larger message passes on as it came from there on, so that a
//! large result is never cut off (the upstream text this removes is at most a few hundred
//! bytes, and the sidecar's own note read stops at the same size). Nothing removed is
//! logged; what was rewritten is counted by kind when the answer ends.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, SizeHint};

use super::gateway::is_event_stream;
use super::{BoxError, ProxyBody, Shared};
use crate::budget::Reservation;
use crate::mcp::sanitize::{Counts, Sanitizer};
use crate::mcp::Rewriter;
use crate::telemetry::{Metrics, Sanitized};

/// `response` (the gateway's answer to a forwarded `POST /mcp`) with its messages
/// sanitized, when it is an event stream or JSON; any other answer as it came. The
/// bytes held count in `owner`'s budget.
pub(super) fn mcp_answer(
    shared: &Shared,
    response: Response<ProxyBody>,
    sanitizer: Sanitizer,
    owner: &str,
) -> Response<ProxyBody> {
    let json = response
        .headers()
        .get_all(header::CONTENT_TYPE)
        .iter()
        .any(|v| {
            String::from_utf8_lossy(v.as_bytes())
                .to_ascii_lowercase()
                .contains("json")
        });
    let mode = if is_event_stream(response.headers()) {
        Mode::Sse(Box::new(Rewriter::sanitizing(
            sanitizer.clone(),
            usize::MAX,
        )))
    } else if json {
        Mode::Json(BytesMut::new())
    } else {
        return response;
    };
    let (mut parts, inner) = response.into_parts();
    // The length changes with the rewrite; the server frames the answer itself.
    parts.headers.remove(header::CONTENT_LENGTH);
    let body = SanitizedBody {
        inner,
        mode,
        max: sanitizer.settings().max_message_bytes,
        sanitizer,
        held: shared.budget.reservation(owner),
        metrics: Arc::clone(&shared.metrics),
        counts: Counts::default(),
        too_large: false,
        ended: false,
    };
    Response::from_parts(parts, body.boxed_unsync())
}

/// How the answer is being read.
enum Mode {
    /// An event stream, message event by message event.
    Sse(Box<Rewriter>),
    /// A JSON answer, held whole.
    Json(BytesMut),
    /// Past the bound: passed on as it comes.
    Raw,
}

/// Why a sanitized answer was cut.
#[derive(Debug)]
struct Cut;

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("answer cut: no room in the buffered-bytes budget")
    }
}

impl std::error::Error for Cut {}

struct SanitizedBody {
    inner: ProxyBody,
    mode: Mode,
    max: usize,
    sanitizer: Sanitizer,
    /// The bytes held, in the caller's budget.
    held: Reservation,
    metrics: Arc<Metrics>,
    counts: Counts,
    too_large: bool,
    ended: bool,
}

impl SanitizedBody {
    /// From here on the answer passes as it comes: what is held goes first.
    fn give_up(&mut self, data: &[u8]) -> Bytes {
        let mut out = match std::mem::replace(&mut self.mode, Mode::Raw) {
            Mode::Sse(r) => {
                self.counts = add(self.counts, r.counts());
                r.into_unread()
            }
            Mode::Json(buf) => buf.to_vec(),
            Mode::Raw => Vec::new(),
        };
        out.extend_from_slice(data);
        self.too_large = true;
        self.held.release();
        Bytes::from(out)
    }

    /// Keeps the reservation at the bytes held.
    fn account(&mut self) -> bool {
        let held = match &self.mode {
            Mode::Sse(r) => r.held_bytes(),
            Mode::Json(buf) => buf.len(),
            Mode::Raw => 0,
        };
        if held == 0 {
            self.held.release();
            return true;
        }
        held <= self.held.bytes() || self.held.reserve(held - self.held.bytes()).is_ok()
    }

    fn cut(&mut self) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.ended = true;
        self.held.release();
        tracing::warn!(
            upstream = "gateway",
            reason = "over_budget",
            "gateway answer cut"
        );
        Poll::Ready(Some(Err(Box::new(Cut))))
    }

    /// The answer ended: the rest of it.
    fn finish(&mut self) -> Vec<u8> {
        self.ended = true;
        self.held.release();
        match std::mem::replace(&mut self.mode, Mode::Raw) {
            Mode::Sse(mut r) => {
                let mut out = Vec::new();
                // Sanitizing alone never refuses a stream: what cannot be read passes.
                let _ = r.finish(&mut out);
                self.counts = add(self.counts, r.counts());
                out
            }
            Mode::Json(buf) => match std::str::from_utf8(&buf)
                .ok()
                .and_then(|t| self.sanitizer.message(t, &mut self.counts))
            {
                Some(clean) => clean.into_bytes(),
                None => buf.to_vec(),
            },
            Mode::Raw => Vec::new(),
        }
    }
}

fn add(a: Counts, b: Counts) -> Counts {
    Counts {
        tool_errors: a.tool_errors + b.tool_errors,
        prompt_errors: a.prompt_errors + b.prompt_errors,
        rpc_errors: a.rpc_errors + b.rpc_errors,
        paths_replaced: a.paths_replaced + b.paths_replaced,
        paths_dropped: a.paths_dropped + b.paths_dropped,
    }
}

impl Drop for SanitizedBody {
    fn drop(&mut self) {
        let counts = match &self.mode {
            Mode::Sse(r) => add(self.counts, r.counts()),
            _ => self.counts,
        };
        let m = &self.metrics;
        m.sanitized(Sanitized::ToolError, counts.tool_errors);
        m.sanitized(Sanitized::PromptError, counts.prompt_errors);
        m.sanitized(Sanitized::RpcError, counts.rpc_errors);
        m.sanitized(Sanitized::PathReplaced, counts.paths_replaced);
        m.sanitized(Sanitized::PathDropped, counts.paths_dropped);
        m.sanitized(Sanitized::TooLarge, u64::from(self.too_large));
    }
}

impl Body for SanitizedBody {
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
            match std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    let data = match frame.into_data() {
                        Ok(data) => data,
                        Err(other) => return Poll::Ready(Some(Ok(other))),
                    };
                    let held = match &this.mode {
                        Mode::Sse(r) => r.held_bytes(),
                        Mode::Json(buf) => buf.len(),
                        Mode::Raw => return Poll::Ready(Some(Ok(Frame::data(data)))),
                    };
                    if held + data.len() > this.max {
                        let out = this.give_up(&data);
                        return Poll::Ready(Some(Ok(Frame::data(out))));
                    }
                    let mut out = Vec::new();
                    match &mut this.mode {
                        Mode::Sse(r) => {
                            if r.feed(&data, &mut out).is_err() {
                                // Sanitizing alone refuses nothing; should a reader error
                                // come all the same, the answer passes as it is.
                                let rest = this.give_up(&data);
                                let mut all = out;
                                all.extend_from_slice(&rest);
                                return Poll::Ready(Some(Ok(Frame::data(Bytes::from(all)))));
                            }
                        }
                        Mode::Json(buf) => buf.extend_from_slice(&data),
                        Mode::Raw => {}
                    }
                    if !this.account() {
                        return this.cut();
                    }
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                    }
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => {
                    let out = this.finish();
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// The body a REST note route's 5xx answer gets in place of the upstream's.
pub(super) fn rest_error_body(status: StatusCode) -> String {
    format!(
        r#"{{"error":"Upstream {}","code":"UPSTREAM_ERROR"}}"#,
        status.as_u16()
    )
}

/// `response` (the gateway's 5xx to a REST note route) with the fixed body: its status
/// and the headers that say nothing of the old body kept.
pub(super) fn rest_error(metrics: &Metrics, response: Response<ProxyBody>) -> Response<ProxyBody> {
    let (mut parts, _dropped) = response.into_parts();
    let body = rest_error_body(parts.status);
    for h in [
        header::CONTENT_LENGTH,
        header::CONTENT_ENCODING,
        header::CONTENT_RANGE,
        header::ETAG,
        header::LAST_MODIFIED,
        header::CONTENT_DISPOSITION,
    ] {
        parts.headers.remove(h);
    }
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    parts
        .headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    metrics.sanitized(Sanitized::RestError, 1);
    let body = http_body_util::Full::new(Bytes::from(body))
        .map_err(|never| match never {})
        .boxed_unsync();
    Response::from_parts(parts, body)
}
