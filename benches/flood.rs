//! Flood benchmark of the daemon at full scale, with its default limits. Run with
//! `ulimit -n 8192` (or more) and `cargo bench --bench flood`.
//!
//! The mock gateway, canister and bridge run in this process; the sidecar is the release
//! binary (`serve`) in its own process, configured only with its addresses, the upstream
//! URLs, the JWT secret and the log level, so every limit is the default one. Four floods
//! run one after another, each against a freshly started sidecar, for `FLOOD_SECONDS`
//! (10) each:
//! 1. 1,100 connections sending `POST /mcp` without a token, announcing 1,000 body bytes
//!    and sending one;
//! 2. the same from one authenticated user;
//! 3. 256 connections without a token, each sending a 4 MiB body but its last byte;
//! 4. 64 connections of one authenticated user, each sending a 9 MiB body but its last
//!    byte;
//! 5. 4,000 connections sending a passed-through `POST /api/v1/notes` without a token,
//!    announcing 1,000 body bytes and sending one: each one the sidecar lets through holds
//!    a request at the gateway, until `listen.max_forwarded_in_flight_anonymous` (512)
//!    are there.
//!
//! Flood connections never finish a body and never close; when the sidecar answers and
//! closes one, it is opened again at once, so the pressure stays on. During each flood,
//! every 250 ms, another user reads a note over REST and yet another sends an MCP
//! `initialize`, each on a fresh connection; their latency and status are recorded, and
//! the sidecar's resident memory is sampled from `/proc/<pid>/status`. A flood passes
//! when every probe was answered 2xx within a second and the sidecar's peak RSS stayed
//! under 128 MiB. `FLOOD_ONLY` (e.g. `1,3`) picks floods by number.
//!
//! The harness holds up to 4,000 sockets at once; it checks `/proc/self/limits` first and
//! stops when the soft limit on open files is below 8192 (raise it with `ulimit -n` in
//! the shell that runs `cargo bench`).
//!
//! Figures go to `docs/benchmarks.md` by hand, with the machine they came from.

// A benchmark harness: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::Method;
use knowtation_testkit::{client, sign_token, unix_now};
use serde_json::json;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod common;
use common::{binary, mocks, status_kib, wrap_from_env, Sidecar, Upstreams};

/// The HMAC secret the sidecar verifies tokens with.
const SECRET: &str = "flood-bench-secret-0123456789abcdef";
/// The vault the mock bridge allows by default.
const VAULT: &str = "default";
/// The note the REST probe reads.
const NOTE: &str = "notes/probe.md";
/// What a streamable-HTTP MCP client accepts.
const ACCEPT: &str = "application/json, text/event-stream";
/// The `initialize` request of the MCP probe.
const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"flood-probe","version":"0"}}}"#;
/// Time between probe rounds.
const PROBE_EVERY: Duration = Duration::from_millis(250);
/// A probe slower than this counts as failed anyway; waiting longer only delays the run.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// A probe must be answered within this to pass.
const PROBE_LIMIT: Duration = Duration::from_secs(1);
/// The sidecar's peak resident memory must stay below this to pass.
const RSS_LIMIT_KIB: u64 = 128 * 1024;
/// Lowest soft limit on open files the harness runs with.
const MIN_OPEN_FILES: u64 = 8192;
/// The MCP window is 60 calls a minute per user by default; the `initialize` probe moves
/// to a new user after this many calls so that the window never refuses it.
const CALLS_PER_PROBE_USER: usize = 40;
/// Largest single write of a flood body.
const CHUNK: usize = 64 * 1024;

/// Seconds per flood; `FLOOD_SECONDS` overrides.
fn seconds() -> u64 {
    std::env::var("FLOOD_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(10)
}

/// Whether flood `number` runs: `FLOOD_ONLY` (comma-separated numbers) picks some; by
/// default all run.
fn selected(number: usize) -> bool {
    match std::env::var("FLOOD_ONLY") {
        Ok(only) => only
            .split(',')
            .any(|f| f.trim().parse::<usize>().ok() == Some(number)),
        Err(_) => true,
    }
}

/// The soft limit on open files of this process, from `/proc/self/limits`
/// (`None` for "unlimited" or when it cannot be read).
fn open_files_soft_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The kernel's listen-queue counters (`TcpExt` in `/proc/net/netstat`, for this network
/// namespace): `ListenOverflows` (a connection completed but the accept queue was full),
/// `ListenDrops` and `SyncookiesSent`. A dropped handshake is retried by the client after
/// a second, which a probe sees as a one-second answer.
fn listen_counters() -> [u64; 3] {
    let text = std::fs::read_to_string("/proc/net/netstat").unwrap_or_default();
    let mut lines = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        return [0; 3];
    };
    let field = |wanted: &str| {
        names
            .split_whitespace()
            .zip(values.split_whitespace())
            .find(|(n, _)| *n == wanted)
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0)
    };
    [
        field("ListenOverflows"),
        field("ListenDrops"),
        field("SyncookiesSent"),
    ]
}

