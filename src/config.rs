//! Configuration: the schema every module reads, as plain data. Its parts load it
//! (`load`: built-in defaults, then a TOML file, then
//! `KNOWTATION_SIDECAR_<SECTION>__<KEY>` environment variables), validate it whole
//! before any port is bound (`validate`) and print it with secrets as comments saying
//! where each came from (`render`).
//!
//! Environment values are taken as they are for strings (URLs, addresses, paths,
//! secrets, `log.level`); numbers, booleans and enum names are parsed. The list keys,
//! `auth.jwt_secrets`, `cors.allowed_origins` and `forwarded.trusted_proxies`, are
//! comma-separated
//! (`KNOWTATION_SIDECAR_CORS__ALLOWED_ORIGINS=https://a.example,https://b.example`) or,
//! when the value starts with `[`, an array of double-quoted strings
//! (`["9f86d081884c7d659a2feaa0c55ad015", "a,secret,of,32,bytes,with,commas"]`).
//! Secrets with commas or quotes belong in `auth.jwt_secrets_file` (one per line)
//! instead.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::worker::PerWorker;

use serde::{Deserialize, Serialize};

mod load;
mod render;
mod validate;

pub(crate) use load::explain;
pub use load::{load, load_with_env, resolve_file};
pub use render::to_toml;
pub use validate::{inert, trusted_proxies, validate, warnings, Inert, Warning, LOG_LEVELS};

/// A secret value: never printed, logged or serialized in clear.
#[derive(Clone, Default, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret {
    value: String,
    /// Where the loader found it, so `check-config` and errors can say so.
    #[serde(skip)]
    origin: SecretOrigin,
}

/// Where a [`Secret`] came from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SecretOrigin {
    /// The configuration file (or a configuration built in code).
    #[default]
    ConfigFile,
    /// The key's `KNOWTATION_SIDECAR_<SECTION>__<KEY>` environment variable.
    Environment,
    /// The key's `*_file` (`auth.jwt_secrets_file`, `upstream.gateway_secret_file`).
    SecretFile,
}

/// How a secret shows in debug output and serialization, and what `check-config` once
/// printed in place of secrets. A configuration holding it was copied from such output:
/// it is never a secret, and the loader refuses it.
pub const REDACTED_PLACEHOLDER: &str = "<redacted>";

/// The shortest JWT secret accepted, in bytes: RFC 7518 §3.2 requires an HMAC key at
/// least as long as the hash output, 256 bits for HS256 (HS384 and HS512 verify with
/// the same secrets, so the floor is the one all three share).
pub const MIN_JWT_SECRET_BYTES: usize = 32;

impl Secret {
    /// Wraps a secret value (its origin: [`SecretOrigin::ConfigFile`]).
    pub fn new(value: impl Into<String>) -> Secret {
        Secret {
            value: value.into(),
            origin: SecretOrigin::ConfigFile,
        }
    }

    /// Wraps a secret value found in `origin`.
    fn with_origin(value: impl Into<String>, origin: SecretOrigin) -> Secret {
        Secret {
            value: value.into(),
            origin,
        }
    }

    /// The secret itself, for the one place that uses it.
    pub fn expose(&self) -> &str {
        &self.value
    }

    /// Where it came from.
    pub fn origin(&self) -> SecretOrigin {
        self.origin
    }
}

