//! The REST choke point: `GET /api/v1/section-source?path=…` (wire contract §5) and
//! `GET /api/v1/note-outline?path=…` (the same table, serving NoteOutline v1), answered
//! here from one canister read (§4) and never passed to the gateway.
//!
//! [`RestService::handle`] runs the §5 table in order and maps every refusal to the wire in one place
//! ([`RestError`]). Upstream bodies are never forwarded, and no response carries
//! anything from the request except a listed (or twin) CORS origin.
//!
//! Decisions where the contract is silent:
//! - Which requests are ours is decided in [`crate::route`], shared with the MCP surface.
//! - An invalid `X-Vault-Id` (400 `INVALID_VAULT`) is checked right before the first use
//!   of the vault upstream (after the path), so every gateway outcome keeps its place.
//! - The bridge's own 403, when failing closed, is answered with the "vault not
//!   allowed" body of §2.
//! - "Verified" in the agent row means signature, `exp`/`nbf` and the `exp` requirement
//!   passed: an agent token failing those is a 401 like any other.
//! - A method other than GET, HEAD or OPTIONS (the proxy never sends one here) runs the
//!   same table, with the write scope rule of §1.
//! - The rate limit is taken right after the token (the table's third row), before any
//!   bridge or canister call, so a caller naming many vaults cannot turn its requests
//!   into bridge calls. OPTIONS is never limited or authenticated.
//! - An in-flight slot is taken after the token verifies and before the rate limit; a
//!   full budget (overall or for this user) is 503 `Service overloaded` with
//!   `Retry-After: 1`.
//! - A `sub` or effective user that cannot be sent as a header value ends as 502 with no
//!   canister request, as the gateway's `fetch` would throw before sending.
//! - Any invalid percent-escape anywhere in the query (key or value, any parameter)
//!   makes it invalid, as does a decoded key or value that is not UTF-8.
//! - `Content-Length` is set on GET and HEAD answers (HEAD: the length GET would have),
//!   as Express does.

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{Method, Response, StatusCode};
use http_body_util::Full;

use crate::auth::{self, AuthError, Keys};
use crate::budget::{self, Budget, Refusal};
use crate::canister::{self, CanisterClient, NoteResponse};
use crate::config::{Config, ConfigError, OnFailure};
use crate::cors::Cors;
use crate::extract::{self, ExtractError, Limits, NoteError, View};
use crate::hosted::{HostedClient, HostedError, Scope, Source};
use crate::mcp::{Policy, ViewMode};
use crate::path;
use crate::ratelimit::{Limited, RateLimit};
use crate::route::hex_pair;
use crate::telemetry::{
    trace, HostedContextEvent, Intercepted, Metrics, Outcome, Surface, UpstreamName,
};
use crate::upstream::{self, Caller, ConnId};

/// Most query parameters accepted (§3 Deviation; `qs` reads only the first 1000).
pub const MAX_QUERY_PARAMETERS: usize = 1000;

const JSON_CONTENT_TYPE: &str = "application/json; charset=utf-8";
const CACHE_CONTROL: &str = "private, no-store, must-revalidate";

/// Every refusal of the §5 table, in table order. The one place that maps them to the
/// wire is [`RestError::wire`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestError {
    /// A verified agent token whose `vault_ids` lacks the vault.
    AgentVaultForbidden,
    /// No or invalid token, wrong kind or scope: why, for the log, the metric and the
    /// `WWW-Authenticate` header.
    Unauthorized(AuthError),
    /// No canister configured (the view's name in the message).
    NotConfigured(View),
    /// The policy denies the view (`deny`): answered as a route that does not exist.
    Denied,
    /// The `path` parameter failed §3.
    InvalidPath,
    /// `X-Vault-Id` failed the §1 Deviation.
    InvalidVault,
    /// The hosted context does not allow the vault (or the bridge said 403, failing
    /// closed).
    VaultForbidden,
    /// The hosted-context lookup failed, failing closed (§2 Deviation).
    HostedContextUnavailable,
    /// Rate limited (§5 Deviation).
    RateLimited(Limited),
    /// No in-flight slot for this request (the budget is full overall or for the user).
    Overloaded(Refusal),
    /// The canister said 401 or 403.
    UpstreamForbidden,
    /// The canister said 404.
    UpstreamNotFound,
    /// The canister said another non-2xx status.
    UpstreamStatus(u16),
    /// The canister's 2xx body is not JSON (§4).
    InvalidNoteResponse,
    /// The canister's 2xx body is JSON `null` (§4).
    NullNote,
    /// The note is outside the caller's scope.
    OutOfScope,
    /// Anything else: timeout, transport, note over the cap, a throwing title.
    BadGateway,
}

