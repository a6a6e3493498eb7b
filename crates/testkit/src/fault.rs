//! A raw-TCP upstream that misbehaves on purpose: the faults the hyper-based mocks cannot
//! produce (a reset in the middle of an answer, a head that never ends, bytes dripping
//! one at a time, an HTTP/1.0 answer, repeated framing headers, an answer without end).
//!
//! Each connection carries one request. The server reads the request head (and a body
//! announced by `Content-Length`, or a chunked one up to its last chunk), records it,
//! then plays the [`Script`] of the first rule whose needle occurs in the request bytes
//! (ASCII case-insensitive), or the default script. A script is a list of [`Act`]s:
//! bytes written at once or dripped, pauses, holding the connection open until the peer
//! goes, an endless body, an abortive close. After the last act the connection is closed
//! gracefully (unless it was reset). [`Script::respond`] builds an ordinary answer that
//! says `Connection: close`, so the peer never pools a connection the server will drop.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use knowtation_mock_upstream::lock;

/// Largest request head read; a longer one is recorded as it is and answered anyway.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// Largest request body read (and recorded).
const MAX_BODY_BYTES: usize = 1024 * 1024;

/// Time allowed for a request to arrive before the script plays anyway.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// An endless body stops after this many bytes, so a test that forgets to hang up
/// cannot run for ever.
const MAX_ENDLESS_BYTES: usize = 1024 * 1024 * 1024;

/// The recorded requests kept (the count goes on).
const MAX_RECORDED: usize = 10_000;

/// One step of a [`Script`].
#[derive(Debug, Clone)]
pub enum Act {
    /// Write these bytes at once.
    Write(Bytes),
    /// Write these bytes one at a time, `gap` apart.
    Drip {
        /// The bytes.
        bytes: Bytes,
        /// The pause before each byte.
        gap: Duration,
    },
    /// Wait this long.
    Pause(Duration),
    /// Keep the connection open, sending nothing, until the peer closes it.
    Hold,
    /// Write this chunk again and again until the peer stops reading (or 1 GiB).
    Endless(Bytes),
    /// Close abortively: `SO_LINGER` 0, so the peer gets a TCP reset.
    Reset,
}

/// What the server does once it has read a request.
#[derive(Debug, Clone, Default)]
pub struct Script(Vec<Act>);

impl Script {
    /// An empty script: the connection is closed without an answer.
    pub fn new() -> Script {
        Script(Vec::new())
    }

