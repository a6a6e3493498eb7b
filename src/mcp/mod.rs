//! The hosted MCP choke point (wire contract §6): `POST /mcp` is classified here, the
//! `get_section_source` tool is answered here, and everything else goes to the gateway
//! in the sidecar's own serialization.
//!
//! Phases, as the proxy drives them once [`crate::route`] picked `/mcp`:
//! [`McpService::authenticate`] verifies the token from the headers (401 at once, before
//! any slot or body byte); [`McpService::read_body`] is the door ([`door`]: media type,
//! encoding, cap, read deadline, budget, canonical JSON); [`McpService::post`] decides:
//! answer the tool call, refuse (batches, header mismatches, failed `initialize`
//! lookups), or forward the canonical bytes with a [`Watch`] that [`McpService::learn`]
//! and [`McpService::rewrite`] apply to the gateway's answer (learn a session from
//! `initialize`, rewrite list answers). Every refusal is mapped to the wire in one place,
//! [`McpError::wire`].
//!
//! Decisions where the contract is silent:
//! - Door refusals: a media type other than `application/json` with at most
//!   `charset=utf-8`, or a non-identity `Content-Encoding` → 415; a body that is not
//!   UTF-8 JSON or holds a `__proto__` key → 400, both in the gateway's
//!   `{"error":…,"code":…}` shape with fixed text (the parser message is not imitated);
//!   over the cap → 413 in the same shape; not in within the read deadline → 408; no
//!   room in the budget → 503 with `Retry-After: 1`.
//! - `initialize` is watched, so it is refused in a batch too (the sidecar could not
//!   learn that session); a batch is refused when any element is `initialize`, a list
//!   method that is rewritten, or a `get_section_source` call.
//! - `Mcp-Method`/`Mcp-Name`: a header present more than once, present on a batch, or
//!   not equal to the body's `method` / `params.name` (or `params.uri`) is refused.
//! - `initialize` with a vault id outside the §1 pattern is refused with 400 -32600
//!   `Invalid vault`; with no bridge configured there is no hosted access (403).
//! - `tools/list` on a session the sidecar does not know is answered 404 `Session not
//!   found` (the role is unknown, and a 404 makes a client initialize again).
//! - The 60-per-minute window counts every `/mcp` request whose token verifies; only
//!   requests the sidecar answers (and `initialize`, before its bridge lookup) are
//!   refused by it (the gateway refuses the others).
//! - A batch holding a nested array is refused like a batch holding a watched call.
//! - A `get_section_source` notification (no `id`) passes every check and is answered
//!   202 with no body and no tool run, as the SDK treats notifications.
//! - No canister configured → `Runtime failure`.

pub mod door;
mod policy;
mod session;
pub mod store;
mod tool;
pub(crate) mod wire;

pub use policy::{Decision, Policy};
pub use session::{valid_session_id, Inserted, Session, Sessions, MAX_SESSION_ID_BYTES};
pub use tool::{ArgumentIssue, JsType, ToolFailure};
pub use wire::{echo_id, Rewrite, TOOL_DESCRIPTOR, TOOL_NAME};

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Response, StatusCode};
use http_body_util::Full;
use serde_json::{Map, Value};
use tokio::sync::oneshot;

use crate::auth::{self, Identity, Keys};
use crate::budget::{Refusal, Slot};
use crate::canister::{self, CanisterClient, NoteResponse};
use crate::config::{Config, ConfigError, Mode};
use crate::cors::Cors;
use crate::extract::{self, Limits};
use crate::hosted::{HostedClient, HostedError};
use crate::path;
use crate::shadow::{self, Own};
use crate::telemetry::{Eviction, HostedContextEvent, Intercepted, Metrics, Outcome, Surface};
use crate::upstream;

/// Protocol versions the SDK accepts (§6 step 8), in its order.
pub const SUPPORTED_PROTOCOL_VERSIONS: [&str; 5] = [
    "2025-11-25",
    "2025-06-18",
    "2025-03-26",
    "2024-11-05",
    "2024-10-07",
];

/// Methods whose answers are rewritten (§6 ACL).
const REWRITTEN: [&str; 3] = ["tools/list", "resources/list", "resources/templates/list"];

/// Largest gateway answer to a rewritten list call that is buffered; larger → 502.
pub const MAX_LIST_ANSWER_BYTES: usize = 8 * 1024 * 1024;

/// The rate window (§6 step 3).
const WINDOW: Duration = Duration::from_secs(60);

