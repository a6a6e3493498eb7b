//! The REST handler (wire contract §1–§5): `RestService::handle` called directly with
//! built request parts, against small canister and bridge servers started here on
//! loopback. Every `rest` and `rest_error` vector of the shared conformance file runs,
//! then each row of the §5 table, headers, CORS, HEAD/OPTIONS, hosted-context failures
//! and caching, rate limiting, and the promise that nothing from a note, a canister
//! error or an unsafe request ever comes back.
//!
//! No router, proxy or gateway is involved here, so nothing in this file shows that a
//! request never reaches the gateway: that is `tests/never_forwarded.rs` (every method
//! and spelling, through the binary) and `tests/door.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use jsonwebtoken::{EncodingKey, Header};
use knowtation_sidecar::budget::{self, Budget};
use knowtation_sidecar::config::{Config, OnFailure, Secret};
use knowtation_sidecar::extract::View;
use knowtation_sidecar::mcp::{Policy, ViewMode};
use knowtation_sidecar::rest::RestService;
use knowtation_sidecar::route;
use knowtation_sidecar::telemetry::{HostedContextEvent, Intercepted, Metrics, Outcome};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

// ---------------------------------------------------------------------------------------
// Mock upstreams.

/// One canned answer.
#[derive(Clone)]
struct Reply {
    status: u16,
    body: Vec<u8>,
    delay: Duration,
    headers: Vec<(&'static str, String)>,
}

impl Reply {
    fn json(status: u16, v: Value) -> Reply {
        Reply::raw(status, v.to_string().into_bytes())
    }

    fn raw(status: u16, body: impl Into<Vec<u8>>) -> Reply {
        Reply {
            status,
            body: body.into(),
            delay: Duration::ZERO,
            headers: Vec::new(),
        }
    }

    fn delayed(mut self, d: Duration) -> Reply {
        self.delay = d;
        self
    }

    fn header(mut self, name: &'static str, value: &str) -> Reply {
        self.headers.push((name, value.to_owned()));
        self
    }
}

/// What a mock saw.
#[derive(Clone, Debug)]
struct Recorded {
    method: Method,
    uri: String,
    headers: HeaderMap,
}

#[derive(Default)]
struct MockState {
    requests: Mutex<Vec<Recorded>>,
    replies: Mutex<HashMap<String, Reply>>,
    fallback: Mutex<Option<Reply>>,
}

/// A real HTTP/1 server on 127.0.0.1 answering canned replies by path and query.
struct Mock {
    addr: SocketAddr,
    state: Arc<MockState>,
    task: JoinHandle<()>,
}

impl Drop for Mock {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Mock {
    async fn start(fallback: Reply) -> Mock {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(MockState::default());
        *state.fallback.lock().unwrap() = Some(fallback);
        let st = Arc::clone(&state);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let st = Arc::clone(&st);
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                        let st = Arc::clone(&st);
                        async move {
                            let uri = req
                                .uri()
                                .path_and_query()
                                .map(|p| p.as_str().to_owned())
                                .unwrap_or_default();
                            st.requests.lock().unwrap().push(Recorded {
                                method: req.method().clone(),
                                uri: uri.clone(),
                                headers: req.headers().clone(),
                            });
                            let reply = st
                                .replies
                                .lock()
                                .unwrap()
                                .get(&uri)
                                .cloned()
                                .or_else(|| st.fallback.lock().unwrap().clone())
                                .unwrap_or_else(|| Reply::raw(404, ""));
                            if !reply.delay.is_zero() {
                                tokio::time::sleep(reply.delay).await;
                            }
                            let mut resp = Response::new(Full::new(Bytes::from(reply.body)));
                            *resp.status_mut() = StatusCode::from_u16(reply.status).unwrap();
                            for (k, v) in reply.headers {
                                resp.headers_mut().insert(k, v.parse().unwrap());
                            }
                            Ok::<_, Infallible>(resp)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Mock { addr, state, task }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn set(&self, path_and_query: &str, reply: Reply) {
        self.state
            .replies
            .lock()
            .unwrap()
            .insert(path_and_query.to_owned(), reply);
    }

    fn set_default(&self, reply: Reply) {
        *self.state.fallback.lock().unwrap() = Some(reply);
    }

    fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().unwrap().clone()
    }

    fn count(&self) -> usize {
        self.state.requests.lock().unwrap().len()
    }
}

/// A raw TCP server that sends `head` and then holds the connection open, sending
/// `chunk` repeatedly when given (an endless body) or nothing (a stalled body).
async fn raw_server(head: &'static str, chunk: Option<Vec<u8>>) -> (String, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let chunk = chunk.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf).await;
                if stream.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                match chunk {
                    Some(c) => {
                        let framed = [
                            format!("{:x}\r\n", c.len()).into_bytes(),
                            c,
                            b"\r\n".to_vec(),
                        ]
                        .concat();
                        while stream.write_all(&framed).await.is_ok() {}
                    }
                    None => tokio::time::sleep(Duration::from_secs(30)).await,
                }
            });
        }
    });
    (url, task)
}

/// A URL nothing listens on.
async fn dead_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    url
}

// ---------------------------------------------------------------------------------------
// Configuration, tokens and calls.

/// The secrets of the conformance vectors.
const SESSION_SECRET: &str = "gateway-section-source-rest-test-secret-32";
const GATEWAY_SECRET: &str = "gateway-section-source-rest-gw-secret";

fn config(canister: Option<&str>, bridge: Option<&str>) -> Config {
    let mut c = Config::default();
    c.upstream.gateway_url = "http://127.0.0.1:9".to_owned();
    c.upstream.canister_url = canister.map(str::to_owned);
    c.upstream.bridge_url = bridge.map(str::to_owned);
    c.upstream.gateway_secret = Some(Secret::new(GATEWAY_SECRET));
    c.upstream.canister_timeout_ms = 1_000;
    c.upstream.connect_timeout_ms = 500;
    c.auth.jwt_secrets = vec![Secret::new(SESSION_SECRET)];
    c.hosted_context.timeout_ms = 300;
    c.rate_limit.per_user_per_minute = 100_000;
    c.rate_limit.burst = 10_000;
    c
}

fn service(c: &Config) -> RestService {
    RestService::new(c, Arc::new(Metrics::new()), Policy::default()).unwrap()
}

/// The view of the route a request target names, as the proxy's classifier picks it.
fn view_of(uri: &http::Uri) -> View {
    match route::classify(uri) {
        route::Route::NoteOutline => View::NoteOutline,
        _ => View::SectionSource,
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn sign(claims: Value) -> String {
    jsonwebtoken::encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(SESSION_SECRET.as_bytes()),
    )
    .unwrap()
}

/// The vectors' token: `{sub:'google:actor', role:'viewer'}`, no `exp`.
fn vector_token() -> String {
    format!(
        "Bearer {}",
        sign(json!({"sub": "google:actor", "role": "viewer"}))
    )
}

/// A one-hour session token for `sub`.
fn token(sub: &str) -> String {
    format!("Bearer {}", sign(json!({"sub": sub, "exp": now() + 3600})))
}

struct Answer {
    status: u16,
    headers: HeaderMap,
    body: String,
    intercepted: Intercepted,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap()
    }

    /// Everything the caller can see, for leak checks.
    fn serialized(&self) -> String {
        let mut s = self.body.clone();
        for (k, v) in &self.headers {
            s.push_str(k.as_str());
            s.push_str(&String::from_utf8_lossy(v.as_bytes()));
        }
        s
    }

    fn assert_error(&self, status: u16, error: &str, code: &str) {
        assert_eq!(self.status, status, "{}", self.body);
        assert_eq!(
            self.body,
            format!(r#"{{"error":"{error}","code":"{code}"}}"#)
        );
    }
}

/// A roomy budget for handler-level calls (the proxy owns the real one).
fn budget() -> Budget {
    Budget::new(
        budget::Limits {
            max_in_flight: 1024,
            max_in_flight_per_user: 1024,
            max_bytes: 1 << 20,
            max_bytes_per_user: 1 << 20,
        },
        None,
    )
}

async fn call(svc: &RestService, method: Method, url: &str, headers: &[(&str, &str)]) -> Answer {
    let mut b = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let (parts, ()) = b.body(()).unwrap().into_parts();
    let (response, intercepted) = svc.handle(&parts, &budget(), view_of(&parts.uri)).await;
    let (rparts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Answer {
        status: rparts.status.as_u16(),
        headers: rparts.headers,
        body: String::from_utf8(body.to_vec()).unwrap(),
        intercepted,
    }
}

async fn get(svc: &RestService, url: &str, headers: &[(&str, &str)]) -> Answer {
    call(svc, Method::GET, url, headers).await
}

/// A canister note as the canister serves it.
fn note(frontmatter: Value, body: &str) -> Reply {
    Reply::json(
        200,
        json!({"path": "/Users/private/upstream.md", "frontmatter": frontmatter.to_string(), "body": body}),
    )
}

/// The §5 headers every GET/HEAD answer carries (CORS with no origins configured).
fn assert_common_headers(a: &Answer) {
    assert_eq!(a.headers["content-type"], "application/json; charset=utf-8");
    assert_eq!(
        a.headers["cache-control"],
        "private, no-store, must-revalidate"
    );
    assert_eq!(a.headers["access-control-allow-origin"], "*");
    assert_eq!(
        a.headers["access-control-allow-methods"],
        "GET, POST, PUT, PATCH, DELETE, OPTIONS"
    );
    assert_eq!(
        a.headers["access-control-allow-headers"],
        "Authorization, Content-Type, X-Vault-Id, X-User-Id"
    );
    assert!(a.headers.get("access-control-allow-credentials").is_none());
    assert!(a.headers.get("vary").is_none());
    assert!(a.headers.get("etag").is_none());
    assert_eq!(
        a.headers["content-length"],
        a.body.len().to_string().as_str()
    );
}

// ---------------------------------------------------------------------------------------
// The shared conformance vectors.

mod common;

fn rest_vectors() -> Vec<Value> {
    common::reference_vectors()
        .into_iter()
        .filter(|v| matches!(v["kind"].as_str(), Some("rest" | "rest_error")))
        .collect()
}

fn vector(name: &str) -> Value {
    rest_vectors()
        .into_iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("vector {name}"))
}

/// Request headers of a vector, with the `<jwt>` placeholder filled in.
fn vector_headers(v: &Value) -> Vec<(String, String)> {
    v["request"]["headers"]
        .as_object()
        .map(|h| {
            h.iter()
                .map(|(k, val)| {
                    let val = val
                        .as_str()
                        .unwrap()
                        .replace("Bearer <jwt>", &vector_token());
                    (k.clone(), val)
                })
                .collect()
        })
        .unwrap_or_default()
}

async fn vector_call(svc: &RestService, url: &str, headers: &[(String, String)]) -> Answer {
    let h: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    get(svc, url, &h).await
}

fn assert_excludes(a: &Answer, excludes: &Value) {
    let seen = a.serialized();
    for x in excludes.as_array().into_iter().flatten() {
        let x = x.as_str().unwrap();
        assert!(!seen.contains(x), "response contains {x:?}");
    }
}

/// Every vector is handled by a test below; a new one fails here until it is.
#[test]
fn s5_every_rest_vector_is_covered() {
    let known = [
        "rest_unauthorized_before_upstream",
        "rest_integration_vault_and_effective_user_headers",
        "rest_e2e_body_free_allowlist_exact",
        "rest_stress_repeat_one_note_per_call",
        "rest_unsafe_paths_400_before_upstream",
        "rest_only_bridge_call_is_hosted_context",
        "rest_upstream_errors_sanitized",
    ];
    let names: Vec<String> = rest_vectors()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names.len(), known.len());
    for n in &names {
        assert!(known.contains(&n.as_str()), "unhandled vector {n}");
    }
}