impl RestError {
    /// Status, exact JSON body and outcome label.
    pub fn wire(&self) -> (StatusCode, String, Outcome) {
        let (status, error, code, outcome) = match self {
            RestError::AgentVaultForbidden => (
                StatusCode::FORBIDDEN,
                "vault forbidden for agent credential",
                "AGENT_VAULT_FORBIDDEN",
                Outcome::AgentVaultForbidden,
            ),
            RestError::Unauthorized(_) => (
                StatusCode::UNAUTHORIZED,
                "Unauthorized",
                "UNAUTHORIZED",
                Outcome::Unauthorized,
            ),
            RestError::NotConfigured(view) => (
                StatusCode::SERVICE_UNAVAILABLE,
                match view {
                    View::SectionSource => "Hosted SectionSource is not configured",
                    View::NoteOutline => "Hosted NoteOutline is not configured",
                    View::DocumentTree => "Hosted DocumentTree is not configured",
                },
                "SERVICE_UNAVAILABLE",
                Outcome::NotConfigured,
            ),
            RestError::Denied => (
                StatusCode::NOT_FOUND,
                "Not found",
                "NOT_FOUND",
                Outcome::ViewDenied,
            ),
            RestError::InvalidPath => (
                StatusCode::BAD_REQUEST,
                "Invalid path",
                "INVALID_PATH",
                Outcome::InvalidPath,
            ),
            RestError::InvalidVault => (
                StatusCode::BAD_REQUEST,
                "Invalid vault",
                "INVALID_VAULT",
                Outcome::InvalidVault,
            ),
            RestError::VaultForbidden => (
                StatusCode::FORBIDDEN,
                "Access to this vault is not allowed.",
                "FORBIDDEN",
                Outcome::VaultForbidden,
            ),
            RestError::HostedContextUnavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "Hosted access context unavailable",
                "SERVICE_UNAVAILABLE",
                Outcome::HostedContextUnavailable,
            ),
            RestError::RateLimited(_) => (
                StatusCode::TOO_MANY_REQUESTS,
                "Rate limit exceeded",
                "RATE_LIMITED",
                Outcome::RateLimited,
            ),
            RestError::Overloaded(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "Service overloaded",
                "SERVICE_UNAVAILABLE",
                Outcome::Overloaded,
            ),
            RestError::UpstreamForbidden => (
                StatusCode::FORBIDDEN,
                "Forbidden",
                "FORBIDDEN",
                Outcome::UpstreamForbidden,
            ),
            RestError::UpstreamNotFound | RestError::OutOfScope => (
                StatusCode::NOT_FOUND,
                "Not found",
                "NOT_FOUND",
                Outcome::NotFound,
            ),
            RestError::UpstreamStatus(s) => {
                // The only variable text: a number, so nothing from upstream is echoed.
                let body = format!(r#"{{"error":"Upstream {s}","code":"BAD_GATEWAY"}}"#);
                return (StatusCode::BAD_GATEWAY, body, Outcome::UpstreamStatus);
            }
            RestError::InvalidNoteResponse => (
                StatusCode::BAD_GATEWAY,
                "Invalid note response",
                "BAD_GATEWAY",
                Outcome::BadGateway,
            ),
            RestError::NullNote | RestError::BadGateway => (
                StatusCode::BAD_GATEWAY,
                "Bad Gateway",
                "BAD_GATEWAY",
                Outcome::BadGateway,
            ),
        };
        let body = format!(r#"{{"error":"{error}","code":"{code}"}}"#);
        (status, body, outcome)
    }
}

/// A built answer: the document's JSON and what the record needs of it.
struct Served {
    json: String,
    sections: usize,
    truncated: bool,
}

/// What one request did besides its answer, for [`Intercepted`].
#[derive(Debug, Default)]
struct Record {
    upstream_status: Option<u16>,
    hosted_context: HostedContextEvent,
    /// Shadow mode: keep the note's body, to recognise it in the gateway's answer.
    keep_witness: bool,
    witness: Option<String>,
}

/// The REST handler for `GET /api/v1/section-source` and `GET /api/v1/note-outline`.
pub struct RestService {
    keys: Keys,
    policy: Policy,
    canister: Option<CanisterClient>,
    hosted: Option<Arc<HostedClient>>,
    on_failure: OnFailure,
    limits: RateLimit,
    cors: Cors,
    metrics: Arc<Metrics>,
}

impl fmt::Debug for RestService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RestService")
            .field("keys", &self.keys)
            .field("canister", &self.canister)
            .field("hosted", &self.hosted)
            .field("on_failure", &self.on_failure)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl RestService {
    /// Builds the handler: verification keys, the canister and bridge clients (one
    /// connector), rate limits, CORS and the views' `policy`. Fails on an unusable URL,
    /// secret or origin.
    pub fn new(
        config: &Config,
        metrics: Arc<Metrics>,
        policy: Policy,
    ) -> Result<RestService, ConfigError> {
        let up = &config.upstream;
        let connector = upstream::connector(up.ca_file.as_deref())?;
        Ok(RestService {
            keys: Keys::new(&config.auth),
            policy,
            canister: CanisterClient::new(
                config,
                &connector,
                metrics.fault_observer(UpstreamName::Canister),
            )?,
            hosted: HostedClient::new(
                config,
                &connector,
                metrics.fault_observer(UpstreamName::Bridge),
            )?
            .map(Arc::new),
            on_failure: config.hosted_context.on_failure,
            limits: RateLimit::new(&config.rate_limit),
            cors: Cors::new(&config.cors.allowed_origins)?,
            metrics,
        })
    }

    /// The hosted-context client and cache, to share with the MCP surface (§2).
    pub fn hosted_client(&self) -> Option<Arc<HostedClient>> {
        self.hosted.clone()
    }

    /// The verification keys and their remembered tokens, to share with the MCP
    /// surface: both verify with the same secrets and policy (§1), so one cache serves a
    /// caller's token on either.
    pub fn keys(&self) -> Keys {
        self.keys.clone()
    }

    /// Answers one intercepted GET, HEAD or OPTIONS of `view`'s route (a request body
    /// is never read). A slot of `budget` is held from the moment the token has verified
    /// (an unverified caller never takes one) until the answer is built.
    pub async fn handle(
        &self,
        parts: &http::request::Parts,
        budget: &Budget,
        view: View,
    ) -> (Response<Full<Bytes>>, Intercepted) {
        let (response, intercepted, _) = self.answer(parts, budget, view, false).await;
        (response, intercepted)
    }

    /// [`RestService::handle`] for shadow mode: also the note's Markdown body when it was
    /// read (kept only for the comparison, never sent or logged).
    pub async fn handle_shadow(
        &self,
        parts: &http::request::Parts,
        budget: &Budget,
        view: View,
    ) -> (Response<Full<Bytes>>, Intercepted, Option<String>) {
        self.answer(parts, budget, view, true).await
    }

    /// Who answers `view`.
    pub fn mode(&self, view: View) -> ViewMode {
        self.policy.mode(view)
    }

    async fn answer(
        &self,
        parts: &http::request::Parts,
        budget: &Budget,
        view: View,
        keep_witness: bool,
    ) -> (Response<Full<Bytes>>, Intercepted, Option<String>) {
        let started = Instant::now();
        let origin = single_header(&parts.headers, http::header::ORIGIN);
        if parts.method == Method::OPTIONS && self.policy.mode(view) != ViewMode::Deny {
            let response = self.preflight(origin);
            let intercepted = Intercepted {
                surface: Surface::Rest,
                view: Some(view),
                outcome: Outcome::Preflight,
                status: response.status().as_u16(),
                upstream_status: None,
                sections: None,
                truncated: false,
                hosted_context: HostedContextEvent::None,
                auth_refusal: None,
                elapsed: started.elapsed(),
            };
            return (response, intercepted, None);
        }
        let head = parts.method == Method::HEAD;
        let mut record = Record {
            keep_witness,
            ..Record::default()
        };
        let served = if self.policy.mode(view) == ViewMode::Deny {
            Err(RestError::Denied)
        } else {
            self.serve(parts, budget, view, &mut record).await
        };
        let mut refused = None;
        let (status, body, outcome, retry_after, sections, truncated) = match served {
            Ok(served) => (
                StatusCode::OK,
                served.json,
                Outcome::Ok,
                None,
                Some(served.sections),
                served.truncated,
            ),
            Err(e) => {
                if let RestError::Unauthorized(why) = e {
                    refused = Some(why);
                }
                let (status, body, outcome) = e.wire();
                let retry = match e {
                    RestError::RateLimited(l) => Some(l.retry_after_secs()),
                    RestError::Overloaded(reason) => {
                        self.metrics.admission_refused(reason);
                        Some(1)
                    }
                    _ => None,
                };
                (status, body, outcome, retry, None, false)
            }
        };
        let mut response = self.json_response(status, body, head, origin, retry_after);
        if let Some(why) = refused {
            // RFC 6750 §3: the reason class, in words fixed here, never the token's.
            response.headers_mut().insert(
                http::header::WWW_AUTHENTICATE,
                HeaderValue::from_static(why.challenge()),
            );
        }
        let intercepted = Intercepted {
            surface: Surface::Rest,
            view: Some(view),
            outcome,
            status: status.as_u16(),
            upstream_status: record.upstream_status,
            sections,
            truncated,
            hosted_context: record.hosted_context,
            auth_refusal: refused.map(AuthError::refusal),
            elapsed: started.elapsed(),
        };
        (response, intercepted, record.witness)
    }

    /// The §5 table, top to bottom.
    async fn serve(
        &self,
        parts: &http::request::Parts,
        budget: &Budget,
        view: View,
        record: &mut Record,
    ) -> Result<Served, RestError> {
        let authorization = auth::authorization(&parts.headers).map_err(RestError::Unauthorized)?;
        let token = auth::verify_token(authorization, &self.keys, auth::now_unix())
            .map_err(RestError::Unauthorized)?;
        self.metrics
            .token_verified(Surface::Rest, token.remembered());
        let vault = auth::requested_vault(&parts.headers);
        // Row 1: the agent vault gate comes before every other identity rule.
        if token.is_agent() && !vault.as_ref().is_ok_and(|v| token.agent_vault_allowed(v)) {
            return Err(RestError::AgentVaultForbidden);
        }
        let identity = token
            .identity(&parts.method)
            .map_err(RestError::Unauthorized)?;
        // Nothing scarce before a valid token: the slot comes only now.
        let mut slot = budget.admit(&identity.sub).map_err(RestError::Overloaded)?;
        // Before any bridge or canister call, so a limited caller costs neither (§5).
        self.limits.check(&identity.sub).map_err(|l| {
            self.metrics.rate_limited(Surface::Rest);
            RestError::RateLimited(l)
        })?;
        let canister = self
            .canister
            .as_ref()
            .ok_or(RestError::NotConfigured(view))?;
        let raw_path = path_parameter(parts.uri.query()).map_err(|_| RestError::InvalidPath)?;
        let path = path::validate(&raw_path).map_err(|_| RestError::InvalidPath)?;
        let vault = vault.map_err(|_| RestError::InvalidVault)?;
        auth::validate_vault(&vault).map_err(|_| RestError::InvalidVault)?;

        let conn = upstream::conn_of(&parts.extensions);
        let (user, scope) = self
            .hosted_context(parts, &identity.sub, &vault, conn, record)
            .await?;

        let headers = canister::rest_headers(&vault, &user, &identity.sub)
            .map_err(|_| RestError::BadGateway)?;
        // The note and its parses are charged to the caller's budget while they are held,
        // its bytes as they arrive: a note of 8 MiB whose frontmatter is an array of zeros
        // took 155 MB to parse. One that could never fit is treated as a note over the cap.
        let (mut charged, mut refusal) = (0, None);
        let mut charge = budget::charge_note(&mut slot, &mut charged, &mut refusal);
        let caller = Caller::Principal {
            sub: &identity.sub,
            scope: &vault,
            conn,
        };
        let body = match canister.get_note(&path, headers, caller, &mut charge).await {
            Err(e) => {
                record.upstream_status = e.upstream_status();
                drop(charge);
                return Err(match refusal {
                    Some(budget::Charge::Refused(r)) => RestError::Overloaded(r),
                    _ => RestError::BadGateway,
                });
            }
            Ok(NoteResponse::Status(s)) => {
                record.upstream_status = Some(s);
                return Err(match s {
                    401 | 403 => RestError::UpstreamForbidden,
                    404 => RestError::UpstreamNotFound,
                    _ => RestError::UpstreamStatus(s),
                });
            }
            Ok(NoteResponse::Success { status, body }) => {
                record.upstream_status = Some(status);
                body
            }
        };
        // The extract phase's two steps are traced here, where the daemon calls the pure
        // extractor: the stored note read, then the document built.
        let parsed = trace::extract_span("parse")
            .in_scope(|| extract::parse_note_charged(&body, extract::Surface::Rest, &mut charge));
        let note = match parsed {
            Ok(note) => note,
            Err(e) => {
                drop(charge);
                return Err(match (e, refusal) {
                    (NoteError::NotJson, _) => RestError::InvalidNoteResponse,
                    (NoteError::Null, _) => RestError::NullNote,
                    (NoteError::TooCostly, Some(budget::Charge::Refused(r))) => {
                        RestError::Overloaded(r)
                    }
                    _ => RestError::BadGateway,
                });
            }
        };
        drop(body);
        if record.keep_witness {
            record.witness = Some(note.body.clone());
        }
        if let Some(scope) = scope {
            if !scope.allows(path.folder(), note.frontmatter.project.as_ref()) {
                return Err(RestError::OutOfScope);
            }
        }
        // The document and its JSON, both held at once.
        let built = trace::extract_span("build").in_scope(|| {
            extract::build_view_charged(
                view,
                &path,
                &note.frontmatter,
                &note.body,
                &Limits::default(),
                &mut |n| charge(n.saturating_mul(2)),
            )
        });
        drop(note);
        let served = built.map(|doc| Served {
            json: doc.to_json(),
            sections: doc.headings(),
            truncated: doc.truncated(),
        });
        drop(charge);
        let served = served.map_err(|e| match (e, refusal) {
            (ExtractError::TooCostly, Some(budget::Charge::Refused(r))) => RestError::Overloaded(r),
            _ => RestError::BadGateway,
        });
        slot.unreserve(charged);
        served
    }

    /// §2: the effective user and the active scope, or a refusal.
    async fn hosted_context(
        &self,
        parts: &http::request::Parts,
        sub: &str,
        vault: &str,
        conn: ConnId,
        record: &mut Record,
    ) -> Result<(String, Option<Scope>), RestError> {
        let Some(client) = &self.hosted else {
            return Ok((sub.to_owned(), None));
        };
        // Verified above, so present; forwarded verbatim.
        let authorization = parts
            .headers
            .get(http::header::AUTHORIZATION)
            .ok_or(RestError::Unauthorized(AuthError::Missing))?;
        match client.lookup(authorization, sub, vault, conn).await {
            Ok((access, source)) => {
                record.hosted_context = match source {
                    Source::Cached => HostedContextEvent::Cached,
                    Source::Fetched => HostedContextEvent::Fetched,
                };
                if !access.vault_allowed(vault) {
                    return Err(RestError::VaultForbidden);
                }
                let scope = access.scope.clone().filter(Scope::is_active);
                Ok((access.rest_effective_user(sub).to_owned(), scope))
            }
            Err(HostedError::Throttled(l)) => {
                // No call was made: this caller has spent its bridge calls for now.
                self.metrics.lookup_throttled();
                Err(RestError::RateLimited(l))
            }
            Err(e) => match self.on_failure {
                OnFailure::Deny => {
                    self.metrics.hosted_context_failure(false);
                    record.hosted_context = HostedContextEvent::FailedDenied;
                    Err(if e == HostedError::Forbidden {
                        RestError::VaultForbidden
                    } else {
                        RestError::HostedContextUnavailable
                    })
                }
                OnFailure::Actor => {
                    self.metrics.hosted_context_failure(true);
                    record.hosted_context = HostedContextEvent::FailedFallback;
                    Ok((sub.to_owned(), None))
                }
            },
        }
    }

    fn json_response(
        &self,
        status: StatusCode,
        body: String,
        head: bool,
        origin: Option<&HeaderValue>,
        retry_after: Option<u64>,
    ) -> Response<Full<Bytes>> {
        let length = body.len();
        let body = if head {
            Bytes::new()
        } else {
            Bytes::from(body)
        };
        let mut response = Response::new(Full::new(body));
        *response.status_mut() = status;
        let h = response.headers_mut();
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static(JSON_CONTENT_TYPE),
        );
        h.insert(http::header::CONTENT_LENGTH, HeaderValue::from(length));
        h.insert(
            http::header::CACHE_CONTROL,
            HeaderValue::from_static(CACHE_CONTROL),
        );
        self.cors.apply(h, origin);
        if let Some(secs) = retry_after {
            h.insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }

    /// §5 OPTIONS: 204, empty body, CORS and `Cache-Control`, no `Content-Type`.
    fn preflight(&self, origin: Option<&HeaderValue>) -> Response<Full<Bytes>> {
        let mut response = Response::new(Full::new(Bytes::new()));
        *response.status_mut() = StatusCode::NO_CONTENT;
        let h = response.headers_mut();
        h.insert(
            http::header::CACHE_CONTROL,
            HeaderValue::from_static(CACHE_CONTROL),
        );
        self.cors.apply(h, origin);
        response
    }
}

/// The header's value when it appears exactly once.
fn single_header(headers: &http::HeaderMap, name: HeaderName) -> Option<&HeaderValue> {
    let mut all = headers.get_all(name).iter();
    let first = all.next()?;
    all.next().is_none().then_some(first)
}

/// Why the query yields no usable `path` (all answered 400 `INVALID_PATH`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueryError {
    /// No `path` parameter.
    Missing,
    /// `path` would be an array or object in `qs` (repeated or bracketed key).
    NotAString,
    /// An invalid percent-escape, or a decoded value that is not UTF-8 (§3 Deviation).
    InvalidEscape,
    /// More than [`MAX_QUERY_PARAMETERS`] parameters (§3 Deviation).
    TooManyParameters,
}

