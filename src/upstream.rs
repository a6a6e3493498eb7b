//! Outbound exchanges with the gateway, canister and bridge ([`Client`]): on plain http,
//! the sidecar's own HTTP/1.1 ([`wire`]) on pooled connections driven by the requesting
//! task; on https, hyper's pooled client over rustls (h2 or HTTP/1.1 by ALPN), trusting
//! the system roots plus an optional CA file.

mod pool;
pub mod wire;

use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::uri::{Scheme, Uri};
use http::{HeaderValue, Request, Response};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};

use crate::config::{self, ConfigError};

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

    fn from_hyper(e: hyper_util::client::legacy::Error) -> Error {
        if e.is_connect() {
            return Error::Connect(e.into());
        }
        // hyper's "user body" kind: the body being sent yielded an error.
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            if s.downcast_ref::<hyper::Error>()
                .is_some_and(hyper::Error::is_user)
            {
                return Error::ClientBody(e.into());
            }
            source = s.source();
        }
        Error::Exchange(e.into())
    }
}

/// How an upstream's connections are kept.
#[derive(Debug, Clone, Copy)]
pub struct PoolSettings {
    /// The TCP connect timeout (plain http; the connector has its own for https).
    pub connect_timeout: Duration,
    /// How long an idle connection is kept.
    pub idle_timeout: Duration,
    /// Most idle connections kept (`upstream.pool_max_idle`).
    pub max_idle: usize,
}

impl PoolSettings {
    /// The `[upstream]` settings, with idle connections kept for `idle_timeout`.
    pub fn new(up: &config::Upstream, idle_timeout: Duration) -> PoolSettings {
        PoolSettings {
            connect_timeout: Duration::from_millis(up.connect_timeout_ms),
            idle_timeout,
            max_idle: up.pool_max_idle,
        }
    }
}

/// A client for one upstream, sending request bodies of type `B`. Plain-http upstreams
/// share one pool among the clients made from it with [`Client::for_body`].
pub struct Client<B> {
    kind: Kind<B>,
    connector: Connector,
    settings: PoolSettings,
}

enum Kind<B> {
    Plain(Arc<pool::Pool>),
    Tls(Box<hyper_util::client::legacy::Client<Connector, B>>),
}

impl<B> std::fmt::Debug for Client<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.kind {
            Kind::Plain(_) => "plain",
            Kind::Tls(_) => "tls",
        };
        f.debug_struct("Client")
            .field("kind", &kind)
            .finish_non_exhaustive()
    }
}

impl<B> Client<B>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    /// A client for the upstream at `base` (http or https).
    pub fn new(base: &Uri, connector: Connector, settings: PoolSettings) -> Client<B> {
        let pool = pool::Pool::new(
            base,
            settings.connect_timeout,
            settings.idle_timeout,
            settings.max_idle,
        );
        let kind = match pool {
            Some(pool) => Kind::Plain(Arc::new(pool)),
            None => Kind::Tls(Box::new(tls_client(&connector, settings))),
        };
        Client {
            kind,
            connector,
            settings,
        }
    }

    /// A client for the same upstream with bodies of type `C`, sharing this one's
    /// connections on plain http.
    pub fn for_body<C>(&self) -> Client<C>
    where
        C: Body<Data = Bytes> + Send + Unpin + 'static,
        C::Error: Into<BoxError>,
    {
        let kind = match &self.kind {
            Kind::Plain(pool) => Kind::Plain(Arc::clone(pool)),
            Kind::Tls(_) => Kind::Tls(Box::new(tls_client(&self.connector, self.settings))),
        };
        Client {
            kind,
            connector: self.connector.clone(),
            settings: self.settings,
        }
    }

    /// Whether the upstream is plain http, where a request's URI only gives its path and
    /// query (an origin-form URI will do); https needs the absolute URI.
    pub fn is_plain(&self) -> bool {
        matches!(self.kind, Kind::Plain(_))
    }

    /// Sends `request` (an absolute URI on this client's upstream, see
    /// [`Client::is_plain`]); the answer once its head has come. Redirects are never
    /// followed.
    pub async fn request(&self, request: Request<B>) -> Result<Response<AnswerBody>, Error> {
        match &self.kind {
            Kind::Plain(pool) => Ok(pool.send(request).await?.map(AnswerBody::Plain)),
            Kind::Tls(client) => Ok(client
                .request(request)
                .await
                .map_err(Error::from_hyper)?
                .map(AnswerBody::Tls)),
        }
    }
}

fn tls_client<B>(
    connector: &Connector,
    settings: PoolSettings,
) -> hyper_util::client::legacy::Client<Connector, B>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(settings.idle_timeout)
        .pool_max_idle_per_host(settings.max_idle)
        .build(connector.clone())
}

/// The body of an upstream's answer.
#[derive(Debug)]
pub enum AnswerBody {
    /// From a plain-http upstream.
    Plain(pool::Answer),
    /// From an https upstream.
    Tls(Incoming),
}

impl Body for AnswerBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        match self.get_mut() {
            AnswerBody::Plain(body) => Pin::new(body).poll_frame(cx),
            AnswerBody::Tls(body) => Pin::new(body)
                .poll_frame(cx)
                .map_err(|e| Error::Exchange(e.into())),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            AnswerBody::Plain(body) => body.is_end_stream(),
            AnswerBody::Tls(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            AnswerBody::Plain(body) => body.size_hint(),
            AnswerBody::Tls(body) => body.size_hint(),
        }
    }
}

/// The connector every upstream client uses: plain http, or https through rustls.
pub type Connector = hyper_rustls::HttpsConnector<HttpConnector>;

/// Most certificates read from one PEM file.
const MAX_PEM_CERTS: usize = 1024;

/// Builds the connector: TCP connect timeout `connect_timeout`, TLS trusting the
/// system roots and, when given, the PEM certificates in `ca_file`
/// (`upstream.ca_file`). ALPN offers h2 and http/1.1.
pub fn connector(
    ca_file: Option<&Path>,
    connect_timeout: Duration,
) -> Result<Connector, ConfigError> {
    const KEY: &str = "upstream.ca_file";
    let mut roots = RootCertStore::empty();
    // A system root rustls cannot parse is skipped, as hyper-rustls does.
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
    let tls = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ConfigError::new(KEY, format!("TLS setup failed: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();

    let mut http = HttpConnector::new();
    // https URLs are handed to the TLS layer, which needs the plain TCP connector to
    // accept them.
    http.enforce_http(false);
    http.set_connect_timeout(Some(connect_timeout));
    http.set_nodelay(true);
    Ok(hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http))
}

/// The `Host` value of an HTTP/1.1 request to `uri`, exactly as the pooled client would
/// format it on every request (the host, and the port unless it is 80), so a caller can
/// compute it once per upstream and set it. `None` unless `uri` is plain http: over
/// https the connection may negotiate h2, which carries the authority as `:authority`
/// and no `Host` header, and the client is left to decide.
pub fn http1_host(uri: &Uri) -> Option<HeaderValue> {
    if uri.scheme() != Some(&Scheme::HTTP) {
        return None;
    }
    let host = uri.host()?;
    let value = match uri.port_u16() {
        Some(port) if port != 80 => format!("{host}:{port}"),
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
        // https may speak h2, where the authority is no header.
        assert_eq!(host("https://gw.internal:3000/"), None);
        assert_eq!(host("https://gw.internal/"), None);
    }
}
