//! End to end through the real binary (`serve`): canary strings placed in note bodies,
//! non-title frontmatter, canister error bodies, request paths, queries, headers and
//! user ids never appear in an intercepted response, in any log line (debug level, JSON)
//! or in the metrics. Wire contract §5 ("Upstream bodies are never forwarded") and §7
//! ("Never log a request path, query, header value, body, heading or user id").

// A failed expectation in a test is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use knowtation_testkit::{
    self as testkit, client, CanisterOverride, MockBridge, MockCanister, MockGateway,
};
use serde_json::json;

#[path = "support/sidecar.rs"]
mod support;

const SECRET: &str = "e2e-test-secret-0123456789abcdef";
const BODY: &str = "CANARY-BODY-7f3a";
const FRONTMATTER: &str = "CANARY-FM-91bd";
const UPSTREAM_ERROR: &str = "CANARY-UPSTREAM-c0de";
const PATH: &str = "CANARY-PATH-55aa";
const QUERY: &str = "CANARY-QUERY-2b2b";
const HEADER: &str = "CANARY-HEADER-9e9e";
const USER: &str = "CANARY-USER-4d4d";
const HEADING_SECRET: &str = "CANARY-HEADING-1212";

fn free_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

struct Sidecar {
    child: Child,
    addr: SocketAddr,
    admin: SocketAddr,
}

impl Sidecar {
    fn spawn(gateway: &str, canister: &str, bridge: &str) -> Sidecar {
        let (addr, admin) = (free_addr(), free_addr());
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_knowtation-sidecar"));
        cmd.arg("serve")
            .env_clear()
            .env("KNOWTATION_SIDECAR_LISTEN__ADDRESS", addr.to_string())
            .env("KNOWTATION_SIDECAR_ADMIN__ADDRESS", admin.to_string())
            .env("KNOWTATION_SIDECAR_UPSTREAM__GATEWAY_URL", gateway)
            .env("KNOWTATION_SIDECAR_UPSTREAM__CANISTER_URL", canister)
            .env("KNOWTATION_SIDECAR_UPSTREAM__BRIDGE_URL", bridge)
            .env("KNOWTATION_SIDECAR_AUTH__JWT_SECRETS", SECRET)
            .env("KNOWTATION_SIDECAR_LOG__LEVEL", "debug")
            .env("KNOWTATION_SIDECAR_LOG__FORMAT", "json")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        support::pass_runtime_threads(&mut cmd);
        let child = cmd.spawn().expect("binary starts");
        Sidecar { child, addr, admin }
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(r) = client::get(&format!("http://{}/ready", self.admin), &[]).await {
                if r.status == 200 {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("sidecar never became ready");
    }

    /// Stops the process with SIGTERM (via `kill`) and returns everything it printed.
    fn stop(mut self) -> String {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                assert!(status.success(), "exit status after SIGTERM: {status}");
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut out = String::new();
        if let Some(mut s) = self.child.stdout.take() {
            s.read_to_string(&mut out).unwrap();
        }
        if let Some(mut s) = self.child.stderr.take() {
            s.read_to_string(&mut out).unwrap();
        }
        out
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

fn assert_clean(what: &str, text: &str) {
    for canary in [
        BODY,
        FRONTMATTER,
        UPSTREAM_ERROR,
        PATH,
        QUERY,
        HEADER,
        USER,
        HEADING_SECRET,
        SECRET,
    ] {
        assert!(!text.contains(canary), "{what} contains {canary}:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canaries_never_reach_responses_logs_or_metrics() {
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

    let sidecar = Sidecar::spawn(&gateway.url(), &canister.url(), &bridge.url());
    sidecar.wait_ready().await;
    let base = format!("http://{}", sidecar.addr);
    let token = testkit::sign_token(
        SECRET,
        testkit::session_claims(USER, Duration::from_secs(600)),
    );
    let bearer = format!("Bearer {token}");
    let auth: &[(&str, &str)] = &[("authorization", &bearer), ("x-vault-id", "default")];

    let mut intercepted = Vec::new();
    for path in [
        "notes/ok.md",
        "notes/err.md",
        "notes/gone.md",
        "notes/html.md",
        "notes/missing.md",
    ] {
        let r = client::get(&format!("{base}/api/v1/section-source?path={path}"), auth)
            .await
            .unwrap();
        intercepted.push((path, r));
    }
    // Unsafe input is never echoed.
    for path in [
        format!("../{PATH}"),
        format!("/{PATH}"),
        format!("{PATH}/%2e%2e/x"),
    ] {
        let r = client::get(
            &format!("{base}/api/v1/section-source?path={path}&{QUERY}=1"),
            auth,
        )
        .await
        .unwrap();
        assert_eq!(r.status, 400, "{path}");
        intercepted.push(("unsafe", r));
    }
    let r = client::get(
        &format!("{base}/api/v1/section-source?path=notes/ok.md"),
        &[("authorization", HEADER)],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 401);
    intercepted.push(("unauthorized", r));
    let heading = client::get(
        &format!("{base}/api/v1/section-source?path=notes/heading.md"),
        auth,
    )
    .await
    .unwrap();
    assert!(
        heading.text().contains(HEADING_SECRET),
        "the heading itself is served"
    );

    assert_eq!(intercepted[0].1.status, 200);
    assert_eq!(intercepted[0].1.json()["title"], json!("Visible"));
    assert_eq!(intercepted[1].1.status, 502);
    assert_eq!(intercepted[2].1.status, 404);
    assert_eq!(intercepted[3].1.status, 502);
    for (what, r) in &intercepted {
        assert_clean(&format!("response for {what}"), &r.text());
        for (name, value) in &r.headers {
            assert_clean(
                &format!("header {name} for {what}"),
                value.to_str().unwrap_or_default(),
            );
        }
    }

    // Passthrough carries canaries to the gateway (that is its job) but never into logs.
    let pass = client::get(
        &format!("{base}/{PATH}/x?{QUERY}=1"),
        &[("x-custom", HEADER), ("authorization", &bearer)],
    )
    .await
    .unwrap();
    assert_eq!(pass.status, 200);
    assert!(gateway
        .requests()
        .iter()
        .any(|r| r.uri.to_string().contains(PATH)));

    let metrics = client::get(&format!("http://{}/metrics", sidecar.admin), &[])
        .await
        .unwrap();
    assert!(metrics
        .text()
        .contains("knowtation_sidecar_intercepted_requests_total"));
    assert_clean("metrics", &metrics.text());

    let logs = sidecar.stop();
    assert!(
        logs.lines().count() >= 10,
        "expected one line per request:\n{logs}"
    );
    assert!(
        logs.contains("\"surface\":\"rest\""),
        "intercepted requests are logged:\n{logs}"
    );
    assert_clean("logs", &logs);
}
