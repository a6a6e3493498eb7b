//! Outbound exchanges with the gateway, canister and bridge ([`Client`]): the sidecar's
//! own HTTP/1.1 ([`wire`]) on keep-alive connections driven by the requesting task,
//! over TCP for http upstreams and over rustls for https ones (ALPN `http/1.1`),
//! trusting the system roots plus an optional CA file. Answers are read strictly and an
//! idle connection serves only the caller it served before (`upstream.reuse`).

mod pool;
pub mod wire;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::uri::{Scheme, Uri};
use http::{HeaderValue, Request, Response};
use hyper::body::Body;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};

pub use crate::config::Reuse;
use crate::config::{self, ConfigError};
use crate::worker::PerWorker;
pub use pool::Answer as AnswerBody;
use wire::WireError;

/// The error type of request bodies sent upstream.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why an exchange with an upstream failed. Neither the messages nor the sources carry
/// anything an upstream sent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No connection could be made (refused, unreachable, the connect timeout, TLS).
    #[error("cannot connect to the upstream")]
    Connect(#[source] BoxError),
    /// The request body being sent failed: the client's fault, not the upstream's.
    #[error("the request body failed")]
    ClientBody(#[source] BoxError),
    /// The upstream broke off, or answered what cannot be read.
    #[error("the upstream exchange failed")]
    Exchange(#[source] BoxError),
}

impl Error {
    /// Whether no connection could be made.
    pub fn is_connect(&self) -> bool {
        matches!(self, Error::Connect(_))
    }

    /// Whether the request body failed.
    pub fn is_client_body(&self) -> bool {
        matches!(self, Error::ClientBody(_))
    }
}

/// One client connection of the sidecar, numbered at accept: the unit of reuse for
/// callers without a verified token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnId(u64);

impl ConnId {
    /// A number no other connection of this process has had.
    pub fn next() -> ConnId {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        ConnId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// The client connection a request came on, as the proxy records it in the request's
/// extensions; a number of its own when none is recorded (the request then shares
/// nothing under `reuse = "connection"`).
pub fn conn_of(extensions: &http::Extensions) -> ConnId {
    extensions
        .get::<ConnId>()
        .copied()
        .unwrap_or_else(ConnId::next)
}

/// Whom an exchange is for, which decides the idle connections it may use (see
/// [`Reuse`]).
#[derive(Debug, Clone, Copy)]
pub enum Caller<'a> {
    /// A caller whose token verified: its `sub`, a scope that separates its exchanges
    /// further (the vault, for the canister; empty elsewhere), and the client connection
    /// it came on.
    Principal {
        /// The token's `sub`.
        sub: &'a str,
        /// The vault, or empty.
        scope: &'a str,
        /// The client connection.
        conn: ConnId,
    },
    /// A caller without a verified token, on this client connection.
    Anonymous(ConnId),
    /// The sidecar itself (the readiness probe).
    Sidecar,
}

/// What went wrong with an upstream's framing: the answer was refused, or its connection
/// closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The answer broke a rule of [`wire`] and was refused.
    Wire(WireError),
    /// Bytes came after a complete answer (at once, or while the connection was idle):
    /// the connection was closed, never used again.
    BytesAfterAnswer,
}

impl Fault {
    /// Every fault, for label sets.
    pub const ALL: [Fault; 8] = [
        Fault::Wire(WireError::Head),
        Fault::Wire(WireError::HeadTooLarge),
        Fault::Wire(WireError::Upgrade),
        Fault::Wire(WireError::Length),
        Fault::Wire(WireError::TransferCoding),
        Fault::Wire(WireError::Bodiless),
        Fault::Wire(WireError::Chunked),
        Fault::BytesAfterAnswer,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::Wire(WireError::Head) => "malformed_head",
            Fault::Wire(WireError::HeadTooLarge) => "head_too_large",
            Fault::Wire(WireError::Upgrade) => "upgrade",
            Fault::Wire(WireError::Length) => "ambiguous_length",
            Fault::Wire(WireError::TransferCoding) => "transfer_coding",
            Fault::Wire(WireError::Bodiless) => "bodiless_status",
            Fault::Wire(WireError::Chunked) => "malformed_chunked",
            Fault::BytesAfterAnswer => "bytes_after_answer",
        }
    }
}

/// Told of every [`Fault`] of one upstream's answers (the metrics).
pub type Observer = Arc<dyn Fn(Fault) + Send + Sync>;

/// An observer that counts nothing.
pub fn unobserved() -> Observer {
    Arc::new(|_| {})
}

/// How an upstream's connections are kept.
#[derive(Debug, Clone, Copy)]
pub struct PoolSettings {
    /// The connect timeout (TCP, and the TLS handshake for https).
    pub connect_timeout: Duration,
    /// How long an idle connection is kept (`upstream.pool_idle_timeout_ms`).
    pub idle_timeout: Duration,
    /// Most idle connections kept in all (`upstream.pool_max_idle`).
    pub max_idle: usize,
    /// Most idle connections kept for one caller
    /// (`upstream.pool_max_idle_per_principal`).
    pub max_idle_per_caller: usize,
    /// Who may use an idle connection (`upstream.reuse`).
    pub reuse: Reuse,
    /// Workers using the client: each gets a pool of its own (see [`Client`]).
    pub workers: usize,
}

impl PoolSettings {
    /// The `[upstream]` settings.
    pub fn new(up: &config::Upstream) -> PoolSettings {
        PoolSettings {
            connect_timeout: Duration::from_millis(up.connect_timeout_ms),
            idle_timeout: Duration::from_millis(up.pool_idle_timeout_ms),
            max_idle: up.pool_max_idle,
            max_idle_per_caller: up.pool_max_idle_per_principal,
            reuse: up.reuse,
            workers: 1,
        }
    }

    /// The same for `workers` workers.
    pub fn for_workers(self, workers: usize) -> PoolSettings {
        PoolSettings { workers, ..self }
    }
}

/// The URL is not an absolute http or https URL with a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("must be an absolute http or https URL with a host")]
pub struct UnsupportedUrl;

/// A client for one upstream; clones share its connections. Each worker
/// ([`crate::worker`]) has a pool of its own: a connection is made, used, kept idle and
/// reaped on one worker's event loop, and no lock or counter of the pool is touched by
/// two workers. `upstream.pool_max_idle` is shared out among the workers' pools; the
/// per-caller bound holds in each.
#[derive(Debug, Clone)]
pub struct Client {
    pools: Arc<PerWorker<Arc<pool::Pool>>>,
}

impl Client {
    /// A client for the upstream at `base` (http or https), its faults told to
    /// `observer`.
    pub fn new(
        base: &Uri,
        connector: &Connector,
        settings: PoolSettings,
        observer: Observer,
    ) -> Result<Client, UnsupportedUrl> {
        let workers = settings.workers.max(1);
        let mut pools = Vec::with_capacity(workers);
        for index in 0..workers {
            // `max_idle` shared out: the pools together keep no more than it.
            let share = PoolSettings {
                max_idle: settings.max_idle / workers
                    + usize::from(index < settings.max_idle % workers),
                ..settings
            };
            let tls = Some(Arc::clone(&connector.tls));
            let observer = Arc::clone(&observer);
            let pool = pool::Pool::new(base, tls, &share, observer).ok_or(UnsupportedUrl)?;
            pools.push(Arc::new(pool));
        }
        let pools = PerWorker::from_values(pools).ok_or(UnsupportedUrl)?;
        Ok(Client {
            pools: Arc::new(pools),
        })
    }

    /// Sends `request` for `caller`: only the path and query of its URI are used, the
    /// authority is this client's upstream. The answer once its head has come.
    /// Redirects are never followed.
    pub async fn request<B>(
        &self,
        request: Request<B>,
        caller: Caller<'_>,
    ) -> Result<Response<AnswerBody>, Error>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: Into<BoxError>,
    {
        self.pools.get().send(request, caller).await
    }
}

/// The TLS settings of https upstreams: the trusted roots, HTTP/1.1 by ALPN.
#[derive(Clone)]
pub struct Connector {
    tls: Arc<ClientConfig>,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector").finish_non_exhaustive()
    }
}

