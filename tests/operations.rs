//! The real binary run the way operators run it: restarted (gracefully and by a crash)
//! and reloaded under a real MCP client whose session must survive, with the log and
//! configuration controls an operator relies on.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use knowtation_testkit::{sign_token, unix_now, MockBridge, MockCanister, MockGateway};
use rmcp::model::CallToolRequestParams;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[path = "support/sidecar.rs"]
mod support;

const BIN: &str = env!("CARGO_BIN_EXE_knowtation-sidecar");
const SECRET: &str = "operations-test-secret-0123456789abcdef";

/// A fresh directory under the temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ks-ops-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn free_addr() -> SocketAddr {
    StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// The binary, its stderr lines collected as they come.
struct Sidecar {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Sidecar {
    fn spawn(args: &[&str], cwd: Option<&Path>) -> Sidecar {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .env_clear()
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        support::pass_runtime_threads(&mut cmd);
        if let Some(dir) = cwd {
            cmd.current_dir(dir);
        }
        let mut child = cmd.spawn().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        for stream in [
            Box::new(child.stderr.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stdout.take().unwrap()),
        ] {
            let lines = Arc::clone(&lines);
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    lines.lock().unwrap().push(line);
                }
            });
        }
        Sidecar { child, lines }
    }

    fn serve(config: &Path) -> Sidecar {
        Sidecar::spawn(&["serve", "--config", config.to_str().unwrap()], None)
    }

    fn log(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Waits for a log line containing `needle`; returns it.
    async fn wait_log(&self, needle: &str) -> String {
        let t0 = Instant::now();
        loop {
            if let Some(l) = self.log().into_iter().find(|l| l.contains(needle)) {
                return l;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "no log line with {needle:?}:\n{}",
                self.log().join("\n")
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    }

    async fn exit(&mut self) -> ExitStatus {
        let t0 = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(t0.elapsed() < Duration::from_secs(15), "did not exit");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 exchange on a fresh connection: status and body.
async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.split(' ').nth(1).unwrap_or("0").parse().unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

async fn wait_ready(admin: SocketAddr) {
    let t0 = Instant::now();
    loop {
        if TcpStream::connect(admin).await.is_ok()
            && http(admin, "GET", "/ready", &[], "").await.0 == 200
        {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "never ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The mock upstreams with one note; they outlive every sidecar run, as the gateway's
/// sessions outlive a sidecar restart.
struct Upstreams {
    gw: MockGateway,
    canister: MockCanister,
    bridge: MockBridge,
}

async fn upstreams() -> Upstreams {
    let gw = MockGateway::start().await;
    let canister = MockCanister::start().await;
    let bridge = MockBridge::start().await;
    bridge.set_json(&json!({"effective_canister_user_id": "google:owner", "allowed_vault_ids": ["default"], "role": "viewer"}));
    canister.insert_note(
        "default",
        "inbox/one.md",
        &json!({"title": "One"}),
        "# A\n\nbody canary\n\n## B",
    );
    Upstreams {
        gw,
        canister,
        bridge,
    }
}

fn config_text(up: &Upstreams, listen: SocketAddr, admin: SocketAddr, extra: &str) -> String {
    format!(
        "[listen]\naddress = \"{listen}\"\n[admin]\naddress = \"{admin}\"\n\
         [upstream]\ngateway_url = \"{}\"\ncanister_url = \"{}\"\nbridge_url = \"{}\"\n\
         [auth]\njwt_secrets = [\"{SECRET}\"]\n\
         [shutdown]\ngrace_seconds = 0\ndrain_seconds = 2\n{extra}",
        up.gw.url(),
        up.canister.url(),
        up.bridge.url()
    )
}

/// A sidecar serving the plain test configuration (`config_text` with nothing extra)
/// from a fresh scratch directory, ready; `config` is there to rewrite for a reload.
struct Served {
    up: Upstreams,
    dir: TempDir,
    listen: SocketAddr,
    admin: SocketAddr,
    config: PathBuf,
    sidecar: Sidecar,
}

async fn serve_plain(name: &str) -> Served {
    let up = upstreams().await;
    let dir = TempDir::new(name);
    let (listen, admin) = (free_addr(), free_addr());
    let config = dir.path("config.toml");
    std::fs::write(&config, config_text(&up, listen, admin, "")).unwrap();
    let sidecar = Sidecar::serve(&config);
    wait_ready(admin).await;
    Served {
        up,
        dir,
        listen,
        admin,
        config,
        sidecar,
    }
}

fn token() -> String {
    sign_token(
        SECRET,
        json!({"sub": "google:actor", "type": "mcp_access", "scopes": ["vault:write"], "exp": unix_now() + 3600}),
    )
}

type Client = rmcp::service::RunningService<rmcp::RoleClient, ()>;

async fn mcp_client(listen: SocketAddr) -> Client {
    let config = StreamableHttpClientTransportConfig::with_uri(format!("http://{listen}/mcp"))
        .auth_header(token());
    ().serve(StreamableHttpClientTransport::from_config(config))
        .await
        .unwrap()
}

/// Calls `get_section_source`; the JSON text of its result, or the error.
async fn section_source(client: &Client) -> Result<(bool, String), String> {
    let args = json!({"path": "inbox/one.md"}).as_object().unwrap().clone();
    let result = tokio::time::timeout(
        Duration::from_secs(15),
        client.call_tool(CallToolRequestParams::new("get_section_source").with_arguments(args)),
    )
    .await
    .map_err(|_| "timed out".to_owned())?
    .map_err(|e| e.to_string())?;
    let content = serde_json::to_value(&result.content).unwrap();
    Ok((
        result.is_error == Some(true),
        content[0]["text"].as_str().unwrap_or_default().to_owned(),
    ))
}

fn assert_answered(result: Result<(bool, String), String>, when: &str) {
    let (is_error, text) = result.unwrap_or_else(|e| panic!("{when}: {e}"));
    assert!(!is_error, "{when}: {text}");
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["schema"], "knowtation.section_source/v0", "{when}");
    assert!(!text.contains("canary"));
}

/// Issue 9 §7: a session the gateway still honours keeps getting `get_section_source`
/// answered after the sidecar restarts, gracefully (SIGTERM) and by a crash (SIGKILL):
/// the same rmcp client, never re-initialized. A session the sidecar has never seen is
/// refused (404 `Session not found`) and never reaches the gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_sessions_survive_restarts_and_crashes() {
    let up = upstreams().await;
    let dir = TempDir::new("restart");
    let (listen, admin) = (free_addr(), free_addr());
    let state = dir.path("state");
    let config = dir.path("config.toml");
    std::fs::write(
        &config,
        config_text(
            &up,
            listen,
            admin,
            &format!("[state]\ndirectory = {:?}\n", state),
        ),
    )
    .unwrap();

    let mut sidecar = Sidecar::serve(&config);
    wait_ready(admin).await;
    let client = mcp_client(listen).await;
    assert_answered(section_source(&client).await, "first run");
    let initializes = up
        .gw
        .requests()
        .iter()
        .filter(|r| r.body_text().contains("\"initialize\""))
        .count();
    assert_eq!(initializes, 1);

    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&state).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let records: Vec<_> = std::fs::read_dir(&state).unwrap().collect();
        assert_eq!(records.len(), 1, "one record per session");
        let record = records[0].as_ref().unwrap().path();
        let mode = std::fs::metadata(&record).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    // A graceful restart.
    sidecar.signal("TERM");
    assert_eq!(sidecar.exit().await.code(), Some(0));
    let sidecar = Sidecar::serve(&config);
    wait_ready(admin).await;
    sidecar.wait_log("\"restored\":1").await;
    assert_answered(section_source(&client).await, "after SIGTERM and restart");

    // A crash: no shutdown code runs at all.
    sidecar.signal("KILL");
    drop(sidecar);
    let sidecar = Sidecar::serve(&config);
    wait_ready(admin).await;
    assert_answered(section_source(&client).await, "after SIGKILL and restart");
    assert_eq!(up.canister.count(), 3);

    // Never re-initialized: the gateway saw one initialize and no tool call.
    let seen = up.gw.requests();
    assert_eq!(
        seen.iter()
            .filter(|r| r.body_text().contains("\"initialize\""))
            .count(),
        1
    );
    assert!(seen
        .iter()
        .all(|r| !r.body_text().contains("get_section_source\",\"arguments")));

    // A session the sidecar has never seen (say, opened at the gateway before the
    // sidecar stood in front of it): the sidecar cannot know the vault and role frozen
    // at that session's initialize, so it refuses rather than guess.
    let before = up.gw.count();
    let call = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"get_section_source","arguments":{"path":"inbox/one.md"}}}"#;
    let bearer = format!("Bearer {}", token());
    let (status, body) = http(
        listen,
        "POST",
        "/mcp",
        &[
            ("Authorization", &bearer),
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("Mcp-Session-Id", "never-seen-by-the-sidecar"),
        ],
        call,
    )
    .await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("Session not found"), "{body}");
    assert_eq!(
        up.gw.count(),
        before,
        "the refused call reached the gateway"
    );
    let _ = client.cancel().await;
    drop(sidecar);
}

/// Issue 9 §6: SIGHUP applies a new policy and access-log mode to the live process
/// without dropping the MCP session or an open connection; a bad config is refused, the
/// running one kept, visibly in the log and the metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_without_dropping_sessions() {
    let Served {
        up,
        dir,
        listen,
        admin,
        config,
        sidecar,
    } = serve_plain("reload").await;
    let deny = dir.path("deny.toml");
    std::fs::write(&deny, "default = \"deny\"\n").unwrap();
    let client = mcp_client(listen).await;
    assert_answered(section_source(&client).await, "before the reload");
    // A keep-alive connection held open across the reload.
    let mut held = TcpStream::connect(listen).await.unwrap();
    let probe = "GET /held HTTP/1.1\r\nHost: x\r\n\r\n";
    held.write_all(probe.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = held.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));

    std::fs::write(
        &config,
        config_text(
            &up,
            listen,
            admin,
            &format!("[mcp]\npolicy_file = {deny:?}\n[log]\naccess = \"none\"\n"),
        ),
    )
    .unwrap();
    sidecar.signal("HUP");
    sidecar.wait_log("configuration reloaded").await;
    let (is_error, text) = section_source(&client)
        .await
        .expect("same session, still known");
    assert!(
        is_error || text.contains("not allowed") || text.contains("denied"),
        "policy not applied: {text}"
    );
    assert!(!text.contains("Session not found"), "{text}");
    held.write_all(probe.as_bytes()).await.unwrap();
    let n = held.read(&mut buf).await.unwrap();
    assert!(
        String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"),
        "held connection dropped"
    );
    // Access logging is off now: a request leaves no line.
    let lines = sidecar.log().len();
    assert_eq!(http(listen, "GET", "/quiet", &[], "").await.0, 200);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        sidecar.log()[lines..]
            .iter()
            .all(|l| !l.contains("\"route\"")),
        "{:?}",
        &sidecar.log()[lines..]
    );

    // A typo: refused, the running configuration (and its policy) stays.
    std::fs::write(
        &config,
        config_text(&up, listen, admin, "[log]\nlevel = \"warning\"\n"),
    )
    .unwrap();
    sidecar.signal("HUP");
    let refused = sidecar.wait_log("reload refused").await;
    assert!(refused.contains("log.level"), "{refused}");
    let (is_error, _) = section_source(&client).await.unwrap();
    assert!(is_error, "the deny policy must still be in force");
    let (_, metrics) = http(admin, "GET", "/metrics", &[], "").await;
    assert!(
        metrics.contains("knowtation_sidecar_config_reloads_total{result=\"applied\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("knowtation_sidecar_config_reloads_total{result=\"refused\"} 1"),
        "{metrics}"
    );
    assert_eq!(http(admin, "GET", "/ready", &[], "").await.0, 200);
    let _ = client.cancel().await;
}

