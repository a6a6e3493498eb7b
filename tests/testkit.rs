//! The mock upstreams themselves: many other tests rely on them behaving like the real
//! canister (wire contract §4), bridge (§2) and gateway (§6, §7), and on their records.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed unwrap is a failed test

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;
use http_body_util::{BodyExt, Full};
use knowtation_testkit::client::{self, Collected};
use knowtation_testkit::{
    big_body, session_claims, sign_token, sign_token_alg, CanisterOverride, MockBridge,
    MockCanister, MockGateway, Reply, VaultError,
};
use serde_json::{json, Value};

const SECRET_MARK: &str = "DEMO-SECRET-BODY-TEXT";

async fn get(url: &str, headers: &[(&str, &str)]) -> Collected {
    client::get(url, headers).await.unwrap()
}

async fn send(method: Method, url: &str, headers: &[(&str, &str)], body: &str) -> Collected {
    let (addr, req) = client::request(method, url, headers, body.to_owned()).unwrap();
    client::send(addr, req).await.unwrap()
}

fn example_vault() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/demo/vault")
}

/// A fresh scratch folder under the system temp dir.
fn scratch_dir() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "ks-testkit-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

// ---------------------------------------------------------------------------------------
// Canister (wire contract §4)

#[tokio::test]
async fn s4_canister_serves_the_stored_note_shape() {
    let c = MockCanister::start().await;
    c.insert_note(
        "default",
        "inbox/hello world.md",
        &json!({"title": "Hello", "tags": ["a", "b"]}),
        "# Hello\n\nbody",
    );
    let url = format!("{}/api/v1/notes/inbox%2Fhello%20world.md", c.url());
    let r = get(
        &url,
        &[("x-vault-id", "default"), ("accept", "application/json")],
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    // Field order and the frontmatter as a JSON string, as the canister writes them.
    assert!(r
        .text()
        .starts_with(r#"{"path":"inbox/hello world.md","frontmatter":"{"#));
    let note = r.json();
    assert_eq!(note["path"], "inbox/hello world.md");
    assert_eq!(note["body"], "# Hello\n\nbody");
    let fm: Value = serde_json::from_str(note["frontmatter"].as_str().unwrap()).unwrap();
    assert_eq!(fm, json!({"title": "Hello", "tags": ["a", "b"]}));
    assert_eq!(
        Some(r.body.clone()),
        c.stored_json("default", "inbox/hello world.md")
    );

    let reqs = c.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(c.count(), 1);
    assert_eq!(reqs[0].method, Method::GET);
    assert_eq!(
        reqs[0].uri.to_string(),
        "/api/v1/notes/inbox%2Fhello%20world.md"
    );
    assert_eq!(reqs[0].header("x-vault-id"), Some("default"));
    assert_eq!(reqs[0].header("accept"), Some("application/json"));
    assert!(reqs[0].body.is_empty());
}

#[tokio::test]
async fn s4_canister_404_for_unknown_note_or_vault() {
    let c = MockCanister::start().await;
    c.insert_note("default", "a.md", &json!({}), "x");
    c.insert_note("team", "b.md", &json!({}), "y");
    c.create_vault("empty");
    let note = |p: &str| format!("{}/api/v1/notes/{p}", c.url());

    let r = get(&note("missing.md"), &[("x-vault-id", "default")]).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json(), json!({"error": "Not found", "code": "NOT_FOUND"}));
    assert_eq!(
        get(&note("a.md"), &[("x-vault-id", "nope")]).await.status,
        404
    );
    assert_eq!(
        get(&note("a.md"), &[("x-vault-id", "team")]).await.status,
        404
    );
    assert_eq!(
        get(&note("a.md"), &[("x-vault-id", "empty")]).await.status,
        404
    );
    assert_eq!(
        get(&note("b.md"), &[("x-vault-id", "team")]).await.status,
        200
    );
    // Trimmed, and `default` when absent.
    assert_eq!(
        get(&note("a.md"), &[("x-vault-id", " default ")])
            .await
            .status,
        200
    );
    assert_eq!(get(&note("a.md"), &[]).await.status, 200);
    assert_eq!(c.count(), 7);

    assert!(c.remove_note("default", "a.md"));
    assert!(!c.remove_note("default", "a.md"));
    assert_eq!(get(&note("a.md"), &[]).await.status, 404);
    assert_eq!(c.note_paths("team"), ["b.md"]);
}

#[tokio::test]
async fn s4_canister_403_for_a_wrong_gateway_secret() {
    let c = MockCanister::start().await;
    c.insert_note("default", "a.md", &json!({}), "x");
    c.set_gateway_secret(Some("s3cret"));
    let url = format!("{}/api/v1/notes/a.md", c.url());
    let r = get(&url, &[]).await;
    assert_eq!(r.status, 403);
    assert_eq!(r.json(), json!({"error": "Forbidden", "code": "FORBIDDEN"}));
    assert_eq!(get(&url, &[("x-gateway-auth", "wrong")]).await.status, 403);
    assert_eq!(get(&url, &[("x-gateway-auth", "S3CRET")]).await.status, 403);
    assert_eq!(get(&url, &[("x-gateway-auth", "s3cret")]).await.status, 200);
    c.set_gateway_secret(None);
    assert_eq!(get(&url, &[]).await.status, 200);
    assert_eq!(c.count(), 5);
}

#[tokio::test]
async fn s4_canister_overrides_status_body_and_delay() {
    let c = MockCanister::start().await;
    c.insert_note("default", "a.md", &json!({"title": "A"}), "secret body");
    let url = format!("{}/api/v1/notes/a.md", c.url());
    let stored = c.stored_json("default", "a.md").unwrap();

    // Status alone keeps the note body: a sidecar must not forward it.
    c.set_override("a.md", CanisterOverride::new().status(500));
    let r = get(&url, &[]).await;
    assert_eq!((r.status.as_u16(), r.body.clone()), (500, stored.clone()));

    // Raw bytes alone keep the status (200 for a stored note, 404 otherwise).
    c.set_override("a.md", CanisterOverride::new().body("not json"));
    let r = get(&url, &[]).await;
    assert_eq!((r.status.as_u16(), r.text()), (200, "not json".to_owned()));
    assert_eq!(r.header("content-type"), Some("application/json"));
    c.set_override("ghost.md", CanisterOverride::new().status(200).body("null"));
    let r = get(&format!("{}/api/v1/notes/ghost.md", c.url()), &[]).await;
    assert_eq!((r.status.as_u16(), r.text()), (200, "null".to_owned()));
    c.set_override("a.md", CanisterOverride::new().status(200).body(""));
    let r = get(&url, &[]).await;
    assert_eq!((r.status.as_u16(), r.body.len()), (200, 0));

    // A redirect is just a status (the sidecar must not follow it).
    c.set_override("a.md", CanisterOverride::new().status(302));
    assert_eq!(get(&url, &[]).await.status, 302);

    c.set_override(
        "a.md",
        CanisterOverride::new().delay(Duration::from_millis(300)),
    );
    let t = Instant::now();
    let r = get(&url, &[]).await;
    assert!(t.elapsed() >= Duration::from_millis(300));
    assert_eq!((r.status.as_u16(), r.body.clone()), (200, stored.clone()));

    c.clear_override("a.md");
    c.set_delay(Duration::from_millis(200));
    let t = Instant::now();
    assert_eq!(get(&url, &[]).await.status, 200);
    assert!(t.elapsed() >= Duration::from_millis(200));
    c.set_delay(Duration::ZERO);
    let r = get(&url, &[]).await;
    assert_eq!((r.status.as_u16(), r.body.clone()), (200, stored));
}

#[tokio::test]
async fn s4_canister_stall_body_delays_the_second_half() {
    let c = MockCanister::start().await;
    c.insert_note("default", "a.md", &json!({}), &"x".repeat(1000));
    c.set_override(
        "a.md",
        CanisterOverride::new().stall_body(Duration::from_millis(400)),
    );
    let stored = c.stored_json("default", "a.md").unwrap();
    let (addr, req) = client::request(
        Method::GET,
        &format!("{}/api/v1/notes/a.md", c.url()),
        &[],
        Bytes::new(),
    )
    .unwrap();
    let t = Instant::now();
    let resp = client::open(addr, req).await.unwrap();
    let head_at = t.elapsed();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-length"].to_str().unwrap(),
        stored.len().to_string()
    );
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    // Lower bounds only, so a loaded machine cannot make this flaky: the head came
    // first, then the body took at least the stall.
    let body_wait = t.elapsed() - head_at;
    assert!(body_wait >= Duration::from_millis(350), "{body_wait:?}");
    assert_eq!(body, stored);
}

#[tokio::test]
async fn s4_canister_answers_only_single_note_reads() {
    let c = MockCanister::start().await;
    c.insert_note("default", "a.md", &json!({}), "x");
    let base = c.url();

    let r = send(
        Method::POST,
        &format!("{base}/api/v1/notes/a.md"),
        &[],
        "{}",
    )
    .await;
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("GET"));
    assert_eq!(get(&format!("{base}/api/v1/notes"), &[]).await.status, 404);
    assert_eq!(get(&format!("{base}/api/v1/notes/"), &[]).await.status, 404);
    assert_eq!(
        get(&format!("{base}/api/v1/search?q=x"), &[]).await.status,
        404
    );
    assert_eq!(
        get(&format!("{base}/api/v1/notes/%zz"), &[]).await.status,
        400
    );
    assert_eq!(get(&format!("{base}/health"), &[]).await.status, 200);
    // A literal `/` still finds the note; tests catch wrong encoding from the record.
    c.insert_note("default", "dir/b.md", &json!({}), "y");
    assert_eq!(
        get(&format!("{base}/api/v1/notes/dir/b.md"), &[])
            .await
            .status,
        200
    );
    assert_eq!(
        get(&format!("{base}/api/v1/notes/dir%2fb.md"), &[])
            .await
            .status,
        200
    );
    let uris: Vec<String> = c.requests().iter().map(|r| r.uri.to_string()).collect();
    assert_eq!(
        uris[uris.len() - 2..],
        ["/api/v1/notes/dir/b.md", "/api/v1/notes/dir%2fb.md"]
    );
}