/// Two secrets are equal when their values are, wherever they came from.
impl PartialEq for Secret {
    fn eq(&self, other: &Secret) -> bool {
        self.value == other.value
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED_PLACEHOLDER)
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(REDACTED_PLACEHOLDER)
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
    /// The proxies in front of the sidecar whose forwarding headers count (wire
    /// contract §7).
    pub forwarded: Forwarded,
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
    /// What is cut out of the answers the sidecar passes through.
    pub sanitize: Sanitize,
    /// Graceful shutdown.
    pub shutdown: Shutdown,
    /// State kept across restarts (MCP sessions).
    pub state: State,
    /// Logging.
    pub log: Log,
    /// Optional OpenTelemetry trace export (OTLP over HTTP), off by default.
    pub tracing: Tracing,
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
    /// A connection whose client takes none of the bytes waiting for it for this long is
    /// closed: an answer nobody reads must not hold its memory and its place forever. On
    /// HTTP/2, an answer whose stream the client grants no window for this long counts
    /// the same, though the socket stays writable.
    pub write_stall_timeout_ms: u64,
    /// Most requests at the gateway at once from callers whose bearer token verifies:
    /// passthrough, event streams, forwarded `POST /mcp` and shadowed REST requests, each
    /// holding one upstream connection until its answer ends; more get 503. Without it,
    /// one HTTP/2 connection's streams could open as many upstream connections.
    pub max_forwarded_in_flight: usize,
    /// Most of those requests one user (`sub`) may have at the gateway at once; more get
    /// 503 (at most `max_forwarded_in_flight` in effect).
    pub max_forwarded_in_flight_per_user: usize,
    /// The same for requests without a token that verifies: a bound of their own, so
    /// that a flood needing no token cannot take the identified callers' room.
    pub max_forwarded_in_flight_anonymous: usize,
    /// Most event streams (answers of type `text/event-stream`, such as the `GET /mcp`
    /// stream every connected MCP client keeps open) that identified callers may hold
    /// among their `max_forwarded_in_flight` places; more get 503. The rest of the places
    /// stay for requests that end, so connected clients cannot lock every caller out.
    pub max_event_streams: usize,
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
            body_read_timeout_ms: 300_000,
            max_buffered_bytes: 96 * 1024 * 1024,
            max_buffered_bytes_per_user: 40 * 1024 * 1024,
            idle_timeout_seconds: 90,
            max_connections: 10_000,
            write_stall_timeout_ms: 300_000,
            max_forwarded_in_flight: 2048,
            max_forwarded_in_flight_per_user: 512,
            max_forwarded_in_flight_anonymous: 512,
            max_event_streams: 1536,
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

/// The proxies in front of the sidecar whose `X-Forwarded-*` headers it believes when it
/// works out the client's address, scheme and host for the gateway (wire contract §7).
/// The default, no hop, is for clients that connect straight to the sidecar: then
/// nothing a client sends decides them.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Forwarded {
    /// How many proxies in front of the sidecar are trusted: the peer and the
    /// `X-Forwarded-For` entries written by trusted hops count, right to left, until this
    /// many hops have been passed. `0`: the peer is the client.
    pub trusted_hops: u32,
    /// Addresses or CIDR ranges those proxies connect from: a hop outside them is not
    /// trusted, whatever `trusted_hops` says. Empty: any address. Needs
    /// `trusted_hops` of at least 1.
    pub trusted_proxies: Vec<String>,
}

/// Most `forwarded.trusted_hops`: the entries read per request are bounded by it.
pub const MAX_TRUSTED_HOPS: u32 = 16;

/// Most `forwarded.trusted_proxies` entries: each trusted hop is matched against them.
pub const MAX_TRUSTED_PROXIES: usize = 1024;

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
    /// Idle keep-alive connections each upstream pool keeps in all (the gateway's, which
    /// passthrough and MCP share; the canister's; the bridge's): past it, a connection is
    /// closed when its exchange ends, so a burst's connections do not stay open. Shared
    /// out among the workers' pools. `0` keeps none.
    pub pool_max_idle: usize,
    /// Idle keep-alive connections one caller keeps in each pool, each worker's own (see
    /// `reuse`): past it, the caller's oldest idle connection is closed. `0` keeps none.
    pub pool_max_idle_per_principal: usize,
    /// How long an idle connection is kept. Below the upstream's own keep-alive timeout
    /// (Node's default is 5 s), so the sidecar, not the upstream, closes it.
    pub pool_idle_timeout_ms: u64,
    /// Who may use an idle upstream connection another exchange left.
    pub reuse: Reuse,
}

