//! What the daemon benchmarks (`load`, `flood`) share: a free loopback port, the release
//! binary, the mock upstreams, a child-process guard and `/proc` readings.

use std::net::{SocketAddr, TcpListener};

use knowtation_sidecar::testkit::{MockBridge, MockCanister, MockGateway};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;

/// A loopback address with a port free a moment ago, for a server to bind.
pub fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Builds the release binary and returns its path.
pub fn binary() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut build = Command::new(env!("CARGO"));
    // Cargo sets package variables for the targets it runs; passed on to a nested build
    // they change its fingerprints and force a full rebuild, so they go.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("CARGO_PKG_")
            || key.starts_with("CARGO_CRATE_")
            || key.starts_with("CARGO_BIN_")
            || key.starts_with("CARGO_MANIFEST_")
            || key == "CARGO_PRIMARY_PACKAGE"
        {
            build.env_remove(&*key);
        }
    }
    let status = build
        .args(["build", "--release", "--bin", "knowtation-sidecar"])
        .current_dir(dir)
        .status()
        .expect("cargo build");
    assert!(status.success());
    // A harness runs from `<target>/release/deps/`; the binary sits in
    // `<target>/release/`, wherever `CARGO_TARGET_DIR` put it.
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .and_then(|deps| deps.parent())
        .map(|release| release.join("knowtation-sidecar"))
        .unwrap()
}

/// The mock gateway, canister and bridge on a one-worker runtime of their own (kept
/// alive by the caller), so their CPU time is this process's and not the sidecar's.
pub fn mocks() -> (Runtime, MockGateway, MockCanister, MockBridge) {
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
    (rt, gateway, canister, bridge)
}

/// A `/proc/<pid>/status` field in KiB (`VmRSS`, `VmHWM`); 0 once the process is gone.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A child process (the sidecar or a reference proxy), stopped when dropped.
pub struct Process(pub Child);

impl Drop for Process {
    // SIGTERM first, so the sidecar drains as it would in production and a wrapping
    // profiler writes its data; a kill only if it has not exited within ten seconds.
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.0.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
