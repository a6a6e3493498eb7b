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
//!   call sent to the gateway directly;
//! - the passthrough scenario through nginx in the sidecar's place, when installed;
//! - CPU time per request of the sidecar against nginx in the same run, alternating:
//!   passthrough (target: at most nginx's), and the REST route against nginx passing the
//!   note fetch through plus a bare pulldown-cmark pass over the note (target: 1.5x);
//!   each side's figure is also split into user space and kernel;
//! - the framework floors: a bare program on the sidecar's own libraries
//!   (`benches/baseline/hyper-bare.rs`) against nginx in the same way, so each gap
//!   splits into what the libraries cost and what the sidecar's controls add. For
//!   passthrough it forwards; for REST it reads the note, parses its JSON and Markdown
//!   once, and sends an answer as long as the sidecar's;
//! - the floor below the framework: a forwarder with no HTTP library
//!   (`benches/baseline/raw-bare.rs`, httparse and one task per connection) against
//!   nginx, for what target (a) would take.
//!
//! Each scenario alternates the two sides for `LOAD_ROUNDS` rounds (3) of
//! `LOAD_SECONDS` (5) and reports the median of each, with the CPU time per request of
//! the sidecar and of the mock upstreams. `LOAD_ONLY` picks scenarios by name fragment;
//! `LOAD_WRAP` runs the sidecar under a command prefix (`taskset -c 1` gives it a core of
//! its own when the harness runs under `taskset -c 0`); `LOAD_BIN` measures a given
//! binary instead of building one; `LOAD_PACE_MS` makes each wrk connection wait that
//! long between requests, so both sides serve about the same rate; `LOAD_HOLD` waits
//! that many seconds with everything started, for attaching a profiler.
//!
//! Figures go to `docs/benchmarks.md` by hand, with the machine they came from.

// A benchmark harness: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use knowtation_testkit::{self as testkit, client};

mod common;
use common::{
    binary, cpu_ticks, cpu_ticks_split, env_parse, env_u64, example, free_addr, mocks, status_kib,
    store_bench_note, ticks_per_second, wrap_from_env, Process, Sidecar, Upstreams,
};

const SECRET: &str = "load-bench-secret-0123456789abcdef";
/// Seconds per wrk run; `LOAD_SECONDS` overrides.
fn seconds() -> u64 {
    env_parse("LOAD_SECONDS").unwrap_or(5)
}

/// `LOAD_PACE_MS`: each wrk connection waits this long between its requests, so both
/// sides of a comparison see (nearly) the same request rate instead of each its own
/// saturation rate.
fn pace_ms() -> Option<u64> {
    env_parse("LOAD_PACE_MS")
}

/// Whether a scenario runs: `LOAD_ONLY` (a comma-separated list of name fragments) picks
/// some; by default all run.
fn selected(name: &str) -> bool {
    match std::env::var("LOAD_ONLY") {
        Ok(only) => only.split(',').any(|f| !f.is_empty() && name.contains(f)),
        Err(_) => true,
    }
}

struct Wrk {
    rps: f64,
    p50_us: f64,
    p99_us: f64,
    non_2xx: u64,
    /// CPU time per request of the sidecar process and of this process (the mock
    /// upstreams), in microseconds, over the run.
    sidecar_cpu_us: f64,
    upstream_cpu_us: f64,
    /// The sidecar's share of `sidecar_cpu_us` spent in user space (the rest is the
    /// kernel's: system calls, TCP, wake-ups).
    sidecar_user_us: f64,
}

/// The process whose CPU time the runs charge as "sidecar": the sidecar, or the reference
/// proxy while it is measured.
static MEASURED_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// `program` under the `LOAD_WRAP` prefix, if any.
fn wrapped(wrap: &[String], program: impl AsRef<std::ffi::OsStr>) -> Command {
    match wrap.split_first() {
        Some((prefix, args)) => {
            let mut c = Command::new(prefix);
            c.args(args).arg(program);
            c
        }
        None => Command::new(program),
    }
}

