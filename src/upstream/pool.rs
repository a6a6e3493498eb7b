//! Exchanges with one upstream on keep-alive connections, each exchange driven by the
//! task that asked for it: no connection task, no channel between the two, no
//! per-request future boxed by a client. On the sidecar's passthrough path that
//! machinery cost more instructions than everything else hyper did together
//! (`docs/benchmarks.md`, "The upstream client"). The same HTTP/1.1 ([`wire`]) runs over
//! TCP for `http` upstreams and over TLS (ALPN `http/1.1` only) for `https` ones, so
//! both read answers with the same strict framing.
//!
//! Reuse never crosses a caller unless configured to: an idle connection is kept under
//! the [`Key`] of the caller whose exchange it carried, and only a later exchange of the
//! same key takes it (`upstream.reuse`, see [`Reuse`]). With HTTP/1.1 keep-alive, bytes
//! an upstream writes after an answer are read as the answer to the next request on
//! that connection; keyed reuse keeps such a slip inside one caller's own exchanges.
//!
//! A connection goes back to the idle pool only when its exchange is over and nothing is
//! left on it: the request sent whole, the answer read whole as [`wire`] framed it, no
//! byte after it, HTTP/1.1 without `Connection: close`. Anything else closes it. Idle
//! connections are checked before use (one the upstream closed or wrote to is dropped;
//! bytes found there are counted) and reaped after the idle timeout, which defaults
//! below the gateway's own keep-alive timeout so the sidecar, not the upstream, closes
//! them. A bodiless request with an idempotent method that fails on a reused connection
//! before any byte of an answer (the upstream closed it as the request went out) is sent
//! once more on a new connection; nothing else is ever sent twice.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::uri::PathAndQuery;
use http::{header, Method, Request, Response, Uri};
use hyper::body::{Body, Frame, SizeHint};
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::client::TlsStream;

use super::wire::{self, Chunked, Decoded, Framing, Parsed, RequestFraming, WireError};
use super::{BoxError, Caller, Error, Fault, Observer, PoolSettings, Reuse};

/// How much a read asks for at a time.
const READ_CHUNK: usize = 16 * 1024;

/// The largest piece of an answer body handed on at once. While the upstream sends
/// faster than one read takes, reads go on up to this before the piece is handed on:
/// pieces as large as the ones a client reading the upstream itself would get, because
/// a client that appends every piece to one long event (an SSE tool result of many
/// megabytes) pays for each.
const MAX_PIECE: usize = 64 * 1024;

/// Request body bytes that go out in the first write with the head, when at hand.
const FIRST_WRITE: usize = 16 * 1024;

/// A connection to the upstream: TCP, or TLS over TCP.
#[derive(Debug)]
enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// What an idle connection holds, looked at without waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Idleness {
    /// Nothing: fit for another exchange.
    Quiet,
    /// The upstream closed it (or it failed).
    Closed,
    /// Bytes came that no request asked for.
    Stray,
}

/// One connection and what has been read from it but not yet used.
#[derive(Debug)]
struct Conn {
    stream: Stream,
    buf: BytesMut,
}

impl Conn {
    /// Whether anything has arrived since the last exchange: an idle keep-alive
    /// connection has nothing to read, so anything there means the upstream closed it or
    /// wrote past an answer. On TCP the runtime's readiness is asked first, so a quiet
    /// connection costs no system call; on TLS a read is tried (a TLS 1.3 session ticket
    /// is taken by rustls and is no data).
    fn idleness(&mut self) -> Idleness {
        let mut cx = Context::from_waker(Waker::noop());
        let mut byte = [0u8; 1];
        match &mut self.stream {
            Stream::Plain(tcp) => {
                if tcp.poll_read_ready(&mut cx).is_pending() {
                    return Idleness::Quiet;
                }
                match tcp.try_read(&mut byte) {
                    Ok(0) => Idleness::Closed,
                    Ok(_) => Idleness::Stray,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => Idleness::Quiet,
                    Err(_) => Idleness::Closed,
                }
            }
            Stream::Tls(tls) => {
                let mut read = ReadBuf::new(&mut byte);
                match Pin::new(tls.as_mut()).poll_read(&mut cx, &mut read) {
                    Poll::Pending => Idleness::Quiet,
                    Poll::Ready(Ok(())) if read.filled().is_empty() => Idleness::Closed,
                    Poll::Ready(Ok(())) => Idleness::Stray,
                    Poll::Ready(Err(_)) => Idleness::Closed,
                }
            }
        }
    }
}

/// The callers an idle connection may serve next (see [`Reuse`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Key {
    /// Any caller (`reuse = "shared"`).
    Shared,
    /// The exchanges of one client connection.
    Connection(u64),
    /// The exchanges of one verified `sub` in one scope: the length of the `sub`, `:`,
    /// the `sub`, the scope (unambiguous whatever bytes either holds).
    Principal(Box<str>),
    /// The sidecar's own requests (the readiness probe).
    Sidecar,
}

impl Key {
    /// The key of `caller`'s exchanges under `reuse`.
    pub(super) fn of(reuse: Reuse, caller: Caller<'_>) -> Key {
        match (reuse, caller) {
            (_, Caller::Sidecar) => Key::Sidecar,
            (Reuse::Shared, _) => Key::Shared,
            (Reuse::Principal, Caller::Principal { sub, scope, .. }) => {
                // One allocation of the exact length (`into_boxed_str` keeps it).
                let digits = sub.len().checked_ilog10().unwrap_or(0) as usize + 1;
                let mut key = String::with_capacity(digits + 1 + sub.len() + scope.len());
                // Writing to a String cannot fail.
                let _ = write!(key, "{}:", sub.len());
                key.push_str(sub);
                key.push_str(scope);
                Key::Principal(key.into_boxed_str())
            }
            (Reuse::Connection, Caller::Principal { conn, .. })
            | (Reuse::Principal | Reuse::Connection, Caller::Anonymous(conn)) => {
                Key::Connection(conn.0)
            }
        }
    }
}

#[derive(Debug)]
struct Idle {
    conn: Conn,
    since: Instant,
}

/// The idle connections, by key (each list oldest first), and how many in all. A key's
/// list stays when it empties, so that a caller taking and giving back one connection
/// costs two lookups and no allocation; empty lists are dropped all at once when they
/// outnumber the connections the pool may keep, and by the reaper.
#[derive(Debug, Default)]
struct IdleSet {
    by_key: HashMap<Key, Vec<Idle>, foldhash::fast::RandomState>,
    total: usize,
}

impl IdleSet {
    /// The most recently kept idle connection of `key`.
    fn pop(&mut self, key: &Key) -> Option<Idle> {
        let idle = self.by_key.get_mut(key)?.pop()?;
        self.total -= 1;
        Some(idle)
    }

    /// Drops the lists of keys with no idle connection once there are more than `keep`
    /// keys: the map stays within a few times the connections it may hold.
    fn prune(&mut self, keep: usize) {
        if self.by_key.len() > keep {
            self.by_key.retain(|_, list| !list.is_empty());
        }
    }
}

/// The connections to one upstream.
#[derive(Debug)]
pub(super) struct Pool {
    /// Connected to, as `(host, port)`; the host without IPv6 brackets.
    host: String,
    port: u16,
    /// `Host` for requests that carry none.
    authority: String,
    /// For https: the TLS settings and the name the certificate must carry.
    tls: Option<Tls>,
    connect_timeout: Duration,
    idle_timeout: Duration,
    max_idle: usize,
    max_idle_per_key: usize,
    reuse: Reuse,
    idle: Mutex<IdleSet>,
    /// Whether the reaper task runs (started with the first idle connection, inside the
    /// runtime).
    reaping: AtomicBool,
    observer: ObserverSlot,
}

/// How a pool of an https upstream connects: rustls, and the server's name.
struct Tls {
    connector: tokio_rustls::TlsConnector,
    name: ServerName<'static>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// The fault observer, printable.
struct ObserverSlot(Observer);

impl std::fmt::Debug for ObserverSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observer")
    }
}

