//! The door holds: one socket-level test per way the choke point was walked around or
//! switched off (wire contract §2, §5, §6 Deviations). A real sidecar (`proxy::start`) on
//! loopback in front of the test-kit gateway, canister and bridge; every test counts what
//! reached each upstream.

// Test code: a failed unwrap is a failed test, which is what we want here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request};
use knowtation_sidecar::config::{Config, Secret};
use knowtation_sidecar::proxy::{self, Running};
use knowtation_testkit::client::{self, Collected};
use knowtation_testkit::Reply as BridgeReply;
use knowtation_testkit::{sign_token, unix_now, MockBridge, MockCanister, MockGateway};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SECRET: &str = "door-test-secret-0123456789abcdef";
const VAULT: &str = "default";
const ACCEPT: &str = "application/json, text/event-stream";
const INIT: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#;

fn token(sub: &str) -> String {
    sign_token(
        SECRET,
        json!({"sub": sub, "type": "mcp_access", "scopes": ["vault:read", "vault:write"], "exp": unix_now() + 3600}),
    )
}

struct Env {
    gw: MockGateway,
    canister: MockCanister,
    bridge: MockBridge,
    sidecar: Running,
}

impl Env {
    async fn start_with(f: impl FnOnce(&mut Config)) -> Env {
        let gw = MockGateway::start().await;
        let canister = MockCanister::start().await;
        let bridge = MockBridge::start().await;
        canister.insert_note(VAULT, "a.md", &json!({}), "# A\n\nbody\n");
        let mut c = Config::default();
        c.listen.address = "127.0.0.1:0".parse().unwrap();
        c.admin.address = "127.0.0.1:0".parse().unwrap();
        c.upstream.gateway_url = gw.url();
        c.upstream.canister_url = Some(canister.url());
        c.upstream.bridge_url = Some(bridge.url());
        c.auth.jwt_secrets = vec![Secret::new(SECRET)];
        c.shutdown.drain_seconds = 1;
        c.log.level = "warn".to_owned();
        f(&mut c);
        let sidecar = proxy::start(c).await.expect("sidecar starts");
        Env {
            gw,
            canister,
            bridge,
            sidecar,
        }
    }

    async fn start() -> Env {
        Env::start_with(|_| {}).await
    }

    fn addr(&self) -> SocketAddr {
        self.sidecar.listen_addr
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr())
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Collected {
        let (addr, req) = client::request(method, &self.url(path), headers, body).unwrap();
        client::send(addr, req).await.unwrap()
    }

    async fn post(&self, sub: &str, session: Option<&str>, ct: &str, body: &str) -> Collected {
        let auth = format!("Bearer {}", token(sub));
        let mut h = vec![
            ("authorization", auth.as_str()),
            ("accept", ACCEPT),
            ("content-type", ct),
        ];
        if let Some(s) = session {
            h.push(("mcp-session-id", s));
        }
        self.send(Method::POST, "/mcp", &h, body.to_owned()).await
    }

    /// A JSON `POST /mcp` in `session` with a `Content-Encoding`.
    async fn post_encoded(
        &self,
        sub: &str,
        session: &str,
        encoding: &str,
        body: Bytes,
    ) -> Collected {
        let auth = format!("Bearer {}", token(sub));
        let h = [
            ("authorization", auth.as_str()),
            ("accept", ACCEPT),
            ("content-type", "application/json"),
            ("content-encoding", encoding),
            ("mcp-session-id", session),
        ];
        self.send(Method::POST, "/mcp", &h, body).await
    }

    async fn initialize(&self, sub: &str) -> Collected {
        self.post(sub, None, "application/json", INIT).await
    }

    async fn session(&self, sub: &str) -> String {
        let r = self.initialize(sub).await;
        assert_eq!(r.status, 200, "{}", r.text());
        r.header("mcp-session-id").unwrap().to_owned()
    }

    async fn rest(&self, sub: &str, path: &str) -> Collected {
        let auth = format!("Bearer {}", token(sub));
        self.send(
            Method::GET,
            path,
            &[("authorization", &auth), ("x-vault-id", VAULT)],
            Bytes::new(),
        )
        .await
    }

    /// `POST /mcp` bodies the gateway received, as text.
    fn gateway_posts(&self) -> Vec<String> {
        self.gw
            .requests()
            .into_iter()
            .filter(|r| r.method == Method::POST)
            .map(|r| r.body_text())
            .collect()
    }

    /// The promise: no request that names a view's tool ever reached the gateway.
    fn assert_tool_never_forwarded(&self) {
        for body in self.gateway_posts() {
            for name in TOOLS {
                assert!(!body.contains(name), "forwarded: {body}");
            }
        }
    }

    fn metric(&self, name: &str) -> f64 {
        let text = self.sidecar.metrics().encode();
        text.lines()
            .find(|l| l.starts_with(name) && !l.starts_with('#'))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    }
}

// ---------------------------------------------------------------------------------------
// Finding 1: a `__proto__` key (zod copies keys by assignment).

/// The tools of the three body-free views: every finding about the tool holds for each.
const TOOLS: [&str; 3] = [
    "get_section_source",
    "get_note_outline",
    "get_document_tree",
];

/// A view's schema name as it appears (escaped) in a tool result, for each tool.
const SCHEMAS: [&str; 3] = ["section_source", "note_outline", "document_tree"];

/// The REST routes of the views that have one.
const ROUTES: [&str; 2] = ["section-source", "note-outline"];

#[tokio::test]
async fn finding_1_prototype_keys_are_refused_at_the_door() {
    let env = Env::start().await;
    let session = env.session("alice").await;
    let bodies: Vec<String> = TOOLS.iter().flat_map(|name| [
        format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"__proto__":{{"name":"{name}"}},"arguments":{{"path":"a.md"}}}}}}"#),
        format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"\u005f_proto__":{{"name":"{name}"}},"arguments":{{"path":"a.md"}}}}}}"#),
        format!(r#"[{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"__proto__":{{"name":"{name}"}},"arguments":{{"path":"a.md"}}}}}}]"#),
        format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"__proto__":{{"name":"{name}","arguments":{{"path":"a.md"}}}}}}}}"#),
    ]).collect();
    for body in &bodies {
        let r = env
            .post("alice", Some(&session), "application/json", body)
            .await;
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert_eq!(
            r.json(),
            json!({"error": "Invalid JSON body", "code": "INTERNAL_ERROR"})
        );
    }
    // Only the `initialize` reached the gateway.
    assert_eq!(env.gateway_posts().len(), 1);
    env.assert_tool_never_forwarded();
}

// ---------------------------------------------------------------------------------------
// Finding 2: charset confusion (body-parser keeps the last `charset` and decodes UTF-7).

