//! The bounded vocabulary of logs and metrics: every label is a closed enum, and nothing
//! derived from a path, query, user id, heading or body can be expressed in it.

use std::time::Duration;

mod log;
mod metrics;
pub mod request_id;
mod shard;
pub mod trace;

pub use log::{log_intercepted, log_passthrough, log_shadow};
pub use metrics::{InFlightGuard, Metrics};

/// Which intercepted surface answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Surface {
    /// `GET /api/v1/section-source` and `GET /api/v1/note-outline`.
    Rest,
    /// `/mcp`: the view tools' calls and every answer the sidecar gives there itself.
    Mcp,
}

impl Surface {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Surface::Rest => "rest",
            Surface::Mcp => "mcp",
        }
    }
}

/// How an intercepted request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// A view was served.
    Ok,
    /// CORS preflight answered.
    Preflight,
    /// Missing/invalid token, wrong kind or scope.
    Unauthorized,
    /// An agent token without the vault.
    AgentVaultForbidden,
    /// Vault id malformed.
    InvalidVault,
    /// Path failed the rules (wire contract §3).
    InvalidPath,
    /// Vault not allowed by the hosted context.
    VaultForbidden,
    /// Hosted context unavailable and failing closed.
    HostedContextUnavailable,
    /// Rate limited.
    RateLimited,
    /// Too many intercepted requests in flight.
    Overloaded,
    /// No canister configured.
    NotConfigured,
    /// Canister said 401/403.
    UpstreamForbidden,
    /// Canister said 404, or the note is outside the caller's scope.
    NotFound,
    /// Canister answered another non-2xx.
    UpstreamStatus,
    /// The note could not be read or built (not JSON, too large, timeout, ...).
    BadGateway,
    /// MCP: no live session owned by the caller (§6 step 4).
    SessionNotFound,
    /// MCP: `Accept` lacks JSON or SSE (§6 step 5).
    NotAcceptable,
    /// MCP: not a JSON content type or encoding (§6 step 6, door).
    UnsupportedMediaType,
    /// MCP: body or JSON-RPC message refused (§6 door, step 7), header mismatch, batch.
    InvalidRequest,
    /// MCP: unsupported `MCP-Protocol-Version` (§6 step 8).
    UnsupportedProtocolVersion,
    /// MCP: body over the cap.
    PayloadTooLarge,
    /// MCP: the hosted-context lookup failed at `initialize` (§2).
    NoHostedAccess,
    /// MCP: the policy denies the session's role the tool.
    ToolDenied,
    /// MCP: tool arguments refused.
    InvalidArguments,
    /// MCP: the body did not arrive within the read deadline.
    BodyTimeout,
    /// MCP: `resources/read` of a resource the lists hide, answered as unknown.
    ResourceHidden,
    /// MCP: a call asking for a task (`params.task`), which the gateway does not offer.
    TaskRefused,
    /// MCP: an `Origin` that is not allowed, refused before anything else (403).
    OriginRefused,
    /// REST: the policy denies the view (`deny`); answered 404 as a missing route.
    ViewDenied,
}

impl Outcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Preflight => "preflight",
            Outcome::Unauthorized => "unauthorized",
            Outcome::AgentVaultForbidden => "agent_vault_forbidden",
            Outcome::InvalidVault => "invalid_vault",
            Outcome::InvalidPath => "invalid_path",
            Outcome::VaultForbidden => "vault_forbidden",
            Outcome::HostedContextUnavailable => "hosted_context_unavailable",
            Outcome::RateLimited => "rate_limited",
            Outcome::Overloaded => "overloaded",
            Outcome::NotConfigured => "not_configured",
            Outcome::UpstreamForbidden => "upstream_forbidden",
            Outcome::NotFound => "not_found",
            Outcome::UpstreamStatus => "upstream_status",
            Outcome::BadGateway => "bad_gateway",
            Outcome::SessionNotFound => "session_not_found",
            Outcome::NotAcceptable => "not_acceptable",
            Outcome::UnsupportedMediaType => "unsupported_media_type",
            Outcome::InvalidRequest => "invalid_request",
            Outcome::UnsupportedProtocolVersion => "unsupported_protocol_version",
            Outcome::PayloadTooLarge => "payload_too_large",
            Outcome::NoHostedAccess => "no_hosted_access",
            Outcome::ToolDenied => "tool_denied",
            Outcome::InvalidArguments => "invalid_arguments",
            Outcome::BodyTimeout => "body_timeout",
            Outcome::ResourceHidden => "resource_hidden",
            Outcome::TaskRefused => "task_refused",
            Outcome::OriginRefused => "origin_refused",
            Outcome::ViewDenied => "view_denied",
        }
    }
}