#[tokio::test]
async fn s4_canister_loads_the_example_vault() {
    let c = MockCanister::start().await;
    let n = c.load_vault("default", &example_vault()).unwrap();
    let paths = c.note_paths("default");
    assert_eq!(n, paths.len());
    assert!((4..=6).contains(&n), "{paths:?}");
    assert!(paths.contains(&"projects/sidecar-rollout.md".to_owned()));
    assert!(paths.contains(&"inbox/reading list.md".to_owned()));

    let mut marked = 0;
    for p in &paths {
        let note: Value = serde_json::from_slice(&c.stored_json("default", p).unwrap()).unwrap();
        assert_eq!(note["path"], p.as_str());
        let fm: Value = serde_json::from_str(note["frontmatter"].as_str().unwrap()).unwrap();
        assert!(fm.is_object(), "{p}");
        assert!(fm["date"].is_string() && fm["tags"].is_array(), "{p}: {fm}");
        let body = note["body"].as_str().unwrap();
        assert!(!body.starts_with("---") && !body.contains("\ntags:"), "{p}");
        marked += usize::from(body.contains(SECRET_MARK));
    }
    assert!(marked >= 3);

    let note: Value = serde_json::from_slice(
        &c.stored_json("default", "projects/sidecar-rollout.md")
            .unwrap(),
    )
    .unwrap();
    let fm: Value = serde_json::from_str(note["frontmatter"].as_str().unwrap()).unwrap();
    assert_eq!(fm["title"], "Sidecar rollout plan");
    assert_eq!(fm["project"], "sidecar");
    assert_eq!(fm["tags"], json!(["infrastructure", "security"]));
    let body = note["body"].as_str().unwrap();
    assert!(body.starts_with("# Sidecar rollout plan\n"));
    assert!(body.contains("\n# not a heading\n"));

    let untitled: Value =
        serde_json::from_slice(&c.stored_json("default", "inbox/reading list.md").unwrap())
            .unwrap();
    let fm: Value = serde_json::from_str(untitled["frontmatter"].as_str().unwrap()).unwrap();
    assert!(fm.get("title").is_none());

    // Served over HTTP with the space encoded as the gateway encodes it.
    let r = get(
        &format!("{}/api/v1/notes/inbox%2Freading%20list.md", c.url()),
        &[("x-vault-id", "default")],
    )
    .await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn canister_vault_loading_fails_loudly() {
    let c = MockCanister::start().await;
    let dir = scratch_dir();
    std::fs::create_dir_all(dir.join("sub/.hidden")).unwrap();
    std::fs::write(dir.join("ok.md"), "---\ntitle: Ok\n---\n# Ok\n").unwrap();
    std::fs::write(dir.join("sub/plain.md"), "# No frontmatter\n").unwrap();
    std::fs::write(dir.join("sub/.hidden/skip.md"), "---\nbad\n---\n").unwrap();
    std::fs::write(dir.join("notes.txt"), "not markdown").unwrap();
    assert_eq!(c.load_vault("v", &dir).unwrap(), 2);
    assert_eq!(c.note_paths("v"), ["ok.md", "sub/plain.md"]);

    std::fs::write(dir.join("sub/bad.md"), "---\nouter:\n  nested: 1\n---\n").unwrap();
    let err = c.load_vault("w", &dir).unwrap_err();
    assert!(matches!(err, VaultError::Frontmatter { .. }), "{err}");
    assert!(err.to_string().contains("line 3"), "{err}");
    // Nothing of a failed load is kept.
    assert!(c.note_paths("w").is_empty());

    std::fs::write(dir.join("sub/bad.md"), [0xffu8, 0xfe]).unwrap();
    assert!(matches!(
        c.load_vault("w", &dir),
        Err(VaultError::NotUtf8 { .. })
    ));
    assert!(matches!(
        c.load_vault("w", &dir.join("missing")),
        Err(VaultError::Io { .. })
    ));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn canister_insert_markdown_and_raw_frontmatter() {
    let c = MockCanister::start().await;
    c.insert_markdown("default", "m.md", "---\ntitle: M\ntags: [x]\n---\n# M\n")
        .unwrap();
    let note: Value = serde_json::from_slice(&c.stored_json("default", "m.md").unwrap()).unwrap();
    assert_eq!(note["frontmatter"], r#"{"tags":["x"],"title":"M"}"#);
    assert_eq!(note["body"], "# M\n");
    assert!(c
        .insert_markdown("default", "bad.md", "---\n- x\n---\n")
        .is_err());

    c.insert_note_fm_text("default", "odd.md", "{not json", "# B");
    let note: Value = serde_json::from_slice(&c.stored_json("default", "odd.md").unwrap()).unwrap();
    assert_eq!(
        note,
        json!({"path": "odd.md", "frontmatter": "{not json", "body": "# B"})
    );
}

// ---------------------------------------------------------------------------------------
// Recording

#[tokio::test]
async fn requests_are_recorded_exactly_as_received() {
    let g = MockGateway::start().await;
    let raw = concat!(
        "POST /a%2fb/%2E%2e/c?x=%41&y=+&x=2 HTTP/1.1\r\n",
        "Host: example.test\r\n",
        "X-Dup: one\r\n",
        "X-Dup: two\r\n",
        "Content-Length: 5\r\n",
        "Connection: close\r\n",
        "\r\n",
        "hello",
    );
    let out = client::raw_exchange(g.addr(), raw.as_bytes(), Duration::from_secs(5))
        .await
        .unwrap();
    assert!(out.starts_with(b"HTTP/1.1 200 OK\r\n"));
    let reqs = g.requests();
    assert_eq!(reqs.len(), 1);
    let r = &reqs[0];
    assert_eq!(r.method, Method::POST);
    assert_eq!(r.uri.to_string(), "/a%2fb/%2E%2e/c?x=%41&y=+&x=2");
    assert_eq!(r.path(), "/a%2fb/%2E%2e/c");
    assert_eq!(r.query(), Some("x=%41&y=+&x=2"));
    assert_eq!(r.header("host"), Some("example.test"));
    assert_eq!(r.header_all("x-dup"), ["one", "two"]);
    assert_eq!(r.body, Bytes::from_static(b"hello"));
    assert_eq!(r.body_text(), "hello");
    assert_eq!(r.version, http::Version::HTTP_11);
}

#[tokio::test]
async fn count_clear_and_connection_reuse() {
    let c = MockCanister::start().await;
    c.insert_note("default", "a.md", &json!({}), "x");
    // Two requests on one keep-alive connection.
    let stream = tokio::net::TcpStream::connect(c.addr()).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    for _ in 0..2 {
        let req = http::Request::get("/api/v1/notes/a.md")
            .header("host", "canister")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = sender.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        resp.into_body().collect().await.unwrap();
    }
    assert_eq!((c.count(), c.connections()), (2, 1));
    c.clear_requests();
    assert_eq!((c.count(), c.requests().len()), (0, 0));
    get(&format!("{}/health", c.url()), &[]).await;
    assert_eq!((c.count(), c.connections()), (1, 2));
}

#[tokio::test]
async fn oversized_request_bodies_get_413_and_are_counted() {
    let g = MockGateway::start().await;
    let big = vec![b'x'; knowtation_testkit::MAX_RECORDED_BODY_BYTES + 1];
    let (addr, req) =
        client::request(Method::POST, &format!("{}/echo", g.url()), &[], big).unwrap();
    let r = client::send(addr, req).await.unwrap();
    assert_eq!(r.status, 413);
    assert_eq!(g.count(), 1);
    assert!(g.requests()[0].body.is_empty());
}

async fn wait_until_refused(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        assert!(Instant::now() < deadline, "{addr} still accepts after drop");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn dropped_mocks_stop_serving() {
    let c = MockCanister::start().await;
    let b = MockBridge::start().await;
    let g = MockGateway::start().await;
    let addrs = [c.addr(), b.addr(), g.addr()];
    assert_eq!(
        addrs.iter().collect::<std::collections::HashSet<_>>().len(),
        3
    );
    for a in addrs {
        assert!(a.ip().is_loopback() && a.port() != 0);
    }
    assert_eq!(g.url(), format!("http://{}", g.addr()));

    // An open keep-alive connection is closed too.
    let (addr, req) = client::request(
        Method::GET,
        &format!("{}/sse?n=1000&gap_ms=50", g.url()),
        &[],
        Bytes::new(),
    )
    .unwrap();
    let resp = client::open(addr, req).await.unwrap();
    drop((c, b, g));
    for a in addrs {
        wait_until_refused(a).await;
    }
    let rest = tokio::time::timeout(Duration::from_secs(5), resp.into_body().collect()).await;
    assert!(rest.expect("stream ended").is_err());
}

// ---------------------------------------------------------------------------------------
// Bridge (wire contract §2)

#[tokio::test]
async fn s2_bridge_default_answer_and_records() {
    let b = MockBridge::start().await;
    let url = format!("{}/api/v1/hosted-context", b.url());
    let r = get(
        &url,
        &[
            ("authorization", "Bearer abc.def.ghi"),
            ("accept", "application/json"),
            ("x-vault-id", "default"),
        ],
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.json(), MockBridge::default_context());
    assert_eq!(
        r.json(),
        json!({"allowed_vault_ids": ["default"], "scope": null, "role": "editor"})
    );
    get(&url, &[]).await;
    assert_eq!(b.count(), 2);
    assert_eq!(
        b.authorizations(),
        [Some("Bearer abc.def.ghi".to_owned()), None]
    );
    assert_eq!(b.vault_ids(), [Some("default".to_owned()), None]);
    assert_eq!(b.requests()[0].header("accept"), Some("application/json"));
}

#[tokio::test]
async fn s2_bridge_knobs() {
    let b = MockBridge::start().await;
    let url = format!("{}/api/v1/hosted-context", b.url());
    let ctx = json!({"effective_canister_user_id": "owner-1", "allowed_vault_ids": ["a"], "scope": {"projects": ["p"], "folders": []}, "role": "viewer"});
    b.set_json(&ctx);
    assert_eq!(get(&url, &[]).await.json(), ctx);
    b.set_status(403);
    let r = get(&url, &[]).await;
    assert_eq!((r.status.as_u16(), r.json()), (403, ctx.clone()));
    b.set_status(200);
    b.set_delay(Duration::from_millis(250));
    let t = Instant::now();
    assert_eq!(get(&url, &[]).await.status, 200);
    assert!(t.elapsed() >= Duration::from_millis(250));

    b.set_reply(Reply::raw(200, "{not json"));
    assert_eq!(get(&url, &[]).await.text(), "{not json");
    b.set_reply(Reply::raw(200, "").with_content_type(None));
    let r = get(&url, &[]).await;
    assert_eq!((r.body.len(), r.header("content-type")), (0, None));

    b.set_reply_for_vault(
        "team",
        Reply::json(200, &json!({"allowed_vault_ids": ["team"]}))
            .with_delay(Duration::from_millis(10)),
    );
    let r = get(&url, &[("x-vault-id", " team ")]).await;
    assert_eq!(r.json(), json!({"allowed_vault_ids": ["team"]}));
    assert_eq!(get(&url, &[("x-vault-id", "other")]).await.body.len(), 0);

    assert_eq!(
        get(&format!("{}/api/v1/other", b.url()), &[]).await.status,
        404
    );
    assert_eq!(send(Method::POST, &url, &[], "").await.status, 405);
}

// ---------------------------------------------------------------------------------------
// Gateway (wire contract §7)

#[tokio::test]
async fn s7_gateway_echoes_the_request() {
    let g = MockGateway::start().await;
    let r = send(
        Method::PUT,
        &format!("{}/api/v1/notes/a%2Fb?x=1&y=%20", g.url()),
        &[("x-custom", "v1"), ("content-type", "text/plain")],
        "payload",
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-mock-upstream"), Some("gateway"));
    let e = r.json();
    assert_eq!(e["method"], "PUT");
    assert_eq!(e["uri"], "/api/v1/notes/a%2Fb?x=1&y=%20");
    assert_eq!(e["version"], "HTTP/1.1");
    assert_eq!(e["body"], "payload");
    assert_eq!(e["body_len"], 7);
    let headers = e["headers"].as_array().unwrap();
    assert!(headers.contains(&json!(["x-custom", "v1"])));
    assert!(headers.contains(&json!(["content-length", "7"])));
    assert_eq!(g.count(), 1);
}

fn split_head(raw: &[u8]) -> (String, &[u8]) {
    let at = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    (
        String::from_utf8_lossy(&raw[..at]).to_ascii_lowercase(),
        &raw[at + 4..],
    )
}

#[tokio::test]
async fn s7_gateway_head_has_headers_and_no_body() {
    let g = MockGateway::start().await;
    for path in ["/anything", "/big?bytes=1000", "/sse?n=2", "/status/200"] {
        let raw = format!("HEAD {path} HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\r\n");
        let out = client::raw_exchange(g.addr(), raw.as_bytes(), Duration::from_secs(5))
            .await
            .unwrap();
        let (head, body) = split_head(&out);
        assert!(head.starts_with("http/1.1 200"), "{path}: {head}");
        assert!(body.is_empty(), "{path}: {body:?}");
        if path.starts_with("/big") {
            assert!(head.contains("content-length: 1000"), "{head}");
        }
    }
    assert_eq!(g.requests()[0].method, Method::HEAD);
}

#[tokio::test]
async fn s7_gateway_streams_sse_events_with_gaps() {
    let g = MockGateway::start().await;
    let (addr, req) = client::request(
        Method::GET,
        &format!("{}/sse?n=5&gap_ms=100", g.url()),
        &[],
        Bytes::new(),
    )
    .unwrap();
    let resp = client::open(addr, req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    assert_eq!(resp.headers()["cache-control"], "no-cache");
    assert_eq!(resp.headers()["transfer-encoding"], "chunked");
    assert!(resp.headers().get("content-length").is_none());

    let mut body = resp.into_body();
    let mut frames = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            frames.push((Instant::now(), data));
        }
    }
    let text: String = frames
        .iter()
        .map(|(_, d)| String::from_utf8_lossy(d).into_owned())
        .collect();
    let expected: String = (0..5)
        .map(|i| format!("id: {i}\nevent: message\ndata: {{\"n\":{i}}}\n\n"))
        .collect();
    assert_eq!(text, expected);
    // One event at a time: the first arrives long before the last.
    assert!(frames.len() >= 5);
    let spread = frames[frames.len() - 1].0 - frames[0].0;
    assert!(spread >= Duration::from_millis(350), "{spread:?}");
}

#[tokio::test]
async fn s7_gateway_big_body_has_content_length() {
    let g = MockGateway::start().await;
    let n = 1_000_003;
    let r = get(&format!("{}/big?bytes={n}", g.url()), &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("1000003"));
    assert!(r.header("transfer-encoding").is_none());
    assert_eq!(r.body.len(), n);
    assert_eq!(r.body, big_body(n));
    assert_eq!(&r.body[..28], b"abcdefghijklmnopqrstuvwxyzab");

    let r = get(&format!("{}/big?bytes=0", g.url()), &[]).await;
    assert_eq!((r.status.as_u16(), r.body.len()), (200, 0));
    assert_eq!(
        get(&format!("{}/big", g.url()), &[]).await.body.len(),
        1 << 20
    );
    for bad in ["x", "-1", "999999999999"] {
        let r = get(&format!("{}/big?bytes={bad}", g.url()), &[]).await;
        assert_eq!(r.status, 400, "{bad}");
    }
}

#[tokio::test]
async fn s7_gateway_status_codes_with_empty_bodies() {
    let g = MockGateway::start().await;
    for code in [200u16, 204, 302, 404, 418, 500, 503, 599] {
        let r = get(&format!("{}/status/{code}", g.url()), &[]).await;
        assert_eq!(r.status.as_u16(), code);
        assert!(r.body.is_empty(), "{code}");
        assert_eq!(r.header("x-mock-upstream"), Some("gateway"));
    }
    for bad in ["99", "600", "abc", ""] {
        let r = get(&format!("{}/status/{bad}", g.url()), &[]).await;
        assert_eq!(r.status, 400, "{bad}");
    }
}

#[tokio::test]
async fn s7_gateway_chunked_body() {
    let g = MockGateway::start().await;
    let raw = "GET /chunked?n=4 HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\r\n";
    let out = client::raw_exchange(g.addr(), raw.as_bytes(), Duration::from_secs(5))
        .await
        .unwrap();
    let (head, _) = split_head(&out);
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    assert!(!head.contains("content-length"), "{head}");
    let r = get(&format!("{}/chunked?n=4", g.url()), &[]).await;
    assert_eq!(r.text(), "chunk 0\nchunk 1\nchunk 2\nchunk 3\n");
}

#[tokio::test]
async fn s7_gateway_delay_then_echo() {
    let g = MockGateway::start().await;
    let t = Instant::now();
    let r = get(&format!("{}/delay?ms=250", g.url()), &[]).await;
    assert!(t.elapsed() >= Duration::from_millis(250));
    assert_eq!(r.json()["uri"], "/delay?ms=250");
}

// ---------------------------------------------------------------------------------------
// Gateway MCP stub (wire contract §6)

const MCP_HEADERS: [(&str, &str); 2] = [
    ("accept", "application/json, text/event-stream"),
    ("content-type", "application/json"),
];

#[tokio::test]
async fn s6_gateway_mcp_initialize_opens_a_session() {
    let g = MockGateway::start().await;
    let url = format!("{}/mcp", g.url());
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let r = send(Method::POST, &url, &MCP_HEADERS, init).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert_eq!(r.header("cache-control"), Some("no-cache"));
    let session = r.header("mcp-session-id").unwrap().to_owned();
    assert_eq!(g.sessions(), [session.as_str()]);
    let text = r.text();
    assert!(
        text.starts_with("event: message\ndata: {\"result\":{"),
        "{text}"
    );
    assert!(
        text.ends_with(",\"jsonrpc\":\"2.0\",\"id\":1}\n\n"),
        "{text}"
    );
    let data: Value = serde_json::from_str(
        text.trim_end()
            .strip_prefix("event: message\ndata: ")
            .unwrap(),
    )
    .unwrap();
    assert_eq!(data["result"]["protocolVersion"], "2025-06-18");

    let with_session = [MCP_HEADERS[0], MCP_HEADERS[1], ("mcp-session-id", &session)];
    let r = send(
        Method::POST,
        &url,
        &with_session,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    )
    .await;
    assert_eq!((r.status.as_u16(), r.body.len()), (202, 0));
    let r = send(
        Method::POST,
        &url,
        &with_session,
        r#"{"jsonrpc":"2.0","id":"a","method":"tools/list"}"#,
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.text().contains(r#""name":"search""#));
    assert!(r.text().contains(r#""id":"a"}"#));
    let r = send(
        Method::POST,
        &url,
        &with_session,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"search","arguments":{"query":"x"}}}"#,
    )
    .await;
    assert!(r.text().contains("answered by the mock gateway"));

    let r = send(Method::GET, &url, &[("mcp-session-id", &session)], "").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let r = send(Method::DELETE, &url, &[("mcp-session-id", &session)], "").await;
    assert_eq!((r.status.as_u16(), r.json()), (200, json!({"ok": true})));
    assert!(g.sessions().is_empty());
    assert_eq!(g.count(), 6);
}

#[tokio::test]
async fn s6_gateway_mcp_without_session_and_odd_paths() {
    let g = MockGateway::start().await;
    let call = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    for path in ["/mcp", "/MCP/", "/.netlify/functions/gateway/Mcp"] {
        let url = format!("{}{path}", g.url());
        let r = send(Method::POST, &url, &MCP_HEADERS, call).await;
        assert_eq!(r.status, 404, "{path}");
        assert_eq!(
            r.json(),
            json!({"jsonrpc": "2.0", "error": {"code": -32600, "message": "Session not found"}})
        );
        let r = send(
            Method::POST,
            &url,
            &[MCP_HEADERS[0], MCP_HEADERS[1], ("mcp-session-id", "forged")],
            call,
        )
        .await;
        assert_eq!(r.status, 404, "{path}");
        assert_eq!(send(Method::GET, &url, &[], "").await.status, 404);
    }
    let r = send(
        Method::POST,
        &format!("{}/mcp", g.url()),
        &MCP_HEADERS,
        "{oops",
    )
    .await;
    assert_eq!(r.status, 400);
    // `/mcpx` is not MCP: echoed.
    let r = send(Method::POST, &format!("{}/mcpx", g.url()), &[], "").await;
    assert_eq!(r.json()["method"], "POST");
}

// ---------------------------------------------------------------------------------------
// Tokens (wire contract §1)

fn decode(token: &str, secret: &str, alg: jsonwebtoken::Algorithm) -> Option<Value> {
    let mut v = jsonwebtoken::Validation::new(alg);
    v.required_spec_claims.clear();
    jsonwebtoken::decode::<Value>(
        token,
        &jsonwebtoken::DecodingKey::from_secret(secret.as_bytes()),
        &v,
    )
    .ok()
    .map(|d| d.claims)
}

#[test]
fn s1_tokens_are_hmac_jwts() {
    use jsonwebtoken::Algorithm;
    let claims = json!({"sub": "u1", "type": "mcp_access", "scopes": ["vault:read"]});
    let t = sign_token("k", claims.clone());
    assert_eq!(t.split('.').count(), 3);
    assert_eq!(
        jsonwebtoken::decode_header(&t).unwrap().alg,
        Algorithm::HS256
    );
    assert_eq!(decode(&t, "k", Algorithm::HS256), Some(claims.clone()));
    assert_eq!(decode(&t, "other", Algorithm::HS256), None);
    for alg in [Algorithm::HS384, Algorithm::HS512] {
        let t = sign_token_alg(alg, "k", claims.clone());
        assert_eq!(jsonwebtoken::decode_header(&t).unwrap().alg, alg);
        assert_eq!(decode(&t, "k", alg), Some(claims.clone()));
    }

    let s = session_claims("u2", Duration::from_secs(60));
    assert_eq!(s["sub"], "u2");
    assert_eq!(s["type"], "session");
    assert_eq!(s["exp"].as_u64().unwrap() - s["iat"].as_u64().unwrap(), 60);
    let t = sign_token("k", s.clone());
    let mut v = jsonwebtoken::Validation::new(Algorithm::HS256);
    v.leeway = 0;
    let d = jsonwebtoken::decode::<Value>(&t, &jsonwebtoken::DecodingKey::from_secret(b"k"), &v)
        .unwrap();
    assert_eq!(d.claims, s);
}
