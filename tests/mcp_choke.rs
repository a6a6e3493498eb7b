//! The MCP choke point end to end (wire contract §6, with §1, §2 and §4): a real sidecar
//! (`proxy::start`) on loopback in front of the test-kit gateway, canister and bridge.
//! Every `hosted_mcp` vector of the shared conformance file runs through
//! `initialize` → `tools/list` → `tools/call`, then the §6 check order, SSE framing, ids,
//! per-role `tools/list` rewriting, batches, header mismatches, sessions (unknown,
//! foreign, capped, deleted, vault frozen), passthrough of everything else, and the
//! promise that nothing from a note or an upstream error comes back. The other two views'
//! tools (`get_note_outline`, `get_document_tree`) are answered the same way. The mock
//! gateway must never see a call of a view's tool: every test asserts it.

// Test code: a failed unwrap is a failed test, which is what we want here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use http::Method;
use knowtation_sidecar::config::{Config, Secret};
use knowtation_sidecar::extract::{self, Frontmatter, Limits, View};
use knowtation_sidecar::mcp::{tool_name, TOOL_DESCRIPTOR};
use knowtation_sidecar::proxy::{self, Running};
use knowtation_testkit::client::{self, Collected};
use knowtation_testkit::Reply as BridgeReply;
use knowtation_testkit::{
    sign_token, unix_now, CanisterOverride, MockBridge, MockCanister, MockGateway,
};
use serde_json::{json, Value};

const SECRET: &str = "mcp-test-secret-0123456789abcdef";
const GATEWAY_SECRET: &str = "gw-secret-section-source";
const VAULT: &str = "vault-section-source";
const ACCEPT: &str = "application/json, text/event-stream";

mod common;
#[path = "support/sidecar.rs"]
mod support;

fn vectors() -> Vec<Value> {
    common::reference_vectors()
        .into_iter()
        .filter(|v| v["name"].as_str().unwrap().starts_with("hosted_mcp"))
        .collect()
}

fn vector(name: &str) -> Value {
    vectors()
        .into_iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("vector {name}"))
}

/// An MCP OAuth token for `sub` with `scopes`.
fn token_with(sub: &str, scopes: &[&str]) -> String {
    sign_token(
        SECRET,
        json!({"sub": sub, "type": "mcp_access", "scopes": scopes, "exp": unix_now() + 3600, "iat": unix_now()}),
    )
}

fn token(sub: &str) -> String {
    token_with(sub, &["vault:read", "vault:write"])
}

struct Env {
    gw: MockGateway,
    canister: MockCanister,
    bridge: MockBridge,
    sidecar: Running,
}

impl Env {
    async fn start() -> Env {
        Env::start_with(|_| {}).await
    }

    async fn start_with(f: impl FnOnce(&mut Config)) -> Env {
        let gw = MockGateway::start().await;
        let canister = MockCanister::start().await;
        let bridge = MockBridge::start().await;
        canister.set_gateway_secret(Some(GATEWAY_SECRET));
        bridge.set_json(&json!({
            "effective_canister_user_id": "google:owner",
            "allowed_vault_ids": [VAULT],
            "scope": null,
            "role": "viewer",
        }));
        let mut c = Config::default();
        c.listen.address = "127.0.0.1:0".parse().unwrap();
        c.admin.address = "127.0.0.1:0".parse().unwrap();
        c.upstream.gateway_url = gw.url();
        c.upstream.canister_url = Some(canister.url());
        c.upstream.bridge_url = Some(bridge.url());
        c.upstream.gateway_secret = Some(Secret::new(GATEWAY_SECRET));
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

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.sidecar.listen_addr)
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

    async fn post(&self, headers: &[(&str, &str)], body: &str) -> Collected {
        self.send(Method::POST, "/mcp", headers, body.to_owned())
            .await
    }

    /// `initialize` with `token` in `vault`; the session id.
    async fn initialize_in(&self, token: &str, vault: &str) -> String {
        let auth = format!("Bearer {token}");
        let r = self
            .post(
                &[
                    ("authorization", &auth),
                    ("accept", ACCEPT),
                    ("content-type", "application/json"),
                    ("x-vault-id", vault),
                ],
                r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#,
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
        r.header("mcp-session-id").unwrap().to_owned()
    }

    async fn initialize(&self, token: &str) -> String {
        self.initialize_in(token, VAULT).await
    }

    /// A JSON-RPC request on `session` with the usual headers plus `extra`.
    async fn rpc(
        &self,
        token: &str,
        session: &str,
        extra: &[(&str, &str)],
        body: &str,
    ) -> Collected {
        let auth = format!("Bearer {token}");
        let mut headers = vec![
            ("authorization", auth.as_str()),
            ("accept", ACCEPT),
            ("content-type", "application/json"),
            ("mcp-session-id", session),
        ];
        for (k, v) in extra {
            headers.retain(|(h, _)| h != k);
            headers.push((k, v));
        }
        self.post(&headers, body).await
    }

    async fn call(&self, token: &str, session: &str, args: Value) -> Collected {
        let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_section_source","arguments":args}});
        self.rpc(token, session, &[], &body.to_string()).await
    }

    /// Requests the gateway received on `/mcp` (the readiness probe hits `/`).
    fn mcp_count(&self) -> usize {
        self.gw
            .requests()
            .iter()
            .filter(|r| r.path().to_ascii_lowercase().contains("mcp"))
            .count()
    }

    /// The gateway never saw a call of a view's tool.
    fn assert_gateway_never_ran_the_tool(&self) {
        for r in self.gw.requests() {
            for name in [
                "get_section_source",
                "get_note_outline",
                "get_document_tree",
            ] {
                assert!(
                    !r.body_text().contains(name),
                    "the gateway saw {}",
                    r.body_text()
                );
            }
        }
    }

    /// `tools/call` of `name` with `args`.
    async fn call_tool(&self, token: &str, session: &str, name: &str, args: Value) -> Collected {
        let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":name,"arguments":args}});
        self.rpc(token, session, &[], &body.to_string()).await
    }
}

/// The single SSE message of an answer, checking the SDK framing exactly.
fn sse_message(r: &Collected) -> Value {
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert_eq!(r.header("cache-control"), Some("no-cache"));
    let text = r.text();
    let data = text
        .strip_prefix("event: message\ndata: ")
        .and_then(|t| t.strip_suffix("\n\n"))
        .unwrap_or_else(|| panic!("not one SSE message: {text:?}"));
    assert!(!data.contains('\n'));
    serde_json::from_str(data).unwrap()
}

/// The tool result's text and `isError`.
fn tool_text(r: &Collected) -> (String, bool) {
    let m = sse_message(r);
    let result = &m["result"];
    (
        result["content"][0]["text"].as_str().unwrap().to_owned(),
        result.get("isError") == Some(&Value::Bool(true)),
    )
}

fn insert_vector_note(env: &Env, v: &Value) {
    let path = v["path"].as_str().unwrap();
    let body = v["canister_response"]["json"].to_string();
    env.canister.set_override(
        path,
        CanisterOverride::new()
            .status(v["canister_response"]["status"].as_u64().unwrap() as u16)
            .body(body),
    );
}

fn assert_excludes(text: &str, needles: &Value) {
    for n in needles.as_array().into_iter().flatten() {
        let n = n.as_str().unwrap();
        assert!(!text.contains(n), "{n:?} escaped in {text}");
    }
}

// ---------------------------------------------------------------------------------------
// The conformance vectors.

#[tokio::test]
async fn vector_e2e_body_free_output_through_initialize_list_and_call() {
    let env = Env::start().await;
    let v = vector("hosted_mcp_e2e_body_free_output");
    insert_vector_note(&env, &v);
    let t = token("google:actor");
    let session = env.initialize(&t).await;

    let list = env
        .rpc(
            &t,
            &session,
            &[],
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
        )
        .await;
    let text = list.text();
    assert!(text.contains(TOOL_DESCRIPTOR), "{text}");
    assert!(text.contains("\"name\":\"search\""));

    let r = env.call(&t, &session, json!({"path": "safe.md"})).await;
    assert_eq!(r.header("mcp-session-id"), Some(session.as_str()));
    assert_eq!(r.header("connection"), Some("keep-alive"));
    let raw = r.text();
    assert!(raw.starts_with(
        "event: message\ndata: {\"result\":{\"content\":[{\"type\":\"text\",\"text\":"
    ));
    assert!(
        raw.ends_with("}]},\"jsonrpc\":\"2.0\",\"id\":1}\n\n"),
        "{raw}"
    );
    let (text, is_error) = tool_text(&r);
    assert!(!is_error);
    assert!(!raw.contains("isError"));
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc, v["expect"]["result_text_json"]);
    for k in v["expect"]["top_level_keys_absent"].as_array().unwrap() {
        assert!(doc.get(k.as_str().unwrap()).is_none());
    }
    assert_excludes(&raw, &v["expect"]["serialized_excludes"]);
    env.assert_gateway_never_ran_the_tool();
}

#[tokio::test]
async fn vector_integration_one_get_with_the_mcp_header_set() {
    let env = Env::start().await;
    let v = vector("hosted_mcp_integration_one_get_with_headers");
    insert_vector_note(&env, &v);
    let t = token("google:actor");
    let session = env.initialize(&t).await;
    let r = env
        .call(&t, &session, json!({"path": "inbox/hello world.md"}))
        .await;
    let (text, is_error) = tool_text(&r);
    assert!(!is_error, "{text}");
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["path"], "inbox/hello world.md");
    let reqs = env.canister.requests();
    assert_eq!(reqs.len(), 1);
    let req = &reqs[0];
    assert_eq!(req.method, Method::GET);
    assert_eq!(
        req.uri.to_string(),
        "/api/v1/notes/inbox%2Fhello%20world.md"
    );
    assert_eq!(
        req.header("authorization"),
        Some(format!("Bearer {t}").as_str())
    );
    assert_eq!(req.header("x-vault-id"), Some(VAULT));
    assert_eq!(req.header("x-user-id"), Some("google:owner"));
    assert_eq!(req.header("x-gateway-auth"), Some(GATEWAY_SECRET));
    assert_eq!(req.header("accept"), Some("application/json"));
    assert_eq!(req.header("content-type"), Some("application/json"));
    assert!(req.header("x-actor-id").is_none());
    env.assert_gateway_never_ran_the_tool();
}