/// A caller token of the kind MCP clients hold, valid for an hour.
fn token(sub: &str) -> String {
    sign_token(
        SECRET,
        json!({
            "sub": sub,
            "type": "mcp_access",
            "scopes": ["vault:read", "vault:write"],
            "exp": unix_now() + 3600,
        }),
    )
}

/// One flood: how many connections, what each announces and sends, whose token.
struct Flood {
    /// Its number in the table and in `FLOOD_ONLY`.
    number: usize,
    /// What it is, for the table.
    name: &'static str,
    /// The request target: `/mcp` (the door) or a passed-through route.
    target: &'static str,
    /// Connections held open at once.
    connections: usize,
    /// The `Content-Length` each request announces.
    announced: usize,
    /// Body bytes each connection sends before it holds.
    sent: usize,
    /// `sub` of the token, or none for unauthenticated requests.
    user: Option<&'static str>,
}

/// What the flood connections got, counted across reconnections.
#[derive(Default)]
struct Tally {
    /// Connections established.
    opened: AtomicU64,
    /// Connection attempts the OS failed.
    connect_failed: AtomicU64,
    /// Closed or reset by the sidecar before a status line arrived.
    no_answer: AtomicU64,
    /// Body bytes the sidecar's socket took (after the first byte of each body).
    body_bytes_sent: AtomicU64,
    /// Answers by status code.
    statuses: Mutex<BTreeMap<u16, u64>>,
    /// Failed connection attempts by error kind.
    connect_errors: Mutex<BTreeMap<String, u64>>,
}

impl Tally {
    /// How many answers had status `code`.
    fn status(&self, code: u16) -> u64 {
        self.statuses
            .lock()
            .unwrap()
            .get(&code)
            .copied()
            .unwrap_or(0)
    }
}

/// Body bytes the floods write after the opening brace that ends each head: spaces, so a
/// body is the start of a JSON object and never complete.
static FILLER: [u8; CHUNK] = [b' '; CHUNK];