fn vector_config(canister: &Mock, bridge: Option<&Mock>) -> Config {
    let mut c = config(Some(&canister.url()), bridge.map(Mock::url).as_deref());
    // The upstream's test tokens carry no exp (§1 Deviation switch).
    c.auth.require_exp = false;
    c
}

#[tokio::test]
async fn s5_vector_rest_unauthorized_before_upstream() {
    let v = vector("rest_unauthorized_before_upstream");
    let canister = Mock::start(Reply::raw(500, "")).await;
    let svc = service(&vector_config(&canister, None));
    let a = vector_call(
        &svc,
        v["request"]["url"].as_str().unwrap(),
        &vector_headers(&v),
    )
    .await;
    assert_eq!(a.status, v["expect"]["status"]);
    assert_eq!(a.json(), v["expect"]["json"]);
    assert_eq!(
        canister.count() as u64,
        v["expect"]["canister_calls"].as_u64().unwrap()
    );
    assert_eq!(a.intercepted.outcome, Outcome::Unauthorized);
}

#[tokio::test]
async fn s2_s4_vector_rest_integration_vault_and_effective_user_headers() {
    let v = vector("rest_integration_vault_and_effective_user_headers");
    let e = &v["expect"];
    let canister = Mock::start(Reply::json(200, v["canister_response"]["json"].clone())).await;
    let bridge = Mock::start(Reply::json(
        200,
        v["bridge_hosted_context_response"].clone(),
    ))
    .await;
    let svc = service(&vector_config(&canister, Some(&bridge)));
    let headers = vector_headers(&v);
    let a = vector_call(&svc, v["request"]["url"].as_str().unwrap(), &headers).await;
    assert_eq!(a.status, e["status"], "{}", a.body);
    assert_eq!(a.json()["schema"], e["json.schema"]);
    assert_eq!(a.json()["path"], e["json.path"]);

    assert_eq!(bridge.count() as u64, e["bridge_calls"].as_u64().unwrap());
    let b = &bridge.requests()[0];
    for (k, want) in e["bridge_request_headers"].as_object().unwrap() {
        let want = want
            .as_str()
            .unwrap()
            .replace("Bearer <same jwt>", &vector_token());
        assert_eq!(b.headers[k.as_str()], want.as_str(), "bridge {k}");
    }
    assert_eq!(b.headers["accept"], "application/json");

    assert_eq!(
        canister.count() as u64,
        e["canister_calls"].as_u64().unwrap()
    );
    let c = &canister.requests()[0];
    assert_eq!(c.method, Method::GET);
    assert_eq!(c.uri, e["canister_request_url"].as_str().unwrap());
    for (k, want) in e["canister_request_headers"].as_object().unwrap() {
        assert_eq!(
            c.headers[k.as_str()],
            want.as_str().unwrap(),
            "canister {k}"
        );
    }
    assert_common_headers(&a);
    assert_eq!(a.intercepted.hosted_context, HostedContextEvent::Fetched);
    assert_eq!(a.intercepted.upstream_status, Some(200));
    assert_eq!(a.intercepted.sections, Some(2));
}

async fn e2e_allowlist_answer() -> (Value, Answer) {
    let v = vector("rest_e2e_body_free_allowlist_exact");
    let canister = Mock::start(Reply::json(200, v["canister_response"]["json"].clone())).await;
    let svc = service(&vector_config(&canister, None));
    let a = vector_call(
        &svc,
        v["request"]["url"].as_str().unwrap(),
        &vector_headers(&v),
    )
    .await;
    assert_eq!(canister.count(), 1);
    // No bridge: effective user = sub.
    assert_eq!(canister.requests()[0].headers["x-user-id"], "google:actor");
    (v, a)
}

#[tokio::test]
async fn s5_vector_rest_e2e_body_free_allowlist_all_but_title() {
    let (v, a) = e2e_allowlist_answer().await;
    assert_eq!(a.status, v["expect"]["status"]);
    let mut got = a.json();
    let mut want = v["expect"]["json"].clone();
    got.as_object_mut().unwrap().remove("title");
    want.as_object_mut().unwrap().remove("title");
    assert_eq!(got, want);
    assert_excludes(&a, &v["expect"]["serialized_excludes"]);
    assert_common_headers(&a);
}

#[tokio::test]
async fn s5_vector_rest_e2e_body_free_allowlist_exact() {
    let (v, a) = e2e_allowlist_answer().await;
    assert_eq!(a.json(), v["expect"]["json"]);
    // Field order as the gateway serializes it.
    assert!(a.body.starts_with(
        r#"{"schema":"knowtation.section_source/v0","path":"safe.md","title":"REST Section","sections":[{"section_id":"#
    ));
}

#[tokio::test]
async fn s4_vector_rest_stress_repeat_one_note_per_call() {
    let v = vector("rest_stress_repeat_one_note_per_call");
    let e = &v["expect"];
    let canister = Mock::start(Reply::json(200, v["canister_response"]["json"].clone())).await;
    let svc = service(&vector_config(&canister, None));
    let mut bodies = Vec::new();
    for _ in 0..e["calls"].as_u64().unwrap() {
        let a = vector_call(
            &svc,
            v["request"]["url"].as_str().unwrap(),
            &vector_headers(&v),
        )
        .await;
        assert_eq!(a.status, 200);
        assert_excludes(&a, &e["serialized_excludes"]);
        bodies.push(a.body);
    }
    assert!(bodies.windows(2).all(|w| w[0] == w[1]));
    assert_eq!(
        canister.count() as u64,
        e["canister_calls"].as_u64().unwrap()
    );
    for r in canister.requests() {
        assert_eq!(r.uri, e["every_canister_url"].as_str().unwrap());
    }
}

#[tokio::test]
async fn s3_vector_rest_unsafe_paths_400_before_upstream() {
    let v = vector("rest_unsafe_paths_400_before_upstream");
    let e = &v["expect"];
    let canister = Mock::start(Reply::raw(500, "")).await;
    let bridge = Mock::start(Reply::json(200, json!({}))).await;
    let svc = service(&vector_config(&canister, Some(&bridge)));
    for case in e["cases"].as_array().unwrap() {
        let a = get(
            &svc,
            case["request_url"].as_str().unwrap(),
            &[("authorization", &vector_token())],
        )
        .await;
        assert_eq!(a.status, case["status"], "{}", case["query_path_raw"]);
        assert_eq!(a.json(), case["json"]);
        assert_excludes(&a, &e["serialized_excludes"]);
        assert_eq!(a.intercepted.outcome, Outcome::InvalidPath);
    }
    assert_eq!(
        canister.count() as u64,
        e["canister_calls"].as_u64().unwrap()
    );
    assert_eq!(bridge.count(), 0);
}

