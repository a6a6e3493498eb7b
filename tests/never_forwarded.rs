//! The section-source surface never reaches the gateway, through the real binary
//! (`serve`): every method the sidecar answers on the REST route (`GET`, `HEAD`,
//! `OPTIONS`, wire contract §5), on every spelling the gateway's router, or a hop in front
//! of it, takes for that route (case, one trailing slash, the Netlify prefix, escapes of
//! unreserved characters, normalizing and decoding hops, the absolute form), over
//! HTTP/1.1 and HTTP/2, with a token and without; and `tools/call` of
//! `get_section_source` on every spelling of `/mcp`, in every JSON spelling of its name
//! (§6). The mock gateway records every request it receives. The count is shown not to be
//! blind: the methods the sidecar passes through on the same spellings (§5: "Other
//! methods pass through") and an ordinary tool call are seen arriving.
//! A well-formed call on another user's session is answered by the sidecar and never
//! reaches the gateway either, while the owner's call on it does.

// A failed expectation in a test is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/sidecar.rs"]
mod support;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use knowtation_testkit::{MockBridge, MockCanister, MockGateway, Recorded};
use serde_json::{json, Value};
use support::{exchange, token, Sidecar};
use tokio::net::TcpStream;

const VAULT: &str = "default";
const ACCEPT: &str = "application/json, text/event-stream";
const WAIT: Duration = Duration::from_secs(10);
const INIT: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#;
/// The heading of the note the sidecar serves: in an answer, it shows the sidecar's own
/// document and not something the gateway sent.
const HEADING: &str = "Only the sidecar knows this heading";

/// Every spelling of `/api/v1/section-source` that the gateway routes to its handler, or
/// that a hop in front of it turns into one (`src/route.rs` reads them all).
const REST_SPELLINGS: &[&str] = &[
    "/api/v1/section-source",
    "/api/v1/section-source/",
    "/API/V1/SECTION-SOURCE",
    "/Api/V1/Section-Source/",
    "/.netlify/functions/gateway/api/v1/section-source",
    "/.netlify/functions/gateway/.netlify/functions/gateway/api/v1/section-source/",
    "/.NETLIFY/Functions/Gateway/api/v1/section-source",
    "/%61pi/v1/section-source",
    "/api/v1/section%2Dsource",
    "/api/v1/section%2dsource",
    "/%41%50%49/%76%31/%73ection-source",
    "/%2Enetlify/functions/gateway/api/v1/section-source",
    "/api/v1/section-source/%2E",
    "//api/v1/section-source",
    "/api//v1/section-source",
    "/api/v1/./section-source",
    "/api/v1/x/../section-source",
    "//.netlify/functions/gateway/../api/v1/section-source",
    "/api/v1%2Fsection-source",
    "/api/v1/section-source%2F",
    "/api/v1/x%2F..%2Fsection-source",
    "/api%2Fv1%2Fsection-source",
    "/api/v1%252Fsection-source",
    "/api/v1/%2573ection-source",
    "/api%5Cv1%5Csection-source",
    "/api\\v1\\section-source",
    "/api/v1/section-source%20",
    "/api/v1/section-source%C2%A0",
    "/%2Fa@b/api/v1/section-source%23",
    "/%5Ca@b/api/v1/section-source%23",
];

/// Every spelling of `/mcp` the gateway's `app.use('/mcp')` mounts on, or a hop in front
/// of it turns into one.
const MCP_SPELLINGS: &[&str] = &[
    "/mcp",
    "/mcp/",
    "/MCP",
    "/Mcp/",
    "/.netlify/functions/gateway/mcp",
    "/.netlify/functions/gateway/.netlify/functions/gateway/MCP/",
    "//mcp",
    "/x/../mcp",
    "/mcp%2F",
    "/mcp%2f",
    "/x%2F..%2Fmcp",
    "/.netlify/functions/gateway%2Fmcp",
    "/mcp%252F",
    "/mcp%09",
    "/mcp%23",
    "/mcp\\",
    "/%2Fa@b/mcp%23",
];

/// The methods the sidecar answers itself on the REST route.
const ANSWERED: &[&str] = &["GET", "HEAD", "OPTIONS"];

