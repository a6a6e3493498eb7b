//! The daemon over real sockets: passthrough transparency (wire contract §7), the error
//! answers, the request-phase bounds, the admin listener and graceful shutdown. A small
//! echo gateway lives in this file.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use knowtation_sidecar::budget::Refusal;
use knowtation_sidecar::config::Config;
use knowtation_sidecar::proxy::{self, Running};
use knowtation_sidecar::telemetry::{
    eviction_labels, outcome_labels, view_labels, HeadRefusal, Reload, Sanitized, Shadow, StoreOp,
    TokenCheck, TokenRefusal, UpstreamName, STATUS_CLASSES,
};
use knowtation_sidecar::upstream::{self, Fault};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

#[path = "support/sidecar.rs"]
mod support;

// ----------------------------------------------------------------------------------
// The echo gateway.

const BIG: usize = 8 * 1024 * 1024;

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100000001b3)
    })
}

#[derive(Clone, Default)]
struct GatewayState {
    requests: Arc<AtomicUsize>,
    sse_release: Arc<Notify>,
    sse_finished: Arc<AtomicBool>,
}

struct Gateway {
    addr: SocketAddr,
    state: GatewayState,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Gateway {
    async fn start() -> Gateway {
        Gateway::on(TcpListener::bind("127.0.0.1:0").await.unwrap()).await
    }

    async fn on(listener: TcpListener) -> Gateway {
        Gateway::serve(listener, None).await
    }

    /// The gateway behind TLS with the test certificate (ALPN h2 and http/1.1).
    async fn start_tls() -> Gateway {
        let tls =
            proxy::tls_server_config(&fixture("localhost.crt"), &fixture("localhost.key")).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Gateway::serve(
            listener,
            Some(tokio_rustls::TlsAcceptor::from(Arc::new(tls))),
        )
        .await
    }

    async fn serve(listener: TcpListener, tls: Option<tokio_rustls::TlsAcceptor>) -> Gateway {
        let addr = listener.local_addr().unwrap();
        let state = GatewayState::default();
        let shared = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = shared.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(gateway_answer(state, req).await) }
                    });
                    let builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    match tls {
                        Some(acceptor) => {
                            let Ok(stream) = acceptor.accept(stream).await else {
                                return;
                            };
                            let _ = builder
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        }
                        None => {
                            let _ = builder
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        }
                    }
                });
            }
        });
        Gateway { addr, state, task }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn count(&self) -> usize {
        self.state.requests.load(Ordering::SeqCst)
    }
}

type GwBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

fn full(b: impl Into<Bytes>) -> GwBody {
    Full::new(b.into()).boxed()
}

