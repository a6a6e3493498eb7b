//! A mock of the gateway as a passthrough target (wire contract §7), with a minimal
//! `/mcp` stub (wire contract §6).

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE};
use http::{Method, Response, StatusCode};
use serde_json::Value;

use super::body::MockBody;
use super::server::{lock, query_param, respond, Recorded, Server};

/// Most events one `/sse` request may ask for.
pub const MAX_SSE_EVENTS: u64 = 10_000;

/// Largest `/big` body.
pub const MAX_BIG_BYTES: u64 = 256 * 1024 * 1024;

/// Longest gap or delay a request may ask for, in milliseconds.
const MAX_WAIT_MS: u64 = 60_000;

/// Most chunks one `/chunked` request may ask for.
const MAX_CHUNKS: u64 = 1_000;

/// `/big` is sent in pieces of this size.
const BIG_CHUNK: usize = 64 * 1024;

/// Every answer carries this header, so a test can tell the gateway answered.
const MARK: (&str, &str) = ("x-mock-upstream", "gateway");

const SESSION_NOT_FOUND: &str =
    r#"{"jsonrpc":"2.0","error":{"code":-32600,"message":"Session not found"}}"#;

/// The SDK's answer to a call in a session it has not initialized.
const NOT_INITIALIZED: &str = r#"{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: Server not initialized"},"id":null}"#;

/// The SDK's answer to an `initialize` in a session it has initialized.
const ALREADY_INITIALIZED: &str = r#"{"jsonrpc":"2.0","error":{"code":-32600,"message":"Invalid Request: Server already initialized"},"id":null}"#;

const UNAUTHORIZED: &str = r#"{"jsonrpc":"2.0","error":{"code":-32600,"message":"Unauthorized"}}"#;

/// The `/big?bytes=n` body: `abc…xyzabc…`, so a test can check every byte.
pub fn big_body(n: usize) -> Bytes {
    Bytes::from((0..n).map(|i| b'a' + (i % 26) as u8).collect::<Vec<u8>>())
}

/// The gateway's own session rules (`hub/gateway/mcp-proxy.mjs`), for tests of the
/// sidecar's agreement with them.
#[derive(Debug)]
struct GatewayRules {
    /// `MCP_MAX_SESSIONS_PER_USER`.
    cap: usize,
    /// Session id → owner `sub` and last activity (a tick of `clock`).
    owners: HashMap<String, (String, u64)>,
    clock: u64,
}

impl GatewayRules {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The owner's least recently active session goes when the owner is at the cap.
    fn evict_for(&mut self, owner: &str, live: &mut BTreeSet<String>) {
        let owned: Vec<(&String, u64)> = self
            .owners
            .iter()
            .filter(|(_, (o, _))| o == owner)
            .map(|(id, (_, t))| (id, *t))
            .collect();
        if owned.len() < self.cap {
            return;
        }
        if let Some(oldest) = owned
            .iter()
            .min_by_key(|(_, t)| *t)
            .map(|(id, _)| (*id).clone())
        {
            self.owners.remove(&oldest);
            live.remove(&oldest);
        }
    }
}

#[derive(Debug, Default)]
struct McpState {
    sessions: BTreeSet<String>,
    next: u64,
    /// `Some`: sessions follow the gateway's own rules (see
    /// [`MockGateway::set_mcp_gateway_rules`]).
    rules: Option<GatewayRules>,
    /// `tools/list` tools; `None`: one `search` tool.
    tools: Option<Vec<Value>>,
    /// `tools/list` `nextCursor`.
    next_cursor: Option<String>,
    /// Answer requests with `application/json` instead of SSE.
    json_answers: bool,
    /// The section-source surface, for shadow-mode tests; `None`: not special.
    section_source: Option<SectionSourceSurface>,
    /// Keep events as the SDK does when given an event store.
    event_store: bool,
    /// The stored events, oldest first (at most [`MAX_STORED_EVENTS`]).
    events: Vec<StoredEvent>,
    /// Answer streams opened so far, and events stored so far.
    streams: u64,
    stored: u64,
    /// How answer streams are written.
    style: SseStyle,
    /// Scripted answers (see [`MockGateway::set_mcp_answer`]).
    scripted: HashMap<String, Value>,
    /// The answer of the REST note routes (see [`MockGateway::set_note_route_answer`]).
    note_route: Option<(u16, String)>,
}

/// Most events the mock's event store keeps; the oldest go first.
const MAX_STORED_EVENTS: usize = 4096;

