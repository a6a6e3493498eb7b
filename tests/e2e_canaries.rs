//! End to end through the real binary (`serve`): canary strings placed in note bodies,
//! non-title frontmatter, canister error bodies, request paths, queries, headers, MCP
//! `clientInfo` and user ids never appear in an intercepted answer (REST and the MCP
//! tool), in any log line (debug level, JSON) or in the metrics. Wire contract §5
//! ("Upstream bodies are never forwarded") and §7 ("Never log a request path, query,
//! header value, body, heading or user id").
//!
//! The scan matches in any letter case, reads header values as bytes (a value that is
//! not visible ASCII is scanned, not skipped), and is shown to find each canary before it
//! is trusted to find none. Every answer's status is asserted, so the test cannot pass by
//! answering nothing. `tests/leak_proof.rs` does the same over 300 generated notes.

// A failed expectation in a test is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bytes::Bytes;
use http::Method;
use knowtation_testkit::{
    self as testkit, client, CanisterOverride, MockBridge, MockCanister, MockGateway,
};
use serde_json::{json, Value};

#[path = "support/sidecar.rs"]
mod support;

use support::{Sidecar, SECRET};

const BODY: &str = "CANARY-BODY-7f3a";
const FRONTMATTER: &str = "CANARY-FM-91bd";
const UPSTREAM_ERROR: &str = "CANARY-UPSTREAM-c0de";
const PATH: &str = "CANARY-PATH-55aa";
const QUERY: &str = "CANARY-QUERY-2b2b";
const HEADER: &str = "CANARY-HEADER-9e9e";
const USER: &str = "CANARY-USER-4d4d";
const CLIENT: &str = "CANARY-CLIENT-3c3c";
const HEADING_SECRET: &str = "CANARY-HEADING-1212";
const ACCEPT: &str = "application/json, text/event-stream";

/// Every string that must never leave where it is not allowed.
const CANARIES: &[&str] = &[
    BODY,
    FRONTMATTER,
    UPSTREAM_ERROR,
    PATH,
    QUERY,
    HEADER,
    USER,
    CLIENT,
    HEADING_SECRET,
    SECRET,
];

/// The canaries found in `bytes`, in any letter case.
fn hits(bytes: &[u8], canaries: &[&str]) -> Vec<String> {
    let lower = bytes.to_ascii_lowercase();
    canaries
        .iter()
        .filter(|c| {
            let c = c.to_ascii_lowercase();
            lower.windows(c.len()).any(|w| w == c.as_bytes())
        })
        .map(|c| (*c).to_owned())
        .collect()
}

fn assert_clean_of(what: &str, bytes: &[u8], canaries: &[&str]) {
    let found = hits(bytes, canaries);
    assert!(
        found.is_empty(),
        "{what} contains {found:?}:\n{}",
        String::from_utf8_lossy(bytes)
    );
}

fn assert_clean(what: &str, bytes: &[u8]) {
    assert_clean_of(what, bytes, CANARIES);
}

/// The status, every header name and value (as bytes) and the body of an answer.
fn assert_answer_clean(what: &str, r: &client::Collected, canaries: &[&str]) {
    assert_clean_of(&format!("the body of {what}"), &r.body, canaries);
    for (name, value) in &r.headers {
        assert_clean_of(
            &format!("header {name} of {what}"),
            value.as_bytes(),
            canaries,
        );
    }
}

/// The scan finds what it looks for: each canary as written, lowercased, uppercased,
/// inside a JSON log line, and in a header value that is not ASCII.
fn scanner_sees_what_it_must() {
    for c in CANARIES {
        for form in [
            (*c).to_owned(),
            c.to_ascii_lowercase(),
            c.to_ascii_uppercase(),
        ] {
            assert_eq!(hits(form.as_bytes(), CANARIES), [*c], "{form}");
        }
        let line = json!({"level": "DEBUG", "message": format!("read {c}")}).to_string();
        assert!(!hits(line.as_bytes(), CANARIES).is_empty(), "{line}");
        let mut value = "caf\u{e9} ".as_bytes().to_vec();
        value.extend_from_slice(c.as_bytes());
        let value = http::HeaderValue::from_bytes(&value).unwrap();
        assert!(value.to_str().is_err());
        assert!(!hits(value.as_bytes(), CANARIES).is_empty());
    }
    assert!(hits(b"knowtation.section_source/v0 Visible Heading", CANARIES).is_empty());
}