#[tokio::test]
async fn finding_2_only_plain_utf8_json_passes_the_door() {
    let env = Env::start().await;
    let session = env.session("alice").await;
    for name in TOOLS {
        let utf7 = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"{}","arguments":{{"path":"a.md"}}}}}}"#,
            name.replace('_', "+AF8-")
        );
        for ct in [
            "application/json; charset=utf-8; charset=utf-7",
            "application/json; x=\"; charset=utf-8\"; charset=utf-7",
            "application/json; charset=utf-7",
            "application/json; charset=utf-16",
            "text/plain",
        ] {
            let r = env.post("alice", Some(&session), ct, &utf7).await;
            assert_eq!(r.status, 415, "{name} {ct}: {}", r.text());
        }
    }
    let utf7 = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get+AF8-section+AF8-source","arguments":{"path":"a.md"}}}"#;
    for ct in [
        "application/json; charset=utf-8; charset=utf-7",
        "application/json; x=\"; charset=utf-8\"; charset=utf-7",
        "application/json; charset=utf-7",
        "application/json; charset=utf-16",
        "text/plain",
    ] {
        let r = env.post("alice", Some(&session), ct, utf7).await;
        assert_eq!(r.status, 415, "{ct}: {}", r.text());
    }
    // The same body under plain JSON is an ordinary call of an unknown tool: forwarded,
    // and what is forwarded is the sidecar's canonical serialization.
    let r = env
        .post(
            "alice",
            Some(&session),
            "application/json; charset=UTF-8",
            &format!(" {utf7} "),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let posts = env.gw.requests();
    let last = posts.last().unwrap();
    assert_eq!(last.header("content-type"), Some("application/json"));
    assert_eq!(last.body_text(), utf7);
    assert_eq!(
        last.header("content-length"),
        Some(utf7.len().to_string().as_str())
    );
    env.assert_tool_never_forwarded();
}

#[tokio::test]
async fn forwarded_bodies_are_the_sidecars_own_serialization() {
    let env = Env::start().await;
    let session = env.session("alice").await;
    // Repeated keys resolve as JSON.parse does; numbers as JavaScript prints them;
    // whitespace is gone; an identity Content-Encoding is dropped.
    let body = "{ \"jsonrpc\":\"2.0\", \"id\": 1.0, \"method\":\"tools/call\", \"params\": {\"name\":\"get_section_source\",\"arguments\":{\"path\":\"a.md\"},\"name\":\"search\"} }";
    let r = env
        .post_encoded(
            "alice",
            &session,
            "identity",
            Bytes::from_static(body.as_bytes()),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let last = env.gw.requests().pop().unwrap();
    assert_eq!(
        last.body_text(),
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search","arguments":{"path":"a.md"}}}"#
    );
    assert_eq!(last.header("content-encoding"), None);
    // A compressed body is refused, never inflated or forwarded.
    let r = env
        .post_encoded(
            "alice",
            &session,
            "gzip",
            Bytes::from_static(b"\x1f\x8b\x08\x00"),
        )
        .await;
    assert_eq!(r.status, 415);
    env.assert_tool_never_forwarded();
}

// ---------------------------------------------------------------------------------------
// Findings 3 and 4: nothing scarce for the unauthenticated.

/// Opens `n` HTTP/1.1 connections that each announce `announced` body bytes on
/// `POST /mcp` with `auth` (if any) and send one byte; returns the streams.
async fn slow_posts(
    addr: SocketAddr,
    n: usize,
    auth: Option<&str>,
    announced: usize,
) -> Vec<TcpStream> {
    let mut out = Vec::new();
    for _ in 0..n {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let auth = auth.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
        let head = format!(
            "POST /mcp HTTP/1.1\r\nHost: x\r\n{auth}Accept: {ACCEPT}\r\nContent-Type: application/json\r\nContent-Length: {announced}\r\n\r\n{{"
        );
        s.write_all(head.as_bytes()).await.unwrap();
        out.push(s);
    }
    out
}

/// Reads what the sidecar answered on `s` within `within` (empty when nothing came).
async fn answer(s: &mut TcpStream, within: Duration) -> String {
    let mut buf = vec![0u8; 4096];
    match tokio::time::timeout(within, s.read(&mut buf)).await {
        Ok(Ok(n)) => String::from_utf8_lossy(&buf[..n]).into_owned(),
        _ => String::new(),
    }
}

/// Another user's REST read and MCP `initialize` both answer within a second.
async fn others_are_served(env: &Env) {
    let t = Instant::now();
    let r = env.rest("bob", "/api/v1/section-source?path=a.md").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = env.initialize("carol").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
}

#[tokio::test]
async fn finding_3_slow_unauthenticated_bodies_hold_no_slot() {
    let env = Env::start_with(|c| c.listen.max_in_flight = 8).await;
    let mut flood = slow_posts(env.addr(), 40, None, 1000).await;
    // Each is answered 401 at once, without the body.
    for s in &mut flood {
        let a = answer(s, Duration::from_secs(2)).await;
        assert!(a.starts_with("HTTP/1.1 401"), "{a}");
        assert!(a.to_ascii_lowercase().contains("connection: close"), "{a}");
    }
    others_are_served(&env).await;
    assert_eq!(
        env.gateway_posts().len(),
        1,
        "only carol's initialize passed"
    );
}

#[tokio::test]
async fn finding_3_slow_bodies_from_one_user_hold_only_their_share() {
    let env = Env::start_with(|c| {
        c.listen.max_in_flight = 16;
        c.listen.max_in_flight_per_user = 4;
        c.listen.body_read_timeout_ms = 30_000;
    })
    .await;
    let t = token("mallory");
    let mut flood = slow_posts(env.addr(), 20, Some(&t), 1000).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut refused = 0;
    for s in &mut flood {
        let a = answer(s, Duration::from_millis(50)).await;
        if a.starts_with("HTTP/1.1 503") {
            assert!(a.to_ascii_lowercase().contains("retry-after: 1"), "{a}");
            refused += 1;
        }
    }
    assert_eq!(refused, 16, "all but the user's 4 slots refused");
    others_are_served(&env).await;
    assert_eq!(
        env.metric("knowtation_sidecar_admission_refused_total{reason=\"user_in_flight\"}"),
        16.0
    );
}

#[tokio::test]
async fn finding_3_a_body_that_never_arrives_times_out() {
    let env = Env::start_with(|c| c.listen.body_read_timeout_ms = 300).await;
    let t = token("mallory");
    let mut slow = slow_posts(env.addr(), 1, Some(&t), 1000).await;
    let a = answer(&mut slow[0], Duration::from_secs(3)).await;
    assert!(a.starts_with("HTTP/1.1 408"), "{a}");
    assert_eq!(
        env.metric("knowtation_sidecar_intercepted_requests_total{outcome=\"body_timeout\",surface=\"mcp\"}"),
        1.0
    );
}

#[tokio::test]
async fn finding_3_idle_http2_streams_without_a_token_hold_nothing() {
    let env = Env::start_with(|c| c.listen.max_in_flight = 8).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        let tcp = TcpStream::connect(env.addr()).await.unwrap();
        let (mut h2, conn) = h2::client::handshake(tcp).await.unwrap();
        tokio::spawn(conn);
        for _ in 0..20 {
            let req = Request::post(env.url("/mcp"))
                .header("content-type", "application/json")
                .header("content-length", "1000")
                .body(())
                .unwrap();
            h2 = h2.ready().await.unwrap();
            // The body is never sent: each stream stays open from the client's side.
            let (response, stream) = h2.send_request(req, false).unwrap();
            held.push((response, stream));
        }
    }
    for (response, _) in held.iter_mut().take(8) {
        let r = tokio::time::timeout(Duration::from_secs(2), response)
            .await
            .expect("answered at once")
            .unwrap();
        assert_eq!(r.status(), 401);
    }
    others_are_served(&env).await;
}

