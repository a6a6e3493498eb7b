//! The main listener: answers the intercepted surfaces through [`RestService`] and
//! [`McpService`] and passes everything else through to the gateway (wire contract §7).
//!
//! Request phase, in order: refuse ambiguous framing (Content-Length beside
//! Transfer-Encoding), too many headers and `CONNECT`; then [`route::routes`] picks
//! the handler once. The section-source route with GET, HEAD or OPTIONS is answered
//! here (a slot of the [`Budget`] is taken only after the token verifies). `POST` on
//! the MCP mount goes through the door: the token from the headers (401 before a slot or
//! a body byte), a slot, the body read within the budget and its deadline, the canonical
//! form; then it is answered here, or the canonical bytes are forwarded and the answer
//! watched (§6). GET and DELETE on `/mcp` are observed (session activity, `DELETE`
//! forgets) and streamed; everything else is streamed to the gateway and back.
//!
//! Bounds: `listen.max_connections` open connections (more are accepted and closed),
//! `listen.header_read_timeout_ms` for a request head, a TLS handshake and a
//! connection's first request, `listen.max_header_bytes` and `listen.max_headers`,
//! `listen.idle_timeout_seconds` without a request in progress (bytes alone, such as
//! HTTP/2 PINGs, keep nothing open), the HTTP/2 stream and reset bounds. Passthrough has
//! no total deadline: `upstream.gateway_timeout_ms` for the answer head after the last
//! request byte, `upstream.gateway_idle_timeout_ms` for a pause inside a body (event
//! streams exempt). Shutdown: readiness goes false, the listener closes, open
//! connections finish their requests (HTTP/2 gets GOAWAY) for up to
//! `shutdown.drain_seconds`, then the rest are closed.

mod conn;
mod deadline;
mod drain;
mod headers;

pub use conn::{BoxError, ProxyBody};
pub use headers::{forward_request_headers, strip_hop_by_hop, Peer};

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::uri::{Authority, Scheme};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body as _, Incoming};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::PrivateKeyDer;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;

use crate::admin::{self, stopped, ProbeTarget, Readiness};
use crate::budget::{self, Budget};
use crate::config::{self, Config, ConfigError, Live, Mode};
use crate::limits::{Admitted, ConnectionLimit};
use crate::mcp::store::Store;
use crate::mcp::{self, McpError, McpService, Sessions, Step, Watch};
use crate::rest::RestService;
use crate::route::{self, Route};
use crate::shadow::{self, Observed, Own};
use crate::telemetry::{self, HeadRefusal, Metrics, Outcome, Shadow, Surface};
use crate::upstream::{self, Connector};
use conn::{ConnIo, ConnState, Tracked};
use deadline::{IdleBody, Progress};
use drain::Drain;

/// Why the sidecar could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A listener could not be bound.
    #[error("cannot bind the {what} address {addr}: {source}")]
    Bind {
        /// `listen` or `admin`.
        what: &'static str,
        /// The configured address.
        addr: SocketAddr,
        /// The OS error.
        source: io::Error,
    },
    /// A server task panicked or was cancelled.
    #[error("a server task failed: {0}")]
    Task(String),
}

/// Everything built from one configuration: what a reload (SIGHUP) would rebuild and
/// swap in through [`Live`]. Listener settings (addresses, TLS, connection bounds) are
/// fixed at start.
pub struct Generation {
    /// The configuration this was built from.
    pub config: Arc<Config>,
    rest: RestService,
    mcp: McpService,
    gateway: GatewayBase,
    client: Client<Connector, IdleBody<Incoming>>,
    /// For `POST /mcp`, whose body the sidecar has buffered (§6 door).
    mcp_client: Client<Connector, Full<Bytes>>,
    /// The gateway's response head, counted from the last request byte sent.
    gateway_timeout: Duration,
    /// The longest pause inside a passed-through body.
    gateway_idle: Duration,
    /// What the readiness probe asks.
    probe: ProbeTarget,
}

impl Generation {
    /// Builds the handlers and the gateway client for `config` (already validated)
    /// around the session table, which outlives every generation.
    pub fn build(
        config: Config,
        metrics: Arc<Metrics>,
        sessions: Arc<Sessions>,
    ) -> Result<Generation, ConfigError> {
        let up = &config.upstream;
        let gateway = GatewayBase::parse(&up.gateway_url)?;
        let connector = upstream::connector(
            up.ca_file.as_deref(),
            Duration::from_millis(up.connect_timeout_ms),
        )?;
        let probe = ProbeTarget {
            connector: connector.clone(),
            base: gateway.uri.clone(),
            timeout: Duration::from_millis(up.gateway_timeout_ms).min(PROBE_TIMEOUT),
        };
        let client = Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(up.pool_max_idle)
            .build(connector.clone());
        let mcp_client = Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(up.pool_max_idle)
            .build(connector);
        let rest = RestService::new(&config, Arc::clone(&metrics))?;
        let mcp = McpService::new(
            &config,
            rest.keys(),
            rest.hosted_client(),
            metrics,
            sessions,
        )?;
        Ok(Generation {
            gateway_timeout: Duration::from_millis(up.gateway_timeout_ms),
            gateway_idle: Duration::from_millis(up.gateway_idle_timeout_ms),
            probe,
            config: Arc::new(config),
            rest,
            mcp,
            gateway,
            client,
            mcp_client,
        })
    }
}

/// The gateway's base URL, split for building upstream URIs.
#[derive(Debug, Clone)]
struct GatewayBase {
    scheme: Scheme,
    authority: Authority,
    /// The base path without its trailing `/` (usually empty).
    prefix: String,
    uri: Uri,
    /// The `Host` every forwarded HTTP/1.1 request carries, when known up front.
    host: Option<HeaderValue>,
}