/// The tool result of an SSE answer: its text and `isError`.
fn tool_result(r: &client::Collected) -> (String, bool) {
    let message = support::sse_message(&r.text());
    let result = &message["result"];
    (
        result["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        result["isError"] == Value::Bool(true),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canaries_never_reach_responses_logs_or_metrics() {
    scanner_sees_what_it_must();
    let gateway = MockGateway::start().await;
    let canister = MockCanister::start().await;
    let bridge = MockBridge::start().await;
    canister.insert_note(
        "default",
        "notes/ok.md",
        &json!({"title": "Visible", "secret": FRONTMATTER, "tags": [FRONTMATTER]}),
        &format!("# Heading\n\n{BODY}\n\n```\n# {BODY}\n```\n\n<!-- {BODY} -->\n"),
    );
    canister.insert_note("default", "notes/err.md", &json!({}), "# x");
    canister.set_override(
        "notes/err.md",
        CanisterOverride::new()
            .status(500)
            .body(format!("{{\"error\":\"{UPSTREAM_ERROR}\"}}")),
    );
    canister.insert_note("default", "notes/gone.md", &json!({}), "# x");
    canister.set_override(
        "notes/gone.md",
        CanisterOverride::new().status(404).body(UPSTREAM_ERROR),
    );
    canister.insert_note("default", "notes/html.md", &json!({}), "# x");
    canister.set_override(
        "notes/html.md",
        CanisterOverride::new()
            .status(200)
            .body(format!("<html>{UPSTREAM_ERROR}")),
    );
    // The heading text is allowed in the document, but never in logs or metrics.
    canister.insert_note(
        "default",
        "notes/heading.md",
        &json!({}),
        &format!("# {HEADING_SECRET}"),
    );

    let sidecar = Sidecar::spawn(&[
        ("UPSTREAM__GATEWAY_URL", gateway.url()),
        ("UPSTREAM__CANISTER_URL", canister.url()),
        ("UPSTREAM__BRIDGE_URL", bridge.url()),
    ]);
    sidecar.wait_ready().await;
    let base = format!("http://{}", sidecar.addr);
    let token = testkit::sign_token(
        SECRET,
        testkit::session_claims(USER, Duration::from_secs(600)),
    );
    let bearer = format!("Bearer {token}");
    let auth: &[(&str, &str)] = &[
        ("authorization", &bearer),
        ("x-vault-id", "default"),
        ("x-custom", HEADER),
    ];
    let send = |method: Method, target: String, headers: Vec<(&'static str, String)>, body| {
        let base = base.clone();
        async move {
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let (addr, req) = client::request(
                method,
                &format!("{base}{target}"),
                &headers,
                Bytes::from(body),
            )
            .unwrap();
            client::send(addr, req).await.unwrap()
        }
    };
    let owned = |h: &[(&'static str, &str)]| -> Vec<(&'static str, String)> {
        h.iter().map(|(k, v)| (*k, (*v).to_owned())).collect()
    };

    // REST: each outcome, its status asserted.
    let mut answers = Vec::new();
    for (path, status) in [
        ("notes/ok.md", 200),
        ("notes/err.md", 502),
        ("notes/gone.md", 404),
        ("notes/html.md", 502),
        ("notes/missing.md", 404),
    ] {
        let r = send(
            Method::GET,
            format!("/api/v1/section-source?path={path}&{QUERY}=1"),
            owned(auth),
            Vec::new(),
        )
        .await;
        assert_eq!(r.status, status, "{path}: {}", r.text());
        answers.push((format!("REST {path}"), r));
    }
    assert_eq!(answers[0].1.json()["title"], json!("Visible"));
    assert_eq!(
        answers[0].1.json()["sections"][0]["heading_text"],
        json!("Heading")
    );
    // Unsafe input is never echoed.
    for path in [
        format!("../{PATH}"),
        format!("/{PATH}"),
        format!("{PATH}/%2e%2e/x"),
    ] {
        let r = send(
            Method::GET,
            format!("/api/v1/section-source?path={path}&{QUERY}=1"),
            owned(auth),
            Vec::new(),
        )
        .await;
        assert_eq!(r.status, 400, "{path}");
        answers.push((format!("REST unsafe {path}"), r));
    }
    let r = send(
        Method::GET,
        "/api/v1/section-source?path=notes/ok.md".to_owned(),
        vec![("authorization", HEADER.to_owned())],
        Vec::new(),
    )
    .await;
    assert_eq!(r.status, 401);
    answers.push(("REST unauthorized".to_owned(), r));
    // A header value that is not ASCII is not a reason to skip anything.
    let odd_value = format!("caf\u{e9}-{HEADER}");
    let (addr, mut req) = client::request(
        Method::GET,
        &format!("{base}/api/v1/section-source?path=notes/ok.md"),
        auth,
        Bytes::new(),
    )
    .unwrap();
    req.headers_mut().insert(
        "x-odd",
        http::HeaderValue::from_bytes(odd_value.as_bytes()).unwrap(),
    );
    let r = client::send(addr, req).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    answers.push(("REST with a non-ASCII header".to_owned(), r));

    // MCP: `initialize` with canaries in `clientInfo` and a header, then the tool on each
    // outcome.
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": CLIENT, "version": CLIENT}}})
    .to_string();
    let mcp_headers = |session: Option<&str>| {
        let mut h = owned(auth);
        h.push(("accept", ACCEPT.to_owned()));
        h.push(("content-type", "application/json".to_owned()));
        if let Some(s) = session {
            h.push(("mcp-session-id", s.to_owned()));
        }
        h
    };
    let r = send(
        Method::POST,
        "/mcp".to_owned(),
        mcp_headers(None),
        init.into_bytes(),
    )
    .await;
    assert_eq!(r.status, 200, "initialize: {}", r.text());
    let session = r.header("mcp-session-id").unwrap().to_owned();
    // The gateway's own answer to `initialize` passes through; it holds no canary.
    answers.push(("MCP initialize".to_owned(), r));
    let unsafe_path = format!("../{PATH}");
    for (i, (path, want_text, want_error)) in [
        ("notes/ok.md", "Visible", false),
        (
            "notes/err.md",
            r#"{"error":"Upstream 500","code":"UPSTREAM_ERROR"}"#,
            true,
        ),
        (
            "notes/gone.md",
            r#"{"error":"Upstream 404","code":"UPSTREAM_ERROR"}"#,
            true,
        ),
        (
            "notes/html.md",
            r#"{"error":"Runtime failure","code":"UPSTREAM_ERROR"}"#,
            true,
        ),
        (
            "notes/missing.md",
            r#"{"error":"Upstream 404","code":"UPSTREAM_ERROR"}"#,
            true,
        ),
        (
            unsafe_path.as_str(),
            r#"{"error":"Invalid path","code":"UPSTREAM_ERROR"}"#,
            true,
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let call = json!({"jsonrpc": "2.0", "id": i + 1, "method": "tools/call",
            "params": {"name": "get_section_source", "arguments": {"path": path}}})
        .to_string();
        let r = send(
            Method::POST,
            format!("/mcp?{QUERY}=1"),
            mcp_headers(Some(&session)),
            call.into_bytes(),
        )
        .await;
        assert_eq!(r.status, 200, "tool on {path}: {}", r.text());
        let (text, is_error) = tool_result(&r);
        assert_eq!(is_error, want_error, "tool on {path}: {}", r.text());
        if want_error {
            assert_eq!(text, want_text, "tool on {path}");
        } else {
            assert!(text.contains(want_text), "tool on {path}: {text}");
        }
        answers.push((format!("MCP tool {path}"), r));
    }
    assert_eq!(answers.len(), 17);
    for (what, r) in &answers {
        assert_answer_clean(what, r, CANARIES);
    }

    // The heading itself is served, and is the one canary an answer may carry.
    let heading = send(
        Method::GET,
        "/api/v1/section-source?path=notes/heading.md".to_owned(),
        owned(auth),
        Vec::new(),
    )
    .await;
    assert_eq!(heading.status, 200);
    assert_eq!(hits(&heading.body, CANARIES), [HEADING_SECRET]);
    let others: Vec<&str> = CANARIES
        .iter()
        .copied()
        .filter(|c| *c != HEADING_SECRET)
        .collect();
    assert_answer_clean("REST notes/heading.md", &heading, &others);

    // Passthrough carries canaries to the gateway (that is its job) but never into logs.
    let pass = send(
        Method::GET,
        format!("/{PATH}/x?{QUERY}=1"),
        vec![
            ("x-custom", HEADER.to_owned()),
            ("authorization", bearer.clone()),
        ],
        Vec::new(),
    )
    .await;
    assert_eq!(pass.status, 200);
    assert!(gateway
        .requests()
        .iter()
        .any(|r| r.uri.to_string().contains(PATH)));

    let metrics = sidecar.metrics().await;
    // Every intercepted answer above was counted: 11 REST (7 served or refused by the
    // route, the 401, the non-ASCII one, the heading) and 6 tool calls.
    assert!(
        metrics.get(&support::intercepted("rest", "ok")) >= 3.0,
        "{}",
        metrics.text
    );
    assert!(metrics.text.contains("surface=\"mcp\""), "{}", metrics.text);
    assert_clean("the metrics", metrics.text.as_bytes());

    let logs = sidecar.stop_bytes();
    let text = String::from_utf8_lossy(&logs);
    let lines: Vec<&str> = text.lines().collect();
    for line in &lines {
        assert!(
            serde_json::from_str::<Value>(line).is_ok(),
            "not a JSON log line: {line}"
        );
    }
    let rest_lines = lines
        .iter()
        .filter(|l| l.contains("\"surface\":\"rest\""))
        .count();
    let mcp_lines = lines
        .iter()
        .filter(|l| l.contains("\"surface\":\"mcp\""))
        .count();
    assert!(rest_lines >= 11, "one line per REST answer:\n{text}");
    assert!(mcp_lines >= 6, "one line per tool call:\n{text}");
    assert_clean("the log", &logs);
}