/// The buffered-bytes gauge, sampled every millisecond from the moment this is made
/// until it is dropped: what was held while requests were open, not only after.
struct BufferedPeak {
    peak: Arc<AtomicI64>,
    task: tokio::task::JoinHandle<()>,
}

impl BufferedPeak {
    fn watch(env: &Env) -> BufferedPeak {
        let gauge = env.sidecar.metrics().buffered_bytes_gauge().unwrap();
        let peak = Arc::new(AtomicI64::new(0));
        let seen = Arc::clone(&peak);
        let task = tokio::spawn(async move {
            loop {
                seen.fetch_max(gauge.get(), Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        BufferedPeak { peak, task }
    }

    fn peak(&self) -> f64 {
        self.peak.load(Ordering::SeqCst) as f64
    }
}

impl Drop for BufferedPeak {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Waits (at most 5 s) until the buffered-bytes gauge shows `bytes`.
async fn buffered_reaches(env: &Env, bytes: f64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while env.metric("knowtation_sidecar_buffered_body_bytes") != bytes {
        assert!(
            Instant::now() < deadline,
            "buffered bytes {} never reached {bytes}",
            env.metric("knowtation_sidecar_buffered_body_bytes")
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn finding_4_unauthenticated_bodies_are_never_buffered() {
    let env = Env::start().await;
    let peak = BufferedPeak::watch(&env);
    let mut flood = slow_posts(env.addr(), 32, None, 4 * 1024 * 1024).await;
    // Send most of each body; the sidecar must not be reading it.
    let chunk = vec![b' '; 256 * 1024];
    for s in &mut flood {
        let _ = tokio::time::timeout(Duration::from_millis(50), s.write_all(&chunk)).await;
    }
    // Read while every request is still open on the client's side.
    assert_eq!(env.metric("knowtation_sidecar_buffered_body_bytes"), 0.0);
    for s in &mut flood {
        let a = answer(s, Duration::from_secs(2)).await;
        assert!(a.starts_with("HTTP/1.1 401"), "{a}");
    }
    assert_eq!(peak.peak(), 0.0, "bodies without a token were buffered");
    assert_eq!(env.metric("knowtation_sidecar_buffered_body_bytes"), 0.0);
    others_are_served(&env).await;
}

/// One user's bodies are held up to `listen.max_buffered_bytes_per_user` while they are
/// open, never beyond: the body that would cross it is refused at once, and what the
/// admitted bodies hold stays exactly theirs.
#[tokio::test]
async fn finding_4_one_users_buffered_bytes_are_capped() {
    const MIB: usize = 1024 * 1024;
    let env = Env::start_with(|c| {
        c.mcp.max_body_bytes = MIB;
        c.listen.max_buffered_bytes_per_user = 2 * MIB;
        c.listen.max_buffered_bytes = 8 * MIB;
        c.listen.max_in_flight_per_user = 16;
    })
    .await;
    let peak = BufferedPeak::watch(&env);
    let t = token("mallory");
    // Eight bodies of 1 MiB announced, each with its first byte sent and held.
    let mut flood = slow_posts(env.addr(), 8, Some(&t), MIB).await;
    buffered_reaches(&env, 8.0).await;
    // Two of them grow to 5 bytes short of their length: 2 MiB - 10 bytes, plus the six
    // first bytes of the others, is 4 bytes under the user's share.
    let piece = vec![b' '; MIB - 6];
    for s in &mut flood[..2] {
        s.write_all(&piece).await.unwrap();
    }
    let admitted = 2.0 * (MIB - 5) as f64;
    buffered_reaches(&env, admitted + 6.0).await;
    // Each of the others sends 4 KiB more than the share has room for: refused at once,
    // its first byte given back, while the two admitted bodies stay open and held.
    for (i, s) in flood[2..].iter_mut().enumerate() {
        s.write_all(&[b' '; 4096]).await.unwrap();
        let a = answer(s, Duration::from_secs(2)).await;
        assert!(a.starts_with("HTTP/1.1 503"), "body {}: {a:?}", i + 2);
        buffered_reaches(&env, admitted + (5 - i) as f64).await;
    }
    assert!(
        peak.peak() <= 2.0 * MIB as f64,
        "{} bytes held for one user",
        peak.peak()
    );
    for s in &mut flood[..2] {
        let open = tokio::time::timeout(Duration::from_millis(1), s.read(&mut [0u8; 1])).await;
        assert!(open.is_err(), "an admitted body was answered: {open:?}");
    }
    others_are_served(&env).await;
}

// ---------------------------------------------------------------------------------------
// Finding 5: HTTP/2 PINGs do not keep a connection.

#[tokio::test]
async fn finding_5_a_ping_only_connection_is_closed() {
    let env = Env::start_with(|c| {
        c.listen.idle_timeout_seconds = 1;
        c.listen.header_read_timeout_ms = 500;
    })
    .await;
    let tcp = TcpStream::connect(env.addr()).await.unwrap();
    let (client, mut conn) = h2::client::handshake(tcp).await.unwrap();
    let mut ping = conn.ping_pong().expect("ping_pong");
    let pinger = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if ping.ping(h2::Ping::opaque()).await.is_err() {
                return;
            }
        }
    });
    let t = Instant::now();
    // The connection future ends when the server closes it (GOAWAY, then EOF).
    let closed = tokio::time::timeout(Duration::from_secs(8), conn).await;
    assert!(closed.is_ok(), "still open after {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(7), "{:?}", t.elapsed());
    pinger.abort();
    drop(client);
}

#[tokio::test]
async fn finding_5_idle_after_a_request_is_closed_despite_pings() {
    let env = Env::start_with(|c| c.listen.idle_timeout_seconds = 1).await;
    let tcp = TcpStream::connect(env.addr()).await.unwrap();
    let (h2, mut conn) = h2::client::handshake(tcp).await.unwrap();
    let mut ping = conn.ping_pong().expect("ping_pong");
    let conn = tokio::spawn(conn);
    let mut h2 = h2.ready().await.unwrap();
    let (response, _) = h2
        .send_request(Request::get(env.url("/x")).body(()).unwrap(), true)
        .unwrap();
    let r = response.await.unwrap();
    assert_eq!(r.status(), 200);
    drop(r);
    let pinger = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if ping.ping(h2::Ping::opaque()).await.is_err() {
                return;
            }
        }
    });
    let closed = tokio::time::timeout(Duration::from_secs(8), conn).await;
    assert!(closed.is_ok(), "a PING-only connection stayed open");
    pinger.abort();
}

// ---------------------------------------------------------------------------------------
// Finding 6: bridge lookups are bounded per user.

#[tokio::test]
async fn finding_6_distinct_vaults_do_not_multiply_bridge_calls() {
    let env = Env::start_with(|c| {
        c.hosted_context.max_lookups_per_user_per_minute = 10;
        c.rate_limit.per_user_per_minute = 6000;
        c.rate_limit.burst = 1000;
    })
    .await;
    let auth = format!("Bearer {}", token("alice"));
    let mut limited = 0;
    for i in 0..300 {
        let vault = format!("v{i}");
        let r = env
            .send(
                Method::GET,
                "/api/v1/section-source?path=a.md",
                &[("authorization", &auth), ("x-vault-id", &vault)],
                Bytes::new(),
            )
            .await;
        if r.status == 429 {
            assert!(r.header("retry-after").is_some());
            limited += 1;
        }
    }
    assert!(env.bridge.count() <= 10, "{}", env.bridge.count());
    assert!(limited >= 290, "{limited}");
}

/// `n` vaults the bridge allows, each holding `a.md`: a request in a vault not asked
/// about before finds the hosted-context cache cold, so every lookup is a bridge call.
fn cold_vaults(env: &Env, n: usize) -> Vec<String> {
    let vaults: Vec<String> = (0..n).map(|i| format!("cold{i}")).collect();
    env.bridge.set_json(&json!({
        "allowed_vault_ids": vaults,
        "scope": null,
        "role": "editor",
    }));
    for v in &vaults {
        env.canister
            .insert_note(v, "a.md", &json!({}), "# A\n\nbody\n");
    }
    vaults
}

/// The REST rate limit comes before the hosted-context lookup and the canister read:
/// with the cache cold, a limited request costs neither.
#[tokio::test]
async fn finding_6_the_rest_rate_limit_comes_before_the_lookup() {
    let env = Env::start_with(|c| {
        c.rate_limit.per_user_per_minute = 1;
        c.rate_limit.burst = 3;
        c.hosted_context.max_lookups_per_user_per_minute = 1000;
    })
    .await;
    let auth = format!("Bearer {}", token("alice"));
    let mut statuses = Vec::new();
    for vault in cold_vaults(&env, 20) {
        let r = env
            .send(
                Method::GET,
                "/api/v1/section-source?path=a.md",
                &[("authorization", &auth), ("x-vault-id", &vault)],
                Bytes::new(),
            )
            .await;
        statuses.push(r.status.as_u16());
    }
    let served = statuses.iter().filter(|s| **s == 200).count();
    let limited = statuses.iter().filter(|s| **s == 429).count();
    assert_eq!((served, limited), (3, 17), "{statuses:?}");
    assert_eq!(
        env.bridge.count(),
        served,
        "a limited request cost a lookup"
    );
    assert_eq!(
        env.canister.count(),
        served,
        "a limited request cost a read"
    );
}

/// The MCP window comes before the lookup of `initialize` and before the canister read
/// of a tool call: with the cache cold, a refused request costs neither.
#[tokio::test]
async fn finding_6_the_mcp_window_comes_before_the_lookup_and_the_read() {
    let env = Env::start_with(|c| {
        c.mcp.calls_per_minute = 4;
        c.hosted_context.max_lookups_per_user_per_minute = 1000;
    })
    .await;
    let vaults = cold_vaults(&env, 10);
    let auth = format!("Bearer {}", token("alice"));
    let mut statuses = Vec::new();
    for vault in &vaults {
        let r = env
            .send(
                Method::POST,
                "/mcp",
                &[
                    ("authorization", &auth),
                    ("accept", ACCEPT),
                    ("content-type", "application/json"),
                    ("x-vault-id", vault),
                ],
                INIT,
            )
            .await;
        statuses.push(r.status.as_u16());
    }
    assert_eq!(statuses, [[200; 4].as_slice(), &[429; 6]].concat());
    assert_eq!(env.bridge.count(), 4, "a refused initialize cost a lookup");

    // Another caller: one session (one lookup, one place in the window), then calls.
    let session = env.session("bob").await;
    let mut statuses = Vec::new();
    for _ in 0..10 {
        let r = env
            .post(
                "bob",
                Some(&session),
                "application/json",
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_section_source","arguments":{"path":"a.md"}}}"#,
            )
            .await;
        statuses.push(r.status.as_u16());
    }
    assert_eq!(statuses, [[200; 3].as_slice(), &[429; 7]].concat());
    assert_eq!(env.canister.count(), 3, "a refused call cost a read");
    env.assert_tool_never_forwarded();
}

#[tokio::test]
async fn finding_6_failed_lookups_are_cached_and_initialize_counts() {
    let env = Env::start_with(|c| c.mcp.calls_per_minute = 100).await;
    env.bridge.set_status(500);
    for _ in 0..100 {
        let r = env.initialize("alice").await;
        assert_eq!(r.status, 403, "{}", r.text());
    }
    // One bridge call: the failure is remembered for `failure_cache_ttl_seconds`.
    assert_eq!(env.bridge.count(), 1);
    // The 101st request in the minute is refused by the window, before any lookup.
    let r = env.initialize("alice").await;
    assert_eq!(r.status, 429, "{}", r.text());
    assert!(env.gateway_posts().is_empty());
}

// ---------------------------------------------------------------------------------------
// Finding 7 and the defaults.

#[tokio::test]
async fn finding_7_a_2xx_error_body_is_a_failed_lookup() {
    let env = Env::start().await;
    env.bridge
        .set_reply(BridgeReply::json(200, &json!({"error": "nope"})));
    let r = env.rest("alice", "/api/v1/section-source?path=a.md").await;
    assert_eq!(r.status, 503, "{}", r.text());
    let r = env.initialize("bob").await;
    assert_eq!(r.status, 403, "{}", r.text());
    for (i, bad) in [
        json!({"allowed_vault_ids": ["default", 5]}),
        json!({"allowed_vault_ids": "default"}),
        json!({"allowed_vault_ids": ["default"], "effective_canister_user_id": 7}),
        json!({"allowed_vault_ids": ["default"], "effective_canister_user_id": null}),
    ]
    .into_iter()
    .enumerate()
    {
        env.bridge.set_reply(BridgeReply::json(200, &bad));
        // A new user each time: failures are cached per user and vault.
        let r = env
            .rest(&format!("dave{i}"), "/api/v1/section-source?path=a.md")
            .await;
        assert_eq!(r.status, 503, "{bad}: {}", r.text());
    }
    assert_eq!(env.canister.count(), 0);
}

#[tokio::test]
async fn finding_7_a_twice_prefixed_route_is_intercepted() {
    let env = Env::start().await;
    let prefix = "/.netlify/functions/gateway";
    for route in ROUTES {
        let r = env
            .rest(
                "alice",
                &format!("{prefix}{prefix}/api/v1/{route}?path=a.md"),
            )
            .await;
        assert_eq!(r.status, 200, "{route}: {}", r.text());
        assert!(r.text().starts_with("{\"schema\":\"knowtation."), "{route}");
    }
    let r = env.post("alice", None, "application/json", INIT).await;
    assert_eq!(r.status, 200);
    let session = r.header("mcp-session-id").unwrap().to_owned();
    let auth = format!("Bearer {}", token("alice"));
    for (name, schema) in TOOLS.iter().zip(SCHEMAS) {
        let r = env
            .send(
                Method::POST,
                &format!("{prefix}{prefix}/MCP/"),
                &[
                    ("authorization", &auth),
                    ("accept", ACCEPT),
                    ("content-type", "application/json"),
                    ("mcp-session-id", &session),
                ],
                format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"{name}","arguments":{{"path":"a.md"}}}}}}"#),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.text().contains(schema), "{name}: {}", r.text());
    }
    env.assert_tool_never_forwarded();
    assert!(env.gw.requests().iter().all(|r| {
        let path = r.path().to_ascii_lowercase();
        !path.contains("section-source") && !path.contains("note-outline")
    }));
}

