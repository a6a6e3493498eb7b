//! The hosted MCP choke point (wire contract §6): `POST /mcp` is classified here, the
//! tools of the body-free views the policy says the sidecar owns (`get_section_source`,
//! `get_note_outline`, `get_document_tree`) are answered here, those it denies are
//! refused as unknown tools, and everything else (passed views included) goes to the
//! gateway in the sidecar's own serialization.
//!
//! Phases, as the proxy drives them once [`crate::route`] picked `/mcp`:
//! [`McpService::check_origin`] refuses, on every method, an `Origin` that is not allowed
//! ([`origin`]: DNS-rebinding protection, the SDK's 403, before anything else);
//! [`McpService::authenticate`] verifies the token from the headers (401 at once, before
//! any slot or body byte); [`McpService::read_body`] is the door ([`door`]: media type,
//! encoding, cap, read deadline, budget, canonical JSON); [`McpService::post`] decides:
//! answer the tool call, refuse (batches, header mismatches, failed `initialize`
//! lookups), or forward the canonical bytes with a [`Watch`] that [`McpService::learn`]
//! and [`McpService::rewrite`] apply to the gateway's answer (learn a session from
//! `initialize`, rewrite list answers), and [`McpService::settle`] reads for the session
//! it was on. `GET`, `HEAD` and `DELETE` go through [`McpService::gate`]; the event
//! stream a `GET` gets back is read as it passes and the list answers it replays are
//! rewritten again ([`Passed::stream`]). Event streams are read as a client reads them
//! ([`sse`]): only the data of JSON-RPC message events is rewritten, every other byte
//! (priming events, comments, `id`, `event`, `retry`, line ends) is kept. Every refusal
//! is mapped to the wire in one place, [`McpError::wire`].
//!
//! Decisions where the contract is silent:
//! - `Origin`: allowed are `mcp.allowed_origins`, else the origins of
//!   `cors.allowed_origins` with their `www.` twins; never the request's own `Host`,
//!   which DNS rebinding controls. `null`, a value that is not an origin and a repeated
//!   header are refused; a request without `Origin` passes. The check comes before the
//!   token, so a refused page learns nothing of a token and costs nothing.
//! - Event streams: an event is a JSON-RPC message when its type is empty or `message`
//!   and its data is not empty (as the SDK's client reads it); a message whose data is
//!   not a JSON object makes a list answer 502 and cuts a `GET` stream. An event left
//!   open at the end of a stream is rewritten too (no client dispatches it).
//! - Door refusals: a media type other than `application/json` with at most
//!   `charset=utf-8`, or a non-identity `Content-Encoding` → 415; a body that is not
//!   UTF-8 JSON or holds a `__proto__` key → 400, both in the gateway's
//!   `{"error":…,"code":…}` shape with fixed text (the parser message is not imitated);
//!   over the cap → 413 in the same shape; not in within the read deadline → 408; no
//!   room in the budget → 503 with `Retry-After: 1`.
//! - `initialize` is watched, so it is refused in a batch too (the sidecar could not
//!   learn that session); a batch is refused when any element is `initialize`, a list
//!   method that is rewritten, or a call of a view's tool the gateway does not answer
//!   itself.
//! - `Mcp-Method`/`Mcp-Name`: a header present more than once, present on a batch, or
//!   not equal to the body's `method` / `params.name` (or `params.uri`) is refused.
//! - `initialize` without a string or safe-integer `id` is refused with 400 -32600
//!   before any lookup: the SDK would open a session for it and answer 202 without the
//!   session id, so the gateway's per-user session cap would count a session the sidecar
//!   never learns.
//! - `initialize` with a vault id outside the §1 pattern is refused with 400 -32600
//!   `Invalid vault`; with no bridge configured there is no hosted access (403).
//! - Sessions agree with the gateway's (§6: alive at both or at neither). Every request
//!   on `/mcp` but `initialize` (`POST`, `GET`, `HEAD`) whose `Mcp-Session-Id` is not a
//!   live session of its caller (absent, unknown, another user's, expired, repeated) is
//!   answered 404 `Session not found` here and never forwarded: the gateway would take
//!   the id for a new session, evicting the caller's least recently active one at its
//!   cap, and refuse the call as not initialized. A `DELETE` on such an id gets the
//!   gateway's own 200 `{"ok":true}` here, and changes nothing, as there. The check is
//!   §6 step 4: after the token (401) and the window (429 when full; on a live session a
//!   full window is left to the gateway to refuse), before everything the SDK checks.
//!   In shadow mode the shadowed surface (the tool, hidden resource reads) passes in
//!   whatever session it names, as it would without the sidecar.
//! - The table runs on the gateway's clock: the time a session last *reached* the
//!   gateway ([`McpService::sending`], [`McpService::settle`]); calls the sidecar
//!   answers itself never do. An `initialize` that opens a session makes room as it
//!   leaves, evicting the owner's least recently active session at the gateway when the
//!   owner is at the cap, as the gateway does when it arrives.
//! - When the gateway answers a request on a live session with its unknown-session
//!   answer (404 `Session not found`) or its not-initialized one (400 -32000 `Bad
//!   Request: Server not initialized`), read strictly from at most
//!   [`MAX_DROPPED_ANSWER_BYTES`] of a JSON answer, the sidecar forgets the session
//!   (and its owner's sessions last seen at the gateway no later than it: the gateway
//!   drops a user's sessions oldest first, and all of them when it restarts) and
//!   answers 404 `Session not found`, which makes the client initialize again. Other
//!   users' sessions are not inferred dead from one answer (see `docs/daemon.md`).
//! - The 60-per-minute window counts every `/mcp` request whose token verifies; only
//!   requests the sidecar answers (and `initialize`, before its bridge lookup) are
//!   refused by it (the gateway refuses the others).
//! - A batch holding a nested array is refused like a batch holding a watched call.
//! - A view tool's notification (no `id`) passes every check and is answered 202 with no
//!   body and no tool run, as the SDK treats notifications.
//! - No canister configured → `Runtime failure`.
//! - `resources/read` of a URI that names a view's resources (a section source, an
//!   outline or a tree of a view that does not pass; as the lists' filter reads names,
//!   after dropping what the WHATWG URL parser drops and decoding escapes) is
//!   answered as the SDK answers a URI no resource matches, `-32602 Resource <uri> not
//!   found`, after the checks of a tool call; it is watched, so refused in a batch. A
//!   gateway version that offered section sources as resources would otherwise serve
//!   through the back door what the tool serves through the front.