/// A status code reduced to its class (`2xx` … `5xx`), the only form that is logged.
pub fn status_class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        500..=599 => "5xx",
        _ => "other",
    }
}

/// What happened to the hosted-context lookup of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum HostedContextEvent {
    /// No lookup (not reached, or no bridge configured).
    #[default]
    None,
    /// Served from the cache.
    Cached,
    /// Looked up successfully.
    Fetched,
    /// Failed, request refused (fail closed).
    FailedDenied,
    /// Failed, fell back to the token's `sub` (operator-enabled).
    FailedFallback,
}

/// Everything recorded about one intercepted request: exactly the fields a log line and
/// the metrics may carry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Intercepted {
    /// Which surface.
    pub surface: Surface,
    /// Which body-free view was asked for, once known (`None` for MCP answers given
    /// before a tool call is read).
    pub view: Option<crate::extract::View>,
    /// How it ended.
    pub outcome: Outcome,
    /// Status sent to the caller.
    pub status: u16,
    /// Status of the one canister read, if it was made.
    pub upstream_status: Option<u16>,
    /// Sections served, on success.
    pub sections: Option<usize>,
    /// Whether the served document was truncated.
    pub truncated: bool,
    /// The hosted-context lookup.
    pub hosted_context: HostedContextEvent,
    /// Why the token was refused, for a 401.
    pub auth_refusal: Option<TokenRefusal>,
    /// Time from request head to response head.
    pub elapsed: Duration,
}

// ---------------------------------------------------------------------------------------
// Metrics and logging.

/// Every metric name starts with this.
pub const METRIC_PREFIX: &str = "knowtation_sidecar_";

/// The status-class label values [`status_class`] can produce.
pub const STATUS_CLASSES: &[&str] = &["1xx", "2xx", "3xx", "4xx", "5xx", "other"];

/// Why the HTTP/1 layer refused a request head itself, before the sidecar saw a request
/// (hyper answers these on its own; the sidecar learns of them when the connection ends).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadRefusal {
    /// A head that does not parse: answered 400.
    Malformed,
    /// A head over `listen.max_header_bytes` or `listen.max_headers`: answered 431 (414
    /// for a request target too long).
    TooLarge,
}

impl HeadRefusal {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            HeadRefusal::Malformed => "malformed",
            HeadRefusal::TooLarge => "too_large",
        }
    }

    /// Every reason, for pre-registering metric series.
    pub const ALL: [HeadRefusal; 2] = [HeadRefusal::Malformed, HeadRefusal::TooLarge];
}

/// Why a bearer token was refused (a 401 on either surface), in words an operator can
/// act on: the label of `tokens_refused_total` and the `auth_reason` field of the access
/// line. Never anything of the token itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenRefusal {
    /// No `Authorization` header.
    Missing,
    /// Not one `Bearer <token>` header, not a JWT of an accepted algorithm, a time claim
    /// that is not a number, or no usable `sub`.
    Malformed,
    /// A well-formed token that none of the configured secrets verifies.
    BadSignature,
    /// No secret is configured to verify it with (`auth.jwt_secrets` is empty).
    UnknownKey,
    /// `exp` has passed.
    Expired,
    /// `nbf` is in the future.
    NotYetValid,
    /// No `exp`, and `auth.require_exp` is on.
    NoExpiry,
    /// A `type` the gateway does not know, or an agent token without the agent `aud`
    /// and `typ`.
    WrongKind,
    /// The token's scopes do not allow the method.
    InsufficientScope,
}

