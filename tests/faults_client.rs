//! Client-side attacks on the real binary (`serve`) on loopback. Each cell checks the
//! answer, what reached the gateway (a raw-TCP `testkit::FaultServer` that records every
//! request it reads), the counters on the admin `/metrics`, and that the sidecar is
//! healthy afterwards (a REST and a passthrough request succeed, `/ready` is 200, nothing
//! in flight or buffered, no canary in the log or the metrics). References:
//! `docs/daemon.md` ("The proxy": answers of its own and bounds), `docs/security.md` §3
//! (nothing scarce for the unauthenticated), wire contract §6 (the `/mcp` door) and §7.
//!
//! | cell | observed answer |
//! |---|---|
//! | slow head (slowloris), 8 connections, one byte per 100 ms | closed without an answer at `listen.header_read_timeout_ms`; each holds a connection (a ninth over `listen.max_connections` is closed at once, `connections_rejected_total` +1) but never an in-flight slot; the connections are free again after |
//! | connection that sends nothing | closed at the same bound |
//! | head over `listen.max_header_bytes` | 431 (hyper), closed, `head_refused_total{too_large}` |
//! | more headers than `listen.max_headers` | 431 (hyper), closed, `head_refused_total{too_large}` |
//! | `POST /mcp` announcing more than `mcp.max_body_bytes` | 413 at once, `payload_too_large` |
//! | the same, chunked | 413 once the cap is passed, `payload_too_large` |
//! | `POST /mcp` without a token, 10 MB announced | 401 at once, closed, `unauthorized` |
//! | REST `GET` announcing a 10 MB body | 200 without reading it, closed, `ok` |
//! | Content-Length with Transfer-Encoding (either order, any case) | 400 `BAD_REQUEST`, closed, `passthrough_requests_total{4xx}` |
//! | two Content-Length, a list, a sign; TE not ending in chunked, two TE, space before the colon, VT; obs-fold; bare CR; NUL; space in the target; HTTP/1.0 with chunked | 400 (hyper), closed, `head_refused_total{malformed}` |
//! | bad chunk sizes (negative, `0x`, overflow, bare LF) and data longer than its size | 400 `BAD_REQUEST`, closed, `passthrough_requests_total{4xx}`; the gateway gets no complete message |
//! | TE with a tab, bare LF line ends, a request inside a GET body | re-framed: one request with the body as read, one answer |
//! | every shape above | the request hidden behind it never reaches the gateway |
//! | HTTP/2 rapid reset, 1,000 streams opened and reset | GOAWAY `ENHANCE_YOUR_CALM` at once, no stream reaches the gateway |
//! | HTTP/2 SETTINGS flood, 10,000 frames (reading or not) | each acknowledged in turn; GOAWAY at the first-request bound, dropped 5 s later |
//! | HTTP/2 by prior knowledge | served (the listener speaks h2c) |
//! | disconnects: passthrough download, REST and MCP tool mid-request, `/mcp` body mid-way, HTTP/2 stream reset | the gateway connection is closed; in-flight and buffered gauges back to 0; no per-user slot left taken |
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/sidecar.rs"]
mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use knowtation_testkit::fault::raw_head;
use knowtation_testkit::{CanisterOverride, FaultServer, MockBridge, MockCanister, Script};
use serde_json::json;
use support::{
    assert_no_canary, eventually, exchange, get_request, intercepted, post_request, token, Metrics,
    Raw, Sidecar, BUFFERED, IN_FLIGHT,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HEADER_READ_MS: u64 = 500;
const MAX_HEADER_BYTES: usize = 16 * 1024;
const MAX_HEADERS: usize = 30;
const MCP_MAX_BODY: usize = 64 * 1024;
const CANISTER_MS: u64 = 3000;
/// Added to a deadline before a close counts as late.
const MARGIN: Duration = Duration::from_millis(1500);
const HUNG: Duration = Duration::from_secs(10);
const ACCEPT_BOTH: &str = "application/json, text/event-stream";
const INIT: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"faults","version":"0"}}}"#;
const SESSION: &str = "client-fault-session";
/// How long an HTTP/2 connection told to go (GOAWAY) may linger before it is dropped
/// (`CLOSE_GRACE` in `src/proxy/listener.rs`, documented in docs/daemon.md).
const CLOSE_GRACE: Duration = Duration::from_secs(5);
const REJECTED: &str = "knowtation_sidecar_connections_rejected_total";

/// The sidecar in front of a gateway that answers everything `gateway-ok` (and
/// `initialize` with a session), a canister holding `n.md` and a slow `slow.md`, and a
/// bridge that allows the `default` vault.
struct Env {
    sidecar: Sidecar,
    gateway: FaultServer,
    _canister: MockCanister,
    _bridge: MockBridge,
}