#[tokio::test]
async fn s2_vector_rest_only_bridge_call_is_hosted_context() {
    let v = vector("rest_only_bridge_call_is_hosted_context");
    let canister = Mock::start(Reply::json(200, v["canister_response"]["json"].clone())).await;
    let bridge = Mock::start(Reply::json(
        200,
        v["bridge_hosted_context_response"].clone(),
    ))
    .await;
    let svc = service(&vector_config(&canister, Some(&bridge)));
    let a = vector_call(
        &svc,
        v["request"]["url"].as_str().unwrap(),
        &vector_headers(&v),
    )
    .await;
    assert_eq!(a.status, v["expect"]["status"]);
    let calls: Vec<String> = bridge.requests().into_iter().map(|r| r.uri).collect();
    let want: Vec<String> =
        serde_json::from_value(v["expect"]["bridge_calls_exact"].clone()).unwrap();
    assert_eq!(calls, want);
    assert_eq!(canister.requests()[0].headers["x-user-id"], "google:owner");
    assert_eq!(canister.requests()[0].headers["x-vault-id"], "default");
    assert_eq!(bridge.requests()[0].headers["x-vault-id"], "default");
}

#[tokio::test]
async fn s5_vector_rest_upstream_errors_sanitized() {
    let v = vector("rest_upstream_errors_sanitized");
    let e = &v["expect"];
    let canister = Mock::start(Reply::raw(500, "")).await;
    let svc = service(&vector_config(&canister, None));
    for case in e["cases"].as_array().unwrap() {
        let path = case["path"].as_str().unwrap();
        let cr = &case["canister_response"];
        canister.set(
            &format!("/api/v1/notes/{path}"),
            Reply::json(cr["status"].as_u64().unwrap() as u16, cr["json"].clone()),
        );
        let a = get(
            &svc,
            &format!("/api/v1/section-source?path={path}"),
            &[("authorization", &vector_token())],
        )
        .await;
        assert_eq!(a.status, case["status"], "{path}");
        assert_eq!(a.json(), case["json"], "{path}");
        assert_excludes(&a, &e["serialized_excludes"]);
        assert_eq!(
            a.intercepted.upstream_status,
            cr["status"].as_u64().map(|s| s as u16)
        );
        assert_common_headers(&a);
    }
    assert_eq!(canister.count(), 3);
}

// ---------------------------------------------------------------------------------------
// §5 table, row by row.

const URL: &str = "/api/v1/section-source?path=notes%2Fa.md";
const NOTE_URI: &str = "/api/v1/notes/notes%2Fa.md";

struct Setup {
    canister: Mock,
    bridge: Mock,
}

async fn setup() -> Setup {
    let canister = Mock::start(note(json!({"title": "T"}), "# A\n\nbody\n\n## B\n")).await;
    let bridge = Mock::start(Reply::json(
        200,
        json!({"effective_canister_user_id": "google:owner", "allowed_vault_ids": ["default", "v2"], "scope": null, "role": "viewer"}),
    ))
    .await;
    Setup { canister, bridge }
}

impl Setup {
    fn config(&self) -> Config {
        config(Some(&self.canister.url()), Some(&self.bridge.url()))
    }

    fn no_calls(&self) {
        assert_eq!(self.canister.count(), 0, "canister calls");
        assert_eq!(self.bridge.count(), 0, "bridge calls");
    }
}

fn agent_token(extra: Value) -> String {
    let mut c = json!({
        "sub": "agent:1", "exp": now() + 3600, "type": "agent_access",
        "aud": "knowtation-hub-rest", "typ": "kt_agent_access",
        "scopes": ["vault:read"], "vault_ids": ["v2"],
    });
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    format!("Bearer {}", sign(c))
}

#[tokio::test]
async fn s5_row1_agent_vault_forbidden_even_if_later_checks_fail() {
    let s = setup().await;
    let svc = service(&s.config());
    for (token, vault) in [
        (agent_token(json!({})), None),
        (agent_token(json!({})), Some("default")),
        (agent_token(json!({})), Some("v3")),
        // Would fail later checks: no sub, wrong aud, no scopes, bad vault shape, no canister path.
        (
            agent_token(json!({"sub": null, "aud": "x", "scopes": []})),
            Some("v3"),
        ),
        (agent_token(json!({"vault_ids": "v2"})), Some("v2")),
        (agent_token(json!({})), Some("bad vault!")),
    ] {
        let mut headers = vec![("authorization", token.as_str())];
        if let Some(v) = vault {
            headers.push(("x-vault-id", v));
        }
        let a = get(&svc, "/api/v1/section-source?path=..%2Fx", &headers).await;
        a.assert_error(
            403,
            "vault forbidden for agent credential",
            "AGENT_VAULT_FORBIDDEN",
        );
        assert_eq!(a.intercepted.outcome, Outcome::AgentVaultForbidden);
        assert_common_headers(&a);
    }
    // A no-canister sidecar still answers the agent gate first.
    let mut c = s.config();
    c.upstream.canister_url = None;
    let a = get(
        &service(&c),
        URL,
        &[("authorization", &agent_token(json!({})))],
    )
    .await;
    assert_eq!(a.status, 403);
    s.no_calls();
}

