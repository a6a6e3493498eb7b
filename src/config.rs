//! Configuration: the schema every module reads. Loading (built-in defaults, then a TOML
//! file, then `KNOWTATION_SIDECAR_<SECTION>__<KEY>` environment variables), validation
//! and redaction live here too, so a bad config fails before any port is bound.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// A secret value: never printed, logged or serialized in clear.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The secret itself, for the one place that uses it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("<redacted>")
    }
}

/// The whole configuration.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The main (proxy) listener.
    pub listen: Listen,
    /// The admin listener (`/live`, `/ready`, `/metrics`).
    pub admin: Admin,
    /// Gateway, canister and bridge.
    pub upstream: Upstream,
    /// Caller token verification (wire contract §1).
    pub auth: Auth,
    /// The hosted-context lookup (wire contract §2).
    pub hosted_context: HostedContext,
    /// Rate limits.
    pub rate_limit: RateLimit,
    /// CORS for the REST route (wire contract §5).
    pub cors: Cors,
    /// Graceful shutdown.
    pub shutdown: Shutdown,
    /// Logging.
    pub log: Log,
}

/// The main listener and its bounds.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Listen {
    /// Address to bind.
    pub address: SocketAddr,
    /// PEM certificate chain; with `tls_key_file`, TLS is terminated here.
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key.
    pub tls_key_file: Option<PathBuf>,
    /// Time allowed to receive a request's headers.
    pub header_read_timeout_ms: u64,
    /// Largest request head (HTTP/1 read buffer; HTTP/2 header list).
    pub max_header_bytes: usize,
    /// Most request headers.
    pub max_headers: usize,
    /// Largest request body the sidecar itself reads.
    pub max_body_bytes: usize,
    /// Most intercepted requests in flight; more get 503.
    pub max_in_flight: usize,
    /// Idle keep-alive connections are closed after this.
    pub idle_timeout_seconds: u64,
    /// Most open client connections.
    pub max_connections: usize,
}

impl Default for Listen {
    fn default() -> Self {
        Listen {
            address: SocketAddr::from(([0, 0, 0, 0], 8080)),
            tls_cert_file: None,
            tls_key_file: None,
            header_read_timeout_ms: 10_000,
            max_header_bytes: 64 * 1024,
            max_headers: 100,
            max_body_bytes: 4 * 1024 * 1024,
            max_in_flight: 1024,
            idle_timeout_seconds: 90,
            max_connections: 10_000,
        }
    }
}

/// The admin listener.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Admin {
    /// Address to bind; loopback by default.
    pub address: SocketAddr,
}

impl Default for Admin {
    fn default() -> Self {
        Admin {
            address: SocketAddr::from(([127, 0, 0, 1], 9901)),
        }
    }
}

/// Upstream services.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Upstream {
    /// Base URL of the gateway everything else passes through to (required).
    pub gateway_url: String,
    /// Base URL of the canister; without it the REST route answers 503.
    pub canister_url: Option<String>,
    /// Base URL of the bridge (hosted context); optional.
    pub bridge_url: Option<String>,
    /// `X-Gateway-Auth` value sent to the canister.
    pub gateway_secret: Option<Secret>,
    /// File holding the gateway secret (trailing newline trimmed).
    pub gateway_secret_file: Option<PathBuf>,
    /// Extra CA certificates (PEM) trusted for https upstreams.
    pub ca_file: Option<PathBuf>,
    /// TCP connect timeout for every upstream.
    pub connect_timeout_ms: u64,
    /// Passthrough: time allowed for the gateway's response head.
    pub gateway_timeout_ms: u64,
    /// The one canister read: total time allowed, body included.
    pub canister_timeout_ms: u64,
    /// Largest canister note body read (wire contract §4).
    pub note_max_bytes: usize,
}

impl Default for Upstream {
    fn default() -> Self {
        Upstream {
            gateway_url: String::new(),
            canister_url: None,
            bridge_url: None,
            gateway_secret: None,
            gateway_secret_file: None,
            ca_file: None,
            connect_timeout_ms: 2_000,
            gateway_timeout_ms: 30_000,
            canister_timeout_ms: 5_000,
            note_max_bytes: crate::extract::MAX_NOTE_JSON_BYTES,
        }
    }
}

/// Token verification (wire contract §1).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Auth {
    /// HMAC secrets: the first signs-and-verifies, the rest verify only (rotation).
    pub jwt_secrets: Vec<Secret>,
    /// File with one secret per line, appended to `jwt_secrets`.
    pub jwt_secrets_file: Option<PathBuf>,
    /// Refuse tokens without `exp` (a deviation from the gateway; default on).
    pub require_exp: bool,
}

impl Default for Auth {
    fn default() -> Self {
        Auth {
            jwt_secrets: Vec::new(),
            jwt_secrets_file: None,
            require_exp: true,
        }
    }
}

/// What to do when the hosted-context lookup fails on REST (wire contract §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnFailure {
    /// Fail closed: 503 (403 for the bridge's own 403).
    #[default]
    Deny,
    /// Gateway-compatible: fall back to the token's `sub`, skip the vault check.
    Actor,
}

/// The hosted-context lookup (wire contract §2).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HostedContext {
    /// Behaviour when the lookup fails.
    pub on_failure: OnFailure,
    /// How long successful answers are cached, per `sub` + vault.
    pub cache_ttl_seconds: u64,
    /// Lookup timeout (250–10000 ms, as the gateway clamps it).
    pub timeout_ms: u64,
    /// Most cached entries.
    pub cache_max_entries: usize,
}

impl Default for HostedContext {
    fn default() -> Self {
        HostedContext {
            on_failure: OnFailure::Deny,
            cache_ttl_seconds: 60,
            timeout_ms: 3_000,
            cache_max_entries: 10_000,
        }
    }
}

/// Rate limits for intercepted requests.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateLimit {
    /// Sustained requests per minute per authenticated `sub` (0 disables).
    pub per_user_per_minute: u32,
    /// Burst allowance per user.
    pub burst: u32,
    /// Sustained requests per second over all users (0 disables).
    pub global_per_second: u32,
    /// Most tracked users; beyond it idle keys are evicted, then new keys are refused.
    pub max_keys: usize,
}

impl Default for RateLimit {
    fn default() -> Self {
        RateLimit {
            per_user_per_minute: 600,
            burst: 60,
            global_per_second: 0,
            max_keys: 100_000,
        }
    }
}

/// CORS (wire contract §5).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Cors {
    /// Allowed origins; empty means `*`.
    pub allowed_origins: Vec<String>,
}

/// Graceful shutdown.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Shutdown {
    /// In-flight requests get this long to finish after SIGTERM/SIGINT.
    pub drain_seconds: u64,
}

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown { drain_seconds: 25 }
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// One JSON object per line.
    #[default]
    Json,
    /// Human-readable.
    Plain,
}

/// Logging.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Log {
    /// Output format.
    pub format: LogFormat,
    /// `tracing` filter directive, e.g. `info`.
    pub level: String,
}

impl Default for Log {
    fn default() -> Self {
        Log {
            format: LogFormat::Json,
            level: "info".to_owned(),
        }
    }
}