impl GatewayBase {
    fn parse(url: &str) -> Result<GatewayBase, ConfigError> {
        const KEY: &str = "upstream.gateway_url";
        let invalid = |m: &str| ConfigError::new(KEY, m);
        let uri: Uri = url.trim().parse().map_err(|_| invalid("not a valid URL"))?;
        let scheme = uri
            .scheme()
            .cloned()
            .ok_or_else(|| invalid("needs a scheme"))?;
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| invalid("needs a host"))?;
        let prefix = uri.path().trim_end_matches('/').to_owned();
        Ok(GatewayBase {
            scheme,
            authority,
            prefix,
            host: upstream::http1_host(&uri),
            uri,
        })
    }

    /// The upstream URI: the base plus the original path and query bytes, unchanged.
    fn uri_for(&self, original: &Uri) -> Option<Uri> {
        let pq = original.path_and_query().map_or("/", |pq| pq.as_str());
        let pq = if pq.is_empty() { "/" } else { pq };
        // `*` (OPTIONS *) has no form under a base path.
        if !pq.starts_with('/') {
            return None;
        }
        let builder = Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone());
        let builder = match original.path_and_query() {
            // No base path: the original bytes as they are, without a copy.
            Some(original) if self.prefix.is_empty() && !original.as_str().is_empty() => {
                builder.path_and_query(original.clone())
            }
            _ => builder.path_and_query(format!("{}{pq}", self.prefix)),
        };
        builder.build().ok()
    }
}

/// State shared by every connection.
struct Shared {
    live: Arc<Live<Generation>>,
    sessions: Arc<Sessions>,
    drain: Arc<Drain>,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
    budget: Budget,
    tls: bool,
    max_headers: usize,
}

/// What each connection task needs.
struct ConnCtx {
    shared: Arc<Shared>,
    builder: auto::Builder<TokioExecutor>,
    tls: Option<TlsAcceptor>,
    connections: ConnectionLimit,
    handshake_timeout: Duration,
    idle_timeout: Duration,
    /// A connection that has not begun a request this long after opening is closed.
    first_request_timeout: Duration,
}

struct Tasks {
    main: JoinHandle<()>,
    admin: JoinHandle<()>,
    probe: JoinHandle<()>,
}

/// A started sidecar. Dropping it starts a shutdown without waiting for it.
pub struct Running {
    /// The bound proxy address (useful with port 0).
    pub listen_addr: SocketAddr,
    /// The bound admin address.
    pub admin_addr: SocketAddr,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    admin_stop: watch::Sender<bool>,
    probe_target: watch::Sender<ProbeTarget>,
    tasks: Option<Tasks>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("listen_addr", &self.listen_addr)
            .field("admin_addr", &self.admin_addr)
            .finish_non_exhaustive()
    }
}

/// The gateway probe gives up after this (or the response-head timeout, if shorter).
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// After an idle connection is told to close, it gets this long to go before it is
/// dropped (an HTTP/2 peer that never acknowledges the GOAWAY keeps nothing open).
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// Builds everything `start` builds from `config` (TLS, the CA bundle, the policy, the
/// clients) without binding a port: what `check-config` runs.
pub fn check(config: &Config) -> Result<(), ConfigError> {
    config::validate(config)?;
    server_tls(&config.listen)?;
    Generation::build(
        config.clone(),
        Arc::new(Metrics::new()),
        Arc::new(in_memory_sessions(config)),
    )?;
    Ok(())
}

/// The sections (or keys) read only at start that differ between `old` and `new`.
fn fixed_at_start(old: &Config, new: &Config) -> Vec<&'static str> {
    // Compared in serialized form; none of these sections holds a secret.
    fn differ<T: serde::Serialize>(a: &T, b: &T) -> bool {
        serde_json::to_value(a).ok() != serde_json::to_value(b).ok()
    }
    let mut out = Vec::new();
    if differ(&old.listen, &new.listen) {
        out.push("listen");
    }
    if differ(&old.admin, &new.admin) {
        out.push("admin");
    }
    if differ(&old.state, &new.state) {
        out.push("state");
    }
    if old.log.format != new.log.format {
        out.push("log.format");
    }
    if old.runtime != new.runtime {
        out.push("runtime");
    }
    out
}

/// One warning per surface the configuration leaves inert.
fn warn_inert(config: &Config) {
    for inert in config::inert(config) {
        tracing::warn!(key = inert.key, effect = inert.effect, "surface left inert");
    }
}

fn in_memory_sessions(config: &Config) -> Sessions {
    let m = &config.mcp;
    Sessions::new(m.session_ttl(), m.per_user_cap(), m.max_sessions)
}

fn server_tls(listen: &config::Listen) -> Result<Option<TlsAcceptor>, ConfigError> {
    Ok(match (&listen.tls_cert_file, &listen.tls_key_file) {
        (Some(cert), Some(key)) => Some(TlsAcceptor::from(Arc::new(tls_server_config(cert, key)?))),
        _ => None,
    })
}

