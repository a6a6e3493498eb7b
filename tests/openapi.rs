//! `docs/openapi.yaml` against the real thing: a sidecar (`proxy::start`) on loopback in
//! front of the test-kit gateway, canister and bridge answers every status the document
//! lists for the section-source and note-outline routes, on every documented path and
//! for every method.
//! Each answer must be documented for its operation: its status, every header it carries
//! (only `Date` may go unmentioned), every required header, its `Content-Type` and its
//! body against the schema (every object in the document is closed, so the
//! `knowtation.section_source/v0` and `knowtation.note_outline/v1` allowlists are
//! pinned). Conversely every documented
//! status of every operation, and every alternative body of a GET answer, must have been
//! seen, so the document can carry nothing the sidecar does not do.

// A failed expectation in a test is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/yaml.rs"]
mod yaml;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use knowtation_sidecar::config::{Config, Secret};
use knowtation_sidecar::proxy::{self, Running};
use knowtation_testkit::{
    client, session_claims, sign_token, unix_now, CanisterOverride, MockBridge, MockCanister,
    MockGateway, Reply,
};
use serde_json::{json, Value};
use tokio::net::TcpStream;

const SECRET: &str = "openapi-test-secret-0123456789abcdef";
const ORIGIN: &str = "https://hub.example";
const REST: &str = "/api/v1/section-source";
const NETLIFY: &str = "/.netlify/functions/gateway/api/v1/section-source";
const OUTLINE: &str = "/api/v1/note-outline";
const OUTLINE_NETLIFY: &str = "/.netlify/functions/gateway/api/v1/note-outline";
const METHODS: [&str; 3] = ["get", "head", "options"];

// ---------------------------------------------------------------------------------------
// The document

fn document() -> Value {
    let path = format!("{}/docs/openapi.yaml", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("docs/openapi.yaml");
    yaml::parse(&text).expect("docs/openapi.yaml is YAML")
}

/// Follows `$ref`s (local JSON pointers) until a value without one.
fn resolve<'a>(doc: &'a Value, mut v: &'a Value) -> &'a Value {
    for _ in 0..32 {
        let Some(r) = v.get("$ref").and_then(Value::as_str) else {
            return v;
        };
        let pointer = r
            .strip_prefix('#')
            .unwrap_or_else(|| panic!("only local $refs: {r}"));
        v = doc
            .pointer(pointer)
            .unwrap_or_else(|| panic!("$ref {r} points nowhere"));
    }
    panic!("$ref chain too long");
}

/// The keywords the schema checker understands; a schema using any other fails the test
/// rather than being half-checked.
const KEYWORDS: [&str; 16] = [
    "$ref",
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "const",
    "pattern",
    "minimum",
    "maximum",
    "minItems",
    "maxItems",
    "minLength",
    "oneOf",
    "description",
];
const ANNOTATIONS: [&str; 2] = ["default", "title"];

fn type_matches(t: &str, v: &Value) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "number" => v.is_number(),
        "integer" => v.as_i64().is_some() || v.as_u64().is_some(),
        other => panic!("unknown type {other}"),
    }
}

