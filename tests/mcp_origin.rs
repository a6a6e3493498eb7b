//! DNS-rebinding protection on `/mcp`, through the real binary (`serve`): a request whose
//! `Origin` is not allowed is refused with the MCP SDK's own 403 before anything else
//! (the token is not read, no session, window, budget slot or gateway request is
//! spent), on every method; a request without `Origin`, or with an allowed one, passes;
//! `mcp.allowed_origins` takes only origins.
//!
//! The attack the MCP transport specification names: a page on
//! `http://evil.example.com` whose name is rebound to the sidecar's address sends
//! `Host: evil.example.com` and `Origin: http://evil.example.com`. The gateway behind
//! never sees that `Host` (the sidecar sends the gateway's own), so the check has to be
//! here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/sidecar.rs"]
mod support;

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use knowtation_testkit::{MockBridge, MockGateway};
use serde_json::json;
use support::{exchange, intercepted, token, tokens_verified, Raw, Sidecar, BIN};

const ACCEPT: &str = "application/json, text/event-stream";
const WAIT: Duration = Duration::from_secs(10);
const EVIL: &str = "http://evil.example.com";
const INIT: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#;
const PING: &str = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;

/// The SDK's answer (`StreamableHTTPServerTransport` with DNS-rebinding protection) to
/// an origin it does not allow.
fn refusal(origin: &str) -> String {
    let message = serde_json::to_string(&format!("Invalid Origin header: {origin}")).unwrap();
    format!(r#"{{"jsonrpc":"2.0","error":{{"code":-32000,"message":{message}}},"id":null}}"#)
}

struct Env {
    gw: MockGateway,
    bridge: MockBridge,
    sidecar: Sidecar,
}

impl Env {
    async fn start(extra: &[(&str, String)]) -> Env {
        let gw = MockGateway::start().await;
        let bridge = MockBridge::start().await;
        bridge.set_json(&json!({
            "effective_canister_user_id": "google:owner",
            "allowed_vault_ids": ["default"],
            "scope": null,
            "role": "viewer",
        }));
        let mut env = vec![
            ("UPSTREAM__GATEWAY_URL", gw.url()),
            ("UPSTREAM__BRIDGE_URL", bridge.url()),
        ];
        env.extend(extra.iter().cloned());
        let sidecar = Sidecar::spawn(&env);
        sidecar.wait_ready().await;
        Env {
            gw,
            bridge,
            sidecar,
        }
    }

    fn addr(&self) -> SocketAddr {
        self.sidecar.addr
    }

    /// `initialize` without `Origin`: the session id.
    async fn session(&self) -> String {
        let r = send(
            self.addr(),
            "POST",
            "sidecar.test",
            &self.auth_headers(),
            INIT,
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.all_text());
        r.header("mcp-session-id").unwrap().to_owned()
    }

    fn auth_headers(&self) -> Vec<(String, String)> {
        vec![
            ("Authorization".into(), format!("Bearer {}", token("alice"))),
            ("Accept".into(), ACCEPT.into()),
            ("Content-Type".into(), "application/json".into()),
            ("X-Vault-Id".into(), "default".into()),
        ]
    }
}

/// `method /mcp` with `Host: host`, `headers` and `body` (its length announced), on a
/// connection of its own.
async fn send(
    addr: SocketAddr,
    method: &str,
    host: &str,
    headers: &[(String, String)],
    body: &str,
) -> Raw {
    exchange(
        addr,
        &request(method, host, headers, body, body.len()),
        WAIT,
    )
    .await
}

fn request(
    method: &str,
    host: &str,
    headers: &[(String, String)],
    body: &str,
    announced: usize,
) -> Vec<u8> {
    let mut r = format!("{method} /mcp HTTP/1.1\r\nHost: {host}\r\n");
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    if announced > 0 {
        r.push_str(&format!("Content-Length: {announced}\r\n"));
    }
    r.push_str("Connection: close\r\n\r\n");
    r.push_str(body);
    r.into_bytes()
}

fn with(base: &[(String, String)], extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut h = base.to_vec();
    h.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    h
}

fn assert_refused(r: &Raw, echoed: &str, what: &str) {
    assert_eq!(r.status, 403, "{what}: {}", r.all_text());
    assert_eq!(r.header("content-type"), Some("application/json"), "{what}");
    if !what.starts_with("HEAD") {
        assert_eq!(r.text(), refusal(echoed), "{what}");
    }
}

/// The rebinding request of the specification, on every method, with a token or
/// without, on a live session or none, a body announced and never sent: 403, and nothing
/// reaches the gateway or the bridge, no token is verified, the session lives on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_not_allowed_is_refused_before_anything_is_spent() {
    let env = Env::start(&[("CORS__ALLOWED_ORIGINS", "https://hub.example".to_owned())]).await;
    let session = env.session().await;
    let base = env.auth_headers();
    let on_session = with(&base, &[("Mcp-Session-Id", &session), ("Origin", EVIL)]);
    let no_token = vec![
        ("Accept".to_owned(), ACCEPT.to_owned()),
        ("Content-Type".to_owned(), "application/json".to_owned()),
        ("Origin".to_owned(), EVIL.to_owned()),
    ];
    let gateway_before = env.gw.count();
    let bridge_before = env.bridge.count();
    let before = env.sidecar.metrics().await;
    let call = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"get_section_source","arguments":{"path":"a.md"}}}"#;
    let host = "evil.example.com";
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "POST initialize",
            request(
                "POST",
                host,
                &with(&base, &[("Origin", EVIL)]),
                INIT,
                INIT.len(),
            ),
        ),
        (
            "POST initialize without a token",
            request("POST", host, &no_token, INIT, INIT.len()),
        ),
        (
            "POST ping in a session",
            request("POST", host, &on_session, PING, PING.len()),
        ),
        (
            "POST the tool in a session",
            request("POST", host, &on_session, call, call.len()),
        ),
        // A body announced and never sent: the answer does not wait for it.
        (
            "POST with a body still to come",
            request("POST", host, &on_session, "{", 1 << 20),
        ),
        ("GET in a session", request("GET", host, &on_session, "", 0)),
        (
            "DELETE in a session",
            request("DELETE", host, &on_session, "", 0),
        ),
        (
            "OPTIONS (a preflight)",
            request(
                "OPTIONS",
                host,
                &with(&no_token, &[("Access-Control-Request-Method", "POST")]),
                "",
                0,
            ),
        ),
        (
            "HEAD in a session",
            request("HEAD", host, &on_session, "", 0),
        ),
        // The sidecar's own host name changes nothing.
        (
            "POST ping, Host the sidecar's",
            request("POST", "sidecar.test", &on_session, PING, PING.len()),
        ),
    ];
    let n = cases.len();
    for (what, bytes) in cases {
        let r = exchange(env.addr(), &bytes, WAIT).await;
        assert!(!r.timed_out, "{what}: the answer waited");
        assert_refused(&r, EVIL, what);
        // The gateway's CORS headers, as on every answer; never the refused origin.
        assert_eq!(
            r.header("access-control-allow-origin"),
            Some("https://hub.example"),
            "{what}"
        );
    }
    assert_eq!(
        env.gw.count(),
        gateway_before,
        "a refused request reached the gateway"
    );
    assert_eq!(
        env.bridge.count(),
        bridge_before,
        "a refused request reached the bridge"
    );
    let after = env.sidecar.metrics().await;
    assert_eq!(
        after.get(&intercepted("mcp", "origin_refused"))
            - before.get(&intercepted("mcp", "origin_refused")),
        n as f64
    );
    for check in ["signature", "remembered"] {
        let series = tokens_verified("mcp", check);
        assert_eq!(
            after.get(&series),
            before.get(&series),
            "a token was read: {series}"
        );
    }
    // Only the refusals moved (and nothing was admitted, forwarded or held).
    let moved: Vec<String> = after
        .moved_since(&before)
        .into_keys()
        .filter(|k| !k.starts_with("knowtation_sidecar_request_duration_seconds"))
        .collect();
    assert_eq!(moved, [intercepted("mcp", "origin_refused")], "{moved:?}");

    // The DELETE changed nothing: the session still answers, without `Origin`.
    let r = send(
        env.addr(),
        "POST",
        "sidecar.test",
        &with(&base, &[("Mcp-Session-Id", &session)]),
        PING,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.all_text());
    assert_eq!(env.gw.count(), gateway_before + 1);
}

