//! Exchanges with a plain-http upstream on pooled keep-alive connections, each exchange
//! driven by the task that asked for it: no connection task, no channel between the
//! two, no per-request future boxed by a client. On the sidecar's passthrough path that
//! machinery cost more instructions than everything else hyper did together
//! (`docs/benchmarks.md`, "The upstream client").
//!
//! A connection goes back to the idle pool only when its exchange is over and nothing is
//! left on it: the request sent whole, the answer read whole as [`wire`] framed it, no
//! byte after it, HTTP/1.1 without `Connection: close`. Anything else closes it. Idle
//! connections are checked before use (one the upstream closed or wrote to is dropped,
//! without a system call) and reaped after the idle timeout. A request without a body
//! that fails on a reused connection before any byte of an answer (the upstream closed
//! it as the request went out: Node closes idle keep-alive sockets after five seconds)
//! is sent once more on a new connection.

use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::uri::PathAndQuery;
use http::{header, Method, Request, Response, Uri};
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::wire::{self, Chunked, Decoded, Framing, Parsed, RequestFraming, WireError};
use super::{BoxError, Error};

/// How much a read asks for at a time.
const READ_CHUNK: usize = 16 * 1024;

/// Request body bytes that go out in the first write with the head, when at hand.
const FIRST_WRITE: usize = 16 * 1024;

/// One connection and what has been read from it but not yet used.
#[derive(Debug)]
struct Conn {
    stream: TcpStream,
    buf: BytesMut,
}

impl Conn {
    /// Whether nothing has arrived since the last exchange: an idle keep-alive connection
    /// has nothing to read, so readiness means the upstream closed it or wrote past an
    /// answer. Asks the runtime's readiness, never the socket.
    fn is_quiet(&self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        self.stream.poll_read_ready(&mut cx).is_pending()
    }
}

#[derive(Debug)]
struct Idle {
    conn: Conn,
    since: Instant,
}

/// The idle connections to one plain-http upstream.
#[derive(Debug)]
pub(super) struct Pool {
    /// Connected to, as `(host, port)`; the host without IPv6 brackets.
    host: String,
    port: u16,
    /// `Host` for requests that carry none.
    authority: String,
    connect_timeout: Duration,
    idle_timeout: Duration,
    max_idle: usize,
    idle: Mutex<Vec<Idle>>,
    /// Whether the reaper task runs (started with the first idle connection, inside the
    /// runtime).
    reaping: AtomicBool,
}