/// Checks `v` against `schema`; `Err` says where and why.
fn validate(doc: &Value, schema: &Value, v: &Value, at: &str) -> Result<(), String> {
    let schema = resolve(doc, schema);
    let s = schema.as_object().expect("a schema is an object");
    for key in s.keys() {
        assert!(
            KEYWORDS.contains(&key.as_str()) || ANNOTATIONS.contains(&key.as_str()),
            "docs/openapi.yaml uses the schema keyword {key}, which this test does not check"
        );
    }
    let fail = |why: String| Err(format!("{at}: {why} (value {v})"));
    if let Some(t) = s.get("type") {
        let ok = match t {
            Value::String(t) => type_matches(t, v),
            Value::Array(ts) => ts.iter().any(|t| type_matches(t.as_str().unwrap(), v)),
            _ => panic!("type is a string or a list"),
        };
        if !ok {
            return fail(format!("not of type {t}"));
        }
    }
    if let Some(c) = s.get("const") {
        if c != v {
            return fail(format!("not {c}"));
        }
    }
    if let Some(e) = s.get("enum") {
        if !e.as_array().unwrap().contains(v) {
            return fail(format!("not one of {e}"));
        }
    }
    if let Some(text) = v.as_str() {
        if let Some(n) = s.get("minLength").and_then(Value::as_u64) {
            if (text.chars().count() as u64) < n {
                return fail(format!("shorter than {n}"));
            }
        }
        if let Some(p) = s.get("pattern").and_then(Value::as_str) {
            if !Pattern::new(p).is_match(text) {
                return fail(format!("does not match {p}"));
            }
        }
    }
    if let Some(n) = v.as_f64() {
        if s.get("minimum")
            .and_then(Value::as_f64)
            .is_some_and(|m| n < m)
        {
            return fail("below the minimum".into());
        }
        if s.get("maximum")
            .and_then(Value::as_f64)
            .is_some_and(|m| n > m)
        {
            return fail("above the maximum".into());
        }
    }
    if let Some(items) = v.as_array() {
        if s.get("minItems")
            .and_then(Value::as_u64)
            .is_some_and(|m| (items.len() as u64) < m)
        {
            return fail("too few items".into());
        }
        if s.get("maxItems")
            .and_then(Value::as_u64)
            .is_some_and(|m| (items.len() as u64) > m)
        {
            return fail("too many items".into());
        }
        if let Some(item) = s.get("items") {
            for (i, x) in items.iter().enumerate() {
                validate(doc, item, x, &format!("{at}[{i}]"))?;
            }
        }
    }
    if let Some(obj) = v.as_object() {
        let props = s.get("properties").and_then(Value::as_object);
        for r in s
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let r = r.as_str().unwrap();
            if !obj.contains_key(r) {
                return fail(format!("missing {r}"));
            }
        }
        for (k, x) in obj {
            match props.and_then(|p| p.get(k)) {
                Some(p) => validate(doc, p, x, &format!("{at}.{k}"))?,
                None => match s.get("additionalProperties") {
                    Some(Value::Bool(false)) => return fail(format!("{k} is not allowed")),
                    Some(Value::Bool(true)) | None => {}
                    Some(extra) => validate(doc, extra, x, &format!("{at}.{k}"))?,
                },
            }
        }
    }
    if s.contains_key("oneOf") {
        one_of(doc, schema, v, at)?;
    }
    Ok(())
}

/// The index of the one `oneOf` branch `v` matches.
fn one_of(doc: &Value, schema: &Value, v: &Value, at: &str) -> Result<usize, String> {
    let branches = schema["oneOf"].as_array().expect("oneOf is a list");
    let matched: Vec<usize> = (0..branches.len())
        .filter(|&i| validate(doc, &branches[i], v, at).is_ok())
        .collect();
    match matched.as_slice() {
        [i] => Ok(*i),
        [] => Err(format!("{at}: {v} matches no alternative")),
        _ => Err(format!(
            "{at}: {v} matches several alternatives {matched:?}"
        )),
    }
}

/// Every schema in the document (components, parameters, headers, media types), for the
/// structural checks.
fn all_schemas(v: &Value, out: &mut Vec<Value>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == "schema" {
                    out.push(x.clone());
                }
                all_schemas(x, out);
            }
        }
        Value::Array(xs) => xs.iter().for_each(|x| all_schemas(x, out)),
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------
// A small regular-expression matcher for `pattern`: anchors `^…$`, literals, `\`-escapes,
// `.`, bracket classes with ranges and negation, and the quantifiers `* + ? {n} {n,}
// {n,m}`. Anything else in a pattern fails the test instead of being guessed at.

#[derive(Debug)]
enum Atom {
    Char(char),
    Any,
    Class(bool, Vec<(char, char)>),
}

impl Atom {
    fn matches(&self, c: char) -> bool {
        match self {
            Atom::Char(x) => *x == c,
            Atom::Any => true,
            Atom::Class(negated, ranges) => {
                ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&c)) != *negated
            }
        }
    }
}

struct Pattern(Vec<(Atom, usize, usize)>);