/// `null`, what is not an origin, and two `Origin` headers (Node joins them) are refused
/// like an origin not listed, echoed as the SDK echoes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn null_malformed_and_repeated_origins_are_refused() {
    let env = Env::start(&[("CORS__ALLOWED_ORIGINS", "https://hub.example".to_owned())]).await;
    let session = env.session().await;
    let base = with(&env.auth_headers(), &[("Mcp-Session-Id", &session)]);
    let gateway_before = env.gw.count();
    for origin in [
        "null",
        "https://hub.example/",
        "https://hub.example/app",
        "hub.example",
        "https://user@hub.example",
        "https://hub.example:99999",
        "*",
    ] {
        let r = send(
            env.addr(),
            "POST",
            "sidecar.test",
            &with(&base, &[("Origin", origin)]),
            PING,
        )
        .await;
        assert_refused(&r, origin, origin);
    }
    let twice = with(
        &base,
        &[
            ("Origin", "https://hub.example"),
            ("Origin", "https://hub.example"),
        ],
    );
    let r = send(env.addr(), "POST", "sidecar.test", &twice, PING).await;
    assert_refused(
        &r,
        "https://hub.example, https://hub.example",
        "two Origin headers",
    );
    assert_eq!(env.gw.count(), gateway_before);
}

/// Without `Origin` nothing changes; the CORS origins and their `www.` twins pass by
/// default, in any case of letters and with the default port written out; an explicit
/// `mcp.allowed_origins` replaces them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_and_absent_origins_pass() {
    let env = Env::start(&[("CORS__ALLOWED_ORIGINS", "https://hub.example".to_owned())]).await;
    let base = env.auth_headers();
    for origin in [
        None,
        Some("https://hub.example"),
        Some("https://www.hub.example"),
        Some("HTTPS://Hub.Example:443"),
    ] {
        let what = format!("{origin:?}");
        let mut h = base.clone();
        if let Some(o) = origin {
            h.push(("Origin".into(), o.into()));
        }
        let before = env.gw.count();
        let r = send(env.addr(), "POST", "sidecar.test", &h, INIT).await;
        assert_eq!(r.status, 200, "{what}: {}", r.all_text());
        let session = r.header("mcp-session-id").unwrap().to_owned();
        let h = with(&h, &[("Mcp-Session-Id", &session)]);
        let r = send(env.addr(), "POST", "sidecar.test", &h, PING).await;
        assert_eq!(r.status, 200, "{what}: {}", r.all_text());
        let r = send(
            env.addr(),
            "GET",
            "sidecar.test",
            &with(&h, &[("Accept", "text/event-stream")]),
            "",
        )
        .await;
        assert_eq!(r.status, 200, "{what}: {}", r.all_text());
        let r = send(env.addr(), "DELETE", "sidecar.test", &h, "").await;
        assert_eq!(r.status, 200, "{what}: {}", r.all_text());
        assert_eq!(env.gw.count(), before + 4, "{what}");
    }
    drop(env);

    let env = Env::start(&[
        ("CORS__ALLOWED_ORIGINS", "https://hub.example".to_owned()),
        (
            "MCP__ALLOWED_ORIGINS",
            "http://localhost:6274, https://app.example".to_owned(),
        ),
    ])
    .await;
    let base = env.auth_headers();
    for (origin, status) in [
        ("http://localhost:6274", 200),
        ("https://app.example", 200),
        ("https://hub.example", 403),
        ("https://www.app.example", 403),
        ("http://localhost", 403),
    ] {
        let r = send(
            env.addr(),
            "POST",
            "sidecar.test",
            &with(&base, &[("Origin", origin)]),
            INIT,
        )
        .await;
        assert_eq!(r.status, status, "{origin}: {}", r.all_text());
    }
}

/// `mcp.allowed_origins` takes origins only: anything else exits 64 naming the key.
#[test]
fn allowed_origins_must_be_origins() {
    let check = |value: &str| {
        Command::new(BIN)
            .arg("check-config")
            .env_clear()
            .env(
                "KNOWTATION_SIDECAR_UPSTREAM__GATEWAY_URL",
                "http://127.0.0.1:3000",
            )
            .env("KNOWTATION_SIDECAR_MCP__ALLOWED_ORIGINS", value)
            .output()
            .expect("binary runs")
    };
    let out = check("https://App.example:8443, http://localhost:6274");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout
            .contains(r#"allowed_origins = ["https://App.example:8443", "http://localhost:6274"]"#),
        "{stdout}"
    );
    for bad in [
        "null",
        "*",
        "https://a.example/path",
        "a.example",
        "https://a.example, ftp//x",
    ] {
        let out = check(bad);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{bad}: {stderr}");
        assert!(
            stderr.contains("mcp.allowed_origins") && stderr.contains("not an origin"),
            "{bad}: {stderr}"
        );
    }
}
