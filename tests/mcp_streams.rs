//! Event streams through the real binary (`serve`), against the test-kit gateway keeping
//! events as the MCP SDK does when given an event store: every message event carries an
//! `id`, and under protocol `2025-11-25` every answer stream starts with a priming event
//! (`id`, `retry`, empty data), which clients use to resume with `Last-Event-ID`.
//!
//! - `tools/list`, `resources/list` and `resources/templates/list` are rewritten under
//!   each protocol version the door accepts (`2025-11-25`, `2025-06-18`, `2025-03-26`,
//!   `2024-11-05`): the priming event passes as it came, each message keeps its `event`
//!   and `id`, and its data is the rewritten list;
//! - a stream written with CRLF or lone-CR line ends, a BOM, comments and data split over
//!   two `data:` lines keeps every byte but the rewritten data;
//! - `Last-Event-ID` reaches the gateway unchanged on `GET` and on `POST`, and the list
//!   answers a `GET` replays from the gateway's store are rewritten as the answers of
//!   the list calls are (a role the policy denies never sees the tool, section-source
//!   resources never appear), also for an answer the gateway stored that never passed
//!   through the sidecar;
//! - a replayed event larger than the caller's buffered-bytes share cuts the stream, and
//!   the bytes held for it come back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/sidecar.rs"]
mod support;

use std::time::Duration;

use knowtation_sidecar::mcp::{DOCUMENT_TREE_DESCRIPTOR, NOTE_OUTLINE_DESCRIPTOR, TOOL_DESCRIPTOR};
use knowtation_testkit::{MockBridge, MockGateway, SseStyle, PRIMING_RETRY_MS};
use serde_json::{json, Value};
use support::{exchange, get_request, post_request, token, Raw, Sidecar};

const ACCEPT: &str = "application/json, text/event-stream";
const WAIT: Duration = Duration::from_secs(10);

/// The protocol versions the door accepts (the SDK's list, less the one it only reads).
const VERSIONS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

const LISTS: [&str; 3] = ["tools/list", "resources/list", "resources/templates/list"];

struct Env {
    gw: MockGateway,
    _bridge: MockBridge,
    sidecar: Sidecar,
}

impl Env {
    /// The binary in front of a gateway with an event store; `deny`: a tool policy that
    /// hides the tool from every role.
    async fn start(deny: bool) -> Env {
        Env::start_with(deny, &[]).await
    }

    async fn start_with(deny: bool, extra: &[(&str, String)]) -> Env {
        let gw = MockGateway::start().await;
        gw.set_mcp_event_store(true);
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
        if deny {
            let dir = std::env::temp_dir().join(format!("mcp-streams-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let file = dir.join("policy.toml");
            std::fs::write(&file, "default = \"deny\"\n").unwrap();
            env.push(("MCP__POLICY_FILE", file.display().to_string()));
        }
        let sidecar = Sidecar::spawn(&env);
        sidecar.wait_ready().await;
        Env {
            gw,
            _bridge: bridge,
            sidecar,
        }
    }

    async fn post_to(
        &self,
        addr: std::net::SocketAddr,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Raw {
        let auth = format!("Bearer {}", token("alice"));
        let mut h = vec![("Authorization", auth.as_str()), ("Accept", ACCEPT)];
        h.extend_from_slice(headers);
        exchange(addr, &post_request("/mcp", &h, body), WAIT).await
    }

    async fn post(&self, headers: &[(&str, &str)], body: &str) -> Raw {
        self.post_to(self.sidecar.addr, headers, body).await
    }

    /// `initialize` under `version` through the sidecar: the session id.
    async fn initialize(&self, version: &str) -> String {
        let body = json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
        })
        .to_string();
        let r = self.post(&[("X-Vault-Id", "default")], &body).await;
        assert_eq!(r.status, 200, "{version}: {}", r.all_text());
        r.header("mcp-session-id").unwrap().to_owned()
    }

    /// `method` in `session` under `version`, with `extra` headers.
    async fn list(
        &self,
        session: &str,
        version: &str,
        method: &str,
        id: u32,
        extra: &[(&str, &str)],
    ) -> Raw {
        let mut h = vec![
            ("Mcp-Session-Id", session),
            ("MCP-Protocol-Version", version),
        ];
        h.extend_from_slice(extra);
        let body = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}"}}"#);
        self.post(&h, &body).await
    }