/// A body fed by a task, of unknown length unless a header says otherwise.
struct ChanBody(tokio::sync::mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChanBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

fn channel() -> (tokio::sync::mpsc::Sender<Bytes>, GwBody) {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    (tx, ChanBody(rx).boxed())
}

async fn gateway_answer(state: GatewayState, req: Request<Incoming>) -> Response<GwBody> {
    // `/` is the sidecar's readiness probe; tests count only their own requests.
    if req.uri().path() != "/" {
        state.requests.fetch_add(1, Ordering::SeqCst);
    }
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let mut resp = Response::new(full(""));
    if path == "/hop" {
        let h = resp.headers_mut();
        h.insert("connection", "x-resp-hop".parse().unwrap());
        h.insert("x-resp-hop", "1".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("proxy-authenticate", "Basic".parse().unwrap());
        h.insert("trailer", "x-t".parse().unwrap());
        h.insert("upgrade", "foo/1".parse().unwrap());
        h.insert("x-kept", "1".parse().unwrap());
        *resp.body_mut() = full("hop");
    } else if path == "/chunked" {
        let (tx, body) = channel();
        tokio::spawn(async move {
            for part in ["alpha-", "beta-", "gamma"] {
                let _ = tx.send(Bytes::from(part)).await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        *resp.body_mut() = body;
    } else if path == "/head" {
        *resp.body_mut() = full("hello");
    } else if let Some(code) = path.strip_prefix("/status/") {
        *resp.status_mut() = StatusCode::from_u16(code.parse().unwrap()).unwrap();
        resp.headers_mut().insert("etag", "\"v1\"".parse().unwrap());
    } else if path == "/big" {
        let (tx, body) = channel();
        tokio::spawn(async move {
            let data = Bytes::from(pattern(BIG));
            let mut at = 0;
            while at < BIG {
                let end = (at + 64 * 1024).min(BIG);
                if tx.send(data.slice(at..end)).await.is_err() {
                    return;
                }
                at = end;
            }
        });
        resp.headers_mut()
            .insert("content-length", BIG.to_string().parse().unwrap());
        *resp.body_mut() = body;
    } else if path == "/sse" || path == "/mcp" {
        let (tx, body) = channel();
        let release = Arc::clone(&state.sse_release);
        let finished = Arc::clone(&state.sse_finished);
        // On `/mcp` the messages are JSON-RPC, as the SDK writes them: the sidecar reads
        // that stream, and cuts one whose messages are not JSON.
        let (one, two) = if path == "/mcp" {
            (
                r#"{"jsonrpc":"2.0","method":"one"}"#,
                r#"{"jsonrpc":"2.0","method":"two"}"#,
            )
        } else {
            ("one", "two")
        };
        tokio::spawn(async move {
            let _ = tx
                .send(Bytes::from(format!("event: message\ndata: {one}\n\n")))
                .await;
            release.notified().await;
            let _ = tx
                .send(Bytes::from(format!("event: message\ndata: {two}\n\n")))
                .await;
            finished.store(true, Ordering::SeqCst);
        });
        let h = resp.headers_mut();
        h.insert("content-type", "text/event-stream".parse().unwrap());
        h.insert("cache-control", "no-cache".parse().unwrap());
        h.insert("connection", "keep-alive".parse().unwrap());
        *resp.body_mut() = body;
    } else if path == "/slow" {
        let ms: u64 = query
            .strip_prefix("ms=")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1000);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        *resp.body_mut() = full("slow done");
    } else {
        let method = req.method().to_string();
        let uri = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_default();
        let headers: Vec<Value> = req
            .headers()
            .iter()
            .map(|(k, v)| {
                Value::from(vec![
                    Value::from(k.as_str()),
                    Value::from(String::from_utf8_lossy(v.as_bytes()).into_owned()),
                ])
            })
            .collect();
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let json = serde_json::json!({
            "method": method,
            "uri": uri,
            "headers": headers,
            "body_len": body.len(),
            "body_fnv": fnv(&body).to_string(),
        });
        resp.headers_mut()
            .insert("content-type", "application/json".parse().unwrap());
        resp.headers_mut().insert("x-echo", "1".parse().unwrap());
        *resp.body_mut() = full(json.to_string());
    }
    resp
}

/// The values of one header in an echo answer.
fn echoed<'a>(echo: &'a Value, name: &str) -> Vec<&'a str> {
    echo["headers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|pair| pair[0] == name)
        .map(|pair| pair[1].as_str().unwrap())
        .collect()
}

// ----------------------------------------------------------------------------------
// The sidecar and clients.

fn config(gateway: &str) -> Config {
    let mut c = Config::default();
    c.listen.address = "127.0.0.1:0".parse().unwrap();
    c.admin.address = "127.0.0.1:0".parse().unwrap();
    c.upstream.gateway_url = gateway.to_owned();
    c.shutdown.drain_seconds = 5;
    c.shutdown.grace_seconds = 0;
    c.log.level = "warn".to_owned();
    c
}

async fn sidecar(c: Config) -> Running {
    proxy::start(c).await.expect("sidecar starts")
}

/// A sidecar in front of a fresh echo gateway, ready.
async fn pair() -> (Gateway, Running) {
    let gw = Gateway::start().await;
    let running = sidecar(config(&gw.url())).await;
    wait_ready(&running).await;
    (gw, running)
}

async fn wait_ready(running: &Running) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !running.is_ready() {
        assert!(Instant::now() < deadline, "sidecar never became ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

fn h2_client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

async fn get(url: String) -> (StatusCode, http::HeaderMap, Bytes) {
    let resp = client().get(url.parse().unwrap()).await.expect("response");
    let (parts, body) = resp.into_parts();
    (
        parts.status,
        parts.headers,
        body.collect().await.expect("body").to_bytes(),
    )
}

/// Sends raw bytes (the request should say `Connection: close`) and reads to EOF.
async fn raw(addr: SocketAddr, request: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("answer within 10 s")
        .expect("read");
    out
}

struct RawResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl RawResponse {
    fn parse(bytes: &[u8]) -> RawResponse {
        let split = bytes
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a complete head");
        let head = String::from_utf8_lossy(&bytes[..split]).into_owned();
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .unwrap()
            .split(' ')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let headers = lines
            .map(|l| {
                let (k, v) = l.split_once(':').unwrap();
                (k.trim().to_ascii_lowercase(), v.trim().to_owned())
            })
            .collect();
        RawResponse {
            status,
            headers,
            body: bytes[split + 4..].to_vec(),
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The body of a chunked HTTP/1.1 response.
fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n").unwrap();
        let size =
            usize::from_str_radix(std::str::from_utf8(&body[..line_end]).unwrap(), 16).unwrap();
        body = &body[line_end + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

async fn admin_get(running: &Running, path: &str) -> (StatusCode, String) {
    let (status, _, body) = get(format!("http://{}{path}", running.admin_addr)).await;
    (status, String::from_utf8(body.to_vec()).unwrap())
}

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).expect("JSON body")
}

// ----------------------------------------------------------------------------------
// §7 transparency checklist.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s7_body_with_content_length_passes_intact() {
    let (gw, sc) = pair().await;
    let req = Request::post(format!("http://{}/echo/upload", sc.listen_addr))
        .header("content-type", "text/plain")
        .body(Full::new(Bytes::from_static(b"hello world")))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-echo"], "1");
    let echo = json(&resp.into_body().collect().await.unwrap().to_bytes());
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["body_len"], 11);
    assert_eq!(echoed(&echo, "content-length"), ["11"]);
    assert_eq!(echoed(&echo, "content-type"), ["text/plain"]);
    assert!(echoed(&echo, "transfer-encoding").is_empty());
    assert_eq!(gw.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s7_chunked_bodies_both_ways() {
    let (_gw, sc) = pair().await;
    let request = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
    let resp = RawResponse::parse(&raw(sc.listen_addr, request).await);
    assert_eq!(resp.status, 200);
    let body = if resp.header("transfer-encoding") == Some("chunked") {
        dechunk(&resp.body)
    } else {
        resp.body.clone()
    };
    let echo = json(&body);
    assert_eq!(echo["body_len"], 11);
    assert_eq!(echo["body_fnv"], fnv(b"hello world").to_string());

    let resp = RawResponse::parse(
        &raw(
            sc.listen_addr,
            b"GET /chunked HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await,
    );
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("transfer-encoding"), Some("chunked"));
    assert_eq!(dechunk(&resp.body), b"alpha-beta-gamma");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s7_head_gets_headers_and_no_body() {
    let (_gw, sc) = pair().await;
    let resp = RawResponse::parse(
        &raw(
            sc.listen_addr,
            b"HEAD /head HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await,
    );
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("content-length"), Some("5"));
    assert!(resp.body.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s7_204_and_304_have_no_body() {
    let (_gw, sc) = pair().await;
    for code in [204u16, 304] {
        let request =
            format!("GET /status/{code} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let resp = RawResponse::parse(&raw(sc.listen_addr, request.as_bytes()).await);
        assert_eq!(resp.status, code);
        assert!(resp.body.is_empty(), "{code} has a body");
        assert_eq!(resp.header("transfer-encoding"), None);
        assert_eq!(resp.header("etag"), Some("\"v1\""));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s7_large_bodies_stream_intact() {
    let (_gw, sc) = pair().await;
    let data = pattern(BIG);
    let req = Request::put(format!("http://{}/echo/big", sc.listen_addr))
        .body(Full::new(Bytes::from(data.clone())))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    let echo = json(&resp.into_body().collect().await.unwrap().to_bytes());
    assert_eq!(echo["body_len"], BIG);
    assert_eq!(echo["body_fnv"], fnv(&data).to_string());

    let (status, headers, body) = get(format!("http://{}/big", sc.listen_addr)).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-length"], BIG.to_string().as_str());
    assert_eq!(body.len(), BIG);
    assert!(body[..] == data[..], "downloaded bytes differ");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s7_sse_flows_event_by_event() {
    let (gw, sc) = pair().await;
    let resp = client()
        .get(format!("http://{}/sse", sc.listen_addr).parse().unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    assert!(resp.headers().get("connection").is_none());
    let mut body = resp.into_body();
    let mut seen = Vec::new();
    while !seen.ends_with(b"data: one\n\n") {
        let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("first event before the stream ends")
            .unwrap()
            .unwrap();
        if let Ok(data) = frame.into_data() {
            seen.extend_from_slice(&data);
        }
    }
    // The gateway is still holding the stream open: the event was not buffered.
    assert!(!gw.state.sse_finished.load(Ordering::SeqCst));
    gw.state.sse_release.notify_one();
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(&rest[..], b"event: message\ndata: two\n\n");
    assert!(gw.state.sse_finished.load(Ordering::SeqCst));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s7_hop_by_hop_removed_and_forwarding_headers_set() {
    let (_gw, sc) = pair().await;
    let request = b"GET /echo HTTP/1.1\r\nHost: client.example\r\n\
        Connection: close, X-Custom-Hop\r\nX-Custom-Hop: 1\r\nKeep-Alive: timeout=5\r\n\
        Proxy-Connection: keep-alive\r\nTE: trailers\r\nUpgrade: websocket\r\n\
        Proxy-Authorization: Basic Zm9vOmJhcg==\r\nTrailer: X-T\r\n\
        X-Gateway-Auth: forged-by-client\r\nx-gateway-auth: again\r\n\
        X-Forwarded-For: 203.0.113.9\r\nX-Forwarded-Proto: https\r\n\
        Authorization: Bearer end-to-end\r\nX-Keep: yes\r\n\r\n";
    let resp = RawResponse::parse(&raw(sc.listen_addr, request).await);
    assert_eq!(resp.status, 200);
    let echo = json(&resp.body);
    for gone in [
        "connection",
        "x-custom-hop",
        "keep-alive",
        "proxy-connection",
        "te",
        "upgrade",
        "proxy-authorization",
        "trailer",
        "x-gateway-auth",
    ] {
        assert!(echoed(&echo, gone).is_empty(), "{gone} was forwarded");
    }
    // The client's own claims are replaced by what the sidecar saw (`tests/forwarded.rs`).
    assert_eq!(echoed(&echo, "x-forwarded-for"), ["127.0.0.1"]);
    assert_eq!(echoed(&echo, "x-forwarded-proto"), ["http"]);
    assert_eq!(echoed(&echo, "x-forwarded-host"), ["client.example"]);
    assert_eq!(echoed(&echo, "authorization"), ["Bearer end-to-end"]);
    assert_eq!(echoed(&echo, "x-keep"), ["yes"]);
    assert_eq!(echoed(&echo, "host"), [_gw.addr.to_string().as_str()]);

    let resp = RawResponse::parse(
        &raw(
            sc.listen_addr,
            b"GET /hop HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await,
    );
    assert_eq!(resp.status, 200);
    for gone in [
        "x-resp-hop",
        "keep-alive",
        "proxy-authenticate",
        "trailer",
        "upgrade",
    ] {
        assert_eq!(resp.header(gone), None, "{gone} was returned");
    }
    // Only the sidecar's own `Connection: close` for this request remains.
    assert!(resp.header("connection").is_none_or(|v| v == "close"));
    assert_eq!(resp.header("x-kept"), Some("1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s7_path_and_query_bytes_preserved() {
    let (_gw, sc) = pair().await;
    for target in [
        "/echo/a%2fb/./c/../d//e%2F?x=%2f&y=a+b&z=%&w=%zz&v=%C3%A9&&u=a%20b&q=?&s=;",
        "/Echo/%7Euser/%25?%2e%2E=1&path[]=x&path%5B%5D=y",
        "/echo?",
        "/echo/%00%ff",
    ] {
        let request = format!("GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let resp = RawResponse::parse(&raw(sc.listen_addr, request.as_bytes()).await);
        assert_eq!(resp.status, 200, "{target}");
        let echo = json(&resp.body);
        assert_eq!(echo["uri"], target);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s7_http2_client_through_the_proxy() {
    let (_gw, sc) = pair().await;
    let req = Request::post(format!("http://{}/echo/h2?a=1", sc.listen_addr))
        .body(Full::new(Bytes::from_static(b"over h2")))
        .unwrap();
    let resp = h2_client().request(req).await.unwrap();
    assert_eq!(resp.version(), Version::HTTP_2);
    assert_eq!(resp.status(), 200);
    let echo = json(&resp.into_body().collect().await.unwrap().to_bytes());
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["uri"], "/echo/h2?a=1");
    assert_eq!(echo["body_len"], 7);
    assert_eq!(echoed(&echo, "x-forwarded-proto"), ["http"]);

    // SSE over h2 as well (the `Connection` header must not reach an h2 client).
    let resp = h2_client()
        .get(format!("http://{}/sse", sc.listen_addr).parse().unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let first = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .expect("first event")
        .unwrap()
        .unwrap()
        .into_data()
        .unwrap();
    assert!(first.ends_with(b"data: one\n\n"));
    _gw.state.sse_release.notify_one();
    let rest = body.collect().await.unwrap().to_bytes();
    assert!(rest.ends_with(b"data: two\n\n"));
}

// ----------------------------------------------------------------------------------
// Errors and bounds.

/// A loopback port with nothing listening on it (until someone binds it again).
async fn free_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap()
}

fn assert_json_error(headers: &http::HeaderMap, body: &[u8], expected: &str) {
    assert_eq!(headers["content-type"], "application/json; charset=utf-8");
    assert_eq!(std::str::from_utf8(body).unwrap(), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s7_gateway_down_is_502() {
    let sc = sidecar(config(&format!("http://{}", free_addr().await))).await;
    let (status, headers, body) = get(format!("http://{}/anything", sc.listen_addr)).await;
    assert_eq!(status, 502);
    assert_json_error(
        &headers,
        &body,
        r#"{"error":"Bad Gateway","code":"BAD_GATEWAY"}"#,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s7_gateway_slow_is_504() {
    let gw = Gateway::start().await;
    let mut c = config(&gw.url());
    c.upstream.gateway_timeout_ms = 300;
    let sc = sidecar(c).await;
    let t0 = Instant::now();
    let (status, headers, body) = get(format!("http://{}/slow?ms=5000", sc.listen_addr)).await;
    assert_eq!(status, 504);
    assert!(t0.elapsed() < Duration::from_secs(3));
    assert_json_error(
        &headers,
        &body,
        r#"{"error":"Gateway Timeout","code":"GATEWAY_TIMEOUT"}"#,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_length_with_transfer_encoding_is_400() {
    let (gw, sc) = pair().await;
    for request in [
        &b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"[..],
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
        b"POST /echo HTTP/1.1\r\nHost: x\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n",
    ] {
        let resp = RawResponse::parse(&raw(sc.listen_addr, request).await);
        assert_eq!(resp.status, 400);
        assert_eq!(
            std::str::from_utf8(&resp.body).unwrap(),
            r#"{"error":"Bad Request","code":"BAD_REQUEST"}"#
        );
    }
    assert_eq!(gw.count(), 0, "an ambiguous request reached the gateway");
    // An honest chunked request on a fresh connection still passes.
    let ok = RawResponse::parse(
        &raw(
            sc.listen_addr,
            b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n",
        )
        .await,
    );
    assert_eq!(ok.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_bounds_are_enforced() {
    let gw = Gateway::start().await;
    let mut c = config(&gw.url());
    c.listen.max_headers = 10;
    c.listen.header_read_timeout_ms = 300;
    let sc = sidecar(c).await;
    let request = support::many_headers_request("/echo", 20);
    let resp = RawResponse::parse(&raw(sc.listen_addr, &request).await);
    assert_eq!(resp.status, 431);

    // Too many headers over HTTP/2 too.
    let mut req = Request::get(format!("http://{}/echo", sc.listen_addr));
    for i in 0..20 {
        req = req.header(format!("x-h{i}"), "v");
    }
    let resp = h2_client()
        .request(req.body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), 431);

    // A head that never completes: the connection is closed after the timeout.
    let mut s = TcpStream::connect(sc.listen_addr).await.unwrap();
    s.write_all(b"GET /echo HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let t0 = Instant::now();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
        .await
        .expect("closed by the header timeout");
    assert!(t0.elapsed() < Duration::from_secs(3));
    assert_eq!(gw.count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_of_exactly_max_headers_passes() {
    let gw = Gateway::start().await;
    let mut c = config(&gw.url());
    c.listen.max_headers = 10;
    let sc = sidecar(c).await;
    // `Host` and `Connection` are two of the ten.
    for (extra, want) in [(8, 200), (9, 431)] {
        let request = support::many_headers_request("/echo", extra);
        let resp = RawResponse::parse(&raw(sc.listen_addr, &request).await);
        assert_eq!(resp.status, want, "HTTP/1.1, {extra} + 2 headers");
    }
    // HTTP/2, where hyper's own count is not applied and the sidecar's is the bound.
    for (n, want) in [(10, 200), (11, 431)] {
        let mut req = Request::get(format!("http://{}/echo", sc.listen_addr));
        for i in 0..n {
            req = req.header(format!("x-h{i}"), "v");
        }
        let resp = h2_client()
            .request(req.body(Full::new(Bytes::new())).unwrap())
            .await
            .unwrap();
        assert_eq!(resp.status(), want, "HTTP/2, {n} headers");
    }
    assert_eq!(gw.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed() {
    let gw = Gateway::start().await;
    let mut c = config(&gw.url());
    c.listen.idle_timeout_seconds = 1;
    let sc = sidecar(c).await;
    // HTTP/2 has no header timeout of its own: only the idle bound closes it.
    let stream = TcpStream::connect(sc.listen_addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    let resp = send
        .send_request(
            Request::get(format!("http://{}/echo", sc.listen_addr))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    drop(resp);
    let t0 = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), conn)
        .await
        .expect("idle connection closed")
        .unwrap()
        .ok();
    assert!(t0.elapsed() >= Duration::from_millis(500));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_bound_are_closed() {
    let gw = Gateway::start().await;
    let mut c = config(&gw.url());
    c.listen.max_connections = 1;
    let sc = sidecar(c).await;
    let held = TcpStream::connect(sc.listen_addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut extra = TcpStream::connect(sc.listen_addr).await.unwrap();
    let _ = extra
        .write_all(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
        .await;
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), extra.read_to_end(&mut buf))
        .await
        .expect("closed at once");
    assert!(read.is_err() || buf.is_empty(), "answered over the bound");
    drop(held);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let resp = RawResponse::parse(
        &raw(
            sc.listen_addr,
            b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await,
    );
    assert_eq!(resp.status, 200);
    let metrics = sc.metrics().encode();
    assert!(metrics.contains("knowtation_sidecar_connections_rejected_total 1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn section_source_route_is_answered_here() {
    let (gw, sc) = pair().await;
    for target in [
        "/api/v1/section-source?path=notes/a.md",
        "/API/V1/Section-Source/?path=x",
        "/.netlify/functions/gateway/api/v1/section-source?path=x",
        // Readings of normalizing hops in front of the gateway (route.rs).
        "//.netlify/functions/gateway/../api/v1/section-source?path=x",
        "/api/v1/section-source//..?path=x",
    ] {
        let (_, headers, _) = get(format!("http://{}{target}", sc.listen_addr)).await;
        assert!(headers.get("x-echo").is_none(), "{target} passed through");
    }
    assert_eq!(gw.count(), 0);
    // Other methods pass through (§5).
    let req = Request::post(format!(
        "http://{}/api/v1/section-source?path=x",
        sc.listen_addr
    ))
    .body(Full::new(Bytes::new()))
    .unwrap();
    let resp = client().request(req).await.unwrap();
    assert_eq!(resp.headers()["x-echo"], "1");
    assert_eq!(gw.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_answer_has_the_length_of_the_get_and_no_other() {
    // RFC 9110 §8.6: a HEAD answer carries the Content-Length the GET answer would. The
    // sidecar's own error answers have no such header until it sets one (hyper writes
    // none for a HEAD's empty body); a gateway answer keeps its own, and one without a
    // length (the GET is chunked) must not be given `content-length: 0`.
    let down = sidecar(config(&format!("http://{}", free_addr().await))).await;
    let (status, _, body) = get(format!("http://{}/anything", down.listen_addr)).await;
    assert_eq!(status, 502);
    let length = body.len().to_string();
    let head = RawResponse::parse(
        &raw(
            down.listen_addr,
            b"HEAD /anything HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await,
    );
    assert_eq!(head.status, 502);
    assert_eq!(head.header("content-length"), Some(length.as_str()));
    assert!(head.body.is_empty());
    // HTTP/2 as well, where the sidecar drops the body itself.
    let req = Request::head(format!("http://{}/anything", down.listen_addr))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = h2_client().request(req).await.unwrap();
    assert_eq!(resp.version(), Version::HTTP_2);
    assert_eq!(resp.status(), 502);
    assert_eq!(
        resp.headers()
            .get("content-length")
            .and_then(|v| v.to_str().ok()),
        Some(length.as_str())
    );
    assert!(resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .is_empty());

    let (_gw, sc) = pair().await;
    let head = RawResponse::parse(
        &raw(
            sc.listen_addr,
            b"HEAD /chunked HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await,
    );
    assert_eq!(head.status, 200);
    assert_eq!(head.header("content-length"), None);
    assert!(head.body.is_empty());
}

// ----------------------------------------------------------------------------------
// TLS.

/// A TLS client trusting the test certificate, offering `alpn`.
fn client_tls(alpn: &[&[u8]]) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for cert in upstream::load_certs(&fixture("localhost.crt"), "test").unwrap() {
        roots.add(cert).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    tls
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tls")
        .join(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_terminates_with_h2_and_http11() {
    let gw = Gateway::start().await;
    let mut c = config(&gw.url());
    c.listen.tls_cert_file = Some(fixture("localhost.crt"));
    c.listen.tls_key_file = Some(fixture("localhost.key"));
    let sc = sidecar(c).await;

    // h2 chosen by ALPN when the client offers both.
    let tcp = TcpStream::connect(sc.listen_addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let stream = tokio_rustls::TlsConnector::from(Arc::new(client_tls(&[b"h2", b"http/1.1"])))
        .connect(name, tcp)
        .await
        .unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let url = format!("https://localhost:{}/echo/tls", sc.listen_addr.port());
    let req = Request::get(url).body(Full::new(Bytes::new())).unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), Version::HTTP_2);
    let echo = json(&resp.into_body().collect().await.unwrap().to_bytes());
    assert_eq!(echoed(&echo, "x-forwarded-proto"), ["https"]);

    // HTTP/1.1 when the client offers only that.
    let tls = client_tls(&[b"http/1.1"]);
    let tcp = TcpStream::connect(sc.listen_addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
        .connect(name, tcp)
        .await
        .unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    stream
        .write_all(b"GET /echo/tls1 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out).await;
    let resp = RawResponse::parse(&out);
    assert_eq!(resp.status, 200);
    let echo = json(&resp.body);
    assert_eq!(echo["uri"], "/echo/tls1");
    assert_eq!(echoed(&echo, "x-forwarded-proto"), ["https"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_gateway_trusted_through_ca_file() {
    let gw = Gateway::start_tls().await;
    let mut c = config(&format!("https://localhost:{}", gw.addr.port()));
    c.upstream.ca_file = Some(fixture("localhost.crt"));
    let sc = sidecar(c).await;
    wait_ready(&sc).await;
    let (status, headers, body) = get(format!("http://{}/echo/up?q=%2f", sc.listen_addr)).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-echo"], "1");
    let echo = json(&body);
    assert_eq!(echo["uri"], "/echo/up?q=%2f");
    assert_eq!(echoed(&echo, "x-forwarded-proto"), ["http"]);

    // Without the CA the gateway's certificate is not trusted: 502.
    let sc = sidecar(config(&format!("https://localhost:{}", gw.addr.port()))).await;
    let (status, _, _) = get(format!("http://{}/echo", sc.listen_addr)).await;
    assert_eq!(status, 502);
}

// ----------------------------------------------------------------------------------
// Admin.

fn check_labels(metrics: &str) {
    let outcomes: Vec<&str> = outcome_labels().collect();
    for line in metrics
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        // Ours, or the process_* family every Prometheus client exports under its
        // standard names.
        assert!(
            line.starts_with("knowtation_sidecar_") || line.starts_with("process_"),
            "{line}"
        );
        let Some(open) = line.find('{') else { continue };
        let close = line.rfind('}').unwrap();
        for pair in line[open + 1..close].split(',') {
            let (name, value) = pair.split_once('=').unwrap();
            let value = value.trim_matches('"');
            let ok = match name {
                "surface" => ["rest", "mcp"].contains(&value),
                "outcome" => outcomes.contains(&value),
                "view" => view_labels().any(|v| v == value),
                "reason" => {
                    eviction_labels().any(|r| r == value)
                        || Refusal::ALL.iter().any(|r| r.as_str() == value)
                        || HeadRefusal::ALL.iter().any(|r| r.as_str() == value)
                        || TokenRefusal::ALL.iter().any(|r| r.as_str() == value)
                }
                "op" => StoreOp::ALL.iter().any(|o| o.as_str() == value),
                "check" => TokenCheck::ALL.iter().any(|c| c.as_str() == value),
                "result" => {
                    Reload::ALL.iter().any(|r| r.as_str() == value)
                        || Shadow::ALL.iter().any(|r| r.as_str() == value)
                }
                "status_class" => STATUS_CLASSES.contains(&value),
                "upstream" => UpstreamName::ALL.iter().any(|u| u.as_str() == value),
                "kind" => {
                    Fault::ALL.iter().any(|f| f.as_str() == value)
                        || Sanitized::ALL.iter().any(|k| k.as_str() == value)
                }
                "version" => value == env!("CARGO_PKG_VERSION"),
                // The build's facts, as the build script gave them to the binary.
                "commit" => value == env!("KNOWTATION_SIDECAR_COMMIT"),
                "rustc" => value == env!("KNOWTATION_SIDECAR_RUSTC"),
                "mode" => ["enforce", "shadow"].contains(&value),
                "le" => value == "+Inf" || value.parse::<f64>().is_ok(),
                _ => false,
            };
            assert!(ok, "label {name}={value} in {line}");
        }
    }
}

const METRICS_SECRET: &str = "metrics-test-secret-0123456789abcdef";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_live_ready_metrics() {
    let gateway_addr = free_addr().await;
    let canister = knowtation_testkit::MockCanister::start().await;
    canister.insert_note(
        "default",
        "private/heading.md",
        &serde_json::json!({"title": "private title", "owner": "alice"}),
        "# private heading\n\nprivate body of alice\n",
    );
    let mut c = config(&format!("http://{gateway_addr}"));
    c.upstream.canister_url = Some(canister.url());
    c.auth.jwt_secrets = vec![knowtation_sidecar::config::Secret::new(METRICS_SECRET)];
    let sc = sidecar(c).await;
    assert_eq!(admin_get(&sc, "/live").await.0, 200);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        admin_get(&sc, "/ready").await.0,
        503,
        "ready without a gateway"
    );
    assert_eq!(admin_get(&sc, "/nope").await.0, 404);

    let gw = Gateway::on(TcpListener::bind(gateway_addr).await.unwrap()).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while admin_get(&sc, "/ready").await.0 != 200 {
        assert!(
            Instant::now() < deadline,
            "never ready after the gateway came up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Traffic with private paths, values and a served note, each answer checked: the
    // metrics of traffic that was refused or never answered would prove little.
    let (status, _, body) = get(format!(
        "http://{}/echo/secret-path?user=alice",
        sc.listen_addr
    ))
    .await;
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&body).contains("secret-path"));
    let (status, _, _) = get(format!("http://{}/status/404", sc.listen_addr)).await;
    assert_eq!(status, 404);
    let token = knowtation_testkit::sign_token(
        METRICS_SECRET,
        knowtation_testkit::session_claims("alice", Duration::from_secs(600)),
    );
    let req = Request::get(format!(
        "http://{}/api/v1/section-source?path=private/heading.md",
        sc.listen_addr
    ))
    .header("authorization", format!("Bearer {token}"))
    .header("x-vault-id", "default")
    .body(Full::new(Bytes::new()))
    .unwrap();
    let resp = client().request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(
        String::from_utf8_lossy(&body).contains("\"private heading\""),
        "{body:?}"
    );
    assert_eq!(canister.count(), 1);
    let (status, metrics) = admin_get(&sc, "/metrics").await;
    assert_eq!(status, 200);
    check_labels(&metrics);
    for private in ["secret-path", "alice", "private", "heading"] {
        assert!(!metrics.contains(private), "{private} leaked into metrics");
    }
    // The scrape is of that traffic: the served note and both passthrough answers.
    for series in [
        "knowtation_sidecar_intercepted_requests_total{outcome=\"ok\",surface=\"rest\"} 1",
        "knowtation_sidecar_upstream_reads_total{status_class=\"2xx\",surface=\"rest\"} 1",
        "knowtation_sidecar_passthrough_requests_total{status_class=\"2xx\"} 1",
        "knowtation_sidecar_passthrough_requests_total{status_class=\"4xx\"} 1",
    ] {
        assert!(metrics.contains(series), "{series} missing:\n{metrics}");
    }
    for family in [
        "knowtation_sidecar_intercepted_requests_total",
        "knowtation_sidecar_upstream_reads_total",
        "knowtation_sidecar_request_duration_seconds",
        "knowtation_sidecar_sections",
        "knowtation_sidecar_truncated_total",
        "knowtation_sidecar_rate_limited_total",
        "knowtation_sidecar_hosted_context_failures_total",
        "knowtation_sidecar_hosted_context_fallbacks_total",
        "knowtation_sidecar_passthrough_requests_total{status_class=\"2xx\"}",
        "knowtation_sidecar_passthrough_requests_total{status_class=\"4xx\"}",
        "knowtation_sidecar_passthrough_duration_seconds",
        "knowtation_sidecar_in_flight_requests",
        "knowtation_sidecar_build_info{commit=",
    ] {
        assert!(metrics.contains(family), "{family} missing");
    }
    assert!(gw.count() >= 2);

    sc.shutdown();
    assert_eq!(
        admin_get(&sc, "/ready").await.0,
        503,
        "ready while shutting down"
    );
    assert_eq!(admin_get(&sc, "/live").await.0, 200);
    sc.wait().await.unwrap();
}

// ----------------------------------------------------------------------------------
// Shutdown.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_in_flight_and_refuses_new_connections() {
    let (gw, sc) = pair().await;
    let addr = sc.listen_addr;
    let slow = tokio::spawn(get(format!("http://{addr}/slow?ms=1500")));
    while gw.count() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let t0 = Instant::now();
    sc.shutdown();
    assert!(!sc.is_ready());
    let deadline = Instant::now() + Duration::from_secs(1);
    while TcpStream::connect(addr).await.is_ok() {
        assert!(Instant::now() < deadline, "still accepting after shutdown");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, _, body) = slow.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(&body[..], b"slow done");
    sc.wait().await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(5), "drain overran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_at_the_drain_deadline() {
    let gw = Gateway::start().await;
    let mut c = config(&gw.url());
    c.shutdown.drain_seconds = 1;
    let sc = sidecar(c).await;
    let addr = sc.listen_addr;
    let slow = tokio::spawn(async move {
        client()
            .get(format!("http://{addr}/slow?ms=10000").parse().unwrap())
            .await
    });
    while gw.count() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let t0 = Instant::now();
    sc.shutdown();
    sc.wait().await.unwrap();
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "returned before the deadline"
    );
    assert!(
        took < Duration::from_secs(3),
        "overran the deadline: {took:?}"
    );
    assert!(
        slow.await.unwrap().is_err(),
        "the cut request cannot succeed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_config_fails_before_binding() {
    let mut c = config("ftp://nope");
    let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
    c.listen.address = taken.local_addr().unwrap();
    match proxy::start(c).await {
        Err(proxy::StartError::Config(e)) => assert_eq!(e.key, "upstream.gateway_url"),
        other => panic!("expected a config error, got {other:?}"),
    }
}

/// §shutdown: during `shutdown.grace_seconds` readiness is false but new connections are
/// still served (endpoints are still being updated); after it, they are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_keeps_accepting_during_the_grace_period() {
    let gw = Gateway::start().await;
    let mut c = config(&gw.url());
    c.shutdown.grace_seconds = 1;
    let sc = sidecar(c).await;
    let addr = sc.listen_addr;
    let t0 = Instant::now();
    sc.shutdown();
    assert!(!sc.is_ready());
    // A fresh connection inside the grace period is served.
    let (status, _, _) = get(format!("http://{addr}/during-grace")).await;
    assert_eq!(status, 200);
    assert!(
        t0.elapsed() < Duration::from_millis(900),
        "too slow to tell"
    );
    let deadline = Instant::now() + Duration::from_secs(3);
    while TcpStream::connect(addr).await.is_ok() {
        assert!(
            Instant::now() < deadline,
            "still accepting after the grace period"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        t0.elapsed() >= Duration::from_millis(950),
        "stopped before the grace period ended"
    );
    sc.wait().await.unwrap();
}

/// §shutdown: a `GET /mcp` event stream does not hold the drain to its deadline: it is
/// ended, cleanly, as soon as no other request is in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_event_streams_once_nothing_else_is_in_flight() {
    let gw = Gateway::start().await;
    let mut c = config(&gw.url());
    c.shutdown.drain_seconds = 20;
    let sc = sidecar(c).await;
    let addr = sc.listen_addr;
    let resp = client()
        .get(format!("http://{addr}/mcp").parse().unwrap())
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut stream = resp.into_body();
    let first = stream.frame().await.unwrap().unwrap().into_data().unwrap();
    assert!(first.starts_with(b"event: message"));
    let before = gw.count();
    let slow = tokio::spawn(get(format!("http://{addr}/slow?ms=1000")));
    while gw.count() == before {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let t0 = Instant::now();
    sc.shutdown();
    // The stream stays open while the slow request is in flight…
    let early = tokio::time::timeout(Duration::from_millis(500), stream.frame()).await;
    assert!(
        early.is_err(),
        "stream ended while a request was still in flight"
    );
    let (status, _, body) = slow.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(&body[..], b"slow done");
    // …and ends cleanly right after it, long before the 20 s deadline.
    let end = tokio::time::timeout(Duration::from_secs(3), async {
        while let Some(frame) = stream.frame().await {
            frame.expect("a clean end, not an error");
        }
    })
    .await;
    assert!(end.is_ok(), "stream still open");
    sc.wait().await.unwrap();
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(4),
        "drain waited for the stream: {took:?}"
    );
    assert!(!gw.state.sse_finished.load(Ordering::SeqCst));
}

// ----------------------------------------------------------------------------------
// Upstream pools: idle connections kept (`upstream.pool_max_idle`).

/// A keep-alive HTTP/1.1 upstream that answers every request after `delay`, so that
/// concurrent requests each open a connection, and counts the connections still open
/// that carried an `/api/` request (the readiness probe's connections are not counted).
struct KeepAlive {
    addr: SocketAddr,
    open: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl KeepAlive {
    async fn start(delay: Duration) -> KeepAlive {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let open = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&open);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(keep_alive_conn(stream, delay, Arc::clone(&counted)));
            }
        });
        KeepAlive { addr, open, task }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

async fn keep_alive_conn(mut stream: TcpStream, delay: Duration, open: Arc<AtomicUsize>) {
    let mut counted = false;
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    'conn: loop {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break 'conn,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        if !counted && head.starts_with(b"GET /api/") {
            counted = true;
            open.fetch_add(1, Ordering::SeqCst);
        }
        // GETs only: the head is the whole request.
        head.clear();
        tokio::time::sleep(delay).await;
        let body = r##"{"path":"a.md","frontmatter":"{}","body":"# A\n"}"##;
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
             content-length: {}\r\n\r\n{body}",
            body.len()
        );
        if stream.write_all(answer.as_bytes()).await.is_err() {
            break;
        }
    }
    if counted {
        open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Sends `n` requests to `url` at once, each on a connection of its own; all must be 200.
async fn burst(url: &str, n: usize, headers: &[(&str, &str)]) {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        let mut req = Request::get(url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(Bytes::new())).unwrap();
        set.spawn(async move { client().request(req).await.expect("answer").status() });
    }
    while let Some(status) = set.join_next().await {
        assert_eq!(status.unwrap(), StatusCode::OK);
    }
}

/// The connections `upstream` still holds open once they have settled (2 s at most).
async fn settled_open(upstream: &KeepAlive, expected: usize) -> usize {
    support::eventually(Duration::from_secs(2), || upstream.open() == expected).await;
    upstream.open()
}

#[tokio::test]
async fn upstream_pools_keep_at_most_pool_max_idle_connections() {
    let gateway = KeepAlive::start(Duration::from_millis(300)).await;
    let canister = KeepAlive::start(Duration::from_millis(300)).await;
    let secret = "pool-test-secret-0123456789abcdef";
    let mut c = config(&gateway.url());
    c.upstream.canister_url = Some(canister.url());
    c.auth.jwt_secrets = vec![knowtation_sidecar::config::Secret::new(secret)];
    c.rate_limit.per_user_per_minute = 0;
    c.upstream.pool_max_idle = 2;
    // One worker: with more, the two are shared out and a burst may land on one.
    c.runtime.threads = 1;
    let running = sidecar(c).await;
    wait_ready(&running).await;
    let base = format!("http://{}", running.listen_addr);

    // Passthrough: eight at once need eight gateway connections; two stay.
    burst(&format!("{base}/api/v1/echo"), 8, &[]).await;
    assert_eq!(settled_open(&gateway, 2).await, 2);

    // The REST route's canister reads: the same.
    let token = knowtation_testkit::sign_token(
        secret,
        knowtation_testkit::session_claims("pool-user", Duration::from_secs(600)),
    );
    let bearer = format!("Bearer {token}");
    burst(
        &format!("{base}/api/v1/section-source?path=a.md"),
        8,
        &[("authorization", &bearer), ("x-vault-id", "default")],
    )
    .await;
    assert_eq!(settled_open(&canister, 2).await, 2);

    // The pools reuse what they kept: two more requests open nothing new.
    burst(&format!("{base}/api/v1/echo"), 2, &[]).await;
    assert_eq!(gateway.open(), 2);
    running.shutdown();
    running.wait().await.unwrap();
}

#[tokio::test]
async fn by_default_a_burst_of_upstream_connections_stays_open() {
    // The control for the test above: the default keeps 32, so all eight stay.
    let gateway = KeepAlive::start(Duration::from_millis(300)).await;
    let running = sidecar(config(&gateway.url())).await;
    wait_ready(&running).await;
    let base = format!("http://{}", running.listen_addr);
    burst(&format!("{base}/api/v1/echo"), 8, &[]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(gateway.open(), 8);
    running.shutdown();
    running.wait().await.unwrap();
}

// ----------------------------------------------------------------------------------
// Heads hyper refuses on its own are counted (knowtation_sidecar_head_refused_total).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_refused_by_the_http_layer_are_counted() {
    let gw = Gateway::start().await;
    let mut c = config(&gw.url());
    c.listen.max_headers = 10;
    c.listen.header_read_timeout_ms = 300;
    let sc = sidecar(c).await;
    wait_ready(&sc).await;
    let (malformed, too_large) = (
        support::head_refused("malformed"),
        support::head_refused("too_large"),
    );
    let before = support::Metrics::parse(&admin_get(&sc, "/metrics").await.1);
    // Both series exist from the start, at zero.
    assert_eq!(before.samples.get(&malformed), Some(&0.0));
    assert_eq!(before.samples.get(&too_large), Some(&0.0));

    let answer = raw(
        sc.listen_addr,
        b"GET /echo HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
    )
    .await;
    assert_eq!(RawResponse::parse(&answer).status, 400);
    let many = support::many_headers_request("/echo", 20);
    assert_eq!(
        RawResponse::parse(&raw(sc.listen_addr, &many).await).status,
        431
    );

    // An ordinary keep-alive connection that goes quiet is closed by the head timeout:
    // not a refusal.
    let mut s = TcpStream::connect(sc.listen_addr).await.unwrap();
    s.write_all(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    assert!(
        buf.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&buf)
    );

    let mut after = support::Metrics::default();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        after = support::Metrics::parse(&admin_get(&sc, "/metrics").await.1);
        if after.get(&too_large) >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(after.samples.get(&malformed), Some(&1.0));
    assert_eq!(after.samples.get(&too_large), Some(&1.0));
    // Only the one good request reached the gateway.
    assert_eq!(gw.state.requests.load(Ordering::SeqCst), 1);
    sc.shutdown();
    sc.wait().await.unwrap();
}
