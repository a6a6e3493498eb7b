//! Per-connection bookkeeping below hyper: requests in progress for the idle timeout,
//! and a scan of HTTP/1 heads for Content-Length beside Transfer-Encoding.
//!
//! Only requests keep a connection open: bytes that carry no request (HTTP/2 PINGs,
//! SETTINGS, WINDOW_UPDATEs, a client that never sends a first request) do not, so a
//! connection that costs a slot must keep a request in progress to hold it.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::drain::Ordinary;
use super::window::{Waiting, Watch};
use crate::upstream::ConnId;

/// The error type of every body the proxy sends.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A response body: an upstream stream or a local answer.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// What one connection shares with its requests.
#[derive(Debug)]
pub(crate) struct ConnState {
    start: Instant,
    /// Milliseconds after `start` at which the last request began or ended.
    last_activity_ms: AtomicU64,
    /// Whether any request has begun.
    served: AtomicBool,
    /// Requests whose response has not finished.
    active: AtomicUsize,
    /// An HTTP/1 head on this connection carried both Content-Length and
    /// Transfer-Encoding.
    ambiguous_framing: AtomicBool,
    /// HTTP/2 answers whose last chunk waits for the client's window.
    waiting: Waiting,
    /// The connection's number: the unit of upstream reuse for callers without a token.
    id: ConnId,
}

impl ConnState {
    pub(crate) fn new() -> ConnState {
        ConnState {
            start: Instant::now(),
            last_activity_ms: AtomicU64::new(0),
            served: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            ambiguous_framing: AtomicBool::new(false),
            waiting: Waiting::default(),
            id: ConnId::next(),
        }
    }

    /// The connection's number.
    pub(crate) fn id(&self) -> ConnId {
        self.id
    }

    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_activity_ms.store(ms, Ordering::Relaxed);
    }

    /// When the connection is to be closed if no request begins meanwhile: `first` after
    /// it opened while it has had none, `idle` after the last request ended.
    pub(crate) fn idle_deadline(&self, idle: Duration, first: Duration) -> Instant {
        if self.active.load(Ordering::Acquire) > 0 {
            return Instant::now() + idle;
        }
        if !self.served.load(Ordering::Acquire) {
            // Wake no later than `idle` from now too: a request may begin and end before
            // the first-request deadline, and the idle rule applies from then on.
            return (self.start + first).min(Instant::now() + idle);
        }
        let last = Duration::from_millis(self.last_activity_ms.load(Ordering::Relaxed));
        self.start + last + idle
    }

    /// No request in progress, and none for `idle` (`first` before the first one).
    pub(crate) fn is_idle(&self, idle: Duration, first: Duration) -> bool {
        self.active.load(Ordering::Acquire) == 0
            && self.idle_deadline(idle, first) <= Instant::now()
    }

    /// Requests in progress.
    pub(crate) fn active(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }

    /// Whether an HTTP/1 head here had both framing headers (see [`FramingScan`]).
    pub(crate) fn ambiguous_framing(&self) -> bool {
        self.ambiguous_framing.load(Ordering::Acquire)
    }

    /// Counts a request until its response body is done.
    pub(crate) fn begin_request(self: &Arc<Self>) -> ActiveRequest {
        self.active.fetch_add(1, Ordering::AcqRel);
        self.served.store(true, Ordering::Release);
        self.touch();
        ActiveRequest {
            state: Arc::clone(self),
        }
    }
}

/// One request in progress on a connection.
#[derive(Debug)]
pub(crate) struct ActiveRequest {
    state: Arc<ConnState>,
}