const GATEWAY_JSON: &str = "application/json; charset=utf-8";
const SDK_JSON: &str = "application/json";

/// Every refusal the sidecar answers on `/mcp`; [`McpError::wire`] is the one mapping
/// to status, body and content type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McpError {
    /// Body over `mcp.max_body_bytes` (door).
    PayloadTooLarge,
    /// `Content-Encoding` other than identity, or a charset other than UTF-8 (door).
    UnsupportedEncoding,
    /// Not UTF-8 or not JSON, or a `__proto__` key (door; the gateway's step 1).
    InvalidBody,
    /// The body did not arrive within `listen.body_read_timeout_ms` (door).
    BodyTimeout,
    /// No room in the in-flight or buffered-bytes budget (door).
    Overloaded(Refusal),
    /// A batch holding a call the sidecar answers or rewrites (§6 Deviation).
    BatchRefused,
    /// `Mcp-Method`/`Mcp-Name` disagree with the body (§6 Deviation).
    HeaderMismatch,
    /// `X-Vault-Id` outside the §1 pattern at `initialize`.
    InvalidVault,
    /// Step 2.
    Unauthorized,
    /// Step 3.
    RateLimited,
    /// Step 4.
    SessionNotFound,
    /// The hosted-context lookup failed at `initialize` (§2).
    NoHostedAccess,
    /// Step 5.
    NotAcceptable,
    /// Step 6.
    UnsupportedMediaType,
    /// Step 7.
    InvalidJsonRpc,
    /// Step 8, with the header value.
    UnsupportedProtocolVersion(String),
    /// A rewritten list answer could not be read or rewritten.
    BadGateway,
}

impl McpError {
    /// Status, exact body, content type and outcome label.
    pub fn wire(&self) -> (StatusCode, String, &'static str, Outcome) {
        let gateway = |status, code: i32, message: &str, outcome| {
            (
                status,
                format!(r#"{{"jsonrpc":"2.0","error":{{"code":{code},"message":"{message}"}}}}"#),
                GATEWAY_JSON,
                outcome,
            )
        };
        let sdk = |status, code: i32, message: &str, outcome| {
            let message = serde_json::to_string(message).unwrap_or_default();
            (
                status,
                format!(
                    r#"{{"jsonrpc":"2.0","error":{{"code":{code},"message":{message}}},"id":null}}"#
                ),
                SDK_JSON,
                outcome,
            )
        };
        let plain = |status, error: &str, code: &str, outcome| {
            (
                status,
                format!(r#"{{"error":"{error}","code":"{code}"}}"#),
                GATEWAY_JSON,
                outcome,
            )
        };
        match self {
            McpError::PayloadTooLarge => plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                "Payload Too Large",
                "PAYLOAD_TOO_LARGE",
                Outcome::PayloadTooLarge,
            ),
            McpError::UnsupportedEncoding => plain(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "Unsupported content encoding or charset",
                "UNSUPPORTED_MEDIA_TYPE",
                Outcome::UnsupportedMediaType,
            ),
            McpError::InvalidBody => plain(
                StatusCode::BAD_REQUEST,
                "Invalid JSON body",
                "INTERNAL_ERROR",
                Outcome::InvalidRequest,
            ),
            McpError::BodyTimeout => plain(
                StatusCode::REQUEST_TIMEOUT,
                "Request Timeout",
                "REQUEST_TIMEOUT",
                Outcome::BodyTimeout,
            ),
            McpError::Overloaded(_) => plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "Service overloaded",
                "SERVICE_UNAVAILABLE",
                Outcome::Overloaded,
            ),
            McpError::BatchRefused => sdk(
                StatusCode::BAD_REQUEST,
                -32600,
                "Invalid Request: batches may not contain this method",
                Outcome::InvalidRequest,
            ),
            McpError::HeaderMismatch => sdk(
                StatusCode::BAD_REQUEST,
                -32600,
                "Invalid Request: Mcp-Method or Mcp-Name header does not match the body",
                Outcome::InvalidRequest,
            ),
            McpError::InvalidVault => gateway(
                StatusCode::BAD_REQUEST,
                -32600,
                "Invalid vault",
                Outcome::InvalidVault,
            ),
            McpError::Unauthorized => gateway(
                StatusCode::UNAUTHORIZED,
                -32600,
                "Unauthorized",
                Outcome::Unauthorized,
            ),
            McpError::RateLimited => gateway(
                StatusCode::TOO_MANY_REQUESTS,
                -32600,
                "Rate limit exceeded",
                Outcome::RateLimited,
            ),
            McpError::SessionNotFound => gateway(
                StatusCode::NOT_FOUND,
                -32600,
                "Session not found",
                Outcome::SessionNotFound,
            ),
            McpError::NoHostedAccess => gateway(
                StatusCode::FORBIDDEN,
                -32600,
                "No hosted access",
                Outcome::NoHostedAccess,
            ),
            McpError::NotAcceptable => sdk(
                StatusCode::NOT_ACCEPTABLE,
                -32000,
                "Not Acceptable: Client must accept both application/json and text/event-stream",
                Outcome::NotAcceptable,
            ),
            McpError::UnsupportedMediaType => sdk(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                -32000,
                "Unsupported Media Type: Content-Type must be application/json",
                Outcome::UnsupportedMediaType,
            ),
            McpError::InvalidJsonRpc => sdk(
                StatusCode::BAD_REQUEST,
                -32700,
                "Parse error: Invalid JSON-RPC message",
                Outcome::InvalidRequest,
            ),
            McpError::UnsupportedProtocolVersion(v) => sdk(
                StatusCode::BAD_REQUEST,
                -32000,
                &format!(
                    "Bad Request: Unsupported protocol version: {v} (supported versions: {})",
                    SUPPORTED_PROTOCOL_VERSIONS.join(", ")
                ),
                Outcome::UnsupportedProtocolVersion,
            ),
            McpError::BadGateway => plain(
                StatusCode::BAD_GATEWAY,
                "Bad Gateway",
                "BAD_GATEWAY",
                Outcome::BadGateway,
            ),
        }
    }
}