/// `req.query.path` as Express 4's "extended" parser (`qs`) would produce it, when it
/// is a string (§3). Keys and values are percent-decoded, `+` is a space; a key with
/// `]=` splits after the bracket, as `qs` does. Any key that makes `path` an array or
/// object, or a second `path`, is refused, including `qs`'s leading-bracket form
/// `[path]=` (which it reads as `path`).
pub fn path_parameter(query: Option<&str>) -> Result<String, QueryError> {
    let query = query.unwrap_or("");
    // A fragment never reaches the parser.
    let query = query.split('#').next().unwrap_or("");
    if query.split('&').count() > MAX_QUERY_PARAMETERS {
        return Err(QueryError::TooManyParameters);
    }
    let mut found: Option<String> = None;
    let mut not_a_string = false;
    for part in query.split('&') {
        let split_at = match part.find("]=") {
            Some(i) => Some(i + 1),
            None => part.find('='),
        };
        let (raw_key, raw_value) = match split_at {
            Some(i) => (&part[..i], &part[i + 1..]),
            None => (part, ""),
        };
        let key = form_decode(raw_key)?;
        let value = form_decode(raw_value)?;
        let plain = if key == "path" {
            true
        } else if key.starts_with("path[") {
            not_a_string = true;
            false
        } else if let Some(rest) = key.strip_prefix("[path]") {
            if rest.contains('[') {
                not_a_string = true;
            }
            !rest.contains('[')
        } else {
            false
        };
        if plain {
            if found.is_some() {
                not_a_string = true;
            }
            found = Some(value);
        }
    }
    if not_a_string {
        return Err(QueryError::NotAString);
    }
    found.ok_or(QueryError::Missing)
}