impl Drop for ActiveRequest {
    fn drop(&mut self) {
        self.state.touch();
        self.state.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request counted as active until it ends or is
/// dropped, so a quiet stream (SSE) is not mistaken for an idle connection.
pub(crate) struct Tracked {
    inner: ProxyBody,
    active: ActiveRequest,
    _ordinary: Option<Ordinary>,
    /// On HTTP/2, whether hyper still holds the last chunk (see [`super::window`]);
    /// boxed, so that HTTP/1 answers move no bigger.
    watch: Option<Box<Watch>>,
}

impl Tracked {
    /// `ordinary` counts the request for shutdown too (every request but an event
    /// stream, see [`super::drain`]); `http2` watches the answer for a client that
    /// withholds its window.
    pub(crate) fn new(
        inner: ProxyBody,
        active: ActiveRequest,
        ordinary: Option<Ordinary>,
        http2: bool,
    ) -> Tracked {
        let watch = http2.then(|| Box::new(Watch::new(&active.state.waiting)));
        Tracked {
            inner,
            active,
            _ordinary: ordinary,
            watch,
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if let Some(watch) = &mut self.watch {
            watch.gone(&self.active.state.waiting);
        }
    }
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match &mut this.watch {
            None => Pin::new(&mut this.inner).poll_frame(cx),
            Some(watch) => {
                watch.poll_frame(&this.active.state.waiting, Pin::new(&mut this.inner), cx)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.watch {
            None => self.inner.is_end_stream(),
            Some(watch) => watch.rest() == 0 && self.inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let Some(watch) = self.watch.as_ref().filter(|w| w.rest() > 0) else {
            return inner;
        };
        let rest = watch.rest() as u64;
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower().saturating_add(rest));
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(rest));
        }
        hint
    }
}

/// The client stream, scanning what hyper is about to parse, and closing when the client
/// takes none of the bytes waiting for it within the write-stall limit.
pub(crate) struct ConnIo<S> {
    inner: S,
    state: Arc<ConnState>,
    scan: FramingScan,
    stall_limit: Duration,
    /// Armed while a write waits for the client; the timer is made only then, so a
    /// client that keeps reading costs nothing.
    stalled: Option<Pin<Box<Sleep>>>,
    /// Armed while an HTTP/2 answer's chunk waits for the client's window.
    window: Option<Pin<Box<Sleep>>>,
}

impl<S> ConnIo<S> {
    pub(crate) fn new(inner: S, state: Arc<ConnState>, stall_limit: Duration) -> ConnIo<S> {
        ConnIo {
            inner,
            state,
            scan: FramingScan::default(),
            stall_limit,
            stalled: None,
            window: None,
        }
    }

    /// Passes a write's progress on; a write still waiting once the client has taken
    /// nothing for the limit fails, and hyper closes the connection.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.stalled = None;
            return polled;
        }
        let limit = self.stall_limit;
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client took no bytes within the write-stall limit",
            )));
        }
        Poll::Pending
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ConnIo<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // hyper's HTTP/2 connection always has a read pending, so a failed read closes
        // it even while no byte moves.
        if this
            .state
            .waiting
            .poll_stalled(cx, &mut this.window, this.stall_limit)
        {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client granted no window within the write-stall limit",
            )));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let fresh = buf.filled().get(before..).unwrap_or_default();
            // The flag is set before hyper sees the bytes, so it is in place when the
            // request reaches the service.
            if !fresh.is_empty() && this.scan.feed(fresh) {
                this.state.ambiguous_framing.store(true, Ordering::Release);
            }
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ConnIo<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.watch(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.watch(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_flush(cx) {
            // A flush with nothing to write is ready at once on TCP: no sign that the
            // client took anything, so a waiting write's timer keeps running.
            Poll::Ready(r) => Poll::Ready(r),
            pending => this.watch(cx, pending),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

const CONTENT_LENGTH: &[u8] = b"content-length:";
const TRANSFER_ENCODING: &[u8] = b"transfer-encoding:";
/// Enough of a line to recognise either header name.
const PREFIX_LEN: usize = 18;

/// Watches the byte stream for a header block (lines up to a blank line) that carries
/// both `Content-Length` and `Transfer-Encoding`.
///
/// hyper accepts such a request, drops the Content-Length and decodes the chunked body
/// (RFC 9112 §6.3 allows that); the request reaching the service no longer shows the
/// conflict. It is a classic smuggling vector, so the sidecar refuses it instead. The scan
/// does not know where bodies end, so body bytes that look like such a block could flag
/// the connection too: the flag is only consulted for HTTP/1 requests that still carry
/// Transfer-Encoding, and a false alarm costs a 400, never a bypass.
#[derive(Debug, Default)]
pub(crate) struct FramingScan {
    line: [u8; PREFIX_LEN],
    /// Bytes seen on the current line.
    pos: usize,
    saw_cl: bool,
    saw_te: bool,
    flagged: bool,
}

impl FramingScan {
    /// Feeds bytes; returns whether a conflicting block has been seen so far.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> bool {
        if self.flagged {
            return true;
        }
        let mut rest = bytes;
        loop {
            // Vectorized: request bodies (up to the gateway's 10 MB) pass through here too.
            let newline = memchr::memchr(b'\n', rest);
            let line = rest
                .get(..newline.unwrap_or(rest.len()))
                .unwrap_or_default();
            match newline {
                // A whole line within one read, as almost every line of a head is: looked
                // at where it is.
                Some(_) if self.pos == 0 => self.line_ends(line, line.len()),
                // A line split across reads: its first PREFIX_LEN bytes are kept, the
                // rest is skipped to the next line break without a per-byte copy.
                _ => {
                    let kept = self
                        .line
                        .get_mut(self.pos.min(PREFIX_LEN)..)
                        .unwrap_or_default();
                    for (slot, &b) in kept.iter_mut().zip(line) {
                        *slot = b;
                    }
                    self.pos = self.pos.saturating_add(line.len());
                    if newline.is_some() {
                        let (start, len) = (self.line, self.pos);
                        let seen = start.get(..len.min(PREFIX_LEN)).unwrap_or_default();
                        self.line_ends(seen, len);
                        self.pos = 0;
                    }
                }
            }
            match newline {
                Some(at) => rest = rest.get(at + 1..).unwrap_or_default(),
                None => break,
            }
        }
        self.flagged
    }

    /// A line of `len` bytes ended; `start` is at least its first PREFIX_LEN bytes.
    fn line_ends(&mut self, start: &[u8], len: usize) {
        let blank = len == 0 || (len == 1 && start == b"\r");
        let names = |name: &[u8]| {
            start
                .get(..name.len())
                .is_some_and(|s| s.eq_ignore_ascii_case(name))
        };
        if blank {
            if self.saw_cl && self.saw_te {
                self.flagged = true;
            }
            self.saw_cl = false;
            self.saw_te = false;
        } else if names(CONTENT_LENGTH) {
            self.saw_cl = true;
        } else if names(TRANSFER_ENCODING) {
            self.saw_te = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn scan(chunks: &[&[u8]]) -> bool {
        let mut s = FramingScan::default();
        chunks.iter().fold(false, |_, c| s.feed(c))
    }

    #[test]
    fn flags_both_orders_and_any_case() {
        assert!(scan(&[
            b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
        ]));
        assert!(scan(&[
            b"POST / HTTP/1.1\r\nTRANSFER-ENCODING: chunked\r\ncontent-LENGTH: 5\r\n\r\n"
        ]));
        // Bare LF line ends, as httparse accepts them.
        assert!(scan(&[
            b"POST / HTTP/1.1\nContent-Length: 5\nTransfer-Encoding: chunked\n\n"
        ]));
    }

    #[test]
    fn flags_across_read_boundaries() {
        assert!(scan(&[
            b"POST / HTTP/1.1\r\nContent-Len",
            b"gth: 5\r\nTransfer-Enc",
            b"oding: chunked\r",
            b"\n\r",
            b"\n",
        ]));
    }

    #[test]
    fn one_framing_header_is_fine() {
        assert!(!scan(&[
            b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"
        ]));
        assert!(!scan(&[
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
        ]));
        // Names that merely start alike.
        assert!(!scan(&[
            b"GET / HTTP/1.1\r\nContent-Lengthy: 1\r\nTransfer-Encodings: x\r\n\r\n"
        ]));
    }

    #[test]
    fn headers_in_separate_blocks_do_not_combine() {
        assert!(!scan(&[
            b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        ]));
    }

    proptest! {
        /// Where the reads split the bytes never changes the verdict.
        #[test]
        fn read_boundaries_do_not_matter(
            lines in proptest::collection::vec(
                prop_oneof![
                    Just(&b"Content-Length: 5"[..]),
                    Just(&b"transfer-ENCODING: chunked"[..]),
                    Just(&b"Content-Lengthy: 1"[..]),
                    Just(&b"X-A: b"[..]),
                    Just(&b""[..]),
                    Just(&b"\r"[..]),
                ],
                0..12,
            ),
            crlf in any::<bool>(),
            cuts in proptest::collection::vec(any::<proptest::sample::Index>(), 0..6),
        ) {
            let mut bytes = Vec::new();
            for line in lines {
                bytes.extend_from_slice(line);
                bytes.extend_from_slice(if crlf { b"\r\n" } else { b"\n" });
            }
            let mut at: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
            at.sort_unstable();
            let mut chunks = Vec::new();
            let mut from = 0;
            for cut in at {
                chunks.push(&bytes[from..cut]);
                from = cut;
            }
            chunks.push(&bytes[from..]);
            prop_assert_eq!(scan(&chunks), scan(&[&bytes]));
        }
    }
}