// ---------------------------------------------------------------------------------------
// Finding 8: a hop that decodes escapes between the sidecar and the gateway. nginx with a
// URI in `proxy_pass` forwards `/mcp%2F` as `/mcp/`; a Netlify function is reported to see
// its path decoded, and Node's `url.parse` (Express's fallback for a path holding `#` or
// whitespace) then cuts at `?` or `#`, trims, reads `\` as `/` and takes a leading
// `//user@host` for an authority.

#[tokio::test]
async fn finding_8_paths_a_decoding_hop_makes_a_route_are_intercepted() {
    let env = Env::start().await;
    for (path, route) in [
        "/api/v1%2Fsection-source?path=a.md",
        "/api/v1/section-source%2F?path=a.md",
        "/api/v1/x%2F..%2Fsection-source?path=a.md",
        "/.netlify/functions/gateway%2Fapi%2Fv1%2Fsection-source?path=a.md",
        "/api/v1%252Fsection-source?path=a.md",
        "/api%5Cv1%5Csection-source?path=a.md",
        "/api\\v1\\section-source?path=a.md",
        "/api/v1/section-source%20?path=a.md",
        // Decoded to `//a@b/api/v1/section-source#`: url.parse takes `//a@b` for an
        // authority.
        "/%2Fa@b/api/v1/section-source%23?path=a.md",
        "/%5Ca@b/api/v1/section-source%23?path=a.md",
    ]
    .into_iter()
    .flat_map(|p| ROUTES.map(|route| (p.replace("section-source", route), route)))
    {
        let r = env.rest("alice", &path).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        let schema = route.replace('-', "_");
        assert!(r.text().contains(&schema), "{path}: {}", r.text());
    }
    // No query once the hop cuts the path at its decoded `?`: the sidecar refuses it.
    for route in ROUTES {
        let r = env
            .rest("alice", &format!("/api/v1/{route}%3Fpath=a.md"))
            .await;
        assert_eq!(r.status, 400, "{}", r.text());
    }

    let session = env.session("alice").await;
    let auth = format!("Bearer {}", token("alice"));
    for (name, schema) in TOOLS.iter().zip(SCHEMAS) {
        let call = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"{name}","arguments":{{"path":"a.md"}}}}}}"#
        );
        for path in [
            "/mcp%2F",
            "/mcp%2f",
            "/x%2F..%2Fmcp",
            "/.netlify/functions/gateway%2Fmcp",
            "/mcp%252F",
            "/mcp%23",
            "/mcp\\",
            "/%2Fa@b/mcp%23",
        ] {
            let r = env
                .send(
                    Method::POST,
                    path,
                    &[
                        ("authorization", &auth),
                        ("accept", ACCEPT),
                        ("content-type", "application/json"),
                        ("mcp-session-id", &session),
                    ],
                    call.clone(),
                )
                .await;
            assert_eq!(r.status, 200, "{path}: {}", r.text());
            assert!(r.text().contains(schema), "{name} {path}: {}", r.text());
        }
    }
    env.assert_tool_never_forwarded();
    for r in env.gw.requests() {
        let path = r.path().to_ascii_lowercase();
        assert!(
            !path.contains("section-source") && !path.contains("note-outline"),
            "reached the gateway: {path}"
        );
        assert!(
            r.method != Method::POST || !path.contains("mcp") || path == "/mcp",
            "reached the gateway: POST {path}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Finding 9: nothing bounded what the sidecar sends on to the gateway. Every forwarded
// request holds an upstream connection until its answer ends, and passthrough asks no
// token. Under the shipped 256 MiB memory limit, 5,000 unauthenticated passthrough `POST`s
// that never finish their bodies (about 50 KiB of the sidecar's memory each) got it
// OOM-killed, and HTTP/2 multiplies them: 20 connections of 100 such streams opened 2,000
// upstream connections. Requests at the gateway are now bounded, those without a token
// that verifies apart (`listen.max_forwarded_in_flight`,
// `listen.max_forwarded_in_flight_anonymous`): past a bound, 503 with `Retry-After` at
// once, nothing read or sent.

/// A passthrough `POST` whose body never ends, with `sub`'s token or none.
async fn slow_passthrough(addr: SocketAddr, sub: Option<&str>) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let auth = sub.map_or(String::new(), |u| {
        format!("Authorization: Bearer {}\r\n", token(u))
    });
    let head = format!(
        "POST /api/v1/notes HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s
}

/// A 503 `Service overloaded` with `Retry-After: 1` and, for an unread body, the close.
fn assert_overloaded(a: &str) {
    assert!(a.starts_with("HTTP/1.1 503"), "{a}");
    let lower = a.to_ascii_lowercase();
    assert!(lower.contains("retry-after: 1"), "{a}");
    assert!(lower.contains("connection: close"), "{a}");
    assert!(
        a.contains(r#"{"error":"Service overloaded","code":"SERVICE_UNAVAILABLE"}"#),
        "{a}"
    );
}

#[tokio::test]
async fn finding_9_requests_at_the_gateway_are_bounded() {
    let env = Env::start_with(|c| {
        c.listen.max_forwarded_in_flight = 3;
        c.listen.max_forwarded_in_flight_anonymous = 2;
    })
    .await;
    let session = env.session("alice").await;
    let alice = format!("Bearer {}", token("alice"));
    let with_token = [("authorization", alice.as_str())];

    // Without a token: two requests hold the anonymous room, the third is refused at once.
    let mut anonymous = Vec::new();
    for _ in 0..2 {
        anonymous.push(slow_passthrough(env.addr(), None).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut third = slow_passthrough(env.addr(), None).await;
    assert_overloaded(&answer(&mut third, Duration::from_secs(2)).await);
    let r = env
        .send(Method::GET, "/api/v1/echo", &[], Bytes::new())
        .await;
    assert_eq!(r.status, 503, "{}", r.text());
    // ...and takes nothing from callers whose token verifies.
    let r = env
        .send(Method::GET, "/api/v1/echo", &with_token, Bytes::new())
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(env.initialize("bob").await.status, 200);

    // With a token: three hold the room, the fourth is refused.
    let mut identified = Vec::new();
    for _ in 0..3 {
        identified.push(slow_passthrough(env.addr(), Some("carol")).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut fourth = slow_passthrough(env.addr(), Some("carol")).await;
    assert_overloaded(&answer(&mut fourth, Duration::from_secs(2)).await);
    // HTTP/2: one connection's streams get no more room than as many connections.
    let tcp = TcpStream::connect(env.addr()).await.unwrap();
    let (h2, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    for _ in 0..5 {
        let req = Request::get(env.url("/api/v1/echo"))
            .header("authorization", &alice)
            .body(())
            .unwrap();
        let mut h2 = h2.clone().ready().await.unwrap();
        let (response, _) = h2.send_request(req, true).unwrap();
        let r = tokio::time::timeout(Duration::from_secs(2), response)
            .await
            .expect("answered at once")
            .unwrap();
        assert_eq!(r.status(), 503);
    }
    // A call forwarded from the MCP door is refused in the door's own shape.
    let search = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"search","arguments":{"query":"q"}}}"#;
    let r = env
        .post("alice", Some(&session), "application/json", search)
        .await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    // The REST route is answered by the sidecar, within a budget of its own.
    let r = env.rest("bob", "/api/v1/section-source?path=a.md").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let refused = |reason: &str| {
        env.metric(&format!(
            "knowtation_sidecar_admission_refused_total{{reason=\"{reason}\"}}"
        ))
    };
    assert!(refused("anonymous_forwarded_in_flight") >= 2.0);
    assert!(refused("forwarded_in_flight") >= 7.0);
    // A place comes back when its request ends.
    drop(identified.pop());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = env
        .send(Method::GET, "/api/v1/echo", &with_token, Bytes::new())
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
}

/// Finding 9, one user: a caller whose token verifies gets at most
/// `listen.max_forwarded_in_flight_per_user` places at the gateway, so one token cannot
/// take every identified caller's room; over it, the same 503 at once, counted as
/// `user_forwarded_in_flight`, on passthrough and at the MCP door alike.
#[tokio::test]
async fn finding_9_one_user_cannot_take_every_place_at_the_gateway() {
    let env = Env::start_with(|c| {
        c.listen.max_forwarded_in_flight = 4;
        c.listen.max_forwarded_in_flight_per_user = 2;
    })
    .await;
    let carol_session = env.session("carol").await;
    let alice_session = env.session("alice").await;
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(slow_passthrough(env.addr(), Some("carol")).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut third = slow_passthrough(env.addr(), Some("carol")).await;
    assert_overloaded(&answer(&mut third, Duration::from_secs(2)).await);
    let search = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"search","arguments":{"query":"q"}}}"#;
    let r = env
        .post("carol", Some(&carol_session), "application/json", search)
        .await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    // Everyone else is served.
    let alice = format!("Bearer {}", token("alice"));
    let r = env
        .send(
            Method::GET,
            "/api/v1/echo",
            &[("authorization", alice.as_str())],
            Bytes::new(),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = env
        .post("alice", Some(&alice_session), "application/json", search)
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = env
        .send(Method::GET, "/api/v1/echo", &[], Bytes::new())
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let refused = |reason: &str| {
        env.metric(&format!(
            "knowtation_sidecar_admission_refused_total{{reason=\"{reason}\"}}"
        ))
    };
    assert_eq!(refused("user_forwarded_in_flight"), 2.0);
    assert_eq!(refused("forwarded_in_flight"), 0.0);
    // A place comes back when its request ends.
    drop(held.pop());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = env
        .post("carol", Some(&carol_session), "application/json", search)
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
}

/// An event stream from the gateway that stays open, asked for by `sub`; its answer head.
async fn event_stream(addr: SocketAddr, sub: &str) -> (TcpStream, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "GET /sse?n=2&gap_ms=30000 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nAccept: text/event-stream\r\n\r\n",
        token(sub)
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let a = answer(&mut s, Duration::from_secs(5)).await;
    (s, a)
}

/// Connected MCP clients each keep an event stream open at the gateway; they may hold
/// only `listen.max_event_streams` of the identified callers' places, so that requests
/// that end still find room (2,048 connected clients used to get every other signed-in
/// caller 503).
#[tokio::test]
async fn event_streams_leave_room_for_requests_that_end() {
    let env = Env::start_with(|c| {
        c.listen.max_forwarded_in_flight = 4;
        c.listen.max_event_streams = 2;
    })
    .await;
    let mut open = Vec::new();
    for sub in ["u1", "u2"] {
        let (s, a) = event_stream(env.addr(), sub).await;
        assert!(a.starts_with("HTTP/1.1 200"), "{a}");
        assert!(a.contains("text/event-stream"), "{a}");
        open.push(s);
    }
    let (_s, a) = event_stream(env.addr(), "u3").await;
    assert!(a.starts_with("HTTP/1.1 503"), "{a}");
    assert!(a.to_ascii_lowercase().contains("retry-after: 1"), "{a}");
    assert_eq!(
        env.metric("knowtation_sidecar_admission_refused_total{reason=\"event_streams\"}"),
        1.0
    );
    // Requests that end are served beside the streams.
    let auth = format!("Bearer {}", token("u4"));
    let r = env
        .send(
            Method::GET,
            "/api/v1/echo",
            &[("authorization", auth.as_str())],
            Bytes::new(),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    // A stream's place comes back when it ends.
    drop(open.pop());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_s, a) = event_stream(env.addr(), "u3").await;
    assert!(a.starts_with("HTTP/1.1 200"), "{a}");
}

/// A client with a small receive window that asks for `request` and then reads nothing.
async fn stalled_client(addr: SocketAddr, request: &str) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut s = socket.connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    s
}

/// Reads what `s` still delivers until it ends or `within` passes; the bytes read and
/// whether it ended.
async fn drain_for(s: &mut TcpStream, within: Duration) -> (usize, bool) {
    let mut n = 0;
    let mut buf = vec![0u8; 64 * 1024];
    let end = Instant::now() + within;
    loop {
        match tokio::time::timeout_at(end.into(), s.read(&mut buf)).await {
            Err(_) => return (n, false),
            Ok(Ok(0) | Err(_)) => return (n, true),
            Ok(Ok(k)) => n += k,
        }
    }
}

/// An answer nobody reads holds nothing forever: once the client has taken no bytes for
/// `listen.write_stall_timeout_ms`, the connection is closed, with the place its request
/// held at the gateway. Without the limit the answer flows in full as soon as the
/// client reads again.
#[tokio::test]
async fn a_client_that_stops_reading_is_closed_at_the_write_stall_limit() {
    let env = Env::start_with(|c| {
        c.listen.write_stall_timeout_ms = 500;
        c.listen.max_forwarded_in_flight_anonymous = 1;
    })
    .await;
    // 30 MB, far more than the socket buffers between the two hold.
    let request = "GET /big?bytes=30000000 HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut s = stalled_client(env.addr(), request).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (read, ended) = drain_for(&mut s, Duration::from_secs(10)).await;
    assert!(ended, "still open after {read} bytes");
    assert!(read < 29_000_000, "the whole answer came: {read} bytes");
    // The request's place at the gateway came back.
    let r = env
        .send(Method::GET, "/api/v1/echo", &[], Bytes::new())
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
}

/// A rewritten list answer is held in memory until the client has taken it: its bytes
/// count in the caller's buffered-bytes budget until then, and come back when the
/// stalled connection is closed.
#[tokio::test]
async fn a_list_answer_nobody_reads_counts_in_the_budget() {
    let env = Env::start_with(|c| c.listen.write_stall_timeout_ms = 3000).await;
    let tools: Vec<_> = (0..60_000)
        .map(|i| json!({"name": format!("tool-{i}"), "description": "x".repeat(40), "inputSchema": {"type": "object"}}))
        .collect();
    env.gw.set_mcp_tools(Some(tools));
    let session = env.session("alice").await;
    let body = r#"{"jsonrpc":"2.0","id":5,"method":"tools/list","params":{}}"#;
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nAccept: {ACCEPT}\r\nContent-Type: application/json\r\nMcp-Session-Id: {session}\r\nContent-Length: {}\r\n\r\n{body}",
        token("alice"),
        body.len()
    );
    let mut s = stalled_client(env.addr(), &request).await;
    // Reading and rewriting 6 MB takes a while in a debug build: wait for it.
    let until = Instant::now() + Duration::from_secs(10);
    let mut most = 0.0f64;
    while Instant::now() < until && most < 1_000_000.0 {
        most = most.max(env.metric("knowtation_sidecar_buffered_body_bytes"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        most > 1_000_000.0,
        "the held answer was not counted: {most}"
    );
    // Past the stall limit the connection is closed and the bytes come back, while the
    // client still reads nothing (the sidecar's workers write the answer on their own
    // time: the stall counts from the first write the client does not take).
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until && env.metric("knowtation_sidecar_buffered_body_bytes") > 0.0 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(env.metric("knowtation_sidecar_buffered_body_bytes"), 0.0);
    let (read, ended) = drain_for(&mut s, Duration::from_secs(10)).await;
    assert!(ended && read < 6_000_000, "{read} bytes, ended: {ended}");
}

/// A body's parse is charged to the caller's budget before it runs: a value costs
/// tens of bytes of tree where it took two bytes of JSON, so a 10 MiB body of `[0,0,…]`
/// took 298 MB. A body whose parse could never fit the caller's share is 413 and
/// never parsed; one that fits is forwarded and its charge given back.
#[tokio::test]
async fn a_body_is_parsed_only_within_the_budget() {
    let env = Env::start().await;
    let session = env.session("alice").await;
    // 1.5 million values in 3 MB: about 96 MB of tree, over the 40 MiB share.
    let zeros = format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"search","arguments":{{"q":[{}0]}}}}}}"#,
        "0,".repeat(1_500_000)
    );
    let before = env.gw.requests().len();
    let r = env
        .post("alice", Some(&session), "application/json", &zeros)
        .await;
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(env.gw.requests().len(), before, "nothing was forwarded");
    // 50,000 values (about 3 MiB of tree) fit, and their charge comes back.
    let some = format!(
        r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"search","arguments":{{"q":[{}0]}}}}}}"#,
        "0,".repeat(50_000)
    );
    let r = env
        .post("alice", Some(&session), "application/json", &some)
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(env.metric("knowtation_sidecar_buffered_body_bytes"), 0.0);
}

