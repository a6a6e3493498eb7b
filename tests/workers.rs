//! The worker model through the real binary, with more workers than this machine may
//! have cores (`runtime.threads = 4`): connections are served by several workers, and
//! what the process promises as a whole still holds exactly across them: the metrics,
//! the connection limit, one user's share of the requests at the gateway, a reload and
//! the drain.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[path = "support/sidecar.rs"]
mod support;

use support::{free_addr, passthrough, token, Metrics, BIN, SECRET};

const WORKERS: usize = 4;

/// A gateway on loopback that answers every request with its own name, counting them
/// (but for the readiness probe's);
/// while `hold` is true, a request waits before its answer.
struct Gateway {
    addr: SocketAddr,
    name: &'static str,
    seen: Arc<AtomicUsize>,
    hold: watch::Sender<bool>,
}

impl Gateway {
    async fn start(name: &'static str) -> Gateway {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(AtomicUsize::new(0));
        let (hold, hold_rx) = watch::channel(false);
        let counter = Arc::clone(&seen);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, name, Arc::clone(&counter), hold_rx.clone()));
            }
        });
        Gateway {
            addr,
            name,
            seen,
            hold,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn seen(&self) -> usize {
        self.seen.load(Ordering::SeqCst)
    }
}

/// Keep-alive: request heads without bodies, one answer each.
async fn serve(
    mut stream: TcpStream,
    name: &'static str,
    seen: Arc<AtomicUsize>,
    mut hold: watch::Receiver<bool>,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        // The sidecar's readiness probe asks for the base URL: not counted.
        let probe = buf.starts_with(b"GET / ");
        buf.drain(..end);
        if !probe {
            seen.fetch_add(1, Ordering::SeqCst);
        }
        let _ = hold.wait_for(|held| !*held).await;
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{name}",
            name.len()
        );
        if stream.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// Writes `text` to a configuration file named for `tag` and this test process.