/// What to do with a gateway answer to a forwarded `POST /mcp`.
#[derive(Debug)]
pub enum Watch {
    /// Stream it back unchanged.
    Nothing,
    /// An `initialize`: record the session if the answer is a 200 with an
    /// `mcp-session-id`.
    Initialize(Box<Session>),
    /// A list answer to rewrite.
    Rewrite(Rewrite),
    /// Shadow mode: a `get_section_source` call the gateway answers; compare its answer
    /// with the sidecar's own.
    Shadow(Box<shadow::Own>),
}

/// The decision for one `POST /mcp`.
#[derive(Debug)]
pub enum Step {
    /// Answered here.
    Answer(Response<Full<Bytes>>),
    /// Forward the buffered body, then apply the watch.
    Forward(Watch),
}

/// A sliding 60 s request log per `sub` (§6 step 3), bounded in users.
struct Window {
    limit: usize,
    max_keys: usize,
    map: Mutex<HashMap<String, VecDeque<Instant>>>,
}

impl Window {
    /// Counts one request of `sub`; `false` when the window is full (nothing counted).
    fn hit(&self, sub: &str, now: Instant) -> bool {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        let fresh = |q: &mut VecDeque<Instant>| {
            while q
                .front()
                .is_some_and(|t| now.saturating_duration_since(*t) >= WINDOW)
            {
                q.pop_front();
            }
        };
        if !map.contains_key(sub) && map.len() >= self.max_keys {
            map.retain(|_, q| {
                fresh(q);
                !q.is_empty()
            });
            if map.len() >= self.max_keys {
                // Full of active users: refuse rather than grow without bound.
                return false;
            }
        }
        let q = map.entry(sub.to_owned()).or_default();
        fresh(q);
        if q.len() >= self.limit {
            return false;
        }
        q.push_back(now);
        true
    }
}

/// The MCP surface: door, session table, policy and the tool.
pub struct McpService {
    keys: Keys,
    canister: Option<CanisterClient>,
    hosted: Option<Arc<HostedClient>>,
    /// Shared with every other generation: a reload keeps the sessions.
    sessions: Arc<Sessions>,
    policy: Policy,
    cors: Cors,
    window: Window,
    max_body: usize,
    body_timeout: Duration,
    metrics: Arc<Metrics>,
    /// `intercept.mode = "shadow"`: the gateway answers the tool and sees list answers
    /// unchanged; the sidecar computes its own answer to compare.
    shadow: bool,
}

impl fmt::Debug for McpService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpService")
            .field("sessions", &self.sessions)
            .field("max_body", &self.max_body)
            .finish_non_exhaustive()
    }
}

/// Records and logs one answered request.
fn record(metrics: &Metrics, i: &Intercepted) {
    metrics.record(i);
    crate::telemetry::log_intercepted(i);
}

