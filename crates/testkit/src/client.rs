//! A small HTTP/1.1 client for tests: one fresh connection per request, everything
//! under a timeout, so a misbehaving server fails a test instead of hanging it.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::header::HOST;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Default time allowed for a whole exchange.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest response body [`send`] collects.
pub const MAX_RESPONSE_BYTES: usize = 512 * 1024 * 1024;

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The URL is not `http://host:port/...`.
    #[error("unusable URL")]
    Url,
    /// Connecting or I/O failed.
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    /// The HTTP exchange failed.
    #[error("http: {0}")]
    Http(#[from] hyper::Error),
    /// Building the request failed.
    #[error("request: {0}")]
    Request(#[from] http::Error),
    /// The body was larger than [`MAX_RESPONSE_BYTES`] or broke off.
    #[error("response body unreadable")]
    Body,
    /// The exchange took longer than allowed.
    #[error("timed out")]
    Timeout,
}

/// A whole response.
#[derive(Debug, Clone)]
pub struct Collected {
    /// The status.
    pub status: StatusCode,
    /// The version.
    pub version: Version,
    /// The headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl Collected {
    /// The first value of a header, if present and visible ASCII.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The body, lossily decoded as UTF-8.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body parsed as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// Builds a request for `url` (`http://host:port/path?query`) with a `Host` header.
pub fn request(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Result<(SocketAddr, Request<Full<Bytes>>), ClientError> {
    let uri: Uri = url.parse().map_err(|_| ClientError::Url)?;
    let authority = uri.authority().ok_or(ClientError::Url)?;
    let addr: SocketAddr = authority.as_str().parse().map_err(|_| ClientError::Url)?;
    let target = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut builder = Request::builder().method(method).uri(target).header(
        HOST,
        HeaderValue::from_str(authority.as_str()).map_err(|_| ClientError::Url)?,
    );
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    Ok((addr, builder.body(Full::new(body.into()))?))
}

/// Sends one request on a fresh connection and collects the answer, within
/// [`DEFAULT_TIMEOUT`].
pub async fn send(addr: SocketAddr, req: Request<Full<Bytes>>) -> Result<Collected, ClientError> {
    send_within(DEFAULT_TIMEOUT, addr, req).await
}

/// Sends one request on a fresh connection and collects the answer within `timeout`.
pub async fn send_within(
    timeout: Duration,
    addr: SocketAddr,
    req: Request<Full<Bytes>>,
) -> Result<Collected, ClientError> {
    let exchange = async {
        let resp = open(addr, req).await?;
        let (parts, body) = resp.into_parts();
        let body = http_body_util::Limited::new(body, MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|_| ClientError::Body)?
            .to_bytes();
        Ok(Collected {
            status: parts.status,
            version: parts.version,
            headers: parts.headers,
            body,
        })
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| ClientError::Timeout)?
}

/// `GET url` with extra headers.
pub async fn get(url: &str, headers: &[(&str, &str)]) -> Result<Collected, ClientError> {
    let (addr, req) = request(Method::GET, url, headers, Bytes::new())?;
    send(addr, req).await
}

/// Sends one request on a fresh connection and returns as soon as the response head
/// arrives, for reading a streamed body frame by frame. The head must arrive within
/// [`DEFAULT_TIMEOUT`]; reading the body is up to the caller.
pub async fn open(
    addr: SocketAddr,
    req: Request<Full<Bytes>>,
) -> Result<Response<Incoming>, ClientError> {
    let head = async {
        let stream = TcpStream::connect(addr).await?;
        let (mut sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
        // The connection task ends when the response body is done or dropped.
        tokio::spawn(conn);
        Ok::<_, ClientError>(sender.send_request(req).await?)
    };
    tokio::time::timeout(DEFAULT_TIMEOUT, head)
        .await
        .map_err(|_| ClientError::Timeout)?
}

/// Writes raw bytes to `addr` and reads until the server closes the connection or
/// `timeout` passes (then returns what arrived): for wire-level checks such as framing
/// headers. Send `Connection: close` to get a prompt close.
pub async fn raw_exchange(
    addr: SocketAddr,
    request: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>, ClientError> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.write_all(request).await?;
    let mut out = Vec::new();
    let read = async {
        let mut buf = [0u8; 16 * 1024];
        loop {
            let n = stream.read(&mut buf).await?;
            if n == 0 || out.len() + n > MAX_RESPONSE_BYTES {
                return Ok::<_, io::Error>(());
            }
            out.extend_from_slice(&buf[..n]);
        }
    };
    // On timeout, hand back what arrived.
    if let Ok(result) = tokio::time::timeout(timeout, read).await {
        result?;
    }
    Ok(out)
}