/// See [`Upstream::reuse`]. With HTTP/1.1 keep-alive, bytes an upstream writes past an
/// answer are read as the answer to the next request on that connection; the choice
/// here decides whose request that can be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reuse {
    /// A connection carries the exchanges of one principal only: the verified token's
    /// `sub` (with the vault, for the canister), or for a request without a verified
    /// token, one client connection.
    #[default]
    Principal,
    /// A connection carries the exchanges of one client connection only.
    Connection,
    /// Any caller's exchange may use any idle connection: fewer connections, but an
    /// upstream's framing slip can hand one caller's answer to another. Unsafe for
    /// mixed callers.
    Shared,
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
            pool_max_idle: 128,
            pool_max_idle_per_principal: 32,
            pool_idle_timeout_ms: 4_000,
            reuse: Reuse::Principal,
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
    /// The views' policy (TOML): who answers each body-free view (`[views]`) and which
    /// roles may use the ones the sidecar owns; absent: every view owned by the sidecar
    /// and every role allowed, as the gateway allows `get_section_source`.
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
    /// Origins whose browser pages may call `/mcp`; a request with any other `Origin`
    /// (or `null`, or two) is refused with 403 before anything else. Unset: the origins
    /// of `cors.allowed_origins`, each with its `www.` twin. A request without `Origin`
    /// is never refused for it.
    pub allowed_origins: Option<Vec<String>>,
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
            allowed_origins: None,
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

/// What is cut out of the gateway's answers on the tools, prompts and routes the sidecar
/// passes through (each on by default).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Sanitize {
    /// In tool results with `isError`, prompt messages and JSON-RPC errors on `/mcp`,
    /// the text after `Upstream <status>` (the canister's error body) is cut.
    pub upstream_errors: bool,
    /// An absolute filesystem path in the `path` field of a `get_note`, `relate`,
    /// `backlinks` or `list_notes` result becomes the vault-relative path asked for, or
    /// is dropped.
    pub note_paths: bool,
    /// A 5xx answer of a REST note route (`/api/v1/notes…`) gets a fixed JSON body in
    /// place of the upstream's.
    pub rest_errors: bool,
    /// The most of one MCP message (an event's data, a JSON answer) held to sanitize it,
    /// and never more than `listen.max_buffered_bytes_per_user`; a larger one passes as
    /// it came (counted).
    pub max_message_bytes: usize,
}

impl Default for Sanitize {
    fn default() -> Self {
        Sanitize {
            upstream_errors: true,
            note_paths: true,
            rest_errors: true,
            max_message_bytes: 8 * 1024 * 1024,
        }
    }
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
    /// Workers, each a thread with a single-threaded event loop of its own
    /// ([`crate::worker`]). `0`: one per CPU the process may use (its CPU affinity and
    /// cgroup CPU limit).
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

/// Optional OpenTelemetry trace export: one span per request phase, sent over OTLP/HTTP
/// (protobuf). Read only at start.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Tracing {
    /// Export spans at all.
    pub enabled: bool,
    /// The collector's OTLP/HTTP traces URL (plain `http://`; put a collector beside the
    /// sidecar to reach one over TLS).
    pub endpoint: String,
    /// The share of new traces kept, 0.0 to 1.0; a caller's `traceparent` decides for its
    /// own trace.
    pub sample_ratio: f64,
    /// The `service.name` resource attribute.
    pub service_name: String,
    /// Time allowed for one export request.
    pub export_timeout_ms: u64,
}