#[tokio::test]
async fn s5_row1_agent_with_the_vault_proceeds() {
    let s = setup().await;
    let svc = service(&s.config());
    let a = get(
        &svc,
        URL,
        &[
            ("authorization", &agent_token(json!({}))),
            ("x-vault-id", " v2 "),
        ],
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(s.canister.requests()[0].headers["x-vault-id"], "v2");
    assert_eq!(s.canister.requests()[0].headers["x-actor-id"], "agent:1");
    // The agent claims are still required once the vault passes.
    let a = get(
        &svc,
        URL,
        &[
            ("authorization", &agent_token(json!({"typ": "JWT"}))),
            ("x-vault-id", "v2"),
        ],
    )
    .await;
    a.assert_error(401, "Unauthorized", "UNAUTHORIZED");
}

#[tokio::test]
async fn s5_row2_unauthorized_before_any_upstream_call() {
    let s = setup().await;
    let svc = service(&s.config());
    let t = now();
    let other = jsonwebtoken::encode(
        &Header::default(),
        &json!({"sub": "u", "exp": t + 60}),
        &EncodingKey::from_secret(b"another-secret"),
    )
    .unwrap();
    let bad_tokens = vec![
        String::new(),
        format!("bearer {}", sign(json!({"sub": "u", "exp": t + 60}))),
        format!("Bearer {other}"),
        format!("Bearer {}", sign(json!({"sub": "u", "exp": t}))),
        format!("Bearer {}", sign(json!({"sub": "u"}))),
        format!(
            "Bearer {}",
            sign(json!({"sub": "u", "exp": t + 60, "nbf": t + 30}))
        ),
        format!("Bearer {}", sign(json!({"sub": "", "exp": t + 60}))),
        format!(
            "Bearer {}",
            sign(json!({"sub": "u", "exp": t + 60, "type": "refresh"}))
        ),
        format!(
            "Bearer {}",
            sign(json!({"sub": "u", "exp": t + 60, "type": "mcp_access"}))
        ),
        format!(
            "Bearer {}",
            sign(json!({"sub": "u", "exp": t + 60, "type": "mcp_access", "scopes": "vault:read"}))
        ),
        "Bearer x.y.z".to_owned(),
    ];
    for tok in &bad_tokens {
        let headers: Vec<(&str, &str)> = if tok.is_empty() {
            vec![]
        } else {
            vec![("authorization", tok.as_str())]
        };
        // Even with a bad path, a bad vault and an unlisted origin, 401 comes first.
        let a = get(&svc, "/api/v1/section-source?path=..%2Fsecret.md", &headers).await;
        a.assert_error(401, "Unauthorized", "UNAUTHORIZED");
        assert_common_headers(&a);
    }
    // Two Authorization headers are refused.
    let tok = token("u");
    let a = get(
        &svc,
        URL,
        &[("authorization", &tok), ("authorization", &tok)],
    )
    .await;
    assert_eq!(a.status, 401);
    s.no_calls();
}

#[tokio::test]
async fn s1_read_only_mcp_token_is_accepted_on_rest() {
    let s = setup().await;
    let svc = service(&s.config());
    let tok = format!(
        "Bearer {}",
        sign(
            json!({"sub": "m", "exp": now() + 60, "type": "mcp_access", "scopes": ["vault:read"], "role": "admin"})
        )
    );
    let a = get(&svc, URL, &[("authorization", &tok)]).await;
    assert_eq!(a.status, 200);
    let a = call(&svc, Method::HEAD, URL, &[("authorization", &tok)]).await;
    assert_eq!(a.status, 200);
}

#[tokio::test]
async fn s5_row3_no_canister_configured() {
    let s = setup().await;
    let mut c = s.config();
    c.upstream.canister_url = None;
    let svc = service(&c);
    // Before the path check: an invalid path still gets 503.
    for url in [
        URL,
        "/api/v1/section-source?path=..%2Fx",
        "/api/v1/section-source",
    ] {
        let a = get(&svc, url, &[("authorization", &token("u"))]).await;
        a.assert_error(
            503,
            "Hosted SectionSource is not configured",
            "SERVICE_UNAVAILABLE",
        );
        assert_eq!(a.intercepted.outcome, Outcome::NotConfigured);
    }
    s.no_calls();
}

#[tokio::test]
async fn s5_row4_bad_path_before_vault_and_upstream() {
    let s = setup().await;
    let svc = service(&s.config());
    for q in [
        "",
        "?",
        "?path",
        "?path=",
        "?path=%20%20",
        "?path=..%2Fa.md",
        "?path=%2Fetc%2Fpasswd",
        "?path=C%3A%5Cx.md",
        "?path=C%3Ax.md",
        "?path=a%2F.%2Fb.md",
        "?path=a%2Fb.md%20%2F",
        "?path=a%252e%252e%2Fb.md",
        "?path=a%00.md",
        "?path=a.md&path=b.md",
        "?path[]=a.md",
        "?path%5B%5D=a.md",
        "?path[0]=a.md",
        "?path[x]=a.md",
        "?[path][]=a.md",
        "?path=%zz",
        "?path=a%FF.md",
        "?PATH=a.md",
    ] {
        // An invalid vault too: the path is checked first.
        let a = get(
            &svc,
            &format!("/api/v1/section-source{q}"),
            &[("authorization", &token("u")), ("x-vault-id", "bad vault")],
        )
        .await;
        a.assert_error(400, "Invalid path", "INVALID_PATH");
    }
    let many = format!("/api/v1/section-source?{}path=a.md", "x=1&".repeat(1000));
    let a = get(&svc, &many, &[("authorization", &token("u"))]).await;
    a.assert_error(400, "Invalid path", "INVALID_PATH");
    s.no_calls();
}

#[tokio::test]
async fn s3_query_forms_that_qs_reads_as_one_string_are_served() {
    let s = setup().await;
    let svc = service(&s.config());
    for q in [
        "path=notes%2Fa.md",
        "path=notes/a.md",
        "%70ath=notes%2Fa.md",
        "[path]=notes%2Fa.md",
        "x=1&path=notes%2Fa.md&y=%20",
        "path=+notes/a.md+",
        "path=notes%5Ca.md",
        "path=notes//a.md",
    ] {
        let a = get(
            &svc,
            &format!("/api/v1/section-source?{q}"),
            &[("authorization", &token("u"))],
        )
        .await;
        assert_eq!(a.status, 200, "{q}: {}", a.body);
        assert_eq!(a.json()["path"], "notes/a.md");
    }
    assert!(s.canister.requests().iter().all(|r| r.uri == NOTE_URI));
}

#[tokio::test]
async fn s1_invalid_vault_is_400_before_upstream() {
    let s = setup().await;
    let svc = service(&s.config());
    for v in ["a b", "a/b", "../x", &"v".repeat(65), "vault,other", "v%2e"] {
        let a = get(
            &svc,
            URL,
            &[("authorization", &token("u")), ("x-vault-id", v)],
        )
        .await;
        a.assert_error(400, "Invalid vault", "INVALID_VAULT");
        assert_eq!(a.intercepted.outcome, Outcome::InvalidVault);
    }
    let a = get(
        &svc,
        URL,
        &[
            ("authorization", &token("u")),
            ("x-vault-id", "v2"),
            ("x-vault-id", "v2"),
        ],
    )
    .await;
    assert_eq!(a.status, 400);
    s.no_calls();
}

#[tokio::test]
async fn s5_row5_vault_not_allowed_by_hosted_context() {
    let s = setup().await;
    let svc = service(&s.config());
    let a = get(
        &svc,
        URL,
        &[("authorization", &token("u")), ("x-vault-id", "v3")],
    )
    .await;
    a.assert_error(403, "Access to this vault is not allowed.", "FORBIDDEN");
    assert_eq!(a.intercepted.outcome, Outcome::VaultForbidden);
    assert_eq!(a.intercepted.hosted_context, HostedContextEvent::Fetched);
    assert_eq!(s.bridge.count(), 1);
    assert_eq!(s.canister.count(), 0);
    // A 2xx answer without an array of vault ids is no context (§2): failing closed.
    s.bridge
        .set_default(Reply::json(200, json!({"allowed_vault_ids": null})));
    let a = get(
        &svc,
        URL,
        &[("authorization", &token("w")), ("x-vault-id", "v3")],
    )
    .await;
    assert_eq!(a.status, 503);
    s.bridge
        .set_default(Reply::json(200, json!({"allowed_vault_ids": ["v3"]})));
    let a = get(
        &svc,
        URL,
        &[("authorization", &token("w2")), ("x-vault-id", "v3")],
    )
    .await;
    assert_eq!(a.status, 200);
    // No bridge: no vault check, effective user = sub.
    let mut c = s.config();
    c.upstream.bridge_url = None;
    let a = get(
        &service(&c),
        URL,
        &[("authorization", &token("x")), ("x-vault-id", "v9")],
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(a.intercepted.hosted_context, HostedContextEvent::None);
    let last = s.canister.requests().pop().unwrap();
    assert_eq!(last.headers["x-user-id"], "x");
}

#[tokio::test]
async fn s5_row6_rate_limited_with_retry_after() {
    let s = setup().await;
    let mut c = s.config();
    c.rate_limit.per_user_per_minute = 1;
    c.rate_limit.burst = 2;
    let svc = service(&c);
    let tok = token("busy");
    for _ in 0..2 {
        assert_eq!(get(&svc, URL, &[("authorization", &tok)]).await.status, 200);
    }
    let a = get(&svc, URL, &[("authorization", &tok)]).await;
    a.assert_error(429, "Rate limit exceeded", "RATE_LIMITED");
    assert_common_headers(&a);
    let retry: u64 = a.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    assert_eq!(a.intercepted.outcome, Outcome::RateLimited);
    assert_eq!(s.canister.count(), 2);
    // Another user is not affected.
    assert_eq!(
        get(&svc, URL, &[("authorization", &token("calm"))])
            .await
            .status,
        200
    );
    // The limit comes right after the token, before any bridge or canister call, so a
    // bad path or a forbidden vault is limited too (§5 Deviation).
    let bridge_calls = s.bridge.count();
    let a = get(
        &svc,
        "/api/v1/section-source?path=..%2Fa",
        &[("authorization", &tok)],
    )
    .await;
    assert_eq!(a.status, 429);
    let a = get(&svc, URL, &[("authorization", &tok), ("x-vault-id", "v3")]).await;
    assert_eq!(a.status, 429);
    assert_eq!(s.bridge.count(), bridge_calls);
    // HEAD carries Retry-After too; OPTIONS is never limited.
    let a = call(&svc, Method::HEAD, URL, &[("authorization", &tok)]).await;
    assert_eq!(a.status, 429);
    assert!(a.headers.contains_key("retry-after"));
    assert_eq!(call(&svc, Method::OPTIONS, URL, &[]).await.status, 204);
}

#[tokio::test]
async fn s5_rows7_to_9_canister_statuses() {
    let s = setup().await;
    let svc = service(&s.config());
    for (status, want_status, error, code) in [
        (401, 403, "Forbidden", "FORBIDDEN"),
        (403, 403, "Forbidden", "FORBIDDEN"),
        (404, 404, "Not found", "NOT_FOUND"),
        (500, 502, "Upstream 500", "BAD_GATEWAY"),
        (503, 502, "Upstream 503", "BAD_GATEWAY"),
        (418, 502, "Upstream 418", "BAD_GATEWAY"),
        (400, 502, "Upstream 400", "BAD_GATEWAY"),
        (304, 502, "Upstream 304", "BAD_GATEWAY"),
    ] {
        s.canister.set(
            NOTE_URI,
            Reply::raw(status, "CANARY-ERROR-BODY {\"body\":\"CANARY-BODY\"}"),
        );
        let before = s.canister.count();
        let a = get(&svc, URL, &[("authorization", &token("u"))]).await;
        a.assert_error(want_status, error, code);
        assert_eq!(a.intercepted.upstream_status, Some(status));
        assert!(!a.serialized().contains("CANARY"));
        assert_eq!(s.canister.count(), before + 1);
    }
}

#[tokio::test]
async fn s4_redirects_are_not_followed() {
    let s = setup().await;
    let svc = service(&s.config());
    for status in [301, 302, 307, 308] {
        s.canister.set(
            NOTE_URI,
            Reply::raw(status, "").header("location", "/api/v1/notes/other.md"),
        );
        let before = s.canister.count();
        let a = get(&svc, URL, &[("authorization", &token("u"))]).await;
        a.assert_error(502, &format!("Upstream {status}"), "BAD_GATEWAY");
        assert_eq!(s.canister.count(), before + 1, "one request, no redirect");
    }
    assert!(s.canister.requests().iter().all(|r| r.uri == NOTE_URI));
}

#[tokio::test]
async fn s4_s5_row10_odd_2xx_bodies() {
    let s = setup().await;
    let svc = service(&s.config());
    let tok = token("u");
    let headers = [("authorization", tok.as_str())];
    let run = |reply: Reply| {
        s.canister.set(NOTE_URI, reply);
        get(&svc, URL, &headers)
    };
    run(Reply::raw(200, "<html>CANARY</html>"))
        .await
        .assert_error(502, "Invalid note response", "BAD_GATEWAY");
    run(Reply::raw(200, " "))
        .await
        .assert_error(502, "Invalid note response", "BAD_GATEWAY");
    run(Reply::raw(200, "\"\\ud800\"")).await.assert_error(
        502,
        "Invalid note response",
        "BAD_GATEWAY",
    );
    run(Reply::raw(200, "null"))
        .await
        .assert_error(502, "Bad Gateway", "BAD_GATEWAY");
    // Empty: success, zero sections, basename title.
    let a = run(Reply::raw(200, "")).await;
    assert_eq!(a.status, 200);
    assert_eq!(
        a.body,
        r#"{"schema":"knowtation.section_source/v0","path":"notes/a.md","title":"a","sections":[],"truncated":false}"#
    );
    assert_eq!(a.intercepted.sections, Some(0));
    for odd in ["\"# x\"", "12", "true", "[\"# x\"]"] {
        let a = run(Reply::raw(200, odd)).await;
        assert_eq!(a.status, 200, "{odd}");
        assert_eq!(a.json()["sections"], json!([]));
    }
    // Any 2xx is a success.
    let a = run(Reply::json(203, json!({"body": "# H"}))).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.intercepted.upstream_status, Some(203));
}

#[tokio::test]
async fn s5_row11_scope_filter_by_folder() {
    let s = setup().await;
    let svc = service(&s.config());
    let scoped = |folders: Value| {
        Reply::json(
            200,
            json!({"allowed_vault_ids": ["default"], "scope": {"projects": [], "folders": folders}}),
        )
    };
    for (folders, path, ok) in [
        (json!(["notes"]), "notes/a.md", true),
        (json!(["notes"]), "notes/deep/a.md", true),
        (json!(["notes"]), "notesy/a.md", false),
        (json!(["notes"]), "a.md", false),
        (json!([""]), "a.md", true),
        (json!(["notes/"]), "notes/a.md", false),
        (json!(["Notes"]), "notes/a.md", false),
        (json!([]), "other/a.md", true),
    ] {
        // A fresh user per case, so no cached context is reused.
        let user = format!("scope-{}-{}", folders, path);
        s.bridge.set_default(scoped(folders.clone()));
        s.canister
            .set_default(note(json!({"project": "p"}), "# A\n"));
        let a = get(
            &svc,
            &format!("/api/v1/section-source?path={path}"),
            &[("authorization", &token(&user))],
        )
        .await;
        if ok {
            assert_eq!(a.status, 200, "{folders} {path}");
        } else {
            a.assert_error(404, "Not found", "NOT_FOUND");
            assert_eq!(a.intercepted.outcome, Outcome::NotFound);
            assert_eq!(a.intercepted.upstream_status, Some(200));
        }
    }
}

/// Needs the REST frontmatter decoder (project read from the canister's JSON text).
#[tokio::test]
async fn s5_row11_scope_filter_by_project() {
    let s = setup().await;
    let svc = service(&s.config());
    s.bridge.set_default(Reply::json(
        200,
        json!({"allowed_vault_ids": ["default"], "scope": {"projects": ["alpha", 7], "folders": ["x"]}}),
    ));
    for (project, ok) in [
        (json!("alpha"), true),
        (json!(7), true),
        (json!("Alpha"), false),
        (json!(" alpha"), false),
        (json!("7"), false),
        (json!(["alpha"]), false),
        (json!(null), false),
    ] {
        s.canister
            .set_default(note(json!({"project": project}), "# A\n"));
        let a = get(
            &svc,
            URL,
            &[("authorization", &token(&format!("p{project}")))],
        )
        .await;
        assert_eq!(a.status, if ok { 200 } else { 404 }, "{project}");
    }
}

#[tokio::test]
async fn s4_body_is_converted_with_string() {
    let s = setup().await;
    let svc = service(&s.config());
    s.canister.set(
        NOTE_URI,
        Reply::json(200, json!({"body": ["# One", "two"]})),
    );
    let a = get(&svc, URL, &[("authorization", &token("u"))]).await;
    assert_eq!(a.json()["sections"][0]["heading_text"], "One,two");
}

/// Needs the REST frontmatter decoder (a title object with its own `toString`).
#[tokio::test]
async fn s5_row12_title_tostring_object_is_bad_gateway() {
    let s = setup().await;
    let svc = service(&s.config());
    s.canister
        .set_default(note(json!({"title": {"toString": 1}}), "# A\n"));
    let a = get(&svc, URL, &[("authorization", &token("u"))]).await;
    a.assert_error(502, "Bad Gateway", "BAD_GATEWAY");
}

#[tokio::test]
async fn s4_s5_row12_canister_timeout_is_bad_gateway() {
    let s = setup().await;
    let mut c = s.config();
    c.upstream.canister_timeout_ms = 200;
    let svc = service(&c);
    s.canister.set(
        NOTE_URI,
        note(json!({}), "# A\n").delayed(Duration::from_secs(3)),
    );
    let started = std::time::Instant::now();
    let a = get(&svc, URL, &[("authorization", &token("u"))]).await;
    a.assert_error(502, "Bad Gateway", "BAD_GATEWAY");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(a.intercepted.upstream_status, None);
}

#[tokio::test]
async fn s4_timeout_covers_the_body_read() {
    let (url, _task) = raw_server(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"body\":",
        None,
    )
    .await;
    let mut c = config(Some(&url), None);
    c.upstream.canister_timeout_ms = 300;
    let svc = service(&c);
    let started = std::time::Instant::now();
    let a = get(&svc, URL, &[("authorization", &token("u"))]).await;
    a.assert_error(502, "Bad Gateway", "BAD_GATEWAY");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(a.intercepted.upstream_status, Some(200));
}

#[tokio::test]
async fn s4_body_over_the_cap_is_bad_gateway_and_reading_stops() {
    // Announced length over the cap.
    let s = setup().await;
    let mut c = s.config();
    c.upstream.note_max_bytes = 1_000;
    let svc = service(&c);
    s.canister
        .set(NOTE_URI, note(json!({}), &"# big\n".repeat(500)));
    let a = get(&svc, URL, &[("authorization", &token("u"))]).await;
    a.assert_error(502, "Bad Gateway", "BAD_GATEWAY");
    // Exactly at the cap is fine.
    let body = json!({"body": "# H"}).to_string();
    let mut c2 = s.config();
    c2.upstream.note_max_bytes = body.len();
    s.canister.set(NOTE_URI, Reply::raw(200, body));
    assert_eq!(
        get(&service(&c2), URL, &[("authorization", &token("u"))])
            .await
            .status,
        200
    );

    // An endless chunked body: refused once past the cap, well before the timeout.
    let (url, _task) = raw_server(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
        Some(vec![b' '; 64 * 1024]),
    )
    .await;
    let mut c3 = config(Some(&url), None);
    c3.upstream.note_max_bytes = 256 * 1024;
    c3.upstream.canister_timeout_ms = 5_000;
    let started = std::time::Instant::now();
    let a = get(&service(&c3), URL, &[("authorization", &token("u"))]).await;
    a.assert_error(502, "Bad Gateway", "BAD_GATEWAY");
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn s4_canister_down_is_bad_gateway() {
    let url = dead_url().await;
    let svc = service(&config(Some(&url), None));
    let a = get(&svc, URL, &[("authorization", &token("u"))]).await;
    a.assert_error(502, "Bad Gateway", "BAD_GATEWAY");
    assert_eq!(a.intercepted.upstream_status, None);
}

#[tokio::test]
async fn s5_row13_success_body_and_record() {
    let s = setup().await;
    let svc = service(&s.config());
    let a = get(&svc, URL, &[("authorization", &token("u"))]).await;
    assert_eq!(a.status, 200);
    assert_common_headers(&a);
    let j = a.json();
    assert_eq!(j["schema"], "knowtation.section_source/v0");
    assert_eq!(j["path"], "notes/a.md");
    assert_eq!(j["sections"].as_array().unwrap().len(), 2);
    assert_eq!(j["sections"][0]["section_id"], "notes-a-md:h1-a-0001");
    let i = a.intercepted;
    assert_eq!(i.outcome, Outcome::Ok);
    assert_eq!(i.status, 200);
    assert_eq!(i.upstream_status, Some(200));
    assert_eq!(i.sections, Some(2));
    assert!(!i.truncated);
    assert_eq!(i.hosted_context, HostedContextEvent::Fetched);
}

#[tokio::test]
async fn s4_exactly_one_canister_read_with_the_rest_header_set() {
    let s = setup().await;
    let mut c = s.config();
    // One trailing slash on the configured URL is stripped.
    c.upstream.canister_url = Some(format!("{}/", s.canister.url()));
    let svc = service(&c);
    let tok = token("google:actor");
    let a = get(
        &svc,
        "/api/v1/section-source?path=inbox%2Fhello%20world.md",
        &[
            ("authorization", &tok),
            ("x-vault-id", "v2"),
            ("x-user-id", "spoofed-user"),
            ("x-actor-id", "spoofed-actor"),
            ("x-gateway-auth", "spoofed-secret"),
            ("content-type", "application/json"),
            ("cookie", "session=CANARY"),
        ],
    )
    .await;
    assert_eq!(a.status, 200);
    let reqs = s.canister.requests();
    assert_eq!(reqs.len(), 1);
    let r = &reqs[0];
    assert_eq!(r.method, Method::GET);
    assert_eq!(r.uri, "/api/v1/notes/inbox%2Fhello%20world.md");
    let mut names: Vec<&str> = r.headers.keys().map(|k| k.as_str()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "accept",
            "host",
            "x-actor-id",
            "x-gateway-auth",
            "x-user-id",
            "x-vault-id"
        ]
    );
    assert_eq!(r.headers["accept"], "application/json");
    assert_eq!(r.headers["x-vault-id"], "v2");
    assert_eq!(r.headers["x-user-id"], "google:owner");
    assert_eq!(r.headers["x-actor-id"], "google:actor");
    assert_eq!(r.headers["x-gateway-auth"], GATEWAY_SECRET);

    // Without a gateway secret there is no X-Gateway-Auth.
    let mut c = s.config();
    c.upstream.gateway_secret = None;
    get(&service(&c), URL, &[("authorization", &tok)]).await;
    let r = s.canister.requests().pop().unwrap();
    assert!(r.headers.get("x-gateway-auth").is_none());
    assert!(r.headers.get("authorization").is_none());
}

#[tokio::test]
async fn s4_encode_uri_component_of_the_path() {
    let s = setup().await;
    let svc = service(&s.config());
    for (query, uri) in [
        ("a.md", "/api/v1/notes/a.md"),
        ("caf%C3%A9%2Fx%20y.md", "/api/v1/notes/caf%C3%A9%2Fx%20y.md"),
        ("a!~*'()_-.md", "/api/v1/notes/a!~*'()_-.md"),
        ("a%23b%3Fc%26d.md", "/api/v1/notes/a%23b%3Fc%26d.md"),
        ("a%5Cb.md", "/api/v1/notes/a%2Fb.md"),
    ] {
        let a = get(
            &svc,
            &format!("/api/v1/section-source?path={query}"),
            &[("authorization", &token("u"))],
        )
        .await;
        assert_eq!(a.status, 200, "{query}");
        assert_eq!(s.canister.requests().pop().unwrap().uri, uri);
    }
}

// ---------------------------------------------------------------------------------------
// §2 hosted context: failures, fallback, cache.

async fn bridge_failures() -> Vec<(&'static str, Option<Mock>, String)> {
    let slow = Mock::start(Reply::json(200, json!({})).delayed(Duration::from_secs(3))).await;
    let e500 = Mock::start(Reply::json(500, json!({"error": "CANARY-BRIDGE"}))).await;
    let e401 = Mock::start(Reply::raw(401, "")).await;
    let bad = Mock::start(Reply::raw(200, "not json CANARY-BRIDGE")).await;
    let arr = Mock::start(Reply::json(200, json!(["x"]))).await;
    let big = Mock::start(Reply::json(200, json!({"role": "x".repeat(70_000)}))).await;
    let redirect = Mock::start(Reply::raw(302, "").header("location", "/elsewhere")).await;
    let mut out = vec![("down", None, dead_url().await)];
    for (name, m) in [
        ("slow", slow),
        ("500", e500),
        ("401", e401),
        ("malformed", bad),
        ("array", arr),
        ("too large", big),
        ("redirect", redirect),
    ] {
        let url = m.url();
        out.push((name, Some(m), url));
    }
    out
}

#[tokio::test]
async fn s2_bridge_failure_fails_closed_by_default() {
    let canister = Mock::start(note(json!({}), "# A\n")).await;
    for (name, _mock, url) in bridge_failures().await {
        let svc = service(&config(Some(&canister.url()), Some(&url)));
        let started = std::time::Instant::now();
        let a = get(&svc, URL, &[("authorization", &token("u"))]).await;
        a.assert_error(
            503,
            "Hosted access context unavailable",
            "SERVICE_UNAVAILABLE",
        );
        assert_eq!(
            a.intercepted.hosted_context,
            HostedContextEvent::FailedDenied,
            "{name}"
        );
        assert_eq!(a.intercepted.outcome, Outcome::HostedContextUnavailable);
        assert!(!a.serialized().contains("CANARY"));
        assert!(started.elapsed() < Duration::from_secs(2), "{name}");
    }
    assert_eq!(canister.count(), 0);
}

#[tokio::test]
async fn s2_bridge_403_is_forbidden_when_failing_closed() {
    let canister = Mock::start(note(json!({}), "# A\n")).await;
    let bridge = Mock::start(Reply::json(403, json!({"error": "CANARY-BRIDGE"}))).await;
    let svc = service(&config(Some(&canister.url()), Some(&bridge.url())));
    let a = get(&svc, URL, &[("authorization", &token("u"))]).await;
    a.assert_error(403, "Access to this vault is not allowed.", "FORBIDDEN");
    assert_eq!(
        a.intercepted.hosted_context,
        HostedContextEvent::FailedDenied
    );
    assert_eq!(canister.count(), 0);
}

#[tokio::test]
async fn s2_bridge_failure_falls_back_to_sub_when_configured() {
    let canister = Mock::start(note(json!({}), "# A\n")).await;
    let forbidden = Mock::start(Reply::raw(403, "")).await;
    let mut failures = bridge_failures().await;
    let url = forbidden.url();
    failures.push(("403", Some(forbidden), url));
    for (name, _mock, url) in failures {
        let mut c = config(Some(&canister.url()), Some(&url));
        c.hosted_context.on_failure = OnFailure::Actor;
        let svc = service(&c);
        // A vault the bridge would not have allowed: the check is skipped.
        let a = get(
            &svc,
            URL,
            &[
                ("authorization", &token("google:actor")),
                ("x-vault-id", "v9"),
            ],
        )
        .await;
        assert_eq!(a.status, 200, "{name}: {}", a.body);
        assert_eq!(
            a.intercepted.hosted_context,
            HostedContextEvent::FailedFallback,
            "{name}"
        );
        let r = canister.requests().pop().unwrap();
        assert_eq!(r.headers["x-user-id"], "google:actor");
        assert_eq!(r.headers["x-vault-id"], "v9");
    }
}

#[tokio::test]
async fn s2_successful_answers_are_cached_per_sub_and_vault() {
    let s = setup().await;
    let svc = service(&s.config());
    let a = get(&svc, URL, &[("authorization", &token("u"))]).await;
    assert_eq!(a.intercepted.hosted_context, HostedContextEvent::Fetched);
    let a = get(&svc, URL, &[("authorization", &token("u"))]).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.intercepted.hosted_context, HostedContextEvent::Cached);
    assert_eq!(s.bridge.count(), 1, "second call made no bridge call");
    // Another vault or another user is another entry.
    get(
        &svc,
        URL,
        &[("authorization", &token("u")), ("x-vault-id", "v2")],
    )
    .await;
    get(&svc, URL, &[("authorization", &token("other"))]).await;
    assert_eq!(s.bridge.count(), 3);
    // A cached refusal is still a refusal, without a new call.
    let a = get(
        &svc,
        URL,
        &[("authorization", &token("other")), ("x-vault-id", "v3")],
    )
    .await;
    assert_eq!(a.status, 403);
    get(
        &svc,
        URL,
        &[("authorization", &token("other")), ("x-vault-id", "v3")],
    )
    .await;
    assert_eq!(s.bridge.count(), 4);
    assert_eq!(s.canister.count(), 4);
}