/// A note the canister returns is charged to the caller's budget with what parsing it
/// may cost before it is parsed: a note whose frontmatter is an array of a million
/// zeros (2 MB, some 128 MB to parse) is treated as a note over the cap on both
/// surfaces; an ordinary note is served and its charge given back.
#[tokio::test]
async fn a_note_is_parsed_only_within_the_budget() {
    let env = Env::start().await;
    let zeros: Vec<u8> = vec![0; 1_000_000];
    env.canister
        .insert_note(VAULT, "heavy.md", &json!({"tags": zeros}), "# H\n");
    let r = env
        .rest("alice", "/api/v1/section-source?path=heavy.md")
        .await;
    assert_eq!(r.status, 502, "{}", r.text());
    let session = env.session("alice").await;
    let call = r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"get_section_source","arguments":{"path":"heavy.md"}}}"#;
    let r = env
        .post("alice", Some(&session), "application/json", call)
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("Runtime failure"), "{}", r.text());
    let r = env.rest("alice", "/api/v1/section-source?path=a.md").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(env.metric("knowtation_sidecar_buffered_body_bytes"), 0.0);
}

/// A note is charged to the caller's budget as it arrives, not once it has arrived: while
/// the canister is still sending a 6 MB note, its bytes already count, so a second read of
/// the same user that would pass the user's share is refused at once (503) instead of
/// being held too; another user is served, and everything is given back at the end.
#[tokio::test]
async fn a_note_is_charged_while_it_arrives() {
    let env = Env::start_with(|c| {
        c.listen.max_buffered_bytes_per_user = 10 * 1024 * 1024;
        c.upstream.canister_timeout_ms = 30_000;
    })
    .await;
    // Within the note cap of 1,000,000 characters; JSON escapes each as six bytes.
    let text = format!("# Big\n\n{}\n", "\u{1}".repeat(990_000));
    env.canister.insert_note(VAULT, "big.md", &json!({}), &text);
    env.canister.set_override(
        "big.md",
        knowtation_testkit::CanisterOverride::new().stall_body(Duration::from_secs(6)),
    );
    let path = "/api/v1/section-source?path=big.md";
    let first = env.rest("alice", path);
    let meanwhile = async {
        let t = Instant::now();
        while env.metric("knowtation_sidecar_buffered_body_bytes") < 5_900_000.0 {
            assert!(
                t.elapsed() < Duration::from_secs(4),
                "the arriving note is not counted"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let t = Instant::now();
        let second = env.rest("alice", path).await;
        assert_eq!(second.status, 503, "{}", second.text());
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        let other = env.rest("bob", "/api/v1/section-source?path=a.md").await;
        assert_eq!(other.status, 200, "{}", other.text());
    };
    let (first, ()) = tokio::join!(first, meanwhile);
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(env.metric("knowtation_sidecar_buffered_body_bytes"), 0.0);
}

/// Every `heading_path` repeats its ancestors' texts (spec §7), so one long heading over
/// 499 short ones makes a document hundreds of times the note's size: with a 200 KB
/// heading, 100 MB of JSON (a 990 KB one took 2 GB to serve over MCP). What the document
/// and its answer hold is charged to the caller before they are built: one that could
/// never fit is a note over the cap on both surfaces; an ordinary note is served.
#[tokio::test]
async fn an_answer_is_charged_before_it_is_built() {
    let env = Env::start().await;
    let body = format!("# {}\n\n{}", "A".repeat(200_000), "## b\n\n".repeat(499));
    env.canister
        .insert_note(VAULT, "wide.md", &json!({}), &body);
    let r = env
        .rest("alice", "/api/v1/section-source?path=wide.md")
        .await;
    assert_eq!(r.status, 502, "{}", &r.text()[..r.text().len().min(200)]);
    let session = env.session("alice").await;
    let call = r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"get_section_source","arguments":{"path":"wide.md"}}}"#;
    let r = env
        .post("alice", Some(&session), "application/json", call)
        .await;
    assert_eq!(r.status, 200);
    assert!(r.text().len() < 1_000, "{} bytes", r.text().len());
    assert!(r.text().contains("Runtime failure"), "{}", r.text());
    // Twenty such sections are served.
    let body = format!("# {}\n\n{}", "A".repeat(200_000), "## b\n\n".repeat(19));
    env.canister
        .insert_note(VAULT, "wide.md", &json!({}), &body);
    let r = env
        .rest("alice", "/api/v1/section-source?path=wide.md")
        .await;
    assert_eq!(r.status, 200);
    assert!(r.text().len() > 20 * 200_000, "{} bytes", r.text().len());
    assert_eq!(env.metric("knowtation_sidecar_buffered_body_bytes"), 0.0);
}