impl TokenRefusal {
    /// Every reason, for pre-registering metric series.
    pub const ALL: [TokenRefusal; 9] = [
        TokenRefusal::Missing,
        TokenRefusal::Malformed,
        TokenRefusal::BadSignature,
        TokenRefusal::UnknownKey,
        TokenRefusal::Expired,
        TokenRefusal::NotYetValid,
        TokenRefusal::NoExpiry,
        TokenRefusal::WrongKind,
        TokenRefusal::InsufficientScope,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenRefusal::Missing => "missing",
            TokenRefusal::Malformed => "malformed",
            TokenRefusal::BadSignature => "bad_signature",
            TokenRefusal::UnknownKey => "unknown_key",
            TokenRefusal::Expired => "expired",
            TokenRefusal::NotYetValid => "not_yet_valid",
            TokenRefusal::NoExpiry => "no_expiry",
            TokenRefusal::WrongKind => "wrong_kind",
            TokenRefusal::InsufficientScope => "insufficient_scope",
        }
    }
}

/// How a token that passed was checked: its signature computed, or its earlier
/// verification remembered (`auth.token_cache_entries`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenCheck {
    /// Decoded and its signature computed.
    Signature,
    /// Verified earlier under the same secrets; its time claims checked again.
    Remembered,
}

impl TokenCheck {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenCheck::Signature => "signature",
            TokenCheck::Remembered => "remembered",
        }
    }

    /// Every kind, for pre-registering metric series.
    pub const ALL: [TokenCheck; 2] = [TokenCheck::Signature, TokenCheck::Remembered];
}

const SURFACES: [Surface; 2] = [Surface::Rest, Surface::Mcp];

const OUTCOMES: [Outcome; 29] = [
    Outcome::Ok,
    Outcome::Preflight,
    Outcome::Unauthorized,
    Outcome::AgentVaultForbidden,
    Outcome::InvalidVault,
    Outcome::InvalidPath,
    Outcome::VaultForbidden,
    Outcome::HostedContextUnavailable,
    Outcome::RateLimited,
    Outcome::Overloaded,
    Outcome::NotConfigured,
    Outcome::UpstreamForbidden,
    Outcome::NotFound,
    Outcome::UpstreamStatus,
    Outcome::BadGateway,
    Outcome::SessionNotFound,
    Outcome::NotAcceptable,
    Outcome::UnsupportedMediaType,
    Outcome::InvalidRequest,
    Outcome::UnsupportedProtocolVersion,
    Outcome::PayloadTooLarge,
    Outcome::NoHostedAccess,
    Outcome::ToolDenied,
    Outcome::InvalidArguments,
    Outcome::BodyTimeout,
    Outcome::ResourceHidden,
    Outcome::TaskRefused,
    Outcome::OriginRefused,
    Outcome::ViewDenied,
];

/// Which upstream a series is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UpstreamName {
    /// The gateway (passthrough and MCP).
    Gateway,
    /// The canister (the note read).
    Canister,
    /// The bridge (the hosted-context lookup).
    Bridge,
}

impl UpstreamName {
    /// Every upstream, for label sets.
    pub const ALL: [UpstreamName; 3] = [
        UpstreamName::Gateway,
        UpstreamName::Canister,
        UpstreamName::Bridge,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamName::Gateway => "gateway",
            UpstreamName::Canister => "canister",
            UpstreamName::Bridge => "bridge",
        }
    }
}

/// Why an MCP session left the table early (not by `DELETE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Eviction {
    /// Idle longer than the session lifetime.
    Idle,
    /// The owner opened more than the per-user cap.
    UserCap,
    /// The table was full.
    GlobalCap,
    /// The gateway answered a call in the session as it answers a session it does not
    /// know (or it was an older session of the same user than one it so answered).
    GatewayDropped,
}

impl Eviction {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Eviction::Idle => "idle",
            Eviction::UserCap => "user_cap",
            Eviction::GlobalCap => "global_cap",
            Eviction::GatewayDropped => "gateway_dropped",
        }
    }
}

const EVICTIONS: [Eviction; 4] = [
    Eviction::Idle,
    Eviction::UserCap,
    Eviction::GlobalCap,
    Eviction::GatewayDropped,
];

/// What the session store failed to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreOp {
    /// Reading a record at start (the record is dropped).
    Load,
    /// Writing a record (the session lives on in memory only).
    Write,
    /// Removing a record.
    Remove,
    /// The writer's queue was full; the change was not written.
    QueueFull,
}