#[tokio::test]
async fn s2_failures_are_cached_briefly() {
    let canister = Mock::start(note(json!({}), "# A\n")).await;
    let bridge = Mock::start(Reply::raw(500, "")).await;
    // Remembered for `failure_cache_ttl_seconds`: one bridge call for three requests.
    let svc = service(&config(Some(&canister.url()), Some(&bridge.url())));
    for _ in 0..3 {
        assert_eq!(
            get(&svc, URL, &[("authorization", &token("u"))])
                .await
                .status,
            503
        );
    }
    assert_eq!(bridge.count(), 1);
    let before = bridge.count();
    // With the failure cache off, every request asks again.
    let mut c = config(Some(&canister.url()), Some(&bridge.url()));
    c.hosted_context.failure_cache_ttl_seconds = 0;
    let svc = service(&c);
    for _ in 0..3 {
        assert_eq!(
            get(&svc, URL, &[("authorization", &token("u"))])
                .await
                .status,
            503
        );
    }
    assert_eq!(bridge.count() - before, 3);
    bridge.set_default(Reply::json(200, json!({"allowed_vault_ids": ["default"]})));
    assert_eq!(
        get(&svc, URL, &[("authorization", &token("u"))])
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn s2_effective_user_is_not_trimmed_on_rest() {
    let s = setup().await;
    let svc = service(&s.config());
    s.bridge.set_default(Reply::json(
        200,
        json!({"allowed_vault_ids": ["default"], "effective_canister_user_id": ""}),
    ));
    get(&svc, URL, &[("authorization", &token("a"))]).await;
    assert_eq!(
        s.canister.requests().pop().unwrap().headers["x-user-id"],
        "a"
    );
    // A blank id is non-empty, so it is used as is (MCP would trim it and use `sub`);
    // HTTP drops the spaces around a header value, so the canister sees it empty.
    s.bridge.set_default(Reply::json(
        200,
        json!({"allowed_vault_ids": ["default"], "effective_canister_user_id": " "}),
    ));
    get(&svc, URL, &[("authorization", &token("b"))]).await;
    assert_eq!(
        s.canister.requests().pop().unwrap().headers["x-user-id"],
        ""
    );
}

// ---------------------------------------------------------------------------------------
// HEAD, OPTIONS, CORS.

#[tokio::test]
async fn s5_head_has_the_same_headers_and_no_body() {
    let s = setup().await;
    let svc = service(&s.config());
    let g = get(&svc, URL, &[("authorization", &token("u"))]).await;
    let h = call(&svc, Method::HEAD, URL, &[("authorization", &token("u"))]).await;
    assert_eq!(h.status, 200);
    assert_eq!(h.body, "");
    assert_eq!(g.headers, h.headers);
    assert_eq!(
        h.headers["content-length"],
        g.body.len().to_string().as_str()
    );
    // Errors too.
    let g = get(&svc, URL, &[]).await;
    let h = call(&svc, Method::HEAD, URL, &[]).await;
    assert_eq!((h.status, h.body.as_str()), (401, ""));
    assert_eq!(g.headers, h.headers);
}

#[tokio::test]
async fn s5_options_is_204_with_cors_and_cache_control_only() {
    let s = setup().await;
    let svc = service(&s.config());
    for headers in [vec![], vec![("authorization", "Bearer junk")]] {
        let a = call(
            &svc,
            Method::OPTIONS,
            "/api/v1/section-source?path=..%2Fx",
            &headers,
        )
        .await;
        assert_eq!(a.status, 204);
        assert_eq!(a.body, "");
        assert!(a.headers.get("content-type").is_none());
        assert!(a.headers.get("content-length").is_none());
        assert_eq!(
            a.headers["cache-control"],
            "private, no-store, must-revalidate"
        );
        assert_eq!(a.headers["access-control-allow-origin"], "*");
        assert_eq!(
            a.headers["access-control-allow-methods"],
            "GET, POST, PUT, PATCH, DELETE, OPTIONS"
        );
        assert_eq!(
            a.headers["access-control-allow-headers"],
            "Authorization, Content-Type, X-Vault-Id, X-User-Id"
        );
        assert_eq!(a.headers.len(), 4);
        assert_eq!(a.intercepted.outcome, Outcome::Preflight);
        assert_eq!(a.intercepted.status, 204);
    }
    s.no_calls();
}

#[tokio::test]
async fn s5_cors_with_configured_origins() {
    let s = setup().await;
    let mut c = s.config();
    c.cors.allowed_origins = vec![
        "https://app.example.com".into(),
        "https://hub.example.org".into(),
    ];
    let svc = service(&c);
    for (origin, allowed) in [
        (Some("https://hub.example.org"), "https://hub.example.org"),
        (
            Some("https://www.app.example.com"),
            "https://www.app.example.com",
        ),
        (
            Some("https://www.hub.example.org:444"),
            "https://www.hub.example.org:444",
        ),
        (Some("https://evil.example"), "https://app.example.com"),
        (Some("http://app.example.com"), "https://app.example.com"),
        (None, "https://app.example.com"),
    ] {
        for method in [Method::GET, Method::HEAD, Method::OPTIONS] {
            let mut headers = vec![("authorization", "Bearer nope")];
            if let Some(o) = origin {
                headers.push(("origin", o));
            }
            let a = call(&svc, method.clone(), URL, &headers).await;
            assert_eq!(
                a.headers["access-control-allow-origin"], allowed,
                "{origin:?} {method}"
            );
            assert_eq!(a.headers["access-control-allow-credentials"], "true");
            assert_eq!(a.headers["vary"], "Origin");
            assert!(!a.serialized().contains("evil"));
        }
    }
}

/// The proxy serves these responses with hyper: HEAD keeps its Content-Length, OPTIONS
/// gets none.
#[tokio::test]
async fn s5_head_content_length_survives_a_hyper_server() {
    let s = setup().await;
    let svc = Arc::new(service(&s.config()));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server_svc = Arc::clone(&svc);
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let svc = Arc::clone(&server_svc);
            tokio::spawn(async move {
                let f = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let svc = Arc::clone(&svc);
                    async move {
                        let (parts, _) = req.into_parts();
                        let view = view_of(&parts.uri);
                        Ok::<_, Infallible>(svc.handle(&parts, &budget(), view).await.0)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), f)
                    .await;
            });
        }
    });
    let raw = |method: &str| {
        let tok = token("u");
        let method = method.to_owned();
        async move {
            let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            let req = format!(
                "{method} {URL} HTTP/1.1\r\nHost: x\r\nAuthorization: {tok}\r\nConnection: close\r\n\r\n"
            );
            stream.write_all(req.as_bytes()).await.unwrap();
            let mut out = String::new();
            stream.read_to_string(&mut out).await.unwrap();
            out.to_ascii_lowercase()
        }
    };
    let g = raw("GET").await;
    let h = raw("HEAD").await;
    let len_of = |s: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix("content-length: ").map(str::to_owned))
    };
    assert!(len_of(&g).is_some());
    assert_eq!(len_of(&g), len_of(&h), "{h}");
    assert!(h.ends_with("\r\n\r\n"), "HEAD has no body");
    let o = raw("OPTIONS").await;
    assert!(o.starts_with("http/1.1 204"));
    assert!(len_of(&o).is_none());
    task.abort();
}

