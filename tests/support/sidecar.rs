//! The real binary (`serve`) for the tests that drive it: configured through its environment,
//! its log (stderr, JSON, debug level) collected as it comes, its admin listener scraped,
//! and a raw HTTP/1.1 exchange that reports exactly what came back, incomplete bodies
//! and resets included.
// Each test file uses its own part of this module.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Read;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use knowtation_testkit::{client, sign_token, unix_now};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const BIN: &str = env!("CARGO_BIN_EXE_knowtation-sidecar");
pub const SECRET: &str = "faults-test-secret-0123456789abcdef";

/// Every canary starts with this; none may reach a log line or a metric, and none that
/// an upstream sent may reach an answer the sidecar builds itself.
pub const CANARY: &str = "CANARY-";

/// A loopback port nothing listens on (until someone binds it again).
pub fn free_addr() -> SocketAddr {
    StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A caller token: an MCP access token with read and write scopes, valid for an hour
/// (accepted on both surfaces, wire contract §1).
pub fn token(sub: &str) -> String {
    sign_token(
        SECRET,
        json!({"sub": sub, "type": "mcp_access", "scopes": ["vault:read", "vault:write"], "exp": unix_now() + 3600}),
    )
}

/// The running binary.
pub struct Sidecar {
    child: Child,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    /// Every byte the process wrote to stdout and stderr, in arrival order.
    log: Arc<Mutex<Vec<u8>>>,
    /// The threads reading the two pipes; each ends when its pipe closes.
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Sidecar {
    /// Starts `serve` with the test secret, debug JSON logs, no shutdown grace and
    /// `env` (keys after `KNOWTATION_SIDECAR_`, such as `UPSTREAM__GATEWAY_URL`).
    pub fn spawn(env: &[(&str, String)]) -> Sidecar {
        let (addr, admin) = (free_addr(), free_addr());
        let mut cmd = Command::new(BIN);
        cmd.arg("serve")
            .env_clear()
            .env("KNOWTATION_SIDECAR_LISTEN__ADDRESS", addr.to_string())
            .env("KNOWTATION_SIDECAR_ADMIN__ADDRESS", admin.to_string())
            .env("KNOWTATION_SIDECAR_AUTH__JWT_SECRETS", SECRET)
            .env("KNOWTATION_SIDECAR_LOG__LEVEL", "debug")
            .env("KNOWTATION_SIDECAR_LOG__FORMAT", "json")
            .env("KNOWTATION_SIDECAR_SHUTDOWN__GRACE_SECONDS", "0")
            .env("KNOWTATION_SIDECAR_SHUTDOWN__DRAIN_SECONDS", "2")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(format!("KNOWTATION_SIDECAR_{k}"), v);
        }
        pass_runtime_threads(&mut cmd);
        let mut child = cmd.spawn().expect("binary starts");
        let log = Arc::new(Mutex::new(Vec::new()));
        // Read both pipes as they fill, so a chatty log never blocks the process.
        let mut readers = Vec::new();
        for mut pipe in [
            Box::new(child.stderr.take().unwrap()) as Box<dyn Read + Send>,
            Box::new(child.stdout.take().unwrap()),
        ] {
            let log = Arc::clone(&log);
            readers.push(std::thread::spawn(move || {
                let mut buf = [0u8; 8192];
                while let Ok(n) = pipe.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    log.lock().unwrap().extend_from_slice(&buf[..n]);
                }
            }));
        }
        Sidecar {
            child,
            addr,
            admin,
            log,
            readers,
        }
    }

    /// Waits (at most 20 s) until `/ready` answers 200.
    pub async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self.ready().await == 200 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("sidecar never became ready:\n{}", self.log());
    }

    /// The status of `/ready` (0 when the admin listener does not answer).
    pub async fn ready(&self) -> u16 {
        client::get(&format!("http://{}/ready", self.admin), &[])
            .await
            .map_or(0, |r| r.status.as_u16())
    }

    /// A scrape of `/metrics`.
    pub async fn metrics(&self) -> Metrics {
        let r = client::get(&format!("http://{}/metrics", self.admin), &[])
            .await
            .expect("metrics answer");
        assert_eq!(r.status, 200);
        Metrics::parse(&r.text())
    }

    /// A scrape taken once every series of `expected` has moved by at least its amount
    /// since `before`, or after a second. Some counters are recorded just after the
    /// client has its answer: a head hyper refused is counted when its connection's task
    /// ends, which can be after the client read the answer and the close.
    pub async fn metrics_settled(&self, before: &Metrics, expected: &[(String, f64)]) -> Metrics {
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            let after = self.metrics().await;
            let settled = expected
                .iter()
                .all(|(series, delta)| after.get(series) - before.get(series) >= *delta);
            if settled || Instant::now() >= deadline {
                return after;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Everything logged so far.
    pub fn log(&self) -> String {
        String::from_utf8_lossy(&self.log.lock().unwrap()).into_owned()
    }

    /// Stops the process with SIGTERM and returns its whole log.
    pub fn stop(self) -> String {
        String::from_utf8_lossy(&self.stop_bytes()).into_owned()
    }

    /// [`Sidecar::stop`], with the log's bytes exactly as written.
    pub fn stop_bytes(mut self) -> Vec<u8> {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                assert!(status.success(), "exit status after SIGTERM: {status}");
                // Everything written is read once both pipes have closed.
                for reader in self.readers.drain(..) {
                    reader.join().expect("a log reader");
                }
                return self.log.lock().unwrap().clone();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("sidecar did not stop after SIGTERM");
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One scrape: every sample line, keyed by name and labels as exposed.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    pub samples: BTreeMap<String, f64>,
    pub text: String,
}

impl Metrics {
    pub fn parse(text: &str) -> Metrics {
        let samples = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                Some((series.to_owned(), value.parse().ok()?))
            })
            .collect();
        Metrics {
            samples,
            text: text.to_owned(),
        }
    }

    /// The value of one series (`name{labels}` exactly as exposed); 0 when absent.
    pub fn get(&self, series: &str) -> f64 {
        self.samples.get(series).copied().unwrap_or(0.0)
    }

    /// Every counter series that changed since `before`, with its change (histogram
    /// buckets, sums and counts left out, and the `process_*` families, which move on
    /// their own).
    pub fn moved_since(&self, before: &Metrics) -> BTreeMap<String, f64> {
        self.samples
            .iter()
            .filter(|(k, _)| !k.contains("_bucket") && !k.contains("_sum") && !k.contains("_count"))
            .filter(|(k, _)| !k.starts_with("process_"))
            .filter_map(|(k, v)| {
                let d = v - before.get(k);
                (d != 0.0).then(|| (k.clone(), d))
            })
            .collect()
    }

    /// The counters that moved since `before`, as `name+delta` without the metric prefix
    /// (the in-flight and buffered gauges left out): the tail of a matrix report line.
    pub fn moved_summary(&self, before: &Metrics) -> String {
        self.moved_since(before)
            .into_iter()
            .filter(|(k, _)| !k.contains("_in_flight_") && !k.contains("_buffered_"))
            .map(|(k, d)| format!("{}+{d}", k.trim_start_matches("knowtation_sidecar_")))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// `knowtation_sidecar_intercepted_requests_total{surface,outcome}`.
pub fn intercepted(surface: &str, outcome: &str) -> String {
    format!(
        "knowtation_sidecar_intercepted_requests_total{{outcome=\"{outcome}\",surface=\"{surface}\"}}"
    )
}

/// `knowtation_sidecar_upstream_reads_total{surface,status_class}`.
pub fn upstream_reads(surface: &str, class: &str) -> String {
    format!(
        "knowtation_sidecar_upstream_reads_total{{status_class=\"{class}\",surface=\"{surface}\"}}"
    )
}

/// `knowtation_sidecar_passthrough_requests_total{status_class}`.
pub fn passthrough(class: &str) -> String {
    format!("knowtation_sidecar_passthrough_requests_total{{status_class=\"{class}\"}}")
}

/// `knowtation_sidecar_tokens_verified_total{surface,check}`.
pub fn tokens_verified(surface: &str, check: &str) -> String {
    format!("knowtation_sidecar_tokens_verified_total{{check=\"{check}\",surface=\"{surface}\"}}")
}

/// `knowtation_sidecar_head_refused_total{reason}`.
pub fn head_refused(reason: &str) -> String {
    format!("knowtation_sidecar_head_refused_total{{reason=\"{reason}\"}}")
}

pub const HOSTED_FAILURES: &str = "knowtation_sidecar_hosted_context_failures_total";
pub const IN_FLIGHT: &str = "knowtation_sidecar_in_flight_requests";
pub const BUFFERED: &str = "knowtation_sidecar_buffered_body_bytes";

/// What came back on one connection.
#[derive(Debug, Clone, Default)]
pub struct Raw {
    /// Every byte received.
    pub bytes: Vec<u8>,
    /// Status of the answer head (0 when no complete head arrived).
    pub status: u16,
    /// Header lines, names lowercased, in order.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
    /// Whether the body ended as its framing says (length reached, last chunk, or a
    /// clean close for a close-delimited body).
    pub complete: bool,
    /// Whether reading ended with an error (a reset) rather than a clean close.
    pub reset: bool,
    /// Whether reading stopped at the timeout.
    pub timed_out: bool,
    /// From the first byte written to the end of reading.
    pub elapsed: Duration,
}

impl Raw {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn header_all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn all_text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }

    fn parse(&mut self) {
        let Some(split) = self.bytes.windows(4).position(|w| w == b"\r\n\r\n") else {
            return;
        };
        let head = String::from_utf8_lossy(&self.bytes[..split]).into_owned();
        let mut lines = head.split("\r\n");
        self.status = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        self.headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        let raw = self.bytes[split + 4..].to_vec();
        let no_body = self.status == 204 || self.status == 304 || self.status < 200;
        if no_body {
            self.complete = true;
            return;
        }
        if self
            .header("transfer-encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
        {
            let (body, complete) = dechunk(&raw);
            self.body = body;
            self.complete = complete;
        } else if let Some(n) = self
            .header("content-length")
            .and_then(|v| v.parse::<usize>().ok())
        {
            self.complete = raw.len() >= n;
            self.body = raw[..raw.len().min(n)].to_vec();
        } else {
            self.complete = !self.reset && !self.timed_out;
            self.body = raw;
        }
    }
}

/// A chunked body and whether its last chunk arrived.
fn dechunk(mut raw: &[u8]) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    loop {
        let Some(end) = raw.windows(2).position(|w| w == b"\r\n") else {
            return (out, false);
        };
        let size_text = String::from_utf8_lossy(&raw[..end]);
        let size_text = size_text.split(';').next().unwrap_or("").trim();
        let Ok(size) = usize::from_str_radix(size_text, 16) else {
            return (out, false);
        };
        raw = &raw[end + 2..];
        if size == 0 {
            return (out, true);
        }
        if raw.len() < size + 2 {
            out.extend_from_slice(&raw[..raw.len().min(size)]);
            return (out, false);
        }
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

/// Writes `request` on a fresh connection and reads until the peer closes, resets, or
/// `timeout` passes (or `max_bytes` arrived, then hangs up).
pub async fn exchange_capped(
    addr: SocketAddr,
    request: &[u8],
    timeout: Duration,
    max_bytes: usize,
) -> Raw {
    let t0 = Instant::now();
    let mut raw = Raw::default();
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(request).await.expect("write");
    let read = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match s.read(&mut buf).await {
                Ok(0) => return false,
                Ok(n) => {
                    raw.bytes.extend_from_slice(&buf[..n]);
                    if raw.bytes.len() >= max_bytes {
                        return false;
                    }
                }
                Err(_) => return true,
            }
        }
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(reset) => raw.reset = reset,
        Err(_) => raw.timed_out = true,
    }
    raw.elapsed = t0.elapsed();
    raw.parse();
    raw
}

/// [`exchange_capped`] with no byte cap beyond 64 MiB.
pub async fn exchange(addr: SocketAddr, request: &[u8], timeout: Duration) -> Raw {
    exchange_capped(addr, request, timeout, 64 * 1024 * 1024).await
}

/// `GET target` with these extra header lines and `Connection: close`.
pub fn get_request(target: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    let mut r = format!("GET {target} HTTP/1.1\r\nHost: sidecar.test\r\n");
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str("Connection: close\r\n\r\n");
    r.into_bytes()
}

/// [`get_request`] with `n` extra headers `X-H0: v`, `X-H1: v`, …: a head with more
/// headers than `listen.max_headers` allows.
pub fn many_headers_request(target: &str, n: usize) -> Vec<u8> {
    let names: Vec<String> = (0..n).map(|i| format!("X-H{i}")).collect();
    let headers: Vec<(&str, &str)> = names.iter().map(|k| (k.as_str(), "v")).collect();
    get_request(target, &headers)
}

/// `POST target` with a JSON body, these extra header lines and `Connection: close`.
pub fn post_request(target: &str, headers: &[(&str, &str)], body: &str) -> Vec<u8> {
    let mut r = format!(
        "POST {target} HTTP/1.1\r\nHost: sidecar.test\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str("Connection: close\r\n\r\n");
    r.push_str(body);
    r.into_bytes()
}

/// The first `data:` line of an SSE body, parsed.
pub fn sse_message(body: &str) -> serde_json::Value {
    body.lines()
        .find_map(|l| l.strip_prefix("data: "))
        .and_then(|d| serde_json::from_str(d).ok())
        .unwrap_or(serde_json::Value::Null)
}

/// Asserts that no canary is in `text`, naming where it was looked for.
pub fn assert_no_canary(cell: &str, what: &str, text: &str) {
    if let Some(at) = text.find(CANARY) {
        let from = at.saturating_sub(200);
        let to = (at + 200).min(text.len());
        let around = text.get(from..to).unwrap_or("(not on a char boundary)");
        panic!("[{cell}] a canary reached {what}: …{around}…");
    }
}

/// Polls `cond` every 20 ms for up to `within`; true once it holds.
pub async fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The runtime under test: `KNOWTATION_SIDECAR_RUNTIME__THREADS` from the test's own
/// environment, when set (`.ci/run` runs these tests on the single-threaded runtime too).
pub fn pass_runtime_threads(cmd: &mut Command) {
    const KEY: &str = "KNOWTATION_SIDECAR_RUNTIME__THREADS";
    // A test that sets its own keeps it.
    let own = cmd.get_envs().any(|(k, _)| k == KEY);
    if let (Ok(threads), false) = (std::env::var(KEY), own) {
        cmd.env(KEY, threads);
    }
}
