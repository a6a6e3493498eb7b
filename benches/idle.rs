//! Idle-connection benchmark of the daemon: what 10,000 open, idle connections cost and
//! how they end. Run with `cargo bench --bench idle` (`IDLE_CONNECTIONS`, 10,000;
//! `IDLE_HEADER_TIMEOUT_MS`, 30,000; `IDLE_AGAIN`, 1).
//!
//! The mock upstreams run in this process; the sidecar is the release binary (`serve`) in
//! its own process. Two of its defaults stand in the way of holding 10,000 idle
//! connections long enough to measure them, and are set for the run (docs/configuration.md,
//! `[listen]`):
//! - `listen.max_connections` (10,000): with 10,000 held, the bound is full and every
//!   further connection, the probes' included, is accepted and closed at once. It is set
//!   to the held connections plus 100.
//! - `listen.header_read_timeout_ms` (10,000). It is also the time a connection gets to
//!   begin its first request, and hyper applies it while an HTTP/1 connection waits for
//!   its next request (docs/daemon.md): with the default, both kinds of idle connection
//!   below are closed 10 s after they opened or after their last answer, whatever
//!   `listen.idle_timeout_seconds` (90) says. It is set to 30,000 so that 10,000 of them
//!   can be opened and measured before it fires; `IDLE_HEADER_TIMEOUT_MS=10000` runs with
//!   the default.
//!
//! `IDLE_WRAP` runs the sidecar under a command prefix that execs it (`taskset -c 1`).
//!
//! Both this process and the sidecar (which inherits the limit) need more than 10,000
//! descriptors; the soft limit on open files is raised to the hard limit with `prlimit`
//! when it is lower, and the run stops when even the hard limit is too low.
//!
//! Phases, on one sidecar, one after another:
//! 0. baseline: the sidecar's RSS and descriptors, and 200 probes (`GET` passed through
//!    to the gateway, each on a fresh connection) for the latency;
//! (b) silent: open the connections, 100 at a time, and send nothing;
//! (a) keep-alive: open the connections, 100 at a time, each sending one `GET` (passed
//!     through) and reading the whole answer, then leaving the connection open;
//! (a) again, `IDLE_AGAIN` times, to tell memory the allocator kept for reuse from
//!     memory lost.
//!
//! In each phase: how many connections were opened and are still open after a few
//! seconds (on this side, and as descriptors of the sidecar), the sidecar's RSS before,
//! with and after them, the probes again while they are held, then the wait for the
//! sidecar's timeout to close them: when each connection was closed (after its answer
//! ended, or after it opened) and whether anything was sent before the close.
//!
//! Figures go to `docs/benchmarks.md` by hand, with the machine they came from.

// A benchmark harness: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::HOST;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use knowtation_testkit::client;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::runtime::Runtime;
use tokio::task::JoinSet;

mod common;
use common::{
    binary, env_u64, load_average, micros, mocks, open_fds, open_files_limits, percentile,
    raise_open_files, status_kib, wrap_from_env, Sidecar, Upstreams,
};

/// The HMAC secret the sidecar verifies tokens with (no request here carries a token).
const SECRET: &str = "idle-bench-secret-0123456789abcdef";
/// Probes per measurement.
const PROBES: usize = 200;
/// Connections being opened at once.
const OPEN_AT_ONCE: usize = 100;
/// The sidecar's default `listen.idle_timeout_seconds`.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// How long the sidecar waits for a connection it told to close for idleness
/// (`CLOSE_GRACE` in the proxy), plus a margin.
const CLOSE_MARGIN: Duration = Duration::from_secs(30);
/// Time for the connections to settle before they are counted and measured.
const SETTLE: Duration = Duration::from_secs(3);

/// `TCP: inuse … mem …` of `/proc/net/sockstat`: TCP sockets in use and the pages of
/// socket buffers, for the whole network namespace (both ends of loopback connections).
fn sockstat() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/net/sockstat").unwrap_or_default();
    let line = text.lines().find(|l| l.starts_with("TCP:")).unwrap_or("");
    let field = |name: &str| {
        let mut words = line.split_whitespace();
        words
            .by_ref()
            .find(|w| *w == name)
            .and_then(|_| words.next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("inuse"), field("mem"))
}

