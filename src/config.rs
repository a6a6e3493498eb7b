//! Configuration: the schema every module reads. Loading (built-in defaults, then a TOML
//! file, then `KNOWTATION_SIDECAR_<SECTION>__<KEY>` environment variables), validation
//! and redaction live here too, so a bad config fails before any port is bound.
//!
//! Environment values are taken as they are for strings (URLs, addresses, paths,
//! secrets, `log.level`); numbers, booleans and enum names are parsed. The two list keys,
//! `auth.jwt_secrets` and `cors.allowed_origins`, are comma-separated
//! (`KNOWTATION_SIDECAR_CORS__ALLOWED_ORIGINS=https://a.example,https://b.example`) or,
//! when the value starts with `[`, an array of double-quoted strings
//! (`["s1", "s2,with comma"]`). Secrets with commas or quotes belong in
//! `auth.jwt_secrets_file` (one per line) instead.

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use figment::providers::{Format, Serialized, Toml};
use figment::value::Value;
use figment::Figment;
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
    /// The hosted MCP choke point (wire contract §6).
    pub mcp: Mcp,
    /// Who answers the intercepted surface: the sidecar, or the gateway while the
    /// sidecar compares.
    pub intercept: Intercept,
    /// Graceful shutdown.
    pub shutdown: Shutdown,
    /// State kept across restarts (MCP sessions).
    pub state: State,
    /// Logging.
    pub log: Log,
    /// The threads that serve requests.
    pub runtime: Runtime,
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
    /// Most intercepted requests in flight; more get 503.
    pub max_in_flight: usize,
    /// Most intercepted requests one user may have in flight; more get 503 (at most
    /// `max_in_flight` in effect).
    pub max_in_flight_per_user: usize,
    /// Time allowed to receive a whole `POST /mcp` body once its headers are in.
    pub body_read_timeout_ms: u64,
    /// Bytes of request bodies buffered at once over all users; over it, 503.
    pub max_buffered_bytes: usize,
    /// Bytes of request bodies one user may have buffered at once; over it, 503.
    pub max_buffered_bytes_per_user: usize,
    /// A connection with no request in progress for this long is closed (HTTP/2: GOAWAY),
    /// whatever else it sends (PINGs keep nothing open).
    pub idle_timeout_seconds: u64,
    /// Most open client connections.
    pub max_connections: usize,
    /// Connections the kernel may queue before they are accepted (capped by
    /// `net.core.somaxconn`).
    pub accept_backlog: u32,
    /// Most concurrent streams one HTTP/2 connection may open.
    pub http2_max_concurrent_streams: u32,
    /// Streams an HTTP/2 client may reset before the sidecar accepts them, before the
    /// connection is closed (rapid-reset bound).
    pub http2_max_pending_accept_reset_streams: usize,
    /// Streams the sidecar may reset for protocol errors on one HTTP/2 connection before
    /// it is closed.
    pub http2_max_local_error_reset_streams: usize,
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
            max_in_flight: 1024,
            max_in_flight_per_user: 64,
            body_read_timeout_ms: 30_000,
            max_buffered_bytes: 96 * 1024 * 1024,
            max_buffered_bytes_per_user: 24 * 1024 * 1024,
            idle_timeout_seconds: 90,
            max_connections: 10_000,
            accept_backlog: 4096,
            http2_max_concurrent_streams: 100,
            http2_max_pending_accept_reset_streams: 20,
            http2_max_local_error_reset_streams: 256,
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
    /// Passthrough: time allowed for the gateway's response head once the request is
    /// sent. There is no total deadline: an answer that keeps moving is never cut.
    pub gateway_timeout_ms: u64,
    /// Passthrough: longest gap without a byte in a request or response body (event
    /// streams excepted: a quiet `GET /mcp` stream is not a stall).
    pub gateway_idle_timeout_ms: u64,
    /// The one canister read: total time allowed, body included.
    pub canister_timeout_ms: u64,
    /// Largest canister note body read (wire contract §4).
    pub note_max_bytes: usize,
    /// Idle keep-alive connections each upstream pool keeps (passthrough and MCP to the
    /// gateway, the canister, the bridge): past it, a connection is closed when its
    /// exchange ends, so a burst's connections do not stay open. `0` keeps none.
    pub pool_max_idle: usize,
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
            connect_timeout_ms: 5_000,
            gateway_timeout_ms: 600_000,
            gateway_idle_timeout_ms: 300_000,
            canister_timeout_ms: 5_000,
            note_max_bytes: DEFAULT_NOTE_MAX_BYTES,
            pool_max_idle: 32,
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
    /// Accept more than two secrets (the gateway knows only a current and a previous
    /// one, wire contract §1); off by default so a third secret is a deliberate choice.
    pub allow_extra_secrets: bool,
    /// Verified tokens remembered per surface, so a repeated token is not decoded and
    /// its signature not recomputed on every request; time claims are still checked
    /// each time. `0` remembers none.
    pub token_cache_entries: usize,
}