    /// `GET /mcp` in `session` with `Last-Event-ID: last`.
    async fn resume(&self, session: &str, version: &str, last: &str) -> Raw {
        let auth = format!("Bearer {}", token("alice"));
        let h = [
            ("Authorization", auth.as_str()),
            ("Accept", "text/event-stream"),
            ("Mcp-Session-Id", session),
            ("MCP-Protocol-Version", version),
            ("Last-Event-ID", last),
        ];
        exchange(self.sidecar.addr, &get_request("/mcp", &h), WAIT).await
    }

    /// The `last-event-id` of the last request the gateway received with `method`.
    fn last_event_id_seen(&self, method: &str) -> Option<String> {
        self.gw
            .requests()
            .into_iter()
            .rev()
            .find(|r| r.method.as_str() == method)
            .and_then(|r| r.header("last-event-id").map(str::to_owned))
    }
}

/// One event as written: its lines without their ends.
#[derive(Debug, Clone, PartialEq)]
struct Event(Vec<String>);

impl Event {
    fn field(&self, name: &str) -> Option<&str> {
        self.0.iter().rev().find_map(|l| {
            l.strip_prefix(name)
                .and_then(|r| r.strip_prefix(':'))
                .map(|v| v.strip_prefix(' ').unwrap_or(v))
        })
    }

    /// The data, joined as a client joins it.
    fn data(&self) -> String {
        self.0
            .iter()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|v| v.strip_prefix(' ').unwrap_or(v))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn message(&self) -> Value {
        serde_json::from_str(&self.data()).unwrap_or(Value::Null)
    }
}

/// The events of a stream body, as a client splits them (lines end at CRLF, LF or CR; a
/// leading BOM dropped), and the line ends used.
fn events(body: &[u8]) -> (Vec<Event>, Vec<&'static str>) {
    let text = String::from_utf8(body.to_vec()).unwrap();
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let (mut out, mut ends, mut lines) = (Vec::new(), Vec::new(), Vec::new());
    let mut rest = text;
    while let Some(at) = rest.find(['\r', '\n']) {
        let line = rest[..at].to_owned();
        let end = if rest[at..].starts_with("\r\n") {
            "\r\n"
        } else if rest[at..].starts_with('\r') {
            "\r"
        } else {
            "\n"
        };
        ends.push(end);
        rest = &rest[at + end.len()..];
        if line.is_empty() {
            if !lines.is_empty() {
                out.push(Event(std::mem::take(&mut lines)));
            }
        } else {
            lines.push(line);
        }
    }
    assert!(rest.is_empty() && lines.is_empty(), "unfinished: {text:?}");
    (out, ends)
}

