//! A scripted keep-alive HTTP/1.1 upstream on loopback, plain or behind TLS, for the
//! hostile-upstream tests; and a keep-alive HTTP/1.1 client for the callers in front of
//! the sidecar.
//!
//! The upstream reads request after request on each connection it accepts and asks its
//! handler for each answer: what to write at once, and what to write after it, either at
//! once too or late. Late means deterministically after the next request: the upstream
//! keeps the bytes until it has read the next request on the same connection, then writes
//! them and that request's own answer in one write, as an upstream does whose answer the
//! sidecar framed shorter than it was. Every request is recorded with its connection and
//! the tag the handler gave it (the caller it came from), so a test can tell which
//! callers shared an upstream connection.
// Each test file uses its own part of this module.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinHandle};

/// Largest request head or body the upstream reads.
const MAX_REQUEST_BYTES: usize = 1024 * 1024;

/// A request as the upstream read it.
#[derive(Debug, Clone)]
pub struct Request {
    /// The connection it came on (numbered from 0 in accept order).
    pub conn: usize,
    pub method: String,
    pub target: String,
    /// Names lowercased, in order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What the upstream does with one request.
#[derive(Debug, Clone, Default)]
pub struct Answer {
    /// The caller the request came from, when it is one the test follows.
    pub tag: Option<String>,
    /// Written at once.
    pub now: Vec<u8>,
    /// Written after `now`: at once in the same write, or, when `late`, only once the
    /// next request on this connection has been read.
    pub rest: Vec<u8>,
    pub late: bool,
    /// Waited before writing (to hold several requests at once).
    pub delay: Duration,
}

impl Answer {
    /// `bytes` at once, nothing after.
    pub fn plain(tag: Option<String>, bytes: Vec<u8>) -> Answer {
        Answer {
            tag,
            now: bytes,
            ..Answer::default()
        }
    }
}

/// Answers one request.
pub type Handler = Arc<dyn Fn(&Request) -> Answer + Send + Sync>;

/// One request the upstream read, as recorded.
#[derive(Debug, Clone)]
pub struct Record {
    pub conn: usize,
    pub tag: Option<String>,
}

#[derive(Default)]
struct Conns {
    /// Open connections: their task, and whether a tagged request came on them.
    open: HashMap<usize, (AbortHandle, bool)>,
}

struct State {
    handler: Handler,
    records: Mutex<Vec<Record>>,
    conns: Mutex<Conns>,
    next_conn: AtomicUsize,
    /// Late bytes written (each after the next request on their connection).
    delivered: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The scripted upstream; dropping it closes every connection.
pub struct Upstream {
    pub addr: SocketAddr,
    tls: bool,
    state: Arc<State>,
    task: JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
        for (task, _) in lock(&self.state.conns).open.values() {
            task.abort();
        }
    }
}

/// The test certificate and key (`tests/fixtures/tls`: `localhost` and `127.0.0.1`).
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tls")
        .join(name)
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

impl Upstream {
    /// Starts on `127.0.0.1:0`; behind TLS with the test certificate (ALPN `http/1.1`
    /// only) when `tls`.
    pub async fn start(tls: bool, handler: Handler) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let acceptor = tls.then(|| {
            let mut config = knowtation_sidecar::proxy::tls_server_config(
                &fixture("localhost.crt"),
                &fixture("localhost.key"),
            )
            .expect("test certificate");
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            tokio_rustls::TlsAcceptor::from(Arc::new(config))
        });
        let state = Arc::new(State {
            handler,
            records: Mutex::new(Vec::new()),
            conns: Mutex::new(Conns::default()),
            next_conn: AtomicUsize::new(0),
            delivered: AtomicUsize::new(0),
        });
        let shared = Arc::clone(&state);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let conn = shared.next_conn.fetch_add(1, Ordering::SeqCst);
                let state = Arc::clone(&shared);
                let acceptor = acceptor.clone();
                // Registered before the task can end, so that its guard always finds it.
                let mut conns = lock(&shared.conns);
                // Moved into the task, so dropped however it ends, even unpolled.
                let guard = Closed(Arc::clone(&state), conn);
                let handle = tokio::spawn(async move {
                    let _guard = guard;
                    let stream: Box<dyn Io> = match acceptor {
                        Some(acceptor) => match acceptor.accept(stream).await {
                            Ok(s) => Box::new(s),
                            Err(_) => return,
                        },
                        None => Box::new(stream),
                    };
                    serve(stream, conn, &state).await;
                });
                conns.open.insert(conn, (handle.abort_handle(), false));
            }
        });
        Upstream {
            addr,
            tls,
            state,
            task,
        }
    }

    /// `http://127.0.0.1:<port>` or `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Every request read so far, in order.
    pub fn records(&self) -> Vec<Record> {
        lock(&self.state.records).clone()
    }

    /// How many late pieces were written so far.
    pub fn delivered(&self) -> usize {
        self.state.delivered.load(Ordering::SeqCst)
    }

    /// Whether connection `conn` is still open at this end (the peer has not closed it).
    pub fn is_open(&self, conn: usize) -> bool {
        lock(&self.state.conns).open.contains_key(&conn)
    }

    /// Open connections that carried a tagged request.
    pub fn open_tagged(&self) -> usize {
        lock(&self.state.conns)
            .open
            .values()
            .filter(|(_, tagged)| *tagged)
            .count()
    }

    /// Closes every connection that carried a tagged request (the probe's are kept), and
    /// waits until they are gone.
    pub async fn close_tagged(&self) {
        for (task, tagged) in lock(&self.state.conns).open.values() {
            if *tagged {
                task.abort();
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.open_tagged() > 0 {
            assert!(Instant::now() < deadline, "connections did not close");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Marks a connection closed however its task ends.
struct Closed(Arc<State>, usize);

impl Drop for Closed {
    fn drop(&mut self) {
        lock(&self.0.conns).open.remove(&self.1);
    }
}

async fn serve(mut stream: Box<dyn Io>, conn: usize, state: &State) {
    let mut buf = Vec::new();
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let Some(request) = read_request(&mut stream, &mut buf, conn).await else {
            return;
        };
        let answer = (state.handler)(&request);
        if !answer.delay.is_zero() {
            tokio::time::sleep(answer.delay).await;
        }
        if answer.tag.is_some() {
            if let Some(entry) = lock(&state.conns).open.get_mut(&conn) {
                entry.1 = true;
            }
        }
        lock(&state.records).push(Record {
            conn,
            tag: answer.tag.clone(),
        });
        // What was held back goes first, in the same write as this request's answer.
        let mut out = std::mem::take(&mut pending);
        if !out.is_empty() {
            state.delivered.fetch_add(1, Ordering::SeqCst);
        }
        out.extend_from_slice(&answer.now);
        if answer.late {
            pending = answer.rest;
        } else {
            out.extend_from_slice(&answer.rest);
        }
        if stream.write_all(&out).await.is_err() || stream.flush().await.is_err() {
            return;
        }
    }
}

/// Reads one request (head, and a body announced by `Content-Length`); `None` once the
/// peer closes or sends what is not a request.
async fn read_request(stream: &mut Box<dyn Io>, buf: &mut Vec<u8>, conn: usize) -> Option<Request> {
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let mut slots = [httparse::EMPTY_HEADER; 128];
        let mut req = httparse::Request::new(&mut slots);
        if let httparse::Status::Complete(len) = req.parse(buf).ok()? {
            let method = req.method?.to_owned();
            let target = req.path?.to_owned();
            let headers: Vec<(String, String)> = req
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_ascii_lowercase(),
                        String::from_utf8_lossy(h.value).into_owned(),
                    )
                })
                .collect();
            let body_len = headers
                .iter()
                .find(|(k, _)| k == "content-length")
                .and_then(|(_, v)| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            while buf.len() < len + body_len {
                let n = stream.read(&mut chunk).await.ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            let body = buf[len..len + body_len].to_vec();
            buf.drain(..len + body_len);
            return Some(Request {
                conn,
                method,
                target,
                headers,
                body,
            });
        }
        if buf.len() > MAX_REQUEST_BYTES {
            return None;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

// ---------------------------------------------------------------------------------------
// The callers' side.

/// One answer as a caller got it.
#[derive(Debug, Clone, Default)]
pub struct Reply {
    /// 0 when no complete head came.
    pub status: u16,
    /// Names lowercased, in order.
    pub headers: Vec<(String, String)>,
    /// De-chunked.
    pub body: Vec<u8>,
    /// Whether the body ended as its framing says.
    pub complete: bool,
    /// Every byte received for this answer, head included.
    pub raw: Vec<u8>,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Head and body as received, lossily decoded (for messages).
    pub fn all_text(&self) -> String {
        String::from_utf8_lossy(&self.raw).into_owned()
    }
}

/// An HTTP/1.1 client connection to the sidecar, kept open between requests (opened
/// again when the sidecar closed it).
pub struct Client {
    addr: SocketAddr,
    stream: Option<TcpStream>,
    buf: Vec<u8>,
}

/// An answer that takes this long has hung.
const HUNG: Duration = Duration::from_secs(5);

impl Client {
    pub fn new(addr: SocketAddr) -> Client {
        Client {
            addr,
            stream: None,
            buf: Vec::new(),
        }
    }

    /// Sends `request` (a whole HTTP/1.1 request) and reads one answer; `head` when the
    /// request was a `HEAD`.
    pub async fn send(&mut self, request: &[u8], head: bool) -> Reply {
        if self.stream.is_none() {
            let s = TcpStream::connect(self.addr).await.expect("connect");
            s.set_nodelay(true).expect("nodelay");
            self.stream = Some(s);
            self.buf.clear();
        }
        let mut reply = Reply::default();
        let written = match self.stream.as_mut() {
            Some(s) => s.write_all(request).await.is_ok(),
            None => false,
        };
        if written {
            match tokio::time::timeout(HUNG, self.read_reply(head, &mut reply)).await {
                Ok(true) => {}
                // Broken off or hung: this connection is done.
                Ok(false) | Err(_) => self.stream = None,
            }
        } else {
            self.stream = None;
        }
        if reply
            .header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
        {
            self.stream = None;
        }
        reply
    }

    /// Reads one answer into `reply`; false when the connection broke off first.
    async fn read_reply(&mut self, head: bool, reply: &mut Reply) -> bool {
        let Some(stream) = self.stream.as_mut() else {
            return false;
        };
        let mut chunk = [0u8; 16 * 1024];
        // The head.
        let (status, headers, head_len) = loop {
            let mut slots = [httparse::EMPTY_HEADER; 128];
            let mut resp = httparse::Response::new(&mut slots);
            match resp.parse(&self.buf) {
                Ok(httparse::Status::Complete(len)) => {
                    let status = resp.code.unwrap_or(0);
                    let headers: Vec<(String, String)> = resp
                        .headers
                        .iter()
                        .map(|h| {
                            (
                                h.name.to_ascii_lowercase(),
                                String::from_utf8_lossy(h.value).into_owned(),
                            )
                        })
                        .collect();
                    if (100..200).contains(&status) {
                        reply.raw.extend(self.buf.drain(..len));
                        continue;
                    }
                    break (status, headers, len);
                }
                Ok(httparse::Status::Partial) => {}
                Err(_) => {
                    reply.raw.append(&mut self.buf);
                    return false;
                }
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => {
                    reply.raw.append(&mut self.buf);
                    return false;
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        };
        reply.status = status;
        reply.headers = headers;
        reply.raw.extend(self.buf.drain(..head_len));
        let header = |name: &str| {
            reply
                .headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let chunked =
            header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
        let length = match header("content-length") {
            // A list of one value repeated is read as that value, as a lenient client
            // reads it; any other is no framing this client can follow.
            Some(v) => match content_length(&v) {
                Some(n) => Some(n),
                None => return false,
            },
            None => None,
        };
        if head || status == 204 || status == 304 {
            reply.complete = true;
            return true;
        }
        loop {
            if chunked {
                if let Some((body, used)) = dechunk(&self.buf) {
                    reply.body = body;
                    reply.raw.extend(self.buf.drain(..used));
                    reply.complete = true;
                    return true;
                }
            } else if let Some(n) = length {
                if self.buf.len() >= n {
                    reply.body = self.buf[..n].to_vec();
                    reply.raw.extend(self.buf.drain(..n));
                    reply.complete = true;
                    return true;
                }
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => {
                    // A body delimited by the close is complete at a clean close only.
                    let clean = !chunked && length.is_none();
                    reply.body = if chunked {
                        dechunk_partial(&self.buf)
                    } else {
                        self.buf.clone()
                    };
                    reply.raw.append(&mut self.buf);
                    reply.complete = clean;
                    return false;
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }
}

/// A `Content-Length` value: one number, or a list of that number repeated.
fn content_length(value: &str) -> Option<usize> {
    let mut values = value.split(',').map(|v| v.trim().parse::<usize>().ok());
    let first = values.next()??;
    values.all(|v| v == Some(first)).then_some(first)
}

/// A whole chunked body at the front of `raw` and the bytes it took (trailers skipped);
/// `None` while it is incomplete.
fn dechunk(raw: &[u8]) -> Option<(Vec<u8>, usize)> {
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let line_end = at + raw[at..].windows(2).position(|w| w == b"\r\n")?;
        let size_text = String::from_utf8_lossy(&raw[at..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        at = line_end + 2;
        if size == 0 {
            // Trailers, up to the empty line.
            loop {
                let end = at + raw[at..].windows(2).position(|w| w == b"\r\n")?;
                let empty = end == at;
                at = end + 2;
                if empty {
                    return Some((body, at));
                }
            }
        }
        if raw.len() < at + size + 2 {
            return None;
        }
        body.extend_from_slice(&raw[at..at + size]);
        at += size + 2;
    }
}

/// What data a broken-off chunked body carried.
fn dechunk_partial(raw: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    let mut at = 0;
    while let Some(pos) = raw[at..].windows(2).position(|w| w == b"\r\n") {
        let line_end = at + pos;
        let Ok(size) = usize::from_str_radix(
            String::from_utf8_lossy(&raw[at..line_end])
                .split(';')
                .next()
                .unwrap_or("")
                .trim(),
            16,
        ) else {
            break;
        };
        at = line_end + 2;
        let end = (at + size).min(raw.len());
        body.extend_from_slice(&raw[at..end]);
        if size == 0 || end < at + size {
            break;
        }
        at = (end + 2).min(raw.len());
    }
    body
}