/// The methods it passes through on the same route (the gateway forwards them to the
/// canister through its `/api/v1` catch-all).
const PASSED: &[&str] = &["POST", "PUT", "PATCH", "DELETE"];

struct Env {
    gw: MockGateway,
    _canister: MockCanister,
    _bridge: MockBridge,
    sidecar: Sidecar,
}

impl Env {
    async fn start() -> Env {
        let gw = MockGateway::start().await;
        let canister = MockCanister::start().await;
        canister.insert_note(
            VAULT,
            "a.md",
            &json!({"title": "A"}),
            &format!("# {HEADING}\n\nbody\n"),
        );
        let bridge = MockBridge::start().await;
        let sidecar = Sidecar::spawn(&[
            ("UPSTREAM__GATEWAY_URL", gw.url()),
            ("UPSTREAM__CANISTER_URL", canister.url()),
            ("UPSTREAM__BRIDGE_URL", bridge.url()),
            // Every answer is the sidecar's own document, never a 429 that would prove
            // less.
            ("RATE_LIMIT__PER_USER_PER_MINUTE", "100000".to_owned()),
            ("RATE_LIMIT__BURST", "100000".to_owned()),
            ("MCP__CALLS_PER_MINUTE", "100000".to_owned()),
            // Debug logs of a few thousand requests are not what this test reads.
            ("LOG__LEVEL", "warn".to_owned()),
        ]);
        sidecar.wait_ready().await;
        Env {
            gw,
            _canister: canister,
            _bridge: bridge,
            sidecar,
        }
    }

    fn addr(&self) -> SocketAddr {
        self.sidecar.addr
    }

    /// The requests the gateway received, less the readiness probe's (`GET /`, the
    /// gateway's base URL, every few seconds).
    fn at_gateway(&self) -> Vec<Recorded> {
        self.gw
            .requests()
            .into_iter()
            .filter(|r| !(r.method == Method::GET && r.uri == "/"))
            .collect()
    }

    /// The requests the gateway received whose method is `method`.
    fn gateway_count(&self, method: &Method) -> usize {
        self.at_gateway()
            .iter()
            .filter(|r| r.method == method)
            .count()
    }
}