impl Default for Tracing {
    fn default() -> Self {
        Tracing {
            enabled: false,
            endpoint: "http://127.0.0.1:4318/v1/traces".to_owned(),
            sample_ratio: 1.0,
            service_name: "knowtation-sidecar".to_owned(),
            export_timeout_ms: 10_000,
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

/// The one swappable handle on live state (the config and everything built from it):
/// readers take a cheap snapshot per request; a reload stores a new value without
/// touching open connections.
#[derive(Debug)]
pub struct Live<T> {
    current: RwLock<Arc<T>>,
    /// Counts stores, so a worker can tell its snapshot is still current.
    version: AtomicU64,
    /// Each worker's snapshot and the version it was taken at: [`Live::load_local`]
    /// hands out clones of the worker's own `Arc`, whose count no other worker touches.
    local: PerWorker<Mutex<Option<Stamped<T>>>>,
}

/// A worker's own reference to a value: an `Arc` of the shared `Arc` (the double
/// allocation is the point: its count is the worker's alone).
#[allow(clippy::redundant_allocation)]
type Snapshot<T> = Arc<Arc<T>>;

/// A snapshot and the store count it was taken at.
type Stamped<T> = (u64, Snapshot<T>);

/// A worker's snapshot of a [`Live`] value (see [`Live::load_local`]).
#[derive(Debug)]
pub struct Local<T>(Snapshot<T>);

impl<T> std::ops::Deref for Local<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> Live<T> {
    /// Holds `value`, for one worker.
    pub fn new(value: T) -> Live<T> {
        Live::for_workers(value, 1)
    }

    /// Holds `value`, with a snapshot slot for each of `workers` workers.
    pub fn for_workers(value: T, workers: usize) -> Live<T> {
        Live {
            current: RwLock::new(Arc::new(value)),
            version: AtomicU64::new(0),
            local: PerWorker::new(workers, |_| Mutex::new(None)),
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

    /// The current value, through the calling worker's snapshot: on the request path
    /// this takes no lock and no reference another worker takes. A store is seen by
    /// every load that begins after it returned; a worker keeps the previous value
    /// alive until its next load.
    pub fn load_local(&self) -> Local<T> {
        let version = self.version.load(Ordering::Acquire);
        let mut slot = self.local.get().lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, value)) = &*slot {
            if *at == version {
                return Local(Arc::clone(value));
            }
        }
        let value = Arc::new(self.load());
        *slot = Some((version, Arc::clone(&value)));
        Local(value)
    }

    /// Replaces the value; requests already holding the old one finish with it.
    pub fn store(&self, value: T) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(value);
        self.version.fetch_add(1, Ordering::Release);
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;
    use figment::providers::{Format, Toml};
    use figment::Figment;
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
            128,
            MAX_POOL_IDLE,
            |c| c.upstream.pool_max_idle,
        );
    }

    #[test]
    fn upstream_pool_max_idle_per_principal_default_zero_allowed_and_bounded() {
        count_key(
            "KNOWTATION_SIDECAR_UPSTREAM__POOL_MAX_IDLE_PER_PRINCIPAL",
            "upstream.pool_max_idle_per_principal",
            32,
            MAX_POOL_IDLE,
            |c| c.upstream.pool_max_idle_per_principal,
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
    fn forwarded_defaults_env_lists_and_errors() {
        let c = load_text(MINIMAL, &[]).expect("loads");
        assert_eq!(c.forwarded.trusted_hops, 0);
        assert!(c.forwarded.trusted_proxies.is_empty());
        let c = load_text(
            MINIMAL,
            &[
                ("KNOWTATION_SIDECAR_FORWARDED__TRUSTED_HOPS", "2"),
                (
                    "KNOWTATION_SIDECAR_FORWARDED__TRUSTED_PROXIES",
                    "10.0.0.0/8, 192.0.2.7,2001:db8::/32",
                ),
            ],
        )
        .expect("env");
        assert_eq!(c.forwarded.trusted_hops, 2);
        assert_eq!(
            c.forwarded.trusted_proxies,
            ["10.0.0.0/8", "192.0.2.7", "2001:db8::/32"]
        );
        let nets = trusted_proxies(&c.forwarded).expect("ranges");
        assert_eq!(nets.len(), 3);
        // IPv4-mapped ranges are their IPv4 range: peers are compared canonically.
        let mapped = Forwarded {
            trusted_hops: 1,
            trusted_proxies: vec!["::ffff:10.0.0.0/104".to_owned()],
        };
        assert_eq!(
            trusted_proxies(&mapped).expect("mapped")[0].to_string(),
            "10.0.0.0/8"
        );
        for (toml, key) in [
            ("[forwarded]\ntrusted_hops = 17\n", "forwarded.trusted_hops"),
            ("[forwarded]\ntrusted_hops = -1\n", "forwarded.trusted_hops"),
            (
                "[forwarded]\ntrusted_proxies = [\"10.0.0.0/8\"]\n",
                "forwarded.trusted_hops",
            ),
            (
                "[forwarded]\ntrusted_hops = 1\ntrusted_proxies = [\"10.0.0.1/8\"]\n",
                "forwarded.trusted_proxies",
            ),
            (
                "[forwarded]\ntrusted_hops = 1\ntrusted_proxies = [\"lb.internal\"]\n",
                "forwarded.trusted_proxies",
            ),
            (
                "[forwarded]\ntrusted_hops = 1\ntrusted_proxies = [\"10.0.0.0/33\"]\n",
                "forwarded.trusted_proxies",
            ),
            ("[forwarded]\ntrusted_hop = 1\n", "forwarded.trusted_hop"),
        ] {
            assert_eq!(err_key(&format!("{MINIMAL}{toml}"), &[]), key, "{toml}");
        }
        let many = vec!["10.0.0.1"; MAX_TRUSTED_PROXIES + 1].join(",");
        assert_eq!(
            err_key(
                &format!("{MINIMAL}[forwarded]\ntrusted_hops = 1\n"),
                &[(
                    "KNOWTATION_SIDECAR_FORWARDED__TRUSTED_PROXIES",
                    many.as_str()
                )]
            ),
            "forwarded.trusted_proxies"
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
                (
                    "KNOWTATION_SIDECAR_AUTH__JWT_SECRETS",
                    "12345678901234567890123456789012, true-ish-0123456789abcdef0123456789",
                ),
                (
                    "KNOWTATION_SIDECAR_CORS__ALLOWED_ORIGINS",
                    r#"["https://a.example", "https://b.example"]"#,
                ),
                ("KNOWTATION_SIDECAR_UPSTREAM__GATEWAY_SECRET", "true"),
            ],
        )
        .expect("valid");
        let secrets: Vec<&str> = c.auth.jwt_secrets.iter().map(Secret::expose).collect();
        assert_eq!(
            secrets,
            [
                "12345678901234567890123456789012",
                "true-ish-0123456789abcdef0123456789"
            ]
        );
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
            (
                "sanitize.max_message_bytes",
                "[sanitize]\nmax_message_bytes = 0\n",
            ),
            ("log.level", "[log]\nlevel = \"=[\"\n"),
            ("log.format", "[log]\nformat = \"xml\"\n"),
            (
                "tracing.endpoint",
                "[tracing]\nendpoint = \"https://collector:4318/v1/traces\"\n",
            ),
            ("tracing.endpoint", "[tracing]\nendpoint = \"collector\"\n"),
            ("tracing.sample_ratio", "[tracing]\nsample_ratio = 1.5\n"),
            ("tracing.service_name", "[tracing]\nservice_name = \"\"\n"),
            (
                "tracing.export_timeout_ms",
                "[tracing]\nexport_timeout_ms = 0\n",
            ),
            (
                "auth.jwt_secrets",
                "[auth]\njwt_secrets = [\"0123456789abcdef0123456789abcdef\", \"\"]\n",
            ),
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
            &format!(
                "{MINIMAL}[auth]\njwt_secrets = [\"{A}\", \"{B}\", \"{C}\"]\nallow_extra_secrets = true\n",
                A = "a".repeat(32),
                B = "b".repeat(32),
                C = "c".repeat(32),
            ),
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
        let jwt = TempFile::new(
            "first-secret-0123456789abcdef0123\r\n\nsecond-secret-0123456789abcdef0123\n",
        );
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
        assert_eq!(
            secrets,
            [
                "first-secret-0123456789abcdef0123",
                "second-secret-0123456789abcdef0123"
            ]
        );
        let both = load_text(
            &format!(
                "{MINIMAL}gateway_secret = \"x\"\ngateway_secret_file = {:?}\n",
                gw.0
            ),
            &[],
        );
        assert_eq!(both.expect_err("both").key, "upstream.gateway_secret_file");
    }

    /// 32 bytes: the shortest JWT secret accepted.
    const JWT_32: &str = "jwt-secret-0123456789abcdef01234";

    #[test]
    fn toml_output_round_trips_and_loads_with_no_secret() {
        let c = load_text(
            &format!(
                "{MINIMAL}gateway_secret = \"hunter2-gw\"\ncanister_url = \"http://c:1\"\n\
                 [auth]\njwt_secrets = [\"hunter2-jwt-0123456789abcdef0123456789\"]\n\
                 [cors]\nallowed_origins = [\"https://a.example\"]\n\
                 [state]\ndirectory = \"/var/lib/a\\\"b\"\n"
            ),
            &[],
        )
        .expect("valid");
        let text = to_toml(&c);
        assert!(!text.contains("hunter2"), "{text}");
        assert!(
            text.contains("\n# gateway_secret = <redacted, from the config file>\n"),
            "{text}"
        );
        assert!(
            text.contains("\n# jwt_secrets = <1 redacted: 1 from the config file>\n"),
            "{text}"
        );
        // Only comments mention the placeholder.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(!line.contains(REDACTED_PLACEHOLDER), "{line}");
        }
        let again: Config = Figment::from(Toml::string(&text))
            .extract()
            .expect("printed TOML parses");
        assert_eq!(again.upstream.canister_url.as_deref(), Some("http://c:1"));
        assert_eq!(again.cors.allowed_origins, ["https://a.example"]);
        assert_eq!(
            again.state.directory.as_deref(),
            Some(std::path::Path::new("/var/lib/a\"b"))
        );
        assert_eq!(again.listen.max_headers, c.listen.max_headers);
        assert_eq!(again.upstream.gateway_secret_file, None);
        // Loaded as a configuration, it holds no secret at all.
        let again = load_text(&text, &[]).expect("printed TOML loads");
        assert!(again.auth.jwt_secrets.is_empty());
        assert!(again.upstream.gateway_secret.is_none());
    }

    #[test]
    fn toml_output_says_where_each_secret_came_from() {
        let gw = TempFile::new("gateway-secret-value\n");
        let jwt = TempFile::new(&format!("{JWT_32}\n{JWT_32}-previous\n"));
        let files = format!(
            "{MINIMAL}gateway_secret_file = {:?}\n[auth]\njwt_secrets = [\"{JWT_32}\"]\n\
             jwt_secrets_file = {:?}\nallow_extra_secrets = true\n",
            gw.0, jwt.0
        );
        let text = to_toml(&load_text(&files, &[]).expect("valid"));
        assert!(
            text.contains("\n# gateway_secret = <redacted, from gateway_secret_file>\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "\n# jwt_secrets = <3 redacted: 1 from the config file, then 2 from jwt_secrets_file>\n"
            ),
            "{text}"
        );
        let from_env = to_toml(
            &load_text(
                MINIMAL,
                &[
                    ("KNOWTATION_SIDECAR_AUTH__JWT_SECRETS", JWT_32),
                    ("KNOWTATION_SIDECAR_UPSTREAM__GATEWAY_SECRET", "gw"),
                ],
            )
            .expect("valid"),
        );
        assert!(
            from_env.contains(
                "\n# gateway_secret = <redacted, from the environment \
                 (KNOWTATION_SIDECAR_UPSTREAM__GATEWAY_SECRET)>\n"
            ),
            "{from_env}"
        );
        assert!(
            from_env.contains(
                "\n# jwt_secrets = <1 redacted: 1 from the environment \
                 (KNOWTATION_SIDECAR_AUTH__JWT_SECRETS)>\n"
            ),
            "{from_env}"
        );
        // Without secrets, the keys print as their defaults.
        let none = to_toml(&load_text(MINIMAL, &[]).expect("valid"));
        assert!(none.contains("\njwt_secrets = []\n"), "{none}");
        assert!(none.contains("\n# gateway_secret = unset\n"), "{none}");
    }

    /// (the key an error must name, config file, environment)
    type SecretCase<'a> = (&'static str, String, Vec<(&'a str, &'a str)>);