// ---------------------------------------------------------------------------------------
// Leaks and echoes.

#[tokio::test]
async fn s5_canaries_never_leave_the_sidecar() {
    let canister = Mock::start(Reply::json(
        200,
        json!({
            "path": "/CANARY-PATH/secret.md",
            "frontmatter": json!({
                "title": "Visible",
                "api_key": "CANARY-FM-KEY",
                "project": "CANARY-FM-PROJECT",
                "tags": ["CANARY-FM-TAG"],
            }).to_string(),
            "body": "# Heading\n\nCANARY-BODY-1 paragraph.\n\n```\n# CANARY-CODE\n```\n\n> CANARY-QUOTE\n\n## Second\n\n- CANARY-LIST\n",
            "extra": "CANARY-EXTRA",
        }),
    ))
    .await;
    let svc = service(&config(Some(&canister.url()), None));
    let a = get(&svc, URL, &[("authorization", &token("u"))]).await;
    assert_eq!(a.status, 200);
    assert!(!a.serialized().contains("CANARY"), "{}", a.body);
    assert_eq!(a.json()["sections"].as_array().unwrap().len(), 2);

    for status in [200, 401, 403, 404, 409, 500, 502] {
        canister.set(
            NOTE_URI,
            Reply::raw(
                status,
                "CANARY-ERR {\"error\":\"CANARY-ERR\",\"body\":\"CANARY-ERR\"}",
            )
            .header("x-canary", "CANARY-HEADER")
            .header("set-cookie", "CANARY-COOKIE=1"),
        );
        let a = get(&svc, URL, &[("authorization", &token("u"))]).await;
        assert!(
            !a.serialized().contains("CANARY"),
            "{status}: {}",
            a.serialized()
        );
        assert!(a.headers.get("set-cookie").is_none());
    }
}

