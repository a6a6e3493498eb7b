//! Soak benchmark of the daemon: a fixed request rate for a long time. Run with
//! `cargo bench --bench soak` (`SOAK_SECONDS`, 600; `SOAK_RATE`, 2,000 requests a second;
//! `SOAK_WARMUP`, 60 seconds).
//!
//! The mock gateway, canister and bridge run in this process; the sidecar is the release
//! binary (`serve`) in its own process with its default limits (only its addresses, the
//! upstream URLs, the JWT secret and `log.level = warn` are set).
//!
//! The load is open loop: request `i` is due at `start + i / rate`, a scheduler thread
//! starts it then, whatever the answers before it are doing, and its latency is measured
//! from the time it was due. A stall in the sidecar therefore shows in the latency of
//! every request due during it, instead of pausing the generator (coordinated omission);
//! the scheduler's own lateness is reported apart.
//!
//! The requests come from `rate / 2` simulated clients (users), each with its own token,
//! its own keep-alive HTTP/1.1 connection and MCP session (one `initialize` and
//! `notifications/initialized` before the run), so each sends one request every 0.5 s
//! and every per-user default limit holds: 30 MCP calls a minute against the window of
//! 60, 30 REST reads against 600. A client sends on its one connection, in order, as an
//! MCP client does: a request due while the previous one is still out waits for it, and
//! that wait is part of its latency. (With a pool that opened a connection per waiting
//! request instead, a stall of a second or two on this shared machine turned into
//! thousands of new connections to the sidecar and from it to the upstreams, and the
//! sidecar's `listen.max_in_flight` and `listen.max_connections` refused the excess.)
//! Request `i` belongs to client `i mod clients`, and each client cycles through four
//! kinds, a quarter of the load each:
//! - REST `GET /api/v1/section-source` of a 1 KiB note (answered by the sidecar);
//! - MCP `tools/call` of `get_section_source` (answered by the sidecar);
//! - passthrough `GET /api/v1/notes?folder=projects` (the gateway's answer);
//! - passthrough `POST /api/v1/notes` with a small JSON body.
//!
//! An error is a transport failure, a request unanswered after 10 s, or an unexpected
//! answer: anything but 200 (and for MCP, a JSON-RPC result without `isError`; for
//! passthrough, the mock gateway's mark). The sidecar's RSS and CPU time are sampled
//! every 10 s from `/proc`; RSS counts as flat when the highest sample of the second half
//! is within 10 % of the sample at the end of the warm-up. With the RSS come the
//! sidecar's open descriptors (client connections and upstream pools) and the number of
//! connections the mock upstreams accepted so far, as memory follows connections; and
//! how long the sidecar's and this process's threads waited for a CPU
//! (`/proc/<pid>/task/*/schedstat`) and the machine's CPU pressure (`/proc/pressure/cpu`),
//! as other work shares the cores.
//!
//! `SOAK_WRAP` runs the sidecar under a command prefix that execs it (`taskset -c 1`).
//!
//! Figures go to `docs/benchmarks.md` by hand, with the machine they came from.

// A benchmark harness: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use http::{HeaderValue, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use knowtation_testkit::{session_claims, sign_token};
use std::net::SocketAddr;
use tokio::net::TcpStream;

mod common;
use common::{
    binary, cpu_ticks, env_u64, load_average, micros, mocks, open_fds, percentile,
    raise_open_files, status_kib, store_bench_note, ticks_per_second, wrap_from_env, Sidecar,
    Upstreams, BENCH_NOTE,
};

/// The HMAC secret the sidecar verifies tokens with.
const SECRET: &str = "soak-bench-secret-0123456789abcdef";
/// The vault every client names (the mock bridge allows it).
const VAULT: &str = "default";
/// The note the REST and MCP requests read.
const NOTE: &str = BENCH_NOTE;
/// What a streamable-HTTP MCP client accepts.
const ACCEPT: &str = "application/json, text/event-stream";
/// The protocol version the clients negotiate and then announce on every request.
const PROTOCOL: &str = "2025-06-18";
/// The kinds of request, in the order each client cycles through them.
const KINDS: [&str; 4] = [
    "REST section-source",
    "MCP get_section_source",
    "passthrough GET",
    "passthrough POST",
];
/// A request unanswered after this long counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Time between samples of the sidecar's memory and CPU time.
const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// Each client sends one request per this many seconds (so clients = rate × this).
const CLIENT_PERIOD_S: f64 = 0.5;