impl Default for Auth {
    fn default() -> Self {
        Auth {
            jwt_secrets: Vec::new(),
            jwt_secrets_file: None,
            require_exp: true,
            allow_extra_secrets: false,
            token_cache_entries: DEFAULT_TOKEN_CACHE_ENTRIES,
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
    /// How long a failed lookup is remembered per `sub` + vault (0: not at all), so a
    /// caller cannot turn every request into a bridge call.
    pub failure_cache_ttl_seconds: u64,
    /// Bridge calls one `sub` may cause per minute, whatever vault ids it names; beyond
    /// it the lookup fails as throttled (429).
    pub max_lookups_per_user_per_minute: u32,
}

impl Default for HostedContext {
    fn default() -> Self {
        HostedContext {
            on_failure: OnFailure::Deny,
            cache_ttl_seconds: 60,
            timeout_ms: 3_000,
            cache_max_entries: 10_000,
            failure_cache_ttl_seconds: 5,
            max_lookups_per_user_per_minute: 30,
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

/// The hosted MCP choke point (wire contract §6).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Mcp {
    /// The tool policy (TOML); absent: the gateway's default (every role may list and
    /// call `get_section_source`).
    pub policy_file: Option<PathBuf>,
    /// Largest `POST /mcp` body the sidecar buffers; larger ones get 413 (§6 door). The
    /// default is the gateway's own `express.json` limit, 10 MB (10 × 2^20 bytes).
    pub max_body_bytes: usize,
    /// Idle session lifetime; clamped to 5 min–24 h as the gateway clamps
    /// `MCP_SESSION_TTL_MS`.
    pub session_ttl_seconds: u64,
    /// Sessions one user may hold; clamped to 2–20 as `MCP_MAX_SESSIONS_PER_USER`.
    pub max_sessions_per_user: usize,
    /// Sessions the table holds over all users; the least recently active goes first.
    pub max_sessions: usize,
    /// Requests per sliding minute per `sub` (§6 step 3).
    pub calls_per_minute: u32,
}

impl Default for Mcp {
    fn default() -> Self {
        Mcp {
            policy_file: None,
            max_body_bytes: 10 * 1024 * 1024,
            session_ttl_seconds: 8 * 3600,
            max_sessions_per_user: 8,
            max_sessions: 100_000,
            calls_per_minute: 60,
        }
    }
}

impl Mcp {
    /// The idle lifetime after the gateway's clamp (5 min–24 h).
    pub fn session_ttl(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.session_ttl_seconds.clamp(300, 86_400))
    }

    /// The per-user cap after the gateway's clamp (2–20).
    pub fn per_user_cap(&self) -> usize {
        self.max_sessions_per_user.clamp(2, 20)
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
    /// After SIGTERM/SIGINT, readiness is false but the listener keeps accepting this
    /// long, while load balancers and Kubernetes endpoints stop sending (0: stop at once).
    pub grace_seconds: u64,
    /// Then requests in flight get this long to finish; long-lived `GET /mcp` streams are
    /// ended as soon as nothing else is in flight.
    pub drain_seconds: u64,
}

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown {
            grace_seconds: 5,
            drain_seconds: 25,
        }
    }
}

/// Who answers the intercepted surface (the REST section-source route and the MCP tool
/// `get_section_source`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Intercept {
    /// `enforce` (the sidecar answers) or `shadow` (the gateway answers, the sidecar
    /// computes its own answer too and counts how the two compare).
    pub mode: Mode,
}

/// See [`Intercept::mode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// The sidecar answers; the gateway never sees an intercepted request.
    #[default]
    Enforce,
    /// Intercepted requests pass to the gateway as if the sidecar were not there; the
    /// sidecar's own answer is computed, compared and dropped. For a rollout against a
    /// gateway that already serves the surface.
    Shadow,
}

/// State kept across restarts.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct State {
    /// Directory for the MCP session records (created mode 0700 if missing). Unset:
    /// sessions live in memory only and a restart forgets them.
    pub directory: Option<PathBuf>,
}

/// The threads that serve requests.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Runtime {
    /// Worker threads. `0`: one per CPU the process may use (its CPU affinity and cgroup
    /// CPU limit). With one, everything runs on a single event-loop thread, which costs
    /// less CPU per request than a one-worker scheduler built for several.
    pub threads: usize,
}

/// Most `runtime.threads`.
pub const MAX_RUNTIME_THREADS: usize = 1024;

/// Which requests get an access-log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AccessLog {
    /// Every request.
    #[default]
    All,
    /// Requests answered with a 4xx or 5xx status.
    Errors,
    /// None.
    None,
}

impl AccessLog {
    /// Whether a request answered with `status` is logged.
    pub fn logs(self, status: u16) -> bool {
        match self {
            AccessLog::All => true,
            AccessLog::Errors => status >= 400,
            AccessLog::None => false,
        }
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
    /// Level: `trace`, `debug`, `info`, `warn`, `error` or `off`, or comma-separated
    /// `target=level` directives beside one.
    pub level: String,
    /// Access-log lines: `all`, `errors` (4xx and 5xx) or `none`.
    pub access: AccessLog,
}

impl Default for Log {
    fn default() -> Self {
        Log {
            format: LogFormat::Json,
            level: "info".to_owned(),
            access: AccessLog::All,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Loading, validation and printing.

/// Prefix of the environment variables that override the file:
/// `KNOWTATION_SIDECAR_<SECTION>__<KEY>`, e.g. `KNOWTATION_SIDECAR_UPSTREAM__GATEWAY_URL`.
pub const ENV_PREFIX: &str = "KNOWTATION_SIDECAR_";

/// The file read when no `--config` is given, and only if it exists.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/knowtation-sidecar/config.toml";

/// A config file larger than this is refused (it is a few hundred bytes in practice).
const MAX_CONFIG_FILE_BYTES: u64 = 1024 * 1024;

/// A secret file larger than this is refused.
const MAX_SECRET_FILE_BYTES: u64 = 64 * 1024;

/// Largest `upstream.pool_max_idle`: each idle connection holds a socket and buffers.
pub const MAX_POOL_IDLE: usize = 65_536;

/// The default `upstream.note_max_bytes`, 8 MiB: the same value as
/// `crate::extract::MAX_NOTE_JSON_BYTES` (a test keeps them equal; `config` imports
/// nothing of the crate).
pub const DEFAULT_NOTE_MAX_BYTES: usize = 8 * 1024 * 1024;

/// The default `auth.token_cache_entries`.
pub const DEFAULT_TOKEN_CACHE_ENTRIES: usize = 1024;

/// Largest `auth.token_cache_entries`: each entry holds the claims of a token of at most
/// 4 KiB.
pub const MAX_TOKEN_CACHE_ENTRIES: usize = 65_536;

/// Refuses `value` over `max` for `key`, naming the bound.
fn at_most(key: &'static str, value: usize, max: usize) -> Result<(), ConfigError> {
    if value > max {
        return Err(ConfigError::new(key, format!("must be at most {max}")));
    }
    Ok(())
}

/// Even with `auth.allow_extra_secrets`, every token check tries each secret in turn.
const MAX_JWT_SECRETS: usize = 16;

/// hyper refuses an HTTP/1 read buffer below this.
const MIN_HEADER_BYTES: usize = 8192;

/// Keys whose environment value is taken verbatim as a string. Everything else is parsed
/// as a TOML-like scalar; these must not be, or a secret such as `12345` or `true…`
/// would turn into a number or a boolean.
const ENV_STRING_KEYS: &[&str] = &[
    "listen.address",
    "listen.tls_cert_file",
    "listen.tls_key_file",
    "admin.address",
    "upstream.gateway_url",
    "upstream.canister_url",
    "upstream.bridge_url",
    "upstream.gateway_secret",
    "upstream.gateway_secret_file",
    "upstream.ca_file",
    "auth.jwt_secrets_file",
    "mcp.policy_file",
    "state.directory",
    "log.level",
];

/// Keys holding a list of strings. From the environment they are comma-separated
/// (`a,b`; items trimmed, empty items dropped), or, when the value starts with `[`, an
/// array of double-quoted strings (`["a", "b,c"]`).
const ENV_LIST_KEYS: &[&str] = &["auth.jwt_secrets", "cors.allowed_origins"];

/// Keys whose values are secrets: errors about them never quote the value.
const SECRET_KEYS: &[&str] = &["upstream.gateway_secret", "auth.jwt_secrets"];

/// A configuration problem, naming the key (e.g. `upstream.gateway_url`) it is about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct ConfigError {
    /// Dotted key, or the file or environment variable when no key applies.
    pub key: String,
    /// What is wrong, never quoting a secret.
    pub message: String,
}

impl ConfigError {
    /// A problem with `key`.
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError {
            key: key.into(),
            message: message.into(),
        }
    }
}

/// Loads the configuration: built-in defaults, then the TOML file (`file`, or
/// [`DEFAULT_CONFIG_PATH`] when it exists), then `KNOWTATION_SIDECAR_<SECTION>__<KEY>`
/// environment variables; then reads the `*_file` secrets and validates everything.
pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
    let mut env = Vec::new();
    for (name, value) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        if !has_env_prefix(name) {
            continue;
        }
        let value = value
            .into_string()
            .map_err(|_| ConfigError::new(name, "value is not valid UTF-8"))?;
        env.push((name.to_owned(), value));
    }
    let default = Path::new(DEFAULT_CONFIG_PATH);
    let file = match file {
        Some(f) => Some(f),
        None if default.exists() => Some(default),
        None => None,
    };
    load_with_env(file, &env)
}