impl Env {
    async fn start(extra: &[(&str, &str)]) -> Env {
        let gateway = FaultServer::start(Script::respond(
            200,
            &[("Content-Type", "text/plain")],
            "gateway-ok",
        ))
        .await;
        let init_body = "event: message\ndata: {\"result\":{\"protocolVersion\":\"2025-06-18\",\"capabilities\":{},\"serverInfo\":{\"name\":\"fault\",\"version\":\"0\"}},\"jsonrpc\":\"2.0\",\"id\":0}\n\n";
        gateway.on(
            r#""method":"initialize""#,
            Script::respond(
                200,
                &[
                    ("Content-Type", "text/event-stream"),
                    ("Mcp-Session-Id", SESSION),
                ],
                init_body,
            ),
        );
        gateway.on(
            "GET /endless ",
            Script::new()
                .write(raw_head(
                    "HTTP/1.1",
                    200,
                    &[
                        ("Content-Type", "application/octet-stream"),
                        ("Content-Length", "1099511627776"),
                    ],
                ))
                .endless(vec![b'e'; 64 * 1024]),
        );
        let canister = MockCanister::start().await;
        canister.insert_note("default", "n.md", &json!({}), "# N\n\nCANARY-CLIENT-BODY\n");
        canister.insert_note("default", "slow.md", &json!({}), "# Slow\n");
        canister.set_override(
            "slow.md",
            CanisterOverride::new().delay(Duration::from_millis(1500)),
        );
        let bridge = MockBridge::start().await;
        let mut env: Vec<(&str, String)> = vec![
            ("UPSTREAM__GATEWAY_URL", gateway.url()),
            ("UPSTREAM__CANISTER_URL", canister.url()),
            ("UPSTREAM__BRIDGE_URL", bridge.url()),
            ("UPSTREAM__CANISTER_TIMEOUT_MS", CANISTER_MS.to_string()),
            ("UPSTREAM__GATEWAY_TIMEOUT_MS", "3000".to_owned()),
            ("UPSTREAM__GATEWAY_IDLE_TIMEOUT_MS", "2000".to_owned()),
            ("LISTEN__HEADER_READ_TIMEOUT_MS", HEADER_READ_MS.to_string()),
            ("LISTEN__MAX_HEADER_BYTES", MAX_HEADER_BYTES.to_string()),
            ("LISTEN__MAX_HEADERS", MAX_HEADERS.to_string()),
            ("LISTEN__BODY_READ_TIMEOUT_MS", "1000".to_owned()),
            ("LISTEN__MAX_IN_FLIGHT_PER_USER", "2".to_owned()),
            ("MCP__MAX_BODY_BYTES", MCP_MAX_BODY.to_string()),
            ("MCP__CALLS_PER_MINUTE", "100000".to_owned()),
        ];
        for (k, v) in extra {
            env.push((k, (*v).to_owned()));
        }
        let sidecar = Sidecar::spawn(&env);
        sidecar.wait_ready().await;
        Env {
            sidecar,
            gateway,
            _canister: canister,
            _bridge: bridge,
        }
    }

    fn addr(&self) -> SocketAddr {
        self.sidecar.addr
    }

    /// Requests the gateway saw whose request line starts with `line` (not body bytes
    /// that merely look like one).
    fn gateway_saw(&self, line: &str) -> usize {
        self.gateway
            .requests()
            .iter()
            .filter(|r| r.starts_with(line))
            .count()
    }