/// One simulated client: its own connection, token and MCP session.
struct User {
    conn: Conn,
    bearer: HeaderValue,
    session: HeaderValue,
}

/// A client's one keep-alive connection to the sidecar, opened again if it was closed.
/// Its lock is fair: requests due while another is out wait their turn.
struct Conn {
    addr: SocketAddr,
    sender: tokio::sync::Mutex<Option<http1::SendRequest<Full<Bytes>>>>,
}

impl Conn {
    fn new(addr: SocketAddr) -> Conn {
        Conn {
            addr,
            sender: tokio::sync::Mutex::new(None),
        }
    }

    /// Sends one request when the previous one is done and collects the whole answer;
    /// all within [`REQUEST_TIMEOUT`].
    async fn exchange(
        &self,
        req: Request<Full<Bytes>>,
    ) -> Result<(http::response::Parts, Bytes), String> {
        let answer = async {
            let mut guard = self.sender.lock().await;
            let result = async {
                if guard.as_ref().is_none_or(http1::SendRequest::is_closed) {
                    let stream = TcpStream::connect(self.addr)
                        .await
                        .map_err(|e| format!("connect: {e}"))?;
                    // Small requests and answers: Nagle's algorithm against delayed ACKs
                    // would add 40 ms.
                    let _ = stream.set_nodelay(true);
                    let (sender, conn) = http1::handshake(TokioIo::new(stream))
                        .await
                        .map_err(|e| format!("handshake: {e}"))?;
                    tokio::spawn(conn);
                    *guard = Some(sender);
                }
                let sender = guard.as_mut().ok_or("no connection")?;
                sender.ready().await.map_err(|e| format!("ready: {e}"))?;
                let resp = sender.send_request(req).await.map_err(|e| format!("{e}"))?;
                let (parts, body) = resp.into_parts();
                let body = body
                    .collect()
                    .await
                    .map_err(|e| format!("body: {e}"))?
                    .to_bytes();
                Ok::<_, String>((parts, body))
            }
            .await;
            if result.is_err() {
                // Whatever state the connection is in, the next request gets a new one.
                *guard = None;
            }
            result
        };
        tokio::time::timeout(REQUEST_TIMEOUT, answer)
            .await
            .map_err(|_| "timed out".to_owned())?
    }
}

/// What every request task shares.
struct Ctx {
    users: Vec<User>,
    /// The sidecar's address, for the `Host` header.
    host: HeaderValue,
    /// The four request targets, in [`KINDS`] order.
    targets: [String; 4],
    /// Per kind: (milliseconds from the start to when the request was due, latency in
    /// microseconds from then to the end of the answer's body).
    results: [Mutex<Vec<(u32, u32)>>; 4],
    /// How late the request task started, in microseconds after it was due.
    lag: Mutex<Vec<u32>>,
    /// Errors by kind and reason.
    errors: Mutex<BTreeMap<String, u64>>,
    /// Requests started and finished.
    started: AtomicU64,
    finished: AtomicU64,
    failed: AtomicU64,
}

/// The request of `kind` for `user`; `id` numbers the JSON-RPC call.
fn build(ctx: &Ctx, user: &User, kind: usize, id: u64) -> Request<Full<Bytes>> {
    let mut req = Request::builder()
        .uri(ctx.targets[kind].as_str())
        .header(HOST, ctx.host.clone())
        .header(AUTHORIZATION, user.bearer.clone())
        .header("x-vault-id", VAULT);
    let body = match kind {
        1 => {
            req = req
                .method(Method::POST)
                .header(CONTENT_TYPE, "application/json")
                .header("accept", ACCEPT)
                .header("mcp-session-id", user.session.clone())
                .header("mcp-protocol-version", PROTOCOL);
            format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"get_section_source","arguments":{{"path":"{NOTE}"}}}}}}"#
            )
        }
        3 => {
            req = req
                .method(Method::POST)
                .header(CONTENT_TYPE, "application/json");
            format!(
                r#"{{"path":"inbox/soak-{id}.md","body":"A note written during the soak.","frontmatter":{{"title":"Soak {id}"}}}}"#
            )
        }
        _ => String::new(),
    };
    req.body(Full::new(Bytes::from(body))).unwrap()
}