/// Validates `config`, binds the proxy and admin listeners and starts serving; returns
/// once both accept connections. Readiness waits for the first gateway probe.
pub async fn start(config: Config) -> Result<Running, StartError> {
    config::validate(&config)?;
    let metrics = Arc::new(Metrics::new());
    let readiness = Arc::new(Readiness::default());
    let listen = config.listen.clone();
    let admin_address = config.admin.address;
    let sessions = Arc::new(match &config.state.directory {
        Some(dir) => {
            let store = Store::open(dir, Arc::clone(&metrics))?;
            let m = &config.mcp;
            let table =
                Sessions::persistent(m.session_ttl(), m.per_user_cap(), m.max_sessions, store);
            tracing::info!(restored = table.len(), "MCP sessions restored");
            metrics.set_mcp_sessions(table.len());
            table
        }
        None => in_memory_sessions(&config),
    });
    let generation = Generation::build(config, Arc::clone(&metrics), Arc::clone(&sessions))?;
    let (probe_target, probe_rx) = watch::channel(generation.probe.clone());
    let tls = server_tls(&listen)?;
    readiness.set_config_loaded();
    warn_inert(&generation.config);

    let listener = bind_with_backlog(listen.address, listen.accept_backlog).map_err(|source| {
        StartError::Bind {
            what: "listen",
            addr: listen.address,
            source,
        }
    })?;
    let admin_listener =
        TcpListener::bind(admin_address)
            .await
            .map_err(|source| StartError::Bind {
                what: "admin",
                addr: admin_address,
                source,
            })?;
    let local = |l: &TcpListener, what, addr| {
        l.local_addr()
            .map_err(|source| StartError::Bind { what, addr, source })
    };
    let listen_addr = local(&listener, "listen", listen.address)?;
    let admin_addr = local(&admin_listener, "admin", admin_address)?;
    readiness.set_listeners_bound();
    tracing::info!(address = %listen_addr, tls = tls.is_some(), "proxy listening");
    tracing::info!(address = %admin_addr, "admin listening");

    let shared = Arc::new(Shared {
        live: Arc::new(Live::new(generation)),
        sessions,
        drain: Arc::new(Drain::new()),
        metrics: Arc::clone(&metrics),
        readiness: Arc::clone(&readiness),
        budget: Budget::new(
            budget::Limits {
                max_in_flight: listen.max_in_flight,
                max_in_flight_per_user: listen.max_in_flight_per_user,
                max_bytes: listen.max_buffered_bytes,
                max_bytes_per_user: listen.max_buffered_bytes_per_user,
            },
            metrics.buffered_bytes_gauge(),
        ),
        tls: tls.is_some(),
        max_headers: listen.max_headers,
    });
    let ctx = Arc::new(ConnCtx {
        shared: Arc::clone(&shared),
        builder: http_builder(&listen),
        tls,
        connections: ConnectionLimit::new(listen.max_connections),
        handshake_timeout: Duration::from_millis(listen.header_read_timeout_ms),
        idle_timeout: Duration::from_secs(listen.idle_timeout_seconds),
        first_request_timeout: Duration::from_millis(listen.header_read_timeout_ms),
    });
    let (stop, stop_rx) = watch::channel(false);
    let (admin_stop, admin_stop_rx) = watch::channel(false);
    let main = tokio::spawn(accept_loop(listener, ctx, stop_rx.clone()));
    let admin = tokio::spawn(admin::serve(
        admin_listener,
        Arc::clone(&readiness),
        Arc::clone(&metrics),
        admin_stop_rx,
    ));
    let probe = tokio::spawn(admin::probe_gateway(probe_rx, readiness, metrics, stop_rx));
    Ok(Running {
        listen_addr,
        admin_addr,
        shared,
        stop,
        admin_stop,
        probe_target,
        tasks: Some(Tasks { main, admin, probe }),
    })
}

impl Running {
    /// Begins a graceful shutdown: readiness turns false, the proxy listener closes, and
    /// requests in progress get `shutdown.drain_seconds` to finish. Returns at once; see
    /// [`Running::wait`].
    pub fn shutdown(&self) {
        self.shared.readiness.set_shutting_down();
        let _ = self.stop.send(true);
    }

    /// Waits until the proxy has stopped (after [`Running::shutdown`], once drained or at
    /// the deadline), then stops the admin listener.
    pub async fn wait(mut self) -> Result<(), StartError> {
        let Some(tasks) = self.tasks.take() else {
            return Ok(());
        };
        let main = tasks.main.await;
        self.shutdown();
        let _ = self.admin_stop.send(true);
        let admin = tasks.admin.await;
        let probe = tasks.probe.await;
        for joined in [main, admin, probe] {
            joined.map_err(|e| StartError::Task(e.to_string()))?;
        }
        tracing::info!("stopped");
        Ok(())
    }

    /// Reloads the per-request settings from `config`, the outcome of loading the
    /// configuration again (SIGHUP): policy, rate limits,
    /// CORS, JWT secrets, upstreams and their timeouts, hosted context, MCP bounds,
    /// shutdown timings, log level and access logging. Requests in progress finish with
    /// the settings they started with; connections and MCP sessions are kept. An invalid
    /// config is refused whole and the running one stays; either way the outcome is
    /// logged and counted. Keys read only at start (`listen.*`, `admin.*`,
    /// `state.directory`, `log.format`, `runtime.threads`) are reported when they changed.
    pub fn reload(&self, config: Result<Config, ConfigError>) -> Result<(), ConfigError> {
        let metrics = &self.shared.metrics;
        match config.and_then(|c| self.try_reload(c)) {
            Ok(fixed) => {
                metrics.config_reload(telemetry::Reload::Applied);
                tracing::info!("configuration reloaded");
                for key in fixed {
                    tracing::warn!(
                        section = key,
                        "changed, but read only at start: restart to apply"
                    );
                }
                Ok(())
            }
            Err(e) => {
                metrics.config_reload(telemetry::Reload::Refused);
                tracing::error!(error = %e, "configuration reload refused; the running configuration stays");
                Err(e)
            }
        }
    }