    /// A normal REST answer and a normal passthrough answer, `/ready` 200, nothing in
    /// flight or buffered, no canary in the log or the metrics.
    async fn assert_healthy(&self, cell: &str) {
        let mut settled = false;
        for _ in 0..100 {
            let m = self.sidecar.metrics().await;
            if m.get(IN_FLIGHT) == 0.0 && m.get(BUFFERED) == 0.0 {
                settled = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            settled,
            "[{cell}] in-flight or buffered gauges did not return to 0"
        );
        let r = exchange(self.addr(), &rest("healthy-user", "n.md"), HUNG).await;
        assert_eq!(r.status, 200, "[{cell}] REST afterwards: {}", r.all_text());
        let r = exchange(self.addr(), &get_request("/healthy", &[]), HUNG).await;
        assert_eq!(
            (r.status, r.text().as_str()),
            (200, "gateway-ok"),
            "[{cell}]"
        );
        assert_eq!(self.sidecar.ready().await, 200, "[{cell}] /ready");
        let m = self.sidecar.metrics().await;
        assert_no_canary(cell, "the metrics", &m.text);
        assert_no_canary(cell, "the log", &self.sidecar.log());
    }
}

fn rest(sub: &str, path: &str) -> Vec<u8> {
    let auth = format!("Bearer {}", token(sub));
    get_request(
        &format!("/api/v1/section-source?path={path}"),
        &[("Authorization", &auth), ("X-Vault-Id", "default")],
    )
}

fn report(cell: &str, r: &Raw, before: &Metrics, after: &Metrics) {
    eprintln!(
        "CELL {cell} | {} | {} ms | closed={} | {}",
        r.status,
        r.elapsed.as_millis(),
        !r.timed_out,
        after.moved_summary(before)
    );
}

// ---------------------------------------------------------------------------------------
// Slow heads (slowloris).

/// A connection that sends a request head one byte every 100 ms and never finishes it:
/// returns when the sidecar closes it, with how long that took and what it answered.
async fn slowloris(addr: SocketAddr, tag: usize) -> (Duration, Vec<u8>) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut rd, mut wr) = stream.into_split();
    let done = Arc::new(AtomicBool::new(false));
    let stop = Arc::clone(&done);
    let t0 = Instant::now();
    let writer = tokio::spawn(async move {
        let head = format!(
            "GET /slowloris-{tag} HTTP/1.1\r\nHost: x\r\nX-Pad: {}",
            "a".repeat(400)
        );
        for b in head.bytes() {
            if stop.load(Ordering::SeqCst) || wr.write_all(&[b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), rd.read_to_end(&mut out)).await;
    let took = t0.elapsed();
    done.store(true, Ordering::SeqCst);
    writer.abort();
    (took, out)
}

/// Heads that trickle in are closed at `listen.header_read_timeout_ms` whatever their
/// pace; while open they hold a connection (bounded by `listen.max_connections`, over it
/// new ones are refused and counted) and never an in-flight slot; once closed, the
/// connections are free again. Nothing reaches the gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_heads_are_closed_and_hold_no_slot() {
    let env = Env::start(&[("LISTEN__MAX_CONNECTIONS", "8")]).await;
    let before = env.sidecar.metrics().await;
    let loris: Vec<_> = (0..8)
        .map(|i| tokio::spawn(slowloris(env.addr(), i)))
        .collect();
    tokio::time::sleep(Duration::from_millis(150)).await;
    // Over the connection bound: accepted and closed at once, without an answer.
    let extra = exchange(
        env.addr(),
        &get_request("/extra", &[]),
        Duration::from_secs(3),
    )
    .await;
    assert!(
        extra.bytes.is_empty() && !extra.timed_out,
        "[slowloris] a ninth connection was served: {}",
        extra.all_text()
    );
    let during = env.sidecar.metrics().await;
    assert_eq!(
        during.get(IN_FLIGHT),
        0.0,
        "[slowloris] a slow head took a slot"
    );
    for task in loris {
        let (took, answer) = task.await.unwrap();
        eprintln!(
            "CELL client/slowloris | closed after {} ms | answer {:?}",
            took.as_millis(),
            String::from_utf8_lossy(&answer)
        );
        assert!(
            took < Duration::from_millis(HEADER_READ_MS) + MARGIN,
            "[slowloris] open for {took:?}"
        );
        assert!(
            took + Duration::from_millis(60) >= Duration::from_millis(HEADER_READ_MS),
            "[slowloris] closed after {took:?}, before the header timeout"
        );
    }
    let after = env.sidecar.metrics().await;
    assert_eq!(
        after.get(REJECTED) - before.get(REJECTED),
        1.0,
        "[slowloris] rejected"
    );
    assert_eq!(env.gateway_saw("GET /slowloris"), 0);
    assert_eq!(env.gateway_saw("GET /extra"), 0);
    // The closed heads released their connections: the bound admits new ones.
    env.assert_healthy("slowloris").await;

    // A connection that never sends a byte is closed too.
    let t0 = Instant::now();
    let mut idle = TcpStream::connect(env.addr()).await.unwrap();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), idle.read_to_end(&mut buf)).await;
    eprintln!(
        "CELL client/silent-connection | closed after {} ms",
        t0.elapsed().as_millis()
    );
    assert!(read.is_ok(), "[silent] still open");
    assert!(t0.elapsed() < Duration::from_millis(HEADER_READ_MS) + MARGIN);
}

// ---------------------------------------------------------------------------------------
// Oversized heads and bodies.

#[derive(Debug)]
struct Oversized {
    name: &'static str,
    request: Vec<u8>,
    /// Status of the one answer.
    status: u16,
    /// The counters that must move.
    metric: Vec<(String, f64)>,
}

fn oversized_cells() -> Vec<Oversized> {
    let auth = format!("Bearer {}", token("CANARY-SUB-oversized"));
    let mut cells = Vec::new();
    // One header larger than the whole head may be (hyper's own 431, before the service).
    let big = "a".repeat(MAX_HEADER_BYTES + 1024);
    cells.push(Oversized {
        name: "head-over-max-header-bytes",
        request: get_request("/big-head", &[("X-Big", &big)]),
        status: 431,
        metric: vec![(support::head_refused("too_large"), 1.0)],
    });
    // More headers than `listen.max_headers`.
    cells.push(Oversized {
        name: "too-many-headers",
        request: support::many_headers_request("/many-headers", MAX_HEADERS + 10),
        status: 431,
        metric: vec![(support::head_refused("too_large"), 1.0)],
    });
    // A `POST /mcp` announcing more than `mcp.max_body_bytes`: 413 before a byte is read.
    let announced = format!(
        "POST /mcp HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nAccept: {ACCEPT_BOTH}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        MCP_MAX_BODY * 4
    );
    cells.push(Oversized {
        name: "mcp-body-announced-over-cap",
        request: announced.into_bytes(),
        status: 413,
        metric: vec![(intercepted("mcp", "payload_too_large"), 1.0)],
    });
    // The same, chunked (no length announced): read up to the cap, then 413.
    let mut chunked = format!(
        "POST /mcp HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nAccept: {ACCEPT_BOTH}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    let piece = format!("[{}]", "1,".repeat(4095) + "1");
    for _ in 0..(MCP_MAX_BODY * 2 / piece.len() + 1) {
        chunked.extend_from_slice(format!("{:x}\r\n{piece}\r\n", piece.len()).as_bytes());
    }
    cells.push(Oversized {
        name: "mcp-body-chunked-over-cap",
        request: chunked,
        status: 413,
        metric: vec![(intercepted("mcp", "payload_too_large"), 1.0)],
    });
    // No token: 401 from the headers, before a slot or a byte of the 10 MB body.
    cells.push(Oversized {
        name: "mcp-body-unauthenticated",
        request: format!(
            "POST /mcp HTTP/1.1\r\nHost: x\r\nAccept: {ACCEPT_BOTH}\r\nContent-Type: application/json\r\nContent-Length: 10000000\r\n\r\n"
        )
        .into_bytes(),
        status: 401,
        metric: vec![(intercepted("mcp", "unauthorized"), 1.0)],
    });
    // The REST route takes no body: answered without reading the announced 10 MB.
    cells.push(Oversized {
        name: "rest-get-with-body",
        request: format!(
            "GET /api/v1/section-source?path=n.md HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nX-Vault-Id: default\r\nContent-Length: 10000000\r\n\r\n"
        )
        .into_bytes(),
        status: 200,
        metric: vec![
            (intercepted("rest", "ok"), 1.0),
            (support::upstream_reads("rest", "2xx"), 1.0),
        ],
    });
    cells
}

/// Each oversized head or body gets its documented answer at once, the connection is
/// closed (its unread bytes cannot be trusted as the next request), nothing reaches the
/// gateway and nothing stays buffered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_heads_and_bodies_are_refused_before_the_gateway() {
    let env = Env::start(&[]).await;
    for c in oversized_cells() {
        let cell = format!("client/{}", c.name);
        let gateway_before = env.gateway.count();
        let before = env.sidecar.metrics().await;
        let r = exchange(env.addr(), &c.request, Duration::from_secs(5)).await;
        let after = env.sidecar.metrics_settled(&before, &c.metric).await;
        report(&cell, &r, &before, &after);
        assert_eq!(r.status, c.status, "[{cell}] {}", r.all_text());
        assert!(!r.timed_out, "[{cell}] the connection stayed open");
        assert!(r.elapsed < MARGIN, "[{cell}] took {:?}", r.elapsed);
        assert_eq!(
            env.gateway.count(),
            gateway_before,
            "[{cell}] reached the gateway"
        );
        let moved = after.moved_since(&before);
        for (series, delta) in &c.metric {
            assert_eq!(
                moved.get(series),
                Some(delta),
                "[{cell}] {series}: {moved:#?}"
            );
        }
        assert_no_canary(&cell, "the answer", &r.all_text());
        env.assert_healthy(&cell).await;
    }
}