impl McpService {
    /// Builds the surface; `keys` and `hosted` are the REST surface's, so both share one
    /// cache of verified tokens and one of hosted context (§1, §2). `sessions` outlives
    /// the surface: a reload builds a new one around it.
    pub fn new(
        config: &Config,
        keys: Keys,
        hosted: Option<Arc<HostedClient>>,
        metrics: Arc<Metrics>,
        sessions: Arc<Sessions>,
    ) -> Result<McpService, ConfigError> {
        let up = &config.upstream;
        let connector = upstream::connector(
            up.ca_file.as_deref(),
            Duration::from_millis(up.connect_timeout_ms),
        )?;
        let m = &config.mcp;
        let policy = match &m.policy_file {
            Some(p) => Policy::load(p)?,
            None => Policy::default(),
        };
        let cors = Cors::new(&config.cors.allowed_origins)?;
        let canister = CanisterClient::new(config, connector)?;
        Ok(McpService {
            keys,
            canister,
            hosted,
            sessions,
            policy,
            cors,
            window: Window {
                limit: usize::try_from(m.calls_per_minute).unwrap_or(usize::MAX),
                max_keys: config.rate_limit.max_keys,
                map: Mutex::new(HashMap::new()),
            },
            max_body: m.max_body_bytes,
            body_timeout: Duration::from_millis(config.listen.body_read_timeout_ms),
            metrics,
            shadow: config.intercept.mode == Mode::Shadow,
        })
    }

    /// The session table (for tests and the gauge).
    pub fn sessions(&self) -> &Sessions {
        &self.sessions
    }

    /// Sets the gateway's CORS headers (§5) on an answer the sidecar built itself for a
    /// request with `origin`.
    pub fn cors(&self, headers: &mut http::HeaderMap, origin: Option<&HeaderValue>) {
        self.cors.apply(headers, origin);
    }

    fn intercepted(&self, outcome: Outcome, status: u16, started: Instant) -> Intercepted {
        Intercepted {
            surface: Surface::Mcp,
            outcome,
            status,
            upstream_status: None,
            sections: None,
            truncated: false,
            hosted_context: HostedContextEvent::None,
            elapsed: started.elapsed(),
        }
    }

    /// Answers a refusal: the mapped response, recorded.
    pub fn refuse(&self, e: &McpError, started: Instant) -> Response<Full<Bytes>> {
        let (status, body, content_type, outcome) = e.wire();
        if let McpError::Overloaded(reason) = e {
            self.metrics.admission_refused(*reason);
        }
        record(
            &self.metrics,
            &self.intercepted(outcome, status.as_u16(), started),
        );
        let mut response = json_response(status, body, content_type);
        if matches!(e, McpError::Overloaded(_)) {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }

    /// The caller, verified from the headers alone before any body byte is read (§6
    /// Deviation): a bearer token passing §1 with the write scope every POST needs.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Identity, McpError> {
        self.caller(headers, &Method::POST)
            .ok_or(McpError::Unauthorized)
    }

    /// The caller when the token passes §1 with the scope `method` needs.
    fn caller(&self, headers: &HeaderMap, method: &Method) -> Option<Identity> {
        let authorization = auth::authorization(headers).ok()?;
        auth::verify_token(authorization, &self.keys, auth::now_unix())
            .inspect(|t| self.metrics.token_verified(Surface::Mcp, t.remembered()))
            .and_then(|t| t.identity(method))
            .ok()
    }

    /// The door for the body (§6 Deviations): the headers first (415, 413 on an announced
    /// length over the cap), then the bytes, read under `listen.body_read_timeout_ms`
    /// within the budget `slot` belongs to, then the canonical form. The caller has
    /// already checked the token.
    pub async fn read_body<B>(
        &self,
        headers: &HeaderMap,
        body: B,
        slot: &mut Slot,
    ) -> Result<door::Canonical, McpError>
    where
        B: hyper::body::Body<Data = Bytes> + Unpin,
    {
        door::check_headers(headers).map_err(|e| match e {
            door::DoorError::NotJson => McpError::UnsupportedMediaType,
            door::DoorError::MediaType | door::DoorError::Body => McpError::UnsupportedEncoding,
        })?;
        let announced = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let bytes = door::read_body(body, announced, slot, self.max_body, self.body_timeout)
            .await
            .map_err(|e| match e {
                door::ReadError::TooLarge => McpError::PayloadTooLarge,
                door::ReadError::Timeout => McpError::BodyTimeout,
                door::ReadError::Overloaded(r) => McpError::Overloaded(r),
                door::ReadError::Broken => McpError::InvalidBody,
            })?;
        door::canonical(bytes).map_err(|_| McpError::InvalidBody)
    }

