//! What the operator reads about the real binary's answers: why a token was refused (the
//! metric, the access line and the REST `WWW-Authenticate` header), with nothing of the
//! token in any of them.
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "support/sidecar.rs"]
mod support;

use std::time::Duration;

use knowtation_sidecar::testkit::{sign_token, unix_now, MockCanister, MockGateway};
use serde_json::json;
use support::{exchange, get_request, post_request, Sidecar, SECRET};

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
