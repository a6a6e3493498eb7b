//! The log lines of each answer: route class, surface, outcome, status classes, timings
//! and counts, never content.

use std::time::Duration;

use super::{status_class, Intercepted, Shadow, Surface};

/// Logs one intercepted request: its request id, surface, view, outcome, status class,
/// upstream status class, elapsed milliseconds, heading count and truncation, why a token
/// was refused (a 401 only), and nothing else.
pub fn log_intercepted(i: &Intercepted) {
    super::trace::record_outcome(
        i.surface.as_str(),
        i.outcome.as_str(),
        i.auth_refusal.map(|r| r.as_str()),
    );
    if !crate::logging::access_logged(i.status) {
        return;
    }
    let id = super::request_id::current();
    tracing::info!(
        route = "intercepted",
        request_id = id.as_ref().and_then(|v| v.to_str().ok()),
        surface = i.surface.as_str(),
        view = i.view.map_or("none", crate::extract::View::as_str),
        outcome = i.outcome.as_str(),
        status_class = status_class(i.status),
        upstream_status_class = i.upstream_status.map(status_class).unwrap_or("none"),
        elapsed_ms = elapsed_ms(i.elapsed),
        sections = i.sections.unwrap_or(0),
        truncated = i.truncated,
        auth_reason = i.auth_refusal.map(|r| r.as_str()),
        "request"
    );
}

/// Logs one shadow-mode comparison: the request id, the surface and the result label only, never what
/// either answer said (a disagreement at `warn`, so it shows at the default level).
pub fn log_shadow(surface: Surface, result: Shadow) {
    let id = super::request_id::current();
    let request_id = id.as_ref().and_then(|v| v.to_str().ok());
    if result == Shadow::Agree {
        tracing::debug!(
            request_id,
            surface = surface.as_str(),
            result = result.as_str(),
            "shadow"
        );
    } else {
        tracing::warn!(
            request_id,
            surface = surface.as_str(),
            result = result.as_str(),
            "shadow"
        );
    }
}

/// Logs one passed-through request: request id, route class, status class and elapsed
/// only.
pub fn log_passthrough(status: u16, elapsed: Duration) {
    if !crate::logging::access_logged(status) {
        return;
    }
    let id = super::request_id::current();
    tracing::info!(
        route = "passthrough",
        request_id = id.as_ref().and_then(|v| v.to_str().ok()),
        status_class = status_class(status),
        elapsed_ms = elapsed_ms(elapsed),
        "request"
    );
}

fn elapsed_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