/// One event of the mock's event store.
#[derive(Debug, Clone)]
struct StoredEvent {
    stream: u64,
    id: String,
    /// The JSON-RPC message; `None` for a priming event.
    message: Option<String>,
}

/// How the mock writes its MCP answers as event streams, for tests of the sidecar's
/// reading of them. The default is the SDK's own framing.
#[derive(Debug, Clone)]
pub struct SseStyle {
    /// The line end of every line (`"\n"`, `"\r\n"` or `"\r"`).
    pub line_end: &'static str,
    /// A BOM at the start of each stream.
    pub bom: bool,
    /// A comment line before each event.
    pub comments: bool,
    /// Each message's data over two `data:` lines, cut after its first comma (a line
    /// break after a comma is JSON whitespace, so the data a client joins is the same
    /// message).
    pub split_data: bool,
}

impl Default for SseStyle {
    fn default() -> SseStyle {
        SseStyle {
            line_end: "\n",
            bom: false,
            comments: false,
            split_data: false,
        }
    }
}

/// The `retry` a priming event carries.
pub const PRIMING_RETRY_MS: u64 = 1000;

/// How the mock gateway treats the views' surface (REST `GET /api/v1/section-source` and
/// `GET /api/v1/note-outline`, the MCP tools `get_section_source`, `get_note_outline` and
/// `get_document_tree`), for tests of shadow mode and of passed views, where the gateway
/// answers it.
#[derive(Debug, Clone)]
pub enum SectionSourceSurface {
    /// A gateway that serves it, with these answers.
    Serves {
        /// The REST answer's status.
        rest_status: u16,
        /// The REST answer's body (`application/json; charset=utf-8`).
        rest_body: String,
        /// The tool result's text.
        tool_text: String,
        /// The tool result's `isError`.
        tool_is_error: bool,
    },
    /// A gateway without it: Express's 404 page on REST, the SDK's unknown-tool result
    /// (naming the tool called) on MCP.
    Absent,
}

/// A mock gateway. Routes (any method unless noted; `HEAD` gets the same head and no
/// body):
///
/// - `/sse?n=N&gap_ms=M`: `text/event-stream`, chunked, N events (default 3) of the form
///   `id: i` / `event: message` / `data: {"n":i}`, M ms apart (default 0).
/// - `/big?bytes=N`: N bytes of [`big_body`] with a content-length, streamed in 64 KiB
///   pieces (default 1 MiB, at most [`MAX_BIG_BYTES`]).
/// - `/status/{code}`: that status (200–599), empty body.
/// - `/chunked?n=N&gap_ms=M`: `text/plain`, chunked, N pieces `chunk i\n` (default 3),
///   M ms apart (default 0).
/// - `/delay?ms=M`: waits M ms, then echoes.
/// - `/mcp` (any case, optional trailing slash, also under
///   `/.netlify/functions/gateway`): a minimal MCP stub. `POST` `initialize` opens a
///   session and answers 200 SSE with an `mcp-session-id` header; other posts need a
///   live session (else 404 `Session not found`) and get `{}` results (`tools/list`: one
///   `search` tool unless [`MockGateway::set_mcp_tools`] says otherwise, with
///   [`MockGateway::set_mcp_next_cursor`]'s cursor; `tools/call`: a text result;
///   `resources/list` and `resources/templates/list`: one ordinary and one section-source
///   entry each, which the sidecar must remove); notifications get 202. Answers are SSE,
///   or JSON after [`MockGateway::set_mcp_json_answers`], written per
///   [`MockGateway::set_mcp_sse_style`]. With [`MockGateway::set_mcp_event_store`], events
///   are stored and replayed as the SDK does with an event store. `GET` on a live session
///   streams one comment and ends (or replays what follows its `Last-Event-ID`);
///   `DELETE` answers `{"ok":true}`. With
///   [`MockGateway::set_mcp_gateway_rules`], sessions follow the gateway's own rules
///   (owners, per-user cap, unknown ids taken for new uninitialized sessions).
/// - anything else: 200 JSON echo `{"method","uri","version","headers":[[name,value]…],
///   "body","body_len"}` with the request-target as received.
///
/// Malformed query values get 400. Every answer carries `x-mock-upstream: gateway`.
#[derive(Debug)]
pub struct MockGateway {
    server: Server,
    mcp: Arc<Mutex<McpState>>,
}

impl MockGateway {
    /// Starts a gateway on `127.0.0.1:0`.
    ///
    /// # Panics
    /// If no loopback port can be bound; use [`MockGateway::try_start`] to handle that.
    pub async fn start() -> MockGateway {
        match MockGateway::try_start().await {
            Ok(g) => g,
            Err(e) => panic!("mock gateway: cannot bind 127.0.0.1:0: {e}"),
        }
    }