#[tokio::test]
async fn vector_stress_repeat_is_deterministic_with_one_read_per_call() {
    let env = Env::start().await;
    let v = vector("hosted_mcp_stress_repeat_deterministic");
    insert_vector_note(&env, &v);
    let t = token("google:actor");
    let session = env.initialize(&t).await;
    let bridge_calls = env.bridge.count();
    let mut outputs = Vec::new();
    for _ in 0..5 {
        let r = env.call(&t, &session, json!({"path": "repeat.md"})).await;
        assert_excludes(&r.text(), &v["expect"]["serialized_excludes"]);
        outputs.push(r.body);
    }
    assert!(outputs.windows(2).all(|w| w[0] == w[1]));
    assert_eq!(env.canister.count(), 5);
    assert!(env
        .canister
        .requests()
        .iter()
        .all(|r| r.uri == "/api/v1/notes/repeat.md"));
    assert_eq!(
        env.bridge.count(),
        bridge_calls,
        "no bridge call per tool call"
    );
    env.assert_gateway_never_ran_the_tool();
}

#[tokio::test]
async fn vector_unsafe_paths_are_rejected_before_any_fetch() {
    let env = Env::start().await;
    let v = vector("hosted_mcp_unsafe_paths_rejected_before_fetch");
    let t = token("google:actor");
    let session = env.initialize(&t).await;
    for case in v["expect"]["cases"].as_array().unwrap() {
        let r = env.call(&t, &session, json!({"path": case["path"]})).await;
        let (text, is_error) = tool_text(&r);
        assert!(is_error);
        assert_eq!(
            serde_json::from_str::<Value>(&text).unwrap(),
            case["result_text_json"]
        );
        assert_eq!(text, r#"{"error":"Invalid path","code":"UPSTREAM_ERROR"}"#);
        assert_excludes(&r.text(), &v["expect"]["serialized_excludes"]);
    }
    assert_eq!(env.canister.count(), 0);
    env.assert_gateway_never_ran_the_tool();
}

#[tokio::test]
async fn vector_upstream_errors_are_sanitized() {
    let env = Env::start().await;
    let v = vector("hosted_mcp_upstream_errors_sanitized");
    let t = token("google:actor");
    let session = env.initialize(&t).await;
    for case in v["expect"]["cases"].as_array().unwrap() {
        let path = case["path"].as_str().unwrap();
        let resp = &case["canister_response"];
        let body = match resp.get("text") {
            Some(t) => t.as_str().unwrap().to_owned(),
            None => resp["json"].to_string(),
        };
        env.canister.set_override(
            path,
            CanisterOverride::new()
                .status(resp["status"].as_u64().unwrap() as u16)
                .body(body),
        );
        let r = env.call(&t, &session, json!({"path": path})).await;
        let (text, is_error) = tool_text(&r);
        if let Some(expected) = case.get("result_text_json") {
            assert!(is_error);
            assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), *expected);
        } else {
            assert!(!is_error);
            let doc: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(
                doc["sections"][0]["heading_text"],
                case["result_text_json.sections[0].heading_text"]
            );
            assert_excludes(&r.text(), &case["serialized_excludes"]);
        }
        assert_excludes(&r.text(), &v["expect"]["errors_serialized_exclude"]);
    }
    assert_eq!(env.canister.count(), 3);
    env.assert_gateway_never_ran_the_tool();
}

#[tokio::test]
async fn vector_tools_list_for_all_roles_and_no_section_source_resources() {
    let v = vector("hosted_mcp_tools_list_all_roles");
    let env = Env::start().await;
    let mut roles: Vec<String> = v["expect"]["roles_that_list_get_section_source"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_owned())
        .collect();
    roles.push("some-future-role".to_owned());
    for (n, role) in roles.iter().enumerate() {
        env.bridge
            .set_json(&json!({"allowed_vault_ids": [VAULT], "role": role}));
        // A fresh `sub` per role: the hosted-context cache is per sub and vault.
        let t = token(&format!("user-{n}"));
        let session = env.initialize(&t).await;
        let list = env
            .rpc(
                &t,
                &session,
                &[],
                r#"{"jsonrpc":"2.0","id":"l","method":"tools/list","params":{}}"#,
            )
            .await;
        let m = sse_message(&list);
        let tools = m["result"]["tools"].as_array().unwrap();
        assert_eq!(
            tools
                .iter()
                .filter(|t| t["name"] == "get_section_source")
                .count(),
            1,
            "{role}"
        );
        for method in ["resources/list", "resources/templates/list"] {
            let body = json!({"jsonrpc":"2.0","id":3,"method":method,"params":{}}).to_string();
            let r = env.rpc(&t, &session, &[], &body).await;
            let m = sse_message(&r);
            let listed = m["result"].to_string();
            assert!(listed.contains("knowtation://notes/"), "{listed}");
            assert_excludes(&listed, &v["expect"]["resources_and_templates_exclude"]);
        }
    }
    env.assert_gateway_never_ran_the_tool();
}

#[tokio::test]
async fn vector_still_available_with_ui() {
    let env = Env::start().await;
    let v = vector("hosted_mcp_still_available_with_ui");
    insert_vector_note(&env, &v);
    let t = token("google:actor");
    let session = env
        .initialize_in(&t, "vault-section-source-ui-runtime")
        .await;
    let r = env
        .call(&t, &session, json!({"path": "inbox/one.md"}))
        .await;
    let (text, is_error) = tool_text(&r);
    assert!(!is_error);
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["schema"], v["expect"]["result_text_json.schema"]);
    assert_excludes(&r.text(), &v["expect"]["serialized_excludes"]);
    assert_eq!(
        env.canister.requests()[0].header("x-vault-id"),
        Some("vault-section-source-ui-runtime")
    );
}

// ---------------------------------------------------------------------------------------
// The §6 check order and the SDK's answers.

const UNAUTHORIZED: &str = r#"{"jsonrpc":"2.0","error":{"code":-32600,"message":"Unauthorized"}}"#;
const NOT_FOUND: &str =
    r#"{"jsonrpc":"2.0","error":{"code":-32600,"message":"Session not found"}}"#;
const NOT_ACCEPTABLE: &str = r#"{"jsonrpc":"2.0","error":{"code":-32000,"message":"Not Acceptable: Client must accept both application/json and text/event-stream"},"id":null}"#;
const UNSUPPORTED: &str = r#"{"jsonrpc":"2.0","error":{"code":-32000,"message":"Unsupported Media Type: Content-Type must be application/json"},"id":null}"#;
const PARSE_ERROR: &str = r#"{"jsonrpc":"2.0","error":{"code":-32700,"message":"Parse error: Invalid JSON-RPC message"},"id":null}"#;
const CALL: &str = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_section_source","arguments":{"path":"a.md"}}}"#;

#[tokio::test]
async fn checks_run_in_the_gateway_order() {
    let env = Env::start().await;
    env.canister.insert_note(
        VAULT,
        "a.md",
        &json!({"title": "A"}),
        "# A\n\nprivate body canary",
    );
    let t = token("google:actor");
    let session = env.initialize(&t).await;

    // 401: no token, a read-only token, a bad signature; even with every other fault.
    let read_only = token_with("google:actor", &["vault:read"]);
    for auth in [
        None,
        Some(format!("Bearer {read_only}")),
        Some("Bearer x.y.z".to_owned()),
    ] {
        let mut headers = vec![("accept", "*/*"), ("mcp-session-id", "nope")];
        if let Some(a) = &auth {
            headers.push(("authorization", a.as_str()));
        }
        let r = env.post(&headers, CALL).await;
        assert_eq!(r.status, 401);
        assert_eq!(r.text(), UNAUTHORIZED);
        assert_eq!(
            r.header("content-type"),
            Some("application/json; charset=utf-8")
        );
    }
    // 404 before 406/415: unknown, absent and foreign sessions look the same.
    let other = token("google:someone-else");
    let foreign = env.initialize(&other).await;
    for s in ["unknown-session", foreign.as_str()] {
        let r = env.rpc(&t, s, &[("accept", "*/*")], CALL).await;
        assert_eq!(r.status, 404);
        assert_eq!(r.text(), NOT_FOUND);
    }
    let auth = format!("Bearer {t}");
    let r = env
        .post(
            &[
                ("authorization", &auth),
                ("accept", ACCEPT),
                ("content-type", "application/json"),
            ],
            CALL,
        )
        .await;
    assert_eq!(r.status, 404);
    assert_eq!(r.text(), NOT_FOUND);
    // 406: `*/*` fails, one of the two fails. (The gateway checks `Accept` before
    // `Content-Type`; the sidecar's door refuses a non-JSON media type before reading the
    // body (§6 Deviation), so the 406 is shown with a JSON body.)
    for accept in ["*/*", "application/json", "text/event-stream"] {
        let r = env
            .rpc(
                &t,
                &session,
                &[("accept", accept), ("content-type", "application/json")],
                CALL,
            )
            .await;
        assert_eq!(r.status, 406, "{accept}");
        assert_eq!(r.text(), NOT_ACCEPTABLE);
        assert_eq!(r.header("content-type"), Some("application/json"));
    }
    // 415.
    let r = env
        .rpc(&t, &session, &[("content-type", "text/plain")], CALL)
        .await;
    assert_eq!(r.status, 415);
    assert_eq!(r.text(), UNSUPPORTED);
    // 400 invalid JSON-RPC: bad ids, wrong version, extra keys.
    for body in [
        r#"{"jsonrpc":"2.0","id":1.5,"method":"tools/call","params":{"name":"get_section_source","arguments":{"path":"a.md"}}}"#,
        r#"{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"get_section_source","arguments":{"path":"a.md"}}}"#,
        r#"{"jsonrpc":"2.0","id":9007199254740992,"method":"tools/call","params":{"name":"get_section_source","arguments":{"path":"a.md"}}}"#,
        r#"{"jsonrpc":"1.0","id":1,"method":"tools/call","params":{"name":"get_section_source","arguments":{"path":"a.md"}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_section_source","arguments":{"path":"a.md"}},"extra":1}"#,
    ] {
        let r = env
            .rpc(
                &t,
                &session,
                &[("mcp-protocol-version", "1999-01-01")],
                body,
            )
            .await;
        assert_eq!(r.status, 400, "{body}");
        assert_eq!(r.text(), PARSE_ERROR);
    }
    // 400 protocol version; absent and supported ones pass.
    let r = env
        .rpc(
            &t,
            &session,
            &[("mcp-protocol-version", "1999-01-01")],
            CALL,
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.text(),
        r#"{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: Unsupported protocol version: 1999-01-01 (supported versions: 2025-11-25, 2025-06-18, 2025-03-26, 2024-11-05, 2024-10-07)"},"id":null}"#
    );
    for v in ["2025-11-25", "2024-10-07"] {
        let r = env
            .rpc(&t, &session, &[("mcp-protocol-version", v)], CALL)
            .await;
        assert!(!tool_text(&r).1);
    }
    assert_eq!(env.canister.count(), 2);
    assert!(!String::from_utf8_lossy(
        &env.canister
            .requests()
            .iter()
            .flat_map(|r| r.body.to_vec())
            .collect::<Vec<u8>>()
    )
    .contains("canary"));
    env.assert_gateway_never_ran_the_tool();
}