#[tokio::test]
async fn s3_unsafe_input_is_never_echoed() {
    let s = setup().await;
    let svc = service(&s.config());
    let evil_paths = [
        "..%2FECHO-CANARY.md",
        "%2FECHO-CANARY%2Fsecret.md",
        "C%3A%5CECHO-CANARY.md",
        "ECHO-CANARY%00.md",
        "%3Cscript%3EECHO-CANARY",
    ];
    for p in evil_paths {
        let a = get(
            &svc,
            &format!("/api/v1/section-source?path={p}&ECHO-CANARY=ECHO-CANARY"),
            &[
                ("authorization", &token("ECHO-CANARY-USER")),
                ("x-vault-id", "ECHO<CANARY>"),
                ("origin", "https://ECHO-CANARY.example"),
                ("x-user-id", "ECHO-CANARY"),
            ],
        )
        .await;
        assert_eq!(a.status, 400);
        assert!(
            !a.serialized().to_ascii_uppercase().contains("ECHO"),
            "{}",
            a.serialized()
        );
    }
    for (headers, status) in [
        (vec![("authorization", "Bearer ECHO-CANARY")], 401),
        (vec![("authorization", "ECHO-CANARY")], 401),
    ] {
        let a = get(&svc, "/api/v1/section-source?path=ECHO-CANARY.md", &headers).await;
        assert_eq!(a.status, status);
        assert!(!a.serialized().contains("ECHO"));
    }
    // A valid request never echoes the user, the vault or request headers either.
    let a = get(
        &svc,
        URL,
        &[
            ("authorization", &token("ECHO-CANARY-USER")),
            ("x-vault-id", "v2"),
            ("x-echo", "ECHO-CANARY"),
        ],
    )
    .await;
    assert_eq!(a.status, 200);
    assert!(!a.serialized().contains("ECHO"));
    s.canister
        .requests()
        .iter()
        .for_each(|r| assert!(r.headers.get("x-echo").is_none()));
}

