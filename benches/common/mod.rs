//! What the daemon benchmarks (`load`, `flood`, `soak`, `idle`) share: a free loopback
//! port, the release binary, the mock upstreams, a child-process guard, a sidecar started
//! with its default limits and `/proc` readings.
//!
//! Each benchmark compiles this module on its own, so the items only some of them use
//! carry `allow(dead_code)`.

use std::net::{SocketAddr, TcpListener};

use knowtation_testkit::{client, MockBridge, MockCanister, MockGateway};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
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
    release_build(&["--bin", "knowtation-sidecar"], "knowtation-sidecar")
}

/// Builds the release example `name` (a baseline program beside the benchmarks) and
/// returns its path.
#[allow(dead_code)]
pub fn example(name: &str) -> PathBuf {
    release_build(&["--example", name], &format!("examples/{name}"))
}

/// `cargo build --release` with `target` arguments; the path of `artifact` under the
/// release directory.
fn release_build(target: &[&str], artifact: &str) -> PathBuf {
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
        .args(["build", "--release"])
        .args(target)
        .current_dir(dir)
        .status()
        .expect("cargo build");
    assert!(status.success());
    // A harness runs from `<target>/release/deps/`; the artifact sits under
    // `<target>/release/`, wherever `CARGO_TARGET_DIR` put it.
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .and_then(|deps| deps.parent())
        .map(|release| release.join(artifact))
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

/// The note the benchmarks read: the demo vault's `projects/sidecar-rollout.md`.
#[allow(dead_code)]
pub const BENCH_NOTE: &str = "projects/sidecar-rollout.md";

/// Stores [`BENCH_NOTE`] from the demo vault in `canister`'s vault `default`; returns
/// its Markdown.
#[allow(dead_code)]
pub fn store_bench_note(canister: &MockCanister) -> String {
    let note = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/demo/vault/projects/sidecar-rollout.md"
    ))
    .unwrap();
    canister
        .insert_markdown("default", BENCH_NOTE, &note)
        .unwrap();
    note
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

impl Process {
    /// SIGTERM first, so the sidecar drains as it would in production and a wrapping
    /// profiler writes its data; a kill only if it has not exited within ten seconds.
    /// Once it has exited (and been reaped), nothing is signalled again.
    pub fn stop(&mut self) {
        if let Ok(Some(_)) = self.0.try_wait() {
            return;
        }
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

impl Drop for Process {
    fn drop(&mut self) {
        self.stop();
    }
}

/// User plus system CPU time of a process so far, in clock ticks (`/proc/<pid>/stat`;
/// `"self"` for this process); 0 once it is gone.
#[allow(dead_code)]
pub fn cpu_ticks(pid: &str) -> u64 {
    let (user, system) = cpu_ticks_split(pid);
    user + system
}

/// User and system CPU time of a process so far, in clock ticks (`/proc/<pid>/stat`);
/// `(0, 0)` once it is gone.
#[allow(dead_code)]
pub fn cpu_ticks_split(pid: &str) -> (u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let mut times = rest
        .split_whitespace()
        .skip(11)
        .map(|v| v.parse::<u64>().unwrap_or(0));
    (times.next().unwrap_or(0), times.next().unwrap_or(0))
}

/// Clock ticks per second for `/proc` times (`getconf CLK_TCK`), asked once.
#[allow(dead_code)]
pub fn ticks_per_second() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// Open file descriptors of a process (entries of `/proc/<pid>/fd`); 0 once it is gone.
#[allow(dead_code)]
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// The soft and hard limits on open files of a process (`/proc/<pid>/limits`; `"self"`
/// for this one), `u64::MAX` for "unlimited".
#[allow(dead_code)]
pub fn open_files_limits(pid: &str) -> Option<(u64, u64)> {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let mut values = line
        .trim_start_matches("Max open files")
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(u64::MAX));
    Some((values.next()?, values.next()?))
}

/// Raises this process's soft limit on open files to its hard limit when it is below
/// `needed` (with `prlimit`, so no unsafe code), so that the harness and the sidecar it
/// starts afterwards (which inherits the limit) can hold `needed` descriptors each. Exits
/// with a message when even the hard limit is too low.
#[allow(dead_code)]
pub fn raise_open_files(needed: u64) {
    let Some((soft, hard)) = open_files_limits("self") else {
        return;
    };
    if soft >= needed {
        return;
    }
    if hard >= needed {
        let value = if hard == u64::MAX {
            "unlimited".to_owned()
        } else {
            hard.to_string()
        };
        let _ = Command::new("prlimit")
            .arg("--pid")
            .arg(std::process::id().to_string())
            .arg(format!("--nofile={value}:{value}"))
            .status();
    }
    match open_files_limits("self") {
        Some((soft, _)) if soft >= needed => {}
        _ => {
            eprintln!(
                "the limit on open files is {soft} (hard {hard}); this benchmark needs {needed}. \
                 Raise it (`ulimit -n {needed}` in the shell, as root if the hard limit is lower) \
                 and run it again."
            );
            std::process::exit(2);
        }
    }
}

/// The machine's load average (`/proc/loadavg`: 1, 5 and 15 minutes).
#[allow(dead_code)]
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The upstream base URLs a sidecar is started against.
#[derive(Clone, Copy)]
pub struct Upstreams<'a> {
    /// The gateway.
    pub gateway: &'a str,
    /// The canister.
    pub canister: &'a str,
    /// The bridge.
    pub bridge: &'a str,
}