mod answer;
pub mod door;
mod message;
pub mod origin;
mod policy;
pub mod sanitize;
mod session;
pub mod sse;
pub mod store;
mod tool;
mod window;
pub mod wire;

use answer::{json_response, sse_response};
use message::{check_headers, header_once, joined, valid_request};
pub use message::{watched, Watched};
use window::Window;

pub use answer::McpError;
pub use policy::{Decision, Policy, ViewMode};
pub use session::{valid_session_id, Inserted, Session, Sessions, MAX_SESSION_ID_BYTES};
pub use sse::{Rewriter, SseError};
pub use tool::{ArgumentIssue, JsType, ToolFailure};
pub use wire::{
    echo_id, tool_descriptor, tool_name, view_of_tool, Listed, Listing, Rewrite, ViewSet,
    DOCUMENT_TREE_DESCRIPTOR, DOCUMENT_TREE_TOOL, MAX_DROPPED_ANSWER_BYTES,
    NOTE_OUTLINE_DESCRIPTOR, NOTE_OUTLINE_TOOL, TOOL_DESCRIPTOR, TOOL_NAME,
};

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Response, StatusCode};
use http_body_util::Full;
use serde_json::{Map, Value};
use tokio::sync::oneshot;

use crate::auth::{self, AuthError, Identity, Keys};
use crate::budget::{self, Slot};
use crate::canister::{self, CanisterClient, NoteResponse};
use crate::config::{Config, ConfigError, Mode};
use crate::cors::Cors;
use crate::extract::{self, Limits, View};
use crate::hosted::{HostedClient, HostedError};
use crate::json_cost;
use crate::path;
use crate::shadow::{self, Own};
use crate::telemetry::{
    Eviction, HostedContextEvent, Intercepted, Metrics, Outcome, Surface, UpstreamName,
};
use crate::upstream::{self, Caller, ConnId};

/// Protocol versions the SDK accepts (§6 step 8), in its order.
pub const SUPPORTED_PROTOCOL_VERSIONS: [&str; 5] = [
    "2025-11-25",
    "2025-06-18",
    "2025-03-26",
    "2024-11-05",
    "2024-10-07",
];

/// Largest gateway answer to a rewritten list call that is buffered; larger → 502.
pub const MAX_LIST_ANSWER_BYTES: usize = 8 * 1024 * 1024;

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
    /// Shadow mode: a call of an owned view's tool that the gateway answers; compare its
    /// answer with the sidecar's own.
    Shadow(Box<shadow::Own>),
}

/// The caller's live session a forwarded request is on: the gateway's answer says
/// whether it still knows the session (§6: alive at both or at neither).
#[derive(Debug, Clone)]
pub struct OnSession {
    id: String,
    owner: String,
}

/// A forwarded `POST /mcp`: what to do with the answer, and the session it concerns.
#[derive(Debug)]
pub struct Forward {
    /// What to do with the gateway's answer.
    pub watch: Watch,
    /// The caller's live session the request is on, if any.
    pub on: Option<OnSession>,
    /// An `initialize` that opens a session (it is on none of the caller's): its owner,
    /// whose room is made as it leaves ([`McpService::sending`]).
    opens: Option<String>,
}

impl Forward {
    fn on(watch: Watch, on: Option<OnSession>) -> Step {
        Step::Forward(Forward {
            watch,
            on,
            opens: None,
        })
    }
}

/// The decision for one `POST /mcp`.
#[derive(Debug)]
pub enum Step {
    /// Answered here.
    Answer(Response<Full<Bytes>>),
    /// Forward the buffered body, then apply the watch.
    Forward(Forward),
}