/// [`load`] with an explicit file and environment (name, value) pairs; variables without
/// the [`ENV_PREFIX`] are ignored. The process environment is not read.
pub fn load_with_env(file: Option<&Path>, env: &[(String, String)]) -> Result<Config, ConfigError> {
    let mut figment = Figment::new();
    if let Some(path) = file {
        let text = read_bounded(path, MAX_CONFIG_FILE_BYTES)
            .map_err(|e| ConfigError::new(path.display().to_string(), e))?;
        figment = figment.merge(Toml::string(&text));
    }
    let known = known_keys();
    for (name, raw) in env {
        if !has_env_prefix(name) {
            continue;
        }
        let key = env_key(name, &known)?;
        let value = if ENV_LIST_KEYS.contains(&key.as_str()) {
            env_list(name, raw)?
        } else if ENV_STRING_KEYS.contains(&key.as_str()) {
            Value::from(raw.clone())
        } else {
            // Numbers, booleans and enum names; figment's parser never fails.
            raw.parse::<Value>().unwrap_or_else(|never| match never {})
        };
        figment = figment.merge(Serialized::global(&key, value));
    }
    let mut config: Config = figment.extract().map_err(from_figment)?;
    resolve_secret_files(&mut config)?;
    validate(&config)?;
    Ok(config)
}

fn has_env_prefix(name: &str) -> bool {
    name.get(..ENV_PREFIX.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(ENV_PREFIX))
}

/// `KNOWTATION_SIDECAR_UPSTREAM__GATEWAY_URL` → `upstream.gateway_url`, or an error
/// naming the variable when it names no setting.
fn env_key(name: &str, known: &[String]) -> Result<String, ConfigError> {
    let rest = name.get(ENV_PREFIX.len()..).unwrap_or_default();
    let key = match rest.split_once("__") {
        Some((section, key)) if !section.is_empty() && !key.is_empty() => {
            format!("{section}.{key}").to_ascii_lowercase()
        }
        _ => {
            return Err(ConfigError::new(
                name,
                format!("not a setting; use {ENV_PREFIX}<SECTION>__<KEY>"),
            ))
        }
    };
    if !known.contains(&key) {
        return Err(ConfigError::new(
            name,
            format!("unknown key `{key}` (from the environment)"),
        ));
    }
    Ok(key)
}

/// Every `section.key` of the schema.
fn known_keys() -> Vec<String> {
    let mut keys = Vec::new();
    if let Ok(serde_json::Value::Object(sections)) = serde_json::to_value(Config::default()) {
        for (section, fields) in sections {
            if let serde_json::Value::Object(fields) = fields {
                keys.extend(fields.keys().map(|k| format!("{section}.{k}")));
            }
        }
    }
    keys
}

fn env_list(name: &str, raw: &str) -> Result<Value, ConfigError> {
    let trimmed = raw.trim();
    if trimmed.starts_with('[') {
        let bad = || {
            ConfigError::new(
                name,
                "expected an array of double-quoted strings, or a comma-separated list",
            )
        };
        let parsed = trimmed
            .parse::<Value>()
            .unwrap_or_else(|never| match never {});
        let Value::Array(_, items) = parsed else {
            return Err(bad());
        };
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            match item {
                Value::String(_, s) => out.push(Value::from(s)),
                _ => return Err(bad()),
            }
        }
        return Ok(Value::from(out));
    }
    let items: Vec<Value> = trimmed
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| Value::from(s.to_owned()))
        .collect();
    Ok(Value::from(items))
}

/// Maps the first figment error to a [`ConfigError`] naming its key; a secret's value is
/// never quoted.
fn from_figment(err: figment::Error) -> ConfigError {
    let Some(first) = err.into_iter().next() else {
        return ConfigError::new("config", "invalid configuration");
    };
    let mut path = first.path.clone();
    let message = match &first.kind {
        figment::error::Kind::UnknownField(field, expected) => {
            if path.last() != Some(field) {
                path.push(field.clone());
            }
            format!("unknown key (expected one of: {})", expected.join(", "))
        }
        figment::error::Kind::MissingField(field) => {
            if path.last().map(String::as_str) != Some(field.as_ref()) {
                path.push(field.to_string());
            }
            "missing".to_owned()
        }
        kind => kind.to_string(),
    };
    let key = if path.is_empty() {
        "config".to_owned()
    } else {
        path.join(".")
    };
    let secret = SECRET_KEYS.iter().any(|s| key.starts_with(s));
    let message = if secret {
        "invalid value (must be a string; not shown because it is a secret)".to_owned()
    } else {
        message
    };
    ConfigError::new(key, message)
}