    /// Starts a gateway on `127.0.0.1:0`.
    pub async fn try_start() -> io::Result<MockGateway> {
        let mcp = Arc::new(Mutex::new(McpState::default()));
        let shared = Arc::clone(&mcp);
        let server = Server::start(Arc::new(move |rec| {
            let mcp = Arc::clone(&shared);
            Box::pin(async move { handle(&mcp, rec).await })
        }))
        .await?;
        Ok(MockGateway { server, mcp })
    }

    /// Sets the `tools/list` answer's tools (`None`: the default `search` tool).
    pub fn set_mcp_tools(&self, tools: Option<Vec<Value>>) {
        lock(&self.mcp).tools = tools;
    }

    /// Sets the `tools/list` answer's `nextCursor` (a page that is not the last).
    pub fn set_mcp_next_cursor(&self, cursor: Option<&str>) {
        lock(&self.mcp).next_cursor = cursor.map(str::to_owned);
    }

    /// Answers MCP requests with `application/json` instead of SSE.
    pub fn set_mcp_json_answers(&self, json: bool) {
        lock(&self.mcp).json_answers = json;
    }

    /// Keeps events as the SDK does when given an event store: each message event of
    /// an answer stream gets an `id: <stream>_<n>`; a stream answering a request of
    /// protocol version `2025-11-25` or later (the `initialize` request's own version,
    /// else the `MCP-Protocol-Version` header, else `2025-03-26`) starts with a priming
    /// event, `id`, `retry: 1000` and empty data; a `GET` on a live session with the
    /// `Last-Event-ID` of a stored event replays the messages of its stream after it, each
    /// with its id, then ends.
    pub fn set_mcp_event_store(&self, on: bool) {
        let mut state = lock(&self.mcp);
        state.event_store = on;
        state.events.clear();
    }

    /// Sets how answer streams are written.
    pub fn set_mcp_sse_style(&self, style: SseStyle) {
        lock(&self.mcp).style = style;
    }

    /// The ids of the stored events, oldest first, with whether each is a priming event.
    pub fn stored_events(&self) -> Vec<(String, bool)> {
        lock(&self.mcp)
            .events
            .iter()
            .map(|e| (e.id.clone(), e.message.is_none()))
            .collect()
    }

    /// Answers `key` with `answer` from now on: `key` is `tools/call:<name>` or another
    /// method (`prompts/get`, `resources/read`); `answer` is `{"result": …}` or
    /// `{"error": …}`, sent in the SDK's key order with the request's id. The real
    /// gateway's own formats go here: `Upstream <status>: <body>` errors, note paths.
    pub fn set_mcp_answer(&self, key: &str, answer: Value) {
        lock(&self.mcp).scripted.insert(key.to_owned(), answer);
    }

    /// Answers every request on `/api/v1/notes` and below with `status` and `body`
    /// (`text/html`), as the gateway passes a canister error through; `None`: echo.
    pub fn set_note_route_answer(&self, answer: Option<(u16, &str)>) {
        lock(&self.mcp).note_route = answer.map(|(s, b)| (s, b.to_owned()));
    }

    /// Sets how the section-source surface is answered (`None`: like any other request).
    pub fn set_section_source(&self, surface: Option<SectionSourceSurface>) {
        lock(&self.mcp).section_source = surface;
    }

    /// The live MCP session ids, sorted.
    pub fn sessions(&self) -> Vec<String> {
        lock(&self.mcp).sessions.iter().cloned().collect()
    }

    /// With `Some(cap)`, `/mcp` keeps sessions as the gateway does: each owned by the
    /// `sub` of the bearer token that opened it (read, not verified; none → 401), a
    /// user holding at most `cap`, and a `POST` on an id that is not a live session of
    /// its caller (absent, unknown, another user's) taken for a new session: the
    /// caller's least recently active session is evicted when at the cap, then an
    /// `initialize` opens the session and any other call gets the SDK's 400 `Server not
    /// initialized`. A `POST` or `GET` on a live own session marks it active; `GET` on
    /// any other is 404 `Session not found`; `DELETE` ends only the caller's own.
    /// `None`: the plain stub (live sessions of anyone; 404 for the rest).
    pub fn set_mcp_gateway_rules(&self, cap: Option<usize>) {
        let mut state = lock(&self.mcp);
        state.sessions.clear();
        state.rules = cap.map(|cap| GatewayRules {
            cap: cap.max(1),
            owners: HashMap::new(),
            clock: 0,
        });
    }