#[tokio::test]
async fn ids_of_both_types_are_echoed_as_the_sdk_does() {
    let env = Env::start().await;
    env.canister.insert_note(VAULT, "a.md", &json!({}), "# A");
    let t = token("google:actor");
    let session = env.initialize(&t).await;
    for (id, echoed) in [
        ("\"req-7\"", "\"req-7\""),
        ("1.0", "1"),
        ("1e2", "100"),
        ("-3", "-3"),
        ("\"\"", "\"\""),
    ] {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"get_section_source","arguments":{{"path":"a.md"}}}}}}"#
        );
        let r = env.rpc(&t, &session, &[], &body).await;
        assert!(
            r.text()
                .ends_with(&format!(",\"jsonrpc\":\"2.0\",\"id\":{echoed}}}\n\n")),
            "{}",
            r.text()
        );
    }
    // A notification runs nothing and gets 202.
    let r = env
        .rpc(&t, &session, &[], r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"get_section_source","arguments":{"path":"a.md"}}}"#)
        .await;
    assert_eq!(r.status, 202);
    assert!(r.body.is_empty());
    assert_eq!(env.canister.count(), 5);
    env.assert_gateway_never_ran_the_tool();
}

#[tokio::test]
async fn argument_errors_are_the_sdk_plain_text() {
    let env = Env::start().await;
    let t = token("google:actor");
    let session = env.initialize(&t).await;
    let prefix =
        "MCP error -32602: Input validation error: Invalid arguments for tool get_section_source: ";
    for (args, received) in [
        (json!({}), "undefined"),
        (json!({"path": null}), "null"),
        (json!({"path": 3}), "number"),
        (json!({"path": false}), "boolean"),
        (json!({"path": ["a.md"]}), "array"),
        (json!({"path": {"p": 1}}), "object"),
    ] {
        let r = env.call(&t, &session, args).await;
        let (text, is_error) = tool_text(&r);
        assert!(is_error);
        assert_eq!(
            text,
            format!("{prefix}[\n  {{\n    \"expected\": \"string\",\n    \"code\": \"invalid_type\",\n    \"path\": [\n      \"path\"\n    ],\n    \"message\": \"Invalid input: expected string, received {received}\"\n  }}\n]")
        );
    }
    let body =
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_section_source"}}"#;
    let (text, is_error) = tool_text(&env.rpc(&t, &session, &[], body).await);
    assert!(is_error);
    assert_eq!(
        text,
        format!("{prefix}[\n  {{\n    \"expected\": \"object\",\n    \"code\": \"invalid_type\",\n    \"path\": [],\n    \"message\": \"Invalid input: expected object, received undefined\"\n  }}\n]")
    );
    for args in [
        json!("a.md"),
        json!(["a.md"]),
        json!({"path": "a.md", "extra": 1}),
    ] {
        let (text, is_error) = tool_text(&env.call(&t, &session, args).await);
        assert!(is_error);
        assert!(text.starts_with(prefix), "{text}");
    }
    assert_eq!(env.canister.count(), 0);
    env.assert_gateway_never_ran_the_tool();
}