fn read_bounded(path: &Path, max: u64) -> Result<String, String> {
    let file = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let mut buf = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if buf.len() as u64 > max {
        return Err(format!("{} is larger than {max} bytes", path.display()));
    }
    String::from_utf8(buf).map_err(|_| format!("{} is not UTF-8", path.display()))
}

/// Reads `upstream.gateway_secret_file` and `auth.jwt_secrets_file` into the config.
fn resolve_secret_files(config: &mut Config) -> Result<(), ConfigError> {
    if let Some(path) = &config.upstream.gateway_secret_file {
        const KEY: &str = "upstream.gateway_secret_file";
        if config.upstream.gateway_secret.is_some() {
            return Err(ConfigError::new(
                KEY,
                "set either upstream.gateway_secret or upstream.gateway_secret_file, not both",
            ));
        }
        let text =
            read_bounded(path, MAX_SECRET_FILE_BYTES).map_err(|e| ConfigError::new(KEY, e))?;
        let secret = text.trim_end_matches(['\r', '\n']);
        if secret.is_empty() {
            return Err(ConfigError::new(KEY, "the file holds no secret"));
        }
        config.upstream.gateway_secret = Some(Secret::new(secret));
    }
    if let Some(path) = &config.auth.jwt_secrets_file {
        const KEY: &str = "auth.jwt_secrets_file";
        let text =
            read_bounded(path, MAX_SECRET_FILE_BYTES).map_err(|e| ConfigError::new(KEY, e))?;
        let mut added = 0;
        for line in text.lines() {
            let line = line.trim_end_matches('\r');
            // Blank lines (a trailing newline, a separator) are not secrets.
            if line.trim().is_empty() {
                continue;
            }
            config.auth.jwt_secrets.push(Secret::new(line));
            added += 1;
        }
        if added == 0 {
            return Err(ConfigError::new(KEY, "the file holds no secret"));
        }
    }
    Ok(())
}