    fn try_reload(&self, config: Config) -> Result<Vec<&'static str>, ConfigError> {
        config::validate(&config)?;
        let old = self.shared.live.load();
        let fixed = fixed_at_start(&old.config, &config);
        let m = &config.mcp;
        let bounds = (m.session_ttl(), m.per_user_cap(), m.max_sessions);
        let log = config.log.clone();
        let generation = Generation::build(
            config,
            Arc::clone(&self.shared.metrics),
            Arc::clone(&self.shared.sessions),
        )?;
        crate::logging::reload(&log)?;
        self.shared
            .sessions
            .set_bounds(bounds.0, bounds.1, bounds.2);
        self.probe_target.send_replace(generation.probe.clone());
        warn_inert(&generation.config);
        self.shared.live.store(generation);
        Ok(fixed)
    }

    /// Whether `/ready` would answer 200.
    pub fn is_ready(&self) -> bool {
        self.shared.readiness.is_ready()
    }

    /// The metrics of this sidecar.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }

    /// The live configuration handle: a reload stores a new [`Generation`] here without
    /// dropping connections.
    pub fn live(&self) -> &Arc<Live<Generation>> {
        &self.shared.live
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.tasks.is_some() {
            self.shutdown();
            let _ = self.admin_stop.send(true);
        }
    }
}

/// Binds `addr` with an accept queue of `backlog` (the kernel caps it at
/// `net.core.somaxconn`). Refused flood connections reconnect at thousands a second; with
/// tokio's default of 1024 the queue overflowed and an honest client's handshake was
/// dropped and retried a second later.
fn bind_with_backlog(addr: SocketAddr, backlog: u32) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// The TLS server config for `listen.tls_cert_file` / `listen.tls_key_file`, offering
/// h2 and http/1.1 by ALPN.
pub fn tls_server_config(cert: &Path, key: &Path) -> Result<rustls::ServerConfig, ConfigError> {
    const KEY_KEY: &str = "listen.tls_key_file";
    let certs = upstream::load_certs(cert, "listen.tls_cert_file")?;
    let private_key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        ConfigError::new(
            KEY_KEY,
            format!("cannot read a PEM private key from {}: {e}", key.display()),
        )
    })?;
    // The crypto provider is named here, never taken from a process default.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ConfigError::new(KEY_KEY, format!("TLS setup failed: {e}")))?
        .with_no_client_auth()
        .with_single_cert(certs, private_key)
        .map_err(|e| ConfigError::new(KEY_KEY, format!("unusable with the certificate: {e}")))?;
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tls)
}

/// HTTP/1.1 and HTTP/2 (h2c by prior knowledge on plaintext) with the head bounds.
fn http_builder(listen: &config::Listen) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(listen.header_read_timeout_ms))
        .max_buf_size(listen.max_header_bytes)
        .max_headers(listen.max_headers)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(listen.max_header_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(listen.http2_max_concurrent_streams)
        .max_pending_accept_reset_streams(listen.http2_max_pending_accept_reset_streams)
        .max_local_error_reset_streams(listen.http2_max_local_error_reset_streams);
    builder
}

async fn accept_loop(listener: TcpListener, ctx: Arc<ConnCtx>, mut stop: watch::Receiver<bool>) {
    let mut conns = JoinSet::new();
    // Tells open connections to finish: sent once the grace period is over.
    let (close, close_rx) = watch::channel(false);
    let mut grace_until: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            () = stopped(&mut stop), if grace_until.is_none() => {
                // Readiness is already false; load balancers and endpoints need a moment
                // to stop sending here, so new connections are still served meanwhile.
                let grace = ctx.shared.live.load().config.shutdown.grace_seconds;
                tracing::info!(grace_seconds = grace, "shutting down: still accepting during the grace period");
                grace_until = Some(tokio::time::Instant::now() + Duration::from_secs(grace));
            }
            () = tokio::time::sleep_until(grace_until.unwrap_or_else(tokio::time::Instant::now)), if grace_until.is_some() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => match ctx.connections.try_admit() {
                    Some(admitted) => {
                        conns.spawn(serve_connection(
                            stream,
                            peer,
                            Arc::clone(&ctx),
                            admitted,
                            close_rx.clone(),
                        ));
                    }
                    None => {
                        // Over the bound: accepted only to be closed at once.
                        ctx.shared.metrics.connection_rejected();
                        drop(stream);
                    }
                },
                Err(e) => {
                    // Usually out of descriptors; back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        while conns.try_join_next().is_some() {}
    }
    // New connections are refused from here on.
    drop(listener);
    let drain = Duration::from_secs(ctx.shared.live.load().config.shutdown.drain_seconds);
    tracing::info!(
        open_connections = conns.len(),
        in_flight = ctx.shared.drain.in_flight(),
        "draining"
    );
    let _ = close.send(true);
    let shared = Arc::clone(&ctx.shared);
    let drained = tokio::time::timeout(drain, async {
        let streams = async {
            shared.drain.until_idle().await;
            shared.drain.end_streams();
        };
        let connections = async { while conns.join_next().await.is_some() {} };
        tokio::join!(streams, connections);
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            open_connections = conns.len(),
            "drain deadline passed; closing the remaining connections"
        );
        conns.shutdown().await;
    }
}

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    ctx: Arc<ConnCtx>,
    admitted: Admitted,
    stop: watch::Receiver<bool>,
) {
    let _admitted = admitted;
    let _ = stream.set_nodelay(true);
    match &ctx.tls {
        Some(acceptor) => {
            let handshake = tokio::time::timeout(ctx.handshake_timeout, acceptor.accept(stream));
            // A failed or too slow handshake just closes the connection.
            if let Ok(Ok(tls)) = handshake.await {
                drive(tls, peer, &ctx, stop).await;
            }
        }
        None => drive(stream, peer, &ctx, stop).await,
    }
}