fn wrk(url: &str, connections: u32, headers: &[String]) -> Wrk {
    wrk_post(url, connections, headers, None)
}

/// `wrk` with a POST body (through a generated Lua script) when `body` is given.
fn wrk_post(url: &str, connections: u32, headers: &[String], body: Option<&str>) -> Wrk {
    wrk_charged(
        url,
        connections,
        headers,
        body,
        MEASURED_PID.load(Ordering::Relaxed),
    )
}

/// `wrk`, charging the CPU time of process `pid` as the sidecar's.
fn wrk_charged(
    url: &str,
    connections: u32,
    headers: &[String],
    body: Option<&str>,
    pid: u32,
) -> Wrk {
    let mut cmd = Command::new("wrk");
    let mut lua = String::new();
    if let Some(body) = body {
        lua = format!("wrk.method = \"POST\"\nwrk.body = [==[{body}]==]\n");
    }
    if let Some(ms) = pace_ms() {
        lua.push_str(&format!("function delay() return {ms} end\n"));
    }
    if !lua.is_empty() {
        let script =
            std::env::temp_dir().join(format!("knowtation-load-{}.lua", std::process::id()));
        std::fs::write(&script, lua).unwrap();
        cmd.arg("-s").arg(&script);
    }
    cmd.args(["-t1", "--latency", "-d"])
        .arg(format!("{}s", seconds()))
        .arg("-c")
        .arg(connections.to_string());
    for h in headers {
        cmd.arg("-H").arg(h);
    }
    let sidecar_pid = pid.to_string();
    let before = (cpu_ticks_split(&sidecar_pid), cpu_ticks("self"));
    let out = cmd
        .arg(url)
        .output()
        .expect("wrk is installed (benches/install-tools.sh)");
    let after = (cpu_ticks_split(&sidecar_pid), cpu_ticks("self"));
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
    let requests: f64 = text
        .lines()
        .find(|l| l.contains(" requests in "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(f64::NAN);
    let per_request = |ticks: u64| ticks as f64 / ticks_per_second() * 1e6 / requests;
    Wrk {
        sidecar_cpu_us: per_request(
            (after.0 .0 + after.0 .1).saturating_sub(before.0 .0 + before.0 .1),
        ),
        sidecar_user_us: per_request(after.0 .0.saturating_sub(before.0 .0)),
        upstream_cpu_us: per_request(after.1.saturating_sub(before.1)),
        rps: field("Requests/sec:").parse().unwrap_or(0.0),
        p50_us: micros(field("50%")),
        p99_us: micros(field("99%")),
        non_2xx: field("Non-2xx or 3xx responses:").parse().unwrap_or(0),
    }
}

/// Rounds per scenario; `LOAD_ROUNDS` overrides.
fn rounds() -> usize {
    env_u64("LOAD_ROUNDS", 3) as usize
}

/// Runs one scenario when it is selected: direct and through the sidecar, alternating for
/// a few rounds so that a slow spell on a shared machine hits both sides, and reports the
/// median round of each (by requests per second).
fn scenario(name: &str, direct: impl Fn() -> Wrk, sidecar: impl Fn() -> Wrk) {
    if !selected(name) {
        return;
    }
    let (d, s) = alternate(direct, sidecar);
    report(name, &median(d), &median(s));
}

/// `rounds()` runs of each side, alternating `first` and `second`.
fn alternate(first: impl Fn() -> Wrk, second: impl Fn() -> Wrk) -> (Vec<Wrk>, Vec<Wrk>) {
    (0..rounds()).map(|_| (first(), second())).unzip()
}

fn median(mut runs: Vec<Wrk>) -> Wrk {
    runs.sort_by(|a, b| a.rps.total_cmp(&b.rps));
    let mid = runs.len() / 2;
    runs.swap_remove(mid)
}

fn report(name: &str, direct: &Wrk, sidecar: &Wrk) {
    println!(
        "{name:<34} direct {:>9.0} req/s p50 {:>7.0}us p99 {:>7.0}us | sidecar {:>9.0} req/s p50 {:>7.0}us p99 {:>7.0}us | ratio {:.2} | added p50 {:+.0}us | non-2xx {}/{} | CPU us/req direct: sidecar {:.1} upstream {:.1}, via sidecar: sidecar {:.1} upstream {:.1}",
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
        direct.sidecar_cpu_us,
        direct.upstream_cpu_us,
        sidecar.sidecar_cpu_us,
        sidecar.upstream_cpu_us,
    );
}

/// nginx from the distribution's packages in the sidecar's place (one worker, keep-alive
/// to the upstreams, no buffering of answers), under the same `LOAD_WRAP`: what a mature
/// C proxy costs on this machine. `/api/v1/notes/` goes to the canister (the exchange the
/// REST route makes), everything else to the gateway.
struct Nginx {
    /// Always present until dropped: stopped before its directory goes.
    process: Option<Process>,
    listen: SocketAddr,
    dir: std::path::PathBuf,
}

impl Nginx {
    fn start(wrap: &[String], gateway: SocketAddr, canister: SocketAddr) -> Option<Nginx> {
        let listen = free_addr();
        let dir =
            std::env::temp_dir().join(format!("knowtation-load-nginx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = format!(
            "worker_processes 1;\ndaemon off;\nmaster_process off;\npid {dir}/nginx.pid;\n\
             error_log {dir}/error.log warn;\nevents {{ worker_connections 1024; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {dir};\n  proxy_temp_path {dir};\n\
             upstream gw {{ server {gateway}; keepalive 64; }}\n\
             upstream canister {{ server {canister}; keepalive 64; }}\n\
             server {{\n    listen {listen};\n\
             proxy_http_version 1.1;\n    proxy_set_header Connection \"\";\n\
             proxy_buffering off;\n\
             proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n\
             location / {{ proxy_pass http://gw; }}\n\
             location /api/v1/notes/ {{ proxy_pass http://canister; }}\n  }}\n}}\n",
            dir = dir.display()
        );
        let conf_path = dir.join("nginx.conf");
        std::fs::write(&conf_path, conf).unwrap();
        let Ok(child) = wrapped(wrap, "nginx")
            .arg("-c")
            .arg(&conf_path)
            .arg("-e")
            .arg(dir.join("error.log"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
        else {
            println!("reference proxy: nginx is not installed; skipped");
            return None;
        };
        let nginx = Nginx {
            process: Some(Process(child)),
            listen,
            dir,
        };
        std::thread::sleep(Duration::from_millis(500));
        Some(nginx)
    }

    fn pid(&self) -> u32 {
        self.process.as_ref().map_or(0, |p| p.0.id())
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        drop(self.process.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const REFERENCE_C32: &str = "reference: nginx passthrough (c=32)";
const REFERENCE_C1: &str = "reference: nginx passthrough (c=1)";
/// Target (a): the sidecar's CPU per passed-through request at most nginx's.
const CPU_PASSTHROUGH: &str = "CPU: passthrough, sidecar vs nginx (c=32)";
/// The same with every request carrying one caller's valid token: the sidecar verifies
/// it (a remembered token) and keys the request's upstream connection on its `sub`
/// (`upstream.reuse = "principal"`), where nginx passes the header on.
const CPU_PASSTHROUGH_TOKEN: &str = "CPU: passthrough with a token, sidecar vs nginx (c=32)";
/// The framework floor: a bare hyper proxy's CPU per passed-through request against
/// nginx's (no target; it splits target (a)'s gap).
const CPU_FLOOR: &str = "CPU: passthrough, bare hyper vs nginx (c=32)";
/// The floor below the framework: a forwarder with no HTTP library
/// (`benches/baseline/raw-bare.rs`) against nginx (no target; it shows what (a) would
/// take).
const CPU_FLOOR_RAW: &str = "CPU: passthrough, raw HTTP/1 vs nginx (c=32)";
/// Target (b): the REST route's CPU per request at most 1.5x nginx passing the note
/// fetch through plus a bare pulldown-cmark pass over the note.
const CPU_REST: &str = "CPU: REST section-source vs nginx note + parse (c=32)";
/// The framework floor of a REST answer: the bare program reading the note, parsing its
/// JSON and its Markdown once and sending an answer of the same size, against target
/// (b)'s reference (no target; it splits target (b)'s gap).
const CPU_FLOOR_REST: &str = "CPU: REST, bare hyper vs nginx note + parse (c=32)";

/// The passthrough scenarios with nginx in the sidecar's place (direct against via nginx).
fn reference_proxy(nginx: &Nginx, upstream: SocketAddr, path: &str) {
    MEASURED_PID.store(nginx.pid(), Ordering::Relaxed);
    let direct = format!("http://{upstream}{path}");
    let via = format!("http://{}{path}", nginx.listen);
    let _ = wrk(&via, 8, &[]);
    scenario(
        REFERENCE_C32,
        || wrk(&direct, 32, &[]),
        || wrk(&via, 32, &[]),
    );
    scenario(REFERENCE_C1, || wrk(&direct, 1, &[]), || wrk(&via, 1, &[]));
}

/// CPU time per request of the sidecar against nginx, alternating in the same run: each
/// side's median over the rounds, and their ratio. `floor_extra_us` is added to nginx's
/// figure (work the sidecar must do that nginx does not).
fn cpu_scenario(
    name: &str,
    who: &str,
    sidecar: impl Fn() -> Wrk,
    nginx: impl Fn() -> Wrk,
    floor_extra_us: f64,
) {
    if !selected(name) {
        return;
    }
    let (s, n) = alternate(sidecar, nginx);
    // The round with the median CPU time per request: its total, user and kernel parts.
    let cpu_median = |runs: &[Wrk]| {
        let mut v: Vec<(f64, f64)> = runs
            .iter()
            .map(|w| (w.sidecar_cpu_us, w.sidecar_user_us))
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v[v.len() / 2]
    };
    let rps_median = |runs: Vec<Wrk>| median(runs).rps;
    let ((s_cpu, s_user), (n_cpu, n_user)) = (cpu_median(&s), cpu_median(&n));
    let floor = n_cpu + floor_extra_us;
    println!(
        "{name:<44} CPU us/req: {who} {s_cpu:.1} (user {s_user:.1} kernel {:.1}; rounds {}) | nginx {n_cpu:.1} (user {n_user:.1} kernel {:.1}; rounds {}){} | ratio {:.2} | req/s {who} {:.0} nginx {:.0}",
        s_cpu - s_user,
        s.iter().map(|w| format!("{:.1}", w.sidecar_cpu_us)).collect::<Vec<_>>().join(" "),
        n_cpu - n_user,
        n.iter().map(|w| format!("{:.1}", w.sidecar_cpu_us)).collect::<Vec<_>>().join(" "),
        if floor_extra_us > 0.0 {
            format!(" + bare parse {floor_extra_us:.1} = {floor:.1}")
        } else {
            String::new()
        },
        s_cpu / floor,
        rps_median(s),
        rps_median(n),
    );
}

/// The bare program `bare` (`benches/baseline/`) with `args` after its listen address,
/// under the same `LOAD_WRAP` as the sidecar; returns it and where it listens once it
/// does.
fn start_bare(wrap: &[String], bare: &std::path::Path, args: &[String]) -> (Process, SocketAddr) {
    let listen = free_addr();
    let child = wrapped(wrap, bare)
        .arg(listen.to_string())
        .args(args)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let process = Process(child);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(listen).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "{} did not listen",
            bare.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (process, listen)
}

/// [`CPU_FLOOR`] or [`CPU_FLOOR_RAW`] (`name`): the bare proxy `bare` (`who`) in the
/// sidecar's place in front of `gateway`, against nginx.
fn floor(
    (name, who): (&str, &str),
    wrap: &[String],
    bare: &std::path::Path,
    gateway: SocketAddr,
    nginx: &Nginx,
    echo: &str,
) {
    let (bare, listen) = start_bare(wrap, bare, &[gateway.to_string()]);
    let pid = bare.0.id();
    let url = format!("http://{listen}{echo}");
    let via_nginx = format!("http://{}{echo}", nginx.listen);
    let _ = wrk_charged(&url, 8, &[], None, pid);
    cpu_scenario(
        name,
        who,
        || wrk_charged(&url, 32, &[], None, pid),
        || wrk_charged(&via_nginx, 32, &[], None, nginx.pid()),
        0.0,
    );
}

/// The canister's note fetch that target (b) is measured against.
struct NoteFetch<'a> {
    canister: SocketAddr,
    url: &'a str,
    headers: &'a [String],
}

/// [`CPU_FLOOR_REST`]: the bare program reading `note`'s note and answering
/// `answer_bytes` (the size of the sidecar's answer for it), against nginx passing the
/// same note fetch plus `parse_us`.
fn floor_rest(
    wrap: &[String],
    bare: &std::path::Path,
    nginx: &Nginx,
    note: &NoteFetch<'_>,
    answer_bytes: usize,
    parse_us: f64,
) {
    let args = [
        note.canister.to_string(),
        note.url.to_owned(),
        answer_bytes.to_string(),
    ];
    let (bare, listen) = start_bare(wrap, bare, &args);
    let pid = bare.0.id();
    let url = format!("http://{listen}/api/v1/section-source");
    let via_nginx = format!("http://{}{}", nginx.listen, note.url);
    let _ = wrk_charged(&url, 8, &[], None, pid);
    cpu_scenario(
        CPU_FLOOR_REST,
        "bare hyper",
        || wrk_charged(&url, 32, &[], None, pid),
        || wrk_charged(&via_nginx, 32, note.headers, None, nginx.pid()),
        parse_us,
    );
}

/// CPU time of one bare pulldown-cmark pass (plain CommonMark, with offsets, as the
/// extractor parses) over `note`, in microseconds: the parse the REST route cannot avoid.
fn bare_parse_us(note: &str) -> f64 {
    use pulldown_cmark::{Options, Parser};
    let thread_ticks = || cpu_ticks("thread-self");
    let start = thread_ticks();
    let mut passes = 0u64;
    let mut events = 0usize;
    // At least two seconds of CPU, so the clock tick is a small error.
    while thread_ticks() - start < (2.0 * ticks_per_second()) as u64 {
        for _ in 0..1000 {
            events += Parser::new_ext(std::hint::black_box(note), Options::empty())
                .into_offset_iter()
                .count();
        }
        passes += 1000;
    }
    std::hint::black_box(events);
    (thread_ticks() - start) as f64 / ticks_per_second() * 1e6 / passes as f64
}

/// `LOAD_HOLD` (seconds): print where everything listens, then wait that long before
/// measuring, so a profiler (`perf record -p`, `strace -c -p`) can be attached to either
/// proxy while the caller drives it with its own load.
fn hold(what: &[(&str, String)]) {
    let Some(secs) = env_parse::<u64>("LOAD_HOLD") else {
        return;
    };
    for (name, value) in what {
        println!("hold: {name}: {value}");
    }
    println!("hold: waiting {secs} s");
    std::thread::sleep(Duration::from_secs(secs));
}

fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        // `cargo test --benches` and list requests: nothing to run here.
        return;
    }
    // `LOAD_BIN` measures a given binary (an earlier build, say) instead of building one.
    let bin = std::env::var_os("LOAD_BIN").map_or_else(binary, std::path::PathBuf::from);
    // Built before anything is measured, so no compiler runs beside a measurement.
    let bare = (selected(CPU_FLOOR) || selected(CPU_FLOOR_REST)).then(|| example("hyper-bare"));
    let raw = selected(CPU_FLOOR_RAW).then(|| example("raw-bare"));
    let (rt, gateway, canister, bridge) = mocks();
    let note = store_bench_note(&canister);

    // `LOAD_WRAP` runs the sidecar under a command prefix, such as `taskset -c 1` or a
    // profiler (the RSS figures are then the wrapper's unless it execs, as taskset does).
    let wrap = wrap_from_env("LOAD_WRAP");
    let sidecar = Sidecar::start(
        &bin,
        &rt,
        Upstreams {
            gateway: &gateway.url(),
            canister: &canister.url(),
            bridge: &bridge.url(),
        },
        SECRET,
        &[
            (
                "KNOWTATION_SIDECAR_RATE_LIMIT__PER_USER_PER_MINUTE",
                "0".to_owned(),
            ),
            // The gateway's MCP window is 60 calls a minute; a load run needs far more.
            (
                "KNOWTATION_SIDECAR_MCP__CALLS_PER_MINUTE",
                "2000000".to_owned(),
            ),
        ],
        &wrap,
    );
    let (addr, pid) = (sidecar.addr, sidecar.pid());
    MEASURED_PID.store(pid, Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs(1));
    let idle_kib = status_kib(pid, "VmRSS");

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
    if selected("REST") || selected("MCP") {
        let _ = wrk(&format!("http://{addr}{section}"), 8, &rest_headers);
    }

    let peak = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(status_kib(pid, "VmRSS"), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let g = gateway.url();
    let c = canister.url();
    scenario(
        "passthrough throughput (c=32)",
        || wrk(&format!("{g}{echo}"), 32, &[]),
        || wrk(&format!("http://{addr}{echo}"), 32, &[]),
    );
    let nginx = [
        REFERENCE_C32,
        REFERENCE_C1,
        CPU_PASSTHROUGH,
        CPU_PASSTHROUGH_TOKEN,
        CPU_FLOOR,
        CPU_FLOOR_RAW,
        CPU_REST,
        CPU_FLOOR_REST,
    ]
    .iter()
    .any(|name| selected(name))
    .then(|| Nginx::start(&wrap, gateway.addr(), canister.addr()))
    .flatten();
    if let Some(nginx) = &nginx {
        if selected(REFERENCE_C32) || selected(REFERENCE_C1) {
            reference_proxy(nginx, gateway.addr(), echo);
            MEASURED_PID.store(pid, Ordering::Relaxed);
        }
        let via_nginx = format!("http://{}", nginx.listen);
        hold(&[
            ("sidecar", format!("http://{addr} pid {pid}")),
            ("nginx", format!("{via_nginx} pid {}", nginx.pid())),
            ("passthrough", echo.to_owned()),
            (
                "REST",
                format!("{section} with -H '{}'", rest_headers.join("' -H '")),
            ),
            (
                "note via nginx",
                format!("{note_url} with -H '{}'", canister_headers.join("' -H '")),
            ),
        ]);
        // Warm nginx's pools to both upstreams.
        let _ = wrk_charged(&format!("{via_nginx}{echo}"), 8, &[], None, nginx.pid());
        let _ = wrk_charged(
            &format!("{via_nginx}{note_url}"),
            8,
            &canister_headers,
            None,
            nginx.pid(),
        );
        cpu_scenario(
            CPU_PASSTHROUGH,
            "sidecar",
            || wrk_charged(&format!("http://{addr}{echo}"), 32, &[], None, pid),
            || wrk_charged(&format!("{via_nginx}{echo}"), 32, &[], None, nginx.pid()),
            0.0,
        );
        if selected(CPU_PASSTHROUGH_TOKEN) {
            let auth = [format!("Authorization: Bearer {token}")];
            cpu_scenario(
                CPU_PASSTHROUGH_TOKEN,
                "sidecar",
                || wrk_charged(&format!("http://{addr}{echo}"), 32, &auth, None, pid),
                || wrk_charged(&format!("{via_nginx}{echo}"), 32, &auth, None, nginx.pid()),
                0.0,
            );
        }
        if let Some(bare) = bare.as_ref().filter(|_| selected(CPU_FLOOR)) {
            let name = (CPU_FLOOR, "bare hyper");
            floor(name, &wrap, bare, gateway.addr(), nginx, echo);
        }
        if let Some(raw) = &raw {
            let name = (CPU_FLOOR_RAW, "raw HTTP/1");
            floor(name, &wrap, raw, gateway.addr(), nginx, echo);
        }
        // The route parses the stored body, without the frontmatter.
        let (_, body) = knowtation_sidecar::extract::yaml::split_raw(&note);
        let parse = (selected(CPU_REST) || selected(CPU_FLOOR_REST)).then(|| bare_parse_us(body));
        if let Some(parse) = parse.filter(|_| selected(CPU_REST)) {
            cpu_scenario(
                CPU_REST,
                "sidecar",
                || {
                    wrk_charged(
                        &format!("http://{addr}{section}"),
                        32,
                        &rest_headers,
                        None,
                        pid,
                    )
                },
                || {
                    wrk_charged(
                        &format!("{via_nginx}{note_url}"),
                        32,
                        &canister_headers,
                        None,
                        nginx.pid(),
                    )
                },
                parse,
            );
        }
        if let (Some(bare), Some(parse)) = (&bare, parse.filter(|_| selected(CPU_FLOOR_REST))) {
            // The bare answer is as long as the sidecar's, so both send the same bytes.
            let bearer = format!("Bearer {token}");
            let headers = [
                ("Authorization", bearer.as_str()),
                ("X-Vault-Id", "default"),
            ];
            let answer = rt
                .block_on(client::get(&format!("http://{addr}{section}"), &headers))
                .unwrap();
            assert_eq!(answer.status, 200);
            let note = NoteFetch {
                canister: canister.addr(),
                url: note_url,
                headers: &canister_headers,
            };
            floor_rest(&wrap, bare, nginx, &note, answer.body.len(), parse);
        }
    }
    scenario(
        "passthrough latency (c=1)",
        || wrk(&format!("{g}{echo}"), 1, &[]),
        || wrk(&format!("http://{addr}{echo}"), 1, &[]),
    );
    scenario(
        "REST section-source vs canister (c=32)",
        || wrk(&format!("{c}{note_url}"), 32, &canister_headers),
        || wrk(&format!("http://{addr}{section}"), 32, &rest_headers),
    );
    scenario(
        "REST section-source vs canister (c=1)",
        || wrk(&format!("{c}{note_url}"), 1, &canister_headers),
        || wrk(&format!("http://{addr}{section}"), 1, &rest_headers),
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
    scenario(
        "MCP get_section_source vs REST (c=32)",
        || wrk(&format!("http://{addr}{section}"), 32, &rest_headers),
        || {
            wrk_post(
                &format!("http://{addr}/mcp"),
                32,
                &with_session(&via),
                Some(section_call),
            )
        },
    );
    scenario(
        "MCP passthrough tools/call (c=32)",
        || {
            wrk_post(
                &format!("{g}/mcp"),
                32,
                &with_session(&direct),
                Some(other_call),
            )
        },
        || {
            wrk_post(
                &format!("http://{addr}/mcp"),
                32,
                &with_session(&via),
                Some(other_call),
            )
        },
    );
    scenario(
        "MCP passthrough tools/call (c=1)",
        || {
            wrk_post(
                &format!("{g}/mcp"),
                1,
                &with_session(&direct),
                Some(other_call),
            )
        },
        || {
            wrk_post(
                &format!("http://{addr}/mcp"),
                1,
                &with_session(&via),
                Some(other_call),
            )
        },
    );
    done.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    std::thread::sleep(Duration::from_secs(2));
    println!(
        "sidecar RSS: idle {} KiB, peak under load {} KiB, after load {} KiB",
        idle_kib,
        peak.load(Ordering::Relaxed),
        status_kib(pid, "VmRSS")
    );
}