/// `ListenOverflows` of `/proc/net/netstat`: connections the accept queue had no room for.
fn listen_overflows() -> u64 {
    let text = std::fs::read_to_string("/proc/net/netstat").unwrap_or_default();
    let mut lines = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        return 0;
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "ListenOverflows")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// Latencies of `PROBES` passed-through `GET`s, each on a fresh connection, and how many
/// failed.
fn probes(rt: &Runtime, addr: SocketAddr) -> (Vec<u32>, usize) {
    rt.block_on(async {
        let (mut v, mut failed) = (Vec::new(), 0);
        for i in 0..PROBES {
            let began = Instant::now();
            match client::get(&format!("http://{addr}/api/v1/notes?probe={i}"), &[]).await {
                Ok(r) if r.status == 200 => {
                    v.push(u32::try_from(began.elapsed().as_micros()).unwrap_or(u32::MAX));
                }
                _ => failed += 1,
            }
        }
        v.sort_unstable();
        (v, failed)
    })
}

fn probe_line(what: &str, (v, failed): &(Vec<u32>, usize)) -> String {
    format!(
        "{what}: {} of {PROBES} answered 200, p50 {} p99 {} max {}",
        v.len(),
        micros(percentile(v, 0.5)),
        micros(percentile(v, 0.99)),
        micros(v.last().copied().unwrap_or(0)),
    ) + &if *failed > 0 {
        format!(", {failed} failed")
    } else {
        String::new()
    }
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// Closures seen on this side: when each happened, measured from the connection's own
/// reference (the end of its request, or its opening), and what arrived before it.
#[derive(Default)]
struct Closures {
    count: AtomicUsize,
    after: Mutex<Vec<Duration>>,
    /// Connections that got bytes before the close (an answer such as 408).
    with_bytes: AtomicUsize,
    /// Connections reset instead of closed.
    reset: AtomicUsize,
}

impl Closures {
    fn record(&self, after: Duration) {
        self.after.lock().unwrap().push(after);
        self.count.fetch_add(1, Ordering::SeqCst);
    }

    fn closed(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }
}

/// Opens a connection, sends one `GET` and reads its whole answer, then keeps the
/// connection: returns the request sender (dropping it would close the connection).
async fn keepalive_conn(
    addr: SocketAddr,
    i: usize,
    closures: Arc<Closures>,
    tasks: &Mutex<JoinSet<()>>,
) -> Result<http1::SendRequest<Full<Bytes>>, String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {}", e.kind()))?;
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) = http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let ended: Arc<OnceLock<Instant>> = Arc::new(OnceLock::new());
    let end = Arc::clone(&ended);
    tasks.lock().unwrap().spawn(async move {
        let _ = conn.await;
        let since = end.get().map_or(Duration::ZERO, Instant::elapsed);
        closures.record(since);
    });
    let req = Request::get(format!("/api/v1/notes?idle={i}"))
        .header(HOST, addr.to_string())
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let status = resp.status();
    resp.into_body()
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?;
    let _ = ended.set(Instant::now());
    if status != 200 {
        return Err(format!("status {status}"));
    }
    Ok(sender)
}

/// Opens a connection that sends nothing; a task reads until the sidecar closes it.
async fn silent_conn(
    addr: SocketAddr,
    closures: Arc<Closures>,
    tasks: &Mutex<JoinSet<()>>,
) -> Result<(), String> {
    let mut stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {}", e.kind()))?;
    let opened = Instant::now();
    tasks.lock().unwrap().spawn(async move {
        let mut buf = [0u8; 1024];
        let mut got = 0;
        loop {
            match stream.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(_) => {
                    closures.reset.fetch_add(1, Ordering::SeqCst);
                    break;
                }
            }
        }
        if got > 0 {
            closures.with_bytes.fetch_add(1, Ordering::SeqCst);
        }
        closures.record(opened.elapsed());
    });
    Ok(())
}

/// One phase's readings.
struct Phase {
    name: String,
    opened: usize,
    open_errors: Vec<String>,
    open_seconds: f64,
    held: usize,
    sidecar_fds: usize,
    rss_before: u64,
    rss_with: u64,
    rss_with_after_probes: u64,
    rss_after: u64,
    sock_before: (u64, u64),
    sock_with: (u64, u64),
    probes: (Vec<u32>, usize),
    closed: usize,
    close_after: Vec<Duration>,
    with_bytes: usize,
    reset: usize,
    overflows: u64,
}