impl Pattern {
    fn new(p: &str) -> Pattern {
        let inner = p
            .strip_prefix('^')
            .and_then(|p| p.strip_suffix('$'))
            .unwrap_or_else(|| panic!("patterns are anchored ^…$: {p}"));
        let chars: Vec<char> = inner.chars().collect();
        let mut items = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            let atom = match chars[i] {
                '\\' => {
                    i += 1;
                    Atom::Char(chars[i])
                }
                '.' => Atom::Any,
                '[' => {
                    i += 1;
                    let negated = chars[i] == '^';
                    if negated {
                        i += 1;
                    }
                    let mut ranges = Vec::new();
                    while chars[i] != ']' {
                        let lo = chars[i];
                        if chars.get(i + 1) == Some(&'-') && chars.get(i + 2) != Some(&']') {
                            ranges.push((lo, chars[i + 2]));
                            i += 3;
                        } else {
                            ranges.push((lo, lo));
                            i += 1;
                        }
                    }
                    Atom::Class(negated, ranges)
                }
                c if "()|^$".contains(c) => panic!("pattern syntax {c} is not supported: {p}"),
                c => Atom::Char(c),
            };
            i += 1;
            let (min, max) = match chars.get(i) {
                Some('*') => (0, usize::MAX),
                Some('+') => (1, usize::MAX),
                Some('?') => (0, 1),
                Some('{') => {
                    let end = i + chars[i..].iter().position(|&c| c == '}').unwrap();
                    let spec: String = chars[i + 1..end].iter().collect();
                    i = end;
                    match spec.split_once(',') {
                        None => (spec.parse().unwrap(), spec.parse().unwrap()),
                        Some((lo, "")) => (lo.parse().unwrap(), usize::MAX),
                        Some((lo, hi)) => (lo.parse().unwrap(), hi.parse().unwrap()),
                    }
                }
                _ => {
                    items.push((atom, 1, 1));
                    continue;
                }
            };
            i += 1;
            items.push((atom, min, max));
        }
        Pattern(items)
    }

    fn is_match(&self, text: &str) -> bool {
        let chars: Vec<char> = text.chars().collect();
        Self::from(&self.0, &chars)
    }

    fn from(items: &[(Atom, usize, usize)], text: &[char]) -> bool {
        let Some(((atom, min, max), rest)) = items.split_first() else {
            return text.is_empty();
        };
        let mut n = 0;
        while n < *max && n < text.len() && atom.matches(text[n]) {
            n += 1;
        }
        (*min..=n).rev().any(|k| Self::from(rest, &text[k..]))
    }
}

#[test]
fn the_pattern_matcher_reads_the_patterns_used() {
    let p = Pattern::new("^[a-z0-9-]+:h[1-6]-[a-z0-9-]+-[0-9]{4,}$");
    assert!(p.is_match("notes-a-md:h1-intro-0001"));
    assert!(p.is_match("note:h6-heading-12345"));
    assert!(!p.is_match("notes:h7-intro-0001"));
    assert!(!p.is_match("notes:h1-intro-001"));
    assert!(!p.is_match("Notes:h1-intro-0001"));
    let p = Pattern::new("^Upstream [0-9]{3}$");
    assert!(p.is_match("Upstream 500"));
    assert!(!p.is_match("Upstream 5000"));
    assert!(!p.is_match("Upstream 50"));
    let p = Pattern::new("^[A-Za-z0-9_-]{1,64}$");
    assert!(p.is_match("default"));
    assert!(!p.is_match(""));
    assert!(!p.is_match(&"a".repeat(65)));
    assert!(!p.is_match("a b"));
}

// ---------------------------------------------------------------------------------------
// One answer, checked against the document

/// A whole answer, whichever way it came (client, raw HTTP/1, HTTP/2).
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

impl From<client::Collected> for Answer {
    fn from(c: client::Collected) -> Answer {
        Answer {
            status: c.status.as_u16(),
            headers: c.headers,
            body: c.body,
        }
    }
}

/// What the document promises, and what the run has shown of it.
struct Checker {
    doc: Value,
    /// (documented path, method, status) seen.
    statuses: BTreeSet<(String, String, String)>,
    /// (documented path, method, status, `oneOf` alternative) seen.
    bodies: BTreeSet<(String, String, String, usize)>,
}

impl Checker {
    fn new() -> Checker {
        Checker {
            doc: document(),
            statuses: BTreeSet::new(),
            bodies: BTreeSet::new(),
        }
    }

    fn operation(&self, path: &str, method: &str) -> &Value {
        let item = self.doc["paths"]
            .get(path)
            .unwrap_or_else(|| panic!("{path} is not a documented path"));
        resolve(&self.doc, item)
            .get(method)
            .unwrap_or_else(|| panic!("{method} {path} is not documented"))
    }