/// One answer, whichever protocol carried it.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// `method target` over HTTP/1.1, the request-target exactly as given.
async fn h1(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut r = format!("{method} {target} HTTP/1.1\r\nHost: sidecar.test\r\n");
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || method != "GET" && method != "HEAD" && method != "OPTIONS" {
        r.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    r.push_str("Connection: close\r\n\r\n");
    r.push_str(body);
    let raw = exchange(addr, r.as_bytes(), WAIT).await;
    assert!(!raw.timed_out, "{method} {target}: no answer");
    Answer {
        status: raw.status,
        headers: raw.headers.clone(),
        body: raw.body.clone(),
    }
}

/// `method target` over HTTP/2 by prior knowledge, on a connection of its own.
async fn h2(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let exchange = async {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let (client, conn) = h2::client::handshake(tcp).await.unwrap();
        let conn = tokio::spawn(conn);
        let mut client = client.ready().await.unwrap();
        let mut req = Request::builder()
            .method(method)
            .uri(format!("http://sidecar.test{target}"));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let (response, mut send) = client
            .send_request(req.body(()).unwrap(), body.is_empty())
            .unwrap();
        if !body.is_empty() {
            send.send_data(Bytes::copy_from_slice(body.as_bytes()), true)
                .unwrap();
        }
        let response = response.await.unwrap();
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let mut stream = response.into_body();
        let mut body = Vec::new();
        while let Some(chunk) = stream.data().await {
            let chunk = chunk.unwrap();
            let _ = stream.flow_control().release_capacity(chunk.len());
            body.extend_from_slice(&chunk);
        }
        conn.abort();
        Answer {
            status,
            headers,
            body,
        }
    };
    tokio::time::timeout(WAIT, exchange)
        .await
        .unwrap_or_else(|_| panic!("{method} {target} over HTTP/2: no answer"))
}

/// The request-target: the spelling with the query.
fn with_query(spelling: &str) -> String {
    format!("{spelling}?path=a.md")
}

/// What the sidecar answers itself on the REST route, for `method` with or without a
/// token: the document, its head, the preflight, or the 401.
fn assert_rest_answered_here(what: &str, method: &str, authorized: bool, a: &Answer) {
    assert!(
        a.header("x-mock-upstream").is_none(),
        "{what}: the gateway answered: {a:?}"
    );
    let want = match (method, authorized) {
        ("OPTIONS", _) => 204,
        (_, true) => 200,
        (_, false) => 401,
    };
    assert_eq!(a.status, want, "{what}: {}", a.text());
    assert_eq!(
        a.header("cache-control"),
        Some("private, no-store, must-revalidate"),
        "{what}"
    );
    if method == "GET" && authorized {
        assert!(a.text().contains(HEADING), "{what}: {}", a.text());
    } else {
        assert!(method == "GET" || a.body.is_empty(), "{what}: {}", a.text());
    }
}

/// No method the sidecar answers, on any spelling of the route, over either protocol,
/// with or without a token, reaches the gateway; the methods it passes through on the
/// same spellings all do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_method_or_spelling_of_the_rest_route_reaches_the_gateway() {
    let env = Env::start().await;
    let auth = format!("Bearer {}", token("alice"));
    let mut sent = 0;
    for spelling in REST_SPELLINGS {
        let target = with_query(spelling);
        for method in ANSWERED {
            for authorized in [true, false] {
                let mut headers = vec![("x-vault-id", VAULT), ("origin", "https://app.test")];
                if authorized {
                    headers.push(("authorization", auth.as_str()));
                }
                if *method == "OPTIONS" {
                    headers.push(("access-control-request-method", "GET"));
                }
                let a = h1(env.addr(), method, &target, &headers, "").await;
                assert_rest_answered_here(
                    &format!("HTTP/1.1 {method} {target} (token: {authorized})"),
                    method,
                    authorized,
                    &a,
                );
                let a = h2(env.addr(), method, &target, &headers, "").await;
                assert_rest_answered_here(
                    &format!("HTTP/2 {method} {target} (token: {authorized})"),
                    method,
                    authorized,
                    &a,
                );
                sent += 2;
            }
            // The absolute form carries the same path (RFC 9112 §3.2.2).
            let absolute = format!("http://sidecar.test{target}");
            if absolute.parse::<http::Uri>().is_ok() {
                let a = h1(
                    env.addr(),
                    method,
                    &absolute,
                    &[("x-vault-id", VAULT), ("authorization", &auth)],
                    "",
                )
                .await;
                assert_rest_answered_here(&format!("{method} {absolute}"), method, true, &a);
                sent += 1;
            }
        }
    }
    assert!(sent >= REST_SPELLINGS.len() * ANSWERED.len() * 4, "{sent}");
    let reached: Vec<String> = env
        .at_gateway()
        .iter()
        .map(|r| format!("{} {}", r.method, r.uri))
        .collect();
    assert!(
        reached.is_empty(),
        "{} of {sent} requests the sidecar answers reached the gateway: {reached:#?}",
        reached.len()
    );

    // The gateway's count is not blind: what passes through on the same spellings is
    // seen, one request each.
    let mut passed = 0;
    for spelling in REST_SPELLINGS.iter().step_by(3) {
        for method in PASSED {
            let target = with_query(spelling);
            let a = h1(
                env.addr(),
                method,
                &target,
                &[("authorization", &auth)],
                "{}",
            )
            .await;
            assert_eq!(
                a.header("x-mock-upstream"),
                Some("gateway"),
                "{method} {target} passes through: {a:?}"
            );
            let a = h2(
                env.addr(),
                method,
                &target,
                &[("authorization", &auth)],
                "{}",
            )
            .await;
            assert_eq!(
                a.header("x-mock-upstream"),
                Some("gateway"),
                "{method} {target} over HTTP/2 passes through: {a:?}"
            );
            passed += 2;
        }
    }
    assert_eq!(env.at_gateway().len(), passed);
}