/// The status of a REST section-source request made with `token`.
async fn section(listen: SocketAddr, token: &str) -> u16 {
    let bearer = format!("Bearer {token}");
    let path = "/api/v1/section-source?path=inbox/one.md";
    http(listen, "GET", path, &[("Authorization", &bearer)], "")
        .await
        .0
}

/// REST tokens verified so far, by `check` ("signature" or "remembered").
async fn verified(admin: SocketAddr, check: &str) -> f64 {
    let (_, text) = http(admin, "GET", "/metrics", &[], "").await;
    support::Metrics::parse(&text).get(&support::tokens_verified("rest", check))
}

/// A reload builds new verification keys, and with them an empty cache of verified
/// tokens: a token the sidecar remembered under a secret the reload removed is refused
/// on the next request (wire contract §1). `tokens_verified_total` shows the first use
/// of a token computed and the next ones remembered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_forgets_tokens_verified_under_a_removed_secret() {
    const ROTATED: &str = "operations-rotated-secret-0123456789abcdef";
    let Served {
        up,
        dir: _dir,
        listen,
        admin,
        config,
        sidecar,
    } = serve_plain("rotate").await;
    let claims = json!({"sub": "google:actor", "exp": unix_now() + 3600});
    let old = sign_token(SECRET, claims.clone());
    for _ in 0..3 {
        assert_eq!(section(listen, &old).await, 200);
    }
    // Verified once, then remembered.
    assert_eq!(verified(admin, "signature").await, 1.0);
    assert_eq!(verified(admin, "remembered").await, 2.0);

    let rotated = config_text(&up, listen, admin, "").replace(SECRET, ROTATED);
    std::fs::write(&config, rotated).unwrap();
    sidecar.signal("HUP");
    sidecar.wait_log("configuration reloaded").await;
    assert_eq!(
        section(listen, &old).await,
        401,
        "a remembered token outlived its secret"
    );
    assert_eq!(section(listen, &sign_token(ROTATED, claims)).await, 200);
    assert_eq!(verified(admin, "signature").await, 2.0);
    assert_eq!(verified(admin, "remembered").await, 2.0);
}

