//! Reading one JSON-RPC message as the gateway's SDK will: which messages the sidecar
//! answers, rewrites or learns from, the strict request shape, and the header hints that
//! must agree with the body.

use http::header::{self, HeaderMap};
use serde_json::{Map, Value};

use super::wire::{uri_names_views, view_of_tool, ViewSet};
use super::{echo_id, McpError};
use crate::extract::View;

/// Methods whose answers are rewritten (§6 ACL).
const REWRITTEN: [&str; 3] = ["tools/list", "resources/list", "resources/templates/list"];

/// What the sidecar does with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watched {
    Initialize,
    /// `tools/call` of a view's tool.
    Call(View),
    List(&'static str),
    /// `resources/read` of a URI that names these views' resources: the lists hide
    /// them (unless the view passes), so reading one is answered as the SDK answers an
    /// unknown resource.
    HiddenRead(ViewSet),
}

/// Whether `message` is one the sidecar answers, rewrites or learns from.
pub fn watched(message: &Value) -> Option<Watched> {
    let method = message.get("method")?.as_str()?;
    if method == "initialize" {
        return Some(Watched::Initialize);
    }
    if method == "tools/call" {
        if let Some(view) = message
            .get("params")
            .and_then(|p| p.get("name"))
            .and_then(Value::as_str)
            .and_then(view_of_tool)
        {
            return Some(Watched::Call(view));
        }
    }
    if method == "resources/read" {
        let named = message
            .get("params")
            .and_then(|p| p.get("uri"))
            .and_then(Value::as_str)
            .map_or(ViewSet::NONE, uri_names_views);
        if !named.is_empty() {
            return Some(Watched::HiddenRead(named));
        }
    }
    REWRITTEN
        .iter()
        .find(|m| **m == method)
        .map(|m| Watched::List(m))
}

/// The value of a header that must appear at most once; a repeat or a non-text value is
/// a mismatch (§6 Deviation).
pub(super) fn header_once(
    headers: &HeaderMap,
    name: &'static str,
) -> Result<Option<String>, McpError> {
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
pub(super) fn check_headers(
    headers: &HeaderMap,
    message: &Map<String, Value>,
) -> Result<(), McpError> {
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
pub(super) fn joined(headers: &HeaderMap, name: impl header::AsHeaderName) -> String {
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
pub(super) fn valid_request(
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
    if params.get("_meta").is_some_and(|m| !valid_meta(m)) {
        return Err(McpError::InvalidJsonRpc);
    }
    let id = match message.get("id") {
        None => None,
        Some(v) => Some(echo_id(v).ok_or(McpError::InvalidJsonRpc)?),
    };
    Ok((id, params))
}

/// The SDK's schema of `params._meta` (part of a valid JSON-RPC request): an object whose
/// `progressToken`, if any, is a string or a safe integer (as an id is) and whose
/// related-task entry, if any, is an object with a string `taskId`.
fn valid_meta(meta: &Value) -> bool {
    let Value::Object(meta) = meta else {
        return false;
    };
    let token_ok = meta
        .get("progressToken")
        .is_none_or(|t| echo_id(t).is_some());
    let task_ok = meta
        .get("io.modelcontextprotocol/related-task")
        .is_none_or(|t| t.get("taskId").is_some_and(Value::is_string));
    token_ok && task_ok
}