/// `initialize` through the sidecar; the session id.
async fn session(env: &Env, auth: &str) -> String {
    let a = h1(
        env.addr(),
        "POST",
        "/mcp",
        &[
            ("authorization", auth),
            ("accept", ACCEPT),
            ("content-type", "application/json"),
            ("x-vault-id", VAULT),
        ],
        INIT,
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    a.header("mcp-session-id").unwrap().to_owned()
}

/// The tool's result, from the first `data:` line of an SSE answer.
fn tool_text(a: &Answer) -> String {
    let message = support::sse_message(&a.text());
    message["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Whether a body the gateway received names the tool, read as JSON the way the
/// gateway reads it (escapes decoded, the last of repeated keys) and as bytes.
fn names_the_tool(body: &[u8]) -> bool {
    let text = String::from_utf8_lossy(body).to_ascii_lowercase();
    if text.contains("get_section_source") || text.contains("section") {
        return true;
    }
    fn walk(v: &Value) -> bool {
        match v {
            Value::String(s) => s.to_ascii_lowercase().contains("section"),
            Value::Array(items) => items.iter().any(walk),
            Value::Object(map) => map.iter().any(|(k, v)| k.contains("section") || walk(v)),
            _ => false,
        }
    }
    serde_json::from_slice::<Value>(body).is_ok_and(|v| walk(&v))
}

/// `tools/call get_section_source` on every spelling of `/mcp`, in every spelling of its
/// name, over both protocols, is answered by the sidecar; no request naming the tool
/// reaches the gateway, while an ordinary tool call on the same spellings does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_spelling_of_the_tool_call_reaches_the_gateway() {
    let env = Env::start().await;
    let auth = format!("Bearer {}", token("alice"));
    let sid = session(&env, &auth).await;
    let posts_before = env.gateway_count(&Method::POST);
    let headers = [
        ("authorization", auth.as_str()),
        ("accept", ACCEPT),
        ("content-type", "application/json"),
        ("mcp-session-id", sid.as_str()),
    ];
    let calls = [
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_section_source","arguments":{"path":"a.md"}}}"#,
        // Escapes in the name and the method: JSON reads them as the plain letters.
        r#"{"jsonrpc":"2.0","id":2,"method":"tools\/call","params":{"name":"get\u005fsection\u005Fsource","arguments":{"path":"a.md"}}}"#,
        // A repeated key: the last one counts, as in JavaScript.
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"search","name":"get_section_source","arguments":{"path":"a.md"}}}"#,
        // Keys in another order, with `_meta`, a string id.
        r#"{"params":{"arguments":{"path":"a.md"},"_meta":{"progressToken":7},"name":"get_section_source"},"method":"tools/call","id":"s","jsonrpc":"2.0"}"#,
    ];
    let mut answered = 0;
    for spelling in MCP_SPELLINGS {
        for call in calls {
            for (protocol, a) in [
                (
                    "HTTP/1.1",
                    h1(env.addr(), "POST", spelling, &headers, call).await,
                ),
                (
                    "HTTP/2",
                    h2(env.addr(), "POST", spelling, &headers, call).await,
                ),
            ] {
                let what = format!("{protocol} POST {spelling} {call}");
                assert_eq!(a.status, 200, "{what}: {}", a.text());
                let text = tool_text(&a);
                assert!(
                    text.contains("knowtation.section_source/v0") && text.contains(HEADING),
                    "{what}: {}",
                    a.text()
                );
                answered += 1;
            }
        }
        // A batch holding the call is refused whole, never passed on.
        let batch = format!(
            r#"[{},{{"jsonrpc":"2.0","id":9,"method":"ping"}}]"#,
            calls[0]
        );
        let a = h1(env.addr(), "POST", spelling, &headers, &batch).await;
        assert_eq!(a.status, 400, "batch on {spelling}: {}", a.text());
        // The headers of a later protocol revision that disagree with the body are
        // refused; agreeing ones change nothing.
        let mut named = headers.to_vec();
        named.extend([("mcp-method", "tools/call"), ("mcp-name", "search")]);
        let a = h1(env.addr(), "POST", spelling, &named, calls[0]).await;
        assert_eq!(a.status, 400, "Mcp-Name on {spelling}: {}", a.text());
        let mut named = headers.to_vec();
        named.extend([
            ("mcp-method", "tools/call"),
            ("mcp-name", "get_section_source"),
        ]);
        let a = h1(env.addr(), "POST", spelling, &named, calls[0]).await;
        assert_eq!(a.status, 200, "Mcp-Name on {spelling}: {}", a.text());
        assert!(tool_text(&a).contains(HEADING), "{}", a.text());
    }
    assert_eq!(answered, MCP_SPELLINGS.len() * calls.len() * 2);
    let forwarded: Vec<String> = env
        .at_gateway()
        .iter()
        .filter(|r| names_the_tool(&r.body) || names_the_tool(r.uri.to_string().as_bytes()))
        .map(|r| format!("{} {} {}", r.method, r.uri, r.body_text()))
        .collect();
    assert!(forwarded.is_empty(), "reached the gateway: {forwarded:#?}");
    assert_eq!(
        env.gateway_count(&Method::POST),
        posts_before,
        "a call the sidecar answers reached the gateway"
    );

    // The gateway's record is not blind: an ordinary call on the same spellings reaches
    // it, once each.
    let search = r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"search","arguments":{"query":"x"}}}"#;
    for spelling in MCP_SPELLINGS {
        let a = h1(env.addr(), "POST", spelling, &headers, search).await;
        assert_eq!(a.status, 200, "search on {spelling}: {}", a.text());
        let a = h2(env.addr(), "POST", spelling, &headers, search).await;
        assert_eq!(
            a.status,
            200,
            "search on {spelling} over HTTP/2: {}",
            a.text()
        );
    }
    assert_eq!(
        env.gateway_count(&Method::POST),
        posts_before + 2 * MCP_SPELLINGS.len()
    );
    assert!(names_the_tool(
        br#"{"params":{"name":"get\u005fsection_source"}}"#
    ));
}