/// Reads until a status line has arrived; `None` when the connection ends first.
async fn status_line<R: AsyncRead + Unpin>(rd: &mut R) -> Option<u16> {
    let mut got = Vec::with_capacity(64);
    let mut buf = [0u8; 256];
    loop {
        if let Some(end) = got.windows(2).position(|w| w == b"\r\n") {
            let line = String::from_utf8_lossy(&got[..end]).into_owned();
            return line.split_whitespace().nth(1).and_then(|c| c.parse().ok());
        }
        match rd.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// One flood connection, for ever: connect, send the head (which ends with the body's
/// first byte) and `body` more bytes, hold; when the sidecar answers or closes, count
/// what it said and connect again.
async fn attacker(addr: SocketAddr, head: Arc<[u8]>, body: usize, tally: Arc<Tally>) {
    loop {
        let stream = match TcpStream::connect(addr).await {
            Ok(s) => s,
            Err(e) => {
                tally.connect_failed.fetch_add(1, Ordering::Relaxed);
                *tally
                    .connect_errors
                    .lock()
                    .unwrap()
                    .entry(e.kind().to_string())
                    .or_default() += 1;
                // Whatever the OS refused, a busy retry loop would only take CPU from the
                // sidecar on a small machine.
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        tally.opened.fetch_add(1, Ordering::Relaxed);
        let _ = stream.set_nodelay(true);
        let (mut rd, mut wr) = stream.into_split();
        let send = async {
            wr.write_all(&head).await?;
            let mut left = body;
            while left > 0 {
                let n = left.min(CHUNK);
                wr.write_all(&FILLER[..n]).await?;
                tally.body_bytes_sent.fetch_add(n as u64, Ordering::Relaxed);
                left -= n;
            }
            // The body is never finished and the connection never closed from here.
            std::future::pending::<io::Result<()>>().await
        };
        let status = {
            let answer = status_line(&mut rd);
            tokio::pin!(send, answer);
            let outcome = tokio::select! {
                status = &mut answer => Some(status),
                _ = &mut send => None,
            };
            match outcome {
                Some(status) => status,
                // A write failed: the sidecar closed; what it said may still be readable.
                None => tokio::time::timeout(Duration::from_millis(200), &mut answer)
                    .await
                    .ok()
                    .flatten(),
            }
        };
        match status {
            Some(code) => *tally.statuses.lock().unwrap().entry(code).or_default() += 1,
            None => {
                tally.no_answer.fetch_add(1, Ordering::Relaxed);
            }
        }
        // Wait (briefly) for the sidecar's close, so the next connection replaces this one
        // rather than adding to it.
        let mut sink = [0u8; 4096];
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            while matches!(rd.read(&mut sink).await, Ok(n) if n > 0) {}
        })
        .await;
    }
}

/// Starts `flood`'s connections on `rt`; they run until the runtime is shut down.
fn start_flood(rt: &tokio::runtime::Runtime, flood: &Flood, addr: SocketAddr) -> Arc<Tally> {
    let tally = Arc::new(Tally::default());
    let auth = flood.user.map_or(String::new(), |u| {
        format!("Authorization: Bearer {}\r\n", token(u))
    });
    let head: Arc<[u8]> = format!(
        "POST {} HTTP/1.1\r\nHost: {addr}\r\n{auth}Accept: {ACCEPT}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{{",
        flood.target,
        flood.announced
    )
    .into_bytes()
    .into();
    for _ in 0..flood.connections {
        rt.spawn(attacker(
            addr,
            Arc::clone(&head),
            // The head carries the first body byte.
            flood.sent.saturating_sub(1),
            Arc::clone(&tally),
        ));
    }
    tally
}

/// What the probes saw during one flood.
#[derive(Default)]
struct Probes {
    /// Latency of each REST read, fresh connection included.
    rest: Vec<Duration>,
    /// Latency of each `initialize`, fresh connection included.
    initialize: Vec<Duration>,
    /// Failed probes by description (`REST 503`, `initialize timed out`, ...).
    errors: BTreeMap<String, u64>,
    /// Highest `knowtation_sidecar_buffered_body_bytes` seen.
    buffered_peak: f64,
}

/// A metric's value in Prometheus text (`name` with its labels, if any).
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| !l.starts_with('#') && l.rsplit_once(' ').is_some_and(|(n, _)| n == name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Another user's REST read and another user's `initialize`, each on a fresh connection
/// every [`PROBE_EVERY`], until `stop`.
fn probe(addr: SocketAddr, admin: SocketAddr, stop: Arc<AtomicBool>) -> Probes {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut probes = Probes::default();
    let rest_auth = format!("Bearer {}", token("bob"));
    let rest_url = format!("http://{addr}/api/v1/section-source?path={NOTE}");
    let mcp_url = format!("http://{addr}/mcp");
    let metrics_url = format!("http://{admin}/metrics");
    let start = Instant::now();
    let mut round = 0usize;
    let mut mcp_auth = String::new();
    while !stop.load(Ordering::Relaxed) {
        if round.is_multiple_of(CALLS_PER_PROBE_USER) {
            mcp_auth = format!(
                "Bearer {}",
                token(&format!("carol-{}", round / CALLS_PER_PROBE_USER))
            );
        }
        rt.block_on(async {
            let (peer, req) = client::request(
                Method::GET,
                &rest_url,
                &[("authorization", &rest_auth), ("x-vault-id", VAULT)],
                "",
            )
            .unwrap();
            let t = Instant::now();
            let answer = client::send_within(PROBE_TIMEOUT, peer, req).await;
            probes.rest.push(t.elapsed());
            record("REST", answer, &mut probes.errors);

            let (peer, req) = client::request(
                Method::POST,
                &mcp_url,
                &[
                    ("authorization", &mcp_auth),
                    ("x-vault-id", VAULT),
                    ("accept", ACCEPT),
                    ("content-type", "application/json"),
                ],
                INITIALIZE,
            )
            .unwrap();
            let t = Instant::now();
            let answer = client::send_within(PROBE_TIMEOUT, peer, req).await;
            probes.initialize.push(t.elapsed());
            record("initialize", answer, &mut probes.errors);

            // Not a probe: the admin listener is separate, and this is how full the
            // body budget is.
            if let Ok(m) = client::get(&metrics_url, &[]).await {
                if let Some(b) = metric(&m.text(), "knowtation_sidecar_buffered_body_bytes") {
                    probes.buffered_peak = probes.buffered_peak.max(b);
                }
            }
        });
        round += 1;
        let next = start + PROBE_EVERY * u32::try_from(round).unwrap_or(u32::MAX);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    probes
}

/// Counts a probe's answer as an error unless it is 2xx.
fn record(
    what: &str,
    answer: Result<client::Collected, client::ClientError>,
    errors: &mut BTreeMap<String, u64>,
) {
    let error = match answer {
        Ok(c) if c.status.is_success() => return,
        Ok(c) => format!("{what} {}", c.status.as_u16()),
        Err(e) => format!("{what} {e}"),
    };
    *errors.entry(error).or_default() += 1;
}

/// One flood's results.
struct Row {
    number: usize,
    name: &'static str,
    probes: Probes,
    /// VmRSS of the fresh sidecar before the flood.
    idle_kib: u64,
    /// Highest of the sampled VmRSS and the final VmHWM.
    peak_kib: u64,
    /// VmRSS when the flood stopped.
    end_kib: u64,
    /// Highest VmRSS sampled in each second of the flood.
    by_second_kib: Vec<u64>,
    /// Growth of [`listen_counters`] during the flood.
    listen: [u64; 3],
    /// What the flood connections got.
    tally: Arc<Tally>,
    /// `admission_refused_total` by reason, and `connections_rejected_total`.
    refused: Vec<(String, f64)>,
    /// Warnings and errors the sidecar logged: count by level, and the first few lines.
    log_counts: BTreeMap<String, usize>,
    log_sample: Vec<String>,
}

impl Row {
    /// Every probe answered 2xx within [`PROBE_LIMIT`], and the peak RSS under
    /// [`RSS_LIMIT_KIB`].
    fn passed(&self) -> bool {
        let within = |v: &[Duration]| !v.is_empty() && v.iter().all(|d| *d < PROBE_LIMIT);
        self.probes.errors.is_empty()
            && within(&self.probes.rest)
            && within(&self.probes.initialize)
            && self.peak_kib < RSS_LIMIT_KIB
    }
}

/// Runs one flood against a fresh sidecar.
fn run(
    flood: &Flood,
    bin: &Path,
    upstreams: Upstreams<'_>,
    mocks: &tokio::runtime::Runtime,
) -> Row {
    // `FLOOD_WRAP` runs the sidecar under a command prefix that execs it (`taskset -c 1`,
    // `env NAME=value` for an allocator experiment), so the RSS read is still its own.
    let mut sidecar = Sidecar::start(
        bin,
        mocks,
        upstreams,
        SECRET,
        &[],
        &wrap_from_env("FLOOD_WRAP"),
    );
    let pid = sidecar.pid();
    std::thread::sleep(Duration::from_millis(500));
    let idle_kib = status_kib(pid, "VmRSS");

    // The flood has a runtime (and a core's worth of threads) of its own, so its load
    // never delays the mock upstreams' answers to the probes, which are the sidecar's to
    // delay.
    let flood_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listen_before = listen_counters();
    let tally = start_flood(&flood_rt, flood, sidecar.addr);

    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let start = Instant::now();
            let mut by_second: Vec<u64> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let second = usize::try_from(start.elapsed().as_secs()).unwrap_or(usize::MAX);
                if by_second.len() <= second {
                    by_second.resize(second + 1, 0);
                }
                by_second[second] = by_second[second].max(status_kib(pid, "VmRSS"));
                std::thread::sleep(Duration::from_millis(50));
            }
            by_second
        })
    };
    let prober = {
        let (addr, admin, stop) = (sidecar.addr, sidecar.admin, Arc::clone(&stop));
        std::thread::spawn(move || probe(addr, admin, stop))
    };
    std::thread::sleep(Duration::from_secs(seconds()));
    stop.store(true, Ordering::Relaxed);
    let probes = prober.join().unwrap();
    let by_second_kib = sampler.join().unwrap();
    let end_kib = status_kib(pid, "VmRSS");
    let peak_kib = by_second_kib
        .iter()
        .copied()
        .max()
        .unwrap_or(0)
        .max(status_kib(pid, "VmHWM"));
    let listen_after = listen_counters();
    let listen = [0, 1, 2].map(|i| listen_after[i].saturating_sub(listen_before[i]));

    let metrics = mocks
        .block_on(client::get(
            &format!("http://{}/metrics", sidecar.admin),
            &[],
        ))
        .map(|m| m.text())
        .unwrap_or_default();
    let mut refused: Vec<(String, f64)> = [
        "in_flight",
        "user_in_flight",
        "buffered_bytes",
        "user_buffered_bytes",
        "forwarded_in_flight",
        "anonymous_forwarded_in_flight",
    ]
    .iter()
    .filter_map(|r| {
        let name = format!("knowtation_sidecar_admission_refused_total{{reason=\"{r}\"}}");
        metric(&metrics, &name).map(|v| ((*r).to_owned(), v))
    })
    .collect();
    if let Some(v) = metric(&metrics, "knowtation_sidecar_connections_rejected_total") {
        refused.push(("connections_rejected".to_owned(), v));
    }

    // The flood's sockets close with its runtime, before the sidecar is asked to drain.
    flood_rt.shutdown_timeout(Duration::from_secs(2));
    let text = sidecar.stop();
    drop(sidecar);
    let mut log_counts = BTreeMap::new();
    let mut log_sample = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let level = ["ERROR", "WARN", "INFO"]
            .into_iter()
            .find(|lvl| line.contains(lvl))
            .unwrap_or("other");
        *log_counts.entry(level.to_owned()).or_default() += 1;
        if log_sample.len() < 3 {
            log_sample.push(line.chars().take(300).collect());
        }
    }
    Row {
        number: flood.number,
        name: flood.name,
        probes,
        idle_kib,
        peak_kib,
        end_kib,
        by_second_kib,
        listen,
        tally,
        refused,
        log_counts,
        log_sample,
    }
}