#[tokio::test]
async fn runtime_failures_and_rate_limit() {
    let env = Env::start_with(|c| c.mcp.calls_per_minute = 6).await;
    env.canister
        .set_override("empty.md", CanisterOverride::new().status(200).body(""));
    env.canister.set_override(
        "bad.md",
        CanisterOverride::new().status(200).body("not json canary"),
    );
    env.canister.set_override(
        "fm.md",
        CanisterOverride::new()
            .status(200)
            .body(r##"{"frontmatter":"\"a\"canary\"","body":"# x"}"##),
    );
    let t = token("google:actor");
    let session = env.initialize(&t).await; // 1 of 6
    for p in ["empty.md", "bad.md", "fm.md"] {
        let (text, is_error) = tool_text(&env.call(&t, &session, json!({"path": p})).await);
        assert!(is_error);
        assert_eq!(
            text, r#"{"error":"Runtime failure","code":"UPSTREAM_ERROR"}"#,
            "{p}"
        );
    }
    // A passed-through request counts in the same window.
    let r = env
        .rpc(
            &t,
            &session,
            &[],
            r#"{"jsonrpc":"2.0","id":5,"method":"ping"}"#,
        )
        .await;
    assert_eq!(r.status, 200);
    let (_, is_error) = tool_text(&env.call(&t, &session, json!({"path": "x.md"})).await);
    assert!(is_error); // 404 upstream, the 6th request
    let r = env.call(&t, &session, json!({"path": "x.md"})).await;
    assert_eq!(r.status, 429);
    assert_eq!(
        r.text(),
        r#"{"jsonrpc":"2.0","error":{"code":-32600,"message":"Rate limit exceeded"}}"#
    );
    let metrics = env.sidecar.metrics().encode();
    assert!(metrics.contains("knowtation_sidecar_intercepted_requests_total{outcome=\"bad_gateway\",surface=\"mcp\"} 3"), "{metrics}");
    assert!(metrics.contains(
        "knowtation_sidecar_intercepted_requests_total{outcome=\"rate_limited\",surface=\"mcp\"} 1"
    ));
    assert!(metrics.contains("knowtation_sidecar_mcp_sessions 1"));
    env.assert_gateway_never_ran_the_tool();
}

// ---------------------------------------------------------------------------------------
// Policy and list rewriting.

#[tokio::test]
async fn denied_roles_neither_see_nor_run_the_tool() {
    let dir = std::env::temp_dir().join(format!("mcp-policy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("policy.toml");
    std::fs::write(&file, "default = \"allow\"\n[roles]\nviewer = \"deny\"\n").unwrap();
    let f = file.clone();
    let env = Env::start_with(move |c| c.mcp.policy_file = Some(f)).await;
    // The gateway itself lists the tool: the sidecar removes it for a denied role.
    let mut descriptor: Value = serde_json::from_str(TOOL_DESCRIPTOR).unwrap();
    descriptor["name"] = json!("get_section_source");
    env.gw
        .set_mcp_tools(Some(vec![json!({"name": "search"}), descriptor]));
    let t = token("google:actor");
    let session = env.initialize(&t).await;
    for json_answers in [false, true] {
        env.gw.set_mcp_json_answers(json_answers);
        let r = env
            .rpc(
                &t,
                &session,
                &[],
                r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
            )
            .await;
        assert_eq!(r.status, 200);
        assert!(!r.text().contains("get_section_source"), "{}", r.text());
        assert!(r.text().contains("\"name\":\"search\""));
    }
    env.gw.set_mcp_json_answers(false);
    let (text, is_error) = tool_text(&env.call(&t, &session, json!({"path": "a.md"})).await);
    assert!(is_error);
    assert_eq!(text, "MCP error -32602: Tool get_section_source not found");
    assert_eq!(env.canister.count(), 0);
    // An editor is allowed.
    env.bridge
        .set_json(&json!({"allowed_vault_ids": [VAULT], "role": "editor"}));
    let t2 = token("google:editor");
    let s2 = env.initialize(&t2).await;
    let r = env
        .rpc(
            &t2,
            &s2,
            &[],
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
        )
        .await;
    assert_eq!(r.text().matches("get_section_source").count(), 1);
    let _ = std::fs::remove_dir_all(&dir);
    env.assert_gateway_never_ran_the_tool();
}

#[tokio::test]
async fn injection_respects_pagination() {
    let env = Env::start().await;
    let t = token("google:actor");
    let session = env.initialize(&t).await;
    env.gw.set_mcp_next_cursor(Some("page-2"));
    let r = env
        .rpc(
            &t,
            &session,
            &[],
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
        )
        .await;
    assert!(!r.text().contains("get_section_source"));
    assert!(r.text().contains("page-2"));
    env.gw.set_mcp_next_cursor(None);
    env.gw.set_mcp_json_answers(true);
    let r = env
        .rpc(
            &t,
            &session,
            &[],
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"cursor":"page-2"}}"#,
        )
        .await;
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert!(r.text().contains(TOOL_DESCRIPTOR));
    let m: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(m["id"], 2);
}

// ---------------------------------------------------------------------------------------
// The door.

/// §6 ACL: a resource the lists hide cannot be read through the sidecar either. The
/// read is answered as the SDK answers a URI no resource matches, after the same checks
/// as a tool call, and never reaches the gateway, however the URI spells the name; in a
/// batch it is refused; other reads pass; shadow mode passes it, as it passes the lists.
#[tokio::test]
async fn hidden_resources_cannot_be_read_either() {
    let env = Env::start().await;
    let t = token("google:reader");
    let session = env.initialize(&t).await;
    let before = env.mcp_count();
    let read = |uri: &str, id: &str| {
        json!({"jsonrpc":"2.0","id":id,"method":"resources/read","params":{"uri":uri}}).to_string()
    };
    for uri in [
        "knowtation://section-source/a.md",
        "knowtation://hosted/SECTION_SOURCE/a.md",
        "knowtation://hosted/section-\tsource/a.md",
        "knowtation://hosted/section%2Dsource/a.md",
        "knowtation://hosted/section%252Dsource/a.md",
        "knowtation://hosted/section%25252525252Dsource/a.md",
        "knowtation://hosted/get%5Fsection%5Fsource?path=a.md",
    ] {
        let r = env.rpc(&t, &session, &[], &read(uri, "r")).await;
        let m = sse_message(&r);
        assert_eq!(r.header("mcp-session-id"), Some(session.as_str()));
        assert_eq!(
            m,
            json!({"jsonrpc":"2.0","id":"r","error":{"code":-32602,
                "message":format!("MCP error -32602: Resource {uri} not found")}}),
            "{uri}"
        );
    }
    // The checks of a tool call come first: no session, no answer of ours.
    let r = env
        .rpc(
            &t,
            "nope",
            &[],
            &read("knowtation://section-source/a.md", "x"),
        )
        .await;
    assert_eq!(r.status, 404);
    let batch = format!(
        r#"[{{"jsonrpc":"2.0","id":9,"method":"ping"}},{}]"#,
        read("knowtation://section-source/a.md", "b")
    );
    let r = env.rpc(&t, &session, &[], &batch).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        env.mcp_count(),
        before,
        "no hidden read reached the gateway"
    );
    let intercepted = format!("http://{}/metrics", env.sidecar.admin_addr);
    let metrics = client::get(&intercepted, &[]).await.unwrap().text();
    assert!(
        metrics.contains(r#"outcome="resource_hidden",surface="mcp"} 7"#),
        "{metrics}"
    );
    let r = env
        .rpc(&t, &session, &[], &read("knowtation://notes/a.md", "n"))
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(env.mcp_count(), before + 1, "an ordinary read passes");

    let shadow =
        Env::start_with(|c| c.intercept.mode = knowtation_sidecar::config::Mode::Shadow).await;
    let session = shadow.initialize(&t).await;
    let before = shadow.mcp_count();
    let r = shadow
        .rpc(
            &t,
            &session,
            &[],
            &read("knowtation://section-source/a.md", "s"),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(shadow.mcp_count(), before + 1, "shadow mode passes it");
    env.assert_gateway_never_ran_the_tool();
}

#[tokio::test]
async fn batches_and_header_mismatches_are_refused() {
    let env = Env::start().await;
    let t = token("google:actor");
    let session = env.initialize(&t).await;
    let before = env.mcp_count();
    for batch in [
        format!("[{CALL}]"),
        format!(r#"[{{"jsonrpc":"2.0","id":9,"method":"ping"}},{CALL}]"#),
        r#"[{"jsonrpc":"2.0","id":9,"method":"tools/list"}]"#.to_owned(),
        r#"[{"jsonrpc":"2.0","id":9,"method":"initialize","params":{}}]"#.to_owned(),
    ] {
        let r = env.rpc(&t, &session, &[], &batch).await;
        assert_eq!(r.status, 400, "{batch}");
        assert_eq!(r.json()["error"]["code"], -32600);
    }
    for (name, value) in [
        ("mcp-method", "tools/list"),
        ("mcp-name", "search"),
        ("mcp-method", "ping"),
    ] {
        let r = env.rpc(&t, &session, &[(name, value)], CALL).await;
        assert_eq!(r.status, 400, "{name}: {value}");
    }
    assert_eq!(
        env.mcp_count(),
        before,
        "nothing refused reached the gateway"
    );
    // Agreeing headers pass; other batches pass through.
    let r = env
        .rpc(
            &t,
            &session,
            &[
                ("mcp-method", "tools/call"),
                ("mcp-name", "get_section_source"),
            ],
            CALL,
        )
        .await;
    assert_eq!(r.status, 200);
    let r = env
        .rpc(&t, &session, &[], r#"[{"jsonrpc":"2.0","id":9,"method":"ping"},{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"search","arguments":{}}}]"#)
        .await;
    assert_eq!(r.status, 200);
    assert!(r.text().contains("answered by the mock gateway"));
    env.assert_gateway_never_ran_the_tool();
}

#[tokio::test]
async fn bodies_the_sidecar_cannot_classify_are_refused() {
    let env = Env::start_with(|c| c.mcp.max_body_bytes = 1024).await;
    let t = token("google:actor");
    let session = env.initialize(&t).await;
    let before = env.mcp_count();
    let auth = format!("Bearer {t}");
    let base = [
        ("authorization", auth.as_str()),
        ("accept", ACCEPT),
        ("mcp-session-id", session.as_str()),
    ];
    let send = |extra: Vec<(&'static str, &'static str)>, body: Vec<u8>| {
        let mut h: Vec<(&str, &str)> = base.to_vec();
        h.extend(extra);
        let env = &env;
        async move { env.send(Method::POST, "/mcp", &h, body).await }
    };
    let r = send(
        vec![
            ("content-type", "application/json"),
            ("content-encoding", "gzip"),
        ],
        CALL.as_bytes().to_vec(),
    )
    .await;
    assert_eq!(r.status, 415);
    let r = send(
        vec![("content-type", "application/json; charset=utf-16")],
        CALL.as_bytes().to_vec(),
    )
    .await;
    assert_eq!(r.status, 415);
    let r = send(
        vec![("content-type", "application/json")],
        vec![0xff, 0xfe, b'{', b'}'],
    )
    .await;
    assert_eq!(r.status, 400);
    let r = send(
        vec![("content-type", "application/json")],
        b"{not json".to_vec(),
    )
    .await;
    assert_eq!(r.status, 400);
    let mut big = CALL.as_bytes().to_vec();
    big.extend(std::iter::repeat_n(b' ', 2000));
    let r = send(vec![("content-type", "application/json")], big).await;
    assert_eq!(r.status, 413);
    assert_eq!(env.mcp_count(), before);
    // Duplicate keys: the last wins, so this is a section-source call the sidecar answers.
    let dup = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search","name":"get_section_source","arguments":{"path":"a.md"}}}"#;
    let r = send(
        vec![("content-type", "application/json")],
        dup.as_bytes().to_vec(),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.text().contains("Upstream 404"));
    // Every mount of the router is intercepted, and every path some chain of
    // normalizing hops in front of the gateway could turn into one (route.rs).
    for path in [
        "/MCP/",
        "/.netlify/functions/gateway/mcp",
        "/Mcp",
        "//.netlify/functions/gateway/../mcp",
        "/mcp//..",
    ] {
        let mut h: Vec<(&str, &str)> = base.to_vec();
        h.push(("content-type", "application/json"));
        let r = env.send(Method::POST, path, &h, CALL).await;
        assert!(r.text().contains("Upstream 404"), "{path}");
    }
    assert_eq!(env.mcp_count(), before);
    env.assert_gateway_never_ran_the_tool();
}

// ---------------------------------------------------------------------------------------
// Sessions.

#[tokio::test]
async fn no_hosted_access_creates_no_session() {
    let env = Env::start().await;
    env.bridge
        .set_reply(BridgeReply::json(403, &json!({"error": "forbidden"})));
    let t = token("google:actor");
    let auth = format!("Bearer {t}");
    let r = env
        .post(
            &[
                ("authorization", &auth),
                ("accept", ACCEPT),
                ("content-type", "application/json"),
            ],
            r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#,
        )
        .await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.text(),
        r#"{"jsonrpc":"2.0","error":{"code":-32600,"message":"No hosted access"}}"#
    );
    assert_eq!(env.mcp_count(), 0);
    assert!(env.gw.sessions().is_empty());
}

/// Both surfaces verify with one key set (§1): a token verified on REST is remembered
/// when the same caller opens an MCP session, and the reverse.
#[tokio::test]
async fn both_surfaces_share_the_remembered_tokens() {
    /// `tokens_verified_total` for `surface` and `check`, as exposed.
    async fn verified(env: &Env, surface: &str, check: &str) -> f64 {
        let url = format!("http://{}/metrics", env.sidecar.admin_addr);
        let metrics = client::get(&url, &[]).await.unwrap().text();
        let series = support::tokens_verified(surface, check);
        // Every series is exposed from the start, at zero.
        assert!(metrics.contains(&format!("{series} ")), "no {series}");
        support::Metrics::parse(&metrics).get(&series)
    }
    /// A REST section-source request for a note that does not exist.
    async fn rest(env: &Env, token: &str) -> http::StatusCode {
        let auth = format!("Bearer {token}");
        let path = "/api/v1/section-source?path=inbox/none.md";
        let headers = [("authorization", auth.as_str()), ("x-vault-id", VAULT)];
        env.send(Method::GET, path, &headers, Bytes::new())
            .await
            .status
    }
    let env = Env::start().await;
    let first = token("google:first");
    assert_eq!(rest(&env, &first).await, 404);
    env.initialize(&first).await;
    assert_eq!(verified(&env, "rest", "signature").await, 1.0);
    assert_eq!(verified(&env, "mcp", "signature").await, 0.0);
    assert_eq!(verified(&env, "mcp", "remembered").await, 1.0);

    let second = token("google:second");
    env.initialize(&second).await;
    assert_eq!(rest(&env, &second).await, 404);
    assert_eq!(verified(&env, "mcp", "signature").await, 1.0);
    assert_eq!(verified(&env, "rest", "remembered").await, 1.0);
    env.assert_gateway_never_ran_the_tool();
}

#[tokio::test]
async fn the_vault_and_token_are_frozen_at_initialize() {
    let env = Env::start().await;
    env.canister
        .insert_note(VAULT, "a.md", &json!({"title": "A"}), "# A");
    let t = token("google:actor");
    let session = env.initialize(&t).await;
    // A refreshed token for the same user, and another vault header, on the call.
    let refreshed = sign_token(
        SECRET,
        json!({"sub": "google:actor", "type": "mcp_access", "scopes": ["vault:write"], "exp": unix_now() + 7200}),
    );
    assert_ne!(refreshed, t);
    let body = CALL;
    let r = env
        .rpc(&refreshed, &session, &[("x-vault-id", "other-vault")], body)
        .await;
    assert!(!tool_text(&r).1, "{}", r.text());
    let req = &env.canister.requests()[0];
    assert_eq!(req.header("x-vault-id"), Some(VAULT));
    assert_eq!(
        req.header("authorization"),
        Some(format!("Bearer {t}").as_str())
    );
}

#[tokio::test]
async fn per_user_and_global_caps_evict_the_least_recently_active() {
    let env = Env::start_with(|c| {
        c.mcp.max_sessions_per_user = 2;
        c.mcp.max_sessions = 3;
    })
    .await;
    let t = token("google:actor");
    let first = env.initialize(&t).await;
    let second = env.initialize(&t).await;
    // `first` reaches the gateway again, so `second` is the least recently active there.
    let ping = r#"{"jsonrpc":"2.0","id":5,"method":"ping"}"#;
    assert_eq!(env.rpc(&t, &first, &[], ping).await.status, 200);
    let third = env.initialize(&t).await;
    assert_eq!(
        env.call(&t, &second, json!({"path": "a.md"})).await.status,
        404
    );
    assert_eq!(
        env.call(&t, &first, json!({"path": "a.md"})).await.status,
        200
    );
    assert_eq!(
        env.call(&t, &third, json!({"path": "a.md"})).await.status,
        200
    );
    // Two more users fill the table: the globally least recently active goes.
    let u2 = token("google:u2");
    let s2 = env.initialize(&u2).await;
    let u3 = token("google:u3");
    let s3 = env.initialize(&u3).await;
    assert_eq!(
        env.call(&t, &first, json!({"path": "a.md"})).await.status,
        404
    );
    assert_eq!(
        env.call(&u2, &s2, json!({"path": "a.md"})).await.status,
        200
    );
    assert_eq!(
        env.call(&u3, &s3, json!({"path": "a.md"})).await.status,
        200
    );
    let metrics = env.sidecar.metrics().encode();
    assert!(
        metrics.contains("knowtation_sidecar_mcp_session_evictions_total{reason=\"user_cap\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("knowtation_sidecar_mcp_session_evictions_total{reason=\"global_cap\"} 1")
    );
    assert!(metrics.contains("knowtation_sidecar_mcp_sessions 3"));
    env.assert_gateway_never_ran_the_tool();
}

#[tokio::test]
async fn delete_forgets_and_other_traffic_passes_through_intact() {
    let env = Env::start().await;
    let t = token("google:actor");
    let session = env.initialize(&t).await;
    let auth = format!("Bearer {t}");
    // Another tool, and a notification, reach the gateway unchanged.
    let other = r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"search","arguments":{"query":"x"}}}"#;
    let r = env.rpc(&t, &session, &[], other).await;
    assert_eq!(r.status, 200);
    assert!(r.text().contains("answered by the mock gateway"));
    let last = env.gw.requests().last().cloned().unwrap();
    assert_eq!(last.body_text(), other);
    let note = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    let r = env.rpc(&t, &session, &[], note).await;
    assert_eq!(r.status, 202);
    assert_eq!(env.gw.requests().last().unwrap().body_text(), note);
    // The GET stream flows from the gateway.
    let r = env
        .send(
            Method::GET,
            "/mcp",
            &[
                ("authorization", &auth),
                ("accept", "text/event-stream"),
                ("mcp-session-id", &session),
            ],
            Bytes::new(),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), ": mock stream\n\n");
    // DELETE passes through and the sidecar forgets the session.
    let r = env
        .send(
            Method::DELETE,
            "/mcp",
            &[("authorization", &auth), ("mcp-session-id", &session)],
            Bytes::new(),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), r#"{"ok":true}"#);
    let r = env.call(&t, &session, json!({"path": "a.md"})).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.text(), NOT_FOUND);
    env.assert_gateway_never_ran_the_tool();
}