/// Most certificates read from one PEM file.
const MAX_PEM_CERTS: usize = 1024;

/// Builds the TLS settings of https upstreams: trusting the system roots and, when
/// given, the PEM certificates in `ca_file` (`upstream.ca_file`). ALPN offers
/// `http/1.1` only: the one framing reader ([`wire`]) reads every upstream, and a
/// connection carries one caller's exchanges, so HTTP/2's multiplexing would buy nothing.
pub fn connector(ca_file: Option<&Path>) -> Result<Connector, ConfigError> {
    const KEY: &str = "upstream.ca_file";
    let mut roots = RootCertStore::empty();
    // A system root rustls cannot parse is skipped.
    let (_added, _skipped) = roots.add_parsable_certificates(system_roots().iter().cloned());
    if let Some(path) = ca_file {
        for cert in load_certs(path, KEY)? {
            roots
                .add(cert)
                .map_err(|e| ConfigError::new(KEY, format!("unusable certificate: {e}")))?;
        }
    }
    // The crypto provider is named here, never taken from a process default.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ConfigError::new(KEY, format!("TLS setup failed: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Connector { tls: Arc::new(tls) })
}

/// The `Host` value of a request to `uri`, exactly as the client would format it on
/// every request (the host, and the port unless it is the scheme's default), so a caller
/// can compute it once per upstream and set it. `None` unless `uri` is http or https.
pub fn http1_host(uri: &Uri) -> Option<HeaderValue> {
    let default_port = match uri.scheme() {
        Some(s) if *s == Scheme::HTTP => 80,
        Some(s) if *s == Scheme::HTTPS => 443,
        _ => return None,
    };
    let host = uri.host()?;
    let value = match uri.port_u16() {
        Some(port) if port != default_port => format!("{host}:{port}"),
        _ => host.to_owned(),
    };
    HeaderValue::from_str(&value).ok()
}

