//! Every answer the sidecar writes itself on the intercepted surfaces is documented in
//! `docs/daemon.md`, "What callers are told": each REST refusal with its status and exact
//! body, each `/mcp` refusal with its status, JSON-RPC code and exact body, and each
//! `get_section_source` error result with its exact text. The variants are listed here
//! under `match`es without a wildcard, so a new one does not compile until it is added
//! here, and then fails until it is documented.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use knowtation_sidecar::auth::AuthError;
use knowtation_sidecar::budget::Refusal;
use knowtation_sidecar::extract::View;
use knowtation_sidecar::mcp::{tool_name, ArgumentIssue, McpError, ToolFailure};
use knowtation_sidecar::ratelimit::Limited;
use knowtation_sidecar::rest::RestError;

fn section() -> String {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/daemon.md")).unwrap();
    let start = text
        .find("\n## What callers are told\n")
        .expect("docs/daemon.md has a section 'What callers are told'");
    let rest = &text[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
    rest[..end].to_owned()
}

/// The table rows of `section` (lines starting with `|`).
fn rows(section: &str) -> Vec<&str> {
    section.lines().filter(|l| l.starts_with('|')).collect()
}

fn rest_errors() -> Vec<RestError> {
    let all = vec![
        RestError::AgentVaultForbidden,
        RestError::Unauthorized(AuthError::Missing),
        RestError::NotConfigured(View::SectionSource),
        RestError::NotConfigured(View::NoteOutline),
        RestError::Denied,
        RestError::InvalidPath,
        RestError::InvalidVault,
        RestError::VaultForbidden,
        RestError::HostedContextUnavailable,
        RestError::RateLimited(Limited {
            retry_after: Duration::from_secs(1),
        }),
        RestError::Overloaded(Refusal::InFlight),
        RestError::UpstreamForbidden,
        RestError::UpstreamNotFound,
        RestError::UpstreamStatus(500),
        RestError::InvalidNoteResponse,
        RestError::NullNote,
        RestError::OutOfScope,
        RestError::BadGateway,
    ];
    for e in &all {
        match e {
            RestError::AgentVaultForbidden
            | RestError::Unauthorized(_)
            | RestError::NotConfigured(_)
            | RestError::Denied
            | RestError::InvalidPath
            | RestError::InvalidVault
            | RestError::VaultForbidden
            | RestError::HostedContextUnavailable
            | RestError::RateLimited(_)
            | RestError::Overloaded(_)
            | RestError::UpstreamForbidden
            | RestError::UpstreamNotFound
            | RestError::UpstreamStatus(_)
            | RestError::InvalidNoteResponse
            | RestError::NullNote
            | RestError::OutOfScope
            | RestError::BadGateway => {}
        }
    }
    all
}

fn mcp_errors() -> Vec<McpError> {
    let all = vec![
        McpError::InvalidOrigin("<origin>".to_owned()),
        McpError::PayloadTooLarge,
        McpError::UnsupportedEncoding,
        McpError::InvalidBody,
        McpError::BodyTimeout,
        McpError::Overloaded(Refusal::InFlight),
        McpError::BatchRefused,
        McpError::HeaderMismatch,
        McpError::InitializeWithoutId,
        McpError::InvalidVault,
        McpError::Unauthorized(AuthError::Missing),
        McpError::RateLimited,
        McpError::SessionNotFound,
        McpError::NoHostedAccess,
        McpError::NotAcceptable,
        McpError::UnsupportedMediaType,
        McpError::InvalidJsonRpc,
        McpError::UnsupportedProtocolVersion("<version>".to_owned()),
        McpError::BadGateway,
    ];
    for e in &all {
        match e {
            McpError::InvalidOrigin(_)
            | McpError::PayloadTooLarge
            | McpError::UnsupportedEncoding
            | McpError::InvalidBody
            | McpError::BodyTimeout
            | McpError::Overloaded(_)
            | McpError::BatchRefused
            | McpError::HeaderMismatch
            | McpError::InitializeWithoutId
            | McpError::InvalidVault
            | McpError::Unauthorized(_)
            | McpError::RateLimited
            | McpError::SessionNotFound
            | McpError::NoHostedAccess
            | McpError::NotAcceptable
            | McpError::UnsupportedMediaType
            | McpError::InvalidJsonRpc
            | McpError::UnsupportedProtocolVersion(_)
            | McpError::BadGateway => {}
        }
    }
    all
}

fn tool_failures() -> Vec<ToolFailure> {
    let all = vec![
        ToolFailure::Denied,
        ToolFailure::Arguments(ArgumentIssue::ExtraKeys),
        ToolFailure::InvalidPath,
        ToolFailure::Upstream(404),
        ToolFailure::Runtime,
    ];
    for f in &all {
        match f {
            ToolFailure::Denied
            | ToolFailure::Arguments(_)
            | ToolFailure::InvalidPath
            | ToolFailure::Upstream(_)
            | ToolFailure::Runtime => {}
        }
    }
    all
}

/// Whether some row holds every one of `cells`, each in backquotes.
fn documented(rows: &[&str], cells: &[String]) -> bool {
    rows.iter()
        .any(|row| cells.iter().all(|c| row.contains(&format!("`{c}`"))))
}

#[test]
fn every_rest_refusal_is_documented_with_its_status_and_body() {
    let section = section();
    let rows = rows(&section);
    let mut missing = Vec::new();
    for e in rest_errors() {
        let (status, body, outcome) = e.wire();
        let cells = [
            status.as_u16().to_string(),
            body.replace("Upstream 500", "Upstream <status>"),
            outcome.as_str().to_owned(),
        ];
        if !documented(&rows, &cells) {
            missing.push(format!("{e:?}: {cells:?}"));
        }
    }
    assert!(missing.is_empty(), "undocumented:\n{}", missing.join("\n"));
}

#[test]
fn every_mcp_refusal_is_documented_with_its_status_code_and_body() {
    let section = section();
    let rows = rows(&section);
    let mut missing = Vec::new();
    for e in mcp_errors() {
        let (status, body, content_type, outcome) = e.wire();
        let cells = [
            status.as_u16().to_string(),
            body,
            content_type.to_owned(),
            outcome.as_str().to_owned(),
        ];
        if !documented(&rows, &cells) {
            missing.push(format!("{e:?}: {cells:?}"));
        }
    }
    assert!(missing.is_empty(), "undocumented:\n{}", missing.join("\n"));
}

#[test]
fn every_tool_error_result_is_documented_with_its_text() {
    let section = section();
    let rows = rows(&section);
    let mut missing = Vec::new();
    for (f, view) in tool_failures()
        .into_iter()
        .flat_map(|f| View::ALL.map(|view| (f, view)))
    {
        let result: serde_json::Value = serde_json::from_str(&f.result(view)).unwrap();
        assert_eq!(result["isError"], true);
        // The texts that name the tool are documented once, with `<tool>` for its name.
        let text = result["content"][0]["text"]
            .as_str()
            .unwrap()
            .replace(tool_name(view), "<tool>");
        // The argument texts are the SDK's zod issue lists: documented by their prefix.
        let text = match f {
            ToolFailure::Arguments(_) => text[..text.find('[').unwrap()].to_owned() + "[…]",
            ToolFailure::Upstream(_) => text.replace("Upstream 404", "Upstream <status>"),
            _ => text,
        };
        if !documented(&rows, std::slice::from_ref(&text)) {
            missing.push(format!("{f:?}: {text}"));
        }
    }
    assert!(missing.is_empty(), "undocumented:\n{}", missing.join("\n"));
}