#[tokio::test]
async fn s4_unsendable_user_ids_make_no_canister_call() {
    let s = setup().await;
    let svc = service(&s.config());
    let a = get(&svc, URL, &[("authorization", &token("caf\u{e9}"))]).await;
    a.assert_error(502, "Bad Gateway", "BAD_GATEWAY");
    assert_eq!(s.canister.count(), 0);
}

#[test]
fn s5_matches_sample() {
    let m = |u: &str| route::classify(&u.parse().unwrap()) == route::Route::SectionSource;
    assert!(m("/api/v1/section-source?path=a.md"));
    assert!(m("/.netlify/functions/gateway/API/v1/section-source/"));
    assert!(!m("/api/v1/section-sources"));
    assert!(!m("/api/v1/section-source/x"));
}

// ---------------------------------------------------------------------------------------
// The NoteOutline route: the section-source route's table, a NoteOutline on success.

/// One row of the §5 table: what the canister and bridge say, the request's headers and
/// method, and the query.
struct Row {
    what: &'static str,
    canister: Option<Reply>,
    bridge: Option<Reply>,
    headers: Vec<(&'static str, String)>,
    method: Method,
    query: &'static str,
    config: fn(&mut Config),
}

fn row(what: &'static str) -> Row {
    Row {
        what,
        canister: None,
        bridge: None,
        headers: vec![("authorization", token("u"))],
        method: Method::GET,
        query: "?path=notes%2Fa.md",
        config: |_| {},
    }
}

/// Every row of the §5 table, answered for `GET /api/v1/note-outline` exactly as for
/// `GET /api/v1/section-source` (status, body, headers, the upstream calls made), but
/// the success body, which is the note's NoteOutline, and the 503 body, which names the
/// view.
#[tokio::test]
async fn the_note_outline_route_answers_with_the_section_source_table() {
    let scoped = Reply::json(
        200,
        json!({"effective_canister_user_id": "google:owner", "allowed_vault_ids": ["default"], "scope": {"folders": ["other"]}, "role": "viewer"}),
    );
    let rows = vec![
        Row {
            headers: vec![
                ("authorization", agent_token(json!({}))),
                ("x-vault-id", "default".into()),
            ],
            ..row("agent without the vault")
        },
        Row {
            headers: vec![],
            ..row("no token")
        },
        Row {
            headers: vec![("authorization", "Bearer nope".into())],
            ..row("bad token")
        },
        Row {
            config: |c| {
                c.rate_limit.per_user_per_minute = 1;
                c.rate_limit.burst = 1;
            },
            ..row("rate limited (second call)")
        },
        Row {
            config: |c| c.upstream.canister_url = None,
            ..row("no canister")
        },
        Row {
            query: "?path=..%2Fa.md",
            ..row("bad path")
        },
        Row {
            query: "",
            ..row("no path")
        },
        Row {
            headers: vec![
                ("authorization", token("u")),
                ("x-vault-id", "bad vault".into()),
            ],
            ..row("invalid vault")
        },
        Row {
            headers: vec![("authorization", token("u")), ("x-vault-id", "v9".into())],
            ..row("vault not allowed")
        },
        Row {
            bridge: Some(Reply::raw(500, "")),
            ..row("bridge down")
        },
        Row {
            canister: Some(Reply::raw(401, "CANARY")),
            ..row("canister 401")
        },
        Row {
            canister: Some(Reply::raw(403, "CANARY")),
            ..row("canister 403")
        },
        Row {
            canister: Some(Reply::raw(404, "CANARY")),
            ..row("canister 404")
        },
        Row {
            canister: Some(Reply::raw(500, "CANARY stack trace")),
            ..row("canister 500")
        },
        Row {
            canister: Some(Reply::raw(200, "<html>CANARY</html>")),
            ..row("not JSON")
        },
        Row {
            canister: Some(Reply::raw(200, "null")),
            ..row("null")
        },
        Row {
            bridge: Some(scoped),
            ..row("out of scope")
        },
        Row {
            canister: Some(note(json!({"title": {"toString": 1}}), "# A")),
            ..row("throwing title")
        },
        Row {
            canister: Some(Reply::raw(200, "{}").delayed(Duration::from_secs(3))),
            ..row("canister timeout")
        },
        row("success"),
        Row {
            method: Method::HEAD,
            ..row("HEAD success")
        },
        Row {
            method: Method::OPTIONS,
            headers: vec![],
            ..row("preflight")
        },
    ];
    for r in rows {
        let mut answers = Vec::new();
        for route in ["section-source", "note-outline"] {
            let s = setup().await;
            let mut c = s.config();
            (r.config)(&mut c);
            if let Some(reply) = &r.canister {
                s.canister.set(NOTE_URI, reply.clone());
            }
            if let Some(reply) = &r.bridge {
                *s.bridge.state.fallback.lock().unwrap() = Some(reply.clone());
            }
            let svc = service(&c);
            let url = format!("/api/v1/{route}{}", r.query);
            let headers: Vec<(&str, &str)> =
                r.headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            if r.what.starts_with("rate limited") {
                call(&svc, r.method.clone(), &url, &headers).await;
            }
            let a = call(&svc, r.method.clone(), &url, &headers).await;
            assert!(!a.serialized().contains("CANARY"), "{}: {route}", r.what);
            answers.push((a, s.canister.count(), s.bridge.count()));
        }
        let [(ss, ss_canister, ss_bridge), (no, no_canister, no_bridge)] = &answers[..] else {
            unreachable!()
        };
        let what = r.what;
        assert_eq!(no.status, ss.status, "{what}: status");
        assert_eq!(
            (no_canister, no_bridge),
            (ss_canister, ss_bridge),
            "{what}: upstream calls"
        );
        assert_eq!(
            no.intercepted.outcome, ss.intercepted.outcome,
            "{what}: outcome"
        );
        assert_eq!(no.intercepted.view, Some(View::NoteOutline), "{what}");
        assert_eq!(ss.intercepted.view, Some(View::SectionSource), "{what}");
        let mut no_headers = no.headers.clone();
        let mut ss_headers = ss.headers.clone();
        no_headers.remove("content-length");
        ss_headers.remove("content-length");
        assert_eq!(no_headers, ss_headers, "{what}: headers");
        match ss.status {
            200 if r.method == Method::GET => {
                assert_eq!(
                    no.body,
                    r#"{"schema":"knowtation.note_outline/v1","path":"notes/a.md","title":"T","headings":[{"level":1,"text":"A","id":"h1-a-0001"},{"level":2,"text":"B","id":"h2-b-0002"}],"truncated":false}"#,
                    "{what}"
                );
                assert_eq!(
                    no.headers["content-length"],
                    no.body.len().to_string().as_str()
                );
            }
            503 if ss.body.contains("SectionSource") => {
                no.assert_error(
                    503,
                    "Hosted NoteOutline is not configured",
                    "SERVICE_UNAVAILABLE",
                );
            }
            _ => assert_eq!(no.body, ss.body, "{what}: body"),
        }
    }
}

/// A view the policy denies is no route: 404 `Not found` for every method, nothing
/// read; a view it passes is not the REST service's (the proxy passes its path through).
#[tokio::test]
async fn a_denied_view_route_is_not_found_and_reads_nothing() {
    let s = setup().await;
    let mut policy = Policy::default();
    policy.set_mode(View::NoteOutline, ViewMode::Deny);
    let svc = RestService::new(&s.config(), Arc::new(Metrics::new()), policy).unwrap();
    for method in [Method::GET, Method::HEAD, Method::OPTIONS] {
        let a = call(
            &svc,
            method.clone(),
            "/api/v1/note-outline?path=notes%2Fa.md",
            &[("authorization", &token("u"))],
        )
        .await;
        assert_eq!(a.status, 404, "{method}");
        assert_eq!(a.intercepted.outcome, Outcome::ViewDenied);
        if method == Method::GET {
            a.assert_error(404, "Not found", "NOT_FOUND");
        }
    }
    s.no_calls();
    // The section-source route is still served.
    assert_eq!(
        get(&svc, URL, &[("authorization", &token("u"))])
            .await
            .status,
        200
    );
}
