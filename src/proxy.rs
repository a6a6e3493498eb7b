//! The main listener: answers the intercepted surfaces through [`RestService`] and
//! [`McpService`] and passes everything else through to the gateway (wire contract §7).
//! This module starts, reloads and stops it; the data path runs through its parts:
//!
//! - `listener`: accepting connections and serving each one. Bounds:
//!   `listen.max_connections` open connections (more are accepted and closed),
//!   `listen.header_read_timeout_ms` for a request head, a TLS handshake and a
//!   connection's first request, `listen.max_header_bytes` and `listen.max_headers`,
//!   `listen.idle_timeout_seconds` without a request in progress (bytes alone, such as
//!   HTTP/2 PINGs, keep nothing open), the HTTP/2 stream and reset bounds.
//! - `dispatch`: the request phase. Ambiguous framing (Content-Length beside
//!   Transfer-Encoding), too many headers and `CONNECT` are refused; then
//!   [`route::routes`](crate::route::routes) picks the handler once. The section-source
//!   route with GET, HEAD or OPTIONS is answered by the sidecar (a slot of the
//!   [`Budget`] is taken only after the token verifies).
//! - `mcp_post`: `POST` on the MCP mount goes through the door: the token from the
//!   headers (401 before a slot or a body byte), a slot, the body read within the budget
//!   and its deadline, the canonical form; then it is answered here, or the canonical
//!   bytes are forwarded and the answer watched (§6).
//! - `mcp_session`: GET, HEAD and DELETE on `/mcp` are answered here on a session the
//!   caller does not hold, else streamed (a `DELETE` forgets); the gateway's answer to
//!   a request on a live session is read as far as needed to tell whether the gateway
//!   still knows the session (§6: alive at both or at neither).
//! - `gateway`: everything else is streamed to the gateway and back.
//!   Passthrough has no total deadline: `upstream.gateway_timeout_ms` for the answer head
//!   after the last request byte, `upstream.gateway_idle_timeout_ms` for a pause inside a
//!   body (event streams exempt).
//! - `answer`: the sidecar's own error answers and their record.
//!
//! Shutdown: readiness goes false, the listener closes, open connections finish their
//! requests (HTTP/2 gets GOAWAY) for up to `shutdown.drain_seconds`, then the rest are
//! closed.

mod answer;
mod conn;
mod deadline;
mod dispatch;
mod drain;
mod forwarded;
mod gateway;
mod headers;
mod listener;
mod mcp_post;
mod mcp_session;
mod sanitize;
mod window;
mod workers;

pub use conn::{BoxError, ProxyBody};
pub use forwarded::{Trust, Walk};
pub use headers::{forward_request_headers, strip_hop_by_hop, Downstream, Peer};

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioExecutor;
use hyper_util::server::conn::auto;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::PrivateKeyDer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use crate::admin::{self, ProbeTarget, Readiness};
use crate::auth::Keys;
use crate::budget::{self, Budget};
use crate::config::{self, Config, ConfigError, Live};
use crate::limits::{ConnectionLimit, ForwardedLimit};
use crate::mcp::store::Store;
use crate::mcp::{McpService, Policy, Sessions};
use crate::rest::RestService;
use crate::telemetry::{self, Metrics, UpstreamName};
use crate::upstream;
use drain::Drain;
use gateway::GatewayBase;
use listener::http_builder;

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
    /// The token secrets, to sort passed-through requests by whether their token verifies.
    keys: Keys,
    gateway: GatewayBase,
    /// The proxies in front whose forwarding headers count (`[forwarded]`).
    trust: Trust,
    /// The gateway's client: passthrough and `POST /mcp` share its connections.
    client: upstream::Client,
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
        let trust = Trust::new(&config.forwarded)?;
        let connector = upstream::connector(up.ca_file.as_deref())?;
        let unusable = |e: upstream::UnsupportedUrl| ConfigError::new(GATEWAY_URL, e.to_string());
        let settings = upstream::PoolSettings::new(up);
        let workers = crate::worker::count_here(config.runtime.threads);
        let probe = ProbeTarget {
            client: upstream::Client::new(
                &gateway.uri,
                &connector,
                upstream::PoolSettings {
                    max_idle: 1,
                    max_idle_per_caller: 1,
                    ..settings
                },
                upstream::unobserved(),
            )
            .map_err(unusable)?,
            base: gateway.uri.clone(),
            timeout: Duration::from_millis(up.gateway_timeout_ms).min(PROBE_TIMEOUT),
        };
        let client = upstream::Client::new(
            &gateway.uri,
            &connector,
            settings.for_workers(workers),
            metrics.fault_observer(UpstreamName::Gateway),
        )
        .map_err(unusable)?;
        // One policy for both surfaces: who answers each view, and which roles may.
        let policy = match &config.mcp.policy_file {
            Some(p) => Policy::load(p)?,
            None => Policy::default(),
        };
        let rest = RestService::new(&config, Arc::clone(&metrics), policy.clone())?;
        let mcp = McpService::new(
            &config,
            rest.keys(),
            rest.hosted_client(),
            metrics,
            sessions,
            policy,
        )?;
        Ok(Generation {
            keys: rest.keys(),
            gateway_timeout: Duration::from_millis(up.gateway_timeout_ms),
            gateway_idle: Duration::from_millis(up.gateway_idle_timeout_ms),
            probe,
            config: Arc::new(config),
            rest,
            mcp,
            gateway,
            trust,
            client,
        })
    }
}