/// Why an answer is not the expected one, if it is not.
fn unexpected(kind: usize, parts: &http::response::Parts, body: &[u8]) -> Option<String> {
    if parts.status != 200 {
        return Some(format!("status {}", parts.status.as_u16()));
    }
    let text = String::from_utf8_lossy(body);
    match kind {
        1 if !text.contains(r#""result""#) => Some("no JSON-RPC result".to_owned()),
        1 if text.contains(r#""isError":true"#) => Some("tool error".to_owned()),
        2 | 3 if parts.headers.get("x-mock-upstream").is_none() => {
            Some("not the gateway's answer".to_owned())
        }
        _ => None,
    }
}

/// Request `i`, due at `due`; `start` is when request 0 was due.
async fn one(ctx: Arc<Ctx>, i: u64, due: Instant, start: Instant) {
    let lag = due.elapsed();
    let clients = ctx.users.len() as u64;
    let user = &ctx.users[(i % clients) as usize];
    let kind = ((i / clients) % 4) as usize;
    let req = build(&ctx, user, kind, i);
    let outcome = user.conn.exchange(req).await;
    let latency = due.elapsed();
    let failure = match &outcome {
        Ok((parts, body)) => unexpected(kind, parts, body),
        Err(e) => Some(e.clone()),
    };
    if let Some(why) = failure {
        ctx.failed.fetch_add(1, Ordering::Relaxed);
        *ctx.errors
            .lock()
            .unwrap()
            .entry(format!("{}: {why}", KINDS[kind]))
            .or_default() += 1;
    }
    if outcome.is_ok() {
        let at_ms = due.duration_since(start).as_millis() as u32;
        let us = u32::try_from(latency.as_micros()).unwrap_or(u32::MAX);
        ctx.results[kind].lock().unwrap().push((at_ms, us));
    }
    ctx.lag
        .lock()
        .unwrap()
        .push(u32::try_from(lag.as_micros()).unwrap_or(u32::MAX));
    ctx.finished.fetch_add(1, Ordering::Relaxed);
}

/// Opens an MCP session on `conn` as a client does: `initialize`, then
/// `notifications/initialized` on the session it got.
async fn initialize(conn: &Conn, bearer: &HeaderValue) -> HeaderValue {
    let post = |body: String, session: Option<&HeaderValue>| {
        let mut req = Request::post("/mcp")
            .header(HOST, conn.addr.to_string())
            .header(AUTHORIZATION, bearer.clone())
            .header("x-vault-id", VAULT)
            .header(CONTENT_TYPE, "application/json")
            .header("accept", ACCEPT);
        if let Some(s) = session {
            req = req
                .header("mcp-session-id", s.clone())
                .header("mcp-protocol-version", PROTOCOL);
        }
        req.body(Full::new(Bytes::from(body))).unwrap()
    };
    let init = format!(
        r#"{{"jsonrpc":"2.0","id":0,"method":"initialize","params":{{"protocolVersion":"{PROTOCOL}","capabilities":{{}},"clientInfo":{{"name":"soak","version":"0"}}}}}}"#
    );
    let (parts, body) = conn.exchange(post(init, None)).await.unwrap();
    assert_eq!(
        parts.status,
        200,
        "initialize: {}",
        String::from_utf8_lossy(&body)
    );
    let session = parts
        .headers
        .get("mcp-session-id")
        .expect("a session id")
        .clone();
    let note = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_owned();
    let (parts, _) = conn.exchange(post(note, Some(&session))).await.unwrap();
    assert_eq!(parts.status, 202, "notifications/initialized");
    session
}

/// Nanoseconds the threads of a process have spent runnable but waiting for a CPU
/// (the second field of `/proc/<pid>/task/<tid>/schedstat`, summed over its threads).
fn runqueue_wait_ns(pid: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

/// Microseconds so far in which some runnable task of the machine waited for a CPU
/// (`some … total=` of `/proc/pressure/cpu`); 0 without pressure stall information.
fn cpu_pressure_us() -> u64 {
    std::fs::read_to_string("/proc/pressure/cpu")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("some"))
        .and_then(|l| l.rsplit("total=").next()?.trim().parse().ok())
        .unwrap_or(0)
}

/// One sample of the sidecar and of this process.
struct Sample {
    t: Duration,
    rss_kib: u64,
    sidecar_ticks: u64,
    harness_ticks: u64,
    sidecar_wait_ns: u64,
    harness_wait_ns: u64,
    pressure_us: u64,
    fds: usize,
    /// Connections the mock upstreams accepted so far (the sidecar's pools).
    upstream_conns: usize,
    finished: u64,
    failed: u64,
}

fn sample(pid: u32, ctx: &Ctx, t: Duration, upstream_conns: usize) -> Sample {
    Sample {
        t,
        rss_kib: status_kib(pid, "VmRSS"),
        sidecar_ticks: cpu_ticks(&pid.to_string()),
        harness_ticks: cpu_ticks("self"),
        sidecar_wait_ns: runqueue_wait_ns(&pid.to_string()),
        harness_wait_ns: runqueue_wait_ns("self"),
        pressure_us: cpu_pressure_us(),
        fds: open_fds(pid),
        upstream_conns,
        finished: ctx.finished.load(Ordering::Relaxed),
        failed: ctx.failed.load(Ordering::Relaxed),
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        // `cargo test --benches` and list requests: nothing to run here.
        return;
    }
    let seconds = env_u64("SOAK_SECONDS", 600);
    let rate = env_u64("SOAK_RATE", 2000);
    let warmup = env_u64("SOAK_WARMUP", 60).min(seconds / 2);
    let clients = ((rate as f64 * CLIENT_PERIOD_S).ceil() as u64).max(1);
    // A connection per client, and the mock upstreams' side of the sidecar's pools, which
    // grow with the requests in flight.
    raise_open_files(4 * clients + 1024);

    let load_before = load_average();
    let bin = binary();
    let (mocks_rt, gateway, canister, bridge) = mocks();
    store_bench_note(&canister);
    let sidecar = Sidecar::start(
        &bin,
        &mocks_rt,
        Upstreams {
            gateway: &gateway.url(),
            canister: &canister.url(),
            bridge: &bridge.url(),
        },
        SECRET,
        &[],
        &wrap_from_env("SOAK_WRAP"),
    );
    let pid = sidecar.pid();
    let addr = sidecar.addr;

    // The generator: one runtime thread, as the scheduler thread only hands it tasks.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let token_ttl = Duration::from_secs(seconds + 3600);
    let began = Instant::now();
    let users: Vec<User> = rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        let mut users: Vec<(u64, User)> = Vec::new();
        for n in 0..clients {
            set.spawn(async move {
                let token = sign_token(SECRET, session_claims(&format!("soak-{n}"), token_ttl));
                let bearer = HeaderValue::from_str(&format!("Bearer {token}")).unwrap();
                let conn = Conn::new(addr);
                let session = initialize(&conn, &bearer).await;
                (
                    n,
                    User {
                        conn,
                        bearer,
                        session,
                    },
                )
            });
            // A few sessions at a time, as clients arriving.
            while set.len() >= 32 {
                users.push(set.join_next().await.unwrap().unwrap());
            }
        }
        while let Some(done) = set.join_next().await {
            users.push(done.unwrap());
        }
        users.sort_by_key(|(n, _)| *n);
        users.into_iter().map(|(_, u)| u).collect()
    });
    println!(
        "soak: {clients} clients initialized in {:.1} s; {rate} req/s for {seconds} s \
         (warm-up {warmup} s); sidecar RSS {:.1} MiB; connections the upstreams accepted: \
         gateway {}, canister {}, bridge {}; load average {load_before}",
        began.elapsed().as_secs_f64(),
        status_kib(pid, "VmRSS") as f64 / 1024.0,
        gateway.connections(),
        canister.connections(),
        bridge.connections(),
    );

    let ctx = Arc::new(Ctx {
        users,
        host: HeaderValue::from_str(&addr.to_string()).unwrap(),
        targets: [
            format!("/api/v1/section-source?path={NOTE}"),
            "/mcp".to_owned(),
            "/api/v1/notes?folder=projects".to_owned(),
            "/api/v1/notes".to_owned(),
        ],
        results: Default::default(),
        lag: Mutex::new(Vec::new()),
        errors: Mutex::new(BTreeMap::new()),
        started: AtomicU64::new(0),
        finished: AtomicU64::new(0),
        failed: AtomicU64::new(0),
    });

    let total = rate * seconds;
    let start = Instant::now() + Duration::from_millis(200);
    let mut samples = Vec::new();
    std::thread::scope(|scope| {
        // The scheduler: a thread of its own, as tokio's timers have a resolution of a
        // millisecond, twice the interval at 2,000 requests a second.
        let handle = rt.handle().clone();
        let sched_ctx = Arc::clone(&ctx);
        scope.spawn(move || {
            for i in 0..total {
                let due = start + Duration::from_nanos(i * 1_000_000_000 / rate);
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                sched_ctx.started.fetch_add(1, Ordering::Relaxed);
                handle.spawn(one(Arc::clone(&sched_ctx), i, due, start));
            }
            // Alive until after the last sample, which reads its run-queue time.
            let after_end = start + Duration::from_secs(seconds) + Duration::from_secs(1);
            std::thread::sleep(after_end.saturating_duration_since(Instant::now()));
        });
        // The sampler, on this thread.
        std::thread::sleep(start.saturating_duration_since(Instant::now()));
        let upstream_conns =
            || gateway.connections() + canister.connections() + bridge.connections();
        samples.push(sample(pid, &ctx, Duration::ZERO, upstream_conns()));
        let end = start + Duration::from_secs(seconds);
        let mut next = start + SAMPLE_EVERY;
        while next <= end {
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            let s = sample(pid, &ctx, next - start, upstream_conns());
            println!(
                "  t={:>4} s  RSS {:>6.1} MiB  fds {:>5}  upstream connections {:>6}  finished {:>9}  errors {}",
                s.t.as_secs(),
                s.rss_kib as f64 / 1024.0,
                s.fds,
                s.upstream_conns,
                s.finished,
                s.failed
            );
            samples.push(s);
            // The mocks keep the requests they saw, up to 100,000 each: clear them so the
            // harness's memory stays flat too.
            gateway.clear_requests();
            canister.clear_requests();
            bridge.clear_requests();
            next += SAMPLE_EVERY;
        }
    });
    let deadline = Instant::now() + REQUEST_TIMEOUT + Duration::from_secs(5);
    while ctx.finished.load(Ordering::Relaxed) < ctx.started.load(Ordering::Relaxed)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let unfinished = ctx.started.load(Ordering::Relaxed) - ctx.finished.load(Ordering::Relaxed);
    let load_after = load_average();
    let hwm = status_kib(pid, "VmHWM");
    let log = sidecar.log_lines();
    // The sidecar's own account of what it refused, and its MCP sessions.
    let refusals: Vec<String> = [
        "connections_rejected_total",
        "admission_refused_total",
        "rate_limited_total",
        "hosted_context_failures_total",
        "mcp_sessions",
    ]
    .iter()
    .map(|m| {
        let v = sidecar.metric(&mocks_rt, &format!("knowtation_sidecar_{m}"));
        format!("{m} {v}")
    })
    .collect();

    report(
        &ctx,
        &samples,
        Report {
            rate,
            seconds,
            warmup,
            clients,
            unfinished,
            hwm,
            load_before,
            load_after,
        },
    );
    println!("sidecar metrics at the end: {}", refusals.join(", "));
    println!("sidecar log lines at warn or above: {}", log.len());
    for line in log.iter().take(5) {
        println!("  log: {line}");
    }
    drop(rt);
}