// ---------------------------------------------------------------------------------------
// Request smuggling.

/// What a smuggling shape must come to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Smuggle {
    /// Refused with this status, the connection closed: nothing of it (and nothing after
    /// it) reaches the gateway.
    Refused(u16),
    /// Read one way, re-framed by the sidecar: the gateway gets exactly one request with
    /// this body; the client gets one answer.
    Normalised(&'static str),
    /// The head is forwarded but the body cannot be decoded: the exchange is aborted and
    /// the connection closed; the gateway sees no complete request and nothing after.
    BodyAborted,
}

const SMUGGLED: &str = "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n";

fn smuggling_shapes() -> Vec<(&'static str, String, Smuggle)> {
    let post = |name: &str, headers: &str, body: &str| {
        format!("POST /smug-{name} HTTP/1.1\r\nHost: x\r\n{headers}\r\n{body}{SMUGGLED}")
    };
    let chunked = "5\r\nhello\r\n0\r\n\r\n";
    vec![
        // docs/daemon.md: both framing headers → 400 BAD_REQUEST, connection closed.
        (
            "cl-then-te",
            post("cl-then-te", "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n", chunked),
            Smuggle::Refused(400),
        ),
        (
            "te-then-cl",
            post("te-then-cl", "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n", chunked),
            Smuggle::Refused(400),
        ),
        (
            "cl-te-odd-case",
            post("cl-te-odd-case", "cOnTeNt-LeNgTh: 4\r\ntRaNsFeR-eNcOdInG: chunked\r\n", chunked),
            Smuggle::Refused(400),
        ),
        (
            "two-content-lengths",
            post("two-content-lengths", "Content-Length: 5\r\nContent-Length: 40\r\n", "hello"),
            Smuggle::Refused(400),
        ),
        (
            "content-length-list",
            post("content-length-list", "Content-Length: 5, 40\r\n", "hello"),
            Smuggle::Refused(400),
        ),
        (
            "content-length-plus-sign",
            post("content-length-plus-sign", "Content-Length: +5\r\n", "hello"),
            Smuggle::Refused(400),
        ),
        (
            "te-xchunked",
            post("te-xchunked", "Transfer-Encoding: xchunked\r\n", chunked),
            Smuggle::Refused(400),
        ),
        (
            "te-chunked-then-identity",
            post("te-chunked-then-identity", "Transfer-Encoding: chunked, identity\r\n", chunked),
            Smuggle::Refused(400),
        ),
        (
            "te-two-headers",
            post(
                "te-two-headers",
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n",
                chunked,
            ),
            Smuggle::Refused(400),
        ),
        (
            "te-space-before-colon",
            post("te-space-before-colon", "Transfer-Encoding : chunked\r\n", chunked),
            Smuggle::Refused(400),
        ),
        (
            "te-vertical-tab",
            post("te-vertical-tab", "Transfer-Encoding:\x0bchunked\r\n", chunked),
            Smuggle::Refused(400),
        ),
        (
            "cl-with-te-in-obs-fold",
            post(
                "cl-with-te-in-obs-fold",
                "Content-Length: 4\r\nX-Fold: a\r\n Transfer-Encoding: chunked\r\n",
                chunked,
            ),
            Smuggle::Refused(400),
        ),
        (
            "obs-fold",
            post("obs-fold", "Content-Length: 5\r\nX-Fold: a\r\n b\r\n", "hello"),
            Smuggle::Refused(400),
        ),
        (
            "bare-cr-in-header",
            post("bare-cr-in-header", "Content-Length: 5\r\nX-Cr: a\rb\r\n", "hello"),
            Smuggle::Refused(400),
        ),
        (
            "nul-in-header",
            post("nul-in-header", "Content-Length: 5\r\nX-Nul: a\0b\r\n", "hello"),
            Smuggle::Refused(400),
        ),
        (
            "space-in-target",
            format!("GET /smug space HTTP/1.1\r\nHost: x\r\n\r\n{SMUGGLED}"),
            Smuggle::Refused(400),
        ),
        (
            "http10-chunked",
            format!(
                "POST /smug-http10-chunked HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{chunked}{SMUGGLED}"
            ),
            Smuggle::Refused(400),
        ),
        // Bad chunk sizes: the head has gone on, the body cannot be decoded.
        (
            "chunk-size-negative",
            post("chunk-size-negative", "Transfer-Encoding: chunked\r\n", "-1\r\nhello\r\n0\r\n\r\n"),
            Smuggle::BodyAborted,
        ),
        (
            "chunk-size-hex-prefix",
            post("chunk-size-hex-prefix", "Transfer-Encoding: chunked\r\n", "0x5\r\nhello\r\n0\r\n\r\n"),
            Smuggle::BodyAborted,
        ),
        (
            "chunk-size-overflow",
            post(
                "chunk-size-overflow",
                "Transfer-Encoding: chunked\r\n",
                "fffffffffffffffff5\r\nhello\r\n0\r\n\r\n",
            ),
            Smuggle::BodyAborted,
        ),
        (
            "chunk-data-longer-than-size",
            post(
                "chunk-data-longer-than-size",
                "Transfer-Encoding: chunked\r\n",
                "3\r\nhello\r\n0\r\n\r\n",
            ),
            Smuggle::BodyAborted,
        ),
        (
            "chunk-size-bare-lf",
            post("chunk-size-bare-lf", "Transfer-Encoding: chunked\r\n", "5\nhello\r\n0\r\n\r\n"),
            Smuggle::BodyAborted,
        ),
        // Accepted spellings, re-framed by the sidecar for the gateway.
        (
            "te-tab",
            format!(
                "POST /smug-te-tab HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\tchunked\r\nConnection: close\r\n\r\n{chunked}"
            ),
            Smuggle::Normalised("hello"),
        ),
        (
            "bare-lf-line-ends",
            "POST /smug-bare-lf-line-ends HTTP/1.1\nHost: x\nContent-Length: 5\nConnection: close\n\nhello"
                .to_owned(),
            Smuggle::Normalised("hello"),
        ),

        (
            // A request hidden in a GET body stays a body.
            "request-in-get-body",
            format!(
                "GET /smug-request-in-get-body HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{SMUGGLED}",
                SMUGGLED.len()
            ),
            Smuggle::Normalised(SMUGGLED),
        ),
    ]
}