/// Serves one connection until it closes, shutting it down gracefully on stop or idle.
async fn drive<S>(stream: S, peer: SocketAddr, ctx: &ConnCtx, mut stop: watch::Receiver<bool>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let state = Arc::new(ConnState::new());
    let io = TokioIo::new(ConnIo::new(stream, Arc::clone(&state)));
    let shared = Arc::clone(&ctx.shared);
    let conn_state = Arc::clone(&state);
    // Formatted once per connection, not per forwarded request.
    let peer = Peer::new(peer);
    let service = service_fn(move |req| {
        let shared = Arc::clone(&shared);
        let conn_state = Arc::clone(&conn_state);
        let peer = peer.clone();
        async move { Ok::<_, Infallible>(handle(shared, conn_state, &peer, req).await) }
    });
    let conn = ctx.builder.serve_connection(io, service);
    tokio::pin!(conn);
    let (idle, first) = (ctx.idle_timeout, ctx.first_request_timeout);
    let mut closing = false;
    // Set when the connection was told to close for idleness: past it, a connection
    // still without a request is dropped whatever the peer does.
    let mut drop_at: Option<tokio::time::Instant> = None;
    loop {
        let idle_at = state.idle_deadline(idle, first);
        tokio::select! {
            done = conn.as_mut() => {
                if let Some(reason) = done.err().and_then(|e| head_refusal(&*e)) {
                    ctx.shared.metrics.head_refused(reason);
                }
                return;
            }
            () = stopped(&mut stop), if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            _ = tokio::time::sleep_until(idle_at), if !closing => {
                if state.is_idle(idle, first) {
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                    drop_at = Some(tokio::time::Instant::now() + CLOSE_GRACE);
                }
            }
            _ = tokio::time::sleep_until(drop_at.unwrap_or_else(tokio::time::Instant::now)), if drop_at.is_some() => {
                if state.active() == 0 {
                    return;
                }
                drop_at = Some(tokio::time::Instant::now() + CLOSE_GRACE);
            }
        }
    }
}

