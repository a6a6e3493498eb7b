//! The MCP choke point driven by a real MCP client nobody here wrote: rmcp's
//! streamable-HTTP client (wire contract §6) talks to a sidecar on loopback in front of
//! the test-kit gateway, canister and bridge. It must initialize through the sidecar,
//! see `get_section_source` in `tools/list`, get the SectionSource from the sidecar and
//! the gateway's answer for every other tool; the gateway never sees the tool call.
//! (rmcp asks for a protocol version newer than the SDK's; the mock gateway negotiates
//! down as the SDK does, and the client's later `MCP-Protocol-Version` and `Mcp-Method`
//! headers must pass the §6 checks.)

// Test code: a failed unwrap is a failed test, which is what we want here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use knowtation_sidecar::config::{Config, Secret};
use knowtation_sidecar::proxy;
use knowtation_testkit::{sign_token, unix_now, MockBridge, MockCanister, MockGateway};
use rmcp::model::CallToolRequestParams;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use serde_json::{json, Value};

const SECRET: &str = "rmcp-test-secret-0123456789abcdef";

fn text_of(result: &rmcp::model::CallToolResult) -> String {
    let content = serde_json::to_value(&result.content).unwrap();
    content[0]["text"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_client_gets_section_sources_from_the_sidecar() {
    let gw = MockGateway::start().await;
    let canister = MockCanister::start().await;
    let bridge = MockBridge::start().await;
    bridge.set_json(&json!({"effective_canister_user_id": "google:owner", "allowed_vault_ids": ["default"], "role": "viewer"}));
    canister.insert_note(
        "default",
        "inbox/one.md",
        &json!({"title": "One"}),
        "# A\n\nprivate body canary\n\n## B",
    );
    let mut c = Config::default();
    c.listen.address = "127.0.0.1:0".parse().unwrap();
    c.admin.address = "127.0.0.1:0".parse().unwrap();
    c.upstream.gateway_url = gw.url();
    c.upstream.canister_url = Some(canister.url());
    c.upstream.bridge_url = Some(bridge.url());
    c.auth.jwt_secrets = vec![Secret::new(SECRET)];
    c.shutdown.drain_seconds = 1;
    c.log.level = "warn".to_owned();
    let sidecar = proxy::start(c).await.unwrap();

    let token = sign_token(
        SECRET,
        json!({"sub": "google:actor", "type": "mcp_access", "scopes": ["vault:write"], "exp": unix_now() + 3600}),
    );
    let config = StreamableHttpClientTransportConfig::with_uri(format!(
        "http://{}/mcp",
        sidecar.listen_addr
    ))
    .auth_header(token);
    let transport = StreamableHttpClientTransport::from_config(config);
    let run = async {
        let client = ().serve(transport).await.unwrap();
        let tools = client.list_all_tools().await.unwrap();
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        assert!(names.contains(&"get_section_source"), "{names:?}");
        assert!(names.contains(&"search"), "{names:?}");

        let args = json!({"path": "inbox/one.md"}).as_object().unwrap().clone();
        let result = client
            .call_tool(CallToolRequestParams::new("get_section_source").with_arguments(args))
            .await
            .unwrap();
        assert_ne!(result.is_error, Some(true));
        let text = text_of(&result);
        assert!(!text.contains("canary"));
        let doc: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(doc["schema"], "knowtation.section_source/v0");
        assert_eq!(doc["title"], "One");
        assert_eq!(doc["sections"].as_array().unwrap().len(), 2);

        let args = json!({"path": "../secret.md"}).as_object().unwrap().clone();
        let result = client
            .call_tool(CallToolRequestParams::new("get_section_source").with_arguments(args))
            .await
            .unwrap();
        assert_eq!(result.is_error, Some(true));
        assert_eq!(
            text_of(&result),
            r#"{"error":"Invalid path","code":"UPSTREAM_ERROR"}"#
        );

        let args = json!({"query": "x"}).as_object().unwrap().clone();
        let result = client
            .call_tool(CallToolRequestParams::new("search").with_arguments(args))
            .await
            .unwrap();
        assert_eq!(text_of(&result), "answered by the mock gateway");
        let _ = client.cancel().await;
    };
    tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the rmcp exchange finished in time");

    assert_eq!(canister.count(), 1);
    for r in gw.requests() {
        assert!(
            !r.body_text().contains("get_section_source"),
            "{}",
            r.body_text()
        );
    }
}