    /// Forgets every MCP session, as a gateway restart does.
    pub fn restart_mcp(&self) {
        let mut state = lock(&self.mcp);
        state.sessions.clear();
        if let Some(rules) = &mut state.rules {
            rules.owners.clear();
        }
    }

    /// Ends one MCP session at the gateway alone (the sidecar is not told).
    pub fn drop_mcp_session(&self, id: &str) {
        let mut state = lock(&self.mcp);
        state.sessions.remove(id);
        if let Some(rules) = &mut state.rules {
            rules.owners.remove(id);
        }
    }
}

async fn handle(mcp: &Mutex<McpState>, rec: Recorded) -> Response<MockBody> {
    if is_mcp_path(rec.path()) {
        return handle_mcp(mcp, &rec);
    }
    let note_route = lock(mcp).note_route.clone();
    if let Some((status, body)) = note_route {
        if rec.path().to_ascii_lowercase().starts_with("/api/v1/notes") {
            return respond(
                StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                &[MARK, (CONTENT_TYPE.as_str(), "text/html; charset=utf-8")],
                MockBody::full(body),
            );
        }
    }
    let surface = lock(mcp).section_source.clone();
    if let (Some(surface), true) = (surface, is_section_source(&rec)) {
        return match surface {
            SectionSourceSurface::Serves {
                rest_status,
                rest_body,
                ..
            } => respond(
                StatusCode::from_u16(rest_status).unwrap_or(StatusCode::OK),
                &[
                    MARK,
                    (CONTENT_TYPE.as_str(), "application/json; charset=utf-8"),
                ],
                MockBody::full(rest_body),
            ),
            SectionSourceSurface::Absent => respond(
                StatusCode::NOT_FOUND,
                &[MARK, (CONTENT_TYPE.as_str(), "text/html; charset=utf-8")],
                MockBody::full(format!("<pre>Cannot GET {}</pre>", rec.path())),
            ),
        };
    }
    let path = rec.path().to_owned();
    let query = rec.query();
    match path.as_str() {
        "/sse" => {
            match (
                param(query, "n", 3, MAX_SSE_EVENTS),
                param(query, "gap_ms", 0, MAX_WAIT_MS),
            ) {
                (Some(n), Some(gap)) => sse(n, Duration::from_millis(gap)),
                _ => bad_request(),
            }
        }
        "/big" => match param(query, "bytes", 1024 * 1024, MAX_BIG_BYTES) {
            Some(n) => big(n),
            None => bad_request(),
        },
        "/chunked" => match (
            param(query, "n", 3, MAX_CHUNKS),
            param(query, "gap_ms", 0, MAX_WAIT_MS),
        ) {
            (Some(n), Some(gap)) => chunked(n, Duration::from_millis(gap)),
            _ => bad_request(),
        },
        "/delay" => match param(query, "ms", 0, MAX_WAIT_MS) {
            Some(ms) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                echo(&rec)
            }
            None => bad_request(),
        },
        p => match p.strip_prefix("/status/") {
            Some(code) => match code.parse::<u16>() {
                Ok(code @ 200..=599) => match StatusCode::from_u16(code) {
                    Ok(status) => respond(status, &[MARK], MockBody::empty()),
                    Err(_) => bad_request(),
                },
                _ => bad_request(),
            },
            None => echo(&rec),
        },
    }
}

/// The protocol versions the gateway's MCP SDK (TypeScript 1.27.1) negotiates, latest
/// first. The mock keeps its own list, as the real gateway does: the sidecar's is checked
/// against it in the tests, not derived from it.
pub const SDK_PROTOCOL_VERSIONS: [&str; 5] = [
    "2025-11-25",
    "2025-06-18",
    "2025-03-26",
    "2024-11-05",
    "2024-10-07",
];

/// The hosted MCP tools of the body-free views, which a gateway may serve or lack.
const VIEW_TOOLS: [&str; 3] = [
    "get_section_source",
    "get_note_outline",
    "get_document_tree",
];

/// A numeric query parameter: `default` when absent, `None` when malformed or over `max`.
fn param(query: Option<&str>, key: &str, default: u64, max: u64) -> Option<u64> {
    match query_param(query, key) {
        None => Some(default),
        Some(v) => v.parse::<u64>().ok().filter(|n| *n <= max),
    }
}

fn bad_request() -> Response<MockBody> {
    respond(
        StatusCode::BAD_REQUEST,
        &[MARK, (CONTENT_TYPE.as_str(), "text/plain")],
        MockBody::full("bad query"),
    )
}

