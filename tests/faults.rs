//! The upstream fault matrix, through the real binary (`serve`) on loopback: the
//! canister, the bridge and the gateway misbehave in turn (`testkit::FaultServer`, raw
//! TCP), the other upstreams stay healthy. Each cell asserts the documented sanitized
//! answer; the time against its deadline (short ones here; an answer is never later
//! than deadline + margin, and one a deadline ends is not earlier than it); the counter
//! that moved on the admin `/metrics` (and that no other request counter did); exactly
//! one upstream request per call; that no canary planted by the upstream (bodies,
//! headers, `Location`) or in the caller's user id reaches an answer the sidecar builds,
//! a log line (debug level, JSON) or a metric; and that the sidecar is healthy after it:
//! the upstream connection released, nothing in flight or buffered, `/ready` 200, a
//! normal request through the same upstream served.
//!
//! The requests that reach each upstream: the canister through REST `GET
//! /api/v1/section-source` (wire contract §4, §5) and the MCP tool `get_section_source`
//! (§6, tool results); the bridge through REST (§2, fail closed) and MCP `initialize`
//! (§2: no session without a lookup); the gateway through passthrough (§7,
//! `docs/daemon.md` "Answers of its own") and a forwarded `POST /mcp` `resources/list`
//! in a session the gateway opened, whose answer the sidecar reads to remove
//! section-source entries (§6).
//!
//! Observed (REST / MCP; counters: canister `intercepted_requests_total{surface,outcome}`
//! and `upstream_reads_total{surface,status_class}` when a status arrived; bridge
//! `hosted_context_failures_total` and the outcome; gateway
//! `passthrough_requests_total{status_class}`, or `intercepted{mcp,bad_gateway}` for a
//! list answer it cannot read):
//!
//! | fault | canister | bridge | gateway: passthrough / `POST /mcp` list |
//! |---|---|---|---|
//! | connection refused | 502 `Bad Gateway` / `Runtime failure`, `bad_gateway` | 503 / 403 `No hosted access` | 502 `BAD_GATEWAY` / 502 (an `initialize`: no session without a gateway); `/ready` 503 until the gateway is back, REST still served |
//! | reset before the head | as refused | as refused | 502 / 502 |
//! | reset mid-body | 502 / `Runtime failure`, read 2xx | 503 / 403 | head passed, body left incomplete / 502 `bad_gateway` |
//! | stall before the head | 502 / `Runtime failure` at `canister_timeout_ms` | 503 / 403 at `hosted_context.timeout_ms` | 504 `GATEWAY_TIMEOUT` at `gateway_timeout_ms` / 504 |
//! | stall mid-body | 502 / `Runtime failure` at the total deadline | 503 / 403 at the deadline | body cut at `gateway_idle_timeout_ms` / 502 at `gateway_timeout_ms` |
//! | slow drip (40 ms a byte) | 502 / `Runtime failure` at the total deadline | 503 / 403 at the deadline | passed whole: no total deadline / 502 at `gateway_timeout_ms` |
//! | 500, canaries in body and header | 502 `Upstream 500` / `Upstream 500`, `upstream_status`, read 5xx | 503 / 403 | passed as it came (the gateway's own answer) / same |
//! | 403 (bridge) | | 403 `FORBIDDEN` (vault) / 403 `No hosted access` | |
//! | 200 not JSON | 502 `Invalid note response` / `Runtime failure` | 503 / 403 | passed / 502 `bad_gateway` |
//! | just over the cap | note of 1,000,001 UTF-16 units: 502 / `Runtime failure` (1,000,000: served) | 64 KiB + 1: 503 / 403 (64 KiB: served) | no cap: 9 MiB passed intact |
//! | far over the cap (1 TiB announced; chunked without end) | 502 / `Runtime failure` | 503 / 403 | no cap: the client hangs up after 2 MiB and the gateway connection is closed / 502 `bad_gateway` |
//! | wrong content type | served | served | passed / 502, a list answer the sidecar cannot rewrite is refused |
//! | HTTP/1.0 answer | served | served | passed / rewritten |
//! | two different Content-Length | 502 / `Runtime failure`, no read counted | 503 / 403 | 502 / 502 |
//! | two equal Content-Length | served | served | passed / rewritten |
//! | two Content-Type | served | served | both passed / rewritten (the values are read joined, as a client reads them) |
//! | Content-Length beside chunked | served | served | passed whole, the length dropped / rewritten |
//! | redirect (302 to a canary URL) | 502 `Upstream 302` / `Upstream 302`, not followed | 503 / 403 | passed |
//! | head dripping in (gateway) | | | 504 at `gateway_timeout_ms` |
//! | `initialize` answer with two session ids (gateway) | | | passed; no session learned, the tool 404 `Session not found` in both, never forwarded |
//! | `initialize` answer in HTTP/1.0 (gateway) | | | session learned, the tool served |
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/sidecar.rs"]
mod support;

use std::time::Duration;

use bytes::Bytes;
use knowtation_testkit::fault::raw_head;
use knowtation_testkit::{FaultServer, MockBridge, MockCanister, MockGateway, Script};
use serde_json::{json, Value};
use support::{
    assert_no_canary, eventually, exchange, exchange_capped, get_request, intercepted, passthrough,
    post_request, sse_message, token, upstream_reads, Metrics, Raw, Sidecar, BUFFERED,
    HOSTED_FAILURES, IN_FLIGHT,
};

// Deadlines, short so the suite stays fast (every one is configurable, docs/configuration.md).
const CONNECT_MS: u64 = 300;
const CANISTER_MS: u64 = 500;
const BRIDGE_MS: u64 = 300;
const GATEWAY_HEAD_MS: u64 = 500;
const GATEWAY_IDLE_MS: u64 = 400;
/// Added to a deadline before an answer counts as late: the machine may be busy, but an
/// answer that waits for anything other than the deadline would take seconds.
const MARGIN: Duration = Duration::from_millis(1500);
/// A raw exchange that takes this long has hung.
const HUNG: Duration = Duration::from_secs(10);

const ACCEPT_BOTH: &str = "application/json, text/event-stream";
const INIT: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"faults","version":"0"}}}"#;

const REST_BAD_GATEWAY: &str = r#"{"error":"Bad Gateway","code":"BAD_GATEWAY"}"#;
const REST_INVALID_NOTE: &str = r#"{"error":"Invalid note response","code":"BAD_GATEWAY"}"#;
const REST_UNAVAILABLE: &str =
    r#"{"error":"Hosted access context unavailable","code":"SERVICE_UNAVAILABLE"}"#;
const REST_VAULT_FORBIDDEN: &str =
    r#"{"error":"Access to this vault is not allowed.","code":"FORBIDDEN"}"#;
const MCP_NO_HOSTED_ACCESS: &str =
    r#"{"jsonrpc":"2.0","error":{"code":-32600,"message":"No hosted access"}}"#;
const GW_BAD_GATEWAY: &str = r#"{"error":"Bad Gateway","code":"BAD_GATEWAY"}"#;
const GW_TIMEOUT: &str = r#"{"error":"Gateway Timeout","code":"GATEWAY_TIMEOUT"}"#;

fn env(gateway: &str, canister: &str, bridge: &str) -> Vec<(&'static str, String)> {
    vec![
        ("UPSTREAM__GATEWAY_URL", gateway.to_owned()),
        ("UPSTREAM__CANISTER_URL", canister.to_owned()),
        ("UPSTREAM__BRIDGE_URL", bridge.to_owned()),
        ("UPSTREAM__CONNECT_TIMEOUT_MS", CONNECT_MS.to_string()),
        ("UPSTREAM__CANISTER_TIMEOUT_MS", CANISTER_MS.to_string()),
        ("UPSTREAM__GATEWAY_TIMEOUT_MS", GATEWAY_HEAD_MS.to_string()),
        (
            "UPSTREAM__GATEWAY_IDLE_TIMEOUT_MS",
            GATEWAY_IDLE_MS.to_string(),
        ),
        ("HOSTED_CONTEXT__TIMEOUT_MS", BRIDGE_MS.to_string()),
        // Many cells, one caller: the windows must not be what answers.
        ("MCP__CALLS_PER_MINUTE", "100000".to_owned()),
    ]
}