    /// Classifies and answers or forwards one `POST /mcp` of `identity` whose body the
    /// door read as `message` (its canonical form, which is what may be forwarded).
    pub async fn post(
        &self,
        parts: &http::request::Parts,
        identity: Identity,
        message: &Value,
        started: Instant,
    ) -> Step {
        match self.classify(parts, identity, message, started).await {
            Ok(step) => step,
            Err(e) => Step::Answer(self.refuse(&e, started)),
        }
    }

    async fn classify(
        &self,
        parts: &http::request::Parts,
        identity: Identity,
        message: &Value,
        started: Instant,
    ) -> Result<Step, McpError> {
        let headers = &parts.headers;
        let now = Instant::now();
        let object = match &message {
            Value::Array(items) => {
                if header_once(headers, "mcp-method")?.is_some()
                    || header_once(headers, "mcp-name")?.is_some()
                {
                    return Err(McpError::HeaderMismatch);
                }
                // A nested batch is no JSON-RPC message the SDK dispatches; refusing it
                // keeps the rule "every dispatched message was looked at" simple.
                if items.iter().any(|m| m.is_array() || watched(m).is_some()) {
                    return Err(McpError::BatchRefused);
                }
                self.count(&identity, headers, now);
                return Ok(Step::Forward(Watch::Nothing));
            }
            Value::Object(o) => o,
            _ => {
                self.count(&identity, headers, now);
                return Ok(Step::Forward(Watch::Nothing));
            }
        };
        check_headers(headers, object)?;
        match watched(message) {
            Some(Watched::Initialize) => self.initialize(parts, identity, now, started).await,
            Some(Watched::Call) if self.shadow => {
                let mut witness = None;
                let own = match self
                    .call(headers, object, identity, now, started, &mut witness)
                    .await
                {
                    Ok(r) => Own::from_response(r, false, witness).await,
                    Err(e) => {
                        let limited = matches!(e, McpError::RateLimited | McpError::Overloaded(_));
                        Own::from_response(self.refuse(&e, started), limited, witness).await
                    }
                };
                Ok(Step::Forward(Watch::Shadow(Box::new(own))))
            }
            Some(Watched::Call) => Ok(Step::Answer(
                self.call(headers, object, identity, now, started, &mut None)
                    .await?,
            )),
            Some(Watched::List(method)) => {
                self.window.hit(&identity.sub, now);
                if self.shadow {
                    // The gateway serves the tool in shadow mode: its lists pass as they are.
                    return Ok(Step::Forward(Watch::Nothing));
                }
                let rewrite = if method == "tools/list" {
                    let (_, session) = self.session(headers, &identity.sub, now)?;
                    Rewrite::Tools {
                        allowed: self.policy.allows(&session.role),
                    }
                } else {
                    Rewrite::Resources
                };
                Ok(Step::Forward(Watch::Rewrite(rewrite)))
            }
            None => {
                self.count(&identity, headers, now);
                Ok(Step::Forward(Watch::Nothing))
            }
        }
    }

    /// Counts a passed-through request in the window and keeps its session active.
    fn count(&self, identity: &Identity, headers: &HeaderMap, now: Instant) {
        self.window.hit(&identity.sub, now);
        let _ = self.session(headers, &identity.sub, now);
    }

    /// The live session named by `Mcp-Session-Id` and owned by `sub` (§6 step 4).
    fn session(
        &self,
        headers: &HeaderMap,
        sub: &str,
        now: Instant,
    ) -> Result<(String, Session), McpError> {
        let id = header_once(headers, "mcp-session-id")?.ok_or(McpError::SessionNotFound)?;
        match self.sessions.touch(&id, sub, now) {
            Ok(Some(s)) => Ok((id, s)),
            Ok(None) => Err(McpError::SessionNotFound),
            Err(eviction) => {
                self.evicted(&[eviction]);
                Err(McpError::SessionNotFound)
            }
        }
    }

    fn evicted(&self, evictions: &[Eviction]) {
        for e in evictions {
            self.metrics.mcp_session_evicted(*e);
        }
        self.metrics.set_mcp_sessions(self.sessions.len());
    }

    /// `GET` and `DELETE` on `/mcp` pass through; they are counted, keep the session
    /// active, and a `DELETE` by the owner forgets the session.
    pub fn observe(&self, method: &Method, headers: &HeaderMap) {
        let Some(identity) = self.caller(headers, method) else {
            return;
        };
        let now = Instant::now();
        self.window.hit(&identity.sub, now);
        if *method == Method::DELETE {
            if let Ok(Some(id)) = header_once(headers, "mcp-session-id") {
                if self.sessions.remove(&id, &identity.sub) {
                    self.metrics.set_mcp_sessions(self.sessions.len());
                }
            }
        } else {
            let _ = self.session(headers, &identity.sub, now);
        }
    }