impl StoreOp {
    /// Every value, in label order.
    pub const ALL: [StoreOp; 4] = [
        StoreOp::Load,
        StoreOp::Write,
        StoreOp::Remove,
        StoreOp::QueueFull,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreOp::Load => "load",
            StoreOp::Write => "write",
            StoreOp::Remove => "remove",
            StoreOp::QueueFull => "queue_full",
        }
    }
}

/// How a configuration reload ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reload {
    /// The new configuration is in use.
    Applied,
    /// It was invalid; the previous one stays.
    Refused,
}

impl Reload {
    /// Every value, in label order.
    pub const ALL: [Reload; 2] = [Reload::Applied, Reload::Refused];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Reload::Applied => "applied",
            Reload::Refused => "refused",
        }
    }
}

/// How one shadow-mode comparison of the gateway's answer with the sidecar's own ended
/// (`intercept.mode = "shadow"`). One label per request: the first that applies, in
/// this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Shadow {
    /// The gateway's answer says it has no such route or tool.
    NoRoute,
    /// The gateway could not be reached, broke off or timed out.
    GatewayFailed,
    /// The sidecar's own answer was one of its deliberate limits (429, overloaded) or
    /// the gateway's answer ended early: nothing to compare.
    NotCompared,
    /// The status classes differ (for MCP also result against error).
    StatusClass,
    /// The gateway's answer could not be read as the contract's shape (not JSON, too
    /// large).
    Unreadable,
    /// A value the gateway sent that the sidecar did not holds text of the note's body.
    BodyText,
    /// The gateway sent a field the sidecar's answer does not have.
    ExtraField,
    /// An allowlisted field differs or is missing.
    FieldMismatch,
    /// Same status class and the same allowlisted fields.
    Agree,
}

impl Shadow {
    /// Every value, in label order.
    pub const ALL: [Shadow; 9] = [
        Shadow::Agree,
        Shadow::NoRoute,
        Shadow::GatewayFailed,
        Shadow::NotCompared,
        Shadow::StatusClass,
        Shadow::Unreadable,
        Shadow::BodyText,
        Shadow::ExtraField,
        Shadow::FieldMismatch,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Shadow::Agree => "agree",
            Shadow::NoRoute => "no_route",
            Shadow::GatewayFailed => "gateway_failed",
            Shadow::NotCompared => "not_compared",
            Shadow::StatusClass => "status_class",
            Shadow::Unreadable => "unreadable",
            Shadow::BodyText => "body_text",
            Shadow::ExtraField => "extra_field",
            Shadow::FieldMismatch => "field_mismatch",
        }
    }
}

/// What the sidecar cut out of an answer it passed through (`[sanitize]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sanitized {
    /// A tool result with `isError`: the upstream text after `Upstream <status>`.
    ToolError,
    /// A prompt message: the same.
    PromptError,
    /// A JSON-RPC error message: the same.
    RpcError,
    /// An absolute path in a note tool's result, replaced by the requested path.
    PathReplaced,
    /// An absolute path in a note tool's result, dropped.
    PathDropped,
    /// The body of a REST note route's 5xx answer, replaced.
    RestError,
    /// An MCP message over `sanitize.max_message_bytes`, passed on unread.
    TooLarge,
}

impl Sanitized {
    /// Every kind, in label order.
    pub const ALL: [Sanitized; 7] = [
        Sanitized::ToolError,
        Sanitized::PromptError,
        Sanitized::RpcError,
        Sanitized::PathReplaced,
        Sanitized::PathDropped,
        Sanitized::RestError,
        Sanitized::TooLarge,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Sanitized::ToolError => "tool_error",
            Sanitized::PromptError => "prompt_error",
            Sanitized::RpcError => "rpc_error",
            Sanitized::PathReplaced => "path_replaced",
            Sanitized::PathDropped => "path_dropped",
            Sanitized::RestError => "rest_error",
            Sanitized::TooLarge => "too_large",
        }
    }
}

/// Every eviction-reason label value.
pub fn eviction_labels() -> impl Iterator<Item = &'static str> {
    EVICTIONS.iter().map(|e| e.as_str())
}

/// Every view label value.
pub fn view_labels() -> impl Iterator<Item = &'static str> {
    crate::extract::View::ALL
        .into_iter()
        .map(crate::extract::View::as_str)
}

/// Every outcome label value.
pub fn outcome_labels() -> impl Iterator<Item = &'static str> {
    OUTCOMES.iter().map(|o| o.as_str())
}