    /// Checks one answer to `method` on the documented `path` and records what it showed.
    fn check(&mut self, path: &str, method: &str, a: &Answer) {
        let doc = self.doc.clone();
        let what = format!("{} {path} → {}", method.to_uppercase(), a.status);
        let op = self.operation(path, method);
        let status = a.status.to_string();
        let response = op["responses"]
            .get(&status)
            .map(|r| resolve(&doc, r))
            .unwrap_or_else(|| panic!("{what}: status not documented for this operation"));
        // Headers: every one documented (Date aside), the required ones present.
        let headers = response.get("headers").and_then(Value::as_object);
        let documented =
            |name: &str| headers.and_then(|h| h.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)));
        for name in a.headers.keys() {
            let name = name.as_str();
            if name == "date" || name == "content-type" {
                continue;
            }
            let (_, h) = documented(name)
                .unwrap_or_else(|| panic!("{what}: header {name} is not documented"));
            let h = resolve(&doc, h);
            let values: Vec<_> = a.headers.get_all(name).iter().collect();
            assert_eq!(
                values.len(),
                1,
                "{what}: header {name} appears more than once"
            );
            let text = values[0].to_str().expect("visible ASCII");
            let schema = resolve(&doc, &h["schema"]);
            let numeric = schema.get("type").and_then(Value::as_str) == Some("integer")
                || schema.get("const").is_some_and(Value::is_number);
            let value = if numeric {
                text.parse::<i64>()
                    .map(Value::from)
                    .unwrap_or_else(|_| Value::String(text.to_owned()))
            } else {
                Value::String(text.to_owned())
            };
            if let Err(e) = validate(&doc, schema, &value, &format!("{what}: header {name}")) {
                panic!("{e}");
            }
        }
        for (name, h) in headers.into_iter().flatten() {
            let h = resolve(&doc, h);
            if h.get("required") == Some(&Value::Bool(true)) {
                assert!(
                    a.headers.contains_key(name.as_str()),
                    "{what}: required header {name} missing"
                );
            }
        }
        // Content: Content-Type names a documented media type, and the body fits it.
        let content = response.get("content").and_then(Value::as_object);
        let content_type = a.header("content-type");
        let media = match (content, content_type) {
            (None, None) => None,
            (None, Some(ct)) => {
                panic!("{what}: Content-Type {ct} on an answer documented without content")
            }
            (Some(_), None) => panic!("{what}: no Content-Type"),
            (Some(c), Some(ct)) => Some(
                c.iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(ct))
                    .map(|(_, m)| m)
                    .unwrap_or_else(|| panic!("{what}: Content-Type {ct} is not documented")),
            ),
        };
        let key = (path.to_owned(), method.to_owned(), status.clone());
        match media.filter(|_| method != "head") {
            None => assert!(a.body.is_empty(), "{what}: a body where none is documented"),
            Some(media) => {
                let schema = resolve(&doc, &media["schema"]);
                let body: Value = serde_json::from_slice(&a.body)
                    .unwrap_or_else(|e| panic!("{what}: body is not JSON: {e}"));
                if let Err(e) = validate(&doc, schema, &body, &what) {
                    panic!("{e}");
                }
                let branch = if schema.get("oneOf").is_some() {
                    one_of(&doc, schema, &body, &what).unwrap()
                } else {
                    0
                };
                self.bodies
                    .insert((key.0.clone(), key.1.clone(), key.2.clone(), branch));
            }
        }
        self.statuses.insert(key);
    }

    /// Every documented status of every operation, and every alternative body of every
    /// GET answer, was seen.
    fn assert_everything_shown(&self) {
        let doc = &self.doc;
        let mut missing = Vec::new();
        for path in doc["paths"].as_object().unwrap().keys() {
            for method in METHODS {
                let Some(op) = resolve(doc, &doc["paths"][path]).get(method) else {
                    continue;
                };
                for (status, response) in op["responses"].as_object().unwrap() {
                    let key = (path.clone(), method.to_owned(), status.clone());
                    if !self.statuses.contains(&key) {
                        missing.push(format!("{} {path} {status}", method.to_uppercase()));
                        continue;
                    }
                    if method != "get" {
                        continue;
                    }
                    let response = resolve(doc, response);
                    for media in response
                        .get("content")
                        .and_then(Value::as_object)
                        .into_iter()
                        .flatten()
                        .map(|(_, m)| m)
                    {
                        let schema = resolve(doc, &media["schema"]);
                        let n = schema
                            .get("oneOf")
                            .and_then(Value::as_array)
                            .map_or(1, Vec::len);
                        for branch in 0..n {
                            let k = (key.0.clone(), key.1.clone(), key.2.clone(), branch);
                            if !self.bodies.contains(&k) {
                                missing.push(format!(
                                    "GET {path} {status}, body alternative {branch}"
                                ));
                            }
                        }
                    }
                }
            }
        }
        assert!(
            missing.is_empty(),
            "documented but never answered: {missing:#?}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// The sidecar and its upstreams

struct Env {
    _gateway: MockGateway,
    canister: Option<MockCanister>,
    bridge: Option<MockBridge>,
    sidecar: Running,
}

impl Env {
    /// The main sidecar: canister, bridge, configured CORS origins, one slot per user
    /// and a small burst, so every answer can be provoked.
    async fn main() -> Env {
        let canister = MockCanister::start().await;
        let bridge = MockBridge::start().await;
        let note = "# A\n\nText.\n\n## B\n\nMore.\n";
        for path in [
            "a.md",
            "slow.md",
            "forbidden.md",
            "broken.md",
            "notjson.md",
            "null.md",
        ] {
            canister.insert_note("default", path, &json!({"title": "A"}), note);
        }
        canister.set_override(
            "slow.md",
            CanisterOverride::new().delay(Duration::from_millis(800)),
        );
        canister.set_override("forbidden.md", CanisterOverride::new().status(403));
        canister.set_override("broken.md", CanisterOverride::new().status(500));
        canister.set_override("notjson.md", CanisterOverride::new().body("not json"));
        canister.set_override("null.md", CanisterOverride::new().body("null"));
        bridge.set_reply_for_vault("down", Reply::json(500, &json!({"error": "down"})));
        let (canister_url, bridge_url) = (canister.url(), bridge.url());
        Env::start(Some(canister), Some(bridge), |c| {
            c.upstream.canister_url = Some(canister_url);
            c.upstream.bridge_url = Some(bridge_url);
            c.cors.allowed_origins = vec![ORIGIN.to_owned(), "https://other.example".to_owned()];
            c.listen.max_in_flight_per_user = 1;
            c.rate_limit.per_user_per_minute = 60;
            c.rate_limit.burst = 3;
        })
        .await
    }

    /// A sidecar with no canister, no bridge and no CORS origins.
    async fn bare() -> Env {
        Env::start(None, None, |_| {}).await
    }

    async fn start(
        canister: Option<MockCanister>,
        bridge: Option<MockBridge>,
        f: impl FnOnce(&mut Config),
    ) -> Env {
        let gateway = MockGateway::start().await;
        let mut c = Config::default();
        c.listen.address = "127.0.0.1:0".parse().unwrap();
        c.admin.address = "127.0.0.1:0".parse().unwrap();
        c.upstream.gateway_url = gateway.url();
        c.auth.jwt_secrets = vec![Secret::new(SECRET)];
        c.shutdown.drain_seconds = 1;
        c.log.level = "warn".to_owned();
        f(&mut c);
        let sidecar = proxy::start(c).await.expect("sidecar starts");
        Env {
            _gateway: gateway,
            canister,
            bridge,
            sidecar,
        }
    }

    fn addr(&self) -> SocketAddr {
        self.sidecar.listen_addr
    }

    async fn send(&self, method: &str, target: &str, headers: &[(&str, &str)]) -> Answer {
        let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
        let url = format!("http://{}{target}", self.addr());
        let (addr, req) = client::request(method, &url, headers, Bytes::new()).unwrap();
        client::send(addr, req).await.unwrap().into()
    }

    /// HTTP/1 with both `Content-Length` and `Transfer-Encoding`, over a raw socket.
    async fn send_ambiguous(&self, method: &str, target: &str) -> Answer {
        let request = format!(
            "{} {target} HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            method.to_uppercase()
        );
        let raw = client::raw_exchange(self.addr(), request.as_bytes(), Duration::from_secs(5))
            .await
            .unwrap();
        parse_raw(&raw)
    }

    /// HTTP/2 (prior knowledge) with more than `listen.max_headers` headers. `Err` when
    /// the answer broke HTTP/2's rules (the client reset the stream).
    async fn send_h2_many_headers(&self, method: &str, target: &str) -> Result<Answer, String> {
        let stream = TcpStream::connect(self.addr()).await.unwrap();
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        let mut req = Request::builder()
            .method(Method::from_bytes(method.to_uppercase().as_bytes()).unwrap())
            .uri(format!("http://{}{target}", self.addr()));
        for i in 0..120 {
            req = req.header(format!("x-filler-{i}"), "1");
        }
        let resp = sender
            .send_request(req.body(Empty::<Bytes>::new()).unwrap())
            .await
            .unwrap();
        let (parts, body) = resp.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| {
                format!(
                    "{method} {target} over HTTP/2 answered {}: {e:?}",
                    parts.status
                )
            })?
            .to_bytes();
        Ok(Answer {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
        })
    }
}

/// Status, headers and body of one raw HTTP/1 answer.
fn parse_raw(raw: &[u8]) -> Answer {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a whole response head");
    let head = std::str::from_utf8(&raw[..end]).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let mut headers = HeaderMap::new();
    for line in lines {
        let (k, v) = line.split_once(':').unwrap();
        headers.append(
            HeaderName::from_bytes(k.trim().as_bytes()).unwrap(),
            HeaderValue::from_str(v.trim()).unwrap(),
        );
    }
    Answer {
        status,
        headers,
        body: Bytes::copy_from_slice(&raw[end + 4..]),
    }
}

static USERS: AtomicUsize = AtomicUsize::new(0);

/// A fresh user, so that no rate limit or cache carries over between cases.
fn user() -> String {
    format!("user-{}", USERS.fetch_add(1, Ordering::SeqCst))
}

fn bearer(sub: &str) -> String {
    format!(
        "Bearer {}",
        sign_token(SECRET, session_claims(sub, Duration::from_secs(3600)))
    )
}

fn agent_bearer(sub: &str, vaults: &[&str]) -> String {
    let claims = json!({
        "sub": sub,
        "type": "agent_access",
        "aud": "knowtation-hub-rest",
        "typ": "kt_agent_access",
        "vault_ids": vaults,
        "exp": unix_now() + 3600,
    });
    format!("Bearer {}", sign_token(SECRET, claims))
}

// ---------------------------------------------------------------------------------------
// The run

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_is_documented_and_every_documented_answer_happens() {
    let mut checker = Checker::new();
    // Answers that broke the protocol itself, reported before what they left unseen.
    let mut defects: Vec<String> = Vec::new();
    let env = Env::main().await;
    let bare = Env::bare().await;

    for path in [REST, NETLIFY, OUTLINE, OUTLINE_NETLIFY] {
        let outline = path.ends_with("note-outline");
        for method in ["get", "head"] {
            let q = |note: &str| format!("{path}?path={note}");
            let mut expect = |a: Answer, status: u16, code: Option<&str>| {
                assert_eq!(a.status, status, "{method} {path}: {:?}", a.body);
                if let (Some(code), "get") = (code, method) {
                    assert_eq!(a.json()["code"], code, "{method} {path}");
                }
                checker.check(path, method, &a);
                a
            };
            let auth = bearer(&user());
            let ok = expect(
                env.send(
                    method,
                    &q("a.md"),
                    &[("authorization", &auth), ("origin", ORIGIN)],
                )
                .await,
                200,
                None,
            );
            assert_eq!(ok.header("access-control-allow-origin"), Some(ORIGIN));
            if method == "get" {
                let doc = ok.json();
                assert_eq!(doc["path"], "a.md");
                let list = if outline { "headings" } else { "sections" };
                assert_eq!(doc[list].as_array().unwrap().len(), 2, "{path}");
            } else {
                let get = env
                    .send("get", &q("a.md"), &[("authorization", &bearer(&user()))])
                    .await;
                assert_eq!(
                    ok.header("content-length"),
                    Some(get.body.len().to_string().as_str())
                );
            }
            // No ETag, so no 304 (wire contract §5 Deviation).
            let auth = bearer(&user());
            let cached = expect(
                env.send(
                    method,
                    &q("a.md"),
                    &[("authorization", &auth), ("if-none-match", "*")],
                )
                .await,
                200,
                None,
            );
            assert!(cached.header("etag").is_none());

            let auth = bearer(&user());
            expect(
                env.send(method, &q("../x.md"), &[("authorization", &auth)])
                    .await,
                400,
                Some("INVALID_PATH"),
            );
            let auth = bearer(&user());
            expect(
                env.send(
                    method,
                    &q("a.md"),
                    &[("authorization", &auth), ("x-vault-id", "no such vault")],
                )
                .await,
                400,
                Some("INVALID_VAULT"),
            );
            let framing = expect(
                env.send_ambiguous(method, &q("a.md")).await,
                400,
                Some("BAD_REQUEST"),
            );
            assert_eq!(framing.header("connection"), Some("close"));

            expect(
                env.send(method, &q("a.md"), &[]).await,
                401,
                Some("UNAUTHORIZED"),
            );

            let auth = agent_bearer(&user(), &["elsewhere"]);
            expect(
                env.send(method, &q("a.md"), &[("authorization", &auth)])
                    .await,
                403,
                Some("AGENT_VAULT_FORBIDDEN"),
            );
            let auth = bearer(&user());
            expect(
                env.send(
                    method,
                    &q("a.md"),
                    &[("authorization", &auth), ("x-vault-id", "other")],
                )
                .await,
                403,
                Some("FORBIDDEN"),
            );
            let auth = bearer(&user());
            expect(
                env.send(method, &q("forbidden.md"), &[("authorization", &auth)])
                    .await,
                403,
                Some("FORBIDDEN"),
            );

            let auth = bearer(&user());
            expect(
                env.send(method, &q("missing.md"), &[("authorization", &auth)])
                    .await,
                404,
                Some("NOT_FOUND"),
            );

            // The burst is 3: the fourth request in a row is refused.
            let auth = bearer(&user());
            let mut limited = None;
            for _ in 0..10 {
                let a = env
                    .send(method, &q("a.md"), &[("authorization", &auth)])
                    .await;
                if a.status == 429 {
                    limited = Some(a);
                    break;
                }
                expect(a, 200, None);
            }
            let limited = expect(
                limited.expect("the rate limit answers 429"),
                429,
                Some("RATE_LIMITED"),
            );
            assert!(limited.header("retry-after").is_some());

            match env.send_h2_many_headers(method, &q("a.md")).await {
                Ok(a) => {
                    let a = expect(a, 431, Some("HEADERS_TOO_LARGE"));
                    assert!(a.header("access-control-allow-origin").is_none());
                }
                Err(e) => defects.push(e),
            }

            let auth = bearer(&user());
            expect(
                env.send(method, &q("broken.md"), &[("authorization", &auth)])
                    .await,
                502,
                Some("BAD_GATEWAY"),
            );
            let auth = bearer(&user());
            expect(
                env.send(method, &q("notjson.md"), &[("authorization", &auth)])
                    .await,
                502,
                Some("BAD_GATEWAY"),
            );
            let auth = bearer(&user());
            expect(
                env.send(method, &q("null.md"), &[("authorization", &auth)])
                    .await,
                502,
                Some("BAD_GATEWAY"),
            );

            // One slot per user: while one request waits for the canister, the next gets 503.
            let auth = bearer(&user());
            let canister = env.canister.as_ref().unwrap();
            let slow_reads = || {
                canister
                    .requests()
                    .iter()
                    .filter(|r| r.path().ends_with("slow.md"))
                    .count()
            };
            let before = slow_reads();
            let slow = {
                let (addr, target, auth) = (env.addr(), q("slow.md"), auth.clone());
                tokio::spawn(async move {
                    let url = format!("http://{addr}{target}");
                    let (a, req) = client::request(
                        Method::GET,
                        &url,
                        &[("authorization", &auth)],
                        Bytes::new(),
                    )
                    .unwrap();
                    client::send(a, req).await.unwrap().status
                })
            };
            let deadline = Instant::now() + Duration::from_secs(5);
            while slow_reads() == before {
                assert!(
                    Instant::now() < deadline,
                    "the slow read never reached the canister"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let overloaded = expect(
                env.send(method, &q("a.md"), &[("authorization", &auth)])
                    .await,
                503,
                Some("SERVICE_UNAVAILABLE"),
            );
            assert_eq!(overloaded.header("retry-after"), Some("1"));
            assert_eq!(slow.await.unwrap(), 200);

            let auth = bearer(&user());
            let down = expect(
                env.send(
                    method,
                    &q("a.md"),
                    &[("authorization", &auth), ("x-vault-id", "down")],
                )
                .await,
                503,
                Some("SERVICE_UNAVAILABLE"),
            );
            assert!(down.header("retry-after").is_none());
            assert!(env.bridge.as_ref().unwrap().count() > 0);

            let auth = bearer(&user());
            let unconfigured = expect(
                bare.send(
                    method,
                    &q("a.md"),
                    &[("authorization", &auth), ("origin", ORIGIN)],
                )
                .await,
                503,
                Some("SERVICE_UNAVAILABLE"),
            );
            assert_eq!(
                unconfigured.header("access-control-allow-origin"),
                Some("*")
            );
            assert!(unconfigured.header("vary").is_none());
        }

        // OPTIONS: the preflight, with listed, stranger and no configured origins.
        let target = format!("{path}?path=a.md");
        let mut expect = |a: Answer, status: u16| {
            assert_eq!(a.status, status, "OPTIONS {path}: {:?}", a.body);
            checker.check(path, "options", &a);
            a
        };
        let listed = expect(
            env.send("options", &target, &[("origin", "https://other.example")])
                .await,
            204,
        );
        assert_eq!(
            listed.header("access-control-allow-origin"),
            Some("https://other.example")
        );
        let stranger = expect(
            env.send("options", &target, &[("origin", "https://evil.example")])
                .await,
            204,
        );
        assert_eq!(stranger.header("access-control-allow-origin"), Some(ORIGIN));
        let star = expect(
            bare.send("options", &target, &[("origin", ORIGIN)]).await,
            204,
        );
        assert_eq!(star.header("access-control-allow-origin"), Some("*"));
        expect(env.send_ambiguous("options", &target).await, 400);
        match env.send_h2_many_headers("options", &target).await {
            Ok(a) => drop(expect(a, 431)),
            Err(e) => defects.push(e),
        }
    }

    // Other spellings of the route reach the same handler (a superset of Express's
    // matching) and answer as documented for the canonical path.
    for (spelling, documented) in [
        ("/API/V1/Section-Source/", REST),
        ("/api/v1/section%2Dsource", REST),
        ("/api//v1/./section-source", REST),
        (
            "/.netlify/functions/gateway/.netlify/functions/gateway/api/v1/section-source",
            NETLIFY,
        ),
        (
            "/.NETLIFY/functions/gateway/api/v1/section-source/",
            NETLIFY,
        ),
        ("/API/V1/Note-Outline/", OUTLINE),
        ("/api/v1/note%2Doutline", OUTLINE),
        ("/api//v1/./note-outline", OUTLINE),
        (
            "/.netlify/functions/gateway/.netlify/functions/gateway/api/v1/note-outline",
            OUTLINE_NETLIFY,
        ),
    ] {
        let auth = bearer(&user());
        let a = env
            .send(
                "get",
                &format!("{spelling}?path=a.md"),
                &[("authorization", &auth)],
            )
            .await;
        assert_eq!(a.status, 200, "{spelling}");
        checker.check(documented, "get", &a);
    }

    assert!(
        defects.is_empty(),
        "answers that break HTTP itself (a HEAD answer carries no content, RFC 9110 §9.3.2): {defects:#?}"
    );
    checker.assert_everything_shown();
}

// ---------------------------------------------------------------------------------------
// The document itself

#[test]
fn the_document_is_openapi_3_1_for_this_version_with_closed_objects() {
    let doc = document();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1."));
    assert_eq!(
        doc["info"]["version"],
        env!("CARGO_PKG_VERSION"),
        "info.version"
    );
    let paths: BTreeSet<&str> = doc["paths"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        paths,
        BTreeSet::from([REST, NETLIFY, OUTLINE, OUTLINE_NETLIFY]),
        "the documented paths"
    );
    // The success shape is the allowlist: exactly these fields, nothing more.
    let names = |schema: &str| -> BTreeSet<String> {
        let s = &doc["components"]["schemas"][schema];
        let required: BTreeSet<String> = s["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_str().unwrap().to_owned())
            .collect();
        let properties: BTreeSet<String> = s["properties"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        assert_eq!(required, properties, "{schema}: every field is required");
        properties
    };
    let set = |names: &[&str]| {
        names
            .iter()
            .map(|n| (*n).to_owned())
            .collect::<BTreeSet<_>>()
    };
    assert_eq!(
        names("SectionSource"),
        set(&["schema", "path", "title", "sections", "truncated"])
    );
    assert_eq!(
        names("NoteOutline"),
        set(&["schema", "path", "title", "headings", "truncated"])
    );
    assert_eq!(names("OutlineHeading"), set(&["level", "text", "id"]));
    assert_eq!(
        names("Section"),
        set(&[
            "section_id",
            "heading_id",
            "level",
            "heading_path",
            "heading_text",
            "child_section_ids",
            "body_available",
            "body_returned",
            "snippet_returned",
        ])
    );
    // Every object schema is closed, and every keyword is one the checker understands.
    let mut schemas = Vec::new();
    all_schemas(&doc, &mut schemas);
    for s in doc["components"]["schemas"].as_object().unwrap().values() {
        schemas.push(s.clone());
    }
    let mut stack = schemas;
    while let Some(s) = stack.pop() {
        let s = resolve(&doc, &s).clone();
        let Some(m) = s.as_object() else { continue };
        for key in m.keys() {
            assert!(
                KEYWORDS.contains(&key.as_str()) || ANNOTATIONS.contains(&key.as_str()),
                "schema keyword {key} is not checked by this test"
            );
        }
        if m.get("type") == Some(&json!("object")) {
            assert_eq!(
                m.get("additionalProperties"),
                Some(&json!(false)),
                "an open object: {s}"
            );
        }
        if let Some(p) = m.get("pattern").and_then(Value::as_str) {
            Pattern::new(p);
        }
        stack.extend(
            m.get("properties")
                .and_then(Value::as_object)
                .into_iter()
                .flat_map(|p| p.values().cloned()),
        );
        stack.extend(m.get("items").cloned());
        stack.extend(
            m.get("oneOf")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .cloned(),
        );
    }
    // The operations: GET and HEAD need the bearer token, OPTIONS does not.
    for path in [REST, OUTLINE] {
        let item = resolve(&doc, &doc["paths"][path]);
        for method in ["get", "head"] {
            assert_eq!(
                item[method]["security"],
                json!([{"bearerAuth": []}]),
                "{path} {method}"
            );
        }
        assert_eq!(item["options"]["security"], json!([]), "{path}");
    }
    let scheme = &doc["components"]["securitySchemes"]["bearerAuth"];
    assert_eq!(
        (scheme["type"].as_str(), scheme["scheme"].as_str()),
        (Some("http"), Some("bearer"))
    );
}