    /// `initialize`: the sidecar's own lookup (§2) before the gateway sees it.
    async fn initialize(
        &self,
        parts: &http::request::Parts,
        identity: Identity,
        now: Instant,
        started: Instant,
    ) -> Result<Step, McpError> {
        // The window is checked before the lookup, so a full window costs no bridge call.
        if !self.window.hit(&identity.sub, now) {
            self.metrics.rate_limited(Surface::Mcp);
            return Err(McpError::RateLimited);
        }
        let vault = auth::requested_vault(&parts.headers).map_err(|_| McpError::InvalidVault)?;
        auth::validate_vault(&vault).map_err(|_| McpError::InvalidVault)?;
        let authorization = parts
            .headers
            .get(header::AUTHORIZATION)
            .ok_or(McpError::Unauthorized)?
            .clone();
        let Some(hosted) = &self.hosted else {
            return Err(McpError::NoHostedAccess);
        };
        match hosted.lookup(&authorization, &identity.sub, &vault).await {
            Ok((access, _)) => Ok(Step::Forward(Watch::Initialize(Box::new(Session {
                effective_user: access.mcp_effective_user(&identity.sub).to_owned(),
                role: access.mcp_role().to_owned(),
                owner: identity.sub,
                vault,
                authorization,
            })))),
            Err(HostedError::Throttled(_)) => {
                self.metrics.lookup_throttled();
                Err(McpError::RateLimited)
            }
            Err(_) => {
                self.metrics.hosted_context_failure(false);
                let mut i = self.intercepted(Outcome::NoHostedAccess, 403, started);
                i.hosted_context = HostedContextEvent::FailedDenied;
                let (status, body, ct, _) = McpError::NoHostedAccess.wire();
                record(&self.metrics, &i);
                Ok(Step::Answer(json_response(status, body, ct)))
            }
        }
    }

    /// Applies an `initialize` watch to the gateway's answer head: a 200 with exactly one
    /// valid `mcp-session-id` records the session (§6). With a session store, the
    /// returned receiver resolves once the record is on disk; the answer waits for it,
    /// so a session the client has heard of survives a crash.
    pub fn learn(
        &self,
        watch: &Watch,
        response: &http::response::Parts,
    ) -> Option<oneshot::Receiver<bool>> {
        let Watch::Initialize(session) = watch else {
            return None;
        };
        if response.status != StatusCode::OK {
            return None;
        }
        let mut ids = response.headers.get_all("mcp-session-id").iter();
        let (Some(id), None) = (ids.next(), ids.next()) else {
            return None;
        };
        let id = id.to_str().ok()?;
        let inserted = self
            .sessions
            .insert(id, (**session).clone(), Instant::now());
        self.evicted(&inserted.evicted);
        inserted.durable
    }