/// Only a `POST /mcp` body is read (§6 door); a body on any other method is refused
/// before the gateway could read it, and the connection closes. Without a body those
/// methods pass as before.
#[tokio::test]
async fn bodies_on_other_methods_never_reach_the_gateway() {
    let env = Env::start().await;
    let t = token("google:actor");
    let session = env.initialize(&t).await;
    let auth = format!("Bearer {t}");
    let headers = [
        ("authorization", auth.as_str()),
        ("accept", ACCEPT),
        ("content-type", "application/json"),
        ("mcp-session-id", session.as_str()),
    ];
    let before = env.mcp_count();
    for method in [Method::GET, Method::DELETE, Method::PUT, Method::PATCH] {
        for path in ["/mcp", "/MCP/", "/.netlify/functions/gateway/mcp"] {
            let r = env
                .send(method.clone(), path, &headers, CALL.to_owned())
                .await;
            assert_eq!(r.status, 400, "{method} {path}");
            assert_eq!(r.header("connection"), Some("close"), "{method} {path}");
        }
    }
    assert_eq!(env.mcp_count(), before, "no body reached the gateway");
    let r = env.send(Method::PUT, "/mcp", &headers, Bytes::new()).await;
    assert_ne!(r.status, 400);
    let r = env.send(Method::GET, "/mcp", &headers, Bytes::new()).await;
    assert_eq!(r.status, 200);
    assert_eq!(env.mcp_count(), before + 2, "without a body they pass");
    env.assert_gateway_never_ran_the_tool();
}