/// What every connection of one worker reads: each worker holds its own copy, so the
/// reference counts a request takes and drops are the worker's own; the limits, tables
/// and counters behind them are the process's.
#[derive(Clone)]
struct Shared {
    live: Arc<Live<Generation>>,
    sessions: Arc<Sessions>,
    drain: Arc<Drain>,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
    budget: Budget,
    /// Requests at the gateway from identified callers (`listen.max_forwarded_in_flight`,
    /// `listen.max_forwarded_in_flight_per_user`).
    forwarded: budget::Forwarded,
    /// Requests at the gateway without a verified token
    /// (`listen.max_forwarded_in_flight_anonymous`).
    forwarded_anonymous: ForwardedLimit,
    /// Event streams among the identified callers' places (`listen.max_event_streams`).
    event_streams: ForwardedLimit,
    tls: bool,
    max_headers: usize,
}

/// What each connection task of one worker needs.
#[derive(Clone)]
struct ConnCtx {
    shared: Arc<Shared>,
    builder: auto::Builder<TokioExecutor>,
    tls: Option<TlsAcceptor>,
    connections: ConnectionLimit,
    handshake_timeout: Duration,
    idle_timeout: Duration,
    /// A connection that has not begun a request this long after opening is closed.
    first_request_timeout: Duration,
    /// A connection whose client takes no waiting bytes this long is closed.
    write_stall_timeout: Duration,
}

struct Tasks {
    /// Resolves once every worker has drained and stopped.
    main: JoinHandle<Result<(), String>>,
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

/// The key of the gateway's URL in errors.
const GATEWAY_URL: &str = "upstream.gateway_url";

/// The gateway probe gives up after this (or the response-head timeout, if shorter).
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Builds everything `start` builds from `config` (the state directory, TLS, the CA
/// bundle, the policy, the clients) without binding a port or leaving a file behind:
/// what `check-config` runs.
pub fn check(config: &Config) -> Result<(), ConfigError> {
    config::validate(config)?;
    if let Some(dir) = &config.state.directory {
        crate::mcp::store::check(dir)?;
    }
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
    if differ(&old.tracing, &new.tracing) {
        out.push("tracing");
    }
    out
}

/// The configuration's warnings ([`config::warnings`]: each inert surface, shadow mode),
/// and the intercept mode in the metrics.
fn warn_start(config: &Config, metrics: &Metrics) {
    for w in config::warnings(config) {
        tracing::warn!(key = w.key, effect = w.effect, "{}", w.message);
    }
    metrics.set_intercept_mode(config.intercept.mode == config::Mode::Shadow);
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
    let workers = crate::worker::count_here(config.runtime.threads);
    let metrics = Arc::new(Metrics::for_workers(workers));
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
    warn_start(&generation.config, &metrics);

    let listeners =
        workers::bind(listen.address, listen.accept_backlog, workers).map_err(|source| {
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
    let listen_addr = workers::local_addr(&listeners).map_err(|source| StartError::Bind {
        what: "listen",
        addr: listen.address,
        source,
    })?;
    let admin_addr = admin_listener
        .local_addr()
        .map_err(|source| StartError::Bind {
            what: "admin",
            addr: admin_address,
            source,
        })?;
    readiness.set_listeners_bound();
    tracing::info!(address = %listen_addr, tls = tls.is_some(), "proxy listening");
    tracing::info!(address = %admin_addr, "admin listening");

    let shared = Arc::new(Shared {
        live: Arc::new(Live::for_workers(generation, workers)),
        sessions,
        drain: Arc::new(Drain::new(workers)),
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
        forwarded: budget::Forwarded::new(
            listen.max_forwarded_in_flight,
            listen.max_forwarded_in_flight_per_user,
        ),
        forwarded_anonymous: ForwardedLimit::new(listen.max_forwarded_in_flight_anonymous),
        event_streams: ForwardedLimit::new(listen.max_event_streams),
        tls: tls.is_some(),
        max_headers: listen.max_headers,
    });
    let ctx = ConnCtx {
        shared: Arc::clone(&shared),
        builder: http_builder(&listen),
        tls,
        connections: ConnectionLimit::new(listen.max_connections),
        handshake_timeout: Duration::from_millis(listen.header_read_timeout_ms),
        idle_timeout: Duration::from_secs(listen.idle_timeout_seconds),
        first_request_timeout: Duration::from_millis(listen.header_read_timeout_ms),
        write_stall_timeout: Duration::from_millis(listen.write_stall_timeout_ms),
    };
    let (stop, stop_rx) = watch::channel(false);
    let (admin_stop, admin_stop_rx) = watch::channel(false);
    let workers = workers::spawn(listeners, &ctx, &stop_rx).map_err(|source| StartError::Bind {
        what: "listen",
        addr: listen.address,
        source,
    })?;
    let main = tokio::spawn(workers.wait());
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
        main.map_err(|e| StartError::Task(e.to_string()))?
            .map_err(StartError::Task)?;
        for joined in [admin, probe] {
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
    /// `state.directory`, `log.format`, `runtime.threads`, `tracing.*`) are reported when they changed.
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
        warn_start(&generation.config, &self.shared.metrics);
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
