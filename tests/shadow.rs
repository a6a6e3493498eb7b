//! Shadow mode (`intercept.mode = "shadow"`) over real sockets: intercepted requests on
//! both surfaces reach the gateway and its answer reaches the client, the sidecar's own
//! answer is computed beside it, and every kind of (dis)agreement is counted in
//! `knowtation_sidecar_shadow_comparisons_total` with nothing of either answer in the
//! logs or metrics. A sidecar in enforce mode over the same upstreams supplies the
//! answers a correct gateway gives. A reload turns shadow into enforce (the rollout).
//! Wire contract §5 (REST), §6 (MCP), §7 (passthrough, never log content).

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use http::Method;
use knowtation_sidecar::config::{Config, Mode, Secret};
use knowtation_sidecar::proxy::{self, Running};
use knowtation_testkit::client::{self, Collected};
use knowtation_testkit::{
    sign_token, unix_now, MockBridge, MockCanister, MockGateway, SectionSourceSurface,
};
use serde_json::{json, Value};

const SECRET: &str = "shadow-test-secret-0123456789abcdef";
const VAULT: &str = "vault-shadow";
const NOTE: &str = "projects/plan.md";
const BODY_TEXT: &str = "The acquisition closes on the ninth of March.";
const ACCEPT: &str = "application/json, text/event-stream";

struct Env {
    gw: MockGateway,
    _canister: MockCanister,
    _bridge: MockBridge,
    shadow: Running,
    enforce: Running,
}

fn config(gw: &MockGateway, canister: &MockCanister, bridge: &MockBridge, mode: Mode) -> Config {
    let mut c = Config::default();
    c.listen.address = "127.0.0.1:0".parse().unwrap();
    c.admin.address = "127.0.0.1:0".parse().unwrap();
    c.upstream.gateway_url = gw.url();
    c.upstream.canister_url = Some(canister.url());
    c.upstream.bridge_url = Some(bridge.url());
    c.auth.jwt_secrets = vec![Secret::new(SECRET)];
    c.shutdown.drain_seconds = 1;
    c.shutdown.grace_seconds = 0;
    c.log.level = "warn".to_owned();
    c.intercept.mode = mode;
    c
}

impl Env {
    async fn start() -> Env {
        let gw = MockGateway::start().await;
        let canister = MockCanister::start().await;
        let bridge = MockBridge::start().await;
        bridge.set_json(&json!({
            "effective_canister_user_id": "google:owner",
            "allowed_vault_ids": [VAULT],
            "scope": null,
            "role": "viewer",
        }));
        canister.insert_note(
            VAULT,
            NOTE,
            &json!({"title": "Plan", "owner": "finance"}),
            &format!("# Plan\n\n{BODY_TEXT}\n\n## Steps\n\nSign.\n"),
        );
        let shadow = proxy::start(config(&gw, &canister, &bridge, Mode::Shadow))
            .await
            .unwrap();
        let enforce = proxy::start(config(&gw, &canister, &bridge, Mode::Enforce))
            .await
            .unwrap();
        Env {
            gw,
            _canister: canister,
            _bridge: bridge,
            shadow,
            enforce,
        }
    }

    async fn rest(&self, sidecar: &Running) -> Collected {
        let url = format!(
            "http://{}/api/v1/section-source?path={NOTE}",
            sidecar.listen_addr
        );
        let auth = format!(
            "Bearer {}",
            sign_token(
                SECRET,
                json!({"sub": "google:actor", "exp": unix_now() + 3600})
            )
        );
        let (addr, req) = client::request(
            Method::GET,
            &url,
            &[("authorization", &auth), ("x-vault-id", VAULT)],
            "",
        )
        .unwrap();
        client::send(addr, req).await.unwrap()
    }

    async fn post(sidecar: &Running, headers: &[(&str, &str)], body: &str) -> Collected {
        let url = format!("http://{}/mcp", sidecar.listen_addr);
        let (addr, req) = client::request(Method::POST, &url, headers, body.to_owned()).unwrap();
        client::send(addr, req).await.unwrap()
    }