fn write_config(tag: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("ks-workers-{tag}-{}.toml", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

/// `serve --config config` with nothing from this environment; stderr piped.
fn spawn_serve(config: &Path) -> Child {
    Command::new(BIN)
        .args(["serve", "--config"])
        .arg(config)
        .env_clear()
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The binary, run with a configuration file (so a reload reads it again).
struct Daemon {
    child: Child,
    addr: SocketAddr,
    admin: SocketAddr,
    config: PathBuf,
    log: Arc<Mutex<Vec<u8>>>,
}

impl Daemon {
    fn config_text(addr: SocketAddr, admin: SocketAddr, gateway: &str, extra: &str) -> String {
        format!(
            "[listen]\naddress = \"{addr}\"\n{extra}\n[admin]\naddress = \"{admin}\"\n\
             [upstream]\ngateway_url = \"{gateway}\"\n[auth]\njwt_secrets = [\"{SECRET}\"]\n\
             [runtime]\nthreads = {WORKERS}\n[shutdown]\ngrace_seconds = 0\ndrain_seconds = 5\n"
        )
    }

    /// `extra`: lines for `[listen]`.
    async fn start(tag: &str, gateway: &Gateway, extra: &str) -> Daemon {
        let (addr, admin) = (free_addr(), free_addr());
        let config = write_config(
            tag,
            &Daemon::config_text(addr, admin, &gateway.url(), extra),
        );
        let mut child = spawn_serve(&config);
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut pipe = child.stderr.take().unwrap();
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            use std::io::Read as _;
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        let daemon = Daemon {
            child,
            addr,
            admin,
            config,
            log,
        };
        let ready = support::eventually(Duration::from_secs(20), || {
            std::net::TcpStream::connect(daemon.addr).is_ok()
                && std::net::TcpStream::connect(daemon.admin).is_ok()
        })
        .await;
        assert!(ready, "never listened: {}", daemon.log());
        daemon
    }

    fn log(&self) -> String {
        String::from_utf8_lossy(&self.log.lock().unwrap()).into_owned()
    }

    fn signal(&self, sig: &str) {
        let sent = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
    }

    async fn metrics(&self) -> Metrics {
        let mut s = TcpStream::connect(self.admin).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).await.unwrap();
        let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        Metrics::parse(body)
    }

    /// Per worker thread: its CPU ticks so far.
    fn worker_ticks(&self) -> Vec<u64> {
        let dir = format!("/proc/{}/task", self.child.id());
        let mut out = Vec::new();
        for task in std::fs::read_dir(dir).unwrap().flatten() {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            if !comm.starts_with("worker-") {
                continue;
            }
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            let fields: Vec<&str> = stat
                .rsplit_once(')')
                .map_or(vec![], |(_, f)| f.split_whitespace().collect());
            let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
            out.push(ticks(11).unwrap_or(0) + ticks(12).unwrap_or(0));
        }
        out
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.config);
    }
}

/// A keep-alive client connection sending `GET path` requests.
struct Conn(TcpStream);

impl Conn {
    async fn open(addr: SocketAddr) -> Conn {
        Conn(TcpStream::connect(addr).await.unwrap())
    }

    /// The status and body of one request, or `None` when the connection ended.
    async fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> Option<(u16, String)> {
        let mut req = format!("GET {path} HTTP/1.1\r\nHost: x\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        self.0.write_all(req.as_bytes()).await.ok()?;
        read_answer(&mut self.0).await
    }
}

/// One answer with a `content-length` body.
async fn read_answer(s: &mut TcpStream) -> Option<(u16, String)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let status = head.get(9..12)?.parse().ok()?;
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    Some((
        status,
        String::from_utf8_lossy(&buf[head_end..head_end + length]).into_owned(),
    ))
}

/// Requests on many connections are served by more than one worker, every one answered
/// and counted once in the metrics the workers keep apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connections_spread_over_the_workers_and_every_request_counts_once() {
    let gateway = Gateway::start("gw-a").await;
    let daemon = Daemon::start("spread", &gateway, "").await;
    let before = daemon.metrics().await;
    assert_eq!(daemon.worker_ticks().len(), WORKERS, "{}", daemon.log());
    let (conns, each) = (32, 60);
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let addr = daemon.addr;
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::open(addr).await;
            for _ in 0..each {
                assert_eq!(
                    c.get("/api/v1/echo", &[]).await,
                    Some((200, "gw-a".to_owned()))
                );
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(gateway.seen(), conns * each);
    let after = daemon.metrics().await;
    let counted = after.get(&passthrough("2xx")) - before.get(&passthrough("2xx"));
    assert_eq!(counted, (conns * each) as f64);
    let busy = daemon.worker_ticks().iter().filter(|t| **t > 0).count();
    assert!(
        busy >= 2,
        "one worker served everything: {:?}",
        daemon.worker_ticks()
    );
}

/// `listen.max_connections` counts the process's connections, whichever worker took them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_limit_holds_across_workers() {
    let gateway = Gateway::start("gw-a").await;
    let daemon = Daemon::start("limit", &gateway, "max_connections = 3").await;
    let mut open = Vec::new();
    for _ in 0..3 {
        let mut c = Conn::open(daemon.addr).await;
        assert_eq!(c.get("/x", &[]).await.map(|a| a.0), Some(200));
        open.push(c);
    }
    // The fourth is accepted and closed at once, on whichever worker.
    let mut fourth = Conn::open(daemon.addr).await;
    assert_eq!(fourth.get("/x", &[]).await, None);
    let m = daemon.metrics().await;
    assert_eq!(m.get("knowtation_sidecar_connections_rejected_total"), 1.0);
    // One closed makes room for one more.
    drop(open.pop());
    let mut again = None;
    for _ in 0..100 {
        let mut c = Conn::open(daemon.addr).await;
        if c.get("/x", &[]).await.is_some() {
            again = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(again.is_some(), "no room came back");
}

/// One user's share of the requests at the gateway is exact over all workers: of six
/// requests at once on six connections, two reach the gateway and four are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_users_share_at_the_gateway_is_exact_across_workers() {
    let gateway = Gateway::start("gw-a").await;
    gateway.hold.send_replace(true);
    let daemon = Daemon::start("share", &gateway, "max_forwarded_in_flight_per_user = 2").await;
    let bearer = format!("Bearer {}", token("alice"));
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let (addr, bearer) = (daemon.addr, bearer.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::open(addr).await;
            c.get("/api/v1/echo", &[("authorization", &bearer)])
                .await
                .map(|a| a.0)
        }));
    }
    // Four refusals come at once; then the two held are let go.
    let refused = support::eventually(Duration::from_secs(10), || {
        tasks.iter().filter(|t| t.is_finished()).count() == 4
    })
    .await;
    assert!(refused, "not four answers before the gateway answered");
    assert_eq!(gateway.seen(), 2);
    gateway.hold.send_replace(false);
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    statuses.sort_unstable();
    assert_eq!(
        statuses,
        [
            Some(200),
            Some(200),
            Some(503),
            Some(503),
            Some(503),
            Some(503)
        ]
    );
    let m = daemon.metrics().await;
    assert_eq!(
        m.get("knowtation_sidecar_admission_refused_total{reason=\"user_forwarded_in_flight\"}"),
        4.0
    );
}