#[test]
fn defaults_fit_the_gateway() {
    let c = Config::default();
    // express.json({ limit: '10mb' }) is 10 × 2^20 bytes.
    assert_eq!(c.mcp.max_body_bytes, 10 * 1024 * 1024);
    assert!(c.upstream.gateway_timeout_ms >= 600_000);
    // Node's requestTimeout: a 10 MB body may take minutes on a slow link.
    assert!(c.listen.body_read_timeout_ms >= 300_000);
    // Three tool calls of one user carrying files at the body cap, at once.
    assert!(c.listen.max_buffered_bytes_per_user >= 3 * c.mcp.max_body_bytes + 1024 * 1024);
    assert!(c.upstream.gateway_idle_timeout_ms >= 300_000);
    assert_eq!(
        knowtation_sidecar::config::DEFAULT_NOTE_MAX_BYTES,
        knowtation_sidecar::extract::MAX_NOTE_JSON_BYTES
    );
}

#[tokio::test]
async fn defaults_forward_a_9_mb_mcp_body() {
    let env = Env::start().await;
    let session = env.session("alice").await;
    let big = "A".repeat(9 * 1000 * 1000);
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"import_file","arguments":{{"content_base64":"{big}"}}}}}}"#
    );
    let r = env
        .post("alice", Some(&session), "application/json", &body)
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let last = env.gw.requests().pop().unwrap();
    assert_eq!(last.body.len(), body.len());
}