    /// `initialize`, then one `body` on the session.
    async fn mcp(&self, sidecar: &Running, body: &str) -> Collected {
        let token = sign_token(
            SECRET,
            json!({"sub": "google:agent", "type": "mcp_access", "scopes": ["vault:read", "vault:write"], "exp": unix_now() + 3600, "iat": unix_now()}),
        );
        let auth = format!("Bearer {token}");
        let init = Env::post(
            sidecar,
            &[
                ("authorization", &auth),
                ("accept", ACCEPT),
                ("content-type", "application/json"),
                ("x-vault-id", VAULT),
            ],
            r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#,
        )
        .await;
        assert_eq!(init.status, 200, "{}", init.text());
        let session = init.header("mcp-session-id").unwrap().to_owned();
        Env::post(
            sidecar,
            &[
                ("authorization", &auth),
                ("accept", ACCEPT),
                ("content-type", "application/json"),
                ("mcp-session-id", &session),
            ],
            body,
        )
        .await
    }

    async fn call(&self, sidecar: &Running) -> Collected {
        let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_section_source","arguments":{"path": NOTE}}});
        self.mcp(sidecar, &body.to_string()).await
    }

    /// The correct answers, from the sidecar in enforce mode: the REST body and the tool
    /// text.
    async fn correct(&self) -> (String, String) {
        let rest = self.rest(&self.enforce).await;
        assert_eq!(rest.status, 200, "{}", rest.text());
        let call = self.call(&self.enforce).await;
        let text = call.text();
        let data = text
            .strip_prefix("event: message\ndata: ")
            .and_then(|t| t.strip_suffix("\n\n"))
            .unwrap();
        let m: Value = serde_json::from_str(data).unwrap();
        let tool = m["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .to_owned();
        (rest.text(), tool)
    }

    fn serve(&self, rest_status: u16, rest_body: &str, tool_text: &str, tool_is_error: bool) {
        self.gw
            .set_section_source(Some(SectionSourceSurface::Serves {
                rest_status,
                rest_body: rest_body.to_owned(),
                tool_text: tool_text.to_owned(),
                tool_is_error,
            }));
    }

    /// A call of `name` on `sidecar`.
    async fn call_tool(&self, sidecar: &Running, name: &str) -> Collected {
        let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":name,"arguments":{"path": NOTE}}});
        self.mcp(sidecar, &body.to_string()).await
    }

    /// `GET /api/v1/{route}` of the note on `sidecar`.
    async fn rest_route(&self, sidecar: &Running, route: &str) -> Collected {
        let url = format!("http://{}/api/v1/{route}?path={NOTE}", sidecar.listen_addr);
        let auth = format!(
            "Bearer {}",
            sign_token(
                SECRET,
                json!({"sub": "google:actor", "exp": unix_now() + 3600})
            )
        );
        let (addr, req) = client::request(
            Method::GET,
            &url,
            &[("authorization", &auth), ("x-vault-id", VAULT)],
            "",
        )
        .unwrap();
        client::send(addr, req).await.unwrap()
    }

    /// The shadow sidecar's comparison count for `surface` and `result`.
    async fn count(&self, surface: &str, result: &str) -> u64 {
        let scrape = self.scrape().await;
        let series = format!(
            "knowtation_sidecar_shadow_comparisons_total{{result=\"{result}\",surface=\"{surface}\"}} "
        );
        scrape
            .lines()
            .find_map(|l| l.strip_prefix(&series))
            .unwrap_or_else(|| panic!("no series {series}"))
            .parse()
            .unwrap()
    }

    async fn scrape(&self) -> String {
        let url = format!("http://{}/metrics", self.shadow.admin_addr);
        let (addr, req) = client::request(Method::GET, &url, &[], "").unwrap();
        client::send(addr, req).await.unwrap().text()
    }

    /// Gateway requests for the section-source surface so far.
    fn gateway_saw(&self) -> usize {
        self.gw
            .requests()
            .iter()
            .filter(|r| {
                r.path().contains("section-source") || r.body_text().contains("get_section_source")
            })
            .count()
    }
}

fn with_extra(doc: &str, field: &str) -> String {
    let mut v: Value = serde_json::from_str(doc).unwrap();
    v.as_object_mut()
        .unwrap()
        .insert(field.to_owned(), json!(BODY_TEXT));
    v.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s5_rest_shadow_passes_to_the_gateway_and_counts_each_kind() {
    let env = Env::start().await;
    let (doc, tool) = env.correct().await;
    assert_eq!(env.gateway_saw(), 0, "enforce mode never asks the gateway");

    // A gateway that agrees: the client gets the gateway's own answer.
    env.serve(200, &doc, &tool, false);
    let r = env.rest(&env.shadow).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-mock-upstream"), Some("gateway"));
    assert_eq!(r.text(), doc);
    assert_eq!(env.gateway_saw(), 1);
    assert_eq!(env.count("rest", "agree").await, 1);

    // Field order is no disagreement.
    let mut v: Value = serde_json::from_str(&doc).unwrap();
    let o = v.as_object_mut().unwrap();
    let schema = o.remove("schema").unwrap();
    o.insert("schema".into(), schema);
    env.serve(200, &v.to_string(), &tool, false);
    env.rest(&env.shadow).await;
    assert_eq!(env.count("rest", "agree").await, 2);

    // An extra field holding the note's body text, an extra field without it, a changed
    // field, another status class, a body that is no JSON.
    env.serve(200, &with_extra(&doc, "preview"), &tool, false);
    let r = env.rest(&env.shadow).await;
    assert!(r.text().contains(BODY_TEXT), "shadow mode does not filter");
    assert_eq!(env.count("rest", "body_text").await, 1);
    let mut v: Value = serde_json::from_str(&doc).unwrap();
    v["etag"] = json!("W/\"1\"");
    env.serve(200, &v.to_string(), &tool, false);
    env.rest(&env.shadow).await;
    assert_eq!(env.count("rest", "extra_field").await, 1);
    env.serve(
        200,
        &doc.replace("\"level\":1", "\"level\":3"),
        &tool,
        false,
    );
    env.rest(&env.shadow).await;
    assert_eq!(env.count("rest", "field_mismatch").await, 1);
    env.serve(
        502,
        r#"{"error":"Bad Gateway","code":"BAD_GATEWAY"}"#,
        &tool,
        false,
    );
    let r = env.rest(&env.shadow).await;
    assert_eq!(r.status, 502);
    assert_eq!(env.count("rest", "status_class").await, 1);
    env.serve(200, "<html>ok</html>", &tool, false);
    env.rest(&env.shadow).await;
    assert_eq!(env.count("rest", "unreadable").await, 1);

    // A gateway without the route is its own kind.
    env.gw
        .set_section_source(Some(SectionSourceSurface::Absent));
    let r = env.rest(&env.shadow).await;
    assert_eq!(r.status, 404);
    assert_eq!(env.count("rest", "no_route").await, 1);
    assert_eq!(env.gateway_saw(), 8);

    // Nothing of either answer is in the metrics.
    let scrape = env.scrape().await;
    for needle in [BODY_TEXT, "Plan", "Steps", NOTE, "google:"] {
        assert!(!scrape.contains(needle), "{needle} in the metrics");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s6_mcp_shadow_passes_the_call_and_the_list_to_the_gateway() {
    let env = Env::start().await;
    let (doc, tool) = env.correct().await;
    assert_eq!(env.gateway_saw(), 0);

    env.serve(200, &doc, &tool, false);
    let r = env.call(&env.shadow).await;
    assert_eq!(r.status, 200);
    assert!(r.text().contains("\\\"heading_text\\\":\\\"Steps\\\""));
    assert_eq!(env.gateway_saw(), 1, "the call reached the gateway");
    assert_eq!(env.count("mcp", "agree").await, 1);

    env.serve(200, &doc, &with_extra(&tool, "body"), false);
    env.call(&env.shadow).await;
    assert_eq!(env.count("mcp", "body_text").await, 1);

    env.serve(
        200,
        &doc,
        r#"{"error":"Runtime failure","code":"UPSTREAM_ERROR"}"#,
        true,
    );
    env.call(&env.shadow).await;
    assert_eq!(env.count("mcp", "status_class").await, 1);

    env.gw
        .set_section_source(Some(SectionSourceSurface::Absent));
    let r = env.call(&env.shadow).await;
    assert!(r.text().contains("Tool get_section_source not found"));
    assert_eq!(env.count("mcp", "no_route").await, 1);

    // The gateway serves the tool, so its list passes unchanged (the mock lists only
    // `search`); in enforce mode the sidecar adds its own descriptor.
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}"#;
    let shadowed = env.mcp(&env.shadow, list).await.text();
    assert!(!shadowed.contains("get_section_source"), "{shadowed}");
    let enforced = env.mcp(&env.enforce, list).await.text();
    assert!(enforced.contains("get_section_source"), "{enforced}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_gateway_is_counted_and_a_reload_switches_to_enforce() {
    let env = Env::start().await;
    let (doc, tool) = env.correct().await;
    env.serve(200, &doc, &tool, false);

    // Shadow mode → enforce, the rollout's last step, without a restart.
    let mut c = (*env.shadow.live().load().config).clone();
    c.intercept.mode = Mode::Enforce;
    env.shadow.reload(Ok(c.clone())).unwrap();
    let before = env.gateway_saw();
    let r = env.rest(&env.shadow).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-mock-upstream"), None, "answered by the sidecar");
    assert_eq!(r.text(), doc);
    env.call(&env.shadow).await;
    assert_eq!(
        env.gateway_saw(),
        before,
        "enforce mode never asks the gateway"
    );
    assert_eq!(env.count("rest", "agree").await, 0);

    // Back to shadow with the gateway gone: the caller gets the sidecar's 502 for the
    // gateway, as passthrough would, and the comparison counts the failure.
    c.intercept.mode = Mode::Shadow;
    c.upstream.gateway_url = "http://127.0.0.1:1".to_owned();
    env.shadow.reload(Ok(c)).unwrap();
    let r = env.rest(&env.shadow).await;
    assert_eq!(r.status, 502);
    assert_eq!(env.count("rest", "gateway_failed").await, 1);
}

/// The text of a tool result.
fn tool_result_text(r: &Collected) -> String {
    let text = r.text();
    let data = text
        .strip_prefix("event: message\ndata: ")
        .and_then(|t| t.strip_suffix("\n\n"))
        .unwrap();
    let m: Value = serde_json::from_str(data).unwrap();
    m["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Shadow mode compares each view the sidecar owns with the gateway's, where the gateway
/// has it: its REST route and its tool, each against the sidecar's own document.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_owned_view_is_compared_with_the_gateways() {
    let env = Env::start().await;
    let outline = env.rest_route(&env.enforce, "note-outline").await;
    assert_eq!(outline.status, 200, "{}", outline.text());
    assert!(outline
        .text()
        .starts_with(r#"{"schema":"knowtation.note_outline/v1""#));
    let mut agree = (0, 0);
    for (name, route) in [
        ("get_note_outline", Some("note-outline")),
        ("get_document_tree", None),
    ] {
        let tool = tool_result_text(&env.call_tool(&env.enforce, name).await);
        let rest = route.map_or(String::new(), |_| outline.text());
        // A gateway serving the same documents agrees, on both surfaces.
        env.serve(200, &rest, &tool, false);
        let r = env.call_tool(&env.shadow, name).await;
        assert_eq!(r.header("x-mock-upstream"), Some("gateway"), "{name}");
        agree.1 += 1;
        assert_eq!(env.count("mcp", "agree").await, agree.1, "{name}");
        if let Some(route) = route {
            let r = env.rest_route(&env.shadow, route).await;
            assert_eq!(r.header("x-mock-upstream"), Some("gateway"));
            agree.0 += 1;
            assert_eq!(env.count("rest", "agree").await, agree.0, "{route}");
        }
        // One whose document has a field the view does not: an extra field.
        env.serve(200, &rest, &with_extra(&tool, "snippet"), false);
        env.call_tool(&env.shadow, name).await;
    }
    assert_eq!(env.count("mcp", "body_text").await, 2);
    // A gateway without the views says so.
    env.gw
        .set_section_source(Some(SectionSourceSurface::Absent));
    for name in ["get_note_outline", "get_document_tree"] {
        let r = env.call_tool(&env.shadow, name).await;
        assert!(r.text().contains(&format!("Tool {name} not found")));
    }
    assert_eq!(env.count("mcp", "no_route").await, 2);
    let r = env.rest_route(&env.shadow, "note-outline").await;
    assert_eq!(r.status, 404);
    assert_eq!(env.count("rest", "no_route").await, 1);
}