    /// `value` as the JWT secret and as the gateway secret, from the config file, the
    /// environment and the `*_file`: each load's error, or `None` where it loads.
    fn secret_errors(value: &str) -> Vec<(&'static str, Option<ConfigError>)> {
        let file = TempFile::new(&format!("{value}\n"));
        let path = format!("{:?}", file.0);
        let toml_string = serde_json::Value::from(value).to_string();
        let cases: Vec<SecretCase<'_>> = vec![
            (
                "auth.jwt_secrets",
                format!("{MINIMAL}[auth]\njwt_secrets = [{toml_string}]\n"),
                vec![],
            ),
            (
                "auth.jwt_secrets",
                MINIMAL.to_owned(),
                vec![("KNOWTATION_SIDECAR_AUTH__JWT_SECRETS", value)],
            ),
            (
                "auth.jwt_secrets_file",
                format!("{MINIMAL}[auth]\njwt_secrets_file = {path}\n"),
                vec![],
            ),
            (
                "upstream.gateway_secret",
                format!("{MINIMAL}gateway_secret = {toml_string}\n"),
                vec![],
            ),
            (
                "upstream.gateway_secret",
                MINIMAL.to_owned(),
                vec![("KNOWTATION_SIDECAR_UPSTREAM__GATEWAY_SECRET", value)],
            ),
            (
                "upstream.gateway_secret_file",
                format!("{MINIMAL}gateway_secret_file = {path}\n"),
                vec![],
            ),
        ];
        cases
            .into_iter()
            .map(|(key, toml, env)| (key, load_text(&toml, &env).err()))
            .collect()
    }

    #[test]
    fn the_redacted_placeholder_is_refused_wherever_it_appears() {
        let padded = "CANARY-BEFORE-0123456789abcdef-<Redacted>-CANARY-AFTER";
        for value in [REDACTED_PLACEHOLDER, padded] {
            for (key, err) in secret_errors(value) {
                let err = err.unwrap_or_else(|| panic!("{key} = {value:?} loaded"));
                assert_eq!(err.key, key, "{value:?}: {err}");
                assert!(err.message.contains("placeholder"), "{err}");
                assert!(!err.to_string().contains("CANARY"), "{err}");
            }
        }
    }

    #[test]
    fn jwt_secrets_have_a_32_byte_floor_gateway_secrets_do_not() {
        let short = &JWT_32[..31];
        for (key, err) in secret_errors(short) {
            if key.starts_with("upstream.") {
                assert_eq!(err, None, "{key}: a short gateway secret is the canister's");
                continue;
            }
            let err = err.unwrap_or_else(|| panic!("{key}: a 31-byte secret loaded"));
            assert_eq!(err.key, key, "{err}");
            assert!(err.message.contains("shorter than 32 bytes"), "{err}");
            assert!(!err.to_string().contains(short), "{err}");
        }
        for (key, err) in secret_errors(JWT_32) {
            assert_eq!(err, None, "{key}: a 32-byte secret is refused");
        }
        // The place among secrets of the same origin, never the value.
        let err = load_text(
            &format!("{MINIMAL}[auth]\njwt_secrets = [\"{JWT_32}\", \"{short}\"]\n"),
            &[],
        )
        .expect_err("short second secret");
        assert!(
            err.to_string()
                .starts_with("auth.jwt_secrets: secret #2 in the config file is shorter"),
            "{err}"
        );
    }

    #[test]
    fn live_swaps() {
        let live = Live::new(1);
        let old = live.load();
        live.store(2);
        assert_eq!((*old, *live.load()), (1, 2));
    }

    #[test]
    fn a_workers_snapshot_follows_every_store() {
        let live = Live::for_workers(1, 2);
        let first = live.load_local();
        assert_eq!(*first, 1);
        // The same snapshot while nothing was stored, a new one at once after a store.
        assert!(Arc::ptr_eq(&first.0, &live.load_local().0));
        live.store(2);
        assert_eq!(*live.load_local(), 2);
        assert_eq!(*first, 1, "a request holding the old value keeps it");
        let other = std::thread::spawn({
            let live = Arc::new(live);
            move || {
                crate::worker::enter(1);
                let seen = *live.load_local();
                live.store(3);
                (seen, *live.load_local())
            }
        })
        .join()
        .ok();
        assert_eq!(other, Some((2, 3)));
    }
}