/// Why hyper refused a request head itself, when that is how a connection ended: it
/// answered 400, 431 or 414 before any request reached [`handle`], so nothing else
/// counts it.
fn head_refusal(e: &(dyn std::error::Error + 'static)) -> Option<HeadRefusal> {
    let e = e.downcast_ref::<hyper::Error>()?;
    if e.is_parse_too_large() {
        Some(HeadRefusal::TooLarge)
    } else if e.is_parse() {
        Some(HeadRefusal::Malformed)
    } else {
        None
    }
}

async fn handle(
    shared: Arc<Shared>,
    conn: Arc<ConnState>,
    peer: &Peer,
    req: Request<Incoming>,
) -> Response<Tracked> {
    let active = conn.begin_request();
    // A `GET /mcp` event stream waits for events, not for an answer: shutdown does not
    // wait for it, and ends it once every other request is done.
    // Classified once, here: the drain needs it before the answer, the request phase after.
    let class = route::routes(req.uri()).for_method(req.method());
    let stream = req.method() == Method::GET && class == Route::Mcp;
    let ordinary = (!stream).then(|| shared.drain.begin());
    let head = req.method() == Method::HEAD;
    let mut response = route(&shared, &conn, peer, class, req).await;
    if head && !response.headers().contains_key(header::CONTENT_LENGTH) {
        // The length the GET answer would have (RFC 9110 §8.6), for the sidecar's own
        // answers; a gateway answer carries its own header.
        if let Some(n) = response.body().size_hint().exact().filter(|n| *n > 0) {
            response
                .headers_mut()
                .insert(header::CONTENT_LENGTH, HeaderValue::from(n));
        }
    }
    response.map(|body| {
        // A HEAD answer has no body (RFC 9110 §9.3.2). hyper drops one only on HTTP/1;
        // on HTTP/2 the sidecar's own error answers would carry theirs and clients reset
        // the stream.
        let body = if head {
            Full::new(Bytes::new())
                .map_err(|never| match never {})
                .boxed_unsync()
        } else if stream {
            shared.drain.endable(body).boxed_unsync()
        } else {
            body
        };
        Tracked::new(body, active, ordinary)
    })
}

/// The request phase; `class` is the handler [`route::routes`] finds for the request's
/// path and method, computed once by [`handle`].
async fn route(
    shared: &Shared,
    conn: &ConnState,
    peer: &Peer,
    class: Route,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let started = Instant::now();
    let http1 = req.version() < Version::HTTP_2;
    let te = req.headers().contains_key(header::TRANSFER_ENCODING);
    if http1
        && te
        && (conn.ambiguous_framing() || req.headers().contains_key(header::CONTENT_LENGTH))
    {
        let mut response = local_error(StatusCode::BAD_REQUEST, BAD_REQUEST);
        // The rest of the stream cannot be trusted to be framed as hyper read it.
        close_after(&mut response);
        return finish_local(shared, started, response);
    }
    if req.headers().len() > shared.max_headers {
        return finish_local(
            shared,
            started,
            local_error(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                HEADERS_TOO_LARGE,
            ),
        );
    }
    if req.method() == Method::CONNECT {
        return finish_local(
            shared,
            started,
            local_error(StatusCode::METHOD_NOT_ALLOWED, METHOD_NOT_ALLOWED),
        );
    }
    let generation = shared.live.load();
    // The two largest paths are boxed: every request's future is as large as its largest
    // path and is moved whole several times on its way into hyper, so without the boxes
    // each passthrough and REST request copied about 5 KB for the MCP and shadow states
    // it never uses.
    match (class, req.method()) {
        (Route::SectionSource, &Method::GET | &Method::HEAD | &Method::OPTIONS) => {
            if generation.config.intercept.mode == Mode::Shadow {
                return Box::pin(shadow_intercept(shared, &generation, peer, req, started)).await;
            }
            return intercept(shared, &generation, req, started).await;
        }
        // Every POST is classified: a body the sidecar cannot read never passes (§6).
        (Route::Mcp, &Method::POST) => {
            return Box::pin(mcp_post(shared, &generation, peer, req, started)).await;
        }
        (Route::Mcp, &Method::GET | &Method::DELETE) => {
            generation.mcp.observe(req.method(), req.headers());
        }
        _ => {}
    }
    passthrough(shared, &generation, peer, req, started).await
}

async fn intercept(
    shared: &Shared,
    generation: &Generation,
    req: Request<Incoming>,
    started: Instant,
) -> Response<ProxyBody> {
    let gauge = shared.metrics.in_flight();
    // The body, if any, is never read: the route takes none. The REST table takes its
    // in-flight slot from the budget only once the token has verified.
    let (parts, body) = req.into_parts();
    let (response, mut i) = generation.rest.handle(&parts, &shared.budget).await;
    drop(gauge);
    i.elapsed = started.elapsed();
    shared.metrics.record(&i);
    telemetry::log_intercepted(&i);
    unread(&parts, &body, response)
}

/// Shadow mode on the REST route: the request passes to the gateway as it would without
/// the sidecar, the sidecar's own answer is computed beside it, and the gateway's answer
/// goes back to the client, compared on its way ([`shadow`]).
async fn shadow_intercept(
    shared: &Shared,
    generation: &Generation,
    peer: &Peer,
    req: Request<Incoming>,
    started: Instant,
) -> Response<ProxyBody> {
    let mut own_parts = Request::new(()).into_parts().0;
    own_parts.method = req.method().clone();
    own_parts.uri = req.uri().clone();
    own_parts.version = req.version();
    own_parts.headers = req.headers().clone();
    let own = async {
        let _gauge = shared.metrics.in_flight();
        let (response, mut i, witness) = generation
            .rest
            .handle_shadow(&own_parts, &shared.budget)
            .await;
        i.elapsed = started.elapsed();
        shared.metrics.record(&i);
        telemetry::log_intercepted(&i);
        let limited = matches!(i.outcome, Outcome::RateLimited | Outcome::Overloaded);
        let mut own = Own::from_response(response, limited, witness).await;
        own.compare_body = own_parts.method == Method::GET;
        own
    };
    let (own, gateway) = tokio::join!(own, forward(shared, generation, peer, req));
    let response = match gateway {
        Ok(response) => observe(shared, response, Surface::Rest, own),
        Err(local) => {
            shadow::record(&shared.metrics, Surface::Rest, Shadow::GatewayFailed);
            local
        }
    };
    finish_local(shared, started, response)
}

/// The gateway's answer, compared with `own` once its body has passed.
fn observe(
    shared: &Shared,
    response: Response<ProxyBody>,
    surface: Surface,
    own: Own,
) -> Response<ProxyBody> {
    let (parts, body) = response.into_parts();
    let status = parts.status;
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let compare = move |body: Option<&[u8]>| {
        let gateway = shadow::Gateway {
            status,
            content_type: content_type.as_deref(),
            body,
        };
        match surface {
            Surface::Rest => shadow::compare_rest(&own, &gateway),
            Surface::Mcp => shadow::compare_mcp(&own, &gateway),
        }
    };
    let body = Observed::new(body, surface, Arc::clone(&shared.metrics), compare);
    Response::from_parts(parts, body.boxed_unsync())
}

fn boxed(response: Response<Full<Bytes>>) -> Response<ProxyBody> {
    response.map(|body| body.map_err(|never| match never {}).boxed_unsync())
}

/// Marks an answer head that came from the gateway (it carries the gateway's CORS).
#[derive(Clone, Copy)]
struct FromGateway;

/// How long an `initialize` answer waits for its session record to reach the disk.
const STORE_WAIT: Duration = Duration::from_secs(5);

/// `POST /mcp` (wire contract §6). Every answer the sidecar builds itself carries the
/// gateway's CORS headers (§5), as the gateway's own answers do.
async fn mcp_post(
    shared: &Shared,
    generation: &Generation,
    peer: &Peer,
    req: Request<Incoming>,
    started: Instant,
) -> Response<ProxyBody> {
    let origin = req.headers().get(header::ORIGIN).cloned();
    let mut response = mcp_exchange(shared, generation, peer, req, started).await;
    if response.extensions().get::<FromGateway>().is_none() {
        generation.mcp.cors(response.headers_mut(), origin.as_ref());
    }
    response
}

/// The door, the decision, then either the sidecar's own answer or the buffered bytes
/// forwarded and the answer watched.
async fn mcp_exchange(
    shared: &Shared,
    generation: &Generation,
    peer: &Peer,
    req: Request<Incoming>,
    started: Instant,
) -> Response<ProxyBody> {
    let service = &generation.mcp;
    let (mut parts, body) = req.into_parts();
    // The token first, from the headers alone: an unauthenticated caller gets its 401
    // before it holds a slot or a buffered byte (§6 door).
    let identity = match service.authenticate(&parts.headers) {
        Ok(identity) => identity,
        Err(e) => return unread(&parts, &body, service.refuse(&e, started)),
    };
    let mut slot = match shared.budget.admit(&identity.sub) {
        Ok(slot) => slot,
        Err(r) => {
            return unread(
                &parts,
                &body,
                service.refuse(&McpError::Overloaded(r), started),
            )
        }
    };
    let gauge = shared.metrics.in_flight();
    let canonical = match service.read_body(&parts.headers, body, &mut slot).await {
        Ok(c) => c,
        Err(e) => {
            let mut response = service.refuse(&e, started);
            if parts.version < Version::HTTP_2 {
                // The body may be half read: this connection's framing is spent.
                close_after(&mut response);
            }
            return boxed(response);
        }
    };
    let watch = match service
        .post(&parts, identity, &canonical.value, started)
        .await
    {
        Step::Answer(r) => return boxed(r),
        Step::Forward(w) => w,
    };
    drop(gauge);
    // What leaves is the sidecar's own serialization, never the client's bytes (§6).
    let body = Bytes::from(canonical.text);
    drop(canonical.value);
    // The slot is free once classified; the forwarded bytes stay counted until the
    // gateway's answer head shows it has taken them.
    let reservation = slot.into_reservation();

    let Some(uri) = generation.gateway.uri_for(&parts.uri) else {
        return finish_local(
            shared,
            started,
            local_error(StatusCode::BAD_REQUEST, BAD_REQUEST),
        );
    };
    parts.uri = uri;
    parts.version = Version::HTTP_11;
    forward_request_headers(
        &mut parts.headers,
        peer,
        shared.tls,
        generation.gateway.host.as_ref(),
    );
    parts.headers.remove(header::CONTENT_ENCODING);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    parts
        .headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    let upstream = generation
        .mcp_client
        .request(Request::from_parts(parts, Full::new(body)));
    let head = deadline::await_head(upstream, generation.gateway_timeout, &Progress::new()).await;
    drop(reservation);
    let response = match head {
        Some(Ok(response)) => {
            let (mut parts, body) = response.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            parts.extensions.insert(FromGateway);
            if let Some(durable) = service.learn(&watch, &parts) {
                // A store that cannot keep up delays the answer a little, never forever;
                // the session stays in memory either way.
                let _ = tokio::time::timeout(STORE_WAIT, durable).await;
            }
            match watch {
                Watch::Rewrite(rewrite) if parts.status.is_success() => {
                    let read =
                        http_body_util::Limited::new(body, mcp::MAX_LIST_ANSWER_BYTES).collect();
                    let collected = tokio::time::timeout(generation.gateway_timeout, read).await;
                    let Ok(Ok(collected)) = collected else {
                        return boxed(service.refuse(&McpError::BadGateway, started));
                    };
                    let original = collected.to_bytes();
                    // Every value, joined as a fetch client reads a repeated header: with
                    // only the first, a `text/html` ahead of `application/json` left a list
                    // unrewritten that clients parse as JSON.
                    let content_type = parts
                        .headers
                        .get_all(header::CONTENT_TYPE)
                        .iter()
                        .map(|v| String::from_utf8_lossy(v.as_bytes()))
                        .collect::<Vec<_>>()
                        .join(", ");
                    let content_type = (!content_type.is_empty()).then_some(content_type);
                    let body = match service.rewrite(rewrite, content_type.as_deref(), &original) {
                        Ok(new) => new,
                        Err(e) => return boxed(service.refuse(&e, started)),
                    };
                    // The length changed; the server frames the new body itself.
                    parts.headers.remove(header::CONTENT_LENGTH);
                    boxed(Response::from_parts(parts, Full::new(body)))
                }
                Watch::Shadow(own) => {
                    let body = idle_bounded(&parts.headers, body, generation.gateway_idle);
                    observe(
                        shared,
                        Response::from_parts(parts, body),
                        Surface::Mcp,
                        *own,
                    )
                }
                _ => {
                    let body = idle_bounded(&parts.headers, body, generation.gateway_idle);
                    Response::from_parts(parts, body)
                }
            }
        }
        Some(Err(e)) => {
            shadow_failed(shared, &watch);
            gateway_failed(&e)
        }
        None => {
            shadow_failed(shared, &watch);
            local_error(StatusCode::GATEWAY_TIMEOUT, GATEWAY_TIMEOUT)
        }
    };
    finish_local(shared, started, response)
}

/// Counts a shadowed call whose gateway answer never came.
fn shadow_failed(shared: &Shared, watch: &Watch) {
    if matches!(watch, Watch::Shadow(_)) {
        shadow::record(&shared.metrics, Surface::Mcp, Shadow::GatewayFailed);
    }
}

/// An answer sent without reading the request body: on HTTP/1 the connection is closed
/// after it when a body was announced, since the unread bytes would otherwise be parsed
/// as the next request (or have to be read for nothing).
fn unread(
    parts: &http::request::Parts,
    body: &Incoming,
    response: Response<Full<Bytes>>,
) -> Response<ProxyBody> {
    let mut response = boxed(response);
    if parts.version < Version::HTTP_2 && !body.is_end_stream() {
        close_after(&mut response);
    }
    response
}

/// Ends an HTTP/1 connection after `response` (`Connection: close`).
fn close_after<B>(response: &mut Response<B>) {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
}

/// A gateway answer body that may pause at most `gap` between frames, unless it is an
/// event stream (a quiet `GET /mcp` stream is waiting for events, not stalled).
fn idle_bounded(headers: &HeaderMap, body: Incoming, gap: Duration) -> ProxyBody {
    let event_stream = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .get(..17)
                .is_some_and(|t| t.eq_ignore_ascii_case("text/event-stream"))
        });
    let gap = (!event_stream).then_some(gap);
    IdleBody::new(body, gap, None).boxed_unsync()
}