/// Checks a configuration built by [`load`] or by hand; `crate::proxy::start` runs it
/// too, so a bad config never binds a port.
pub fn validate(config: &Config) -> Result<(), ConfigError> {
    let up = &config.upstream;
    if up.gateway_url.trim().is_empty() {
        return Err(ConfigError::new(
            "upstream.gateway_url",
            "required (the gateway everything else passes through to)",
        ));
    }
    base_url("upstream.gateway_url", &up.gateway_url)?;
    if let Some(url) = &up.canister_url {
        base_url("upstream.canister_url", url)?;
    }
    if let Some(url) = &up.bridge_url {
        base_url("upstream.bridge_url", url)?;
    }
    if up
        .gateway_secret
        .as_ref()
        .is_some_and(|s| s.expose().is_empty())
    {
        return Err(ConfigError::new(
            "upstream.gateway_secret",
            "must not be empty (omit it to send none)",
        ));
    }
    // Files (the CA bundle, TLS certificate and key, the MCP policy) are read where they
    // are used, when the runtime objects are built: `crate::proxy::check` and
    // `crate::proxy::start` do that before any port is bound.
    let listen = &config.listen;
    match (&listen.tls_cert_file, &listen.tls_key_file) {
        (Some(_), Some(_)) | (None, None) => {}
        (Some(_), None) => {
            return Err(ConfigError::new(
                "listen.tls_key_file",
                "required when listen.tls_cert_file is set",
            ))
        }
        (None, Some(_)) => {
            return Err(ConfigError::new(
                "listen.tls_cert_file",
                "required when listen.tls_key_file is set",
            ))
        }
    }
    if listen.max_header_bytes < MIN_HEADER_BYTES {
        return Err(ConfigError::new(
            "listen.max_header_bytes",
            format!("must be at least {MIN_HEADER_BYTES}"),
        ));
    }
    if u32::try_from(listen.max_header_bytes).is_err() {
        return Err(ConfigError::new(
            "listen.max_header_bytes",
            "must fit in 32 bits",
        ));
    }
    at_most("listen.max_connections", listen.max_connections, 1_000_000)?;
    at_most(
        "upstream.pool_max_idle",
        config.upstream.pool_max_idle,
        MAX_POOL_IDLE,
    )?;
    at_most("listen.max_in_flight", listen.max_in_flight, 1_000_000)?;
    if config.admin.address == listen.address && listen.address.port() != 0 {
        return Err(ConfigError::new(
            "admin.address",
            "must differ from listen.address",
        ));
    }

    let bounds: [(&str, u64); 28] = [
        ("mcp.max_body_bytes", config.mcp.max_body_bytes as u64),
        ("mcp.max_sessions", config.mcp.max_sessions as u64),
        (
            "mcp.calls_per_minute",
            u64::from(config.mcp.calls_per_minute),
        ),
        (
            "listen.header_read_timeout_ms",
            listen.header_read_timeout_ms,
        ),
        ("listen.max_header_bytes", listen.max_header_bytes as u64),
        ("listen.max_headers", listen.max_headers as u64),
        ("listen.max_in_flight", listen.max_in_flight as u64),
        (
            "listen.max_in_flight_per_user",
            listen.max_in_flight_per_user as u64,
        ),
        ("listen.body_read_timeout_ms", listen.body_read_timeout_ms),
        (
            "listen.max_buffered_bytes",
            listen.max_buffered_bytes as u64,
        ),
        (
            "listen.max_buffered_bytes_per_user",
            listen.max_buffered_bytes_per_user as u64,
        ),
        (
            "listen.http2_max_concurrent_streams",
            u64::from(listen.http2_max_concurrent_streams),
        ),
        (
            "listen.http2_max_pending_accept_reset_streams",
            listen.http2_max_pending_accept_reset_streams as u64,
        ),
        (
            "listen.http2_max_local_error_reset_streams",
            listen.http2_max_local_error_reset_streams as u64,
        ),
        ("listen.idle_timeout_seconds", listen.idle_timeout_seconds),
        ("listen.max_connections", listen.max_connections as u64),
        ("listen.accept_backlog", u64::from(listen.accept_backlog)),
        ("upstream.connect_timeout_ms", up.connect_timeout_ms),
        ("upstream.gateway_timeout_ms", up.gateway_timeout_ms),
        (
            "upstream.gateway_idle_timeout_ms",
            up.gateway_idle_timeout_ms,
        ),
        ("upstream.canister_timeout_ms", up.canister_timeout_ms),
        ("upstream.note_max_bytes", up.note_max_bytes as u64),
        (
            "hosted_context.max_lookups_per_user_per_minute",
            u64::from(config.hosted_context.max_lookups_per_user_per_minute),
        ),
        (
            "hosted_context.cache_ttl_seconds",
            config.hosted_context.cache_ttl_seconds,
        ),
        (
            "hosted_context.cache_max_entries",
            config.hosted_context.cache_max_entries as u64,
        ),
        ("rate_limit.burst", u64::from(config.rate_limit.burst)),
        ("rate_limit.max_keys", config.rate_limit.max_keys as u64),
        ("shutdown.drain_seconds", config.shutdown.drain_seconds),
    ];
    for (key, value) in bounds {
        if value == 0 {
            return Err(ConfigError::new(key, "must be greater than 0"));
        }
    }
    // Durations beyond a day are mistakes (and would overflow deadline arithmetic).
    let day_ms = 86_400_000;
    for (key, ms) in [
        (
            "listen.header_read_timeout_ms",
            listen.header_read_timeout_ms,
        ),
        (
            "listen.idle_timeout_seconds",
            listen.idle_timeout_seconds.saturating_mul(1000),
        ),
        ("listen.body_read_timeout_ms", listen.body_read_timeout_ms),
        ("upstream.connect_timeout_ms", up.connect_timeout_ms),
        ("upstream.gateway_timeout_ms", up.gateway_timeout_ms),
        (
            "upstream.gateway_idle_timeout_ms",
            up.gateway_idle_timeout_ms,
        ),
        ("upstream.canister_timeout_ms", up.canister_timeout_ms),
        (
            "hosted_context.failure_cache_ttl_seconds",
            config
                .hosted_context
                .failure_cache_ttl_seconds
                .saturating_mul(1000),
        ),
        (
            "hosted_context.cache_ttl_seconds",
            config.hosted_context.cache_ttl_seconds.saturating_mul(1000),
        ),
        (
            "shutdown.drain_seconds",
            config.shutdown.drain_seconds.saturating_mul(1000),
        ),
        (
            "shutdown.grace_seconds",
            config.shutdown.grace_seconds.saturating_mul(1000),
        ),
    ] {
        if ms > day_ms {
            return Err(ConfigError::new(key, "must be at most one day"));
        }
    }

    let timeout = config.hosted_context.timeout_ms;
    if !(250..=10_000).contains(&timeout) {
        return Err(ConfigError::new(
            "hosted_context.timeout_ms",
            format!("must be between 250 and 10000 (as the gateway clamps it), got {timeout}"),
        ));
    }

    let auth = &config.auth;
    if auth.jwt_secrets.len() > 2 && !auth.allow_extra_secrets {
        return Err(ConfigError::new(
            "auth.jwt_secrets",
            format!(
                "{} secrets given; the gateway accepts a current and a previous one \
                 (wire contract §1); set auth.allow_extra_secrets = true to allow more",
                auth.jwt_secrets.len()
            ),
        ));
    }
    at_most(
        "auth.token_cache_entries",
        auth.token_cache_entries,
        MAX_TOKEN_CACHE_ENTRIES,
    )?;
    if auth.jwt_secrets.len() > MAX_JWT_SECRETS {
        return Err(ConfigError::new(
            "auth.jwt_secrets",
            format!("at most {MAX_JWT_SECRETS} secrets"),
        ));
    }
    if let Some(n) = auth.jwt_secrets.iter().position(|s| s.expose().is_empty()) {
        return Err(ConfigError::new(
            "auth.jwt_secrets",
            format!("secret #{} is empty", n + 1),
        ));
    }

    if let Some(n) = config
        .cors
        .allowed_origins
        .iter()
        .position(|o| o.trim().is_empty())
    {
        return Err(ConfigError::new(
            "cors.allowed_origins",
            format!("origin #{} is empty", n + 1),
        ));
    }

    at_most("mcp.max_sessions", config.mcp.max_sessions, 10_000_000)?;
    if config.mcp.max_body_bytes > 64 * 1024 * 1024 {
        return Err(ConfigError::new(
            "mcp.max_body_bytes",
            "must be at most 64 MiB",
        ));
    }
    if listen.max_buffered_bytes_per_user > listen.max_buffered_bytes {
        return Err(ConfigError::new(
            "listen.max_buffered_bytes_per_user",
            "must be at most listen.max_buffered_bytes",
        ));
    }
    if config.mcp.max_body_bytes > listen.max_buffered_bytes_per_user {
        return Err(ConfigError::new(
            "mcp.max_body_bytes",
            "must be at most listen.max_buffered_bytes_per_user (one body must fit a user's share)",
        ));
    }

    validate_log_level(&config.log.level)?;
    if config.runtime.threads > MAX_RUNTIME_THREADS {
        return Err(ConfigError::new(
            "runtime.threads",
            format!("at most {MAX_RUNTIME_THREADS} (0: one per available CPU)"),
        ));
    }
    if config
        .state
        .directory
        .as_ref()
        .is_some_and(|d| d.as_os_str().is_empty())
    {
        return Err(ConfigError::new(
            "state.directory",
            "must not be empty (omit it to keep sessions in memory only)",
        ));
    }
    Ok(())
}

/// A surface the configuration leaves inert: the key to set and what happens without it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inert {
    /// The key that is unset.
    pub key: &'static str,
    /// What the sidecar does without it.
    pub effect: &'static str,
}