/// A well-formed call on another user's session (§6: a session belongs to the user whose
/// token opened it) is answered 404 by the sidecar and never reaches the gateway, for an
/// ordinary tool, the sidecar's own tool, a notification and a `DELETE`; the owner's calls
/// on the same session, and the other user's on their own, still do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_on_another_users_session_never_reaches_the_gateway() {
    let env = Env::start().await;
    let alice = format!("Bearer {}", token("alice"));
    let bob = format!("Bearer {}", token("bob"));
    let alices = session(&env, &alice).await;
    let bobs = session(&env, &bob).await;
    let before = env.at_gateway().len();
    let (alice, bob, alices, bobs) = (&alice, &bob, &alices, &bobs);
    let calls = [
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search","arguments":{"query":"x"}}}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"get_section_source","arguments":{"path":"a.md"}}}"#,
        r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    ];
    for call in calls {
        for (protocol, a) in [
            (
                "HTTP/1.1",
                h1(env.addr(), "POST", "/mcp", &on(bob, alices), call).await,
            ),
            (
                "HTTP/2",
                h2(env.addr(), "POST", "/mcp", &on(bob, alices), call).await,
            ),
        ] {
            assert_eq!(a.status, 404, "{protocol} {call}: {}", a.text());
            assert!(a.header("x-mock-upstream").is_none(), "{protocol} {call}");
        }
    }
    let a = h1(env.addr(), "DELETE", "/mcp", &on(bob, alices), "").await;
    assert_eq!(a.status, 200, "DELETE: {}", a.text());
    assert!(a.header("x-mock-upstream").is_none(), "DELETE");
    assert_eq!(
        env.at_gateway().len(),
        before,
        "a call on another user's session reached the gateway"
    );

    // Not blind: the owner's call on the same session, and bob's on his own, arrive.
    for (auth, sid) in [(alice, alices), (bob, bobs)] {
        let a = h1(env.addr(), "POST", "/mcp", &on(auth, sid), calls[0]).await;
        assert_eq!(a.status, 200, "{}", a.text());
    }
    assert_eq!(env.at_gateway().len(), before + 2);
}

/// The headers of a call by the holder of `auth` on session `sid`.
fn on<'a>(auth: &'a str, sid: &'a str) -> [(&'static str, &'a str); 5] {
    [
        ("authorization", auth),
        ("accept", ACCEPT),
        ("content-type", "application/json"),
        ("x-vault-id", VAULT),
        ("mcp-session-id", sid),
    ]
}