/// The system's trusted roots, read once per process (a few hundred files).
fn system_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| rustls_native_certs::load_native_certs().certs)
}

/// Reads the PEM certificates of `path` (at least one); errors name `key`.
pub fn load_certs(path: &Path, key: &str) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let iter = CertificateDer::pem_file_iter(path)
        .map_err(|e| ConfigError::new(key, format!("cannot read {}: {e}", path.display())))?;
    let mut certs = Vec::new();
    for cert in iter {
        let cert = cert.map_err(|e| {
            ConfigError::new(
                key,
                format!("{}: not a PEM certificate: {e}", path.display()),
            )
        })?;
        if certs.len() == MAX_PEM_CERTS {
            return Err(ConfigError::new(
                key,
                format!("{}: more than {MAX_PEM_CERTS} certificates", path.display()),
            ));
        }
        certs.push(cert);
    }
    if certs.is_empty() {
        return Err(ConfigError::new(
            key,
            format!("{}: no PEM certificate found", path.display()),
        ));
    }
    Ok(certs)
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    fn host(url: &str) -> Option<String> {
        let uri: Uri = url.parse().expect("uri");
        http1_host(&uri).map(|v| v.to_str().expect("ascii").to_owned())
    }

    #[test]
    fn the_host_is_what_the_client_would_send() {
        assert_eq!(
            host("http://gw.internal:3000/").as_deref(),
            Some("gw.internal:3000")
        );
        assert_eq!(
            host("http://gw.internal:80/base").as_deref(),
            Some("gw.internal")
        );
        assert_eq!(host("http://gw.internal").as_deref(), Some("gw.internal"));
        assert_eq!(
            host("http://127.0.0.1:8080").as_deref(),
            Some("127.0.0.1:8080")
        );
        assert_eq!(host("http://[::1]:8080/").as_deref(), Some("[::1]:8080"));
        assert_eq!(host("http://user@gw:81/").as_deref(), Some("gw:81"));
        assert_eq!(
            host("https://gw.internal:3000/").as_deref(),
            Some("gw.internal:3000")
        );
        assert_eq!(host("https://gw.internal/").as_deref(), Some("gw.internal"));
        assert_eq!(
            host("https://gw.internal:443/").as_deref(),
            Some("gw.internal")
        );
        assert_eq!(host("ftp://gw.internal/"), None);
    }
}