/// The names of a `tools/list` result's tools.
fn tool_names(message: &Value) -> Vec<String> {
    message["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

/// What the rewritten list of `method` must hold (the gateway lists `search`, and one
/// ordinary and one section-source entry of each resource list).
fn assert_rewritten(method: &str, message: &Value, deny: bool, what: &str) {
    match method {
        "tools/list" if deny => assert_eq!(tool_names(message), ["search"], "{what}"),
        "tools/list" => {
            assert_eq!(
                tool_names(message),
                [
                    "search",
                    "get_section_source",
                    "get_note_outline",
                    "get_document_tree"
                ],
                "{what}"
            );
            for (i, d) in [
                TOOL_DESCRIPTOR,
                NOTE_OUTLINE_DESCRIPTOR,
                DOCUMENT_TREE_DESCRIPTOR,
            ]
            .into_iter()
            .enumerate()
            {
                let descriptor: Value = serde_json::from_str(d).unwrap();
                assert_eq!(message["result"]["tools"][i + 1], descriptor, "{what}");
            }
        }
        "resources/list" => assert_eq!(
            message["result"]["resources"],
            json!([{"uri": "knowtation://notes/a.md", "name": "a"}]),
            "{what}"
        ),
        _ => assert_eq!(
            message["result"]["resourceTemplates"],
            json!([{"uriTemplate": "knowtation://notes/{path}", "name": "note"}]),
            "{what}"
        ),
    }
}

/// Under every version the door accepts: the lists rewritten, the priming event (under
/// 2025-11-25) passed as the gateway wrote it, every `event` and `id` kept, and
/// `Last-Event-ID` forwarded as it came on `GET` and `POST`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_answers_are_rewritten_under_every_protocol_version() {
    let env = Env::start(false).await;
    for version in VERSIONS {
        let session = env.initialize(version).await;
        let primed = version >= "2025-11-25";
        for (n, method) in LISTS.into_iter().enumerate() {
            let what = format!("{version} {method}");
            let id = 10 + n as u32;
            let r = env.list(&session, version, method, id, &[]).await;
            assert_eq!(r.status, 200, "{what}: {}", r.all_text());
            assert_eq!(
                r.header("content-type"),
                Some("text/event-stream"),
                "{what}"
            );
            let (events, ends) = events(&r.body);
            assert!(ends.iter().all(|e| *e == "\n"), "{what}");
            let stored = env.gw.stored_events();
            let message = if primed {
                assert_eq!(events.len(), 2, "{what}: {events:?}");
                let priming = &events[0];
                let pid = priming.field("id").unwrap();
                assert_eq!(
                    priming.0,
                    [
                        format!("id: {pid}"),
                        format!("retry: {PRIMING_RETRY_MS}"),
                        "data: ".to_owned()
                    ],
                    "{what}"
                );
                assert!(stored.contains(&(pid.to_owned(), true)), "{what}");
                &events[1]
            } else {
                assert_eq!(events.len(), 1, "{what}: {events:?}");
                &events[0]
            };
            let mid = message.field("id").unwrap();
            assert!(stored.contains(&(mid.to_owned(), false)), "{what}");
            assert_eq!(
                message.0[..2],
                ["event: message", format!("id: {mid}").as_str()],
                "{what}"
            );
            let m = message.message();
            assert_eq!(m["id"], id, "{what}");
            assert_rewritten(method, &m, false, &what);

            // `Last-Event-ID` reaches the gateway as it came, on a POST too.
            let r = env
                .list(&session, version, method, id, &[("Last-Event-ID", mid)])
                .await;
            assert_eq!(r.status, 200, "{what}");
            assert_eq!(
                env.last_event_id_seen("POST").as_deref(),
                Some(mid),
                "{what}"
            );
            // And on a GET: after the last event of its stream, nothing to replay.
            let r = env.resume(&session, version, mid).await;
            assert_eq!(r.status, 200, "{what}: {}", r.all_text());
            assert_eq!(
                env.last_event_id_seen("GET").as_deref(),
                Some(mid),
                "{what}"
            );
            assert!(events_of(&r).is_empty(), "{what}: {}", r.all_text());
        }
    }
    let log = env.sidecar.stop();
    assert!(!log.contains("event stream cut"), "{log}");
}

fn events_of(r: &Raw) -> Vec<Event> {
    events(&r.body).0
}

/// A `GET` with the id of a priming event replays the list answer of its stream from
/// the gateway's store: it is rewritten again on its way, whether the list call went
/// through the sidecar or (as a store may hold answers of any origin) straight to the
/// gateway. The tool policy denies the tool here, and the gateway lists it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_list_answers_are_rewritten_again() {
    let env = Env::start(true).await;
    env.gw.set_mcp_tools(Some(vec![
        json!({"name": "search", "inputSchema": {"type": "object"}}),
        json!({"name": "get_section_source", "inputSchema": {"type": "object"}}),
    ]));
    let version = "2025-11-25";
    let session = env.initialize(version).await;
    for (n, method) in LISTS.into_iter().enumerate() {
        let id = 20 + n as u32;
        for direct in [true, false] {
            let what = format!(
                "{method} (the call {})",
                if direct {
                    "straight to the gateway"
                } else {
                    "through the sidecar"
                }
            );
            let h = [
                ("Mcp-Session-Id", session.as_str()),
                ("MCP-Protocol-Version", version),
            ];
            let body = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}"}}"#);
            let r = if direct {
                env.post_to(env.gw.addr(), &h, &body).await
            } else {
                env.post(&h, &body).await
            };
            assert_eq!(r.status, 200, "{what}: {}", r.all_text());
            let answered = events_of(&r);
            let priming = answered[0].field("id").unwrap().to_owned();
            let message_id = answered[1].field("id").unwrap().to_owned();
            if !direct {
                assert_rewritten(method, &answered[1].message(), true, &what);
            }

            let r = env.resume(&session, version, &priming).await;
            assert_eq!(r.status, 200, "{what}: {}", r.all_text());
            assert_eq!(
                env.last_event_id_seen("GET"),
                Some(priming.clone()),
                "{what}"
            );
            let replayed = events_of(&r);
            assert_eq!(replayed.len(), 1, "{what}: {}", r.all_text());
            assert_eq!(
                replayed[0].0[..2],
                ["event: message", format!("id: {message_id}").as_str()],
                "{what}"
            );
            let m = replayed[0].message();
            assert_eq!(m["id"], id, "{what}");
            assert_rewritten(method, &m, true, &what);
        }
    }
    drop(env);
}