/// `+` → space, then strict percent-decoding to UTF-8.
fn form_decode(s: &str) -> Result<String, QueryError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b'%' => {
                let c = b
                    .get(i + 1..i + 3)
                    .and_then(hex_pair)
                    .ok_or(QueryError::InvalidEscape)?;
                out.push(c);
                i += 3;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| QueryError::InvalidEscape)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn s3_s5_a_fragment_is_neither_path_nor_query() {
        // As for Express: `#x?path=a` leaves no query, so the request is a 400 later.
        let u: http::Uri = "/api/v1/section-source#x?path=a".parse().unwrap();
        assert_eq!(
            crate::route::classify(&u),
            crate::route::Route::SectionSource
        );
        assert_eq!(path_parameter(u.query()), Err(QueryError::Missing));
        let u: http::Uri = "/api/v1/section-source?path=a#b".parse().unwrap();
        assert_eq!(path_parameter(u.query()), Ok("a".into()));
    }

    fn q(query: &str) -> Result<String, QueryError> {
        path_parameter(Some(query))
    }

    #[test]
    fn s3_query_percent_decoding_and_plus() {
        assert_eq!(q("path=a.md"), Ok("a.md".into()));
        assert_eq!(q("%70ath=a.md"), Ok("a.md".into()));
        assert_eq!(q("%70%61%74%68=a"), Ok("a".into()));
        assert_eq!(
            q("path=inbox%2Fhello%20world.md"),
            Ok("inbox/hello world.md".into())
        );
        assert_eq!(q("path=a+b"), Ok("a b".into()));
        assert_eq!(q("path=a%2Bb"), Ok("a+b".into()));
        assert_eq!(q("path=caf%C3%A9"), Ok("café".into()));
        assert_eq!(q("x=1&path=a&y"), Ok("a".into()));
        assert_eq!(q("path=a=b"), Ok("a=b".into()));
        assert_eq!(q("path=a&&&"), Ok("a".into()));
        assert_eq!(q("path=a#b"), Ok("a".into()));
        // Keys are case-sensitive and exact.
        assert_eq!(q("PATH=a"), Err(QueryError::Missing));
        assert_eq!(q("path%00=a"), Err(QueryError::Missing));
        assert_eq!(q("path+=a"), Err(QueryError::Missing));
        assert_eq!(q("path.x=a"), Err(QueryError::Missing));
        assert_eq!(q("path]=a"), Err(QueryError::Missing));
        assert_eq!(q("[path=a"), Err(QueryError::Missing));
        assert_eq!(q("[[path]]=a"), Err(QueryError::Missing));
        assert_eq!(q("pa[th]=a"), Err(QueryError::Missing));
        assert_eq!(path_parameter(None), Err(QueryError::Missing));
        assert_eq!(q(""), Err(QueryError::Missing));
    }

    #[test]
    fn s3_bare_or_empty_path_is_empty() {
        // Empty strings are then refused by path validation.
        assert_eq!(q("path"), Ok(String::new()));
        assert_eq!(q("path="), Ok(String::new()));
        assert!(path::validate(&q("path").unwrap()).is_err());
    }

    #[test]
    fn s3_repeated_or_bracketed_path_is_not_a_string() {
        for query in [
            "path=a&path=b",
            "path=a&path=",
            "path=a&path",
            "path[]=a",
            "path%5B%5D=a",
            "path%5b%5d=a",
            "path[0]=a",
            "path[x]=a",
            "path[=a",
            "path[]=a&path=b",
            "[path][]=a",
            "[path][x]=a",
            "[path]=a&path=b",
            "%5Bpath%5D=a&path=b",
        ] {
            assert_eq!(q(query), Err(QueryError::NotAString), "{query}");
        }
    }

    #[test]
    fn s3_qs_reads_a_leading_bracket_key_as_path() {
        // Verified against qs 6.16: `[path]=x`, `[path]x=x`, `[path]]=x` all give `path`.
        assert_eq!(q("[path]=a.md"), Ok("a.md".into()));
        assert_eq!(q("%5Bpath%5D=a.md"), Ok("a.md".into()));
        assert_eq!(q("[path]x=a.md"), Ok("a.md".into()));
        assert_eq!(q("[path]]=a.md"), Ok("a.md".into()));
        // `]=` splits first: the key is `path=a.md]`, so there is no `path`.
        assert_eq!(q("path=a.md]=y"), Err(QueryError::Missing));
        assert_eq!(q("[path]==v"), Ok("=v".into()));
    }

    #[test]
    fn s3_invalid_escapes_are_invalid_anywhere() {
        for query in [
            "path=%zz",
            "path=a%2",
            "path=a%",
            "path=a%FF",
            "path=%E0%A4%A",
            "path=%ED%A0%80",
            "path=a.md&x=%zz",
            "%zzpath=a",
        ] {
            assert_eq!(q(query), Err(QueryError::InvalidEscape), "{query}");
        }
    }

    #[test]
    fn s3_more_than_1000_parameters_are_invalid() {
        let at_limit = format!("{}path=a", "a=1&".repeat(999));
        assert_eq!(q(&at_limit), Ok("a".into()));
        let over = format!("{}path=a", "a=1&".repeat(1000));
        assert_eq!(q(&over), Err(QueryError::TooManyParameters));
        let empties = format!("path=a{}", "&".repeat(1000));
        assert_eq!(q(&empties), Err(QueryError::TooManyParameters));
    }

    #[test]
    fn s5_error_table_bodies_are_exact() {
        let body = |e: RestError| e.wire().1;
        assert_eq!(
            body(RestError::AgentVaultForbidden),
            r#"{"error":"vault forbidden for agent credential","code":"AGENT_VAULT_FORBIDDEN"}"#
        );
        assert_eq!(
            body(RestError::Unauthorized(AuthError::Expired)),
            r#"{"error":"Unauthorized","code":"UNAUTHORIZED"}"#
        );
        assert_eq!(
            body(RestError::NotConfigured(View::SectionSource)),
            r#"{"error":"Hosted SectionSource is not configured","code":"SERVICE_UNAVAILABLE"}"#
        );
        assert_eq!(
            body(RestError::InvalidPath),
            r#"{"error":"Invalid path","code":"INVALID_PATH"}"#
        );
        assert_eq!(
            body(RestError::InvalidVault),
            r#"{"error":"Invalid vault","code":"INVALID_VAULT"}"#
        );
        assert_eq!(
            body(RestError::VaultForbidden),
            r#"{"error":"Access to this vault is not allowed.","code":"FORBIDDEN"}"#
        );
        assert_eq!(
            body(RestError::HostedContextUnavailable),
            r#"{"error":"Hosted access context unavailable","code":"SERVICE_UNAVAILABLE"}"#
        );
        let limited = RestError::RateLimited(Limited {
            retry_after: Duration::from_secs(1),
        });
        assert_eq!(
            body(limited),
            r#"{"error":"Rate limit exceeded","code":"RATE_LIMITED"}"#
        );
        assert_eq!(
            body(RestError::UpstreamForbidden),
            r#"{"error":"Forbidden","code":"FORBIDDEN"}"#
        );
        assert_eq!(
            body(RestError::UpstreamNotFound),
            r#"{"error":"Not found","code":"NOT_FOUND"}"#
        );
        assert_eq!(
            body(RestError::OutOfScope),
            r#"{"error":"Not found","code":"NOT_FOUND"}"#
        );
        assert_eq!(
            body(RestError::UpstreamStatus(500)),
            r#"{"error":"Upstream 500","code":"BAD_GATEWAY"}"#
        );
        assert_eq!(
            body(RestError::InvalidNoteResponse),
            r#"{"error":"Invalid note response","code":"BAD_GATEWAY"}"#
        );
        assert_eq!(
            body(RestError::NullNote),
            r#"{"error":"Bad Gateway","code":"BAD_GATEWAY"}"#
        );
        assert_eq!(
            body(RestError::BadGateway),
            r#"{"error":"Bad Gateway","code":"BAD_GATEWAY"}"#
        );
    }
}