/// Runs one phase: opens `n` connections with `open` (100 at a time), measures while they
/// are held, then waits up to `wait` for the sidecar to close them all.
fn phase<F, Fut, T>(
    name: String,
    rt: &Runtime,
    sidecar: &Sidecar,
    n: usize,
    wait: Duration,
    open: F,
) -> Phase
where
    F: Fn(usize, Arc<Closures>, Arc<Mutex<JoinSet<()>>>) -> Fut,
    Fut: std::future::Future<Output = Result<T, String>> + Send + 'static,
    T: Send + 'static,
{
    let pid = sidecar.pid();
    let closures = Arc::new(Closures::default());
    let tasks = Arc::new(Mutex::new(JoinSet::new()));
    let rss_before = status_kib(pid, "VmRSS");
    let sock_before = sockstat();
    let overflows_before = listen_overflows();
    println!(
        "phase {name}: opening {n} connections; sidecar RSS {}, fds {}",
        mib(rss_before),
        open_fds(pid)
    );
    let began = Instant::now();
    let (held_items, open_errors) = rt.block_on(async {
        let mut pending = JoinSet::new();
        let mut held = Vec::new();
        let mut errors = Vec::new();
        let mut collect = |r: Result<Result<T, String>, tokio::task::JoinError>| match r {
            Ok(Ok(item)) => held.push(item),
            Ok(Err(e)) => errors.push(e),
            Err(e) => errors.push(format!("task: {e}")),
        };
        for i in 0..n {
            pending.spawn(open(i, Arc::clone(&closures), Arc::clone(&tasks)));
            while pending.len() >= OPEN_AT_ONCE {
                collect(pending.join_next().await.unwrap());
            }
        }
        while let Some(r) = pending.join_next().await {
            collect(r);
        }
        (held, errors)
    });
    let open_seconds = began.elapsed().as_secs_f64();
    let opened_at = Instant::now();
    std::thread::sleep(SETTLE);
    let held = held_items.len() - closures.closed().min(held_items.len());
    let sidecar_fds = open_fds(pid);
    let rss_with = status_kib(pid, "VmRSS");
    let sock_with = sockstat();
    println!(
        "  opened {} in {open_seconds:.1} s ({} errors); after {} s: {held} still open here, sidecar fds {sidecar_fds}, RSS {}",
        held_items.len(),
        open_errors.len(),
        SETTLE.as_secs(),
        mib(rss_with)
    );
    let probes = probes(rt, sidecar.addr);
    println!("  {}", probe_line("probes while held", &probes));
    let rss_with_after_probes = status_kib(pid, "VmRSS");

    // The wait for the sidecar's timeout.
    let deadline = opened_at + wait;
    let mut last_print = Instant::now();
    while closures.closed() < held_items.len() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        if last_print.elapsed() >= Duration::from_secs(5) {
            last_print = Instant::now();
            println!(
                "  +{:>3} s: closed {} of {}, sidecar fds {}, RSS {}",
                opened_at.elapsed().as_secs(),
                closures.closed(),
                held_items.len(),
                open_fds(pid),
                mib(status_kib(pid, "VmRSS"))
            );
        }
    }
    // Let the sidecar's tasks and allocator settle before the last reading.
    std::thread::sleep(Duration::from_secs(5));
    let rss_after = status_kib(pid, "VmRSS");
    let closed = closures.closed();
    let mut close_after = closures.after.lock().unwrap().clone();
    close_after.sort_unstable();
    // Whatever is still open goes now.
    drop(held_items);
    rt.block_on(async {
        let mut set = std::mem::take(&mut *tasks.lock().unwrap());
        set.shutdown().await;
    });
    Phase {
        name,
        opened: n - open_errors.len(),
        open_errors,
        open_seconds,
        held,
        sidecar_fds,
        rss_before,
        rss_with,
        rss_with_after_probes,
        rss_after,
        sock_before,
        sock_with,
        probes,
        closed,
        close_after,
        with_bytes: closures.with_bytes.load(Ordering::SeqCst),
        reset: closures.reset.load(Ordering::SeqCst),
        overflows: listen_overflows() - overflows_before,
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        // `cargo test --benches` and list requests: nothing to run here.
        return;
    }
    let n = env_u64("IDLE_CONNECTIONS", 10_000) as usize;
    let header_timeout_ms = env_u64("IDLE_HEADER_TIMEOUT_MS", 30_000);
    let again = env_u64("IDLE_AGAIN", 1);
    // The held connections, plus the mock upstreams' side of the sidecar's pools and the
    // probes, in this process; the sidecar inherits the limit.
    raise_open_files(n as u64 + 1024);
    let load_before = load_average();
    let bin = binary();
    let (mocks_rt, gateway, canister, bridge) = mocks();
    let sidecar = Sidecar::start(
        &bin,
        &mocks_rt,
        Upstreams {
            gateway: &gateway.url(),
            canister: &canister.url(),
            bridge: &bridge.url(),
        },
        SECRET,
        &[
            (
                "KNOWTATION_SIDECAR_LISTEN__MAX_CONNECTIONS",
                (n + 100).to_string(),
            ),
            (
                "KNOWTATION_SIDECAR_LISTEN__HEADER_READ_TIMEOUT_MS",
                header_timeout_ms.to_string(),
            ),
        ],
        &wrap_from_env("IDLE_WRAP"),
    );
    let pid = sidecar.pid();
    let limits = open_files_limits(&pid.to_string());
    println!(
        "idle: {n} connections; sidecar pid {pid}, open-files limit {limits:?}, \
         max_connections {}, header_read_timeout_ms {header_timeout_ms}, idle timeout {} s; load average {load_before}",
        n + 100,
        IDLE_TIMEOUT.as_secs()
    );
    if limits.is_some_and(|(soft, _)| soft < n as u64 + 256) {
        eprintln!("the sidecar's limit on open files is too low for {n} connections");
        std::process::exit(2);
    }
    // The client side: one runtime thread is plenty for connections that do nothing.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let baseline = probes(&rt, sidecar.addr);
    std::thread::sleep(Duration::from_secs(1));
    println!(
        "baseline: sidecar RSS {}, fds {}; {}",
        mib(status_kib(pid, "VmRSS")),
        open_fds(pid),
        probe_line("probes", &baseline)
    );

    let addr = sidecar.addr;
    // An HTTP/1 connection waiting for its next request is closed by whichever comes
    // first, the header timeout or the idle timeout; one that never sent a byte, by the
    // header timeout.
    let header_timeout = Duration::from_millis(header_timeout_ms);
    let keepalive_wait = header_timeout.min(IDLE_TIMEOUT) + CLOSE_MARGIN;
    let keepalive = |name: String| {
        phase(
            name,
            &rt,
            &sidecar,
            n,
            keepalive_wait,
            move |i, closures, tasks| async move { keepalive_conn(addr, i, closures, &tasks).await },
        )
    };
    // The silent connections first, on a fresh process: they cost the least, so what they
    // leave for the allocator to reuse hardly lowers the figure of the keep-alive ones.
    let mut phases = vec![phase(
        "(b) nothing sent".to_owned(),
        &rt,
        &sidecar,
        n,
        header_timeout + CLOSE_MARGIN,
        move |_, closures, tasks| async move { silent_conn(addr, closures, &tasks).await },
    )];
    phases.push(keepalive(
        "(a) one keep-alive request, then idle".to_owned(),
    ));
    for round in 1..=again {
        phases.push(keepalive(if round == 1 {
            "(a) again".to_owned()
        } else {
            format!("(a) again, round {round}")
        }));
    }
    let rejected = sidecar.metric(&mocks_rt, "knowtation_sidecar_connections_rejected_total");
    let log = sidecar.log_lines();

    println!();
    println!(
        "| phase | opened | open after {} s | sidecar fds | RSS before | RSS with | per connection | RSS after close | probes p50 / p99 (baseline {} / {}) | closed by the sidecar | closed after (min / median / max) |",
        SETTLE.as_secs(),
        micros(percentile(&baseline.0, 0.5)),
        micros(percentile(&baseline.0, 0.99)),
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for p in &phases {
        let per_conn_kib = (p.rss_with as f64 - p.rss_before as f64) / p.opened.max(1) as f64;
        let secs = |d: Option<&Duration>| {
            d.map_or("-".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()))
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {:.1} KiB | {} | {} / {} ({} failed) | {} | {} / {} / {} |",
            p.name,
            p.opened,
            p.held,
            p.sidecar_fds,
            mib(p.rss_before),
            mib(p.rss_with),
            per_conn_kib,
            mib(p.rss_after),
            micros(percentile(&p.probes.0, 0.5)),
            micros(percentile(&p.probes.0, 0.99)),
            p.probes.1,
            p.closed,
            secs(p.close_after.first()),
            secs(p.close_after.get(p.close_after.len() / 2)),
            secs(p.close_after.last()),
        );
    }
    println!();
    for p in &phases {
        println!(
            "{}: opened in {:.1} s, open errors {:?}; RSS after the probes {}; TCP sockets (namespace) {} -> {}, socket buffer pages {} -> {}; closes with bytes first {}, resets {}; listen overflows {}",
            p.name,
            p.open_seconds,
            p.open_errors.iter().take(5).collect::<Vec<_>>(),
            mib(p.rss_with_after_probes),
            p.sock_before.0,
            p.sock_with.0,
            p.sock_before.1,
            p.sock_with.1,
            p.with_bytes,
            p.reset,
            p.overflows,
        );
    }
    println!(
        "connections rejected by the sidecar (metric): {rejected}; sidecar log lines at warn or above: {}; load average before {load_before}, after {}",
        log.len(),
        load_average()
    );
    for line in log.iter().take(5) {
        println!("  log: {line}");
    }
    drop(rt);
}