#[tokio::test]
async fn a_slow_answer_that_keeps_moving_is_not_cut() {
    let env = Env::start_with(|c| {
        c.upstream.gateway_idle_timeout_ms = 400;
        c.upstream.gateway_timeout_ms = 400;
    })
    .await;
    // Twelve chunks 150 ms apart: 1.65 s in all, far beyond both timeouts.
    let r = env
        .send(Method::GET, "/chunked?n=12&gap_ms=150", &[], Bytes::new())
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.text().lines().count(), 12);
    // A pause longer than the idle gap ends the answer.
    let (addr, req) = client::request(
        Method::GET,
        &env.url("/chunked?n=3&gap_ms=900"),
        &[],
        Bytes::new(),
    )
    .unwrap();
    let broken = client::send(addr, req).await;
    assert!(broken.is_err(), "{broken:?}");
    // A head later than the head timeout is 504.
    let r = env
        .send(Method::GET, "/delay?ms=900", &[], Bytes::new())
        .await;
    assert_eq!(r.status, 504);
}

#[test]
fn the_passthrough_body_key_is_gone() {
    let dir = std::env::temp_dir().join(format!("ks-door-{}.toml", std::process::id()));
    std::fs::write(
        &dir,
        "[upstream]\ngateway_url = \"http://127.0.0.1:1\"\n[listen]\nmax_body_bytes = 5\n",
    )
    .unwrap();
    let e = knowtation_sidecar::config::load_with_env(Some(&dir), &[]).unwrap_err();
    let _ = std::fs::remove_file(&dir);
    assert_eq!(e.key, "listen.max_body_bytes");
}