async fn passthrough(
    shared: &Shared,
    generation: &Generation,
    peer: &Peer,
    req: Request<Incoming>,
    started: Instant,
) -> Response<ProxyBody> {
    let response = match forward(shared, generation, peer, req).await {
        Ok(r) | Err(r) => r,
    };
    finish_local(shared, started, response)
}

/// Sends `req` to the gateway (wire contract §7): its answer, or the sidecar's own error
/// answer when there is none.
async fn forward(
    shared: &Shared,
    generation: &Generation,
    peer: &Peer,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Response<ProxyBody>> {
    let (mut parts, body) = req.into_parts();
    let Some(uri) = generation.gateway.uri_for(&parts.uri) else {
        return Err(local_error(StatusCode::BAD_REQUEST, BAD_REQUEST));
    };
    parts.uri = uri;
    // The client speaks HTTP/1.1 or negotiates h2 with the gateway on its own.
    parts.version = Version::HTTP_11;
    forward_request_headers(
        &mut parts.headers,
        peer,
        shared.tls,
        generation.gateway.host.as_ref(),
    );
    // No total deadline: the request body may pause at most the idle gap, and the answer
    // head is awaited for the head timeout after the last request byte went out.
    let sent = Progress::new();
    let body = IdleBody::new(body, Some(generation.gateway_idle), Some(sent.clone()));
    let upstream = generation.client.request(Request::from_parts(parts, body));
    match deadline::await_head(upstream, generation.gateway_timeout, &sent).await {
        Some(Ok(response)) => {
            let (mut parts, body) = response.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            let body = idle_bounded(&parts.headers, body, generation.gateway_idle);
            Ok(Response::from_parts(parts, body))
        }
        Some(Err(e)) if client_body_failed(&e) => {
            // The client's body broke (bad chunking, a stall past the idle gap): its
            // fault, not the gateway's, and the rest of the stream cannot be framed.
            let mut response = local_error(StatusCode::BAD_REQUEST, BAD_REQUEST);
            close_after(&mut response);
            Err(response)
        }
        Some(Err(e)) => Err(gateway_failed(&e)),
        None => Err(local_error(StatusCode::GATEWAY_TIMEOUT, GATEWAY_TIMEOUT)),
    }
}

/// Whether a forward failed because the request body the client sent yielded an error
/// (hyper's "user body" kind), rather than because of the gateway.
fn client_body_failed(e: &hyper_util::client::legacy::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if s.downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_user)
        {
            return true;
        }
        source = s.source();
    }
    false
}