impl Pool {
    /// A pool for `uri`'s authority, `None` unless `uri` is http, or https with `tls`,
    /// and has a host.
    pub(super) fn new(
        uri: &Uri,
        tls: Option<Arc<ClientConfig>>,
        settings: &PoolSettings,
        observer: Observer,
    ) -> Option<Pool> {
        let authority = uri.authority()?;
        let host = authority.host();
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let (tls, default_port) = match uri.scheme_str() {
            Some("http") => (None, 80),
            Some("https") => {
                let name = ServerName::try_from(host.to_owned()).ok()?;
                let connector = tokio_rustls::TlsConnector::from(tls?);
                (Some(Tls { connector, name }), 443)
            }
            _ => return None,
        };
        Some(Pool {
            host: host.to_owned(),
            port: authority.port_u16().unwrap_or(default_port),
            authority: authority
                .as_str()
                .rsplit_once('@')
                .map_or(authority.as_str(), |(_, a)| a)
                .to_owned(),
            tls,
            connect_timeout: settings.connect_timeout,
            idle_timeout: settings.idle_timeout,
            max_idle: settings.max_idle,
            max_idle_per_key: settings.max_idle_per_caller,
            reuse: settings.reuse,
            idle: Mutex::new(IdleSet::default()),
            reaping: AtomicBool::new(false),
            observer: ObserverSlot(observer),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, IdleSet> {
        // The set holds no invariant a panicking holder could break halfway.
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn observe(&self, fault: Fault) {
        (self.observer.0)(fault);
    }

    /// The most recently used idle connection of `key` still fit for use, if any. Each
    /// candidate is looked at outside the lock.
    fn take_idle(&self, key: &Key) -> Option<Conn> {
        loop {
            let mut idle = self.lock().pop(key)?;
            if idle.since.elapsed() >= self.idle_timeout {
                continue;
            }
            match idle.conn.idleness() {
                Idleness::Quiet => return Some(idle.conn),
                Idleness::Closed => {}
                Idleness::Stray => self.observe(Fault::BytesAfterAnswer),
            }
        }
    }

    /// A new connection. Boxed by its callers: a TLS handshake's state is kilobytes, and
    /// every exchange's future would otherwise carry (and move) room for it, though most
    /// exchanges take an idle connection.
    async fn connect(&self) -> Result<Conn, Error> {
        let connect = async {
            let stream = TcpStream::connect((self.host.as_str(), self.port)).await?;
            // An answer's last piece must not wait for the peer's acknowledgement.
            stream.set_nodelay(true)?;
            match &self.tls {
                None => Ok(Stream::Plain(stream)),
                Some(tls) => {
                    let tls = tls.connector.connect(tls.name.clone(), stream).await?;
                    Ok(Stream::Tls(Box::new(tls)))
                }
            }
        };
        let stream = tokio::time::timeout(self.connect_timeout, connect)
            .await
            .map_err(|_| Error::Connect(io::Error::from(io::ErrorKind::TimedOut).into()))?
            .map_err(|e: io::Error| Error::Connect(e.into()))?;
        Ok(Conn {
            stream,
            buf: BytesMut::with_capacity(READ_CHUNK),
        })
    }

    /// Keeps `conn` for another exchange of `key`, if there is room: a key keeps at most
    /// `max_idle_per_key` (its oldest goes), the pool at most `max_idle` (past it the
    /// connection closes).
    fn check_in(self: &Arc<Self>, key: Key, conn: Conn) {
        if self.max_idle == 0 || self.max_idle_per_key == 0 {
            return;
        }
        let entry = Idle {
            conn,
            since: Instant::now(),
        };
        let dropped = {
            let mut idle = self.lock();
            let set = &mut *idle;
            match set.by_key.get_mut(&key) {
                // The key's oldest makes room; the total does not change.
                Some(list) if list.len() >= self.max_idle_per_key => {
                    let oldest = list.remove(0);
                    list.push(entry);
                    Some(oldest)
                }
                _ if set.total >= self.max_idle => Some(entry),
                Some(list) => {
                    list.push(entry);
                    set.total += 1;
                    None
                }
                None => {
                    set.prune(2 * self.max_idle);
                    set.by_key.insert(key, vec![entry]);
                    set.total += 1;
                    None
                }
            }
        };
        // Closed outside the lock.
        drop(dropped);
        if !self.reaping.swap(true, Ordering::Relaxed) {
            // An answer may be dropped outside the runtime; the next check-in inside it
            // starts the reaper then.
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn(reap(Arc::downgrade(self)))),
                Err(_) => self.reaping.store(false, Ordering::Relaxed),
            }
        }
    }

    /// Sends `request` for `caller` and returns the answer once its head is read; the
    /// body is read as it is polled. Only the path and query of the request's URI are
    /// used.
    pub(super) async fn send<B>(
        self: &Arc<Self>,
        request: Request<B>,
        caller: Caller<'_>,
    ) -> Result<Response<Answer>, Error>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: Into<BoxError>,
    {
        let key = Key::of(self.reuse, caller);
        let (parts, mut body) = request.into_parts();
        let framing = if body.is_end_stream() {
            // A client's `Content-Length: 0` is kept, as hyper's client kept it.
            if parts.headers.contains_key(header::CONTENT_LENGTH) {
                RequestFraming::Length(0)
            } else {
                RequestFraming::None
            }
        } else {
            match body.size_hint().exact() {
                Some(n) => RequestFraming::Length(n),
                None => RequestFraming::Chunked,
            }
        };
        let target = parts.uri.path_and_query().map_or("/", PathAndQuery::as_str);
        let mut head = Vec::with_capacity(256);
        wire::write_request_head(
            &mut head,
            &parts.method,
            target,
            &self.authority,
            &parts.headers,
            framing,
        );
        let head = Bytes::from(head);
        let (mut conn, reused) = match self.take_idle(&key) {
            Some(conn) => (conn, true),
            None => (Box::pin(self.connect()).await?, false),
        };
        let exchanged = exchange(&mut conn, &head, &mut body, framing, &parts.method).await;
        let (answer, complete) = match exchanged {
            Ok(done) => done,
            // Nothing of an answer came, nothing of the request is lost, and sending it
            // again cannot do twice what once would not (RFC 9110 §9.2.2): once more, on
            // a connection of its own.
            Err(failure)
                if failure.before_answer
                    && reused
                    && matches!(framing, RequestFraming::None | RequestFraming::Length(0))
                    && parts.method.is_idempotent() =>
            {
                drop(conn);
                conn = Box::pin(self.connect()).await?;
                exchange(&mut conn, &head, &mut body, framing, &parts.method)
                    .await
                    .map_err(|f| self.failed(f))?
            }
            Err(failure) => return Err(self.failed(failure)),
        };
        let state = match answer.framing {
            Framing::Empty => State::Done,
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::Chunked(Chunked::default()),
            Framing::UntilClose => State::UntilClose,
        };
        let mut body = Answer {
            conn: Some(conn),
            state,
            more: false,
            reusable: answer.keep_alive && complete,
            pool: Arc::clone(self),
            key,
        };
        if body.state.is_over() {
            body.finish();
        }
        let mut response = Response::new(body);
        *response.status_mut() = answer.status;
        *response.version_mut() = answer.version;
        *response.headers_mut() = answer.headers;
        Ok(response)
    }

    /// The error of a failed exchange, its framing fault counted.
    fn failed(&self, failure: Failure) -> Error {
        if let Some(e) = failure.wire {
            self.observe(Fault::Wire(e));
        }
        failure.error
    }
}

/// Drops idle connections past the idle timeout or no longer quiet, until the pool is
/// gone.
async fn reap(pool: Weak<Pool>) {
    let every = match pool.upgrade() {
        Some(pool) => {
            (pool.idle_timeout / 2).clamp(Duration::from_millis(250), Duration::from_secs(5))
        }
        None => return,
    };
    loop {
        tokio::time::sleep(every).await;
        let Some(pool) = pool.upgrade() else {
            return;
        };
        let mut stale = Vec::new();
        let mut stray = 0;
        {
            let mut idle = pool.lock();
            let set = &mut *idle;
            for list in set.by_key.values_mut() {
                let mut i = 0;
                while i < list.len() {
                    let entry = &mut list[i];
                    let state = if entry.since.elapsed() >= pool.idle_timeout {
                        Idleness::Closed
                    } else {
                        entry.conn.idleness()
                    };
                    if state == Idleness::Quiet {
                        i += 1;
                    } else {
                        stray += usize::from(state == Idleness::Stray);
                        stale.push(list.remove(i));
                    }
                }
            }
            set.by_key.retain(|_, list| !list.is_empty());
            set.total -= stale.len();
        }
        drop(stale);
        for _ in 0..stray {
            pool.observe(Fault::BytesAfterAnswer);
        }
    }
}

/// Why an exchange failed, and whether it failed before any byte of an answer came.
struct Failure {
    error: Error,
    before_answer: bool,
    /// The framing rule the answer broke, if that is why.
    wire: Option<WireError>,
}

impl Failure {
    fn upstream(e: impl Into<BoxError>, before_answer: bool) -> Failure {
        Failure {
            error: Error::Exchange(e.into()),
            before_answer,
            wire: None,
        }
    }

    fn wire(e: WireError) -> Failure {
        Failure {
            error: Error::Exchange(e.into()),
            before_answer: false,
            wire: Some(e),
        }
    }

    fn client_body(e: impl Into<BoxError>) -> Failure {
        Failure {
            error: Error::ClientBody(e.into()),
            before_answer: false,
            wire: None,
        }
    }
}

/// A request body that did not match its own length.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not match its length")]
struct LengthMismatch;

/// A request body on its way up: each frame is counted against the framing and handed
/// out as the pieces to write (the chunk-size line and CRLF around it when chunked),
/// never copied.
struct Sending {
    framing: RequestFraming,
    sent: u64,
}

impl Sending {
    /// Appends the pieces that carry `data` to `out`.
    fn frame(&mut self, out: &mut Vec<Bytes>, data: Bytes) -> Result<(), Failure> {
        if data.is_empty() {
            return Ok(());
        }
        self.sent += data.len() as u64;
        match self.framing {
            RequestFraming::Length(len) if self.sent > len => {
                Err(Failure::client_body(LengthMismatch))
            }
            RequestFraming::Chunked => {
                let mut line = Vec::with_capacity(18);
                wire::push_chunk_size(&mut line, data.len());
                out.extend([Bytes::from(line), data, Bytes::from_static(b"\r\n")]);
                Ok(())
            }
            _ => {
                out.push(data);
                Ok(())
            }
        }
    }

    /// Appends what ends the body, once its source has ended.
    fn end(&self, out: &mut Vec<Bytes>) -> Result<(), Failure> {
        match self.framing {
            RequestFraming::Length(len) if self.sent != len => {
                Err(Failure::client_body(LengthMismatch))
            }
            RequestFraming::Chunked => {
                out.push(Bytes::from_static(wire::LAST_CHUNK));
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// One frame of `body`, or its end.
async fn next_frame<B>(body: &mut B) -> Option<Result<Frame<Bytes>, B::Error>>
where
    B: Body<Data = Bytes> + Unpin,
{
    std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await
}

/// Writes every byte of `parts` (as few system calls as the socket allows), emptying it.
async fn write_parts<W: AsyncWrite + Unpin>(
    writer: &mut W,
    parts: &mut Vec<Bytes>,
) -> io::Result<()> {
    let mut first = 0;
    while first < parts.len() {
        let mut slices = [io::IoSlice::new(&[]); 16];
        let n = parts[first..].len().min(slices.len());
        for (slice, part) in slices.iter_mut().zip(&parts[first..first + n]) {
            *slice = io::IoSlice::new(part);
        }
        let mut written = writer.write_vectored(&slices[..n]).await?;
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        while written > 0 {
            let len = parts[first].len();
            if written >= len {
                written -= len;
                first += 1;
            } else {
                parts[first].advance(written);
                written = 0;
            }
        }
    }
    // TLS holds what it was given until flushed; TCP's flush does nothing.
    writer.flush().await?;
    parts.clear();
    Ok(())
}

/// Writes the request (the head, and what the body has at hand, in one write), then reads
/// the answer head while the rest of the body goes out. `true` beside the head when the
/// request went out whole.
async fn exchange<B>(
    conn: &mut Conn,
    head: &Bytes,
    body: &mut B,
    framing: RequestFraming,
    method: &Method,
) -> Result<(wire::Head, bool), Failure>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut sending = Sending { framing, sent: 0 };
    let mut out = vec![head.clone()];
    let mut ended = matches!(framing, RequestFraming::None | RequestFraming::Length(0));
    // What the body has ready now goes with the head, up to FIRST_WRITE bytes.
    while !ended && (sending.sent as usize) < FIRST_WRITE {
        let ready =
            std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *body).poll_frame(cx))).await;
        match ready {
            Poll::Ready(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    sending.frame(&mut out, data)?;
                }
            }
            Poll::Ready(Some(Err(e))) => return Err(Failure::client_body(e)),
            Poll::Ready(None) => {
                sending.end(&mut out)?;
                ended = true;
            }
            Poll::Pending => break,
        }
    }
    if let Err(e) = write_parts(&mut conn.stream, &mut out).await {
        return Err(Failure::upstream(e, true));
    }
    if ended {
        return read_head(&mut conn.stream, &mut conn.buf, method)
            .await
            .map(|head| (head, true));
    }
    // The upstream may answer before the body is all sent (a refusal), and reads the
    // body only as it pleases: both directions at once.
    // Boxed: most requests have no body to stream, and every request's future would
    // otherwise carry (and move) room for this one.
    match &mut conn.stream {
        Stream::Plain(tcp) => {
            let (reader, writer) = tcp.split();
            Box::pin(send_and_read(
                reader,
                writer,
                &mut conn.buf,
                body,
                sending,
                method,
            ))
            .await
        }
        Stream::Tls(tls) => {
            let (reader, writer) = tokio::io::split(tls.as_mut());
            Box::pin(send_and_read(
                reader,
                writer,
                &mut conn.buf,
                body,
                sending,
                method,
            ))
            .await
        }
    }
}

/// Sends the rest of `body` on `writer` while the answer head is read from `reader`.
async fn send_and_read<R, W, B>(
    mut reader: R,
    mut writer: W,
    buf: &mut BytesMut,
    body: &mut B,
    mut sending: Sending,
    method: &Method,
) -> Result<(wire::Head, bool), Failure>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut out = Vec::new();
    let send = async {
        loop {
            let finished = match next_frame(body).await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        sending.frame(&mut out, data)?;
                    }
                    false
                }
                Some(Err(e)) => return Err(Failure::client_body(e)),
                None => {
                    sending.end(&mut out)?;
                    true
                }
            };
            write_parts(&mut writer, &mut out)
                .await
                .map_err(|e| Failure::upstream(e, false))?;
            if finished {
                return Ok(());
            }
        }
    };
    let recv = read_head(&mut reader, buf, method);
    let (mut send, mut recv) = (pin!(send), pin!(recv));
    let mut sent = false;
    let mut write_failed = None;
    loop {
        tokio::select! {
            biased;
            head = &mut recv => {
                return match (head, write_failed) {
                    (Ok(head), _) => Ok((head, sent)),
                    (Err(read_error), _) if read_error.wire.is_some() => Err(read_error),
                    (Err(_), Some(write_error)) => Err(write_error),
                    (Err(read_error), None) => Err(read_error),
                };
            }
            done = &mut send, if !sent && write_failed.is_none() => match done {
                Ok(()) => sent = true,
                Err(f) if matches!(f.error, Error::ClientBody(_)) => return Err(f),
                // The upstream stopped reading; it may still have answered.
                Err(f) => write_failed = Some(f),
            },
        }
    }
}