    /// Rewrites a buffered list answer (JSON or SSE); an error when it cannot be read or
    /// rewritten, or is labelled neither JSON nor SSE: a lenient client might parse such
    /// an answer as a list all the same, so it is refused rather than passed unread (§6).
    pub fn rewrite(
        &self,
        rewrite: Rewrite,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Result<Bytes, McpError> {
        let ct = content_type.unwrap_or("").to_ascii_lowercase();
        let text = std::str::from_utf8(body).map_err(|_| McpError::BadGateway)?;
        let out = if ct.contains("text/event-stream") {
            wire::rewrite_sse(text, rewrite)
        } else if ct.contains("json") {
            wire::rewrite_message(text, rewrite)
        } else {
            return Err(McpError::BadGateway);
        };
        out.map(Bytes::from).ok_or(McpError::BadGateway)
    }

    /// `tools/call` of `get_section_source`: the §6 order, then the tool. `witness`
    /// receives the note's Markdown body when it was read (shadow mode only).
    async fn call(
        &self,
        headers: &HeaderMap,
        message: &Map<String, Value>,
        identity: Identity,
        now: Instant,
        started: Instant,
        witness: &mut Option<String>,
    ) -> Result<Response<Full<Bytes>>, McpError> {
        if !self.window.hit(&identity.sub, now) {
            self.metrics.rate_limited(Surface::Mcp);
            return Err(McpError::RateLimited);
        }
        let (session_id, session) = self.session(headers, &identity.sub, now)?;
        let accept = joined(headers, header::ACCEPT);
        if !(accept.contains("application/json") && accept.contains("text/event-stream")) {
            return Err(McpError::NotAcceptable);
        }
        let content_type = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !content_type.contains("application/json") {
            return Err(McpError::UnsupportedMediaType);
        }
        let (id, params) = valid_request(message)?;
        if headers.contains_key("mcp-protocol-version") {
            let v = joined(
                headers,
                http::HeaderName::from_static("mcp-protocol-version"),
            );
            if !SUPPORTED_PROTOCOL_VERSIONS.contains(&v.as_str()) {
                return Err(McpError::UnsupportedProtocolVersion(v));
            }
        }
        let Some(id) = id else {
            // A notification: nothing runs and nothing is answered but 202.
            record(&self.metrics, &self.intercepted(Outcome::Ok, 202, started));
            let mut r = Response::new(Full::new(Bytes::new()));
            *r.status_mut() = StatusCode::ACCEPTED;
            return Ok(r);
        };
        let mut i = self.intercepted(Outcome::Ok, 200, started);
        let result = match self.run(&session, params, &mut i, witness).await {
            Ok(doc) => {
                i.sections = Some(doc.sections().len());
                i.truncated = doc.truncated();
                tool::success(&doc.to_json())
            }
            Err(failure) => {
                i.outcome = match failure {
                    ToolFailure::Denied => Outcome::ToolDenied,
                    ToolFailure::Arguments(_) => Outcome::InvalidArguments,
                    ToolFailure::InvalidPath => Outcome::InvalidPath,
                    ToolFailure::Upstream(_) => Outcome::UpstreamStatus,
                    ToolFailure::Runtime => Outcome::BadGateway,
                };
                failure.result()
            }
        };
        let body = wire::sse_event(&wire::result_message(&result, &id));
        i.elapsed = started.elapsed();
        record(&self.metrics, &i);
        Ok(sse_response(body, &session_id))
    }

    /// The tool itself: policy, arguments, path, the one read, the builder.
    async fn run(
        &self,
        session: &Session,
        params: &Map<String, Value>,
        i: &mut Intercepted,
        witness: &mut Option<String>,
    ) -> Result<extract::SectionSource, ToolFailure> {
        if !self.policy.allows(&session.role) {
            return Err(ToolFailure::Denied);
        }
        let raw = tool::path_argument(params).map_err(ToolFailure::Arguments)?;
        let path = path::validate(raw).map_err(|_| ToolFailure::InvalidPath)?;
        let canister = self.canister.as_ref().ok_or(ToolFailure::Runtime)?;
        let token = session
            .authorization
            .to_str()
            .map_err(|_| ToolFailure::Runtime)?;
        let headers = canister::mcp_headers(&session.vault, &session.effective_user, token)
            .map_err(|_| ToolFailure::Runtime)?;
        let body = match canister.get_note(&path, headers).await {
            Err(e) => {
                i.upstream_status = e.upstream_status();
                return Err(ToolFailure::Runtime);
            }
            Ok(NoteResponse::Status(s)) => {
                i.upstream_status = Some(s);
                return Err(ToolFailure::Upstream(s));
            }
            Ok(NoteResponse::Success { status, body }) => {
                i.upstream_status = Some(status);
                body
            }
        };
        let note =
            extract::parse_note(&body, extract::Surface::Mcp).map_err(|_| ToolFailure::Runtime)?;
        drop(body);
        if self.shadow {
            *witness = Some(note.body.clone());
        }
        extract::build(&path, &note.frontmatter, &note.body, &Limits::default())
            .map_err(|_| ToolFailure::Runtime)
    }
}

/// What the sidecar does with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Watched {
    Initialize,
    Call,
    List(&'static str),
}

/// Whether `message` is one the sidecar answers, rewrites or learns from.
pub(crate) fn watched(message: &Value) -> Option<Watched> {
    let method = message.get("method")?.as_str()?;
    if method == "initialize" {
        return Some(Watched::Initialize);
    }
    if method == "tools/call"
        && message
            .get("params")
            .and_then(|p| p.get("name"))
            .and_then(Value::as_str)
            == Some(TOOL_NAME)
    {
        return Some(Watched::Call);
    }
    REWRITTEN
        .iter()
        .find(|m| **m == method)
        .map(|m| Watched::List(m))
}

/// The value of a header that must appear at most once; a repeat or a non-text value is
/// a mismatch (§6 Deviation).
fn header_once(headers: &HeaderMap, name: &'static str) -> Result<Option<String>, McpError> {
    let mut all = headers.get_all(name).iter();
    let Some(first) = all.next() else {
        return Ok(None);
    };
    if all.next().is_some() {
        return Err(McpError::HeaderMismatch);
    }
    first
        .to_str()
        .map(|s| Some(s.trim().to_owned()))
        .map_err(|_| McpError::HeaderMismatch)
}

/// `Mcp-Method` must equal `method`; `Mcp-Name` must equal `params.name` or
/// `params.uri` (§6 Deviation).
fn check_headers(headers: &HeaderMap, message: &Map<String, Value>) -> Result<(), McpError> {
    if let Some(m) = header_once(headers, "mcp-method")? {
        if message.get("method").and_then(Value::as_str) != Some(m.as_str()) {
            return Err(McpError::HeaderMismatch);
        }
    }
    if let Some(n) = header_once(headers, "mcp-name")? {
        let params = message.get("params");
        let named = ["name", "uri"]
            .iter()
            .any(|k| params.and_then(|p| p.get(*k)).and_then(Value::as_str) == Some(n.as_str()));
        if !named {
            return Err(McpError::HeaderMismatch);
        }
    }
    Ok(())
}

/// Every value of a header joined with `, `, as Node presents a repeated header.
fn joined(headers: &HeaderMap, name: impl header::AsHeaderName) -> String {
    headers
        .get_all(name)
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Step 7: a strict JSON-RPC request or notification (`jsonrpc` `"2.0"`, a string
/// `method`, an object `params`, a string or safe-integer `id` when present, nothing
/// else). Returns the echoed id and the params.
fn valid_request(
    message: &Map<String, Value>,
) -> Result<(Option<String>, &Map<String, Value>), McpError> {
    let known = message
        .keys()
        .all(|k| matches!(k.as_str(), "jsonrpc" | "id" | "method" | "params"));
    if !known || message.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(McpError::InvalidJsonRpc);
    }
    let params = message
        .get("params")
        .and_then(Value::as_object)
        .ok_or(McpError::InvalidJsonRpc)?;
    let id = match message.get("id") {
        None => None,
        Some(v) => Some(echo_id(v).ok_or(McpError::InvalidJsonRpc)?),
    };
    Ok((id, params))
}

fn json_response(
    status: StatusCode,
    body: String,
    content_type: &'static str,
) -> Response<Full<Bytes>> {
    let length = body.len();
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    r
}

/// The SDK's SSE answer (§6): 200, `text/event-stream`, `no-cache`, `keep-alive`, the
/// session id.
fn sse_response(body: String, session_id: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
    // Recorded only when valid (visible ASCII), so this cannot fail.
    if let Ok(v) = HeaderValue::from_str(session_id) {
        h.insert("mcp-session-id", v);
    }
    r
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn s6_sdk_error_bodies_are_exact() {
        let (s, b, ct, _) = McpError::NotAcceptable.wire();
        assert_eq!(s, 406);
        assert_eq!(ct, "application/json");
        assert_eq!(
            b,
            r#"{"jsonrpc":"2.0","error":{"code":-32000,"message":"Not Acceptable: Client must accept both application/json and text/event-stream"},"id":null}"#
        );
        let (_, b, ct, _) = McpError::SessionNotFound.wire();
        assert_eq!(ct, "application/json; charset=utf-8");
        assert_eq!(
            b,
            r#"{"jsonrpc":"2.0","error":{"code":-32600,"message":"Session not found"}}"#
        );
        let (_, b, _, _) = McpError::UnsupportedProtocolVersion("x\"y".into()).wire();
        assert_eq!(
            b,
            r#"{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: Unsupported protocol version: x\"y (supported versions: 2025-11-25, 2025-06-18, 2025-03-26, 2024-11-05, 2024-10-07)"},"id":null}"#
        );
    }

    #[test]
    fn s6_window_slides() {
        let w = Window {
            limit: 2,
            max_keys: 1,
            map: Mutex::new(HashMap::new()),
        };
        let t = Instant::now();
        assert!(w.hit("a", t));
        assert!(w.hit("a", t));
        assert!(!w.hit("a", t + Duration::from_secs(59)));
        assert!(w.hit("a", t + Duration::from_secs(60)));
        // The table is full of an active user.
        assert!(!w.hit("b", t + Duration::from_secs(60)));
        assert!(w.hit("b", t + Duration::from_secs(200)));
    }
}