// ---------------------------------------------------------------------------------------
// Scripts shared by the three upstreams.

/// A response head with a `Connection: close` (the sidecar never pools these).
fn head(status: u16, headers: &[(&str, &str)]) -> Bytes {
    let mut all = headers.to_vec();
    all.push(("Connection", "close"));
    raw_head("HTTP/1.1", status, &all)
}

fn len(body: &[u8]) -> String {
    body.len().to_string()
}

/// A chunk of a chunked body.
fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

/// The faults every upstream gets, for a 2xx answer `good` (what a healthy upstream
/// would send for the request) labelled `content_type`. Names are also vault ids and
/// JSON-RPC ids, so they stay within `[A-Za-z0-9_-]`.
fn common_faults(good: &[u8], content_type: &str, canary: &str) -> Vec<(&'static str, Script)> {
    let half = &good[..good.len() / 2];
    let ct = ("Content-Type", content_type);
    let cl = len(good);
    let canary_body = format!(r#"{{"error":"{canary}-5XX","stack":"at {canary}-STACK"}}"#);
    let endless_chunk = format!("{canary}-FLOOD ").repeat(256);
    vec![
        ("reset-before-head", Script::new().reset()),
        (
            "reset-mid-body",
            Script::new()
                .write(head(200, &[ct, ("Content-Length", &cl)]))
                .write(half.to_vec())
                .pause(Duration::from_millis(50))
                .reset(),
        ),
        ("stall-before-head", Script::new().hold()),
        (
            "stall-mid-body",
            Script::new()
                .write(head(200, &[ct, ("Content-Length", &cl)]))
                .write(half.to_vec())
                .hold(),
        ),
        (
            // 40 ms between bytes: far below any per-byte bound, far past the total.
            "slow-drip",
            Script::new()
                .write(head(200, &[ct, ("Content-Length", &cl)]))
                .drip(good.to_vec(), Duration::from_millis(40)),
        ),
        (
            "status-500-canary",
            Script::respond(
                500,
                &[
                    ("Content-Type", "application/json"),
                    ("X-Debug", &format!("{canary}-HEADER")),
                ],
                canary_body,
            ),
        ),
        (
            "ok-not-json",
            Script::respond(
                200,
                &[ct],
                format!("<html><body>{canary}-HTML</body></html>"),
            ),
        ),
        (
            "far-over-cap-announced",
            Script::new()
                .write(head(200, &[ct, ("Content-Length", "1099511627776")]))
                .endless(endless_chunk.clone()),
        ),
        (
            "far-over-cap-chunked",
            Script::new()
                .write(head(200, &[ct, ("Transfer-Encoding", "chunked")]))
                .endless(chunk(endless_chunk.as_bytes())),
        ),
        (
            "wrong-content-type",
            Script::respond(
                200,
                &[("Content-Type", "text/html; charset=iso-8859-1")],
                good.to_vec(),
            ),
        ),
        (
            "http-1-0",
            Script::new()
                .write(raw_head("HTTP/1.0", 200, &[ct]))
                .write(good.to_vec()),
        ),
        (
            "two-content-lengths-differ",
            Script::new()
                .write(head(
                    200,
                    &[ct, ("Content-Length", &cl), ("Content-Length", &len(half))],
                ))
                .write(good.to_vec()),
        ),
        (
            "two-content-lengths-equal",
            Script::new()
                .write(head(
                    200,
                    &[ct, ("Content-Length", &cl), ("Content-Length", &cl)],
                ))
                .write(good.to_vec()),
        ),
        (
            "two-content-types",
            Script::new()
                .write(head(
                    200,
                    &[("Content-Type", "text/html"), ct, ("Content-Length", &cl)],
                ))
                .write(good.to_vec()),
        ),
        (
            // RFC 9112 §6.3 lets a reader take chunked; the sidecar refuses the ambiguity.
            "length-and-chunked",
            Script::new()
                .write(head(
                    200,
                    &[
                        ct,
                        ("Content-Length", "3"),
                        ("Transfer-Encoding", "chunked"),
                    ],
                ))
                .write(chunk(good))
                .write(b"0\r\n\r\n".to_vec()),
        ),
        (
            "redirect",
            Script::respond(
                302,
                &[("Location", &format!("http://127.0.0.1:9/{canary}-LOCATION"))],
                "",
            ),
        ),
    ]
}

// ---------------------------------------------------------------------------------------
// What every cell must leave behind.

/// The checks after a cell: the new log lines and the metrics carry no canary, nothing
/// is in flight or buffered, `/ready` is 200, the fault server's connections are closed
/// (the sidecar let go of the upstream), and a normal request through the same upstream
/// succeeds (`healthy` sends it and checks it).
async fn after_cell<F, Fut>(
    cell: &str,
    sidecar: &Sidecar,
    log_from: usize,
    fault: &FaultServer,
    healthy: F,
) where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    assert!(
        eventually(Duration::from_secs(3), || fault.open_connections() == 0).await,
        "[{cell}] the sidecar kept {} upstream connection(s) open",
        fault.open_connections()
    );
    let mut settled = false;
    for _ in 0..50 {
        let m = sidecar.metrics().await;
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
    healthy().await;
    assert_eq!(sidecar.ready().await, 200, "[{cell}] /ready after the cell");
    let m = sidecar.metrics().await;
    assert_no_canary(cell, "the metrics", &m.text);
    let log = sidecar.log();
    assert_no_canary(cell, "the log", log.get(log_from..).unwrap_or_default());
}

/// The elapsed time of a cell against its deadline: never past deadline + margin, and,
/// when the deadline is what ends it, not much before it either.
fn check_time(cell: &str, elapsed: Duration, deadline_ms: u64, cut_by_deadline: bool) {
    let deadline = Duration::from_millis(deadline_ms);
    assert!(
        elapsed < deadline + MARGIN,
        "[{cell}] took {elapsed:?}, deadline {deadline:?}"
    );
    if cut_by_deadline {
        assert!(
            elapsed + Duration::from_millis(60) >= deadline,
            "[{cell}] answered after {elapsed:?}, before the {deadline:?} deadline could cut it"
        );
    }
}

/// One row of the observed matrix (shown with `--nocapture`): status, time, counters.
fn report(cell: &str, r: &Raw, before: &Metrics, after: &Metrics) {
    eprintln!(
        "CELL {cell} | {} | {} ms | {}",
        r.status,
        r.elapsed.as_millis(),
        after.moved_summary(before)
    );
}

/// Asserts the counter changes between two scrapes: each `expected` series moved by
/// exactly its amount, and no other intercepted or passthrough counter moved.
fn check_moved(cell: &str, before: &Metrics, after: &Metrics, expected: &[(String, f64)]) {
    let moved = after.moved_since(before);
    for (series, delta) in expected {
        let got = moved.get(series).copied().unwrap_or(0.0);
        assert_eq!(
            got, *delta,
            "[{cell}] {series} moved by {got}, expected {delta}; all moves: {moved:#?}"
        );
    }
    for (series, delta) in &moved {
        let watched = series.starts_with("knowtation_sidecar_intercepted_requests_total")
            || series.starts_with("knowtation_sidecar_passthrough_requests_total")
            || series.starts_with("knowtation_sidecar_upstream_reads_total")
            || series.starts_with(HOSTED_FAILURES);
        if watched {
            assert!(
                expected.iter().any(|(s, _)| s == series),
                "[{cell}] unexpected move {series} by {delta}; all moves: {moved:#?}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Requests that reach each upstream.

fn rest_request(sub: &str, vault: &str, path: &str) -> Vec<u8> {
    let auth = format!("Bearer {}", token(sub));
    get_request(
        &format!("/api/v1/section-source?path={path}"),
        &[("Authorization", &auth), ("X-Vault-Id", vault)],
    )
}

fn mcp_post(sub: &str, vault: &str, session: Option<&str>, body: &str) -> Vec<u8> {
    let auth = format!("Bearer {}", token(sub));
    let mut h = vec![
        ("Authorization", auth.as_str()),
        ("Accept", ACCEPT_BOTH),
        ("X-Vault-Id", vault),
    ];
    if let Some(s) = session {
        h.push(("Mcp-Session-Id", s));
    }
    post_request("/mcp", &h, body)
}

fn tool_call(path: &str) -> String {
    json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_section_source","arguments":{"path":path}}}).to_string()
}

/// An MCP session learned by the sidecar (the gateway must answer `initialize`).
async fn session(sidecar: &Sidecar, sub: &str) -> String {
    let r = exchange(sidecar.addr, &mcp_post(sub, "default", None, INIT), HUNG).await;
    assert_eq!(r.status, 200, "initialize: {}", r.all_text());
    r.header("mcp-session-id").expect("a session id").to_owned()
}

/// The tool result of an MCP answer: (`isError`, text).
fn tool_result(r: &Raw) -> (bool, String) {
    let msg = sse_message(&r.text());
    let result = &msg["result"];
    (
        result["isError"] == Value::Bool(true),
        result["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

fn assert_section_source(cell: &str, r: &Raw) {
    assert_eq!(r.status, 200, "[{cell}] {}", r.all_text());
    let doc: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    assert_eq!(
        doc["schema"],
        "knowtation.section_source/v0",
        "[{cell}] {}",
        r.all_text()
    );
}

// ---------------------------------------------------------------------------------------
// The canister (wire contract §4; REST answers §5, MCP tool results §6).

/// What a canister cell must produce on REST and on the MCP tool.
#[derive(Debug, Clone, Copy)]
enum CanisterExpect {
    /// The note is read and served: REST 200, MCP success, `ok`, a 2xx read.
    Served,
    /// A refusal with the §5 body and the §6 tool message.
    Refused {
        rest_body: &'static str,
        mcp_message: &'static str,
        /// The outcome label, the same on both surfaces.
        outcome: &'static str,
        /// The status class counted in `upstream_reads_total`, when a status arrived.
        read: Option<&'static str>,
        /// Whether the total deadline is what ends it.
        deadline: bool,
    },
}

const fn refused(
    rest_body: &'static str,
    mcp_message: &'static str,
    outcome: &'static str,
    read: Option<&'static str>,
    deadline: bool,
) -> CanisterExpect {
    CanisterExpect::Refused {
        rest_body,
        mcp_message,
        outcome,
        read,
        deadline,
    }
}

fn stored_note(body: &str) -> Vec<u8> {
    json!({"path": "cells/n.md", "frontmatter": "{}", "body": body})
        .to_string()
        .into_bytes()
}

/// A note whose body is exactly `units` UTF-16 units (ASCII), a canary in its text.
fn note_of_units(units: usize) -> Vec<u8> {
    let mut body = String::from("# Big\n\nCANARY-CAN-BIG ");
    body.push_str(&"x".repeat(units - body.len()));
    stored_note(&body)
}

fn canister_cells() -> Vec<(&'static str, Script, CanisterExpect)> {
    let good = stored_note("# Fine\n\nCANARY-CAN-BODY text that never leaves\n");
    let expect = |name: &str| match name {
        // Framing that is ambiguous or not allowed: refused before any body is read.
        "reset-before-head"
        | "two-content-lengths-differ"
        | "two-content-lengths-equal"
        | "length-and-chunked" => refused(
            REST_BAD_GATEWAY,
            "Runtime failure",
            "bad_gateway",
            None,
            false,
        ),
        "reset-mid-body" | "far-over-cap-announced" | "far-over-cap-chunked" => refused(
            REST_BAD_GATEWAY,
            "Runtime failure",
            "bad_gateway",
            Some("2xx"),
            false,
        ),
        "stall-before-head" => refused(
            REST_BAD_GATEWAY,
            "Runtime failure",
            "bad_gateway",
            None,
            true,
        ),
        "stall-mid-body" | "slow-drip" => refused(
            REST_BAD_GATEWAY,
            "Runtime failure",
            "bad_gateway",
            Some("2xx"),
            true,
        ),
        "status-500-canary" => refused(
            r#"{"error":"Upstream 500","code":"BAD_GATEWAY"}"#,
            "Upstream 500",
            "upstream_status",
            Some("5xx"),
            false,
        ),
        "ok-not-json" => refused(
            REST_INVALID_NOTE,
            "Runtime failure",
            "bad_gateway",
            Some("2xx"),
            false,
        ),
        // §4 Deviation: a redirect is a status, never followed.
        "redirect" => refused(
            r#"{"error":"Upstream 302","code":"BAD_GATEWAY"}"#,
            "Upstream 302",
            "upstream_status",
            Some("3xx"),
            false,
        ),
        "wrong-content-type" | "http-1-0" | "two-content-types" => CanisterExpect::Served,
        other => panic!("no expectation for {other}"),
    };
    let mut cells: Vec<_> = common_faults(&good, "application/json", "CANARY-CAN")
        .into_iter()
        .map(|(name, script)| (name, script, expect(name)))
        .collect();
    // The note cap (1,000,000 UTF-16 units, spec §10): at it, served; one over, refused.
    let ct = [("Content-Type", "application/json")];
    cells.push((
        "note-at-cap",
        Script::respond(200, &ct, note_of_units(1_000_000)),
        CanisterExpect::Served,
    ));
    cells.push((
        "note-over-cap",
        Script::respond(200, &ct, note_of_units(1_000_001)),
        refused(
            REST_BAD_GATEWAY,
            "Runtime failure",
            "bad_gateway",
            Some("2xx"),
            false,
        ),
    ));
    cells
}

/// One canister cell on one surface.
async fn canister_cell(
    sidecar: &Sidecar,
    fault: &FaultServer,
    cell: &str,
    surface: &str,
    request: &[u8],
    expect: CanisterExpect,
    needle: &str,
) {
    let before = sidecar.metrics().await;
    let seen = fault.count_matching(needle);
    let r = exchange(sidecar.addr, request, HUNG).await;
    assert!(!r.timed_out, "[{cell}] no answer within {HUNG:?}");
    assert_no_canary(cell, "the answer", &r.all_text());
    let after = sidecar.metrics().await;
    report(cell, &r, &before, &after);
    // Exactly one read per call, never a retry or a second request (§4).
    let reads = fault.count_matching(needle) - seen;
    let deadline;
    match expect {
        CanisterExpect::Served => {
            deadline = false;
            if surface == "rest" {
                assert_section_source(cell, &r);
            } else {
                let (error, text) = tool_result(&r);
                assert!(!error, "[{cell}] tool error {text}");
                let doc: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                assert_eq!(doc["schema"], "knowtation.section_source/v0", "[{cell}]");
            }
            check_moved(
                cell,
                &before,
                &after,
                &[
                    (intercepted(surface, "ok"), 1.0),
                    (upstream_reads(surface, "2xx"), 1.0),
                ],
            );
        }
        CanisterExpect::Refused {
            rest_body,
            mcp_message,
            outcome,
            read,
            deadline: cut,
        } => {
            deadline = cut;
            if surface == "rest" {
                // Every canister refusal in the §5 table is a 502 but for 401/403/404.
                assert_eq!(
                    (r.status, r.text().as_str()),
                    (502, rest_body),
                    "[{cell}] REST answer"
                );
                assert_eq!(
                    r.header("content-type"),
                    Some("application/json; charset=utf-8"),
                    "[{cell}]"
                );
            } else {
                assert_eq!(r.status, 200, "[{cell}] {}", r.all_text());
                let (error, text) = tool_result(&r);
                assert!(error, "[{cell}] not a tool error: {text}");
                assert_eq!(
                    text,
                    format!(r#"{{"error":"{mcp_message}","code":"UPSTREAM_ERROR"}}"#),
                    "[{cell}] MCP tool result"
                );
            }
            let mut expected = vec![(intercepted(surface, outcome), 1.0)];
            if let Some(class) = read {
                expected.push((upstream_reads(surface, class), 1.0));
            }
            check_moved(cell, &before, &after, &expected);
        }
    }
    assert_eq!(reads, 1, "[{cell}] the canister saw {reads} requests");
    check_time(cell, r.elapsed, CANISTER_MS, deadline);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canister_fault_matrix() {
    let gateway = MockGateway::start().await;
    let bridge = MockBridge::start().await;
    let ok_note = stored_note("# Fine\n\nCANARY-CAN-OK body\n");
    let canister = FaultServer::start(Script::respond(
        200,
        &[("Content-Type", "application/json")],
        ok_note,
    ))
    .await;
    let cells = canister_cells();
    for (name, script, _) in &cells {
        canister.on(&format!("cells%2F{name}.md"), script.clone());
    }
    let sidecar = Sidecar::spawn(&env(&gateway.url(), &canister.url(), &bridge.url()));
    sidecar.wait_ready().await;
    let sub = "CANARY-SUB-canister";
    let sid = session(&sidecar, sub).await;
    let healthy = || async {
        let r = exchange(
            sidecar.addr,
            &rest_request(sub, "default", "cells/ok.md"),
            HUNG,
        )
        .await;
        assert_section_source("healthy", &r);
    };
    for (name, _, expect) in &cells {
        let needle = format!("cells%2F{name}.md");
        let path = format!("cells/{name}.md");
        for surface in ["rest", "mcp"] {
            let cell = format!("canister/{name}/{surface}");
            let log_from = sidecar.log().len();
            let request = if surface == "rest" {
                rest_request(sub, "default", &path)
            } else {
                mcp_post(sub, "default", Some(&sid), &tool_call(&path))
            };
            canister_cell(
                &sidecar, &canister, &cell, surface, &request, *expect, &needle,
            )
            .await;
            after_cell(&cell, &sidecar, log_from, &canister, healthy).await;
        }
    }
    let log = sidecar.stop();
    assert_no_canary("canister", "the whole log", &log);
    assert!(
        log.contains(r#""outcome":"bad_gateway""#),
        "intercepted requests are logged at debug level:\n{log}"
    );
}

/// Connection refused: the canister's port has nothing behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canister_connection_refused() {
    let gateway = MockGateway::start().await;
    let bridge = MockBridge::start().await;
    let dead = format!("http://{}", support::free_addr());
    let sidecar = Sidecar::spawn(&env(&gateway.url(), &dead, &bridge.url()));
    sidecar.wait_ready().await;
    let sub = "CANARY-SUB-refused";
    let sid = session(&sidecar, sub).await;
    let expect = refused(
        REST_BAD_GATEWAY,
        "Runtime failure",
        "bad_gateway",
        None,
        false,
    );
    for surface in ["rest", "mcp"] {
        let cell = format!("canister/connection-refused/{surface}");
        let request = if surface == "rest" {
            rest_request(sub, "default", "cells/n.md")
        } else {
            mcp_post(sub, "default", Some(&sid), &tool_call("cells/n.md"))
        };
        let before = sidecar.metrics().await;
        let r = exchange(sidecar.addr, &request, HUNG).await;
        let after = sidecar.metrics().await;
        report(&cell, &r, &before, &after);
        let CanisterExpect::Refused {
            rest_body,
            mcp_message,
            ..
        } = expect
        else {
            unreachable!()
        };
        if surface == "rest" {
            assert_eq!((r.status, r.text().as_str()), (502, rest_body), "[{cell}]");
        } else {
            assert_eq!(
                tool_result(&r),
                (
                    true,
                    format!(r#"{{"error":"{mcp_message}","code":"UPSTREAM_ERROR"}}"#)
                ),
                "[{cell}]"
            );
        }
        check_moved(
            &cell,
            &before,
            &after,
            &[(intercepted(surface, "bad_gateway"), 1.0)],
        );
        check_time(&cell, r.elapsed, CONNECT_MS, false);
        assert_eq!(sidecar.ready().await, 200, "[{cell}] /ready");
        assert_no_canary(&cell, "the log", &sidecar.log());
    }
    let log = sidecar.stop();
    assert_no_canary("canister/connection-refused", "the whole log", &log);
}

// ---------------------------------------------------------------------------------------
// The bridge (wire contract §2): REST fails closed (503, 403 for the bridge's 403), an
// MCP `initialize` gets 403 `No hosted access` and never reaches the gateway.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BridgeExpect {
    /// A usable context: REST served, the initialize forwarded and answered by the gateway.
    Served,
    /// A failed lookup (deadline: whether the lookup timeout is what ends it).
    Failed { deadline: bool },
    /// The bridge's own 403.
    Forbidden,
}

fn context(vault: &str) -> Vec<u8> {
    json!({"allowed_vault_ids": [vault], "effective_canister_user_id": "", "scope": null, "role": "editor"})
        .to_string()
        .into_bytes()
}

/// A context for `vault` padded with whitespace to exactly `size` bytes.
fn context_of_size(vault: &str, size: usize) -> Vec<u8> {
    let base = format!(
        r#"{{"allowed_vault_ids":["{vault}"],"scope":null,"role":"editor","pad":"CANARY-BR-PAD"}}"#
    );
    let mut out = base.into_bytes();
    let close = out.pop().unwrap();
    out.resize(size - 1, b' ');
    out.push(close);
    out
}

fn bridge_cells() -> Vec<(&'static str, Script, BridgeExpect)> {
    // The good answer names each cell's vault, so it is built per cell below.
    let mut cells = Vec::new();
    for (name, _) in common_faults(b"{}", "application/json", "CANARY-BR") {
        let good = context(name);
        let scripts = common_faults(&good, "application/json", "CANARY-BR");
        let script = scripts
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| s)
            .unwrap();
        let expect = match name {
            "stall-before-head" | "stall-mid-body" | "slow-drip" => {
                BridgeExpect::Failed { deadline: true }
            }
            "wrong-content-type" | "http-1-0" | "two-content-types" => BridgeExpect::Served,
            _ => BridgeExpect::Failed { deadline: false },
        };
        cells.push((name, script, expect));
    }
    let ct = [("Content-Type", "application/json")];
    cells.push((
        "status-403-canary",
        Script::respond(403, &ct, r#"{"error":"CANARY-BR-403"}"#),
        BridgeExpect::Forbidden,
    ));
    // The answer cap, 64 KiB: at it, a context; one byte over, a failed lookup.
    cells.push((
        "answer-at-cap",
        Script::respond(200, &ct, context_of_size("answer-at-cap", 64 * 1024)),
        BridgeExpect::Served,
    ));
    cells.push((
        "answer-over-cap",
        Script::respond(200, &ct, context_of_size("answer-over-cap", 64 * 1024 + 1)),
        BridgeExpect::Failed { deadline: false },
    ));
    cells
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bridge_fault_matrix() {
    let gateway = MockGateway::start().await;
    let canister = MockCanister::start().await;
    let ct = [("Content-Type", "application/json")];
    let bridge = FaultServer::start(Script::respond(200, &ct, context("default"))).await;
    let cells = bridge_cells();
    for (name, script, _) in &cells {
        bridge.on(&format!("x-vault-id: {name}\r\n"), script.clone());
        canister.insert_note(name, "n.md", &json!({}), "# N\n\nCANARY-BR-NOTE body\n");
    }
    canister.insert_note(
        "default",
        "n.md",
        &json!({}),
        "# N\n\nCANARY-BR-NOTE body\n",
    );
    let sidecar = Sidecar::spawn(&env(&gateway.url(), &canister.url(), &bridge.url()));
    sidecar.wait_ready().await;
    for (name, _, expect) in &cells {
        for surface in ["rest", "mcp"] {
            let cell = format!("bridge/{name}/{surface}");
            // A sub of its own per cell and surface: no cached answer, no spent budget.
            let sub = format!("CANARY-SUB-{name}-{surface}");
            let log_from = sidecar.log().len();
            let before = sidecar.metrics().await;
            let lookups = bridge.count_matching(&format!("x-vault-id: {name}\r\n"));
            let (gw_before, canister_before) = (gateway.count(), canister.count());
            let request = if surface == "rest" {
                rest_request(&sub, name, "n.md")
            } else {
                mcp_post(&sub, name, None, INIT)
            };
            let r = exchange(sidecar.addr, &request, HUNG).await;
            assert!(!r.timed_out, "[{cell}] no answer within {HUNG:?}");
            assert_no_canary(&cell, "the answer", &r.all_text());
            let after = sidecar.metrics().await;
            report(&cell, &r, &before, &after);
            let lookups = bridge.count_matching(&format!("x-vault-id: {name}\r\n")) - lookups;
            assert_eq!(lookups, 1, "[{cell}] the bridge saw {lookups} lookups");
            let forwarded = gateway.count() - gw_before;
            let reads = canister.count() - canister_before;
            let deadline = matches!(expect, BridgeExpect::Failed { deadline: true });
            match (expect, surface) {
                (BridgeExpect::Served, "rest") => {
                    assert_section_source(&cell, &r);
                    assert_eq!(reads, 1, "[{cell}]");
                    check_moved(
                        &cell,
                        &before,
                        &after,
                        &[
                            (intercepted("rest", "ok"), 1.0),
                            (upstream_reads("rest", "2xx"), 1.0),
                        ],
                    );
                }
                (BridgeExpect::Served, _) => {
                    assert_eq!(r.status, 200, "[{cell}] {}", r.all_text());
                    assert!(r.header("mcp-session-id").is_some(), "[{cell}]");
                    assert_eq!(forwarded, 1, "[{cell}]");
                    check_moved(&cell, &before, &after, &[(passthrough("2xx"), 1.0)]);
                }
                (&failed, "rest") => {
                    let (status, body, outcome) = if failed == BridgeExpect::Forbidden {
                        (403, REST_VAULT_FORBIDDEN, "vault_forbidden")
                    } else {
                        (503, REST_UNAVAILABLE, "hosted_context_unavailable")
                    };
                    assert_eq!((r.status, r.text().as_str()), (status, body), "[{cell}]");
                    assert_eq!(reads, 0, "[{cell}] the canister was read");
                    check_moved(
                        &cell,
                        &before,
                        &after,
                        &[
                            (intercepted("rest", outcome), 1.0),
                            (HOSTED_FAILURES.to_owned(), 1.0),
                        ],
                    );
                }
                (_, _) => {
                    assert_eq!(
                        (r.status, r.text().as_str()),
                        (403, MCP_NO_HOSTED_ACCESS),
                        "[{cell}]"
                    );
                    assert_eq!(forwarded, 0, "[{cell}] the initialize reached the gateway");
                    check_moved(
                        &cell,
                        &before,
                        &after,
                        &[
                            (intercepted("mcp", "no_hosted_access"), 1.0),
                            (HOSTED_FAILURES.to_owned(), 1.0),
                        ],
                    );
                }
            }
            check_time(&cell, r.elapsed, BRIDGE_MS, deadline);
            let healthy = || async {
                let sub = format!("CANARY-SUB-healthy-{name}-{surface}");
                let r = exchange(sidecar.addr, &rest_request(&sub, "default", "n.md"), HUNG).await;
                assert_section_source(&cell, &r);
            };
            after_cell(&cell, &sidecar, log_from, &bridge, healthy).await;
        }
    }
    let log = sidecar.stop();
    assert_no_canary("bridge", "the whole log", &log);
    assert!(
        log.contains(r#""outcome":"hosted_context_unavailable""#),
        "intercepted requests are logged:\n{log}"
    );
}

/// Connection refused: the bridge's port has nothing behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bridge_connection_refused() {
    let gateway = MockGateway::start().await;
    let canister = MockCanister::start().await;
    canister.insert_note("default", "n.md", &json!({}), "# N\n");
    let dead = format!("http://{}", support::free_addr());
    let sidecar = Sidecar::spawn(&env(&gateway.url(), &canister.url(), &dead));
    sidecar.wait_ready().await;
    for surface in ["rest", "mcp"] {
        let cell = format!("bridge/connection-refused/{surface}");
        let sub = format!("CANARY-SUB-refused-{surface}");
        let before = sidecar.metrics().await;
        let gw_before = gateway.count();
        let request = if surface == "rest" {
            rest_request(&sub, "default", "n.md")
        } else {
            mcp_post(&sub, "default", None, INIT)
        };
        let r = exchange(sidecar.addr, &request, HUNG).await;
        let after = sidecar.metrics().await;
        report(&cell, &r, &before, &after);
        let outcome = if surface == "rest" {
            assert_eq!(
                (r.status, r.text().as_str()),
                (503, REST_UNAVAILABLE),
                "[{cell}]"
            );
            "hosted_context_unavailable"
        } else {
            assert_eq!(
                (r.status, r.text().as_str()),
                (403, MCP_NO_HOSTED_ACCESS),
                "[{cell}]"
            );
            assert_eq!(gateway.count(), gw_before, "[{cell}] reached the gateway");
            "no_hosted_access"
        };
        check_moved(
            &cell,
            &before,
            &after,
            &[
                (intercepted(surface, outcome), 1.0),
                (HOSTED_FAILURES.to_owned(), 1.0),
            ],
        );
        check_time(&cell, r.elapsed, CONNECT_MS, false);
        assert_eq!(canister.count(), 0, "[{cell}] the canister was read");
        assert_eq!(sidecar.ready().await, 200, "[{cell}] /ready");
    }
    let log = sidecar.stop();
    assert_no_canary("bridge/connection-refused", "the whole log", &log);
}

// ---------------------------------------------------------------------------------------
// The gateway (wire contract §7 passthrough, `docs/daemon.md` "Answers of its own"; §6
// for the `POST /mcp` it answers, which the sidecar reads when it rewrites a list).

/// What a gateway cell must produce.
#[derive(Debug, Clone)]
enum GatewayExpect {
    /// The sidecar's own answer; `deadline` when a deadline of that many ms ends it.
    Own {
        status: u16,
        body: &'static str,
        deadline: Option<u64>,
    },
    /// The gateway's answer passed through whole (status, the named headers, body).
    Passed {
        status: u16,
        body: Vec<u8>,
        headers: Vec<(&'static str, Vec<&'static str>)>,
        /// A slow answer that keeps moving: it takes at least this long and is not cut.
        at_least: Option<Duration>,
    },
    /// The gateway's head passed through, then the body broke off: the framing is left
    /// incomplete, so the client can tell; `deadline` as for `Own`.
    Cut { status: u16, deadline: Option<u64> },
    /// The body never ends: the client reads this many bytes and hangs up; the sidecar
    /// must let go of the gateway's connection.
    ClientHangsUp { after_bytes: usize },
}

struct GatewayCell {
    name: String,
    script: Script,
    expect: GatewayExpect,
    /// The counters that must move, and by how much.
    metric: Vec<(String, f64)>,
}

fn class_of(status: u16) -> String {
    passthrough(&format!("{}xx", status / 100))
}

const GW_GOOD: &[u8] =
    br#"{"ok":true,"note":"CANARY-GW-BODY passes through: it is the gateway's own answer"}"#;
const GW_500: &[u8] = br#"{"error":"CANARY-GW-5XX","stack":"at CANARY-GW-STACK"}"#;

fn gateway_passthrough_cells() -> Vec<GatewayCell> {
    let ct = "application/json";
    let passed = |status: u16, body: &[u8], headers: Vec<(&'static str, Vec<&'static str>)>| {
        GatewayExpect::Passed {
            status,
            body: body.to_vec(),
            headers,
            at_least: None,
        }
    };
    let mut cells = Vec::new();
    for (name, script) in common_faults(GW_GOOD, ct, "CANARY-GW") {
        let expect = match name {
            // No answer head arrived, or one whose framing is ambiguous or not allowed:
            // the sidecar's 502.
            "reset-before-head"
            | "two-content-lengths-differ"
            | "two-content-lengths-equal"
            | "length-and-chunked" => GatewayExpect::Own {
                status: 502,
                body: GW_BAD_GATEWAY,
                deadline: None,
            },
            "reset-mid-body" => GatewayExpect::Cut {
                status: 200,
                deadline: None,
            },
            "stall-before-head" => GatewayExpect::Own {
                status: 504,
                body: GW_TIMEOUT,
                deadline: Some(GATEWAY_HEAD_MS),
            },
            "stall-mid-body" => GatewayExpect::Cut {
                status: 200,
                deadline: Some(GATEWAY_IDLE_MS),
            },
            // No total deadline on passthrough: a body that keeps moving is never cut,
            // however long it takes (docs/daemon.md).
            "slow-drip" => GatewayExpect::Passed {
                status: 200,
                body: GW_GOOD.to_vec(),
                headers: vec![("content-type", vec![ct])],
                at_least: Some(Duration::from_millis(40 * GW_GOOD.len() as u64)),
            },
            // The gateway's own answers, canaries included, are its business (§7); they
            // still never reach a log line or a metric.
            "status-500-canary" => passed(500, GW_500, vec![("x-debug", vec!["CANARY-GW-HEADER"])]),
            "ok-not-json" => passed(
                200,
                b"<html><body>CANARY-GW-HTML</body></html>",
                vec![("content-type", vec![ct])],
            ),
            // Passthrough sets no size cap (docs/daemon.md): the client decides.
            "far-over-cap-announced" | "far-over-cap-chunked" => GatewayExpect::ClientHangsUp {
                after_bytes: 2 * 1024 * 1024,
            },
            "wrong-content-type" => passed(
                200,
                GW_GOOD,
                vec![("content-type", vec!["text/html; charset=iso-8859-1"])],
            ),
            "http-1-0" => passed(200, GW_GOOD, vec![("content-type", vec![ct])]),
            "two-content-types" => {
                passed(200, GW_GOOD, vec![("content-type", vec!["text/html", ct])])
            }
            // A redirect is the gateway's answer like any other.
            "redirect" => passed(
                302,
                b"",
                vec![("location", vec!["http://127.0.0.1:9/CANARY-GW-LOCATION"])],
            ),
            other => panic!("no expectation for {other}"),
        };
        let status = match &expect {
            GatewayExpect::Own { status, .. }
            | GatewayExpect::Passed { status, .. }
            | GatewayExpect::Cut { status, .. } => *status,
            GatewayExpect::ClientHangsUp { .. } => 200,
        };
        cells.push(GatewayCell {
            name: name.to_owned(),
            script,
            metric: vec![(class_of(status), 1.0)],
            expect,
        });
    }
    // A head that drips in: the head deadline runs from the last request byte, so bytes
    // of a head that never completes do not extend it.
    cells.push(GatewayCell {
        name: "head-drip".to_owned(),
        script: Script::new().drip(
            head(
                200,
                &[("Content-Type", ct), ("Content-Length", &len(GW_GOOD))],
            ),
            Duration::from_millis(40),
        ),
        expect: GatewayExpect::Own {
            status: 504,
            body: GW_TIMEOUT,
            deadline: Some(GATEWAY_HEAD_MS),
        },
        metric: vec![(class_of(504), 1.0)],
    });
    // Larger than every cap the sidecar has for its own reads, and passed intact.
    let large: Vec<u8> = (0..9 * 1024 * 1024)
        .map(|i| b'a' + (i % 26) as u8)
        .collect();
    cells.push(GatewayCell {
        name: "large-body-passes".to_owned(),
        script: Script::respond(
            200,
            &[("Content-Type", "application/octet-stream")],
            large.clone(),
        ),
        expect: passed(200, &large, vec![]),
        metric: vec![(class_of(200), 1.0)],
    });
    cells
}

/// `resources/list` through the gateway: the sidecar reads and rewrites the answer (§6:
/// nothing about section sources in it), so the gateway's faults meet its parser.
fn gateway_mcp_cells() -> Vec<GatewayCell> {
    let ct = "application/json";
    let mut cells = Vec::new();
    for (name, _) in common_faults(b"{}", ct, "CANARY-GW") {
        let id = format!("mcp-{name}");
        let good = format!(
            r#"{{"result":{{"resources":[{{"uri":"knowtation://notes/a.md"}},{{"uri":"knowtation://section-source/a.md","name":"CANARY-GW-SECTION"}}]}},"jsonrpc":"2.0","id":"{id}"}}"#
        );
        let rewritten = format!(
            r#"{{"result":{{"resources":[{{"uri":"knowtation://notes/a.md"}}]}},"jsonrpc":"2.0","id":"{id}"}}"#
        )
        .into_bytes();
        let script = common_faults(good.as_bytes(), ct, "CANARY-GW")
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| s)
            .unwrap();
        let own = |status, body, deadline| GatewayExpect::Own {
            status,
            body,
            deadline,
        };
        let bad_list = vec![(intercepted("mcp", "bad_gateway"), 1.0)];
        let (expect, metric) = match name {
            // No head, or a misframed one: the passthrough answers, counted as
            // passthrough.
            "reset-before-head"
            | "two-content-lengths-differ"
            | "two-content-lengths-equal"
            | "length-and-chunked" => (own(502, GW_BAD_GATEWAY, None), vec![(class_of(502), 1.0)]),
            "stall-before-head" => (
                own(504, GW_TIMEOUT, Some(GATEWAY_HEAD_MS)),
                vec![(class_of(504), 1.0)],
            ),
            // A head arrived but the list cannot be read: the sidecar's MCP refusal. A
            // list answer is buffered, so it must arrive whole within the head timeout.
            "reset-mid-body"
            | "ok-not-json"
            | "far-over-cap-announced"
            | "far-over-cap-chunked" => (own(502, GW_BAD_GATEWAY, None), bad_list),
            // Neither JSON nor SSE: a lenient client might still parse it as a list, so
            // an answer the sidecar cannot rewrite is refused, never passed (§6).
            "wrong-content-type" => (own(502, GW_BAD_GATEWAY, None), bad_list),
            "stall-mid-body" | "slow-drip" => {
                (own(502, GW_BAD_GATEWAY, Some(GATEWAY_HEAD_MS)), bad_list)
            }
            // Not a success: streamed back as it is, never parsed.
            "status-500-canary" => (
                GatewayExpect::Passed {
                    status: 500,
                    body: GW_500.to_vec(),
                    headers: vec![],
                    at_least: None,
                },
                vec![(class_of(500), 1.0)],
            ),
            "redirect" => (
                GatewayExpect::Passed {
                    status: 302,
                    body: Vec::new(),
                    headers: vec![],
                    at_least: None,
                },
                vec![(class_of(302), 1.0)],
            ),
            // Read, and the section-source entry removed. With two content types a
            // client sees them joined (`text/html, application/json`) and parses JSON.
            "http-1-0" | "two-content-types" => (
                GatewayExpect::Passed {
                    status: 200,
                    body: rewritten,
                    headers: vec![],
                    at_least: None,
                },
                vec![(class_of(200), 1.0)],
            ),
            other => panic!("no expectation for {other}"),
        };
        cells.push(GatewayCell {
            name: id,
            script,
            expect,
            metric,
        });
    }
    cells
}

async fn gateway_cell(sidecar: &Sidecar, cell: &str, request: &[u8], c: &GatewayCell) {
    let before = sidecar.metrics().await;
    let r = match c.expect {
        GatewayExpect::ClientHangsUp { after_bytes } => {
            exchange_capped(sidecar.addr, request, HUNG, after_bytes).await
        }
        _ => exchange(sidecar.addr, request, HUNG).await,
    };
    let after = sidecar.metrics().await;
    report(cell, &r, &before, &after);
    assert!(!r.timed_out, "[{cell}] no answer within {HUNG:?}");
    match &c.expect {
        GatewayExpect::Own {
            status,
            body,
            deadline,
        } => {
            assert_eq!(
                (r.status, r.text().as_str()),
                (*status, *body),
                "[{cell}] the sidecar's own answer"
            );
            assert!(r.complete, "[{cell}] incomplete");
            assert_no_canary(cell, "the sidecar's own answer", &r.all_text());
            match deadline {
                Some(ms) => check_time(cell, r.elapsed, *ms, true),
                None => check_time(cell, r.elapsed, GATEWAY_HEAD_MS, false),
            }
        }
        GatewayExpect::Passed {
            status,
            body,
            headers,
            at_least,
        } => {
            let shown = String::from_utf8_lossy(&r.bytes[..r.bytes.len().min(1000)]);
            assert_eq!(r.status, *status, "[{cell}] {shown}");
            assert!(r.complete, "[{cell}] incomplete body: {shown}");
            assert!(
                r.body == *body,
                "[{cell}] body differs ({} bytes, expected {}): {shown}",
                r.body.len(),
                body.len(),
            );
            for (name, values) in headers {
                assert_eq!(&r.header_all(name), values, "[{cell}] header {name}");
            }
            match at_least {
                Some(min) => {
                    assert!(r.elapsed >= *min, "[{cell}] cut after {:?}", r.elapsed);
                    assert!(
                        r.elapsed < *min * 2 + MARGIN,
                        "[{cell}] took {:?}",
                        r.elapsed
                    );
                }
                None => check_time(cell, r.elapsed, GATEWAY_HEAD_MS, false),
            }
        }
        GatewayExpect::Cut { status, deadline } => {
            assert_eq!(r.status, *status, "[{cell}] {}", r.all_text());
            assert!(
                !r.complete,
                "[{cell}] the body looks complete: {}",
                r.all_text()
            );
            match deadline {
                Some(ms) => check_time(cell, r.elapsed, *ms, true),
                None => check_time(cell, r.elapsed, GATEWAY_IDLE_MS, false),
            }
        }
        GatewayExpect::ClientHangsUp { after_bytes } => {
            assert_eq!(r.status, 200, "[{cell}]");
            assert!(
                r.bytes.len() >= *after_bytes,
                "[{cell}] only {} bytes",
                r.bytes.len()
            );
        }
    }
    check_moved(cell, &before, &after, &c.metric);
}

/// An `initialize` answered by a misbehaving gateway: which session the sidecar learns
/// decides whether it answers the tool later (§6).
fn initialize_answer(id: &str, session_headers: &[(&str, &str)], version: &str) -> Script {
    let body = format!(
        "event: message\ndata: {{\"result\":{{\"protocolVersion\":\"2025-06-18\",\"capabilities\":{{}},\"serverInfo\":{{\"name\":\"fault\",\"version\":\"0\"}}}},\"jsonrpc\":\"2.0\",\"id\":\"{id}\"}}\n\n"
    );
    let mut headers = vec![("Content-Type", "text/event-stream")];
    headers.extend_from_slice(session_headers);
    if version == "HTTP/1.0" {
        Script::new()
            .write(raw_head(version, 200, &headers))
            .write(body)
    } else {
        let n = body.len().to_string();
        headers.push(("Content-Length", &n));
        Script::new().write(head(200, &headers)).write(body)
    }
}

fn initialize_with_id(id: &str) -> String {
    INIT.replace(r#""id":0"#, &format!(r#""id":"{id}""#))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_fault_matrix() {
    let canister = MockCanister::start().await;
    let bridge = MockBridge::start().await;
    canister.insert_note(
        "default",
        "n.md",
        &json!({}),
        "# N\n\nCANARY-GW-NOTE body\n",
    );
    let gateway = FaultServer::start(Script::respond(
        200,
        &[("Content-Type", "text/plain")],
        "fine",
    ))
    .await;
    let passthrough_cells = gateway_passthrough_cells();
    let mcp_cells = gateway_mcp_cells();
    for c in &passthrough_cells {
        gateway.on(&format!("GET /cell/{} ", c.name), c.script.clone());
    }
    for c in &mcp_cells {
        gateway.on(&format!(r#""id":"{}""#, c.name), c.script.clone());
    }
    gateway.on(
        r#""id":"init-two-session-ids""#,
        initialize_answer(
            "init-two-session-ids",
            &[
                ("Mcp-Session-Id", "fault-session-a"),
                ("Mcp-Session-Id", "fault-session-b"),
            ],
            "HTTP/1.1",
        ),
    );
    gateway.on(
        r#""id":"init-http-1-0""#,
        initialize_answer(
            "init-http-1-0",
            &[("Mcp-Session-Id", "fault-session-h10")],
            "HTTP/1.0",
        ),
    );
    gateway.on(
        r#""id":"init-matrix""#,
        initialize_answer(
            "init-matrix",
            &[("Mcp-Session-Id", "fault-session-matrix")],
            "HTTP/1.1",
        ),
    );
    let sidecar = Sidecar::spawn(&env(&gateway.url(), &canister.url(), &bridge.url()));
    sidecar.wait_ready().await;
    let healthy = || async {
        let r = exchange(sidecar.addr, &get_request("/healthy", &[]), HUNG).await;
        assert_eq!((r.status, r.text().as_str()), (200, "fine"), "healthy");
    };
    let sub = "CANARY-SUB-gateway";
    for c in &passthrough_cells {
        let cell = format!("gateway/{}/passthrough", c.name);
        let log_from = sidecar.log().len();
        let request = get_request(
            &format!("/cell/{}", c.name),
            &[("X-Canary", "CANARY-REQ-HEADER")],
        );
        gateway_cell(&sidecar, &cell, &request, c).await;
        let seen = gateway.count_matching(&format!("GET /cell/{} ", c.name));
        assert_eq!(seen, 1, "[{cell}] the gateway saw {seen} requests");
        after_cell(&cell, &sidecar, log_from, &gateway, healthy).await;
    }
    // The list calls are forwarded in a session the gateway opened (§6); none of the
    // faults below is the gateway's answer for a session it does not know.
    let init = mcp_post(sub, "default", None, &initialize_with_id("init-matrix"));
    let r = exchange(sidecar.addr, &init, HUNG).await;
    assert_eq!(r.header("mcp-session-id"), Some("fault-session-matrix"));
    for c in &mcp_cells {
        let cell = format!("gateway/{}/post-mcp", c.name);
        let log_from = sidecar.log().len();
        let body =
            json!({"jsonrpc":"2.0","id":c.name,"method":"resources/list","params":{}}).to_string();
        let request = mcp_post(sub, "default", Some("fault-session-matrix"), &body);
        gateway_cell(&sidecar, &cell, &request, c).await;
        let seen = gateway.count_matching(&format!(r#""id":"{}""#, c.name));
        assert_eq!(seen, 1, "[{cell}] the gateway saw {seen} requests");
        after_cell(&cell, &sidecar, log_from, &gateway, healthy).await;
    }

    // Two session ids in one `initialize` answer: the sidecar learns neither, so the tool
    // is refused in both (404, never forwarded) while the client got the gateway's answer.
    let cell = "gateway/init-two-session-ids/post-mcp";
    let log_from = sidecar.log().len();
    let before = sidecar.metrics().await;
    let init = initialize_with_id("init-two-session-ids");
    let r = exchange(sidecar.addr, &mcp_post(sub, "default", None, &init), HUNG).await;
    let after = sidecar.metrics().await;
    report(cell, &r, &before, &after);
    assert_eq!(r.status, 200, "[{cell}] {}", r.all_text());
    assert_eq!(
        r.header_all("mcp-session-id"),
        ["fault-session-a", "fault-session-b"],
        "[{cell}]"
    );
    check_moved(cell, &before, &after, &[(class_of(200), 1.0)]);
    for sid in ["fault-session-a", "fault-session-b"] {
        let before = sidecar.metrics().await;
        let call = mcp_post(sub, "default", Some(sid), &tool_call("n.md"));
        let r = exchange(sidecar.addr, &call, HUNG).await;
        let after = sidecar.metrics().await;
        report(&format!("{cell}/tool-in-{sid}"), &r, &before, &after);
        assert_eq!(
            (r.status, r.text().as_str()),
            (
                404,
                r#"{"jsonrpc":"2.0","error":{"code":-32600,"message":"Session not found"}}"#
            ),
            "[{cell}] tool call in {sid}"
        );
        check_moved(
            cell,
            &before,
            &after,
            &[(intercepted("mcp", "session_not_found"), 1.0)],
        );
    }
    assert_eq!(
        gateway.count_matching("get_section_source"),
        0,
        "[{cell}] the tool reached the gateway"
    );
    after_cell(cell, &sidecar, log_from, &gateway, healthy).await;

    // An HTTP/1.0 `initialize` answer with one session id: learned, and the tool works in it.
    let cell = "gateway/init-http-1-0/post-mcp";
    let log_from = sidecar.log().len();
    let before = sidecar.metrics().await;
    let init = initialize_with_id("init-http-1-0");
    let r = exchange(sidecar.addr, &mcp_post(sub, "default", None, &init), HUNG).await;
    let after = sidecar.metrics().await;
    report(cell, &r, &before, &after);
    assert_eq!(
        (r.status, r.header("mcp-session-id")),
        (200, Some("fault-session-h10")),
        "[{cell}]"
    );
    assert!(
        sse_message(&r.text())["result"].is_object(),
        "[{cell}] {}",
        r.all_text()
    );
    check_moved(cell, &before, &after, &[(class_of(200), 1.0)]);
    let before = sidecar.metrics().await;
    let call = mcp_post(
        sub,
        "default",
        Some("fault-session-h10"),
        &tool_call("n.md"),
    );
    let r = exchange(sidecar.addr, &call, HUNG).await;
    let after = sidecar.metrics().await;
    report(&format!("{cell}/tool"), &r, &before, &after);
    let (error, text) = tool_result(&r);
    assert!(!error, "[{cell}] {text}");
    assert_no_canary(cell, "the tool answer", &r.all_text());
    check_moved(
        cell,
        &before,
        &after,
        &[
            (intercepted("mcp", "ok"), 1.0),
            (upstream_reads("mcp", "2xx"), 1.0),
        ],
    );
    after_cell(cell, &sidecar, log_from, &gateway, healthy).await;

    let log = sidecar.stop();
    assert_no_canary("gateway", "the whole log", &log);
    assert!(
        log.contains("gateway request failed") && log.contains(r#""route":"passthrough""#),
        "passthrough requests and gateway failures are logged:\n{log}"
    );
}

/// Connection refused: nothing listens on the gateway's port. Passthrough and forwarded
/// MCP get the sidecar's 502, `/ready` is 503 while the gateway is down (the probe fails),
/// the sidecar's own surface keeps answering, and once the gateway is back the sidecar
/// is ready again without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_connection_refused() {
    let canister = MockCanister::start().await;
    let bridge = MockBridge::start().await;
    canister.insert_note("default", "n.md", &json!({}), "# N\n");
    let gateway_addr = support::free_addr();
    let sidecar = Sidecar::spawn(&env(
        &format!("http://{gateway_addr}"),
        &canister.url(),
        &bridge.url(),
    ));
    // `/ready` stays 503 while the gateway is down, so wait for both listeners instead:
    // the admin one is bound just after the main one.
    assert!(
        eventually(Duration::from_secs(20), || [sidecar.addr, sidecar.admin]
            .iter()
            .all(|a| std::net::TcpStream::connect(a).is_ok()))
        .await,
        "the listeners never opened"
    );
    let sub = "CANARY-SUB-gateway-down";
    // The forwarded `POST /mcp` is the `initialize`: any other call is forwarded only in
    // a session the gateway opened, which a gateway that never answered has not (§6).
    let requests = [
        ("passthrough", get_request("/anything", &[])),
        ("post-mcp-initialize", mcp_post(sub, "default", None, INIT)),
    ];
    for (what, request) in &requests {
        let cell = format!("gateway/connection-refused/{what}");
        let before = sidecar.metrics().await;
        let r = exchange(sidecar.addr, request, HUNG).await;
        let after = sidecar.metrics().await;
        report(&cell, &r, &before, &after);
        assert_eq!(
            (r.status, r.text().as_str()),
            (502, GW_BAD_GATEWAY),
            "[{cell}]"
        );
        check_moved(&cell, &before, &after, &[(class_of(502), 1.0)]);
        check_time(&cell, r.elapsed, CONNECT_MS, false);
    }
    assert_eq!(
        sidecar
            .metrics()
            .await
            .get("knowtation_sidecar_mcp_sessions"),
        0.0
    );
    assert_eq!(
        sidecar.ready().await,
        503,
        "/ready while the gateway is down"
    );
    assert_eq!(
        sidecar
            .metrics()
            .await
            .get("knowtation_sidecar_gateway_reachable"),
        0.0
    );
    // The sidecar's own surface does not need the gateway.
    let r = exchange(sidecar.addr, &rest_request(sub, "default", "n.md"), HUNG).await;
    assert_section_source("gateway/connection-refused/rest", &r);

    let gateway = FaultServer::try_start_on(
        gateway_addr,
        Script::respond(200, &[("Content-Type", "text/plain")], "back"),
    )
    .await
    .expect("the gateway's port is free again");
    sidecar.wait_ready().await;
    let r = exchange(sidecar.addr, &get_request("/anything", &[]), HUNG).await;
    assert_eq!((r.status, r.text().as_str()), (200, "back"));
    assert!(gateway.count() >= 1);
    let log = sidecar.stop();
    assert_no_canary("gateway/connection-refused", "the whole log", &log);
}