/// Reads a whole HTTP/2 answer, granting window as it goes; its bytes.
async fn h2_read_all(mut body: h2::RecvStream) -> usize {
    let mut n = 0;
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        n += chunk.len();
        body.flow_control().release_capacity(chunk.len()).unwrap();
    }
    n
}

/// An HTTP/2 connection whose streams never get more than their first 1 KiB of window,
/// ready to send, and the task driving it.
async fn h2_starved(
    addr: SocketAddr,
) -> (
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (h2, conn) = h2::client::Builder::new()
        .initial_window_size(1024)
        .handshake::<_, Bytes>(tcp)
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    (h2.ready().await.unwrap(), conn)
}

/// The write-stall limit on HTTP/2, where a client can stop taking one answer by
/// granting its stream no window while the socket stays writable: the connection is
/// closed once a chunk has waited for the limit, with the place its request held at the
/// gateway. Waiting for the gateway is no stall, and neither is a client that takes its
/// answer as fast as it can.
#[tokio::test]
async fn an_http2_client_that_grants_no_window_is_closed_at_the_write_stall_limit() {
    let env = Env::start_with(|c| {
        c.listen.write_stall_timeout_ms = 500;
        c.listen.max_forwarded_in_flight_anonymous = 1;
    })
    .await;
    let get = |path: &str| Request::get(env.url(path)).body(()).unwrap();

    // A gateway that pauses longer than the limit between chunks, and an 8 MB answer
    // taken as it comes: both arrive whole.
    let tcp = TcpStream::connect(env.addr()).await.unwrap();
    let (h2, conn) = h2::client::handshake(tcp).await.unwrap();
    let conn = tokio::spawn(conn);
    for (path, bytes) in [
        ("/chunked?n=3&gap_ms=800", None),
        ("/big?bytes=8000000", Some(8_000_000)),
    ] {
        let mut h2 = h2.clone().ready().await.unwrap();
        let (response, _) = h2.send_request(get(path), true).unwrap();
        let r = response.await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let n = tokio::time::timeout(Duration::from_secs(30), h2_read_all(r.into_body()))
            .await
            .expect("the answer ended");
        if let Some(bytes) = bytes {
            assert_eq!(n, bytes, "{path}");
        } else {
            assert!(n > 0, "{path}");
        }
    }
    assert!(!conn.is_finished());

    // A stream that never gets more than its first 1 KiB of window.
    let (mut h2, conn) = h2_starved(env.addr()).await;
    let (response, _) = h2.send_request(get("/big?bytes=30000000"), true).unwrap();
    let r = response.await.unwrap();
    assert_eq!(r.status(), 200);
    let _held = r.into_body();
    // While it waits, the one anonymous place at the gateway is taken.
    let r = env
        .send(Method::GET, "/api/v1/echo", &[], Bytes::new())
        .await;
    assert_eq!(r.status, 503, "{}", r.text());
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(conn.is_finished(), "the connection is still open");
    let r = env
        .send(Method::GET, "/api/v1/echo", &[], Bytes::new())
        .await;
    assert_eq!(r.status, 200, "{}", r.text());

    // The sidecar's own answer, made whole at once, is handed over in slices too: one
    // hyper has not taken is seen waiting.
    let headings: String = (0..2000).map(|i| format!("# Heading {i}\n\n")).collect();
    env.canister
        .insert_note(VAULT, "many.md", &json!({}), &headings);
    let (mut h2, conn) = h2_starved(env.addr()).await;
    let req = Request::get(env.url("/api/v1/section-source?path=many.md"))
        .header("authorization", format!("Bearer {}", token("alice")))
        .header("x-vault-id", VAULT)
        .body(())
        .unwrap();
    let (response, _) = h2.send_request(req, true).unwrap();
    let r = response.await.unwrap();
    assert_eq!(r.status(), 200);
    let length: usize = r.headers()["content-length"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(length > 100_000, "{length}");
    let _held = r.into_body();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(conn.is_finished(), "the connection is still open");
}
