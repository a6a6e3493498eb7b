//! The server every mock runs on: an accept loop on `127.0.0.1:0`, one HTTP/1.1
//! connection task per client, and a journal of every request received.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

use super::body::MockBody;

/// Request bodies larger than this are answered 413 and recorded without their body.
pub const MAX_RECORDED_BODY_BYTES: usize = 16 * 1024 * 1024;

/// The journal keeps at most this many requests (the count goes on), so a long
/// load test cannot exhaust memory.
pub const MAX_RECORDED_REQUESTS: usize = 100_000;

/// One request as a mock received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The method.
    pub method: Method,
    /// The request-target exactly as received (origin-form: path and query, with every
    /// percent-escape as sent).
    pub uri: Uri,
    /// The HTTP version.
    pub version: Version,
    /// All request headers, repeated ones included.
    pub headers: HeaderMap,
    /// The whole request body (empty when over [`MAX_RECORDED_BODY_BYTES`]).
    pub body: Bytes,
}

impl Recorded {
    /// The first value of a header, if present and visible ASCII.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Every value of a header, lossily decoded.
    pub fn header_all(&self, name: &str) -> Vec<String> {
        self.headers
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect()
    }

    /// The path part of the request-target, undecoded.
    pub fn path(&self) -> &str {
        self.uri.path()
    }

    /// The query part of the request-target, undecoded.
    pub fn query(&self) -> Option<&str> {
        self.uri.query()
    }

    /// The body, lossily decoded as UTF-8.
    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Every request a server received, and how many connections it accepted.
#[derive(Debug, Default)]
pub(crate) struct Journal {
    requests: Mutex<Vec<Recorded>>,
    total: AtomicUsize,
    connections: AtomicUsize,
}

impl Journal {
    fn push(&self, rec: Recorded) {
        self.total.fetch_add(1, Ordering::SeqCst);
        let mut requests = lock(&self.requests);
        if requests.len() < MAX_RECORDED_REQUESTS {
            requests.push(rec);
        }
    }

    pub(crate) fn requests(&self) -> Vec<Recorded> {
        lock(&self.requests).clone()
    }

    pub(crate) fn count(&self) -> usize {
        self.total.load(Ordering::SeqCst)
    }

    pub(crate) fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    pub(crate) fn clear(&self) {
        let mut requests = lock(&self.requests);
        requests.clear();
        self.total.store(0, Ordering::SeqCst);
    }
}

/// Locks a mutex; a panic in another test thread must not cascade into every mock.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The future a mock's handler returns.
pub(crate) type HandlerFuture = Pin<Box<dyn Future<Output = Response<MockBody>> + Send>>;

/// A mock's request handler; it gets the request already recorded.
pub(crate) type Handler = Arc<dyn Fn(Recorded) -> HandlerFuture + Send + Sync>;

/// A running mock server; dropping it aborts the accept loop, which drops (and so
/// aborts) every connection task.
#[derive(Debug)]
pub(crate) struct Server {
    addr: SocketAddr,
    journal: Arc<Journal>,
    task: JoinHandle<()>,
}

impl Server {
    /// Binds `127.0.0.1:0` and starts serving.
    pub(crate) async fn start(handler: Handler) -> io::Result<Server> {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let addr = listener.local_addr()?;
        let journal = Arc::new(Journal::default());
        let task = tokio::spawn(accept_loop(listener, handler, Arc::clone(&journal)));
        Ok(Server {
            addr,
            journal,
            task,
        })
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub(crate) fn journal(&self) -> &Journal {
        &self.journal
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(listener: TcpListener, handler: Handler, journal: Arc<Journal>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    // Small answers written in pieces (SSE) must not wait for a delayed ACK.
                    let _ = stream.set_nodelay(true);
                    journal.connections.fetch_add(1, Ordering::SeqCst);
                    let handler = Arc::clone(&handler);
                    let journal = Arc::clone(&journal);
                    connections.spawn(async move {
                        let service = service_fn(move |req| {
                            serve(req, Arc::clone(&handler), Arc::clone(&journal))
                        });
                        // A client that goes away mid-request is normal in tests.
                        let _ = http1::Builder::new()
                            .timer(TokioTimer::new())
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
                // Out of descriptors and the like: back off instead of spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn serve(
    req: Request<Incoming>,
    handler: Handler,
    journal: Arc<Journal>,
) -> Result<Response<MockBody>, Infallible> {
    let (parts, body) = req.into_parts();
    let (body, too_large) = match Limited::new(body, MAX_RECORDED_BODY_BYTES).collect().await {
        Ok(collected) => (collected.to_bytes(), false),
        Err(e) => (Bytes::new(), e.downcast_ref::<LengthLimitError>().is_some()),
    };
    let rec = Recorded {
        method: parts.method,
        uri: parts.uri,
        version: parts.version,
        headers: parts.headers,
        body,
    };
    journal.push(rec.clone());
    if too_large {
        return Ok(respond(
            StatusCode::PAYLOAD_TOO_LARGE,
            &[],
            MockBody::empty(),
        ));
    }
    Ok(handler(rec).await)
}

/// A response with a status, headers and body; header pairs that are not valid HTTP are
/// skipped (they only ever come from tests).
pub(crate) fn respond(
    status: StatusCode,
    headers: &[(&str, &str)],
    body: MockBody,
) -> Response<MockBody> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    for (name, value) in headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            resp.headers_mut().append(name, value);
        }
    }
    resp
}

/// A JSON answer.
pub(crate) fn json(status: StatusCode, body: impl Into<Bytes>) -> Response<MockBody> {
    respond(
        status,
        &[(CONTENT_TYPE.as_str(), "application/json")],
        MockBody::full(body),
    )
}

/// A status from a number; unusable codes become 500 so a bad test knob is visible.
pub(crate) fn status_from(code: u16) -> StatusCode {
    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// Percent-decodes a URI component strictly: `None` for a malformed escape or bytes
/// that are not UTF-8. `+` stays a `+` (this is a path, not a form).
pub(crate) fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The value of `key` in a query string (first occurrence, percent-decoded).
pub(crate) fn query_param(query: Option<&str>, key: &str) -> Option<String> {
    query?
        .split('&')
        .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| percent_decode(v))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;

    #[test]
    fn percent_decode_is_strict() {
        assert_eq!(
            percent_decode("inbox%2Fhello%20world.md").as_deref(),
            Some("inbox/hello world.md")
        );
        assert_eq!(percent_decode("a+b").as_deref(), Some("a+b"));
        assert_eq!(percent_decode("%e2%82%ac").as_deref(), Some("€"));
        assert_eq!(percent_decode("%"), None);
        assert_eq!(percent_decode("%2"), None);
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%ff"), None);
    }

    #[test]
    fn query_param_takes_the_first() {
        assert_eq!(
            query_param(Some("n=3&gap_ms=5&n=9"), "n").as_deref(),
            Some("3")
        );
        assert_eq!(query_param(Some("flag"), "flag").as_deref(), Some(""));
        assert_eq!(query_param(Some("a=1"), "b"), None);
        assert_eq!(query_param(None, "a"), None);
    }
}
