//! Outbound connections to the gateway, canister and bridge: one connector type for
//! http and https, trusting the system roots plus an optional CA file.

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::uri::{Scheme, Uri};
use http::HeaderValue;
use hyper_util::client::legacy::connect::HttpConnector;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};

use crate::config::ConfigError;

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