/// `initialize` as a notification would open a gateway session answered 202 without its
/// id, counted against the caller's cap and never learned: refused before any lookup.
#[tokio::test]
async fn initialize_without_an_id_is_refused_before_the_lookup() {
    let env = Env::start().await;
    let t = token("google:actor");
    let auth = format!("Bearer {t}");
    let headers = [
        ("authorization", auth.as_str()),
        ("accept", ACCEPT),
        ("content-type", "application/json"),
    ];
    let params = r#""params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"p","version":"1"}}"#;
    for body in [
        format!(r#"{{"jsonrpc":"2.0","method":"initialize",{params}}}"#),
        format!(r#"{{"jsonrpc":"2.0","id":null,"method":"initialize",{params}}}"#),
        format!(r#"{{"jsonrpc":"2.0","id":1.5,"method":"initialize",{params}}}"#),
    ] {
        let r = env.post(&headers, &body).await;
        assert_eq!(r.status, 400, "{body}");
        assert_eq!(r.json()["error"]["code"], -32600, "{body}");
    }
    assert_eq!(env.mcp_count(), 0, "nothing reached the gateway");
    assert_eq!(env.bridge.count(), 0, "no lookup");
    env.initialize(&t).await;
}

#[tokio::test]
async fn unknown_sessions_on_list_calls_are_not_found() {
    let env = Env::start().await;
    let t = token("google:actor");
    let r = env
        .rpc(
            &t,
            "made-up",
            &[],
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
        )
        .await;
    assert_eq!(r.status, 404);
    assert_eq!(r.text(), NOT_FOUND);
}

#[tokio::test]
async fn the_idle_lifetime_is_clamped_to_at_least_five_minutes() {
    // One second asked for, five minutes applied (as `MCP_SESSION_TTL_MS` is clamped):
    // the session outlives the second. Expiry itself is covered with injected clocks in
    // the session table's unit tests.
    let env = Env::start_with(|c| c.mcp.session_ttl_seconds = 1).await;
    let t = token("google:actor");
    let session = env.initialize(&t).await;
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let r = env.call(&t, &session, json!({"path": "a.md"})).await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test]
async fn canaries_never_escape() {
    const CANARY: &str = "CANARY-7f3a";
    let env = Env::start().await;
    env.canister.insert_note(
        VAULT,
        "ok.md",
        &json!({"title": "Fine", "api_key": CANARY, "project": CANARY}),
        &format!("# Heading\n\n{CANARY} body\n\n```\n# {CANARY} in code\n```\n"),
    );
    for (path, status) in [("e401.md", 401), ("e500.md", 500), ("e302.md", 302)] {
        env.canister.set_override(
            path,
            CanisterOverride::new()
                .status(status)
                .body(format!(r#"{{"error":"{CANARY}","body":"{CANARY}"}}"#)),
        );
    }
    env.canister.set_override(
        "junk.md",
        CanisterOverride::new()
            .status(200)
            .body(format!("{CANARY} not json")),
    );
    let t = token("google:actor");
    let session = env.initialize(&t).await;
    let mut seen = String::new();
    for (path, expected) in [
        ("ok.md", None),
        ("e401.md", Some("Upstream 401")),
        ("e500.md", Some("Upstream 500")),
        ("e302.md", Some("Upstream 302")),
        ("junk.md", Some("Runtime failure")),
    ] {
        let r = env.call(&t, &session, json!({"path": path})).await;
        let (text, is_error) = tool_text(&r);
        match expected {
            None => assert!(!is_error, "{text}"),
            Some(m) => {
                assert!(is_error);
                assert_eq!(
                    text,
                    format!(r#"{{"error":"{m}","code":"UPSTREAM_ERROR"}}"#)
                );
            }
        }
        seen.push_str(&r.text());
        for (name, value) in &r.headers {
            seen.push_str(name.as_str());
            seen.push_str(&String::from_utf8_lossy(value.as_bytes()));
        }
    }
    seen.push_str(&env.sidecar.metrics().encode());
    assert!(!seen.contains(CANARY), "{seen}");
    env.assert_gateway_never_ran_the_tool();
}

/// Issue 9 §10, wire contract §5: the gateway sets its CORS headers on every answer (one
/// middleware before every route), so the answers the sidecar builds on `/mcp` carry
/// them too: a refusal before the body, a door refusal and the tool's own answer; the
/// gateway's answers are passed as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s5_sidecar_built_mcp_answers_carry_the_gateway_cors_headers() {
    let env = Env::start_with(|c| {
        c.cors.allowed_origins = vec!["https://hub.example".to_owned()];
    })
    .await;
    let origin = ("origin", "https://www.hub.example");
    let check = |r: &Collected, what: &str| {
        assert_eq!(
            r.header("access-control-allow-origin"),
            Some("https://www.hub.example"),
            "{what}"
        );
        assert_eq!(
            r.header("access-control-allow-credentials"),
            Some("true"),
            "{what}"
        );
        assert_eq!(r.header("vary"), Some("Origin"), "{what}");
        assert_eq!(
            r.header("access-control-allow-methods"),
            Some("GET, POST, PUT, PATCH, DELETE, OPTIONS"),
            "{what}"
        );
        assert_eq!(
            r.header("access-control-allow-headers"),
            Some("Authorization, Content-Type, X-Vault-Id, X-User-Id"),
            "{what}"
        );
    };
    // No token: 401 before the body is read.
    let r = env
        .post(
            &[
                origin,
                ("content-type", "application/json"),
                ("accept", ACCEPT),
            ],
            "{}",
        )
        .await;
    assert_eq!(r.status, 401);
    check(&r, "401");
    let token = token("google:actor");
    let auth = format!("Bearer {token}");
    // The door: not JSON.
    let r = env
        .post(
            &[
                origin,
                ("authorization", &auth),
                ("content-type", "text/plain"),
                ("accept", ACCEPT),
            ],
            "{}",
        )
        .await;
    assert_eq!(r.status, 415);
    check(&r, "415");
    // The tool, answered by the sidecar.
    env.canister
        .insert_note(VAULT, "inbox/one.md", &json!({}), "# A");
    let session = env.initialize(&token).await;
    let r = env
        .rpc(
            &token,
            &session,
            &[origin],
            &json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_section_source","arguments":{"path":"inbox/one.md"}}}).to_string(),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    check(&r, "tool answer");
    env.assert_gateway_never_ran_the_tool();
}

/// Sessions the sidecar and the gateway agree on (§6): in front of a gateway that keeps
/// sessions by its own rules, a request on a session its caller does not hold (unknown,
/// another user's, none) is answered by the sidecar and never reaches the gateway, which
/// would take the id for a new session, evict the caller's least recently active one
/// at its cap, and refuse the call as not initialized.
#[tokio::test]
async fn requests_on_sessions_the_caller_does_not_hold_never_reach_the_gateway() {
    let env = Env::start_with(|c| c.mcp.calls_per_minute = 1000).await;
    env.gw.set_mcp_gateway_rules(Some(8));
    let t = token("google:actor");
    let own: Vec<String> = initialize_n(&env, &t, 8).await;
    let other = token("google:someone-else");
    let foreign = env.initialize(&other).await;
    let live_before = env.gw.sessions();
    assert_eq!(live_before.len(), 9);
    let before = env.mcp_count();
    let auth = format!("Bearer {t}");
    let bodies = [
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
        r#"{"jsonrpc":"2.0","id":3,"method":"resources/list"}"#,
        r#"{"jsonrpc":"2.0","id":4,"method":"ping"}"#,
        r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"search","arguments":{"query":"x"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"[{"jsonrpc":"2.0","id":6,"method":"ping"},{"jsonrpc":"2.0","id":7,"method":"ping"}]"#,
        "5",
        CALL,
    ];
    for session in [Some("made-up"), Some(foreign.as_str()), None] {
        let mut headers = vec![
            ("authorization", auth.as_str()),
            ("accept", ACCEPT),
            ("content-type", "application/json"),
        ];
        if let Some(s) = session {
            headers.push(("mcp-session-id", s));
        }
        for body in bodies {
            let r = env.post(&headers, body).await;
            assert_eq!(r.status, 404, "{session:?} {body}");
            assert_eq!(r.text(), NOT_FOUND, "{session:?} {body}");
            assert_eq!(
                r.header("content-type"),
                Some("application/json; charset=utf-8")
            );
        }
        for method in [Method::GET, Method::HEAD] {
            let r = env
                .send(method.clone(), "/mcp", &headers, Bytes::new())
                .await;
            assert_eq!(r.status, 404, "{method} {session:?}");
            if method == Method::GET {
                assert_eq!(r.text(), NOT_FOUND);
            }
        }
        // The gateway's DELETE answers 200 and changes nothing on a session the caller
        // does not hold: the sidecar answers the same.
        let r = env
            .send(Method::DELETE, "/mcp", &headers, Bytes::new())
            .await;
        assert_eq!(r.status, 200, "{session:?}");
        assert_eq!(r.text(), r#"{"ok":true}"#);
        assert_eq!(
            r.header("content-type"),
            Some("application/json; charset=utf-8")
        );
    }
    assert_eq!(env.mcp_count(), before, "a request reached the gateway");
    assert_eq!(env.gw.sessions(), live_before, "the gateway lost a session");
    // The caller's own sessions and the other user's still work, through the gateway.
    for s in &own {
        let r = env
            .rpc(&t, s, &[], r#"{"jsonrpc":"2.0","id":8,"method":"ping"}"#)
            .await;
        assert_eq!(sse_message(&r)["result"], json!({}));
    }
    let r = env
        .rpc(
            &other,
            &foreign,
            &[],
            r#"{"jsonrpc":"2.0","id":8,"method":"ping"}"#,
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(env.mcp_count(), before + 9);
    env.assert_gateway_never_ran_the_tool();
}

/// Opens `n` sessions for `token`, one after another.
async fn initialize_n(env: &Env, token: &str, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(env.initialize(token).await);
    }
    out
}

/// §6 step order for the requests the sidecar now answers: a full window is the 429
/// before the session check; on a live session the request is the gateway's to refuse.
#[tokio::test]
async fn a_full_window_is_refused_before_the_session_check() {
    let env = Env::start_with(|c| c.mcp.calls_per_minute = 3).await;
    let t = token("google:actor");
    let session = env.initialize(&t).await;
    let ping = r#"{"jsonrpc":"2.0","id":4,"method":"ping"}"#;
    assert_eq!(env.rpc(&t, &session, &[], ping).await.status, 200);
    assert_eq!(env.rpc(&t, "made-up", &[], ping).await.status, 404);
    // Full now.
    let before = env.mcp_count();
    let r = env.rpc(&t, "made-up", &[], ping).await;
    assert_eq!(r.status, 429);
    assert_eq!(
        r.text(),
        r#"{"jsonrpc":"2.0","error":{"code":-32600,"message":"Rate limit exceeded"}}"#
    );
    let auth = format!("Bearer {t}");
    let headers = [
        ("authorization", auth.as_str()),
        ("mcp-session-id", "made-up"),
    ];
    for method in [Method::GET, Method::DELETE] {
        let r = env
            .send(method.clone(), "/mcp", &headers, Bytes::new())
            .await;
        assert_eq!(r.status, 429, "{method}");
    }
    assert_eq!(env.mcp_count(), before);
    // The mock gateway has no window of its own: a request it is to refuse passes.
    assert_eq!(env.rpc(&t, &session, &[], ping).await.status, 200);
    assert_eq!(env.mcp_count(), before + 1);
}

/// §6: a session alive at both or at neither. A live session the gateway no longer
/// knows (here ended at the gateway alone, then after a gateway restart) is forgotten as
/// soon as the gateway answers a call on it with its not-initialized or unknown-session
/// answer: that call and every later one, `get_section_source` included, get 404
/// `Session not found`, which makes the client initialize again.
#[tokio::test]
async fn a_session_the_gateway_no_longer_knows_is_forgotten_at_once() {
    let env = Env::start().await;
    env.gw.set_mcp_gateway_rules(Some(8));
    env.canister
        .insert_note(VAULT, "a.md", &json!({"title": "A"}), "# A\n\nbody");
    let t = token("google:actor");
    let auth = format!("Bearer {t}");
    let ping = r#"{"jsonrpc":"2.0","id":4,"method":"ping"}"#;
    let session = env.initialize(&t).await;
    assert!(!tool_text(&env.call(&t, &session, json!({"path": "a.md"})).await).1);

    // The gateway ends it without the sidecar hearing of it; the next forwarded call
    // gets the SDK's 400 `Server not initialized` there, and 404 here.
    env.gw.drop_mcp_session(&session);
    let r = env.rpc(&t, &session, &[], ping).await;
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(r.text(), NOT_FOUND);
    assert_eq!(
        r.header("content-type"),
        Some("application/json; charset=utf-8")
    );
    let reached = env.mcp_count();
    assert_eq!(env.rpc(&t, &session, &[], ping).await.status, 404);
    let r = env.call(&t, &session, json!({"path": "a.md"})).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.text(), NOT_FOUND);
    let r = env
        .send(
            Method::GET,
            "/mcp",
            &[("authorization", &auth), ("mcp-session-id", &session)],
            Bytes::new(),
        )
        .await;
    assert_eq!(r.status, 404);
    assert_eq!(
        env.mcp_count(),
        reached,
        "a forgotten session reached the gateway"
    );

    // The gateway's 404 on a `GET` says the same.
    let streamed = env.initialize(&t).await;
    env.gw.drop_mcp_session(&streamed);
    let get = [
        ("authorization", auth.as_str()),
        ("mcp-session-id", streamed.as_str()),
    ];
    assert_eq!(
        env.send(Method::GET, "/mcp", &get, Bytes::new())
            .await
            .status,
        404
    );
    let reached = env.mcp_count();
    assert_eq!(
        env.call(&t, &streamed, json!({"path": "a.md"}))
            .await
            .status,
        404
    );
    assert_eq!(
        env.send(Method::GET, "/mcp", &get, Bytes::new())
            .await
            .status,
        404
    );
    assert_eq!(env.mcp_count(), reached);

    // A gateway restart: the session whose call finds out is forgotten with every
    // older session of its user; a newer one dies on its own first forwarded call.
    let older = env.initialize(&t).await;
    let middle = env.initialize(&t).await;
    let newer = env.initialize(&t).await;
    let other = token("google:someone-else");
    let others = env.initialize(&other).await;
    env.gw.restart_mcp();
    assert_eq!(env.rpc(&t, &middle, &[], ping).await.status, 404);
    let reached = env.mcp_count();
    assert_eq!(
        env.call(&t, &older, json!({"path": "a.md"})).await.status,
        404
    );
    assert_eq!(env.rpc(&t, &older, &[], ping).await.status, 404);
    assert_eq!(
        env.mcp_count(),
        reached,
        "the older session reached the gateway"
    );
    // Not known to be gone yet: still the sidecar's own tool, until it reaches the gateway.
    assert!(!tool_text(&env.call(&t, &newer, json!({"path": "a.md"})).await).1);
    assert!(!tool_text(&env.call(&other, &others, json!({"path": "a.md"})).await).1);
    for (tok, s) in [(&t, &newer), (&other, &others)] {
        assert_eq!(env.rpc(tok, s, &[], ping).await.status, 404);
        assert_eq!(env.call(tok, s, json!({"path": "a.md"})).await.status, 404);
    }
    // Initializing again works at once.
    let fresh = env.initialize(&t).await;
    assert_eq!(env.rpc(&t, &fresh, &[], ping).await.status, 200);
    assert!(!tool_text(&env.call(&t, &fresh, json!({"path": "a.md"})).await).1);

    let metrics = env.sidecar.metrics().encode();
    assert!(
        metrics.contains(
            "knowtation_sidecar_mcp_session_evictions_total{reason=\"gateway_dropped\"} 6"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains("knowtation_sidecar_mcp_sessions 1"),
        "{metrics}"
    );
    env.assert_gateway_never_ran_the_tool();
}

/// §6: the session the sidecar drops for a user at the cap is the one the gateway
/// dropped, its least recently active *at the gateway*. Calls the sidecar answers itself
/// never reach the gateway, so here they make the sidecar's own order of use differ from
/// the gateway's: the sidecar must follow the gateway's.
#[tokio::test]
async fn the_session_evicted_at_the_cap_is_the_one_the_gateway_evicted() {
    let env = Env::start().await;
    env.gw.set_mcp_gateway_rules(Some(8));
    env.canister
        .insert_note(VAULT, "a.md", &json!({"title": "A"}), "# A\n\nbody");
    let t = token("google:actor");
    let ping = r#"{"jsonrpc":"2.0","id":4,"method":"ping"}"#;
    let s = initialize_n(&env, &t, 8).await;
    // At the gateway: s0 and s1 are used again, so s2 is the least recently active.
    for i in [0, 1] {
        assert_eq!(env.rpc(&t, &s[i], &[], ping).await.status, 200);
    }
    // Here: s2 and s3 are used (for the sidecar's own tool), so by the sidecar's own use
    // s4 would be the least recently active.
    for i in [2, 3] {
        assert!(!tool_text(&env.call(&t, &s[i], json!({"path": "a.md"})).await).1);
    }
    let ninth = env.initialize(&t).await;
    let at_gateway = env.gw.sessions();
    assert!(!at_gateway.contains(&s[2]), "the gateway evicted s2");
    assert_eq!(at_gateway.len(), 8);

    let reached = env.mcp_count();
    let r = env.call(&t, &s[2], json!({"path": "a.md"})).await;
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(r.text(), NOT_FOUND);
    assert_eq!(env.rpc(&t, &s[2], &[], ping).await.status, 404);
    assert_eq!(
        env.mcp_count(),
        reached,
        "the evicted session reached the gateway"
    );
    let survivors: Vec<&String> = s
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 2)
        .map(|(_, id)| id)
        .chain([&ninth])
        .collect();
    for id in survivors {
        assert!(!tool_text(&env.call(&t, id, json!({"path": "a.md"})).await).1);
        let r = env.rpc(&t, id, &[], ping).await;
        assert_eq!(sse_message(&r)["result"], json!({}));
    }
    let metrics = env.sidecar.metrics().encode();
    assert!(
        metrics.contains("knowtation_sidecar_mcp_session_evictions_total{reason=\"user_cap\"} 1"),
        "{metrics}"
    );
    assert!(metrics
        .contains("knowtation_sidecar_mcp_session_evictions_total{reason=\"gateway_dropped\"} 0"));
    env.assert_gateway_never_ran_the_tool();
}

// ---------------------------------------------------------------------------------------
// The other two views.

/// `get_note_outline` and `get_document_tree` are answered by the sidecar exactly as
/// `get_section_source` is: one canister read with the MCP header set, the document the
/// extractor builds from the note as the tool's text, the same sanitized errors, the
/// SDK's argument errors naming the tool, and nothing reaching the gateway.
#[tokio::test]
async fn the_other_views_are_answered_by_the_sidecar() {
    let env = Env::start().await;
    let body = "# Intro\n\nCANARY-BODY text\n\n### Deep\n\n## Method\n\n# Outro\n";
    env.canister.insert_note(
        VAULT,
        "notes/views.md",
        &json!({"title": "Views", "secret": "CANARY-FM"}),
        body,
    );
    let t = token("google:actor");
    let session = env.initialize(&t).await;
    let p = knowtation_sidecar::path::validate("notes/views.md").unwrap();
    let fm = Frontmatter {
        title: Some(extract::FmValue::String("Views".to_owned())),
        ..Frontmatter::default()
    };
    let h = extract::parse(&p, &fm, body, &Limits::default()).unwrap();
    for (view, want) in [
        (View::NoteOutline, h.note_outline().to_json()),
        (View::DocumentTree, h.document_tree().to_json()),
    ] {
        let name = tool_name(view);
        let before = env.canister.count();
        let r = env
            .call_tool(&t, &session, name, json!({"path": "notes/views.md"}))
            .await;
        let (text, is_error) = tool_text(&r);
        assert!(!is_error, "{name}: {text}");
        assert_eq!(text, want, "{name}");
        assert!(!r.text().contains("CANARY"), "{name}");
        assert_eq!(env.canister.count(), before + 1, "{name}: one read");
        let req = env.canister.requests().pop().unwrap();
        assert_eq!(req.uri.to_string(), "/api/v1/notes/notes%2Fviews.md");
        assert_eq!(req.header("x-user-id"), Some("google:owner"));
        assert_eq!(req.header("x-vault-id"), Some(VAULT));

        // Errors: the path before any read, canister statuses as a number only.
        let r = env
            .call_tool(&t, &session, name, json!({"path": "../x.md"}))
            .await;
        assert_eq!(
            tool_text(&r),
            (
                r#"{"error":"Invalid path","code":"UPSTREAM_ERROR"}"#.to_owned(),
                true
            )
        );
        for status in [404, 500] {
            env.canister.set_override(
                "gone.md",
                CanisterOverride::new()
                    .status(status)
                    .body("CANARY-UPSTREAM stack trace at /srv/app.js"),
            );
            let r = env
                .call_tool(&t, &session, name, json!({"path": "gone.md"}))
                .await;
            assert_eq!(
                tool_text(&r),
                (
                    format!(r#"{{"error":"Upstream {status}","code":"UPSTREAM_ERROR"}}"#),
                    true
                )
            );
            assert!(!r.text().contains("CANARY"));
        }
        // The SDK's argument errors name the tool called.
        let r = env.call_tool(&t, &session, name, json!({})).await;
        let (text, is_error) = tool_text(&r);
        assert!(is_error);
        assert!(
            text.starts_with(&format!(
                "MCP error -32602: Input validation error: Invalid arguments for tool {name}: ["
            )),
            "{text}"
        );
        // A notification runs nothing.
        let reads = env.canister.count();
        let note = json!({"jsonrpc":"2.0","method":"tools/call","params":{"name":name,"arguments":{"path":"notes/views.md"}}});
        let r = env.rpc(&t, &session, &[], &note.to_string()).await;
        assert_eq!(r.status, 202);
        assert_eq!(env.canister.count(), reads);
        // In a batch it is refused.
        let batch = format!(
            r#"[{{"jsonrpc":"2.0","id":9,"method":"ping"}},{}]"#,
            json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":name,"arguments":{"path":"a.md"}}})
        );
        let r = env.rpc(&t, &session, &[], &batch).await;
        assert_eq!(r.status, 400, "{name}: batch");
    }
    // Each view's resources are hidden too, and reading one is an unknown resource.
    let before = env.mcp_count();
    for uri in [
        "knowtation://hosted/note-outline/a.md",
        "knowtation://hosted/Document_Tree/a.md",
        "knowtation://hosted/get%5Fnote%5Foutline?path=a.md",
    ] {
        let r = env
            .rpc(
                &t,
                &session,
                &[],
                &json!({"jsonrpc":"2.0","id":"r","method":"resources/read","params":{"uri":uri}})
                    .to_string(),
            )
            .await;
        assert_eq!(sse_message(&r)["error"]["code"], -32602, "{uri}");
    }
    assert_eq!(
        env.mcp_count(),
        before,
        "no hidden read reached the gateway"
    );
    env.assert_gateway_never_ran_the_tool();
}

/// A role the policy denies sees none of the three tools and gets the SDK's
/// unknown-tool answer for each, naming it.
#[tokio::test]
async fn denied_roles_neither_see_nor_run_any_view() {
    let dir = std::env::temp_dir().join(format!("mcp-policy-views-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("policy.toml");
    std::fs::write(&file, "default = \"allow\"\n[roles]\nviewer = \"deny\"\n").unwrap();
    let f = file.clone();
    let env = Env::start_with(move |c| c.mcp.policy_file = Some(f)).await;
    env.gw.set_mcp_tools(Some(vec![
        json!({"name": "search"}),
        json!({"name": "get_note_outline"}),
        json!({"name": "get_document_tree"}),
    ]));
    let t = token("google:actor");
    let session = env.initialize(&t).await;
    let r = env
        .rpc(
            &t,
            &session,
            &[],
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
        )
        .await;
    let names: Vec<String> = sse_message(&r)["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["search"]);
    for view in View::ALL {
        let name = tool_name(view);
        let r = env
            .call_tool(&t, &session, name, json!({"path": "a.md"}))
            .await;
        assert_eq!(
            tool_text(&r),
            (format!("MCP error -32602: Tool {name} not found"), true)
        );
    }
    assert_eq!(env.canister.count(), 0);
    let _ = std::fs::remove_dir_all(&dir);
    env.assert_gateway_never_ran_the_tool();
}

/// Writes a policy file under a fresh directory; the directory to remove afterwards.
fn policy_file(tag: &str, text: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("mcp-policy-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("policy.toml");
    std::fs::write(&file, text).unwrap();
    (dir, file)
}

/// `[views]`: a view the policy passes is the gateway's, untouched (its call, its list
/// entry or its absence, its resources, its REST route); a view it denies is hidden and
/// refused as an unknown tool (its route as one that does not exist), and the gateway
/// never runs it.
#[tokio::test]
async fn a_passed_view_is_the_gateways_and_a_denied_one_is_unknown() {
    let (dir, file) = policy_file(
        "modes",
        "[views]\nnote-outline = \"pass\"\ndocument-tree = \"deny\"\n",
    );
    let f = file.clone();
    let env = Env::start_with(move |c| c.mcp.policy_file = Some(f)).await;
    env.canister
        .insert_note(VAULT, "a.md", &json!({"title": "A"}), "# A\n");
    env.gw.set_mcp_tools(Some(vec![
        json!({"name": "search"}),
        json!({"name": "get_note_outline"}),
        json!({"name": "get_document_tree"}),
    ]));
    let t = token("google:actor");
    let session = env.initialize(&t).await;
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    let r = env.rpc(&t, &session, &[], list).await;
    let tools = sse_message(&r)["result"]["tools"].clone();
    assert_eq!(
        tools,
        json!([
            {"name": "search"},
            {"name": "get_note_outline"},
            serde_json::from_str::<Value>(TOOL_DESCRIPTOR).unwrap(),
        ]),
        "the passed view kept as the gateway lists it, the denied one gone, the owned one added"
    );
    // A gateway that lacks the passed view's tool keeps lacking it.
    env.gw.set_mcp_tools(Some(vec![json!({"name": "search"})]));
    let r = env.rpc(&t, &session, &[], list).await;
    assert!(!r.text().contains("get_note_outline"), "{}", r.text());

    // The passed view's call is the gateway's.
    let r = env
        .call_tool(&t, &session, "get_note_outline", json!({"path": "a.md"}))
        .await;
    assert_eq!(
        tool_text(&r),
        ("answered by the mock gateway".to_owned(), false)
    );
    assert!(env
        .gw
        .requests()
        .iter()
        .any(|r| r.body_text().contains("get_note_outline")));
    // The denied view's is an unknown tool, answered here.
    let before = env.mcp_count();
    let r = env
        .call_tool(&t, &session, "get_document_tree", json!({"path": "a.md"}))
        .await;
    assert_eq!(
        tool_text(&r),
        (
            "MCP error -32602: Tool get_document_tree not found".to_owned(),
            true
        )
    );
    assert_eq!(env.mcp_count(), before);
    assert_eq!(env.canister.count(), 0);
    // In a batch: the passed view's call goes through, the denied one's is refused.
    let batch = |name: &str| {
        format!(
            r#"[{{"jsonrpc":"2.0","id":9,"method":"ping"}},{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"{name}","arguments":{{"path":"a.md"}}}}}}]"#
        )
    };
    assert_eq!(
        env.rpc(&t, &session, &[], &batch("get_note_outline"))
            .await
            .status,
        200
    );
    assert_eq!(
        env.rpc(&t, &session, &[], &batch("get_document_tree"))
            .await
            .status,
        400
    );
    // Resources: the passed view's are read at the gateway, the denied view's are hidden.
    let read = |uri: &str| {
        json!({"jsonrpc":"2.0","id":"r","method":"resources/read","params":{"uri":uri}}).to_string()
    };
    let before = env.mcp_count();
    let r = env
        .rpc(
            &t,
            &session,
            &[],
            &read("knowtation://hosted/note-outline/a.md"),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(env.mcp_count(), before + 1, "the passed view's read passes");
    let r = env
        .rpc(
            &t,
            &session,
            &[],
            &read("knowtation://hosted/document-tree/a.md"),
        )
        .await;
    assert_eq!(sse_message(&r)["error"]["code"], -32602);
    assert_eq!(
        env.mcp_count(),
        before + 1,
        "the denied view's read does not"
    );
    let r = env
        .rpc(
            &t,
            &session,
            &[],
            r#"{"jsonrpc":"2.0","id":3,"method":"resources/list"}"#,
        )
        .await;
    assert!(!r.text().contains("section-source"), "{}", r.text());

    // REST: the passed view's route is the gateway's.
    let auth = format!("Bearer {t}");
    let r = env
        .send(
            Method::GET,
            "/api/v1/note-outline?path=a.md",
            &[("authorization", &auth), ("x-vault-id", VAULT)],
            "",
        )
        .await;
    assert_eq!(r.header("x-mock-upstream"), Some("gateway"));
    let r = env
        .send(
            Method::GET,
            "/api/v1/section-source?path=a.md",
            &[("authorization", &auth), ("x-vault-id", VAULT)],
            "",
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("x-mock-upstream"),
        None,
        "the owned view is answered here"
    );
    for r in env.gw.requests() {
        assert!(
            !r.body_text().contains("get_document_tree"),
            "{}",
            r.body_text()
        );
        assert!(
            !r.body_text().contains("get_section_source"),
            "{}",
            r.body_text()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A denied view's REST route is answered 404 here and never reaches the gateway.
#[tokio::test]
async fn a_denied_view_route_never_reaches_the_gateway() {
    let (dir, file) = policy_file("deny-rest", "[views]\nnote-outline = \"deny\"\n");
    let f = file.clone();
    let env = Env::start_with(move |c| c.mcp.policy_file = Some(f)).await;
    let auth = format!("Bearer {}", token("google:actor"));
    for path in [
        "/api/v1/note-outline?path=a.md",
        "/API/V1/NOTE-OUTLINE/?path=a.md",
        "/.netlify/functions/gateway/api/v1/note-outline?path=a.md",
    ] {
        let r = env
            .send(
                Method::GET,
                path,
                &[("authorization", &auth), ("x-vault-id", VAULT)],
                "",
            )
            .await;
        assert_eq!(r.status, 404, "{path}");
        assert_eq!(r.text(), r#"{"error":"Not found","code":"NOT_FOUND"}"#);
        assert_eq!(r.header("x-mock-upstream"), None);
    }
    assert!(env
        .gw
        .requests()
        .iter()
        .all(|r| !r.path().to_ascii_lowercase().contains("note-outline")));
    assert_eq!(env.canister.count(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `[sanitize]` is streaming-safe: a message over `sanitize.max_message_bytes` is not
/// held; the answer passes on as it came (counted `too_large`), whole; a message within
/// the bound is sanitized, in an event stream and in a JSON answer alike.
#[tokio::test]
async fn a_message_over_the_sanitize_bound_passes_whole_and_is_counted() {
    let env = Env::start_with(|c| c.sanitize.max_message_bytes = 64 * 1024).await;
    let t = token("google:actor");
    let session = env.initialize(&t).await;
    let big = "x".repeat(200 * 1024);
    let doc = json!({"path": "/srv/vault/a.md", "body": big}).to_string();
    env.gw.set_mcp_answer(
        "tools/call:get_note",
        json!({"result": {"content": [{"type": "text", "text": doc}]}}),
    );
    for json_answers in [false, true] {
        env.gw.set_mcp_json_answers(json_answers);
        let r = env
            .call_tool(&t, &session, "get_note", json!({"path": "a.md"}))
            .await;
        assert_eq!(r.status, 200);
        let text = r.text();
        let data = text
            .strip_prefix("event: message\ndata: ")
            .and_then(|t| t.strip_suffix("\n\n"))
            .unwrap_or(&text);
        let m: Value = serde_json::from_str(data).unwrap();
        assert_eq!(
            m["result"]["content"][0]["text"].as_str(),
            Some(doc.as_str()),
            "passed whole, as it came"
        );
    }
    // Within the bound it is sanitized.
    env.gw.set_mcp_answer(
        "tools/call:get_note",
        json!({"result": {"content": [{"type": "text", "text": r#"{"error":"Upstream 500: CANARY-small","code":"UPSTREAM_ERROR"}"#}], "isError": true}}),
    );
    let r = env
        .call_tool(&t, &session, "get_note", json!({"path": "a.md"}))
        .await;
    assert!(!r.text().contains("CANARY"), "{}", r.text());
    let metrics = client::get(&format!("http://{}/metrics", env.sidecar.admin_addr), &[])
        .await
        .unwrap()
        .text();
    assert!(
        metrics.contains("knowtation_sidecar_sanitized_total{kind=\"too_large\"} 2"),
        "{metrics}"
    );
    assert!(metrics.contains("knowtation_sidecar_sanitized_total{kind=\"tool_error\"} 1"));
    env.assert_gateway_never_ran_the_tool();
}
