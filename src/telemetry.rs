//! The bounded vocabulary of logs and metrics: every label is a closed enum, and nothing
//! derived from a path, query, user id, heading or body can be expressed in it.

use std::time::Duration;

/// Which intercepted surface answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Surface {
    /// `GET /api/v1/section-source`.
    Rest,
    /// `tools/call` of `get_section_source` on `/mcp`.
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
    /// A SectionSource was served.
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
    /// Time from request head to response head.
    pub elapsed: Duration,
}