/// `max / p50` of a set of latencies, in milliseconds.
fn max_p50(v: &[Duration]) -> String {
    let mut v = v.to_vec();
    v.sort();
    let ms = |d: Duration| {
        let ms = d.as_secs_f64() * 1e3;
        if ms < 10.0 {
            format!("{ms:.1} ms")
        } else {
            format!("{ms:.0} ms")
        }
    };
    match (v.last(), v.get(v.len() / 2)) {
        (Some(max), Some(p50)) => format!("{} / {}", ms(*max), ms(*p50)),
        _ => "no probes".to_owned(),
    }
}

/// KiB as MiB, for the tables.
fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// Checks the file limit, starts the mocks, runs the selected floods, prints the tables.
fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        // `cargo test --benches` and list requests: nothing to run here.
        return;
    }
    match open_files_soft_limit() {
        Some(n) if n < MIN_OPEN_FILES => {
            eprintln!(
                "flood: the soft limit on open files is {n}; the floods hold up to 1,100 \
                 sockets at once. Run `ulimit -n {MIN_OPEN_FILES}` (or more) in this shell \
                 first, then `cargo bench --bench flood` again."
            );
            std::process::exit(2);
        }
        _ => {}
    }
    let began = Instant::now();
    let bin = binary();
    let (mocks, gateway, canister, bridge) = mocks();
    canister.insert_note(
        VAULT,
        NOTE,
        &json!({"title": "Probe"}),
        "# Probe\n\nThe note another user reads while the floods run.\n\n## Section\n\nMore.\n",
    );
    let urls = (gateway.url(), canister.url(), bridge.url());
    let upstreams = Upstreams {
        gateway: &urls.0,
        canister: &urls.1,
        bridge: &urls.2,
    };

    let floods = [
        Flood {
            number: 1,
            name: "1,100 slow bodies without a token",
            target: "/mcp",
            connections: 1100,
            announced: 1000,
            sent: 1,
            user: None,
        },
        Flood {
            number: 2,
            name: "1,100 slow bodies from one user",
            target: "/mcp",
            connections: 1100,
            announced: 1000,
            sent: 1,
            user: Some("mallory"),
        },
        Flood {
            number: 3,
            name: "256 × 4 MiB bodies without a token",
            target: "/mcp",
            connections: 256,
            announced: 4 * 1024 * 1024,
            sent: 4 * 1024 * 1024 - 1,
            user: None,
        },
        Flood {
            number: 4,
            name: "64 × 9 MiB bodies from one user",
            target: "/mcp",
            connections: 64,
            announced: 9 * 1024 * 1024,
            sent: 9 * 1024 * 1024 - 1,
            user: Some("mallory"),
        },
        Flood {
            number: 5,
            name: "4,000 passed-through slow bodies without a token",
            target: "/api/v1/notes",
            connections: 4000,
            announced: 1000,
            sent: 1,
            user: None,
        },
    ];
    let mut rows = Vec::new();
    for flood in floods.iter().filter(|f| selected(f.number)) {
        println!(
            "flood {}: {} for {} s ...",
            flood.number,
            flood.name,
            seconds()
        );
        let row = run(flood, &bin, upstreams, &mocks);
        println!(
            "  probes: REST {} (n={}), initialize {} (n={}), errors {:?}; RSS idle {}, peak {}, at the end {}",
            max_p50(&row.probes.rest),
            row.probes.rest.len(),
            max_p50(&row.probes.initialize),
            row.probes.initialize.len(),
            row.probes.errors,
            mib(row.idle_kib),
            mib(row.peak_kib),
            mib(row.end_kib),
        );
        rows.push(row);
    }

    println!();
    println!(
        "| flood | another user's REST max / p50 | initialize max / p50 | errors | sidecar peak RSS | result |"
    );
    println!("|---|---|---|---|---|---|");
    for r in &rows {
        // Failed probes, then probes over the limit (a timed-out probe shows in both).
        let slow = |what: &str, v: &[Duration]| {
            let n = v.iter().filter(|d| **d >= PROBE_LIMIT).count();
            (n > 0).then(|| format!("{n} of {} {what} over 1 s", v.len()))
        };
        let errors: Vec<String> = r
            .probes
            .errors
            .iter()
            .map(|(what, n)| format!("{n}× {what}"))
            .chain(slow("REST", &r.probes.rest))
            .chain(slow("initialize", &r.probes.initialize))
            .collect();
        let errors = if errors.is_empty() {
            "0".to_owned()
        } else {
            errors.join(", ")
        };
        println!(
            "| {}. {} | {} | {} | {} | {} (idle {}) | {} |",
            r.number,
            r.name,
            max_p50(&r.probes.rest),
            max_p50(&r.probes.initialize),
            errors,
            mib(r.peak_kib),
            mib(r.idle_kib),
            if r.passed() { "PASS" } else { "FAIL" },
        );
    }

    println!();
    println!(
        "| flood | connections opened | 401 | 503 | other answers | closed without an answer | connect errors | refused by the sidecar (metrics) | peak buffered body bytes |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        let t = &r.tally;
        let other: Vec<String> = t
            .statuses
            .lock()
            .unwrap()
            .iter()
            .filter(|(code, _)| **code != 401 && **code != 503)
            .map(|(code, n)| format!("{n}× {code}"))
            .collect();
        let connect_errors: Vec<String> = t
            .connect_errors
            .lock()
            .unwrap()
            .iter()
            .map(|(kind, n)| format!("{n}× {kind}"))
            .collect();
        let refused: Vec<String> = r
            .refused
            .iter()
            .filter(|(_, v)| *v > 0.0)
            .map(|(reason, v)| format!("{reason} {v}"))
            .collect();
        println!(
            "| {}. | {} | {} | {} | {} | {} | {} | {} | {:.1} MiB |",
            r.number,
            t.opened.load(Ordering::Relaxed),
            t.status(401),
            t.status(503),
            if other.is_empty() {
                "0".to_owned()
            } else {
                other.join(", ")
            },
            t.no_answer.load(Ordering::Relaxed),
            if connect_errors.is_empty() {
                format!("{}", t.connect_failed.load(Ordering::Relaxed))
            } else {
                connect_errors.join(", ")
            },
            if refused.is_empty() {
                "none".to_owned()
            } else {
                refused.join(", ")
            },
            r.probes.buffered_peak / (1024.0 * 1024.0),
        );
    }

    println!();
    for r in &rows {
        println!(
            "flood {}: flood body bytes sent {:.0} MiB; listen queue: {} overflows, {} drops, {} SYN cookies; sidecar log lines {:?}",
            r.number,
            r.tally.body_bytes_sent.load(Ordering::Relaxed) as f64 / (1024.0 * 1024.0),
            r.listen[0],
            r.listen[1],
            r.listen[2],
            r.log_counts
        );
        let series: Vec<String> = r
            .by_second_kib
            .iter()
            .map(|k| format!("{:.0}", *k as f64 / 1024.0))
            .collect();
        println!("  sidecar RSS by second (MiB): {}", series.join(" "));
        for line in &r.log_sample {
            println!("  log: {line}");
        }
    }
    println!(
        "\nresult: {}; {} s in all",
        if rows.iter().all(Row::passed) {
            "PASS"
        } else {
            "FAIL"
        },
        began.elapsed().as_secs()
    );
}