/// The decision for a `GET`, `HEAD` or `DELETE` on `/mcp`.
#[derive(Debug)]
pub enum Gate {
    /// Answered here.
    Answer(Response<Full<Bytes>>),
    /// Passed through.
    Forward(Passed),
}

/// A `GET`, `HEAD` or `DELETE` on `/mcp` passed through to the gateway.
#[derive(Debug)]
pub struct Passed {
    /// The caller's live session it is on: the answer settles it
    /// ([`McpService::settle`]).
    pub on: Option<OnSession>,
    /// How the messages of an event stream the gateway answers with are rewritten
    /// (`None` in shadow mode, where the gateway's lists pass as they are). A `GET`
    /// with `Last-Event-ID` replays the stored events of an earlier answer, list answers
    /// among them, as the gateway first wrote them: each is rewritten again here, told
    /// by its shape.
    pub stream: Option<Rewrite>,
    /// Whose buffered-bytes budget holds an event while it is read (the `sub` of the
    /// token, when it verifies).
    pub owner: Option<String>,
    /// The sanitizer for the messages of an event stream the gateway answers with
    /// (`None` when `[sanitize]` rewrites nothing on `/mcp`), applied with `stream`.
    pub sanitize: Option<sanitize::Sanitizer>,
}

/// A message that passed [`McpService::admit`].
enum Admission<'m> {
    /// A request: answer it in its session.
    Request(Admitted<'m>),
    /// A notification: 202, nothing runs.
    Notification,
}