/// The run's settings and end-of-run readings, for [`report`].
struct Report {
    rate: u64,
    seconds: u64,
    warmup: u64,
    clients: u64,
    unfinished: u64,
    hwm: u64,
    load_before: String,
    load_after: String,
}

fn report(ctx: &Ctx, samples: &[Sample], r: Report) {
    let mut all: Vec<u32> = Vec::new();
    println!();
    println!("| kind | requests | req/s | p50 | p99 | p99.9 | max | errors |");
    println!("|---|---|---|---|---|---|---|---|");
    let failed_kind = |kind: &str| -> u64 {
        ctx.errors
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, _)| k.starts_with(kind))
            .map(|(_, n)| n)
            .sum()
    };
    let row = |name: &str, v: &mut Vec<u32>, errors: u64| {
        v.sort_unstable();
        println!(
            "| {name} | {} | {:.0} | {} | {} | {} | {} | {errors} |",
            v.len(),
            v.len() as f64 / r.seconds as f64,
            micros(percentile(v, 0.5)),
            micros(percentile(v, 0.99)),
            micros(percentile(v, 0.999)),
            micros(v.last().copied().unwrap_or(0)),
        );
    };
    for (kind, name) in KINDS.iter().enumerate() {
        let mut v: Vec<u32> = ctx.results[kind]
            .lock()
            .unwrap()
            .iter()
            .map(|(_, us)| *us)
            .collect();
        all.extend_from_slice(&v);
        row(name, &mut v, failed_kind(name));
    }
    let errors = ctx.failed.load(Ordering::Relaxed) + r.unfinished;
    row("**all**", &mut all, errors);

    let mut lag = ctx.lag.lock().unwrap().clone();
    lag.sort_unstable();
    println!(
        "\nscheduler lateness (request task start after its due time): p50 {} p99 {} p99.9 {} max {}",
        micros(percentile(&lag, 0.5)),
        micros(percentile(&lag, 0.99)),
        micros(percentile(&lag, 0.999)),
        micros(lag.last().copied().unwrap_or(0)),
    );
    println!(
        "errors: {errors} ({} unfinished at the end) {:?}",
        r.unfinished,
        ctx.errors.lock().unwrap()
    );

    // CPU over the whole timed run.
    let (first, last) = (&samples[0], &samples[samples.len() - 1]);
    let requests = (last.finished - first.finished).max(1) as f64;
    let per_request = |ticks: u64| ticks as f64 / ticks_per_second() * 1e6 / requests;
    let wall = (last.t - first.t).as_secs_f64();
    let sidecar_ticks = last.sidecar_ticks - first.sidecar_ticks;
    let harness_ticks = last.harness_ticks - first.harness_ticks;
    println!(
        "CPU per request: sidecar {:.1} µs ({:.1} % of one core), harness (generator and mock upstreams) {:.1} µs ({:.1} % of one core)",
        per_request(sidecar_ticks),
        sidecar_ticks as f64 / ticks_per_second() / wall * 100.0,
        per_request(harness_ticks),
        harness_ticks as f64 / ticks_per_second() / wall * 100.0,
    );

    println!(
        "waiting for a CPU over the run: sidecar threads {:.0} ms/s, harness threads {:.0} ms/s; machine CPU pressure (some) {:.0} %",
        last.sidecar_wait_ns.saturating_sub(first.sidecar_wait_ns) as f64 / 1e6 / wall,
        last.harness_wait_ns.saturating_sub(first.harness_wait_ns) as f64 / 1e6 / wall,
        last.pressure_us.saturating_sub(first.pressure_us) as f64 / 1e4 / wall,
    );

    // Per 10 s window: RSS at its end, sidecar CPU, requests due in it, their p99.
    let mut windows: Vec<Vec<u32>> = vec![Vec::new(); samples.len()];
    for kind in &ctx.results {
        for (at_ms, us) in kind.lock().unwrap().iter() {
            let w = (*at_ms as u64 / SAMPLE_EVERY.as_millis() as u64) as usize;
            if let Some(v) = windows.get_mut(w) {
                v.push(*us);
            }
        }
    }
    println!("\n| t (s) | sidecar RSS (MiB) | sidecar CPU (% of a core) | sidecar fds | upstream connections so far | requests due | p99 | run-queue wait, sidecar / harness (ms/s) | machine CPU pressure |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (w, pair) in samples.windows(2).enumerate() {
        let (a, b) = (&pair[0], &pair[1]);
        let v = &mut windows[w];
        v.sort_unstable();
        let secs = (b.t - a.t).as_secs_f64();
        println!(
            "| {} | {:.1} | {:.1} | {} | {} | {} | {} | {:.0} / {:.0} | {:.0} % |",
            b.t.as_secs(),
            b.rss_kib as f64 / 1024.0,
            (b.sidecar_ticks - a.sidecar_ticks) as f64
                / ticks_per_second()
                / (b.t - a.t).as_secs_f64()
                * 100.0,
            b.fds,
            b.upstream_conns,
            v.len(),
            micros(percentile(v, 0.99)),
            (b.sidecar_wait_ns.saturating_sub(a.sidecar_wait_ns)) as f64 / 1e6 / secs,
            (b.harness_wait_ns.saturating_sub(a.harness_wait_ns)) as f64 / 1e6 / secs,
            (b.pressure_us.saturating_sub(a.pressure_us)) as f64 / 1e4 / secs,
        );
    }
    let series: Vec<String> = samples
        .iter()
        .map(|s| format!("{:.1}", s.rss_kib as f64 / 1024.0))
        .collect();
    println!("\nsidecar RSS every 10 s (MiB): {}", series.join(" "));

    // Flatness: the sample at the end of the warm-up against the second half.
    let at_warmup = samples
        .iter()
        .find(|s| s.t.as_secs() >= r.warmup)
        .map_or(0, |s| s.rss_kib);
    let half = r.seconds / 2;
    let max_second_half = samples
        .iter()
        .filter(|s| s.t.as_secs() >= half)
        .map(|s| s.rss_kib)
        .max()
        .unwrap_or(0);
    // Least-squares slope after the warm-up, in KiB a minute.
    let after: Vec<(f64, f64)> = samples
        .iter()
        .filter(|s| s.t.as_secs() >= r.warmup)
        .map(|s| (s.t.as_secs_f64() / 60.0, s.rss_kib as f64))
        .collect();
    let n = after.len() as f64;
    let (mx, my) = (
        after.iter().map(|p| p.0).sum::<f64>() / n,
        after.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let slope = after.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum::<f64>()
        / after.iter().map(|p| (p.0 - mx).powi(2)).sum::<f64>();
    let flat = (max_second_half as f64) <= at_warmup as f64 * 1.10;
    println!(
        "RSS at the end of the warm-up ({} s) {:.1} MiB; highest in the second half {:.1} MiB ({:+.1} %); at the end {:.1} MiB; VmHWM {:.1} MiB; slope after warm-up {:+.1} KiB/min: {}",
        r.warmup,
        at_warmup as f64 / 1024.0,
        max_second_half as f64 / 1024.0,
        (max_second_half as f64 / at_warmup.max(1) as f64 - 1.0) * 100.0,
        last.rss_kib as f64 / 1024.0,
        r.hwm as f64 / 1024.0,
        slope,
        if flat { "FLAT" } else { "GROWING" },
    );
    println!(
        "rate {} req/s, {} clients, {} s; achieved {:.1} req/s; load average before {}, after {}",
        r.rate,
        r.clients,
        r.seconds,
        requests / wall,
        r.load_before,
        r.load_after
    );
    println!(
        "result: {}",
        if errors == 0 && flat { "PASS" } else { "FAIL" }
    );
}