/// Reads until a final answer head is complete, skipping informational ones.
async fn read_head<R: AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut BytesMut,
    method: &Method,
) -> Result<wire::Head, Failure> {
    let mut received = false;
    loop {
        if !buf.is_empty() {
            received = true;
            match wire::parse_head(buf, method).map_err(Failure::wire)? {
                Parsed::Final(head, len) => {
                    buf.advance(len);
                    return Ok(head);
                }
                Parsed::Informational(len) => {
                    buf.advance(len);
                    continue;
                }
                Parsed::Partial => {}
            }
        }
        buf.reserve(READ_CHUNK);
        match reader.read_buf(buf).await {
            Ok(0) => return Err(Failure::upstream(Closed, !received)),
            Ok(_) => {}
            Err(e) => return Err(Failure::upstream(e, !received)),
        }
    }
}

/// The upstream closed the connection before the answer was complete.
#[derive(Debug, thiserror::Error)]
#[error("the upstream closed the connection before the answer was complete")]
struct Closed;

/// Where an answer body is.
#[derive(Debug)]
enum State {
    Length(u64),
    Chunked(Chunked),
    UntilClose,
    Done,
}

impl State {
    fn is_over(&self) -> bool {
        matches!(self, State::Done | State::Length(0))
    }
}

/// The body of an answer from an upstream, read from its connection as it is polled.
/// Read whole, the connection goes back to the pool under its exchange's key; dropped
/// before, it closes.
#[derive(Debug)]
pub struct Answer {
    conn: Option<Conn>,
    state: State,
    /// Whether the last read filled all the room it had: more may be waiting.
    more: bool,
    /// Whether the connection may be used again once the body is read whole.
    reusable: bool,
    pool: Arc<Pool>,
    key: Key,
}