/// A reload (SIGHUP) reaches every worker: each open connection's next request goes to
/// the gateway the new configuration names.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reload_reaches_every_worker() {
    let (a, b) = (Gateway::start("gw-a").await, Gateway::start("gw-b").await);
    let daemon = Daemon::start("reload", &a, "").await;
    let mut conns = Vec::new();
    for _ in 0..16 {
        let mut c = Conn::open(daemon.addr).await;
        assert_eq!(c.get("/x", &[]).await, Some((200, a.name.to_owned())));
        conns.push(c);
    }
    let mut file = std::fs::File::create(&daemon.config).unwrap();
    file.write_all(Daemon::config_text(daemon.addr, daemon.admin, &b.url(), "").as_bytes())
        .unwrap();
    drop(file);
    daemon.signal("-HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = daemon.metrics().await;
        if m.get("knowtation_sidecar_config_reloads_total{result=\"applied\"}") >= 1.0 {
            break;
        }
        assert!(Instant::now() < deadline, "no reload: {}", daemon.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for c in &mut conns {
        assert_eq!(c.get("/x", &[]).await, Some((200, b.name.to_owned())));
    }
    assert_eq!(b.seen(), conns.len());
}

/// SIGTERM drains every worker: requests in progress on all of them finish, then the
/// process exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_drain_waits_for_every_workers_requests() {
    let gateway = Gateway::start("gw-a").await;
    gateway.hold.send_replace(true);
    let mut daemon = Daemon::start("drain", &gateway, "").await;
    let n = 12;
    let mut tasks = Vec::new();
    for _ in 0..n {
        let addr = daemon.addr;
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::open(addr).await;
            c.get("/x", &[]).await
        }));
    }
    let held = support::eventually(Duration::from_secs(10), || gateway.seen() == n).await;
    assert!(held, "{} of {n} at the gateway", gateway.seen());
    let busy = daemon.worker_ticks().len();
    assert_eq!(busy, WORKERS);
    daemon.signal("-TERM");
    // Still draining while the gateway holds the answers.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(daemon.child.try_wait().unwrap().is_none(), "exited early");
    gateway.hold.send_replace(false);
    for t in tasks {
        assert_eq!(t.await.unwrap(), Some((200, "gw-a".to_owned())));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = daemon.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "did not exit: {}", daemon.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status}: {}", daemon.log());
}

/// The listening sockets share their port only among this process's workers: a second
/// sidecar started on the same address fails to bind instead of taking a share of the
/// connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_on_the_same_port_fails_to_start() {
    let gateway = Gateway::start("gw-a").await;
    let first = Daemon::start("first", &gateway, "").await;
    let config = write_config(
        "second",
        &Daemon::config_text(first.addr, free_addr(), &gateway.url(), ""),
    );
    let mut second = spawn_serve(&config);
    let exited = support::eventually(Duration::from_secs(10), || {
        matches!(second.try_wait(), Ok(Some(_)))
    })
    .await;
    if !exited {
        let _ = second.kill();
    }
    let out = second.wait_with_output().unwrap();
    let _ = std::fs::remove_file(&config);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        exited && !out.status.success(),
        "the second one started: {stderr}"
    );
    assert!(
        stderr.contains("cannot bind the listen address"),
        "{stderr}"
    );
    // The first still serves every connection.
    for _ in 0..8 {
        let mut c = Conn::open(first.addr).await;
        assert_eq!(c.get("/x", &[]).await, Some((200, "gw-a".to_owned())));
    }
}