/// What an admitted request is answered with.
struct Admitted<'m> {
    session_id: String,
    session: Session,
    id: String,
    params: &'m Map<String, Value>,
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
    /// The origins whose pages may call `/mcp` ([`origin`]).
    origins: origin::AllowedOrigins,
    window: Window,
    max_body: usize,
    body_timeout: Duration,
    metrics: Arc<Metrics>,
    /// `intercept.mode = "shadow"`: the gateway answers the tool and sees list answers
    /// unchanged; the sidecar computes its own answer to compare.
    shadow: bool,
    /// What is cut out of the answers passed through (`[sanitize]`).
    sanitize: sanitize::Settings,
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
        policy: Policy,
    ) -> Result<McpService, ConfigError> {
        let up = &config.upstream;
        let connector = upstream::connector(up.ca_file.as_deref())?;
        let m = &config.mcp;
        let cors = Cors::new(&config.cors.allowed_origins)?;
        let origins = origin::AllowedOrigins::new(
            m.allowed_origins.as_deref(),
            &config.cors.allowed_origins,
        )?;
        let canister = CanisterClient::new(
            config,
            &connector,
            metrics.fault_observer(UpstreamName::Canister),
        )?;
        Ok(McpService {
            keys,
            canister,
            hosted,
            sessions,
            policy,
            cors,
            origins,
            window: Window::new(
                usize::try_from(m.calls_per_minute).unwrap_or(usize::MAX),
                config.rate_limit.max_keys,
            ),
            max_body: m.max_body_bytes,
            body_timeout: Duration::from_millis(config.listen.body_read_timeout_ms),
            metrics,
            shadow: config.intercept.mode == Mode::Shadow,
            sanitize: sanitize::Settings {
                upstream_errors: config.sanitize.upstream_errors,
                note_paths: config.sanitize.note_paths,
                // One held message fits the caller's share of the budget.
                max_message_bytes: config
                    .sanitize
                    .max_message_bytes
                    .min(config.listen.max_buffered_bytes_per_user),
            },
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
            view: None,
            outcome,
            status,
            upstream_status: None,
            sections: None,
            truncated: false,
            hosted_context: HostedContextEvent::None,
            auth_refusal: None,
            elapsed: started.elapsed(),
        }
    }

    /// Answers a refusal: the mapped response, recorded.
    pub fn refuse(&self, e: &McpError, started: Instant) -> Response<Full<Bytes>> {
        let (status, body, content_type, outcome) = e.wire();
        if let McpError::Overloaded(reason) = e {
            self.metrics.admission_refused(*reason);
        }
        let mut intercepted = self.intercepted(outcome, status.as_u16(), started);
        if let McpError::Unauthorized(why) = e {
            intercepted.auth_refusal = Some(why.refusal());
        }
        record(&self.metrics, &intercepted);
        let mut response = json_response(status, body, content_type);
        if matches!(e, McpError::Overloaded(_)) {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }

    /// The `Origin` check (DNS-rebinding protection), the first decision on any request
    /// to `/mcp`: before the token, so that a page that is not allowed learns nothing of
    /// a token (valid or not, it gets the same 403) and nothing is spent on it (no
    /// signature, session, window, budget slot or gateway request). A request without
    /// `Origin` passes.
    pub fn check_origin(&self, headers: &HeaderMap) -> Result<(), McpError> {
        match self.origins.check(headers) {
            origin::Verdict::Absent | origin::Verdict::Allowed => Ok(()),
            origin::Verdict::Refused(echoed) => Err(McpError::InvalidOrigin(echoed)),
        }
    }

    /// The caller, verified from the headers alone before any body byte is read (§6
    /// Deviation): a bearer token passing §1 with the write scope every POST needs.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Identity, McpError> {
        self.caller(headers, &Method::POST)
            .map_err(McpError::Unauthorized)
    }

    /// The caller when the token passes §1 with the scope `method` needs, else why not.
    fn caller(&self, headers: &HeaderMap, method: &Method) -> Result<Identity, AuthError> {
        let authorization = auth::authorization(headers)?;
        auth::verify_token(authorization, &self.keys, auth::now_unix())
            .inspect(|t| self.metrics.token_verified(Surface::Mcp, t.remembered()))
            .and_then(|t| t.identity(method))
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
        // The parse may take many times the body's bytes (a tree node per value): that
        // memory is reserved too, before the parse, and given back once classified.
        let cost = json_cost::json_parse_cost(&bytes);
        slot.charge(cost).map_err(|c| match c {
            budget::Charge::TooLarge => McpError::PayloadTooLarge,
            budget::Charge::Refused(r) => McpError::Overloaded(r),
        })?;
        let mut canonical = door::canonical(bytes).map_err(|_| McpError::InvalidBody)?;
        canonical.parse_cost = cost;
        Ok(canonical)
    }

    /// Classifies and answers or forwards one `POST /mcp` of `identity` whose body the
    /// door read as `message` (its canonical form, which is what may be forwarded).
    /// `slot` is the request's place in the budget: a note the tool reads is charged to
    /// it while it is parsed.
    pub async fn post(
        &self,
        parts: &http::request::Parts,
        identity: Identity,
        message: &Value,
        slot: &mut Slot,
        started: Instant,
    ) -> Step {
        match self.classify(parts, identity, message, slot, started).await {
            Ok(step) => step,
            Err(e) => Step::Answer(self.refuse(&e, started)),
        }
    }

    async fn classify(
        &self,
        parts: &http::request::Parts,
        identity: Identity,
        message: &Value,
        slot: &mut Slot,
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
                if items.iter().any(|m| m.is_array() || self.watches(m)) {
                    return Err(McpError::BatchRefused);
                }
                let on = self.forwarded_on(&identity, headers, now)?;
                return Ok(Forward::on(Watch::Nothing, Some(on)));
            }
            Value::Object(o) => o,
            _ => {
                let on = self.forwarded_on(&identity, headers, now)?;
                return Ok(Forward::on(Watch::Nothing, Some(on)));
            }
        };
        check_headers(headers, object)?;
        match watched(message) {
            Some(Watched::Initialize) => {
                // As a notification, the SDK opens a session and answers 202 without its
                // id: a session the gateway counts against the caller's cap and the
                // sidecar never learns.
                if object.get("id").and_then(echo_id).is_none() {
                    return Err(McpError::InitializeWithoutId);
                }
                self.initialize(parts, identity, now, started).await
            }
            Some(Watched::Call(view)) if self.policy.mode(view) == ViewMode::Pass => {
                // The gateway's own view, untouched.
                let on = self.forwarded_on(&identity, headers, now)?;
                Ok(Forward::on(Watch::Nothing, Some(on)))
            }
            Some(Watched::Call(view)) if self.shadow && self.policy.mode(view) == ViewMode::Own => {
                let sub = identity.sub.clone();
                let mut witness = None;
                let own = match self
                    .call(view, parts, object, identity, slot, started, &mut witness)
                    .await
                {
                    Ok(r) => Own::from_response(r, false, witness).await,
                    Err(e) => {
                        let limited = matches!(e, McpError::RateLimited | McpError::Overloaded(_));
                        Own::from_response(self.refuse(&e, started), limited, witness).await
                    }
                };
                // The surface passes as if the sidecar were not there, in whatever
                // session it names; the window was counted by `call`.
                let on = self.known(headers, &sub, now);
                Ok(Forward::on(Watch::Shadow(Box::new(own)), on))
            }
            Some(Watched::Call(view)) => Ok(Step::Answer(
                self.call(view, parts, object, identity, slot, started, &mut None)
                    .await?,
            )),
            Some(Watched::HiddenRead(named)) if !named.meets(self.not_passed()) => {
                // Only views the gateway serves itself are named: its resources pass.
                let on = self.forwarded_on(&identity, headers, now)?;
                Ok(Forward::on(Watch::Nothing, Some(on)))
            }
            Some(Watched::HiddenRead(_)) if self.shadow => {
                // The gateway serves the surface in shadow mode: its resources too.
                self.window.hit(&identity.sub, now);
                let on = self.known(headers, &identity.sub, now);
                Ok(Forward::on(Watch::Nothing, on))
            }
            Some(Watched::HiddenRead(_)) => Ok(Step::Answer(
                self.hidden_read(headers, object, identity, now, started)?,
            )),
            Some(Watched::List(method)) => {
                let (on, session) = self.forwarded_session(&identity, headers, now)?;
                // In shadow mode the gateway serves the views the sidecar owns: its lists
                // pass as they are, but for the views the policy denies.
                let listing = if self.shadow {
                    Listing::for_shadow(&self.policy)
                } else {
                    Some(Listing::for_policy(
                        &self.policy,
                        self.policy.allows(&session.role),
                    ))
                };
                let watch = match listing {
                    None => Watch::Nothing,
                    Some(l) if method == "tools/list" => Watch::Rewrite(Rewrite::Tools(l)),
                    Some(l) => Watch::Rewrite(Rewrite::Resources(l)),
                };
                Ok(Forward::on(watch, Some(on)))
            }
            None => {
                let on = self.forwarded_on(&identity, headers, now)?;
                Ok(Forward::on(Watch::Nothing, Some(on)))
            }
        }
    }

    /// Whether the sidecar answers, rewrites or learns from `message` under its policy:
    /// a call of a view it passes is the gateway's, and so is a read naming only the
    /// resources of such views.
    fn watches(&self, message: &Value) -> bool {
        match watched(message) {
            None => false,
            Some(Watched::Call(view)) => self.policy.mode(view) != ViewMode::Pass,
            Some(Watched::HiddenRead(named)) => named.meets(self.not_passed()),
            Some(Watched::Initialize | Watched::List(_)) => true,
        }
    }

    /// The views the gateway does not answer itself (owned or denied).
    fn not_passed(&self) -> ViewSet {
        View::ALL
            .into_iter()
            .filter(|v| self.policy.mode(*v) != ViewMode::Pass)
            .fold(ViewSet::NONE, ViewSet::with)
    }

    /// The policy in force.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The sanitizer for the gateway's answer to the forwarded `message`, when
    /// `[sanitize]` rewrites anything on `/mcp`.
    pub fn sanitizer_for(&self, message: &Value) -> Option<sanitize::Sanitizer> {
        self.sanitize
            .any()
            .then(|| sanitize::Sanitizer::for_request(self.sanitize, message))
    }

    /// Steps 3 and 4 of §6 for a request the gateway is to answer: counted in the window
    /// (a full window is left to the gateway to refuse, as for any request it answers),
    /// and on a live session of the caller. A request on any other session is answered
    /// here and never forwarded: the gateway would take its id for a new session,
    /// evicting the caller's least recently active one at the cap, and then refuse it as
    /// not initialized. When the window is full that answer is the 429 (step 3 first).
    fn forwarded_session(
        &self,
        identity: &Identity,
        headers: &HeaderMap,
        now: Instant,
    ) -> Result<(OnSession, Session), McpError> {
        let allowed = self.window.hit(&identity.sub, now);
        match self.session(headers, &identity.sub, now) {
            Ok((id, session)) => Ok((
                OnSession {
                    id,
                    owner: identity.sub.clone(),
                },
                session,
            )),
            Err(_) if !allowed => {
                self.metrics.rate_limited(Surface::Mcp);
                Err(McpError::RateLimited)
            }
            Err(e) => Err(e),
        }
    }

    fn forwarded_on(
        &self,
        identity: &Identity,
        headers: &HeaderMap,
        now: Instant,
    ) -> Result<OnSession, McpError> {
        self.forwarded_session(identity, headers, now)
            .map(|(on, _)| on)
    }

    /// The caller's live session named by the request, if any (nothing is refused).
    fn known(&self, headers: &HeaderMap, sub: &str, now: Instant) -> Option<OnSession> {
        self.session(headers, sub, now)
            .ok()
            .map(|(id, _)| OnSession {
                id,
                owner: sub.to_owned(),
            })
    }

    /// The live session named by `Mcp-Session-Id` and owned by `sub` (§6 step 4).
    fn session(
        &self,
        headers: &HeaderMap,
        sub: &str,
        now: Instant,
    ) -> Result<(String, Session), McpError> {
        let id = header_once(headers, "mcp-session-id")?.ok_or(McpError::SessionNotFound)?;
        match self.sessions.lookup(&id, sub, now) {
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

    /// `GET`, `HEAD` and `DELETE` on `/mcp` (§6), counted in the window. On a live
    /// session of the caller they pass (a `DELETE` forgets it first; the others' answers
    /// settle it). On any other session the gateway only answers, so the sidecar answers
    /// for it and nothing reaches the gateway: `GET` and `HEAD` 404 `Session not found`,
    /// `DELETE` its 200 `{"ok":true}` that changes nothing (429 first when the window is
    /// full). A token the sidecar does not accept for the method passes as before: the
    /// gateway refuses it or, for a token it takes, runs no rule that opens or evicts a
    /// session; a `DELETE` by the owner of a session is still forgotten here, since the
    /// gateway may honour it.
    pub fn gate(&self, method: &Method, headers: &HeaderMap, started: Instant) -> Gate {
        let delete = *method == Method::DELETE;
        let passed = |on: Option<OnSession>, allowed: bool, owner: Option<String>| {
            Gate::Forward(Passed {
                sanitize: self
                    .sanitize
                    .any()
                    .then(|| sanitize::Sanitizer::unknown(self.sanitize)),
                on,
                stream: if self.shadow {
                    Listing::for_shadow(&self.policy).map(Rewrite::Any)
                } else {
                    Some(Rewrite::Any(Listing::for_policy(&self.policy, allowed)))
                },
                owner,
            })
        };
        let Ok(identity) = self.caller(headers, method) else {
            let owner = self.token_sub(headers);
            if delete {
                self.forget_deleted(headers, owner.as_deref());
            }
            // No session of the caller is known here: a replayed tool list is read as
            // one the role may not see (fail closed).
            return passed(None, false, owner);
        };
        let now = Instant::now();
        let allowed = self.window.hit(&identity.sub, now);
        match self.session(headers, &identity.sub, now) {
            Ok((id, _)) if delete => {
                if self.sessions.remove(&id, &identity.sub) {
                    self.metrics.set_mcp_sessions(self.sessions.len());
                }
                passed(None, false, Some(identity.sub))
            }
            Ok((id, session)) => passed(
                Some(OnSession {
                    id,
                    owner: identity.sub.clone(),
                }),
                self.policy.allows(&session.role),
                Some(identity.sub),
            ),
            Err(_) if !allowed => {
                self.metrics.rate_limited(Surface::Mcp);
                Gate::Answer(self.refuse(&McpError::RateLimited, started))
            }
            Err(_) if delete => {
                let i = self.intercepted(Outcome::SessionNotFound, 200, started);
                record(&self.metrics, &i);
                Gate::Answer(answer::deleted())
            }
            // A repeated `Mcp-Session-Id` is joined by Node and names no session either.
            Err(_) => Gate::Answer(self.refuse(&McpError::SessionNotFound, started)),
        }
    }

    /// The `sub` of the request's bearer token when it verifies (§1), whatever its kind
    /// and scopes.
    fn token_sub(&self, headers: &HeaderMap) -> Option<String> {
        let authorization = auth::authorization(headers).ok()?;
        let token = auth::verify_token(authorization, &self.keys, auth::now_unix()).ok()?;
        token.sub().map(str::to_owned)
    }

    /// A `DELETE` whose token verifies (its `sub`: `owner`) but is not accepted for the
    /// method here (the scopes): forgets the named session when `owner` holds it.
    fn forget_deleted(&self, headers: &HeaderMap, owner: Option<&str>) {
        if let (Some(sub), Ok(Some(id))) = (owner, header_once(headers, "mcp-session-id")) {
            if self.sessions.remove(&id, sub) {
                self.metrics.set_mcp_sessions(self.sessions.len());
            }
        }
    }

    /// Called as a forwarded `POST /mcp` leaves for the gateway; the time it left. An
    /// `initialize` that opens a session makes room for it first, as the gateway does
    /// when it arrives: the owner's least recently active session at the gateway goes
    /// when the owner holds the per-user cap.
    pub fn sending(&self, forward: &Forward) -> Instant {
        let now = Instant::now();
        if let Some(owner) = &forward.opens {
            let evicted = self.sessions.make_room(owner, now);
            if !evicted.is_empty() {
                self.evicted(&evicted);
            }
        }
        now
    }

    /// Whether the body of the gateway's answer to a request on a live session must be
    /// read to settle it: only an answer that could be the gateway's unknown-session or
    /// not-initialized answer (a 404 or 400 labelled JSON).
    pub fn must_read(&self, status: StatusCode, headers: &HeaderMap) -> bool {
        wire::may_drop_session(status, headers)
    }

    /// The gateway answered a request on `on` that left at `sent` (`body`: the answer's
    /// body, when [`McpService::must_read`] asked for it, read up to
    /// [`wire::MAX_DROPPED_ANSWER_BYTES`]). When the answer says the gateway no longer
    /// knows the session, the sidecar forgets it (and the owner's older ones, see
    /// [`Sessions::dropped`]) and returns `true`: the caller answers 404 `Session not
    /// found`, so the client initializes again. Otherwise the gateway counted the
    /// request as activity in the session unless it refused it before its session
    /// lookup (401, 429).
    pub fn settle(
        &self,
        on: &OnSession,
        sent: Instant,
        status: StatusCode,
        headers: &HeaderMap,
        body: Option<&[u8]>,
    ) -> bool {
        if body.is_some_and(|b| wire::drops_session(status, headers, b)) {
            let n = self.sessions.dropped(&on.id, &on.owner);
            self.evicted(&vec![Eviction::GatewayDropped; n]);
            return true;
        }
        if status != StatusCode::UNAUTHORIZED && status != StatusCode::TOO_MANY_REQUESTS {
            self.sessions.reached(&on.id, &on.owner, sent);
        }
        false
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
        // An owned copy: a clone would share the connection's whole read buffer (hyper
        // slices header values out of it) for as long as the session lives, about
        // 13.5 KiB per session instead of the header's own bytes.
        let authorization = parts
            .headers
            .get(header::AUTHORIZATION)
            .ok_or(McpError::Unauthorized(AuthError::Missing))
            .and_then(|v| {
                HeaderValue::from_bytes(v.as_bytes())
                    .map_err(|_| McpError::Unauthorized(AuthError::NotBearer))
            })?;
        let Some(hosted) = &self.hosted else {
            return Err(McpError::NoHostedAccess);
        };
        let conn = upstream::conn_of(&parts.extensions);
        match hosted
            .lookup(&authorization, &identity.sub, &vault, conn)
            .await
        {
            Ok((access, _)) => {
                // On a live session of the caller the gateway hands it to that session
                // (which refuses it as already initialized); on any other id, or none,
                // it opens a new session.
                let on = self.known(&parts.headers, &identity.sub, now);
                let opens = on.is_none().then(|| identity.sub.clone());
                let session = Session {
                    effective_user: access.mcp_effective_user(&identity.sub).to_owned(),
                    role: access.mcp_role().to_owned(),
                    owner: identity.sub,
                    vault,
                    authorization,
                };
                Ok(Step::Forward(Forward {
                    watch: Watch::Initialize(Box::new(session)),
                    on,
                    opens,
                }))
            }
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
        forward: &Forward,
        response: &http::response::Parts,
    ) -> Option<oneshot::Receiver<bool>> {
        let Watch::Initialize(session) = &forward.watch else {
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
    /// An event stream is read as a client reads it ([`sse`]): only the data of its
    /// JSON-RPC message events is rewritten, every other byte kept.
    pub fn rewrite(
        &self,
        rewrite: Rewrite,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Result<Bytes, McpError> {
        let ct = content_type.unwrap_or("").to_ascii_lowercase();
        if ct.contains("text/event-stream") {
            return sse::rewrite_all(body, rewrite, MAX_LIST_ANSWER_BYTES)
                .map(Bytes::from)
                .map_err(|_| McpError::BadGateway);
        }
        if !ct.contains("json") {
            return Err(McpError::BadGateway);
        }
        let text = std::str::from_utf8(body).map_err(|_| McpError::BadGateway)?;
        wire::rewrite_message(text, rewrite)
            .map(Bytes::from)
            .ok_or(McpError::BadGateway)
    }

    /// `tools/call` of `view`'s tool: the §6 order, then the tool. `witness` receives the
    /// note's Markdown body when it was read (shadow mode only).
    #[allow(clippy::too_many_arguments)]
    async fn call(
        &self,
        view: View,
        parts: &http::request::Parts,
        message: &Map<String, Value>,
        identity: Identity,
        slot: &mut Slot,
        started: Instant,
        witness: &mut Option<String>,
    ) -> Result<Response<Full<Bytes>>, McpError> {
        let now = Instant::now();
        let Admitted {
            session_id,
            session,
            id,
            params,
        } = match self.admit(&parts.headers, message, identity, now)? {
            Admission::Request(a) => a,
            Admission::Notification => return Ok(self.notification(started)),
        };
        let conn = upstream::conn_of(&parts.extensions);
        // The SDK checks a task request before the tool is looked up.
        if let Some(refusal) = tool::task_refusal(params, "tools/call") {
            let body = wire::sse_event(&wire::error_message(-32603, &refusal, &id));
            let mut i = self.intercepted(Outcome::TaskRefused, 200, started);
            i.elapsed = started.elapsed();
            record(&self.metrics, &i);
            return Ok(sse_response(body, &session_id));
        }
        let mut i = self.intercepted(Outcome::Ok, 200, started);
        i.view = Some(view);
        // What the note and the answer hold stays charged until the answer is written.
        // The note, its parses and the answer are charged to the caller's budget while
        // they are held, the note's bytes as they arrive; one that does not fit is a
        // runtime failure, as a note over the cap is.
        let mut held = 0;
        let mut refusal = None;
        let mut charge = budget::charge_note(slot, &mut held, &mut refusal);
        let ran = self
            .run(view, &session, conn, params, &mut charge, &mut i, witness)
            .await;
        drop(charge);
        let result = match ran {
            Ok(doc) => {
                i.sections = Some(doc.headings());
                i.truncated = doc.truncated();
                tool::success(&doc.to_json())
            }
            Err(failure) => {
                i.outcome = match failure {
                    ToolFailure::Denied => Outcome::ToolDenied,
                    ToolFailure::Arguments(_) => Outcome::InvalidArguments,
                    ToolFailure::InvalidPath => Outcome::InvalidPath,
                    // The REST route's classes, so a missing note is a caller's miss
                    // on both surfaces, not a failing canister.
                    ToolFailure::Upstream(404) => Outcome::NotFound,
                    ToolFailure::Upstream(401 | 403) => Outcome::UpstreamForbidden,
                    ToolFailure::Upstream(_) => Outcome::UpstreamStatus,
                    // The same answer, but the operator's to fix, as on REST.
                    ToolFailure::Runtime if self.canister.is_none() => Outcome::NotConfigured,
                    ToolFailure::Runtime => Outcome::BadGateway,
                };
                failure.result(view)
            }
        };
        let body = wire::sse_result(&result, &id);
        drop(result);
        slot.unreserve(held);
        i.elapsed = started.elapsed();
        record(&self.metrics, &i);
        Ok(sse_response(body, &session_id))
    }

    /// Steps 3 to 8 of §6 for a message the sidecar answers itself: the window, the
    /// caller's own live session, `Accept`, `Content-Type`, the strict JSON-RPC shape
    /// and the protocol version, in the SDK's order.
    fn admit<'m>(
        &self,
        headers: &HeaderMap,
        message: &'m Map<String, Value>,
        identity: Identity,
        now: Instant,
    ) -> Result<Admission<'m>, McpError> {
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
        Ok(match id {
            Some(id) => Admission::Request(Admitted {
                session_id,
                session,
                id,
                params,
            }),
            None => Admission::Notification,
        })
    }

    /// A notification the sidecar would answer: nothing runs and nothing is answered
    /// but 202.
    fn notification(&self, started: Instant) -> Response<Full<Bytes>> {
        record(&self.metrics, &self.intercepted(Outcome::Ok, 202, started));
        let mut r = Response::new(Full::new(Bytes::new()));
        *r.status_mut() = StatusCode::ACCEPTED;
        r
    }

    /// `resources/read` of a hidden resource (§6 ACL): the SDK's answer to a URI no
    /// resource matches, after the same checks as a tool call. Nothing is read.
    fn hidden_read(
        &self,
        headers: &HeaderMap,
        message: &Map<String, Value>,
        identity: Identity,
        now: Instant,
        started: Instant,
    ) -> Result<Response<Full<Bytes>>, McpError> {
        let Admitted {
            session_id,
            id,
            params,
            ..
        } = match self.admit(headers, message, identity, now)? {
            Admission::Request(a) => a,
            Admission::Notification => return Ok(self.notification(started)),
        };
        let (body, outcome) = match tool::task_refusal(params, "resources/read") {
            Some(refusal) => (
                wire::sse_event(&wire::error_message(-32603, &refusal, &id)),
                Outcome::TaskRefused,
            ),
            None => {
                let uri = params
                    .get("uri")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let message = wire::unknown_resource_message(uri, &id);
                (wire::sse_event(&message), Outcome::ResourceHidden)
            }
        };
        let mut i = self.intercepted(outcome, 200, started);
        i.elapsed = started.elapsed();
        record(&self.metrics, &i);
        Ok(sse_response(body, &session_id))
    }

    /// The tool itself: policy, arguments, path, the one read, the builder; `charge`
    /// pays for what is held meanwhile.
    #[allow(clippy::too_many_arguments)]
    async fn run(
        &self,
        view: View,
        session: &Session,
        conn: ConnId,
        params: &Map<String, Value>,
        charge: &mut (dyn FnMut(usize) -> bool + Send),
        i: &mut Intercepted,
        witness: &mut Option<String>,
    ) -> Result<extract::Document, ToolFailure> {
        // A denied view is an unknown tool to every role; an owned one to the roles the
        // policy denies.
        if self.policy.mode(view) == ViewMode::Deny || !self.policy.allows(&session.role) {
            return Err(ToolFailure::Denied);
        }
        let raw = tool::path_argument(params).map_err(ToolFailure::Arguments)?;
        let path = path::validate(raw).map_err(|_| ToolFailure::InvalidPath)?;
        if self.canister.is_none() {
            return Err(ToolFailure::Runtime);
        }
        let token = session
            .authorization
            .to_str()
            .map_err(|_| ToolFailure::Runtime)?;
        let headers = canister::mcp_headers(&session.vault, &session.effective_user, token)
            .map_err(|_| ToolFailure::Runtime)?;
        let caller = Caller::Principal {
            sub: &session.owner,
            scope: &session.vault,
            conn,
        };
        self.read_and_build(view, &path, headers, caller, charge, i, witness)
            .await
    }

    /// The one read of `path` and the builder; `charge` pays for the note while it is held.
    #[allow(clippy::too_many_arguments)]
    async fn read_and_build(
        &self,
        view: View,
        path: &path::VaultPath,
        headers: HeaderMap,
        caller: Caller<'_>,
        charge: &mut (dyn FnMut(usize) -> bool + Send),
        i: &mut Intercepted,
        witness: &mut Option<String>,
    ) -> Result<extract::Document, ToolFailure> {
        let canister = self.canister.as_ref().ok_or(ToolFailure::Runtime)?;
        let body = match canister.get_note(path, headers, caller, charge).await {
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
        let note = crate::telemetry::trace::extract_span("parse")
            .in_scope(|| extract::parse_note_charged(&body, extract::Surface::Mcp, charge))
            .map_err(|_| ToolFailure::Runtime)?;
        drop(body);
        if self.shadow {
            *witness = Some(note.body.clone());
        }
        // Held at once: the document, its JSON, then that JSON escaped into the result
        // (at most twice as long); then the result and the event around it.
        crate::telemetry::trace::extract_span("build")
            .in_scope(|| {
                extract::build_view_charged(
                    view,
                    path,
                    &note.frontmatter,
                    &note.body,
                    &Limits::default(),
                    &mut |n| charge(n.saturating_mul(4)),
                )
            })
            .map_err(|_| ToolFailure::Runtime)
    }
}
