//! Load benchmark of the daemon with a real load generator (wrk; install it with
//! `benches/install-tools.sh`). Run with `cargo bench --bench load`.
//!
//! The mock gateway and canister run in this process; the sidecar is the release
//! binary (`serve`) in its own process, so its resident memory is its own. Each
//! scenario runs the same wrk command against the upstream directly and through the
//! sidecar:
//! - passthrough throughput (`-c 32`) and single-connection latency (`-c 1`, p50);
//! - REST `section-source` against fetching the same note from the canister directly;
//! - MCP `tools/call` of `get_section_source` (answered by the sidecar) against the REST
//!   route for the same note, and a passed-through MCP `tools/call` against the same
//!   call sent to the gateway directly.
//!
//! Figures go to `docs/benchmarks.md` by hand, with the machine they came from.

// A benchmark harness: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::Method;
use knowtation_sidecar::testkit::{self, client, MockBridge, MockCanister, MockGateway};

const SECRET: &str = "load-bench-secret-0123456789";
const SECONDS: u64 = 8;

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn binary() -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let status = Command::new(env!("CARGO"))
        .args(["build", "--release", "--bin", "knowtation-sidecar"])
        .current_dir(dir)
        .status()
        .expect("cargo build");
    assert!(status.success());
    dir.join("target/release/knowtation-sidecar")
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

struct Wrk {
    rps: f64,
    p50_us: f64,
    p99_us: f64,
    non_2xx: u64,
}

fn wrk(url: &str, connections: u32, headers: &[String]) -> Wrk {
    wrk_post(url, connections, headers, None)
}

/// `wrk` with a POST body (through a generated Lua script) when `body` is given.
fn wrk_post(url: &str, connections: u32, headers: &[String], body: Option<&str>) -> Wrk {
    let mut cmd = Command::new("wrk");
    let script;
    if let Some(body) = body {
        script = std::env::temp_dir().join(format!("knowtation-load-{}.lua", std::process::id()));
        let lua = format!("wrk.method = \"POST\"\nwrk.body = [==[{body}]==]\n");
        std::fs::write(&script, lua).unwrap();
        cmd.arg("-s").arg(&script);
    }
    cmd.args(["-t1", "--latency", "-d"])
        .arg(format!("{SECONDS}s"))
        .arg("-c")
        .arg(connections.to_string());
    for h in headers {
        cmd.arg("-H").arg(h);
    }
    let out = cmd
        .arg(url)
        .output()
        .expect("wrk is installed (benches/install-tools.sh)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let field = |prefix: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix).map(|v| v.trim().to_owned()))
            .unwrap_or_default()
    };
    let micros = |v: String| {
        let (num, unit) = v.split_at(v.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(v.len()));
        let n: f64 = num.parse().unwrap_or(f64::NAN);
        match unit {
            "us" => n,
            "ms" => n * 1e3,
            "s" => n * 1e6,
            _ => f64::NAN,
        }
    };
    Wrk {
        rps: field("Requests/sec:").parse().unwrap_or(0.0),
        p50_us: micros(field("50%")),
        p99_us: micros(field("99%")),
        non_2xx: field("Non-2xx or 3xx responses:").parse().unwrap_or(0),
    }
}

fn report(name: &str, direct: &Wrk, sidecar: &Wrk) {
    println!(
        "{name:<34} direct {:>9.0} req/s p50 {:>7.0}us p99 {:>7.0}us | sidecar {:>9.0} req/s p50 {:>7.0}us p99 {:>7.0}us | ratio {:.2} | added p50 {:+.0}us | non-2xx {}/{}",
        direct.rps,
        direct.p50_us,
        direct.p99_us,
        sidecar.rps,
        sidecar.p50_us,
        sidecar.p99_us,
        sidecar.rps / direct.rps,
        sidecar.p50_us - direct.p50_us,
        direct.non_2xx,
        sidecar.non_2xx,
    );
}