/// The body of a recorded request (de-chunked when the sidecar forwarded it chunked).
fn recorded_body(request: &str) -> String {
    let Some((head, body)) = request.split_once("\r\n\r\n") else {
        return String::new();
    };
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return body.to_owned();
    }
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

/// Every shape is refused, or read one way and re-framed; the gateway never receives a
/// request the sidecar did not answer for, and never the one hidden behind the shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_smuggling_shapes_never_reach_the_gateway_as_requests() {
    let env = Env::start(&[]).await;
    for (name, request, expect) in smuggling_shapes() {
        let cell = format!("client/smuggling/{name}");
        let before = env.sidecar.metrics().await;
        let r = exchange(env.addr(), request.as_bytes(), Duration::from_secs(5)).await;
        assert!(
            !r.timed_out,
            "[{cell}] the connection stayed open: {}",
            r.all_text()
        );
        // Absence at the gateway is read only once the sidecar is done with the request:
        // it has counted it (as the one series the shape must move), nothing is in
        // flight, and no gateway connection is open (the stand-in records a request
        // before its connection ends).
        let series = match expect {
            Smuggle::Refused(_) => vec![
                support::head_refused("malformed"),
                support::passthrough("4xx"),
            ],
            Smuggle::Normalised(_) => vec![support::passthrough("2xx")],
            Smuggle::BodyAborted => vec![support::passthrough("4xx")],
        };
        let counted =
            |m: &Metrics| -> f64 { series.iter().map(|k| m.get(k) - before.get(k)).sum() };
        let deadline = Instant::now() + Duration::from_secs(5);
        let after = loop {
            let m = env.sidecar.metrics().await;
            if counted(&m) >= 1.0 && m.get(IN_FLIGHT) == 0.0 && env.gateway.open_connections() == 0
            {
                break m;
            }
            assert!(
                Instant::now() < deadline,
                "[{cell}] not done: counted {}, in flight {}, gateway connections {}",
                counted(&m),
                m.get(IN_FLIGHT),
                env.gateway.open_connections()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        report(&cell, &r, &before, &after);
        let answers = r.all_text().matches("HTTP/1.1 ").count();
        let forwarded: Vec<String> = env
            .gateway
            .requests()
            .into_iter()
            .filter(|q| {
                q.starts_with(&format!("POST /smug-{name} "))
                    || q.starts_with(&format!("GET /smug-{name} "))
            })
            .collect();
        eprintln!(
            "CELL {cell} | first line {:?} | gateway got {} request(s), bodies {:?}",
            r.all_text().lines().next().unwrap_or(""),
            forwarded.len(),
            forwarded
                .iter()
                .map(|f| recorded_body(f))
                .collect::<Vec<_>>()
        );
        match expect {
            Smuggle::Refused(status) => {
                assert_eq!(r.status, status, "[{cell}] {}", r.all_text());
                // Counted once: by hyper's refusal of the head, or as the sidecar's own
                // 400 on the passthrough route.
                assert_eq!(
                    counted(&after),
                    1.0,
                    "[{cell}] not counted once: {:#?}",
                    after.moved_since(&before)
                );
                assert_eq!(
                    answers,
                    1,
                    "[{cell}] more than one answer: {}",
                    r.all_text()
                );
                assert!(
                    forwarded.is_empty(),
                    "[{cell}] reached the gateway: {forwarded:?}"
                );
            }
            Smuggle::Normalised(body) => {
                assert_eq!(
                    (r.status, r.text().as_str()),
                    (200, "gateway-ok"),
                    "[{cell}]"
                );
                assert_eq!(forwarded.len(), 1, "[{cell}] {forwarded:?}");
                assert_eq!(recorded_body(&forwarded[0]), body, "[{cell}] {forwarded:?}");
                assert_eq!(answers, 1, "[{cell}] {}", r.all_text());
            }
            Smuggle::BodyAborted => {
                // The client's broken body is the client's fault: one 400, not the 502 of
                // a failed gateway (nor no answer at all), the connection closed, counted
                // once as a passthrough 4xx.
                assert_eq!(answers, 1, "[{cell}] {}", r.all_text());
                assert_eq!(r.status, 400, "[{cell}] {}", r.all_text());
                assert!(!r.reset, "[{cell}] reset instead of closed");
                assert_eq!(
                    counted(&after),
                    1.0,
                    "[{cell}] not counted once: {:#?}",
                    after.moved_since(&before)
                );
                // At most the head and the bytes decoded before the error, never a
                // complete message: the forward is aborted before a last chunk.
                for f in &forwarded {
                    assert!(
                        !f.ends_with("0\r\n\r\n") && !recorded_body(f).contains("hello"),
                        "[{cell}] a body the sidecar could not decode reached the gateway whole: {f:?}"
                    );
                }
            }
        }
        assert_eq!(
            env.gateway_saw("GET /smuggled "),
            0,
            "[{cell}] the hidden request reached the gateway"
        );
        assert!(
            eventually(Duration::from_secs(3), || env.gateway.open_connections()
                == 0)
            .await,
            "[{cell}] a gateway connection stayed open"
        );
        env.assert_healthy(&cell).await;
    }
}

// ---------------------------------------------------------------------------------------
// HTTP/2 (the listener serves h2c by prior knowledge, `src/proxy/listener.rs` `http_builder`).

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let n = payload.len();
    let mut out = vec![(n >> 16) as u8, (n >> 8) as u8, n as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A HEADERS frame for `GET path` (HPACK: static-table method and scheme, literal path
/// and authority without indexing), ending the stream.
fn get_headers(stream: u32, path: &str) -> Vec<u8> {
    let mut block = vec![0x82, 0x86, 0x04, path.len() as u8];
    block.extend_from_slice(path.as_bytes());
    block.extend_from_slice(&[0x01, 0x01, b'x']);
    frame(0x1, 0x4 | 0x1, stream, &block)
}

/// The error code of the first GOAWAY among `bytes` (server frames after the preface).
fn goaway(bytes: &[u8]) -> Option<u32> {
    let mut at = 0;
    while at + 9 <= bytes.len() {
        let n = (usize::from(bytes[at]) << 16)
            | (usize::from(bytes[at + 1]) << 8)
            | usize::from(bytes[at + 2]);
        let kind = bytes[at + 3];
        let payload = bytes.get(at + 9..at + 9 + n)?;
        if kind == 0x7 && payload.len() >= 8 {
            return Some(u32::from_be_bytes([
                payload[4], payload[5], payload[6], payload[7],
            ]));
        }
        at += 9 + n;
    }
    None
}

/// Writes `bytes` and reads what the server sends until it closes (or `within`).
async fn h2_raw(addr: SocketAddr, bytes: &[u8], within: Duration) -> (Vec<u8>, Duration, bool) {
    let t0 = Instant::now();
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut rd, mut wr) = stream.into_split();
    let data = bytes.to_vec();
    // Written from a task: the server may stop reading (and close) halfway.
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&data).await;
        wr
    });
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let closed = tokio::time::timeout(within, async {
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    writer.abort();
    (out, t0.elapsed(), closed)
}

/// Rapid reset (CVE-2023-44487): a thousand streams opened and reset at once. Past
/// `listen.http2_max_pending_accept_reset_streams` the connection gets GOAWAY
/// ENHANCE_YOUR_CALM and is closed; few of the streams reach the gateway; the sidecar
/// stays healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_rapid_reset_is_cut_off() {
    let env = Env::start(&[]).await;
    let mut bytes = PREFACE.to_vec();
    bytes.extend(frame(0x4, 0, 0, &[]));
    for i in 0..1000u32 {
        let id = 2 * i + 1;
        bytes.extend(get_headers(id, "/rapid"));
        bytes.extend(frame(0x3, 0, id, &8u32.to_be_bytes()));
    }
    let (out, took, closed) = h2_raw(env.addr(), &bytes, Duration::from_secs(5)).await;
    let code = goaway(&out);
    let reached = env.gateway_saw("GET /rapid ");
    eprintln!(
        "CELL client/h2-rapid-reset | GOAWAY {code:?} | closed={closed} after {} ms | {reached} of 1000 streams reached the gateway",
        took.as_millis()
    );
    assert!(closed, "[h2-rapid-reset] the connection stayed open");
    assert_eq!(
        code,
        Some(0xb),
        "[h2-rapid-reset] GOAWAY ENHANCE_YOUR_CALM expected"
    );
    assert!(
        reached <= 100,
        "[h2-rapid-reset] {reached} streams reached the gateway"
    );
    env.assert_healthy("h2-rapid-reset").await;
}