/// The surfaces `config` leaves inert, for a warning at start and on reload: a config
/// with only `upstream.gateway_url` is valid, and answers every intercepted request
/// with a refusal.
pub fn inert(config: &Config) -> Vec<Inert> {
    let mut out = Vec::new();
    if config.auth.jwt_secrets.is_empty() {
        out.push(Inert {
            key: "auth.jwt_secrets",
            effect: "no JWT secret: every token is refused with 401, on the REST route and on /mcp",
        });
    }
    if config.upstream.canister_url.is_none() {
        out.push(Inert {
            key: "upstream.canister_url",
            effect:
                "no canister: the REST route answers 503 and the MCP tool get_section_source fails",
        });
    } else if config.upstream.gateway_secret.is_none() {
        out.push(Inert {
            key: "upstream.gateway_secret",
            effect:
                "canister reads carry no X-Gateway-Auth; a canister that requires it refuses them",
        });
    }
    if config.upstream.bridge_url.is_none() {
        out.push(Inert {
            key: "upstream.bridge_url",
            effect: "no bridge: every MCP initialize is refused, and the REST route reads each \
                     token's own notes with no vault check",
        });
    }
    out
}

/// The level names `log.level` accepts.
pub const LOG_LEVELS: &[&str] = &["trace", "debug", "info", "warn", "error", "off"];

/// Checks `log.level`: a level name, or comma-separated directives each of which is a
/// level name or `target=level`. The filter syntax alone would take a typo such as
/// `warning` for a target name and silence every line.
fn validate_log_level(level: &str) -> Result<(), ConfigError> {
    const KEY: &str = "log.level";
    let is_level = |s: &str| LOG_LEVELS.iter().any(|l| l.eq_ignore_ascii_case(s.trim()));
    if level.trim().is_empty() {
        return Err(ConfigError::new(KEY, "must not be empty"));
    }
    for directive in level.split(',') {
        let level_part = match directive.rsplit_once('=') {
            Some((target, lvl)) if !target.trim().is_empty() => lvl,
            Some(_) => directive,
            None => directive,
        };
        if !is_level(level_part) {
            return Err(ConfigError::new(
                KEY,
                format!(
                    "unknown level {:?}: use one of {} (or target=level directives)",
                    directive.trim(),
                    LOG_LEVELS.join(", ")
                ),
            ));
        }
    }
    tracing_subscriber::EnvFilter::try_new(level)
        .map_err(|e| ConfigError::new(KEY, format!("not a valid filter: {e}")))?;
    Ok(())
}

/// Checks an upstream base URL: http or https, a host, no credentials, query or fragment.
fn base_url(key: &str, url: &str) -> Result<http::Uri, ConfigError> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| ConfigError::new(key, format!("not a valid URL: {e}")))?;
    match uri.scheme_str() {
        Some("http") | Some("https") => {}
        _ => return Err(ConfigError::new(key, "must be an http:// or https:// URL")),
    }
    let Some(authority) = uri.authority() else {
        return Err(ConfigError::new(key, "must name a host"));
    };
    // Credentials in a URL would be printed by check-config and sent in the clear.
    if authority.as_str().contains('@') {
        return Err(ConfigError::new(key, "must not contain credentials"));
    }
    if authority.host().is_empty() {
        return Err(ConfigError::new(key, "must name a host"));
    }
    if uri.query().is_some() || url.contains('#') {
        return Err(ConfigError::new(key, "must not have a query or fragment"));
    }
    Ok(uri)
}

/// The effective configuration as TOML, secrets shown as `<redacted>`. Every key is
/// listed: an unset optional key (TOML has no null) as a comment, `# key = unset`.
pub fn to_toml(config: &Config) -> String {
    let mut out = String::new();
    let Ok(serde_json::Value::Object(sections)) = serde_json::to_value(config) else {
        return out;
    };
    for (section, fields) in sections {
        let serde_json::Value::Object(fields) = fields else {
            continue;
        };
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&format!("[{section}]\n"));
        for (key, value) in fields {
            match toml_value(&value) {
                Some(v) => out.push_str(&format!("{key} = {v}\n")),
                None => out.push_str(&format!("# {key} = unset\n")),
            }
        }
    }
    out
}