/// A running sidecar: the process, its two listeners and the file its output goes to.
#[allow(dead_code)]
pub struct Sidecar {
    /// The process, stopped when dropped.
    pub process: Process,
    /// The main listener.
    pub addr: SocketAddr,
    /// The admin listener (`/ready`, `/metrics`).
    pub admin: SocketAddr,
    /// Standard output and error of the sidecar.
    pub log: PathBuf,
}

#[allow(dead_code)]
impl Sidecar {
    /// Starts the release binary (`serve`) against the mock upstreams with its default
    /// limits: only its addresses, the upstream URLs, the JWT secret and `log.level = warn`
    /// are set, then `extra` (environment variables) on top. `wrap` is a command prefix
    /// (such as `taskset -c 1` or a profiler; the `/proc` readings are then the wrapper's
    /// unless it execs). Waits until `/ready` says 200.
    pub fn start(
        bin: &Path,
        rt: &Runtime,
        upstreams: Upstreams<'_>,
        secret: &str,
        extra: &[(&str, String)],
        wrap: &[String],
    ) -> Sidecar {
        let (addr, admin) = (free_addr(), free_addr());
        let log = std::env::temp_dir().join(format!(
            "knowtation-bench-{}-{}.log",
            std::process::id(),
            addr.port()
        ));
        let out = std::fs::File::create(&log).unwrap();
        let err = out.try_clone().unwrap();
        let mut command = match wrap.split_first() {
            Some((prefix, args)) => {
                let mut c = Command::new(prefix);
                c.args(args).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        command
            .arg("serve")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("KNOWTATION_SIDECAR_LISTEN__ADDRESS", addr.to_string())
            .env("KNOWTATION_SIDECAR_ADMIN__ADDRESS", admin.to_string())
            .env(
                "KNOWTATION_SIDECAR_UPSTREAM__GATEWAY_URL",
                upstreams.gateway,
            )
            .env(
                "KNOWTATION_SIDECAR_UPSTREAM__CANISTER_URL",
                upstreams.canister,
            )
            .env("KNOWTATION_SIDECAR_UPSTREAM__BRIDGE_URL", upstreams.bridge)
            .env("KNOWTATION_SIDECAR_AUTH__JWT_SECRETS", secret)
            .env("KNOWTATION_SIDECAR_LOG__LEVEL", "warn");
        for (key, value) in extra {
            command.env(key, value);
        }
        let child = command
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap();
        let sidecar = Sidecar {
            process: Process(child),
            addr,
            admin,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while rt
            .block_on(client::get(&format!("http://{admin}/ready"), &[]))
            .map(|r| r.status != 200)
            .unwrap_or(true)
        {
            assert!(Instant::now() < deadline, "sidecar never became ready");
            std::thread::sleep(Duration::from_millis(50));
        }
        sidecar
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.process.0.id()
    }

    /// Stops the sidecar (it drains first) and returns everything it wrote, its
    /// shutdown lines included.
    pub fn stop(&mut self) -> String {
        self.process.stop();
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Lines the sidecar has written so far (at `warn`, only warnings and errors).
    pub fn log_lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// A counter or gauge from `/metrics`, summed over its label sets (0 when absent).
    pub fn metric(&self, rt: &Runtime, name: &str) -> f64 {
        let text = rt
            .block_on(client::get(&format!("http://{}/metrics", self.admin), &[]))
            .map(|r| r.text())
            .unwrap_or_default();
        text.lines()
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for Sidecar {
    // The log was read by then; the process itself stops when `process` drops, after this.
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Percentile `q` (0–1) of sorted values, nearest rank; 0 when empty.
#[allow(dead_code)]
pub fn percentile(sorted: &[u32], q: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Microseconds for a table: `850 µs`, `1.24 ms`, `12.4 ms`, `1,204 ms`.
#[allow(dead_code)]
pub fn micros(us: u32) -> String {
    let ms = f64::from(us) / 1000.0;
    if us < 1000 {
        format!("{us} µs")
    } else if ms < 10.0 {
        format!("{ms:.2} ms")
    } else if ms < 100.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{ms:.0} ms")
    }
}

/// The environment variable `name` parsed as a `T`; `None` when unset or unparsable.
#[allow(dead_code)]
pub fn env_parse<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|s| s.parse().ok())
}

/// A positive integer from the environment variable `name`, else `default`.
#[allow(dead_code)]
pub fn env_u64(name: &str, default: u64) -> u64 {
    env_parse(name).filter(|&n| n > 0).unwrap_or(default)
}

/// A command prefix for the sidecar from the environment variable `name` (split on
/// whitespace), empty when it is unset.
#[allow(dead_code)]
pub fn wrap_from_env(name: &str) -> Vec<String> {
    std::env::var(name)
        .map(|w| w.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}
