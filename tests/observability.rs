//! What the operator reads about the real binary: why a token was refused (the metric,
//! the access line and the REST `WWW-Authenticate` header, with nothing of the token in
//! any of them); a missing note counted as a miss on both surfaces; which intercept mode
//! runs, with a warning for shadow mode; the process and build facts; one request
//! followed by its id from the access line to the gateway.
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "support/sidecar.rs"]
mod support;

use std::time::Duration;

use knowtation_testkit::{sign_token, unix_now, MockBridge, MockCanister, MockGateway};
use serde_json::json;
use support::{
    exchange, get_request, intercepted, post_request, sse_message, token, Sidecar, SECRET,
};

const SECTION: &str = "/api/v1/section-source?path=a.md";

/// `knowtation_sidecar_tokens_refused_total{surface,reason}`.
fn refused(surface: &str, reason: &str) -> String {
    format!("knowtation_sidecar_tokens_refused_total{{reason=\"{reason}\",surface=\"{surface}\"}}")
}

/// Every refusal class: (reason, Authorization value or none, the challenge's error
/// part). Each token is marked so that a leak of it shows.
fn cases() -> Vec<(&'static str, Option<String>, &'static str)> {
    let now = unix_now();
    let signed = |claims: serde_json::Value| Some(format!("Bearer {}", sign_token(SECRET, claims)));
    let other = "another-secret-LEAKMARK-0123456789abcdef";
    vec![
        ("missing", None, "Bearer"),
        (
            "malformed",
            Some("Basic LEAKMARK".to_owned()),
            r#"Bearer error="invalid_request", error_description="expected one Authorization header: Bearer <token>""#,
        ),
        (
            "malformed",
            Some("Bearer LEAKMARK.not.a-jwt".to_owned()),
            r#"Bearer error="invalid_token", error_description="the token is malformed""#,
        ),
        (
            "bad_signature",
            Some(format!(
                "Bearer {}",
                sign_token(other, json!({"sub": "LEAKMARK-u", "exp": now + 600}))
            )),
            r#"Bearer error="invalid_token", error_description="the signature does not verify""#,
        ),
        (
            "expired",
            signed(json!({"sub": "LEAKMARK-u", "exp": now - 10})),
            r#"Bearer error="invalid_token", error_description="the token has expired""#,
        ),
        (
            "not_yet_valid",
            signed(json!({"sub": "LEAKMARK-u", "exp": now + 600, "nbf": now + 300})),
            r#"Bearer error="invalid_token", error_description="the token is not yet valid""#,
        ),
        (
            "no_expiry",
            signed(json!({"sub": "LEAKMARK-u"})),
            r#"Bearer error="invalid_token", error_description="the token has no expiry""#,
        ),
        (
            "wrong_kind",
            signed(json!({"sub": "LEAKMARK-u", "exp": now + 600, "type": "LEAKMARK"})),
            r#"Bearer error="invalid_token", error_description="the token is of the wrong kind""#,
        ),
        (
            "insufficient_scope",
            signed(
                json!({"sub": "LEAKMARK-u", "exp": now + 600, "type": "mcp_access", "scopes": []}),
            ),
            r#"Bearer error="insufficient_scope", error_description="the scopes of the token do not allow this method""#,
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_token_says_why_in_the_metric_the_log_and_the_challenge() {
    let gateway = MockGateway::start().await;
    let canister = MockCanister::start().await;
    let sidecar = Sidecar::spawn(&[
        ("UPSTREAM__GATEWAY_URL", gateway.url()),
        ("UPSTREAM__CANISTER_URL", canister.url()),
    ]);
    sidecar.wait_ready().await;
    let before = sidecar.metrics().await;
    let mut expected = std::collections::BTreeMap::<String, f64>::new();
    for (reason, authorization, challenge) in cases() {
        let headers: Vec<(&str, &str)> = authorization
            .as_deref()
            .map(|a| vec![("Authorization", a)])
            .unwrap_or_default();
        let raw = exchange(
            sidecar.addr,
            &get_request(SECTION, &headers),
            Duration::from_secs(10),
        )
        .await;
        assert_eq!(raw.status, 401, "{reason}: {}", raw.all_text());
        assert_eq!(raw.header("www-authenticate"), Some(challenge), "{reason}");
        assert_eq!(
            raw.text(),
            r#"{"error":"Unauthorized","code":"UNAUTHORIZED"}"#
        );
        *expected.entry(refused("rest", reason)).or_default() += 1.0;
    }
    // On /mcp: the same reasons, in the gateway's JSON-RPC answer (no challenge there).
    let expired = format!(
        "Bearer {}",
        sign_token(SECRET, json!({"sub": "LEAKMARK-u", "exp": unix_now() - 10}))
    );
    let raw = exchange(
        sidecar.addr,
        &post_request(
            "/mcp",
            &[
                ("Authorization", &expired),
                ("Accept", "application/json, text/event-stream"),
            ],
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
        ),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(raw.status, 401, "{}", raw.all_text());
    *expected.entry(refused("mcp", "expired")).or_default() += 1.0;

    let wanted: Vec<(String, f64)> = expected.clone().into_iter().collect();
    let after = sidecar.metrics_settled(&before, &wanted).await;
    for reason in knowtation_sidecar::telemetry::TokenRefusal::ALL {
        for surface in ["rest", "mcp"] {
            let series = refused(surface, reason.as_str());
            assert_eq!(
                after.get(&series) - before.get(&series),
                expected.get(&series).copied().unwrap_or(0.0),
                "{series}"
            );
        }
    }
    let log = sidecar.stop();
    for (reason, _, _) in cases() {
        assert!(
            log.contains(&format!("\"auth_reason\":\"{reason}\"")),
            "no access line with auth_reason {reason}:\n{log}"
        );
    }
    assert!(!log.contains("LEAKMARK"), "a token reached the log:\n{log}");
    assert!(!after.text.contains("LEAKMARK"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_configured_is_told_apart_from_a_bad_signature() {
    let gateway = MockGateway::start().await;
    let sidecar = Sidecar::spawn(&[
        ("UPSTREAM__GATEWAY_URL", gateway.url()),
        ("AUTH__JWT_SECRETS", String::new()),
    ]);
    sidecar.wait_ready().await;
    let token = format!(
        "Bearer {}",
        sign_token(SECRET, json!({"sub": "u", "exp": unix_now() + 600}))
    );
    let raw = exchange(
        sidecar.addr,
        &get_request(SECTION, &[("Authorization", &token)]),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(raw.status, 401);
    // The caller is told what a bad signature tells it: nothing of the configuration.
    assert_eq!(
        raw.header("www-authenticate"),
        Some(r#"Bearer error="invalid_token", error_description="the signature does not verify""#)
    );
    let series = refused("rest", "unknown_key");
    let before = support::Metrics::default();
    let after = sidecar
        .metrics_settled(&before, &[(series.clone(), 1.0)])
        .await;
    assert_eq!(after.get(&series), 1.0);
    assert_eq!(after.get(&refused("rest", "bad_signature")), 0.0);
}

const INIT: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"observability","version":"0"}}}"#;

/// `POST /mcp` as `sub`, in `session` when given.
fn mcp_post(sub: &str, session: Option<&str>, body: &str) -> Vec<u8> {
    let auth = format!("Bearer {}", token(sub));
    let mut h = vec![
        ("Authorization", auth.as_str()),
        ("Accept", "application/json, text/event-stream"),
        ("X-Vault-Id", "default"),
    ];
    if let Some(s) = session {
        h.push(("Mcp-Session-Id", s));
    }
    post_request("/mcp", &h, body)
}

/// A note the canister does not have is the caller's miss on both surfaces: REST 404
/// and the MCP tool's `Upstream 404` both count `not_found`, never `upstream_status`
/// (which the canister-failure alert reads).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_note_is_not_found_on_both_surfaces() {
    let gateway = MockGateway::start().await;
    let canister = MockCanister::start().await;
    canister.create_vault("default");
    let bridge = MockBridge::start().await;
    let sidecar = Sidecar::spawn(&[
        ("UPSTREAM__GATEWAY_URL", gateway.url()),
        ("UPSTREAM__CANISTER_URL", canister.url()),
        ("UPSTREAM__BRIDGE_URL", bridge.url()),
    ]);
    sidecar.wait_ready().await;
    let before = sidecar.metrics().await;
    let hung = Duration::from_secs(10);

    let bearer = format!("Bearer {}", token("u1"));
    let rest = exchange(
        sidecar.addr,
        &get_request(
            "/api/v1/section-source?path=inbox/absent.md",
            &[("Authorization", &bearer)],
        ),
        hung,
    )
    .await;
    assert_eq!(rest.status, 404, "{}", rest.all_text());

    let init = exchange(sidecar.addr, &mcp_post("u1", None, INIT), hung).await;
    assert_eq!(init.status, 200, "{}", init.all_text());
    let session = init.header("mcp-session-id").unwrap().to_owned();
    let call = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_section_source","arguments":{"path":"inbox/absent.md"}}});
    let mcp = exchange(
        sidecar.addr,
        &mcp_post("u1", Some(&session), &call.to_string()),
        hung,
    )
    .await;
    assert_eq!(mcp.status, 200, "{}", mcp.all_text());
    let result = &sse_message(&mcp.text())["result"];
    assert_eq!(result["isError"], true, "{}", mcp.all_text());
    assert!(
        result["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("Upstream 404"),
        "{}",
        mcp.all_text()
    );

    let after = sidecar
        .metrics_settled(
            &before,
            &[
                (intercepted("rest", "not_found"), 1.0),
                (intercepted("mcp", "not_found"), 1.0),
            ],
        )
        .await;
    for surface in ["rest", "mcp"] {
        let moved = |outcome: &str| {
            let series = intercepted(surface, outcome);
            after.get(&series) - before.get(&series)
        };
        assert_eq!(moved("not_found"), 1.0, "{surface}");
        assert_eq!(moved("upstream_status"), 0.0, "{surface}");
    }
}

/// Without a canister the tool fails as the gateway's does (`Runtime failure`), and is
/// counted `not_configured`, as on REST, for the alert that says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_canister_is_not_configured_on_both_surfaces() {
    let gateway = MockGateway::start().await;
    let bridge = MockBridge::start().await;
    let sidecar = Sidecar::spawn(&[
        ("UPSTREAM__GATEWAY_URL", gateway.url()),
        ("UPSTREAM__BRIDGE_URL", bridge.url()),
    ]);
    sidecar.wait_ready().await;
    let before = sidecar.metrics().await;
    let hung = Duration::from_secs(10);
    let bearer = format!("Bearer {}", token("u1"));
    let rest = exchange(
        sidecar.addr,
        &get_request(SECTION, &[("Authorization", &bearer)]),
        hung,
    )
    .await;
    assert_eq!(rest.status, 503, "{}", rest.all_text());
    let init = exchange(sidecar.addr, &mcp_post("u1", None, INIT), hung).await;
    let session = init.header("mcp-session-id").unwrap().to_owned();
    let call = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_section_source","arguments":{"path":"a.md"}}});
    let mcp = exchange(
        sidecar.addr,
        &mcp_post("u1", Some(&session), &call.to_string()),
        hung,
    )
    .await;
    let result = &sse_message(&mcp.text())["result"];
    assert_eq!(
        result["content"][0]["text"],
        r#"{"error":"Runtime failure","code":"UPSTREAM_ERROR"}"#
    );
    let after = sidecar
        .metrics_settled(
            &before,
            &[
                (intercepted("rest", "not_configured"), 1.0),
                (intercepted("mcp", "not_configured"), 1.0),
            ],
        )
        .await;
    for surface in ["rest", "mcp"] {
        let moved = |outcome: &str| {
            let series = intercepted(surface, outcome);
            after.get(&series) - before.get(&series)
        };
        assert_eq!(moved("not_configured"), 1.0, "{surface}");
        assert_eq!(moved("bad_gateway"), 0.0, "{surface}");
    }
}

/// `knowtation_sidecar_intercept_mode{mode}` of one scrape.
fn mode(m: &support::Metrics, mode: &str) -> f64 {
    m.get(&format!(
        "knowtation_sidecar_intercept_mode{{mode=\"{mode}\"}}"
    ))
}

/// Shadow mode is not silent: a warning at start naming the key, and the mode in the
/// metrics, for enforce as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_intercept_mode_is_a_metric_and_shadow_mode_warns_at_start() {
    let gateway = MockGateway::start().await;
    let enforce = Sidecar::spawn(&[("UPSTREAM__GATEWAY_URL", gateway.url())]);
    let shadow = Sidecar::spawn(&[
        ("UPSTREAM__GATEWAY_URL", gateway.url()),
        ("INTERCEPT__MODE", "shadow".to_owned()),
    ]);
    enforce.wait_ready().await;
    shadow.wait_ready().await;
    let (e, s) = (enforce.metrics().await, shadow.metrics().await);
    assert_eq!((mode(&e, "enforce"), mode(&e, "shadow")), (1.0, 0.0));
    assert_eq!((mode(&s, "enforce"), mode(&s, "shadow")), (0.0, 1.0));
    let (e, s) = (enforce.stop(), shadow.stop());
    let warning = |log: &str| {
        log.lines().any(|l| {
            l.contains("\"key\":\"intercept.mode\"")
                && l.contains("\"level\":\"WARN\"")
                && l.contains("shadow mode")
        })
    };
    assert!(warning(&s), "no shadow-mode warning:\n{s}");
    assert!(!warning(&e), "a shadow-mode warning in enforce mode:\n{e}");
}

/// The process_* families and the build's commit and compiler, as a scrape shows them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_and_build_facts_are_exported() {
    let gateway = MockGateway::start().await;
    let sidecar = Sidecar::spawn(&[("UPSTREAM__GATEWAY_URL", gateway.url())]);
    sidecar.wait_ready().await;
    let m = sidecar.metrics().await;
    let rss = m.get("process_resident_memory_bytes");
    assert!((1e6..1e9).contains(&rss), "resident memory {rss}");
    assert!(m.get("process_open_fds") >= 3.0);
    assert!(m.get("process_max_fds") >= m.get("process_open_fds"));
    assert!(m.get("process_threads") >= 1.0);
    assert!(m.samples.contains_key("process_cpu_seconds_total"));
    let started = m.get("process_start_time_seconds");
    let now = unix_now() as f64;
    assert!(
        (now - 600.0..=now + 1.0).contains(&started),
        "{started} vs {now}"
    );
    let build = format!(
        "knowtation_sidecar_build_info{{commit=\"{}\",rustc=\"{}\",version=\"{}\"}}",
        env!("KNOWTATION_SIDECAR_COMMIT"),
        env!("KNOWTATION_SIDECAR_RUSTC"),
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(m.get(&build), 1.0, "{}", m.text);
}

/// The JSON access lines of a log with `route`.
fn access_lines(log: &str, route: &str) -> Vec<serde_json::Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| l["route"] == route)
        .collect()
}

/// Every request gets an id: the caller's `X-Request-Id` in its bounded form, else the
/// trace id of its `traceparent`, else a new one; the access line carries it and the
/// gateway receives it as `X-Request-Id`, whatever the caller sent there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_is_followed_by_its_id_from_the_log_to_the_gateway() {
    let gateway = MockGateway::start().await;
    let canister = MockCanister::start().await;
    let bridge = MockBridge::start().await;
    let sidecar = Sidecar::spawn(&[
        ("UPSTREAM__GATEWAY_URL", gateway.url()),
        ("UPSTREAM__CANISTER_URL", canister.url()),
        ("UPSTREAM__BRIDGE_URL", bridge.url()),
    ]);
    sidecar.wait_ready().await;
    let hung = Duration::from_secs(10);
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let traceparent = format!("00-{trace}-00f067aa0ba902b7-01");
    // (path, request headers, the id the gateway and the log must have; none: a new one)
    type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, Option<&'a str>);
    let cases: Vec<Case<'_>> = vec![
        (
            "/one",
            vec![("X-Request-Id", "req-one.1")],
            Some("req-one.1"),
        ),
        ("/two", vec![("traceparent", &traceparent)], Some(trace)),
        (
            "/three",
            vec![("X-Request-Id", "not an id"), ("traceparent", &traceparent)],
            Some(trace),
        ),
        ("/four", vec![], None),
    ];
    for (path, headers, _) in &cases {
        let raw = exchange(sidecar.addr, &get_request(path, headers), hung).await;
        assert_eq!(raw.status, 200, "{}", raw.all_text());
    }
    // The REST route the sidecar answers itself: the id is on its access line too.
    exchange(
        sidecar.addr,
        &get_request(
            SECTION,
            &[
                ("X-Request-Id", "rest-77"),
                ("Authorization", &format!("Bearer {}", token("u1"))),
            ],
        ),
        hung,
    )
    .await;
    // The hosted-context lookup made for that request carries the same id.
    let lookups: Vec<Vec<String>> = bridge
        .requests()
        .iter()
        .map(|r| r.header_all("x-request-id"))
        .collect();
    assert_eq!(lookups, [vec!["rest-77".to_owned()]], "{lookups:?}");
    // The MCP tool the sidecar answers itself: its access line carries the id too.
    let init = exchange(sidecar.addr, &mcp_post("u1", None, INIT), hung).await;
    assert_eq!(init.status, 200, "{}", init.all_text());
    let session = init.header("mcp-session-id").unwrap().to_owned();
    let call = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_section_source","arguments":{"path":"a.md"}}});
    let auth = format!("Bearer {}", token("u1"));
    let tool = exchange(
        sidecar.addr,
        &post_request(
            "/mcp",
            &[
                ("Authorization", auth.as_str()),
                ("Accept", "application/json, text/event-stream"),
                ("X-Vault-Id", "default"),
                ("Mcp-Session-Id", session.as_str()),
                ("X-Request-Id", "mcp-9"),
            ],
            &call.to_string(),
        ),
        hung,
    )
    .await;
    assert_eq!(tool.status, 200, "{}", tool.all_text());
    let received = gateway.requests();
    let log = sidecar.stop();
    let lines = access_lines(&log, "passthrough");
    for (path, _, expected) in cases.clone() {
        let at_gateway = received
            .iter()
            .find(|r| r.uri.path() == path)
            .unwrap_or_else(|| panic!("{path} did not reach the gateway"));
        // Tracing off: the caller's trace context passes as it came.
        let sent: Vec<(&str, &str)> = cases
            .iter()
            .find(|c| c.0 == path)
            .map(|c| c.1.clone())
            .unwrap_or_default();
        if let Some((_, tp)) = sent.iter().find(|(k, _)| *k == "traceparent") {
            assert_eq!(at_gateway.header_all("traceparent"), [*tp], "{path}");
        }
        let ids = at_gateway.header_all("x-request-id");
        assert_eq!(ids.len(), 1, "{path}: {ids:?}");
        let id = ids[0].clone();
        match expected {
            Some(want) => assert_eq!(id, want, "{path}"),
            None => {
                assert_eq!(id.len(), 32, "{path}: {id}");
                assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
            }
        }
        assert!(
            lines.iter().any(|l| l["request_id"] == id.as_str()),
            "{path}: no access line with request_id {id}:\n{log}"
        );
    }
    let intercepted = access_lines(&log, "intercepted");
    assert!(
        intercepted.iter().any(|l| l["request_id"] == "rest-77"),
        "{log}"
    );
    assert!(
        intercepted
            .iter()
            .any(|l| l["surface"] == "mcp" && l["request_id"] == "mcp-9"),
        "{log}"
    );
    // Every access line has one.
    for line in lines.iter().chain(&intercepted) {
        assert!(line["request_id"].is_string(), "{line}");
    }
}