impl Answer {
    /// The body has been read whole: its connection goes back to the pool if fit.
    fn finish(&mut self) {
        self.state = State::Done;
        if let Some(conn) = self.conn.take() {
            if !conn.buf.is_empty() {
                // A byte past the answer means the two sides framed it differently.
                self.pool.observe(Fault::BytesAfterAnswer);
            } else if self.reusable {
                let key = std::mem::replace(&mut self.key, Key::Sidecar);
                self.pool.check_in(key, conn);
            }
        }
    }

    fn fail(&mut self, e: impl Into<BoxError>) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        self.conn = None;
        self.state = State::Done;
        Poll::Ready(Some(Err(Error::Exchange(e.into()))))
    }

    fn fail_wire(&mut self, e: WireError) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        self.pool.observe(Fault::Wire(e));
        self.fail(e)
    }
}

impl Body for Answer {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = self.get_mut();
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            // Bytes in hand are handed on, unless more are waiting and there is room.
            let gather = this.more && conn.buf.len() < MAX_PIECE;
            match &mut this.state {
                State::Done | State::Length(0) => {
                    this.finish();
                    return Poll::Ready(None);
                }
                State::Length(left)
                    if !conn.buf.is_empty() && (!gather || conn.buf.len() as u64 >= *left) =>
                {
                    let n = usize::try_from(*left)
                        .unwrap_or(usize::MAX)
                        .min(conn.buf.len());
                    let data = conn.buf.split_to(n).freeze();
                    *left -= n as u64;
                    if *left == 0 {
                        // Given back now: hyper polls no further once the size is met.
                        this.finish();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                State::Chunked(chunked) if !conn.buf.is_empty() && !gather => {
                    match chunked.decode(&mut conn.buf) {
                        Ok(Decoded::Data(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                        Ok(Decoded::End) => {
                            this.finish();
                            return Poll::Ready(None);
                        }
                        Ok(Decoded::Partial) => {}
                        Err(e) => return this.fail_wire(e),
                    }
                }
                State::UntilClose if !conn.buf.is_empty() && !gather => {
                    let data = conn.buf.split().freeze();
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                _ => {}
            }
            conn.buf.reserve(READ_CHUNK);
            // One read's worth at most, whatever room the buffer grew to.
            let mut room = (&mut conn.buf).limit(READ_CHUNK);
            let read = {
                let read = pin!(conn.stream.read_buf(&mut room));
                read.poll(cx)
            };
            match read {
                // Nothing more for now (or ever): what was gathered goes on.
                Poll::Pending | Poll::Ready(Ok(0)) if this.more => this.more = false,
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(n)) if n > 0 => this.more = n == READ_CHUNK,
                Poll::Ready(Ok(0)) if matches!(this.state, State::UntilClose) => {
                    this.conn = None;
                    this.state = State::Done;
                    return Poll::Ready(None);
                }
                Poll::Ready(Ok(0)) => return this.fail(Closed),
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => return this.fail(e),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.conn.is_none() || self.state.is_over()
    }

    fn size_hint(&self) -> SizeHint {
        match self.state {
            State::Length(n) => SizeHint::with_exact(n),
            State::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        // A body dropped before its end leaves bytes on the connection: it closes with it.
        if self.state.is_over() {
            self.finish();
        }
    }
}

impl From<WireError> for Error {
    fn from(e: WireError) -> Error {
        Error::Exchange(e.into())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use http_body_util::{BodyExt, Empty, Full};
    use tokio::net::TcpListener;

    use super::*;
    use knowtation_mock_upstream::body::MockBody;

    /// A scripted upstream on loopback: every connection it accepts is handed to
    /// `script` with its number (from 0); it counts connections and keeps every request
    /// it read.
    struct Upstream {
        uri: Uri,
        connections: Arc<AtomicUsize>,
        requests: Arc<Mutex<Vec<String>>>,
    }

    impl Upstream {
        async fn start<F, Fut>(script: F) -> Upstream
        where
            F: Fn(usize, TcpStream, Arc<Mutex<Vec<String>>>) -> Fut + Send + Sync + 'static,
            Fut: Future<Output = ()> + Send + 'static,
        {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let uri: Uri = format!("http://{}", listener.local_addr().unwrap())
                .parse()
                .unwrap();
            let connections = Arc::new(AtomicUsize::new(0));
            let requests = Arc::new(Mutex::new(Vec::new()));
            let (c, r) = (Arc::clone(&connections), Arc::clone(&requests));
            let script = Arc::new(script);
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let n = c.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(script(n, stream, Arc::clone(&r)));
                }
            });
            Upstream {
                uri,
                connections,
                requests,
            }
        }

        fn pool(&self) -> Arc<Pool> {
            self.pool_with(Reuse::Principal, crate::upstream::unobserved())
        }

        fn pool_with(&self, reuse: Reuse, observer: Observer) -> Arc<Pool> {
            let settings = PoolSettings {
                connect_timeout: Duration::from_secs(2),
                idle_timeout: Duration::from_secs(60),
                max_idle: 8,
                max_idle_per_caller: 4,
                reuse,
                workers: 1,
            };
            Arc::new(Pool::new(&self.uri, None, &settings, observer).unwrap())
        }

        fn connections(&self) -> usize {
            self.connections.load(Ordering::SeqCst)
        }

        fn requests(&self) -> Vec<String> {
            self.requests.lock().unwrap().clone()
        }
    }

    /// Reads one request (head, and a body framed by Content-Length or chunked) from
    /// `stream`, keeping what follows in `buf`; `None` at end of stream.
    async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut more = [0u8; 4096];
            let n = stream.read(&mut more).await.ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&more[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let lower = head.to_ascii_lowercase();
        let body_end = if let Some(len) = lower
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
        {
            head_end + len.trim().parse::<usize>().unwrap()
        } else if lower.contains("transfer-encoding: chunked") {
            loop {
                if let Some(i) = buf[head_end..].windows(5).position(|w| w == b"0\r\n\r\n") {
                    break head_end + i + 5;
                }
                let mut more = [0u8; 4096];
                let n = stream.read(&mut more).await.ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&more[..n]);
            }
        } else {
            head_end
        };
        while buf.len() < body_end {
            let mut more = [0u8; 4096];
            let n = stream.read(&mut more).await.ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&more[..n]);
        }
        let request = String::from_utf8_lossy(&buf[..body_end]).into_owned();
        buf.drain(..body_end);
        Some(request)
    }

    const OK: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";

    /// Answers every request on every connection with `OK`.
    async fn keep_alive(_: usize, mut stream: TcpStream, seen: Arc<Mutex<Vec<String>>>) {
        let mut buf = Vec::new();
        while let Some(request) = read_request(&mut stream, &mut buf).await {
            seen.lock().unwrap().push(request);
            if stream.write_all(OK).await.is_err() {
                return;
            }
        }
    }

    /// One anonymous caller on client connection 1.
    const ONE: Caller<'static> = Caller::Anonymous(crate::upstream::ConnId(1));

    impl Pool {
        /// [`Pool::send`] for [`ONE`].
        async fn send_as<B>(
            self: &Arc<Self>,
            request: Request<B>,
        ) -> Result<Response<Answer>, Error>
        where
            B: Body<Data = Bytes> + Unpin,
            B::Error: Into<BoxError>,
        {
            self.send(request, ONE).await
        }
    }

    fn get(path: &str) -> Request<Empty<Bytes>> {
        Request::get(path).body(Empty::new()).unwrap()
    }

    async fn text(response: Response<Answer>) -> Result<String, Error> {
        let body = response.into_body().collect().await?.to_bytes();
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn a_connection_carries_one_exchange_after_another() {
        let up = Upstream::start(keep_alive).await;
        let pool = up.pool();
        for i in 0..3 {
            let response = pool.send_as(get(&format!("/{i}"))).await.unwrap();
            assert_eq!(response.status(), 200);
            assert_eq!(text(response).await.unwrap(), "ok");
        }
        assert_eq!(up.connections(), 1);
        let requests = up.requests();
        assert_eq!(requests.len(), 3);
        assert!(requests[2].starts_with("GET /2 HTTP/1.1\r\nhost: 127.0.0.1:"));
    }

    #[tokio::test]
    async fn a_connection_the_upstream_closed_is_not_used_again() {
        // One exchange per connection, then the upstream closes it (as Node does after
        // its keep-alive timeout).
        let up = Upstream::start(
            |_, mut stream: TcpStream, seen: Arc<Mutex<Vec<String>>>| async move {
                let mut buf = Vec::new();
                if let Some(request) = read_request(&mut stream, &mut buf).await {
                    seen.lock().unwrap().push(request);
                    let _ = stream.write_all(OK).await;
                }
            },
        )
        .await;
        let pool = up.pool();
        for _ in 0..3 {
            let response = pool.send_as(get("/")).await.unwrap();
            assert_eq!(text(response).await.unwrap(), "ok");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(up.connections(), 3);
        assert_eq!(up.requests().len(), 3, "no request was sent twice");
    }

    /// The upstream reads a second request on a connection and closes it unanswered:
    /// the race of a request against the upstream's keep-alive timeout.
    async fn closes_on_the_second(n: usize, mut stream: TcpStream, seen: Arc<Mutex<Vec<String>>>) {
        let mut buf = Vec::new();
        let mut served = 0;
        while let Some(request) = read_request(&mut stream, &mut buf).await {
            seen.lock().unwrap().push(request);
            if n == 0 && served == 1 {
                return;
            }
            served += 1;
            if stream.write_all(OK).await.is_err() {
                return;
            }
        }
    }

    #[tokio::test]
    async fn a_request_without_a_body_lost_to_that_race_is_sent_again() {
        let up = Upstream::start(closes_on_the_second).await;
        let pool = up.pool();
        assert_eq!(
            text(pool.send_as(get("/a")).await.unwrap()).await.unwrap(),
            "ok"
        );
        assert_eq!(
            text(pool.send_as(get("/b")).await.unwrap()).await.unwrap(),
            "ok"
        );
        assert_eq!(up.connections(), 2);
        let paths: Vec<String> = up
            .requests()
            .iter()
            .map(|r| r.split(' ').nth(1).unwrap().to_owned())
            .collect();
        assert_eq!(paths, ["/a", "/b", "/b"]);
    }

    #[tokio::test]
    async fn a_request_with_a_body_is_never_sent_twice() {
        let up = Upstream::start(closes_on_the_second).await;
        let pool = up.pool();
        assert_eq!(
            text(pool.send_as(get("/a")).await.unwrap()).await.unwrap(),
            "ok"
        );
        let post = Request::post("/b")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let e = pool.send_as(post).await.unwrap_err();
        assert!(matches!(e, Error::Exchange(_)), "{e:?}");
        assert_eq!(up.requests().len(), 2);
    }

    #[tokio::test]
    async fn an_answer_before_the_body_is_sent_is_passed_on() {
        // The upstream refuses as soon as it has the head, and closes.
        let up = Upstream::start(|_, mut stream: TcpStream, _| async move {
            let mut buf = [0u8; 1024];
            let _ = stream.read(&mut buf).await;
            let _ = stream
                .write_all(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 3\r\n\r\nbig")
                .await;
        })
        .await;
        let pool = up.pool();
        let (tx, body) = MockBody::channel(Some(1 << 20));
        tokio::spawn(async move {
            for _ in 0..16 {
                if tx.send(Bytes::from(vec![b'x'; 1 << 16])).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        let response = pool
            .send_as(Request::post("/upload").body(body).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), 413);
        assert_eq!(text(response).await.unwrap(), "big");
        // Not reused: the request never went out whole.
        assert!((pool.lock().total == 0));
    }

    #[tokio::test]
    async fn informational_answers_are_skipped() {
        let up = Upstream::start(|_, mut stream: TcpStream, _| async move {
            let mut buf = Vec::new();
            while read_request(&mut stream, &mut buf).await.is_some() {
                let answer = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                let _ = stream.write_all(answer).await;
            }
        })
        .await;
        let pool = up.pool();
        for _ in 0..2 {
            let response = pool.send_as(get("/")).await.unwrap();
            assert_eq!(response.status(), 200);
            assert!(!response.headers().contains_key("link"));
            assert_eq!(text(response).await.unwrap(), "ok");
        }
        assert_eq!(up.connections(), 1);
    }

    #[tokio::test]
    async fn bytes_past_an_answer_never_reach_the_next_exchange() {
        // The first answer comes with a second one behind it, in the same write or a
        // moment later: the connection is dropped either way.
        for split in [false, true] {
            let up = Upstream::start(move |n, mut stream: TcpStream, _| async move {
                let mut buf = Vec::new();
                while read_request(&mut stream, &mut buf).await.is_some() {
                    if n == 0 {
                        let smuggled = b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nsmuggled!";
                        let mut all = OK.to_vec();
                        if split {
                            let _ = stream.write_all(&all).await;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            all.clear();
                        }
                        all.extend_from_slice(smuggled);
                        let _ = stream.write_all(&all).await;
                    } else {
                        let _ = stream.write_all(OK).await;
                    }
                }
            })
            .await;
            let pool = up.pool();
            assert_eq!(
                text(pool.send_as(get("/")).await.unwrap()).await.unwrap(),
                "ok"
            );
            tokio::time::sleep(Duration::from_millis(60)).await;
            assert_eq!(
                text(pool.send_as(get("/")).await.unwrap()).await.unwrap(),
                "ok"
            );
            assert_eq!(up.connections(), 2, "split {split}");
        }
    }

    #[tokio::test]
    async fn an_answer_left_unread_closes_its_connection() {
        let up = Upstream::start(|_, mut stream: TcpStream, _| async move {
            let mut buf = Vec::new();
            while read_request(&mut stream, &mut buf).await.is_some() {
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\npartial")
                    .await;
            }
        })
        .await;
        let pool = up.pool();
        let mut body = pool.send_as(get("/")).await.unwrap().into_body();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&first[..], b"partial");
        drop(body);
        assert!((pool.lock().total == 0));
    }

    #[tokio::test]
    async fn bodies_are_framed_as_rfc_9112_says() {
        let up = Upstream::start(|n, mut stream: TcpStream, _| async move {
            let mut buf = Vec::new();
            while read_request(&mut stream, &mut buf).await.is_some() {
                let answer: &[u8] = match n {
                    // HEAD: a length, no body; the connection stays.
                    0 => b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
                    // Chunked, with trailers.
                    1 => b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhe\r\n3;x=y\r\nllo\r\n0\r\nX-Trailer: t\r\n\r\n",
                    // HTTP/1.0, until the connection closes.
                    _ => b"HTTP/1.0 200 OK\r\n\r\nuntil close",
                };
                let _ = stream.write_all(answer).await;
                if n >= 1 {
                    return;
                }
            }
        })
        .await;
        let pool = up.pool();
        let head = Request::head("/").body(Empty::<Bytes>::new()).unwrap();
        let response = pool.send_as(head).await.unwrap();
        assert_eq!(response.headers()["content-length"], "5");
        assert!(response.body().is_end_stream());
        assert_eq!(text(response).await.unwrap(), "");
        assert_eq!(
            pool.lock().total,
            0,
            "a HEAD answer announcing a length does not leave its connection usable"
        );
        let response = pool.send_as(get("/")).await.unwrap();
        assert!(!response.headers().contains_key("transfer-encoding"));
        assert_eq!(text(response).await.unwrap(), "hello");
        let response = pool.send_as(get("/")).await.unwrap();
        assert_eq!(response.version(), http::Version::HTTP_10);
        assert_eq!(text(response).await.unwrap(), "until close");
        assert!((pool.lock().total == 0));
    }

    #[tokio::test]
    async fn request_bodies_go_up_in_their_own_framing() {
        let up = Upstream::start(keep_alive).await;
        let pool = up.pool();
        // Length unknown: chunked.
        let (tx, body) = MockBody::channel(None);
        tokio::spawn(async move {
            for piece in ["abc", "defg"] {
                tx.send(Bytes::from(piece)).await.unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        let mut request = Request::post("/c").body(body).unwrap();
        // A client's framing headers are never taken as they came.
        request.headers_mut().insert(
            header::CONTENT_LENGTH,
            http::HeaderValue::from_static("999"),
        );
        assert_eq!(
            text(pool.send_as(request).await.unwrap()).await.unwrap(),
            "ok"
        );
        // Length known: Content-Length, the body as it came.
        let request = Request::post("/l")
            .body(Full::new(Bytes::from_static(b"hello")))
            .unwrap();
        assert_eq!(
            text(pool.send_as(request).await.unwrap()).await.unwrap(),
            "ok"
        );
        let requests = up.requests();
        assert!(
            requests[0]
                .contains("transfer-encoding: chunked\r\n\r\n3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n"),
            "{}",
            requests[0]
        );
        assert!(!requests[0].contains("999"));
        assert!(
            requests[1].ends_with("content-length: 5\r\n\r\nhello"),
            "{}",
            requests[1]
        );
        assert_eq!(up.connections(), 1);
    }

    #[tokio::test]
    async fn a_body_that_breaks_its_length_is_the_clients_fault() {
        let up = Upstream::start(keep_alive).await;
        let pool = up.pool();
        let (tx, body) = MockBody::channel(Some(10));
        tokio::spawn(async move {
            tx.send(Bytes::from_static(b"short")).await.unwrap();
        });
        let e = pool
            .send_as(Request::post("/").body(body).unwrap())
            .await
            .unwrap_err();
        assert!(e.is_client_body(), "{e:?}");
    }

    /// An observer that keeps every fault it is told.
    fn recording() -> (Observer, Arc<Mutex<Vec<Fault>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&seen);
        let observer: Observer = Arc::new(move |f| kept.lock().unwrap().push(f));
        (observer, seen)
    }

    fn principal(sub: &'static str, scope: &'static str, conn: u64) -> Caller<'static> {
        Caller::Principal {
            sub,
            scope,
            conn: crate::upstream::ConnId(conn),
        }
    }

    async fn fetch(pool: &Arc<Pool>, caller: Caller<'_>) -> Result<String, Error> {
        text(pool.send(get("/"), caller).await?).await
    }

    #[tokio::test]
    async fn an_idle_connection_serves_only_the_caller_it_served() {
        let up = Upstream::start(keep_alive).await;
        let pool = up.pool();
        // One principal on two client connections shares its connection.
        fetch(&pool, principal("a", "v", 1)).await.unwrap();
        fetch(&pool, principal("a", "v", 2)).await.unwrap();
        assert_eq!(up.connections(), 1);
        // Another sub, the same sub in another scope, a sub and scope that join to the
        // same text, a caller without a token: each a connection of its own.
        fetch(&pool, principal("b", "v", 1)).await.unwrap();
        assert_eq!(up.connections(), 2);
        fetch(&pool, principal("a", "w", 1)).await.unwrap();
        assert_eq!(up.connections(), 3);
        fetch(&pool, principal("av", "", 1)).await.unwrap();
        assert_eq!(up.connections(), 4);
        fetch(&pool, Caller::Anonymous(crate::upstream::ConnId(1)))
            .await
            .unwrap();
        assert_eq!(up.connections(), 5);
        // And each finds its own again.
        for caller in [
            principal("a", "v", 3),
            principal("b", "v", 3),
            principal("a", "w", 3),
            principal("av", "", 3),
            Caller::Anonymous(crate::upstream::ConnId(1)),
        ] {
            fetch(&pool, caller).await.unwrap();
        }
        assert_eq!(up.connections(), 5);
        // Without a token, another client connection is another caller.
        fetch(&pool, Caller::Anonymous(crate::upstream::ConnId(2)))
            .await
            .unwrap();
        assert_eq!(up.connections(), 6);
    }

    #[tokio::test]
    async fn reuse_by_connection_and_shared() {
        let up = Upstream::start(keep_alive).await;
        let pool = up.pool_with(Reuse::Connection, crate::upstream::unobserved());
        fetch(&pool, principal("a", "v", 1)).await.unwrap();
        fetch(&pool, principal("a", "v", 2)).await.unwrap();
        assert_eq!(up.connections(), 2, "one principal, two client connections");
        fetch(&pool, principal("b", "v", 2)).await.unwrap();
        fetch(&pool, Caller::Anonymous(crate::upstream::ConnId(2)))
            .await
            .unwrap();
        assert_eq!(up.connections(), 2, "one client connection, three callers");

        let up = Upstream::start(keep_alive).await;
        let pool = up.pool_with(Reuse::Shared, crate::upstream::unobserved());
        fetch(&pool, principal("a", "v", 1)).await.unwrap();
        fetch(&pool, principal("b", "w", 2)).await.unwrap();
        fetch(&pool, Caller::Anonymous(crate::upstream::ConnId(3)))
            .await
            .unwrap();
        assert_eq!(up.connections(), 1);
        // The probe keeps to itself whatever the setting.
        fetch(&pool, Caller::Sidecar).await.unwrap();
        assert_eq!(up.connections(), 2);
    }

    #[tokio::test]
    async fn idle_connections_are_bounded_per_caller_and_in_all() {
        let up = Upstream::start(keep_alive).await;
        let settings = PoolSettings {
            connect_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(60),
            max_idle: 3,
            max_idle_per_caller: 2,
            reuse: Reuse::Principal,
            workers: 1,
        };
        let pool =
            Arc::new(Pool::new(&up.uri, None, &settings, crate::upstream::unobserved()).unwrap());
        // Three answers of one caller held open at once: three connections, two kept.
        let a = principal("a", "", 1);
        let held: Vec<_> = futures_join(&pool, a, 3).await;
        assert_eq!(up.connections(), 3);
        drop(held);
        assert_eq!(pool.lock().total, 2);
        assert_eq!(pool.lock().by_key.len(), 1);
        // Another caller's two: the pool is full after one of them.
        let held: Vec<_> = futures_join(&pool, principal("b", "", 1), 2).await;
        drop(held);
        assert_eq!(pool.lock().total, 3);
        // The kept ones are used again, newest first.
        fetch(&pool, a).await.unwrap();
        fetch(&pool, principal("b", "", 9)).await.unwrap();
        assert_eq!(up.connections(), 5);
    }

    /// `n` answers for `caller` read whole but their bodies kept, so that their
    /// connections are busy at once; dropping them gives the connections back.
    async fn futures_join(pool: &Arc<Pool>, caller: Caller<'_>, n: usize) -> Vec<Answer> {
        let mut held = Vec::new();
        for _ in 0..n {
            // The answer is read up to its last byte, not past it: the connection is
            // handed back when the body's end is polled.
            let response = pool.send(get("/"), caller).await.unwrap();
            held.push(response.into_body());
        }
        let mut out = Vec::new();
        for mut body in held {
            let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
            assert_eq!(&first[..], b"ok");
            out.push(body);
        }
        out
    }

    /// Answers every request with `OK`; after the first answer on a connection, the
    /// next request on it gets a smuggled answer first (as an upstream that framed the
    /// first answer one way and wrote it another would send).
    async fn late_smuggler(_: usize, mut stream: TcpStream, seen: Arc<Mutex<Vec<String>>>) {
        let mut buf = Vec::new();
        let mut served = 0;
        while let Some(request) = read_request(&mut stream, &mut buf).await {
            seen.lock().unwrap().push(request);
            let answer: &[u8] = if served == 1 {
                b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nfirst's!!!!"
            } else {
                OK
            };
            served += 1;
            if stream.write_all(answer).await.is_err() {
                return;
            }
        }
    }

    #[tokio::test]
    async fn bytes_an_upstream_sends_late_reach_only_their_own_caller() {
        // Shared reuse: the second caller reads what the upstream meant for the first.
        // This is why it is not the default.
        let up = Upstream::start(late_smuggler).await;
        let pool = up.pool_with(Reuse::Shared, crate::upstream::unobserved());
        assert_eq!(fetch(&pool, principal("a", "", 1)).await.unwrap(), "ok");
        assert_eq!(
            fetch(&pool, principal("b", "", 2)).await.unwrap(),
            "first's!!!!"
        );
        // By principal: never.
        let up = Upstream::start(late_smuggler).await;
        let pool = up.pool();
        assert_eq!(fetch(&pool, principal("a", "", 1)).await.unwrap(), "ok");
        assert_eq!(fetch(&pool, principal("b", "", 2)).await.unwrap(), "ok");
        assert_eq!(
            fetch(&pool, principal("b", "", 2)).await.unwrap(),
            "first's!!!!"
        );
        assert_eq!(up.connections(), 2);
    }

    #[tokio::test]
    async fn a_refused_answer_is_counted_and_its_connection_closed() {
        let answers: [(&[u8], Fault); 5] = [
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
                Fault::Wire(WireError::Length),
            ),
            (
                b"HTTP/1.1 204 No Content\r\nContent-Length: 2\r\n\r\nok",
                Fault::Wire(WireError::Bodiless),
            ),
            (
                b"HTTP/1.1 100 Continue\r\nContent-Length: 2\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
                Fault::Wire(WireError::Bodiless),
            ),
            (
                b"HTTP/1.1 200 OK\nContent-Length: 2\r\n\r\nok",
                Fault::Wire(WireError::Head),
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX: 1\n\r\n",
                Fault::Wire(WireError::Chunked),
            ),
        ];
        for (answer, fault) in answers {
            let up = Upstream::start(move |_, mut stream: TcpStream, _| async move {
                let mut buf = Vec::new();
                while read_request(&mut stream, &mut buf).await.is_some() {
                    let _ = stream.write_all(answer).await;
                }
            })
            .await;
            let (observer, seen) = recording();
            let pool = up.pool_with(Reuse::Principal, observer);
            let a = principal("a", "", 1);
            let e = fetch(&pool, a).await.unwrap_err();
            assert!(matches!(e, Error::Exchange(_)), "{e:?}");
            assert_eq!(*seen.lock().unwrap(), [fault]);
            assert_eq!(pool.lock().total, 0);
            let _ = fetch(&pool, a).await;
            assert_eq!(up.connections(), 2, "{fault:?}");
        }
    }

    #[tokio::test]
    async fn bytes_after_an_answer_are_counted() {
        for split in [false, true] {
            let up = Upstream::start(move |_, mut stream: TcpStream, _| async move {
                let mut buf = Vec::new();
                while read_request(&mut stream, &mut buf).await.is_some() {
                    let _ = stream.write_all(OK).await;
                    if split {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    let _ = stream.write_all(b"stray").await;
                }
            })
            .await;
            let (observer, seen) = recording();
            let pool = up.pool_with(Reuse::Principal, observer);
            assert_eq!(fetch(&pool, ONE).await.unwrap(), "ok");
            if split {
                // Seen when the idle connection is next looked at.
                tokio::time::sleep(Duration::from_millis(60)).await;
            }
            assert_eq!(fetch(&pool, ONE).await.unwrap(), "ok");
            assert_eq!(up.connections(), 2, "split {split}");
            assert_eq!(seen.lock().unwrap()[0], Fault::BytesAfterAnswer);
        }
    }

    #[tokio::test]
    async fn only_idempotent_requests_without_a_body_are_sent_twice() {
        for (method, retried) in [
            (Method::GET, true),
            (Method::DELETE, true),
            (Method::POST, false),
            (Method::PATCH, false),
        ] {
            let up = Upstream::start(closes_on_the_second).await;
            let pool = up.pool();
            assert_eq!(fetch(&pool, ONE).await.unwrap(), "ok");
            let request = Request::builder()
                .method(method.clone())
                .uri("/b")
                .body(Empty::<Bytes>::new())
                .unwrap();
            let sent = pool.send(request, ONE).await;
            assert_eq!(sent.is_ok(), retried, "{method}");
            assert_eq!(up.requests().len(), if retried { 3 } else { 2 }, "{method}");
        }
    }

    /// The test certificate and key (for `localhost`).
    fn tls_fixture() -> (Arc<ClientConfig>, tokio_rustls::TlsAcceptor) {
        use rustls::pki_types::pem::PemObject;
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tls");
        let certs = crate::upstream::load_certs(&dir.join("localhost.crt"), "test").unwrap();
        let key =
            rustls::pki_types::PrivateKeyDer::from_pem_file(dir.join("localhost.key")).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut server = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs.clone(), key)
            .unwrap();
        server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let mut roots = rustls::RootCertStore::empty();
        roots.add(certs[0].clone()).unwrap();
        let mut client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.alpn_protocols = vec![b"http/1.1".to_vec()];
        (
            Arc::new(client),
            tokio_rustls::TlsAcceptor::from(Arc::new(server)),
        )
    }

    #[tokio::test]
    async fn https_upstreams_speak_the_same_http_1_1_over_tls() {
        let (client, acceptor) = tls_fixture();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let alpn = Arc::new(Mutex::new(Vec::new()));
        let seen_alpn = Arc::clone(&alpn);
        tokio::spawn(async move {
            // Connection 0 answers well; connection 1 misframes its answer.
            for n in 0.. {
                let (tcp, _) = listener.accept().await.unwrap();
                let mut tls = acceptor.accept(tcp).await.unwrap();
                seen_alpn
                    .lock()
                    .unwrap()
                    .push(tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec));
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let mut pending = Vec::new();
                    loop {
                        match tls.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(k) => pending.extend_from_slice(&buf[..k]),
                        }
                        while let Some(i) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                            pending.drain(..i + 4);
                            let answer: &[u8] = if n == 0 {
                                OK
                            } else {
                                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok"
                            };
                            if tls.write_all(answer).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        let uri: Uri = format!("https://localhost:{port}/").parse().unwrap();
        let settings = PoolSettings {
            connect_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(60),
            max_idle: 4,
            max_idle_per_caller: 4,
            reuse: Reuse::Principal,
            workers: 1,
        };
        let (observer, faults) = recording();
        let pool = Arc::new(Pool::new(&uri, Some(client), &settings, observer).unwrap());
        for _ in 0..3 {
            assert_eq!(fetch(&pool, ONE).await.unwrap(), "ok");
        }
        // One connection for all three (a TLS 1.3 session ticket is no stray byte), and
        // HTTP/1.1 chosen by ALPN.
        assert_eq!(*alpn.lock().unwrap(), [Some(b"http/1.1".to_vec())]);
        assert!(faults.lock().unwrap().is_empty());
        // Another caller, another connection: misframed, refused, counted.
        assert!(fetch(&pool, principal("b", "", 1)).await.is_err());
        assert_eq!(*faults.lock().unwrap(), [Fault::Wire(WireError::Length)]);
    }

    #[tokio::test]
    async fn a_large_answer_goes_on_in_large_pieces() {
        // The upstream has written all of a 1 MiB answer before the body is read: the
        // pieces are as large as `MAX_PIECE`, not one read's worth each.
        const SIZE: usize = 1 << 20;
        for chunked in [false, true] {
            let (written, wait) = tokio::sync::oneshot::channel();
            let written = Arc::new(Mutex::new(Some(written)));
            let up = Upstream::start(move |_, mut stream: TcpStream, _| {
                let written = Arc::clone(&written);
                async move {
                    let mut buf = Vec::new();
                    if read_request(&mut stream, &mut buf).await.is_some() {
                        let body = vec![b'x'; SIZE];
                        let mut answer = if chunked {
                            format!(
                                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{SIZE:x}\r\n"
                            )
                        } else {
                            format!("HTTP/1.1 200 OK\r\nContent-Length: {SIZE}\r\n\r\n")
                        }
                        .into_bytes();
                        answer.extend_from_slice(&body);
                        if chunked {
                            answer.extend_from_slice(b"\r\n0\r\n\r\n");
                        }
                        let _ = stream.write_all(&answer).await;
                        if let Some(tx) = written.lock().unwrap().take() {
                            let _ = tx.send(());
                        }
                        // Kept open until the client is done.
                        let _ = stream.read(&mut [0u8; 1]).await;
                    }
                }
            })
            .await;
            let pool = up.pool();
            let mut body = pool.send(get("/"), ONE).await.unwrap().into_body();
            wait.await.unwrap();
            let (mut pieces, mut total) = (0, 0);
            while let Some(frame) = body.frame().await {
                let data = frame.unwrap().into_data().unwrap();
                assert!(data.len() <= MAX_PIECE + READ_CHUNK);
                total += data.len();
                pieces += 1;
            }
            assert_eq!(total, SIZE);
            assert!(
                pieces <= SIZE / (MAX_PIECE / 2),
                "{pieces} pieces (chunked: {chunked})"
            );
        }
    }

    mod interleaved {
        //! Arbitrary upstream byte streams answering callers whose exchanges interleave
        //! on one pool: no byte meant for one caller ever reaches another.

        use super::*;
        use proptest::prelude::*;

        /// How the upstream answers one request; `M` is the requesting caller's marker.
        #[derive(Debug, Clone)]
        enum Shape {
            /// A well-framed answer.
            Length,
            Chunked,
            /// Ambiguous or disallowed framing, the rest of the body after it.
            LengthAndChunked,
            NoContentWithBody,
            NotModifiedWithBody,
            ContinueWithLength,
            BareLf,
            /// A good answer, then a second answer at once.
            Pipelined,
            /// A good answer, then a second answer once the next request on the
            /// connection has arrived.
            Late,
            /// HTTP/1.0, until the upstream closes.
            UntilClose,
            /// Bytes (without `#`, the markers' delimiter), then the upstream closes.
            Garbage(Vec<u8>),
        }

        fn shape() -> impl Strategy<Value = (Shape, bool)> {
            let shape = prop_oneof![
                Just(Shape::Length),
                Just(Shape::Chunked),
                Just(Shape::LengthAndChunked),
                Just(Shape::NoContentWithBody),
                Just(Shape::NotModifiedWithBody),
                Just(Shape::ContinueWithLength),
                Just(Shape::BareLf),
                Just(Shape::Pipelined),
                Just(Shape::Late),
                Just(Shape::UntilClose),
                proptest::collection::vec(
                    proptest::num::u8::ANY.prop_filter("no marker byte", |b| *b != b'#'),
                    0..64
                )
                .prop_map(Shape::Garbage),
            ];
            (shape, proptest::bool::weighted(0.2))
        }

        fn marker(caller: usize) -> String {
            format!("#caller-{caller}#")
        }

        fn length(m: &str) -> Vec<u8> {
            format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{m}", m.len()).into_bytes()
        }

        /// The bytes written at once, and those kept for the next request.
        fn render(shape: &Shape, m: &str) -> (Vec<u8>, Vec<u8>) {
            let n = m.len();
            let chunked = format!("{n:x}\r\n{m}\r\n0\r\n\r\n");
            let now = match shape {
                Shape::Length => length(m),
                Shape::Chunked => {
                    format!("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{chunked}")
                        .into_bytes()
                }
                Shape::LengthAndChunked => format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n{chunked}"
                )
                .into_bytes(),
                Shape::NoContentWithBody => {
                    format!("HTTP/1.1 204 No Content\r\nContent-Length: {n}\r\n\r\n{m}").into_bytes()
                }
                Shape::NotModifiedWithBody => {
                    format!("HTTP/1.1 304 Not Modified\r\nContent-Length: {n}\r\n\r\n{m}")
                        .into_bytes()
                }
                Shape::ContinueWithLength => {
                    let mut out = format!("HTTP/1.1 100 Continue\r\nContent-Length: {n}\r\n\r\n")
                        .into_bytes();
                    out.extend(length(m));
                    out
                }
                Shape::BareLf => {
                    format!("HTTP/1.1 200 OK\nContent-Length: {n}\n\n{m}").into_bytes()
                }
                Shape::Pipelined => [length(m), length(m)].concat(),
                Shape::Late => return (length(m), length(m)),
                Shape::UntilClose => format!("HTTP/1.0 200 OK\r\n\r\n{m}").into_bytes(),
                Shape::Garbage(bytes) => bytes.clone(),
            };
            (now, Vec::new())
        }

        /// Whether the upstream closes after this answer.
        fn closes(shape: &Shape, close: bool) -> bool {
            close || matches!(shape, Shape::UntilClose | Shape::Garbage(_))
        }

        async fn upstream(script: Arc<Mutex<std::collections::VecDeque<(Shape, bool)>>>) -> Uri {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let uri = format!("http://{}", listener.local_addr().unwrap())
                .parse()
                .unwrap();
            tokio::spawn(async move {
                while let Ok((mut stream, _)) = listener.accept().await {
                    let script = Arc::clone(&script);
                    tokio::spawn(async move {
                        let mut buf = Vec::new();
                        let mut late = Vec::new();
                        while let Some(request) = read_request(&mut stream, &mut buf).await {
                            let caller: usize = request
                                .lines()
                                .find_map(|l| l.strip_prefix("x-caller: "))
                                .and_then(|c| c.trim().parse().ok())
                                .unwrap_or(usize::MAX);
                            let Some((shape, close)) = script.lock().unwrap().pop_front() else {
                                return;
                            };
                            let (now, next) = render(&shape, &marker(caller));
                            let mut out = std::mem::replace(&mut late, next);
                            out.extend(now);
                            if stream.write_all(&out).await.is_err() || closes(&shape, close) {
                                return;
                            }
                        }
                    });
                }
            });
            uri
        }

        const SUBS: [&str; 3] = ["alice", "bob", "carol"];

        proptest! {
            #![proptest_config(ProptestConfig {
                cases: 48,
                failure_persistence: None,
                ..ProptestConfig::default()
            })]
            #[test]
            fn no_caller_reads_bytes_meant_for_another(
                script in proptest::collection::vec(shape(), 1..10),
                order in proptest::collection::vec(0usize..3, 1..10),
                same_conn in proptest::bool::ANY,
            ) {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async move {
                    let script: std::collections::VecDeque<_> = script.into_iter().collect();
                    let uri = upstream(Arc::new(Mutex::new(script))).await;
                    let settings = PoolSettings {
                        connect_timeout: Duration::from_secs(2),
                        idle_timeout: Duration::from_secs(60),
                        max_idle: 8,
                        max_idle_per_caller: 2,
                        reuse: Reuse::Principal,
            workers: 1,
                    };
                    let pool = Arc::new(
                        Pool::new(&uri, None, &settings, crate::upstream::unobserved()).unwrap(),
                    );
                    for who in order {
                        // Every caller on one client connection, or each on its own.
                        let conn = if same_conn { 1 } else { who as u64 };
                        let caller = Caller::Principal {
                            sub: SUBS[who],
                            scope: "",
                            conn: crate::upstream::ConnId(conn),
                        };
                        let request = Request::get("/")
                            .header("x-caller", who.to_string())
                            .body(Empty::<Bytes>::new())
                            .unwrap();
                        let exchange = async {
                            let response = pool.send(request, caller).await.ok()?;
                            let mut seen = format!("{:?}", response.headers()).into_bytes();
                            let mut body = response.into_body();
                            while let Some(Ok(frame)) = body.frame().await {
                                if let Ok(data) = frame.into_data() {
                                    seen.extend_from_slice(&data);
                                }
                            }
                            Some(seen)
                        };
                        let seen = tokio::time::timeout(Duration::from_millis(500), exchange)
                            .await
                            .ok()
                            .flatten()
                            .unwrap_or_default();
                        let seen = String::from_utf8_lossy(&seen);
                        for other in (0..3).filter(|o| *o != who) {
                            prop_assert!(
                                !seen.contains(&marker(other)),
                                "{} read {}'s bytes: {seen}",
                                SUBS[who],
                                SUBS[other]
                            );
                        }
                    }
                    Ok(())
                })?;
            }
        }
    }
}