/// One TOML value. A JSON string literal is a valid TOML basic string (same escapes).
fn toml_value(value: &serde_json::Value) -> Option<String> {
    match value {
        serde_json::Value::Null => None,
        serde_json::Value::Bool(b) => Some(b.to_string()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        serde_json::Value::String(_) => Some(value.to_string()),
        serde_json::Value::Array(items) => Some(format!(
            "[{}]",
            items
                .iter()
                .filter_map(toml_value)
                .collect::<Vec<_>>()
                .join(", ")
        )),
        serde_json::Value::Object(map) => Some(format!(
            "{{ {} }}",
            map.iter()
                .filter_map(|(k, v)| toml_value(v).map(|v| format!("{k} = {v}")))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// The one swappable handle on live state (the config and everything built from it):
/// readers take a cheap snapshot per request; a reload stores a new value without
/// touching open connections.
#[derive(Debug)]
pub struct Live<T> {
    current: RwLock<Arc<T>>,
}

impl<T> Live<T> {
    /// Holds `value`.
    pub fn new(value: T) -> Live<T> {
        Live {
            current: RwLock::new(Arc::new(value)),
        }
    }

    /// The current value.
    pub fn load(&self) -> Arc<T> {
        // A poisoned lock still holds a complete Arc: the writer only swaps pointers.
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replaces the value; requests already holding the old one finish with it.
    pub fn store(&self, value: T) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(value);
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A file in the temp dir, removed on drop.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(contents: &str) -> TempFile {
            static N: AtomicUsize = AtomicUsize::new(0);
            let path = std::env::temp_dir().join(format!(
                "ks-config-{}-{}.toml",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::write(&path, contents).expect("write temp file");
            TempFile(path)
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    const MINIMAL: &str = "[upstream]\ngateway_url = \"http://127.0.0.1:3000\"\n";

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn load_text(toml: &str, pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let file = TempFile::new(toml);
        load_with_env(Some(&file.0), &env(pairs))
    }

    fn err_key(toml: &str, pairs: &[(&str, &str)]) -> String {
        load_text(toml, pairs).expect_err("must be rejected").key
    }

    #[test]
    fn runtime_threads_default_zero_and_bounded() {
        let c = load_text(MINIMAL, &[]).expect("loads");
        assert_eq!(c.runtime.threads, 0);
        let c = load_text(MINIMAL, &[("KNOWTATION_SIDECAR_RUNTIME__THREADS", "1")]).expect("env");
        assert_eq!(c.runtime.threads, 1);
        let too_many = format!(
            "{MINIMAL}[runtime]\nthreads = {}\n",
            MAX_RUNTIME_THREADS + 1
        );
        assert_eq!(err_key(&too_many, &[]), "runtime.threads");
        assert_eq!(
            err_key(&format!("{MINIMAL}[runtime]\nthreads = -1\n"), &[]),
            "runtime.threads"
        );
    }

    /// A count key set through `env`: `default` when unset, `0` accepted, `max + 1`
    /// refused naming `key`.
    fn count_key(env: &str, key: &str, default: usize, max: usize, get: fn(&Config) -> usize) {
        let c = load_text(MINIMAL, &[]).expect("loads");
        assert_eq!(get(&c), default, "{key} default");
        let c = load_text(MINIMAL, &[(env, "0")]).unwrap_or_else(|e| panic!("{key} = 0: {e}"));
        assert_eq!(get(&c), 0, "{key} = 0");
        let too_many = (max + 1).to_string();
        assert_eq!(err_key(MINIMAL, &[(env, too_many.as_str())]), key);
    }

    #[test]
    fn upstream_pool_max_idle_default_zero_allowed_and_bounded() {
        count_key(
            "KNOWTATION_SIDECAR_UPSTREAM__POOL_MAX_IDLE",
            "upstream.pool_max_idle",
            32,
            MAX_POOL_IDLE,
            |c| c.upstream.pool_max_idle,
        );
    }

    #[test]
    fn auth_token_cache_entries_default_zero_allowed_and_bounded() {
        count_key(
            "KNOWTATION_SIDECAR_AUTH__TOKEN_CACHE_ENTRIES",
            "auth.token_cache_entries",
            DEFAULT_TOKEN_CACHE_ENTRIES,
            MAX_TOKEN_CACHE_ENTRIES,
            |c| c.auth.token_cache_entries,
        );
    }

    #[test]
    fn defaults_then_file_then_env() {
        let c = load_text(
            "[upstream]\ngateway_url = \"http://gw:1\"\nconnect_timeout_ms = 50\n[log]\nformat = \"plain\"\n",
            &[
                ("KNOWTATION_SIDECAR_UPSTREAM__GATEWAY_URL", "https://gw.example/base/"),
                ("KNOWTATION_SIDECAR_LISTEN__MAX_HEADERS", "7"),
                ("UNRELATED", "x"),
            ],
        )
        .expect("valid");
        assert_eq!(c.upstream.gateway_url, "https://gw.example/base/");
        assert_eq!(c.upstream.connect_timeout_ms, 50);
        assert_eq!(c.listen.max_headers, 7);
        assert_eq!(c.log.format, LogFormat::Plain);
        assert_eq!(c.shutdown.drain_seconds, 25);
    }

    #[test]
    fn s6_mcp_section_defaults_clamps_and_policy_file() {
        let c = load_text(MINIMAL, &[]).expect("valid");
        assert_eq!(c.mcp.max_body_bytes, 10 * 1024 * 1024);
        assert_eq!(
            c.mcp.session_ttl(),
            std::time::Duration::from_secs(8 * 3600)
        );
        assert_eq!(c.mcp.per_user_cap(), 8);
        assert_eq!(c.mcp.calls_per_minute, 60);
        let c = load_text(
            &format!("{MINIMAL}[mcp]\nsession_ttl_seconds = 1\nmax_sessions_per_user = 500\n"),
            &[],
        )
        .expect("valid");
        assert_eq!(c.mcp.session_ttl(), std::time::Duration::from_secs(300));
        assert_eq!(c.mcp.per_user_cap(), 20);
        let c = load_text(
            &format!("{MINIMAL}[mcp]\nsession_ttl_seconds = 999999\nmax_sessions_per_user = 0\n"),
            &[],
        )
        .expect("valid");
        assert_eq!(c.mcp.session_ttl(), std::time::Duration::from_secs(86_400));
        assert_eq!(c.mcp.per_user_cap(), 2);
        let policy = TempFile::new("default = \"deny\"\n");
        let c = load_text(
            MINIMAL,
            &[(
                "KNOWTATION_SIDECAR_MCP__POLICY_FILE",
                policy.0.to_str().expect("utf-8 path"),
            )],
        )
        .expect("valid");
        assert_eq!(c.mcp.policy_file.as_deref(), Some(policy.0.as_path()));
        // The policy file itself is read where it is used (`proxy::check`, `proxy::start`).
        assert_eq!(
            err_key(&format!("{MINIMAL}[mcp]\nmax_body_bytes = 0\n"), &[]),
            "mcp.max_body_bytes"
        );
    }

    #[test]
    fn env_lists_and_raw_strings() {
        let c = load_text(
            MINIMAL,
            &[
                ("KNOWTATION_SIDECAR_AUTH__JWT_SECRETS", "12345, true-ish"),
                (
                    "KNOWTATION_SIDECAR_CORS__ALLOWED_ORIGINS",
                    r#"["https://a.example", "https://b.example"]"#,
                ),
                ("KNOWTATION_SIDECAR_UPSTREAM__GATEWAY_SECRET", "true"),
            ],
        )
        .expect("valid");
        let secrets: Vec<&str> = c.auth.jwt_secrets.iter().map(Secret::expose).collect();
        assert_eq!(secrets, ["12345", "true-ish"]);
        assert_eq!(
            c.cors.allowed_origins,
            ["https://a.example", "https://b.example"]
        );
        assert_eq!(
            c.upstream.gateway_secret.as_ref().map(Secret::expose),
            Some("true")
        );
        assert_eq!(
            err_key(
                MINIMAL,
                &[("KNOWTATION_SIDECAR_CORS__ALLOWED_ORIGINS", "[1, 2]")]
            ),
            "KNOWTATION_SIDECAR_CORS__ALLOWED_ORIGINS"
        );
    }

    #[test]
    fn errors_name_the_key() {
        assert_eq!(err_key("", &[]), "upstream.gateway_url");
        assert_eq!(
            err_key("[upstream]\ngateway_url = \"ftp://x\"\n", &[]),
            "upstream.gateway_url"
        );
        assert_eq!(
            err_key("[upstream]\ngateway_url = \"http://u:p@x\"\n", &[]),
            "upstream.gateway_url"
        );
        assert_eq!(
            err_key(&format!("{MINIMAL}canister_url = \"gopher://c\"\n"), &[]),
            "upstream.canister_url"
        );
        assert_eq!(
            err_key(&format!("{MINIMAL}bridge_url = \"nope\"\n"), &[]),
            "upstream.bridge_url"
        );
        assert_eq!(
            err_key(&format!("{MINIMAL}bogus = 1\n"), &[]),
            "upstream.bogus"
        );
        assert_eq!(err_key(&format!("{MINIMAL}[nope]\n"), &[]), "nope");
        assert_eq!(
            err_key(MINIMAL, &[("KNOWTATION_SIDECAR_LISTEN__BOGUS", "1")]),
            "KNOWTATION_SIDECAR_LISTEN__BOGUS"
        );
        assert_eq!(
            err_key(MINIMAL, &[("KNOWTATION_SIDECAR_LISTEN", "1")]),
            "KNOWTATION_SIDECAR_LISTEN"
        );
        assert_eq!(
            err_key(
                MINIMAL,
                &[("KNOWTATION_SIDECAR_LISTEN__MAX_HEADERS", "many")]
            ),
            "listen.max_headers"
        );
        for (key, toml) in [
            (
                "hosted_context.timeout_ms",
                "[hosted_context]\ntimeout_ms = 249\n",
            ),
            (
                "hosted_context.timeout_ms",
                "[hosted_context]\ntimeout_ms = 10001\n",
            ),
            ("listen.max_in_flight", "[listen]\nmax_in_flight = 0\n"),
            (
                "listen.max_header_bytes",
                "[listen]\nmax_header_bytes = 100\n",
            ),
            ("shutdown.drain_seconds", "[shutdown]\ndrain_seconds = 0\n"),
            (
                "upstream.gateway_timeout_ms",
                "[upstream]\ngateway_timeout_ms = 0\n",
            ),
            (
                "listen.tls_key_file",
                "[listen]\ntls_cert_file = \"/nonexistent\"\n",
            ),
            (
                "listen.tls_cert_file",
                "[listen]\ntls_key_file = \"/nonexistent\"\n",
            ),
            (
                "listen.max_buffered_bytes_per_user",
                "[listen]\nmax_buffered_bytes = 1000\nmax_buffered_bytes_per_user = 2000\n",
            ),
            (
                "mcp.max_body_bytes",
                "[listen]\nmax_buffered_bytes_per_user = 1000\n[mcp]\nmax_body_bytes = 2000\n",
            ),
            ("log.level", "[log]\nlevel = \"=[\"\n"),
            ("log.format", "[log]\nformat = \"xml\"\n"),
            ("auth.jwt_secrets", "[auth]\njwt_secrets = [\"a\", \"\"]\n"),
            (
                "auth.jwt_secrets",
                "[auth]\njwt_secrets = [\"a\", \"b\", \"c\"]\n",
            ),
        ] {
            let toml = if toml.starts_with("[upstream]") {
                format!("{toml}gateway_url = \"http://gw\"\n")
            } else {
                format!("{MINIMAL}{toml}")
            };
            assert_eq!(err_key(&toml, &[]), key, "{toml}");
        }
        let ok = load_text(
            &format!("{MINIMAL}[auth]\njwt_secrets = [\"a\", \"b\", \"c\"]\nallow_extra_secrets = true\n"),
            &[],
        );
        assert!(ok.is_ok());
        let missing = PathBuf::from("/nonexistent/config.toml");
        assert_eq!(
            load_with_env(Some(&missing), &[]).expect_err("missing").key,
            "/nonexistent/config.toml"
        );
    }

    #[test]
    fn secret_values_never_appear_in_errors() {
        let e = load_text(&format!("{MINIMAL}gateway_secret = 987654321\n"), &[])
            .expect_err("not a string");
        assert_eq!(e.key, "upstream.gateway_secret");
        assert!(!e.to_string().contains("987654321"), "{e}");
        let e = load_text(&format!("{MINIMAL}[auth]\njwt_secrets = [31337]\n"), &[])
            .expect_err("not a string");
        assert!(e.key.starts_with("auth.jwt_secrets"), "{e}");
        assert!(!e.to_string().contains("31337"), "{e}");
    }

    #[test]
    fn secret_files() {
        let gw = TempFile::new("gateway-secret-value\n");
        let jwt = TempFile::new("first-secret\r\n\nsecond-secret\n");
        let c = load_text(
            &format!(
                "{MINIMAL}gateway_secret_file = {:?}\n[auth]\njwt_secrets_file = {:?}\n",
                gw.0, jwt.0
            ),
            &[],
        )
        .expect("valid");
        assert_eq!(
            c.upstream.gateway_secret.as_ref().map(Secret::expose),
            Some("gateway-secret-value")
        );
        let secrets: Vec<&str> = c.auth.jwt_secrets.iter().map(Secret::expose).collect();
        assert_eq!(secrets, ["first-secret", "second-secret"]);
        let both = load_text(
            &format!(
                "{MINIMAL}gateway_secret = \"x\"\ngateway_secret_file = {:?}\n",
                gw.0
            ),
            &[],
        );
        assert_eq!(both.expect_err("both").key, "upstream.gateway_secret_file");
    }

    #[test]
    fn toml_output_round_trips_and_redacts() {
        let c = load_text(
            &format!(
                "{MINIMAL}gateway_secret = \"hunter2-gw\"\ncanister_url = \"http://c:1\"\n\
                 [auth]\njwt_secrets = [\"hunter2-jwt\"]\n[cors]\nallowed_origins = [\"https://a\\\"b\"]\n"
            ),
            &[],
        )
        .expect("valid");
        let text = to_toml(&c);
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains("gateway_secret = \"<redacted>\""), "{text}");
        let again: Config = Figment::from(Toml::string(&text))
            .extract()
            .expect("printed TOML parses");
        assert_eq!(again.upstream.canister_url.as_deref(), Some("http://c:1"));
        assert_eq!(again.cors.allowed_origins, ["https://a\"b"]);
        assert_eq!(again.listen.max_headers, c.listen.max_headers);
        assert_eq!(again.upstream.gateway_secret_file, None);
    }

    #[test]
    fn live_swaps() {
        let live = Live::new(1);
        let old = live.load();
        live.store(2);
        assert_eq!((*old, *live.load()), (1, 2));
    }
}