/// Line ends CRLF and lone CR, a BOM, a comment before each event, data over two lines:
/// everything but the rewritten data comes back byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_framing_is_read_as_a_client_reads_it_and_kept() {
    let env = Env::start(false).await;
    let version = "2025-11-25";
    let session = env.initialize(version).await;
    for line_end in ["\r\n", "\r"] {
        env.gw.set_mcp_sse_style(SseStyle {
            line_end,
            bom: true,
            comments: true,
            split_data: true,
        });
        for (n, method) in LISTS.into_iter().enumerate() {
            let what = format!("{line_end:?} {method}");
            let r = env
                .list(&session, version, method, 30 + n as u32, &[])
                .await;
            assert_eq!(r.status, 200, "{what}: {}", r.all_text());
            assert!(r.body.starts_with("\u{feff}".as_bytes()), "{what}");
            let (events, ends) = events(&r.body);
            assert!(ends.iter().all(|e| *e == line_end), "{what}: {ends:?}");
            assert_eq!(events.len(), 2, "{what}: {events:?}");
            let pid = events[0].field("id").unwrap();
            assert_eq!(
                events[0].0,
                [
                    ": mock comment".to_owned(),
                    format!("id: {pid}"),
                    format!("retry: {PRIMING_RETRY_MS}"),
                    "data: ".to_owned()
                ],
                "{what}"
            );
            let mid = events[1].field("id").unwrap();
            assert_eq!(
                events[1].0[..3],
                [
                    ": mock comment",
                    "event: message",
                    format!("id: {mid}").as_str()
                ],
                "{what}"
            );
            assert_rewritten(method, &events[1].message(), false, &what);
        }
    }
    drop(env);
}

/// A replayed event is held whole before it passes: one larger than the caller's share
/// of the buffered-bytes budget cuts the stream instead (the client resumes or not, it
/// never gets the event unread), and what was held comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_event_over_the_budget_cuts_the_stream() {
    let env = Env::start_with(
        false,
        &[
            (
                "LISTEN__MAX_BUFFERED_BYTES_PER_USER",
                (256 * 1024).to_string(),
            ),
            ("MCP__MAX_BODY_BYTES", (64 * 1024).to_string()),
        ],
    )
    .await;
    let tools: Vec<Value> = (0..4000)
        .map(|i| json!({"name": format!("tool-{i}"), "description": "x".repeat(60), "inputSchema": {"type": "object"}}))
        .collect();
    env.gw.set_mcp_tools(Some(tools));
    let version = "2025-11-25";
    let session = env.initialize(version).await;
    // Stored at the gateway without the sidecar (through it, the answer would be refused
    // as over the budget already).
    let h = [
        ("Mcp-Session-Id", session.as_str()),
        ("MCP-Protocol-Version", version),
    ];
    let r = env
        .post_to(
            env.gw.addr(),
            &h,
            r#"{"jsonrpc":"2.0","id":40,"method":"tools/list"}"#,
        )
        .await;
    assert_eq!(r.status, 200);
    assert!(r.body.len() > 256 * 1024, "{}", r.body.len());
    let priming = events_of(&r)[0].field("id").unwrap().to_owned();
    let r = env.resume(&session, version, &priming).await;
    assert_eq!(r.status, 200, "{}", r.all_text());
    assert!(!r.complete, "the stream was not cut");
    assert!(!r.text().contains("tool-3999"), "the event passed");
    let cut = support::eventually(WAIT, || {
        let log = env.sidecar.log();
        log.contains("gateway event stream cut") && log.contains("over_budget")
    })
    .await;
    assert!(cut, "{}", env.sidecar.log());
    let m = env.sidecar.metrics().await;
    assert_eq!(m.get(support::BUFFERED), 0.0);
}