/// A token's claims can decode to far more memory than its bytes (a 4 KiB payload of
/// zeros is about 50 KiB of values); such tokens are verified on every request and
/// never remembered, so the cache's memory stays bounded by its entry count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_whose_claims_decode_large_are_never_remembered() {
    // Held to the end: the sidecar, its scratch directory and the upstreams.
    let served = serve_plain("bloated").await;
    let (listen, admin) = (served.listen, served.admin);
    let bloated = sign_token(
        SECRET,
        json!({"sub": "google:actor", "exp": unix_now() + 3600, "pad": vec![0; 1400]}),
    );
    assert!(bloated.len() <= 4096, "{}", bloated.len());
    for _ in 0..3 {
        assert_eq!(section(listen, &bloated).await, 200);
    }
    assert_eq!(verified(admin, "signature").await, 3.0);
    assert_eq!(verified(admin, "remembered").await, 0.0);
    // An ordinary token beside it is still remembered.
    let plain = sign_token(
        SECRET,
        json!({"sub": "google:actor", "exp": unix_now() + 3600}),
    );
    for _ in 0..2 {
        assert_eq!(section(listen, &plain).await, 200);
    }
    assert_eq!(verified(admin, "signature").await, 4.0);
    assert_eq!(verified(admin, "remembered").await, 1.0);
}