struct Sidecar(Child);

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        // `cargo test --benches` and list requests: nothing to run here.
        return;
    }
    let bin = binary();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (gateway, canister, bridge) = rt.block_on(async {
        (
            MockGateway::start().await,
            MockCanister::start().await,
            MockBridge::start().await,
        )
    });
    let note = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/vault/projects/sidecar-rollout.md"
    ))
    .unwrap();
    canister
        .insert_markdown("default", "projects/sidecar-rollout.md", &note)
        .unwrap();

    let (addr, admin) = (free_addr(), free_addr());
    let child = Command::new(&bin)
        .arg("serve")
        .env_clear()
        .env("KNOWTATION_SIDECAR_LISTEN__ADDRESS", addr.to_string())
        .env("KNOWTATION_SIDECAR_ADMIN__ADDRESS", admin.to_string())
        .env("KNOWTATION_SIDECAR_UPSTREAM__GATEWAY_URL", gateway.url())
        .env("KNOWTATION_SIDECAR_UPSTREAM__CANISTER_URL", canister.url())
        .env("KNOWTATION_SIDECAR_AUTH__JWT_SECRETS", SECRET)
        .env("KNOWTATION_SIDECAR_UPSTREAM__BRIDGE_URL", bridge.url())
        .env("KNOWTATION_SIDECAR_RATE_LIMIT__PER_USER_PER_MINUTE", "0")
        // The gateway's MCP window is 60 calls a minute; a load run needs far more.
        .env("KNOWTATION_SIDECAR_MCP__CALLS_PER_MINUTE", "2000000")
        .env("KNOWTATION_SIDECAR_LOG__LEVEL", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let _sidecar = Sidecar(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    while rt
        .block_on(client::get(&format!("http://{admin}/ready"), &[]))
        .map(|r| r.status != 200)
        .unwrap_or(true)
    {
        assert!(Instant::now() < deadline, "sidecar never became ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(1));
    let idle_kib = rss_kib(pid);

    let token = testkit::sign_token(
        SECRET,
        testkit::session_claims("bench-user", Duration::from_secs(3600)),
    );
    let rest_headers = [
        format!("Authorization: Bearer {token}"),
        "X-Vault-Id: default".to_owned(),
    ];
    let canister_headers = [
        "Accept: application/json".to_owned(),
        "X-Vault-Id: default".to_owned(),
        "X-User-Id: bench-user".to_owned(),
    ];
    let echo = "/api/v1/echo?bench=1";
    let note_url = "/api/v1/notes/projects%2Fsidecar-rollout.md";
    let section = "/api/v1/section-source?path=projects/sidecar-rollout.md";

    // Warm both paths (connection pools, caches) before measuring.
    let _ = wrk(&format!("http://{addr}{echo}"), 8, &[]);
    let _ = wrk(&format!("http://{addr}{section}"), 8, &rest_headers);

    let peak = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(rss_kib(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let g = gateway.url();
    let c = canister.url();
    report(
        "passthrough throughput (c=32)",
        &wrk(&format!("{g}{echo}"), 32, &[]),
        &wrk(&format!("http://{addr}{echo}"), 32, &[]),
    );
    report(
        "passthrough latency (c=1)",
        &wrk(&format!("{g}{echo}"), 1, &[]),
        &wrk(&format!("http://{addr}{echo}"), 1, &[]),
    );
    report(
        "REST section-source vs canister (c=32)",
        &wrk(&format!("{c}{note_url}"), 32, &canister_headers),
        &wrk(&format!("http://{addr}{section}"), 32, &rest_headers),
    );
    report(
        "REST section-source vs canister (c=1)",
        &wrk(&format!("{c}{note_url}"), 1, &canister_headers),
        &wrk(&format!("http://{addr}{section}"), 1, &rest_headers),
    );

    // MCP: one session through the sidecar (learned from initialize), one at the gateway.
    let mcp_headers = [
        format!("Authorization: Bearer {token}"),
        "X-Vault-Id: default".to_owned(),
        "Content-Type: application/json".to_owned(),
        "Accept: application/json, text/event-stream".to_owned(),
    ];
    let initialize = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"load","version":"0"}}}"#;
    let session = |base: &str| -> String {
        let headers: Vec<(&str, &str)> = mcp_headers
            .iter()
            .filter_map(|h| h.split_once(": "))
            .collect();
        let (peer, req) = client::request(
            Method::POST,
            &format!("{base}/mcp"),
            &headers,
            initialize.to_owned(),
        )
        .unwrap();
        let answer = rt.block_on(client::send(peer, req)).unwrap();
        answer
            .header("mcp-session-id")
            .expect("a session id")
            .to_owned()
    };
    let via = session(&format!("http://{addr}"));
    let direct = session(&g);
    let with_session = |id: &str| {
        let mut h = mcp_headers.to_vec();
        h.push(format!("Mcp-Session-Id: {id}"));
        h
    };
    let section_call = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"get_section_source","arguments":{"path":"projects/sidecar-rollout.md"}}}"#;
    let other_call = r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"search","arguments":{"query":"x"}}}"#;
    report(
        "MCP get_section_source vs REST (c=32)",
        &wrk(&format!("http://{addr}{section}"), 32, &rest_headers),
        &wrk_post(
            &format!("http://{addr}/mcp"),
            32,
            &with_session(&via),
            Some(section_call),
        ),
    );
    report(
        "MCP passthrough tools/call (c=32)",
        &wrk_post(
            &format!("{g}/mcp"),
            32,
            &with_session(&direct),
            Some(other_call),
        ),
        &wrk_post(
            &format!("http://{addr}/mcp"),
            32,
            &with_session(&via),
            Some(other_call),
        ),
    );
    report(
        "MCP passthrough tools/call (c=1)",
        &wrk_post(
            &format!("{g}/mcp"),
            1,
            &with_session(&direct),
            Some(other_call),
        ),
        &wrk_post(
            &format!("http://{addr}/mcp"),
            1,
            &with_session(&via),
            Some(other_call),
        ),
    );
    done.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    std::thread::sleep(Duration::from_secs(2));
    println!(
        "sidecar RSS: idle {} KiB, peak under load {} KiB, after load {} KiB",
        idle_kib,
        peak.load(Ordering::Relaxed),
        rss_kib(pid)
    );
}