impl Pool {
    /// A pool for `uri`'s authority, `None` unless `uri` is plain http with a host.
    pub(super) fn new(
        uri: &Uri,
        connect_timeout: Duration,
        idle_timeout: Duration,
        max_idle: usize,
    ) -> Option<Pool> {
        if uri.scheme() != Some(&http::uri::Scheme::HTTP) {
            return None;
        }
        let authority = uri.authority()?;
        let host = authority.host();
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        Some(Pool {
            host: host.to_owned(),
            port: authority.port_u16().unwrap_or(80),
            authority: authority
                .as_str()
                .rsplit_once('@')
                .map_or(authority.as_str(), |(_, a)| a)
                .to_owned(),
            connect_timeout,
            idle_timeout,
            max_idle,
            idle: Mutex::new(Vec::new()),
            reaping: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        // The list holds no invariant a panicking holder could break halfway.
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The most recently used idle connection still fit for use, if any.
    fn take_idle(&self) -> Option<Conn> {
        let mut stale = Vec::new();
        let found = {
            let mut idle = self.lock();
            loop {
                match idle.pop() {
                    Some(entry)
                        if entry.since.elapsed() < self.idle_timeout && entry.conn.is_quiet() =>
                    {
                        break Some(entry.conn)
                    }
                    Some(entry) => stale.push(entry),
                    None => break None,
                }
            }
        };
        // Closed outside the lock.
        drop(stale);
        found
    }

    async fn connect(&self) -> Result<Conn, Error> {
        let connect = TcpStream::connect((self.host.as_str(), self.port));
        let stream = tokio::time::timeout(self.connect_timeout, connect)
            .await
            .map_err(|_| Error::Connect(io::Error::from(io::ErrorKind::TimedOut).into()))?
            .map_err(|e| Error::Connect(e.into()))?;
        // An answer's last piece must not wait for the peer's acknowledgement.
        stream
            .set_nodelay(true)
            .map_err(|e| Error::Connect(e.into()))?;
        Ok(Conn {
            stream,
            buf: BytesMut::with_capacity(READ_CHUNK),
        })
    }

    /// Keeps `conn` for another exchange, if there is room.
    fn check_in(self: &Arc<Self>, conn: Conn) {
        if self.max_idle == 0 {
            return;
        }
        let kept = {
            let mut idle = self.lock();
            if idle.len() < self.max_idle {
                idle.push(Idle {
                    conn,
                    since: Instant::now(),
                });
                None
            } else {
                Some(conn)
            }
        };
        drop(kept);
        if !self.reaping.swap(true, Ordering::Relaxed) {
            // An answer may be dropped outside the runtime; the next check-in inside it
            // starts the reaper then.
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn(reap(Arc::downgrade(self)))),
                Err(_) => self.reaping.store(false, Ordering::Relaxed),
            }
        }
    }

    /// Sends `request` and returns the answer once its head is read; the body is read as
    /// it is polled. Only the path and query of the request's URI are used.
    pub(super) async fn send<B>(
        self: &Arc<Self>,
        request: Request<B>,
    ) -> Result<Response<Answer>, Error>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: Into<BoxError>,
    {
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
        let (mut conn, reused) = match self.take_idle() {
            Some(conn) => (conn, true),
            None => (self.connect().await?, false),
        };
        let exchanged = exchange(&mut conn, &head, &mut body, framing, &parts.method).await;
        let (answer, complete) = match exchanged {
            Ok(done) => done,
            // Nothing of an answer came, and nothing of the request is lost: once more,
            // on a connection of its own.
            Err(failure)
                if failure.before_answer
                    && reused
                    && matches!(framing, RequestFraming::None | RequestFraming::Length(0)) =>
            {
                drop(conn);
                conn = self.connect().await?;
                exchange(&mut conn, &head, &mut body, framing, &parts.method)
                    .await
                    .map_err(|f| f.error)?
            }
            Err(failure) => return Err(failure.error),
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
            reusable: answer.keep_alive && complete,
            pool: Arc::clone(self),
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
}

/// Drops idle connections past the idle timeout or no longer quiet, until the pool is
/// gone.
async fn reap(pool: Weak<Pool>) {
    let every = match pool.upgrade() {
        Some(pool) => (pool.idle_timeout / 2).max(Duration::from_secs(1)),
        None => return,
    };
    loop {
        tokio::time::sleep(every).await;
        let Some(pool) = pool.upgrade() else {
            return;
        };
        let stale: Vec<Idle> = {
            let mut idle = pool.lock();
            let (keep, stale) = std::mem::take(&mut *idle)
                .into_iter()
                .partition(|e| e.since.elapsed() < pool.idle_timeout && e.conn.is_quiet());
            *idle = keep;
            stale
        };
        drop(stale);
    }
}

/// Why an exchange failed, and whether it failed before any byte of an answer came.
struct Failure {
    error: Error,
    before_answer: bool,
}

impl Failure {
    fn upstream(e: impl Into<BoxError>, before_answer: bool) -> Failure {
        Failure {
            error: Error::Exchange(e.into()),
            before_answer,
        }
    }

    fn client_body(e: impl Into<BoxError>) -> Failure {
        Failure {
            error: Error::ClientBody(e.into()),
            before_answer: false,
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
    if matches!(framing, RequestFraming::None | RequestFraming::Length(0)) {
        if let Err(e) = conn.stream.write_all(head).await {
            return Err(Failure::upstream(e, true));
        }
        return read_head(&mut conn.stream, &mut conn.buf, method)
            .await
            .map(|head| (head, true));
    }
    // What the body has ready now goes with the head, up to FIRST_WRITE bytes.
    let mut out = vec![head.clone()];
    let mut ended = false;
    while (sending.sent as usize) < FIRST_WRITE {
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
                break;
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
    let (mut reader, mut writer) = conn.stream.split();
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
    let recv = read_head(&mut reader, &mut conn.buf, method);
    let (mut send, mut recv) = (pin!(send), pin!(recv));
    let mut sent = false;
    let mut write_failed = None;
    loop {
        tokio::select! {
            biased;
            head = &mut recv => {
                return match (head, write_failed) {
                    (Ok(head), _) => Ok((head, sent)),
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
            match wire::parse_head(buf, method).map_err(|e| Failure::upstream(e, false))? {
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

/// The body of an answer from a plain-http upstream, read from its connection as it is
/// polled. Read whole, the connection goes back to the pool; dropped before, it closes.
#[derive(Debug)]
pub struct Answer {
    conn: Option<Conn>,
    state: State,
    /// Whether the connection may be used again once the body is read whole.
    reusable: bool,
    pool: Arc<Pool>,
}

impl Answer {
    /// The body has been read whole: its connection goes back to the pool if fit.
    fn finish(&mut self) {
        self.state = State::Done;
        if let Some(conn) = self.conn.take() {
            // A byte past the answer means the two sides framed it differently.
            if self.reusable && conn.buf.is_empty() {
                self.pool.check_in(conn);
            }
        }
    }

    fn fail(&mut self, e: impl Into<BoxError>) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        self.conn = None;
        self.state = State::Done;
        Poll::Ready(Some(Err(Error::Exchange(e.into()))))
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
            match &mut this.state {
                State::Done | State::Length(0) => {
                    this.finish();
                    return Poll::Ready(None);
                }
                State::Length(left) if !conn.buf.is_empty() => {
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
                State::Chunked(chunked) if !conn.buf.is_empty() => {
                    match chunked.decode(&mut conn.buf) {
                        Ok(Decoded::Data(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                        Ok(Decoded::End) => {
                            this.finish();
                            return Poll::Ready(None);
                        }
                        Ok(Decoded::Partial) => {}
                        Err(e) => return this.fail(e),
                    }
                }
                State::UntilClose if !conn.buf.is_empty() => {
                    let data = conn.buf.split().freeze();
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                _ => {}
            }
            conn.buf.reserve(READ_CHUNK);
            let read = {
                let read = pin!(conn.stream.read_buf(&mut conn.buf));
                read.poll(cx)
            };
            match read {
                Poll::Pending => return Poll::Pending,
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
    use crate::testkit::body::MockBody;

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
            Arc::new(
                Pool::new(
                    &self.uri,
                    Duration::from_secs(2),
                    Duration::from_secs(60),
                    4,
                )
                .unwrap(),
            )
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
            let response = pool.send(get(&format!("/{i}"))).await.unwrap();
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
            let response = pool.send(get("/")).await.unwrap();
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
            text(pool.send(get("/a")).await.unwrap()).await.unwrap(),
            "ok"
        );
        assert_eq!(
            text(pool.send(get("/b")).await.unwrap()).await.unwrap(),
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
            text(pool.send(get("/a")).await.unwrap()).await.unwrap(),
            "ok"
        );
        let post = Request::post("/b")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let e = pool.send(post).await.unwrap_err();
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
            .send(Request::post("/upload").body(body).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), 413);
        assert_eq!(text(response).await.unwrap(), "big");
        // Not reused: the request never went out whole.
        assert!(pool.lock().is_empty());
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
            let response = pool.send(get("/")).await.unwrap();
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
                text(pool.send(get("/")).await.unwrap()).await.unwrap(),
                "ok"
            );
            tokio::time::sleep(Duration::from_millis(60)).await;
            assert_eq!(
                text(pool.send(get("/")).await.unwrap()).await.unwrap(),
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
        let mut body = pool.send(get("/")).await.unwrap().into_body();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&first[..], b"partial");
        drop(body);
        assert!(pool.lock().is_empty());
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
        let response = pool.send(head).await.unwrap();
        assert_eq!(response.headers()["content-length"], "5");
        assert!(response.body().is_end_stream());
        assert_eq!(text(response).await.unwrap(), "");
        assert_eq!(
            pool.lock().len(),
            1,
            "a HEAD answer leaves its connection usable"
        );
        // Use the kept connection once more so that the next ones are new.
        pool.take_idle();
        let response = pool.send(get("/")).await.unwrap();
        assert!(!response.headers().contains_key("transfer-encoding"));
        assert_eq!(text(response).await.unwrap(), "hello");
        let response = pool.send(get("/")).await.unwrap();
        assert_eq!(response.version(), http::Version::HTTP_10);
        assert_eq!(text(response).await.unwrap(), "until close");
        assert!(pool.lock().is_empty());
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
        assert_eq!(text(pool.send(request).await.unwrap()).await.unwrap(), "ok");
        // Length known: Content-Length, the body as it came.
        let request = Request::post("/l")
            .body(Full::new(Bytes::from_static(b"hello")))
            .unwrap();
        assert_eq!(text(pool.send(request).await.unwrap()).await.unwrap(), "ok");
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
            .send(Request::post("/").body(body).unwrap())
            .await
            .unwrap_err();
        assert!(e.is_client_body(), "{e:?}");
    }
}