    /// An ordinary HTTP/1.1 answer: the status line, `headers` in order, then
    /// `Content-Length` and `Connection: close`, then `body`.
    pub fn respond(status: u16, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Script {
        let body = body.into();
        let mut all: Vec<(&str, String)> =
            headers.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        all.push(("Content-Length", body.len().to_string()));
        all.push(("Connection", "close".to_owned()));
        let mut out = status_line("HTTP/1.1", status).into_bytes();
        for (k, v) in &all {
            out.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&body);
        Script::new().write(out)
    }

    /// Adds an [`Act::Write`].
    pub fn write(mut self, bytes: impl Into<Bytes>) -> Script {
        self.0.push(Act::Write(bytes.into()));
        self
    }

    /// Adds an [`Act::Drip`].
    pub fn drip(mut self, bytes: impl Into<Bytes>, gap: Duration) -> Script {
        self.0.push(Act::Drip {
            bytes: bytes.into(),
            gap,
        });
        self
    }

    /// Adds an [`Act::Pause`].
    pub fn pause(mut self, pause: Duration) -> Script {
        self.0.push(Act::Pause(pause));
        self
    }

    /// Adds an [`Act::Hold`].
    pub fn hold(mut self) -> Script {
        self.0.push(Act::Hold);
        self
    }

    /// Adds an [`Act::Endless`].
    pub fn endless(mut self, chunk: impl Into<Bytes>) -> Script {
        self.0.push(Act::Endless(chunk.into()));
        self
    }

    /// Adds an [`Act::Reset`].
    pub fn reset(mut self) -> Script {
        self.0.push(Act::Reset);
        self
    }

    /// The acts, in order.
    pub fn acts(&self) -> &[Act] {
        &self.0
    }
}

/// `HTTP/1.1 200 OK\r\n` and the like (the reason phrase is the canonical one, if any).
pub fn status_line(version: &str, status: u16) -> String {
    let reason = http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Status");
    format!("{version} {status} {reason}\r\n")
}

/// A response head written exactly as given: the status line, each header line in
/// order (repeats included, nothing added), the blank line.
pub fn raw_head(version: &str, status: u16, headers: &[(&str, &str)]) -> Bytes {
    let mut out = status_line(version, status);
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    Bytes::from(out)
}

#[derive(Debug, Default)]
struct State {
    rules: Mutex<Vec<(Vec<u8>, Script)>>,
    default: Mutex<Script>,
    recorded: Mutex<Vec<String>>,
    requests: AtomicUsize,
    open: AtomicUsize,
    peer_gone: AtomicUsize,
}

/// A misbehaving upstream on `127.0.0.1:0`; dropping it closes every connection.
#[derive(Debug)]
pub struct FaultServer {
    addr: SocketAddr,
    state: Arc<State>,
    task: JoinHandle<()>,
}

impl Drop for FaultServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Keeps [`FaultServer::open_connections`] right however a connection task ends.
struct OpenGuard(Arc<State>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

impl FaultServer {
    /// Starts a server playing `default` for every request no rule matches.
    ///
    /// # Panics
    /// If no loopback port can be bound; use [`FaultServer::try_start`] to handle that.
    pub async fn start(default: Script) -> FaultServer {
        match FaultServer::try_start(default).await {
            Ok(s) => s,
            Err(e) => panic!("fault server: cannot bind 127.0.0.1:0: {e}"),
        }
    }

    /// Starts a server playing `default` for every request no rule matches.
    pub async fn try_start(default: Script) -> io::Result<FaultServer> {
        FaultServer::try_start_on(SocketAddr::from(([127, 0, 0, 1], 0)), default).await
    }

    /// Starts a server on `addr` (an upstream that comes back on the port it had).
    pub async fn try_start_on(addr: SocketAddr, default: Script) -> io::Result<FaultServer> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            default: Mutex::new(default),
            ..State::default()
        });
        let task = tokio::spawn(accept_loop(listener, Arc::clone(&state)));
        Ok(FaultServer { addr, state, task })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`, no trailing slash.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Plays `script` for requests whose bytes contain `needle` (ASCII case-insensitive);
    /// rules are tried in the order they were added.
    pub fn on(&self, needle: &str, script: Script) {
        lock(&self.state.rules).push((needle.to_ascii_lowercase().into_bytes(), script));
    }

    /// Replaces the default script.
    pub fn set_default(&self, script: Script) {
        *lock(&self.state.default) = script;
    }

    /// How many requests were read.
    pub fn count(&self) -> usize {
        self.state.requests.load(Ordering::SeqCst)
    }

    /// How many recorded requests contain `needle` (ASCII case-insensitive).
    pub fn count_matching(&self, needle: &str) -> usize {
        let needle = needle.to_ascii_lowercase();
        lock(&self.state.recorded)
            .iter()
            .filter(|r| r.to_ascii_lowercase().contains(&needle))
            .count()
    }

    /// The requests read so far (head and body, lossily decoded).
    pub fn requests(&self) -> Vec<String> {
        lock(&self.state.recorded).clone()
    }

    /// Connections open right now.
    pub fn open_connections(&self) -> usize {
        self.state.open.load(Ordering::SeqCst)
    }

    /// Scripts cut short because the peer closed the connection or stopped reading.
    pub fn peer_gone(&self) -> usize {
        self.state.peer_gone.load(Ordering::SeqCst)
    }
}

async fn accept_loop(listener: TcpListener, state: Arc<State>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    state.open.fetch_add(1, Ordering::SeqCst);
                    let guard = OpenGuard(Arc::clone(&state));
                    connections.spawn(serve(stream, Arc::clone(&state), guard));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn serve(mut stream: TcpStream, state: Arc<State>, _open: OpenGuard) {
    let Ok(Ok(request)) = tokio::time::timeout(REQUEST_TIMEOUT, read_request(&mut stream)).await
    else {
        return;
    };
    if request.is_empty() {
        return;
    }
    state.requests.fetch_add(1, Ordering::SeqCst);
    let text = String::from_utf8_lossy(&request).into_owned();
    {
        let mut recorded = lock(&state.recorded);
        if recorded.len() < MAX_RECORDED {
            recorded.push(text);
        }
    }
    let lowered = request.to_ascii_lowercase();
    let script = lock(&state.rules)
        .iter()
        .find(|(needle, _)| contains(&lowered, needle))
        .map(|(_, s)| s.clone())
        .unwrap_or_else(|| lock(&state.default).clone());
    match play(&mut stream, &script).await {
        Ok(Ending::Reset) => {
            // SO_LINGER 0: dropping the socket sends a reset instead of a FIN.
            let _ = stream.set_zero_linger();
        }
        Ok(Ending::Close) => {
            let _ = stream.shutdown().await;
        }
        Err(_) => {
            state.peer_gone.fetch_add(1, Ordering::SeqCst);
        }
    }
}

enum Ending {
    Close,
    Reset,
}

async fn play(stream: &mut TcpStream, script: &Script) -> io::Result<Ending> {
    for act in script.acts() {
        match act {
            Act::Write(bytes) => stream.write_all(bytes).await?,
            Act::Drip { bytes, gap } => {
                for b in bytes.iter() {
                    tokio::time::sleep(*gap).await;
                    stream.write_all(&[*b]).await?;
                    stream.flush().await?;
                }
            }
            Act::Pause(d) => tokio::time::sleep(*d).await,
            Act::Hold => {
                let mut buf = [0u8; 1024];
                loop {
                    if stream.read(&mut buf).await? == 0 {
                        // The peer hung up: nothing more can be sent.
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                }
            }
            Act::Endless(chunk) => {
                if chunk.is_empty() {
                    continue;
                }
                let mut sent = 0;
                while sent < MAX_ENDLESS_BYTES {
                    stream.write_all(chunk).await?;
                    sent += chunk.len();
                }
            }
            Act::Reset => return Ok(Ending::Reset),
        }
    }
    Ok(Ending::Close)
}

/// Reads one request: the head, then a `Content-Length` body or a chunked one up to its
/// last chunk (both bounded). Returns the bytes read (empty when the peer sent nothing).
async fn read_request(stream: &mut TcpStream) -> io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 16 * 1024];
    let head_end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() >= MAX_HEAD_BYTES {
            return Ok(buf);
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(buf);
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = buf[..head_end].to_ascii_lowercase();
    let length = header_value(&head, b"content-length")
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.trim().parse::<usize>().ok());
    let chunked = header_value(&head, b"transfer-encoding")
        .is_some_and(|v| contains(&v.to_ascii_lowercase(), b"chunked"));
    loop {
        let body = &buf[head_end..];
        let done = match (length, chunked) {
            (_, true) => body.ends_with(b"0\r\n\r\n"),
            (Some(n), false) => body.len() >= n,
            (None, false) => true,
        };
        if done || body.len() >= MAX_BODY_BYTES {
            return Ok(buf);
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(buf);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The value of the first header `name` (lowercase) in a lowercased head.
fn header_value<'a>(head: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    head.split(|b| *b == b'\n').skip(1).find_map(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let colon = line.iter().position(|b| *b == b':')?;
        (line[..colon].trim_ascii() == name).then(|| line[colon + 1..].trim_ascii())
    })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || haystack.len() < needle.len() {
        return None;
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || find(haystack, needle).is_some()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn heads_are_written_as_given() {
        let head = raw_head(
            "HTTP/1.0",
            200,
            &[("Content-Length", "1"), ("content-length", "2")],
        );
        assert_eq!(
            &head[..],
            b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\ncontent-length: 2\r\n\r\n"
        );
        let script = Script::respond(502, &[("X-A", "b")], "hi");
        let Act::Write(bytes) = &script.acts()[0] else {
            panic!("a write");
        };
        assert_eq!(
            &bytes[..],
            b"HTTP/1.1 502 Bad Gateway\r\nX-A: b\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi"
        );
    }

    #[test]
    fn header_lookup_reads_the_first_value() {
        let head = b"get / http/1.1\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n";
        assert_eq!(header_value(head, b"content-length"), Some(&b"5"[..]));
        assert_eq!(header_value(head, b"transfer-encoding"), None);
    }

    #[tokio::test]
    async fn rules_pick_the_script_and_requests_are_recorded() {
        let server = FaultServer::start(Script::respond(200, &[], "default")).await;
        server.on("/special", Script::respond(418, &[], "rule"));
        let exchange = |path: &'static str| {
            let addr = server.addr();
            async move {
                let mut s = TcpStream::connect(addr).await.unwrap();
                s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                    .await
                    .unwrap();
                let mut out = Vec::new();
                s.read_to_end(&mut out).await.unwrap();
                String::from_utf8(out).unwrap()
            }
        };
        assert!(exchange("/SPECIAL/x").await.ends_with("rule"));
        assert!(exchange("/other").await.ends_with("default"));
        assert_eq!(server.count(), 2);
        assert_eq!(server.count_matching("/special"), 1);
    }
}