fn echo(rec: &Recorded) -> Response<MockBody> {
    let headers: Vec<Value> = rec
        .headers
        .iter()
        .map(|(name, value)| {
            Value::from(vec![
                name.as_str().to_owned(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            ])
        })
        .collect();
    let doc = serde_json::json!({
        "method": rec.method.as_str(),
        "uri": rec.uri.to_string(),
        "version": format!("{:?}", rec.version),
        "headers": headers,
        "body": rec.body_text(),
        "body_len": rec.body.len(),
    });
    respond(
        StatusCode::OK,
        &[MARK, (CONTENT_TYPE.as_str(), "application/json")],
        MockBody::full(doc.to_string()),
    )
}

fn sse(n: u64, gap: Duration) -> Response<MockBody> {
    let (tx, body) = MockBody::channel(None);
    tokio::spawn(async move {
        for i in 0..n {
            let event = format!("id: {i}\nevent: message\ndata: {{\"n\":{i}}}\n\n");
            // The client left (or it was a HEAD): stop producing.
            if tx.send(Bytes::from(event)).await.is_err() {
                return;
            }
            if i + 1 < n && !gap.is_zero() {
                tokio::time::sleep(gap).await;
            }
        }
    });
    respond(
        StatusCode::OK,
        &[
            MARK,
            (CONTENT_TYPE.as_str(), "text/event-stream"),
            (CACHE_CONTROL.as_str(), "no-cache"),
        ],
        body,
    )
}

fn big(n: u64) -> Response<MockBody> {
    let (tx, body) = MockBody::channel(Some(n));
    tokio::spawn(async move {
        // One pattern block, sliced at the right phase for each piece.
        let block = big_body(BIG_CHUNK + 26);
        let mut sent: u64 = 0;
        while sent < n {
            let len = (n - sent).min(BIG_CHUNK as u64) as usize;
            let phase = (sent % 26) as usize;
            if tx.send(block.slice(phase..phase + len)).await.is_err() {
                return;
            }
            sent += len as u64;
        }
    });
    let len = n.to_string();
    respond(
        StatusCode::OK,
        &[
            MARK,
            (CONTENT_TYPE.as_str(), "application/octet-stream"),
            (CONTENT_LENGTH.as_str(), len.as_str()),
        ],
        body,
    )
}

fn chunked(n: u64, gap: Duration) -> Response<MockBody> {
    let (tx, body) = MockBody::channel(None);
    tokio::spawn(async move {
        for i in 0..n {
            if tx.send(Bytes::from(format!("chunk {i}\n"))).await.is_err() {
                return;
            }
            if i + 1 < n && !gap.is_zero() {
                tokio::time::sleep(gap).await;
            }
        }
    });
    respond(
        StatusCode::OK,
        &[MARK, (CONTENT_TYPE.as_str(), "text/plain")],
        body,
    )
}

/// `/mcp` as the gateway mounts it: any case, one optional trailing slash, with or
/// without the functions prefix (wire contract §6).
/// `GET` or `HEAD` of a view's REST route (any case, one trailing slash).
fn is_section_source(rec: &Recorded) -> bool {
    let lower = rec.path().to_ascii_lowercase();
    let lower = lower.strip_suffix('/').unwrap_or(&lower);
    (rec.method == http::Method::GET || rec.method == http::Method::HEAD)
        && (lower == "/api/v1/section-source" || lower == "/api/v1/note-outline")
}

fn is_mcp_path(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    let rest = lower
        .strip_prefix("/.netlify/functions/gateway")
        .unwrap_or(&lower);
    rest == "/mcp" || rest == "/mcp/"
}

fn json_error(status: StatusCode, body: &'static str) -> Response<MockBody> {
    respond(
        status,
        &[
            MARK,
            (CONTENT_TYPE.as_str(), "application/json; charset=utf-8"),
        ],
        MockBody::full(body),
    )
}

fn session_of(rec: &Recorded) -> Option<String> {
    rec.header("mcp-session-id").map(str::to_owned)
}

/// The `sub` of the request's bearer token, read without verifying it.
fn caller_of(rec: &Recorded) -> Option<String> {
    let token = rec.header("authorization")?.strip_prefix("Bearer ")?;
    let data = jsonwebtoken::dangerous::insecure_decode::<Value>(token).ok()?;
    data.claims.get("sub")?.as_str().map(str::to_owned)
}

/// Under the gateway's rules: the caller's live session the request names, marked
/// active (`Ok(None)`: none), or the gateway's 401.
fn own_session(mcp: &Mutex<McpState>, rec: &Recorded) -> Result<Option<String>, String> {
    let caller = caller_of(rec).ok_or_else(String::new)?;
    let mut state = lock(mcp);
    let Some(rules) = state.rules.as_mut() else {
        return Ok(None);
    };
    let now = rules.tick();
    let id = session_of(rec);
    match id.as_ref().and_then(|id| rules.owners.get_mut(id)) {
        Some((owner, at)) if *owner == caller => {
            *at = now;
            Ok(id)
        }
        _ => Err(caller),
    }
}

fn handle_mcp(mcp: &Mutex<McpState>, rec: &Recorded) -> Response<MockBody> {
    let gateway_rules = lock(mcp).rules.is_some();
    if gateway_rules && caller_of(rec).is_none() {
        return json_error(StatusCode::UNAUTHORIZED, UNAUTHORIZED);
    }
    match rec.method {
        Method::POST => mcp_post(mcp, rec),
        Method::GET => {
            let live = if gateway_rules {
                matches!(own_session(mcp, rec), Ok(Some(_)))
            } else {
                session_of(rec).is_some_and(|s| lock(mcp).sessions.contains(&s))
            };
            if !live {
                return json_error(StatusCode::NOT_FOUND, SESSION_NOT_FOUND);
            }
            if let Some(replay) = replay(mcp, rec.header("last-event-id")) {
                return sse_response(None, replay);
            }
            sse_response(None, ": mock stream\n\n".to_owned())
        }
        Method::DELETE => {
            if let Some(s) = session_of(rec) {
                let caller = caller_of(rec);
                let mut state = lock(mcp);
                let mine = match &state.rules {
                    Some(rules) => rules.owners.get(&s).map(|(o, _)| o) == caller.as_ref(),
                    None => true,
                };
                if mine {
                    state.sessions.remove(&s);
                    if let Some(rules) = &mut state.rules {
                        rules.owners.remove(&s);
                    }
                }
            }
            json_error(StatusCode::OK, r#"{"ok":true}"#)
        }
        _ => json_error(
            StatusCode::METHOD_NOT_ALLOWED,
            r#"{"jsonrpc":"2.0","error":{"code":-32000,"message":"Method not allowed."},"id":null}"#,
        ),
    }
}

fn mcp_post(mcp: &Mutex<McpState>, rec: &Recorded) -> Response<MockBody> {
    let Ok(parsed) = serde_json::from_slice::<Value>(&rec.body) else {
        return json_error(
            StatusCode::BAD_REQUEST,
            r#"{"jsonrpc":"2.0","error":{"code":-32700,"message":"Parse error: Invalid JSON"},"id":null}"#,
        );
    };
    let messages = match parsed {
        Value::Array(items) => items,
        single => vec![single],
    };
    let method_of = |m: &Value| m.get("method").and_then(Value::as_str).map(str::to_owned);
    let initialize = messages
        .iter()
        .any(|m| method_of(m).as_deref() == Some("initialize"));
    let session = if lock(mcp).rules.is_some() {
        match own_session(mcp, rec) {
            Ok(Some(_)) if initialize => {
                return respond(
                    StatusCode::BAD_REQUEST,
                    &[MARK, (CONTENT_TYPE.as_str(), "application/json")],
                    MockBody::full(ALREADY_INITIALIZED),
                );
            }
            Ok(Some(id)) => id,
            Ok(None) => return json_error(StatusCode::UNAUTHORIZED, UNAUTHORIZED),
            Err(caller) => {
                // The gateway takes the id for a new session: room first, then the SDK.
                let mut guard = lock(mcp);
                let state = &mut *guard;
                let Some(rules) = state.rules.as_mut() else {
                    return json_error(StatusCode::UNAUTHORIZED, UNAUTHORIZED);
                };
                rules.evict_for(&caller, &mut state.sessions);
                if !initialize {
                    return respond(
                        StatusCode::BAD_REQUEST,
                        &[MARK, (CONTENT_TYPE.as_str(), "application/json")],
                        MockBody::full(NOT_INITIALIZED),
                    );
                }
                state.next += 1;
                let id = format!("mock-session-{}", state.next);
                let now = rules.tick();
                rules.owners.insert(id.clone(), (caller, now));
                state.sessions.insert(id.clone());
                id
            }
        }
    } else {
        let mut state = lock(mcp);
        if initialize {
            state.next += 1;
            let id = format!("mock-session-{}", state.next);
            state.sessions.insert(id.clone());
            id
        } else {
            match session_of(rec).filter(|s| state.sessions.contains(s)) {
                Some(s) => s,
                None => return json_error(StatusCode::NOT_FOUND, SESSION_NOT_FOUND),
            }
        }
    };
    let (tools, next_cursor, json_answers, section_source, scripted) = {
        let state = lock(mcp);
        (
            state.tools.clone(),
            state.next_cursor.clone(),
            state.json_answers,
            state.section_source.clone(),
            state.scripted.clone(),
        )
    };
    let mut answers: Vec<String> = Vec::new();
    for m in &messages {
        let (Some(method), Some(id)) = (method_of(m), m.get("id")) else {
            continue; // notifications and responses get no answer
        };
        let key = match m.pointer("/params/name").and_then(Value::as_str) {
            Some(name) if method == "tools/call" => format!("tools/call:{name}"),
            _ => method.clone(),
        };
        if let Some(answer) = scripted.get(&key) {
            // The SDK's key orders: result, jsonrpc, id; or jsonrpc, id, error.
            answers.push(match (answer.get("result"), answer.get("error")) {
                (Some(result), _) => {
                    format!("{{\"result\":{result},\"jsonrpc\":\"2.0\",\"id\":{id}}}")
                }
                (None, Some(error)) => {
                    format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"error\":{error}}}")
                }
                (None, None) => format!("{{\"result\":{{}},\"jsonrpc\":\"2.0\",\"id\":{id}}}"),
            });
            continue;
        }
        let result = match method.as_str() {
            "initialize" => serde_json::json!({
                // The SDK's negotiation: a version it supports is echoed, any other
                // request gets its latest.
                "protocolVersion": m
                    .pointer("/params/protocolVersion")
                    .and_then(Value::as_str)
                    .filter(|v| SDK_PROTOCOL_VERSIONS.contains(v))
                    .unwrap_or(SDK_PROTOCOL_VERSIONS[0]),
                "capabilities": {"tools": {"listChanged": true}},
                "serverInfo": {"name": "mock-gateway", "version": "0.0.0"},
            }),
            "tools/list" => {
                let tools = tools.clone().unwrap_or_else(|| {
                    vec![serde_json::json!({
                        "name": "search",
                        "description": "Search notes (mock).",
                        "inputSchema": {
                            "type": "object",
                            "properties": {"query": {"type": "string"}},
                            "required": ["query"],
                        },
                    })]
                });
                let mut result = serde_json::json!({ "tools": tools });
                if let Some(c) = &next_cursor {
                    result["nextCursor"] = Value::from(c.clone());
                }
                result
            }
            "tools/call" => match (
                m.pointer("/params/name")
                    .and_then(Value::as_str)
                    .filter(|name| VIEW_TOOLS.contains(name)),
                &section_source,
            ) {
                (
                    Some(_),
                    Some(SectionSourceSurface::Serves {
                        tool_text,
                        tool_is_error,
                        ..
                    }),
                ) => {
                    let mut result = serde_json::json!({
                        "content": [{"type": "text", "text": tool_text}],
                    });
                    if *tool_is_error {
                        result["isError"] = Value::Bool(true);
                    }
                    result
                }
                (Some(view), Some(SectionSourceSurface::Absent)) => {
                    let text = format!("MCP error -32602: Tool {view} not found");
                    serde_json::json!({
                        "content": [{"type": "text", "text": text}],
                        "isError": true,
                    })
                }
                _ => serde_json::json!({
                    "content": [{"type": "text", "text": "answered by the mock gateway"}],
                }),
            },
            "resources/list" => serde_json::json!({"resources": [
                {"uri": "knowtation://notes/a.md", "name": "a"},
                {"uri": "knowtation://section-source/a.md", "name": "a (sections)"},
            ]}),
            "resources/templates/list" => serde_json::json!({"resourceTemplates": [
                {"uriTemplate": "knowtation://notes/{path}", "name": "note"},
                {"uriTemplate": "knowtation://section_source/{path}", "name": "sections"},
            ]}),
            _ => serde_json::json!({}),
        };
        // The SDK's key order: result, jsonrpc, id (wire contract §6).
        answers.push(format!(
            "{{\"result\":{result},\"jsonrpc\":\"2.0\",\"id\":{id}}}"
        ));
    }
    if answers.is_empty() {
        return respond(StatusCode::ACCEPTED, &[MARK], MockBody::empty());
    }
    if json_answers {
        let body = if answers.len() == 1 {
            answers.remove(0)
        } else {
            format!("[{}]", answers.join(","))
        };
        return respond(
            StatusCode::OK,
            &[
                MARK,
                (CONTENT_TYPE.as_str(), "application/json"),
                ("mcp-session-id", session.as_str()),
            ],
            MockBody::full(body),
        );
    }
    // The SDK's choice of the version that decides the priming event.
    let version = messages
        .iter()
        .find(|m| method_of(m).as_deref() == Some("initialize"))
        .and_then(|m| m.pointer("/params/protocolVersion"))
        .and_then(Value::as_str)
        .or_else(|| rec.header("mcp-protocol-version"))
        .unwrap_or("2025-03-26")
        .to_owned();
    let events = answer_stream(mcp, &version, &answers);
    sse_response(Some(&session), events)
}

/// An answer stream of `answers`, stored and primed when the event store is on.
fn answer_stream(mcp: &Mutex<McpState>, version: &str, answers: &[String]) -> String {
    let mut state = lock(mcp);
    let state = &mut *state;
    let style = state.style.clone();
    let mut out = String::new();
    if style.bom {
        out.push('\u{feff}');
    }
    let stream = if state.event_store {
        state.streams += 1;
        Some(state.streams)
    } else {
        None
    };
    let store = |state: &mut McpState, message: Option<&str>| -> Option<String> {
        let stream = stream?;
        state.stored += 1;
        let id = format!("{stream}_{}", state.stored);
        if state.events.len() >= MAX_STORED_EVENTS {
            state.events.remove(0);
        }
        state.events.push(StoredEvent {
            stream,
            id: id.clone(),
            message: message.map(str::to_owned),
        });
        Some(id)
    };
    if stream.is_some() && version >= "2025-11-25" {
        if let Some(id) = store(state, None) {
            out.push_str(&write_event(
                &style,
                None,
                Some(&id),
                Some(PRIMING_RETRY_MS),
                "",
            ));
        }
    }
    for a in answers {
        let id = store(state, Some(a));
        out.push_str(&write_event(
            &style,
            Some("message"),
            id.as_deref(),
            None,
            a,
        ));
    }
    out
}

/// One event, fields in the SDK's order, written per `style`.
fn write_event(
    style: &SseStyle,
    kind: Option<&str>,
    id: Option<&str>,
    retry: Option<u64>,
    data: &str,
) -> String {
    let le = style.line_end;
    let mut out = String::new();
    if style.comments {
        out.push_str(&format!(": mock comment{le}"));
    }
    if let Some(kind) = kind {
        out.push_str(&format!("event: {kind}{le}"));
    }
    if let Some(id) = id {
        out.push_str(&format!("id: {id}{le}"));
    }
    if let Some(retry) = retry {
        out.push_str(&format!("retry: {retry}{le}"));
    }
    match data.find(',').filter(|_| style.split_data) {
        Some(at) => {
            out.push_str(&format!("data: {}{le}", &data[..=at]));
            out.push_str(&format!("data: {}{le}", &data[at + 1..]));
        }
        None => out.push_str(&format!("data: {data}{le}")),
    }
    out.push_str(le);
    out
}

/// The replay for a `GET` with `Last-Event-ID` (`last`) of a stored event: the messages
/// of its stream after it. `None` when the event store is off or the id unknown.
fn replay(mcp: &Mutex<McpState>, last: Option<&str>) -> Option<String> {
    let last = last?;
    let state = lock(mcp);
    if !state.event_store {
        return None;
    }
    let at = state.events.iter().position(|e| e.id == last)?;
    let stream = state.events[at].stream;
    let style = state.style.clone();
    let mut out = String::new();
    if style.bom {
        out.push('\u{feff}');
    }
    for e in state.events[at + 1..].iter().filter(|e| e.stream == stream) {
        if let Some(m) = &e.message {
            out.push_str(&write_event(&style, Some("message"), Some(&e.id), None, m));
        }
    }
    Some(out)
}

fn sse_response(session: Option<&str>, events: String) -> Response<MockBody> {
    let mut headers = vec![
        MARK,
        (CONTENT_TYPE.as_str(), "text/event-stream"),
        (CACHE_CONTROL.as_str(), "no-cache"),
        ("connection", "keep-alive"),
    ];
    if let Some(s) = session {
        headers.push(("mcp-session-id", s));
    }
    // The SDK writes SSE as it goes, so the answer is chunked, not length-delimited.
    let (tx, body) = MockBody::channel(None);
    tokio::spawn(async move {
        let _ = tx.send(Bytes::from(events)).await;
    });
    respond(StatusCode::OK, &headers, body)
}

journal_accessors!(MockGateway);