/// Ten thousand SETTINGS frames: each is acknowledged in turn (h2 reads no further
/// before its ACK is written), so a client that does not read stalls only itself; the
/// connection carries no request and is closed by the first-request bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_settings_flood_is_bounded() {
    let env = Env::start(&[]).await;
    let mut bytes = PREFACE.to_vec();
    for _ in 0..10_000 {
        bytes.extend(frame(0x4, 0, 0, &[]));
    }
    // A flooder that never reads: the server stops reading once its ACKs fill the
    // socket, and drops the connection at the same bound.
    let silent = {
        let (addr, bytes) = (env.addr(), bytes.clone());
        tokio::spawn(async move {
            let t0 = Instant::now();
            let stream = TcpStream::connect(addr).await.unwrap();
            let (mut rd, mut wr) = stream.into_split();
            let writer = tokio::spawn(async move {
                let _ = wr.write_all(&bytes).await;
                wr
            });
            tokio::time::sleep(Duration::from_millis(HEADER_READ_MS) + CLOSE_GRACE).await;
            let mut sink = Vec::new();
            let closed = tokio::time::timeout(MARGIN, rd.read_to_end(&mut sink))
                .await
                .is_ok();
            writer.abort();
            (closed, t0.elapsed())
        })
    };
    let (out, took, closed) = h2_raw(env.addr(), &bytes, Duration::from_secs(10)).await;
    let code = goaway(&out);
    eprintln!(
        "CELL client/h2-settings-flood | GOAWAY {code:?} | closed={closed} after {} ms | {} bytes back",
        took.as_millis(),
        out.len()
    );
    assert_eq!(
        code,
        Some(0),
        "[h2-settings-flood] GOAWAY NO_ERROR expected"
    );
    assert!(closed, "[h2-settings-flood] the connection stayed open");
    assert!(
        took < Duration::from_millis(HEADER_READ_MS) + CLOSE_GRACE + MARGIN,
        "[h2-settings-flood] open for {took:?}"
    );
    let (silent_closed, silent_took) = silent.await.unwrap();
    eprintln!(
        "CELL client/h2-settings-flood-no-reads | closed={silent_closed} within {} ms",
        silent_took.as_millis()
    );
    assert!(
        silent_closed,
        "[h2-settings-flood-no-reads] the connection stayed open"
    );
    env.assert_healthy("h2-settings-flood").await;
}