/// The gateway could not be reached or broke off: 502, with only the error's kind logged.
fn gateway_failed(e: &hyper_util::client::legacy::Error) -> Response<ProxyBody> {
    let kind = if e.is_connect() { "connect" } else { "other" };
    tracing::warn!(
        upstream = "gateway",
        error_kind = kind,
        "gateway request failed"
    );
    local_error(StatusCode::BAD_GATEWAY, BAD_GATEWAY)
}

/// Records and logs a passthrough-route answer.
fn finish_local(
    shared: &Shared,
    started: Instant,
    response: Response<ProxyBody>,
) -> Response<ProxyBody> {
    let status = response.status().as_u16();
    let elapsed = started.elapsed();
    shared.metrics.record_passthrough(status, elapsed);
    telemetry::log_passthrough(status, elapsed);
    response
}

const BAD_REQUEST: &str = r#"{"error":"Bad Request","code":"BAD_REQUEST"}"#;
const HEADERS_TOO_LARGE: &str =
    r#"{"error":"Request Header Fields Too Large","code":"HEADERS_TOO_LARGE"}"#;
const METHOD_NOT_ALLOWED: &str = r#"{"error":"Method Not Allowed","code":"METHOD_NOT_ALLOWED"}"#;
const BAD_GATEWAY: &str = r#"{"error":"Bad Gateway","code":"BAD_GATEWAY"}"#;
const GATEWAY_TIMEOUT: &str = r#"{"error":"Gateway Timeout","code":"GATEWAY_TIMEOUT"}"#;

fn local_error(status: StatusCode, body: &'static str) -> Response<ProxyBody> {
    let mut response = Response::new(
        Full::new(Bytes::from_static(body.as_bytes()))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn upstream_uri_keeps_path_and_query_bytes() {
        let base = GatewayBase::parse("http://gw.internal:3000/").expect("base");
        let original: Uri = "/a/./b/../c//d%2f?x=%2F&y=a+b&z=%&w=%zz"
            .parse()
            .expect("uri");
        let uri = base.uri_for(&original).expect("upstream");
        assert_eq!(
            uri.to_string(),
            "http://gw.internal:3000/a/./b/../c//d%2f?x=%2F&y=a+b&z=%&w=%zz"
        );
        let prefixed = GatewayBase::parse("https://gw/base/").expect("base");
        let uri = prefixed
            .uri_for(&"/x?q".parse().expect("uri"))
            .expect("upstream");
        assert_eq!(uri.to_string(), "https://gw/base/x?q");
        assert!(base.uri_for(&"*".parse().expect("uri")).is_none());
    }
}