/// Issue 9 §8: a config with only the gateway set warns once per inert surface; plain
/// logs to a pipe carry no colour codes; readiness changes are logged; `log.access =
/// "errors"` logs failed requests only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_warnings_readiness_and_access_modes() {
    let gw = MockGateway::start().await;
    let dir = TempDir::new("logs");
    let (listen, admin) = (free_addr(), free_addr());
    let config = dir.path("config.toml");
    std::fs::write(
        &config,
        format!(
            "[listen]\naddress = \"{listen}\"\n[admin]\naddress = \"{admin}\"\n\
             [upstream]\ngateway_url = \"{}\"\n[shutdown]\ngrace_seconds = 0\n\
             [log]\nformat = \"plain\"\naccess = \"errors\"\n",
            gw.url()
        ),
    )
    .unwrap();
    let sidecar = Sidecar::serve(&config);
    wait_ready(admin).await;
    sidecar.wait_log("readiness changed").await;
    for key in [
        "auth.jwt_secrets",
        "upstream.canister_url",
        "upstream.bridge_url",
    ] {
        let line = sidecar.wait_log(&format!("key=\"{key}\"")).await;
        assert!(line.contains("surface left inert"), "{line}");
    }
    assert_eq!(http(listen, "GET", "/fine", &[], "").await.0, 200);
    assert_eq!(
        http(listen, "GET", "/api/v1/section-source?path=a.md", &[], "")
            .await
            .0,
        401
    );
    sidecar.wait_log("status_class=\"4xx\"").await;
    let log = sidecar.log();
    assert!(
        log.iter().all(|l| !l.contains('\u{1b}')),
        "colour codes in a pipe"
    );
    assert!(
        log.iter().all(|l| !l.contains("status_class=\"2xx\"")),
        "a 2xx was logged: {log:?}"
    );
}

/// Issue 9 §2: the demo notes are in the binary: `demo` runs from any directory, on the
/// addresses it is given, and serves the printed note.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_runs_from_anywhere_on_given_addresses() {
    let dir = TempDir::new("demo");
    let (listen, admin) = (free_addr(), free_addr());
    let demo = Sidecar::spawn(
        &[
            "demo",
            "--listen",
            &listen.to_string(),
            "--admin",
            &admin.to_string(),
        ],
        Some(&dir.0),
    );
    wait_ready(admin).await;
    let line = demo.wait_log("Authorization: Bearer ").await;
    let token = line
        .split("Authorization: Bearer ")
        .nth(1)
        .unwrap()
        .split(['\'', ' '])
        .next()
        .unwrap()
        .to_owned();
    let bearer = format!("Bearer {token}");
    let (status, body) = http(
        listen,
        "GET",
        "/api/v1/section-source?path=projects/sidecar-rollout.md",
        &[("Authorization", &bearer), ("X-Vault-Id", "default")],
        "",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("knowtation.section_source/v0"), "{body}");
}