/// HTTP/2 requests still work on a fresh connection during all this (the flood tests
/// above leave nothing behind): a prior-knowledge request through the raw frames.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_prior_knowledge_is_served() {
    let env = Env::start(&[]).await;
    let mut bytes = PREFACE.to_vec();
    bytes.extend(frame(0x4, 0, 0, &[]));
    bytes.extend(get_headers(1, "/h2-ok"));
    let (out, _, _) = h2_raw(env.addr(), &bytes, Duration::from_secs(2)).await;
    assert!(out.len() > 9, "no answer frames");
    assert!(
        eventually(Duration::from_secs(2), || env.gateway_saw("GET /h2-ok ")
            == 1)
        .await,
        "the h2 request did not reach the gateway"
    );
}

// ---------------------------------------------------------------------------------------
// Abrupt client disconnects.

/// Clients that vanish mid-exchange leak nothing: the gateway connection of an abandoned
/// passthrough download is closed, in-flight and buffered gauges return to zero, no
/// per-user slot stays taken (the same user then runs two slow requests side by side at
/// `listen.max_in_flight_per_user = 2`), and `/ready` stays 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abrupt_client_disconnects_leak_nothing() {
    let env = Env::start(&[]).await;
    let user = "CANARY-SUB-disconnect";
    let auth = format!("Bearer {}", token(user));

    // 1. A passthrough download without end, abandoned after 1 MiB.
    let cell = "client/disconnect/passthrough-download";
    let r = support::exchange_capped(env.addr(), &get_request("/endless", &[]), HUNG, 1024 * 1024)
        .await;
    assert_eq!(r.status, 200, "[{cell}]");
    let gone = eventually(Duration::from_secs(3), || {
        env.gateway.open_connections() == 0 && env.gateway.peer_gone() >= 1
    })
    .await;
    eprintln!("CELL {cell} | 200 | gateway connection closed={gone}");
    assert!(gone, "[{cell}] the gateway connection was kept open");
    env.assert_healthy(cell).await;

    // 2. REST requests on a slow note, abandoned before the answer.
    let cell = "client/disconnect/rest-mid-request";
    for _ in 0..4 {
        let mut s = TcpStream::connect(env.addr()).await.unwrap();
        s.write_all(&rest(user, "slow.md")).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(s);
    }
    let t0 = Instant::now();
    let mut zero = false;
    while t0.elapsed() < Duration::from_millis(CANISTER_MS) + MARGIN {
        if env.sidecar.metrics().await.get(IN_FLIGHT) == 0.0 {
            zero = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "CELL {cell} | in-flight back to 0 after {} ms",
        t0.elapsed().as_millis()
    );
    assert!(zero, "[{cell}] in-flight gauge stuck");
    // No slot leaked: two slow requests of the same user side by side both succeed.
    let addr = env.addr();
    let a = tokio::spawn(async move { exchange(addr, &rest(user, "slow.md"), HUNG).await });
    let b = tokio::spawn(async move { exchange(addr, &rest(user, "slow.md"), HUNG).await });
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    assert_eq!(
        (a.status, b.status),
        (200, 200),
        "[{cell}] {} / {}",
        a.all_text(),
        b.all_text()
    );
    env.assert_healthy(cell).await;

    // 3. A `POST /mcp` body cut off halfway: the buffered bytes are given back.
    let cell = "client/disconnect/mcp-mid-body";
    let mut s = TcpStream::connect(env.addr()).await.unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nAccept: {ACCEPT_BOTH}\r\nContent-Type: application/json\r\nContent-Length: 60000\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(&[b' '; 30_000]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let held = env.sidecar.metrics().await.get(BUFFERED);
    drop(s);
    eprintln!("CELL {cell} | {held} bytes buffered before the client left");
    env.assert_healthy(cell).await;

    // 4. The tool on a slow note, abandoned before the answer.
    let cell = "client/disconnect/mcp-tool-mid-request";
    let init = post_request(
        "/mcp",
        &[("Authorization", &auth), ("Accept", ACCEPT_BOTH)],
        INIT,
    );
    let r = exchange(env.addr(), &init, HUNG).await;
    assert_eq!(
        r.header("mcp-session-id"),
        Some(SESSION),
        "[{cell}] {}",
        r.all_text()
    );
    let call = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_section_source","arguments":{"path":"slow.md"}}}).to_string();
    let request = post_request(
        "/mcp",
        &[
            ("Authorization", &auth),
            ("Accept", ACCEPT_BOTH),
            ("Mcp-Session-Id", SESSION),
        ],
        &call,
    );
    for _ in 0..2 {
        let mut s = TcpStream::connect(env.addr()).await.unwrap();
        s.write_all(&request).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(s);
    }
    env.assert_healthy(cell).await;
    let r = exchange(env.addr(), &request, HUNG).await;
    assert_eq!(r.status, 200, "[{cell}] {}", r.all_text());
    assert!(
        r.text().contains("knowtation.section_source/v0"),
        "[{cell}] {}",
        r.all_text()
    );

    // 5. HTTP/2: the tool's REST twin on a slow note, the stream reset mid-request.
    let cell = "client/disconnect/h2-stream-reset";
    let tcp = TcpStream::connect(env.addr()).await.unwrap();
    let (mut h2, conn) = h2::client::handshake(tcp).await.unwrap();
    let conn = tokio::spawn(conn);
    for _ in 0..4 {
        let req = http::Request::get(format!(
            "http://{}/api/v1/section-source?path=slow.md",
            env.addr()
        ))
        .header("authorization", &auth)
        .header("x-vault-id", "default")
        .body(())
        .unwrap();
        h2 = h2.ready().await.unwrap();
        let (response, mut stream) = h2.send_request(req, true).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        stream.send_reset(h2::Reason::CANCEL);
        drop(response);
    }
    let t0 = Instant::now();
    let mut zero = false;
    while t0.elapsed() < Duration::from_millis(CANISTER_MS) + MARGIN {
        if env.sidecar.metrics().await.get(IN_FLIGHT) == 0.0 {
            zero = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "CELL {cell} | in-flight back to 0 after {} ms",
        t0.elapsed().as_millis()
    );
    assert!(zero, "[{cell}] in-flight gauge stuck");
    // The same connection still serves, and the user's slots are free.
    let req = http::Request::get(format!(
        "http://{}/api/v1/section-source?path=n.md",
        env.addr()
    ))
    .header("authorization", &auth)
    .header("x-vault-id", "default")
    .body(())
    .unwrap();
    h2 = h2.ready().await.unwrap();
    let (response, _) = h2.send_request(req, true).unwrap();
    let response = tokio::time::timeout(HUNG, response).await.unwrap().unwrap();
    assert_eq!(response.status(), 200, "[{cell}]");
    drop(h2);
    conn.abort();
    let addr = env.addr();
    let a = tokio::spawn(async move { exchange(addr, &rest(user, "slow.md"), HUNG).await });
    let b = tokio::spawn(async move { exchange(addr, &rest(user, "slow.md"), HUNG).await });
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    assert_eq!((a.status, b.status), (200, 200), "[{cell}]");
    env.assert_healthy(cell).await;

    let log = env.sidecar.stop();
    assert_no_canary("client/disconnect", "the whole log", &log);
}
