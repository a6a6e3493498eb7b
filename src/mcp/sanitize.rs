//! Sanitizing what the gateway answers on the tools and prompts the sidecar passes
//! through: the note-derived text no caller should get, cut out of JSON-RPC messages
//! without touching anything else of them.
//!
//! The gateway's hosted MCP server (`hub/gateway/mcp-hosted-server.mjs`) turns every
//! failed upstream fetch into `Upstream <status>: <first 200 characters of the upstream
//! body>`, and puts that text in a tool's `isError` result (`{"error":…,"code":…}` as
//! the text), in a prompt's message (`Error: …`) and in the JSON-RPC error of a
//! `resources/read` (`MCP error -32603: …`): canister error bodies and stack traces reach
//! the client. And `get_note`, `relate`, `backlinks` and `list_notes` return the note
//! store's `path` fields verbatim, absolute filesystem paths included.
//!
//! [`Sanitizer::message`] rewrites one message (or a batch of them):
//!
//! - in a tool result with `isError: true`, each text content item: the `error` string
//!   of the gateway's JSON envelope, or the whole text when it is no such envelope, keeps
//!   what comes before and including `Upstream <status>` and loses what follows;
//! - in a prompt's result (`messages`), each text content the same way;
//! - in a JSON-RPC error, `error.message` the same way;
//! - in a successful tool result of `get_note`, `relate`, `backlinks` or `list_notes`
//!   (known from the request it answers), a `path` field holding an absolute path
//!   (POSIX `/…`, Windows `C:\…` or `C:/…`, UNC `\\…`) at the top of the text's document
//!   becomes the vault-relative path the caller asked for, and one in the entries of
//!   `related`, `backlinks` or `notes` is dropped, as is a top-level one when the caller
//!   asked for none that is vault-relative. Where the request is not known (a replayed
//!   event stream), every successful tool result is read so.
//!
//! Everything else of a message stays byte for byte: objects are edited in place, keys
//! in their order, other values as raw text. A message that is not JSON is left alone.
//! What was removed is never logged or counted beyond its kind ([`Counts`]).

use std::collections::HashMap;

use serde_json::value::RawValue;
use serde_json::Value;

use super::wire::{echo_id, Ordered};

/// What the sanitizer does; the `[sanitize]` settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Cut the text after `Upstream <status>` in tool errors, prompts and JSON-RPC errors.
    pub upstream_errors: bool,
    /// Replace or drop absolute paths in the note tools' `path` fields.
    pub note_paths: bool,
    /// The most of one message (an event's data, a JSON answer) held to rewrite it.
    pub max_message_bytes: usize,
}

impl Settings {
    /// Whether any message rewrite is on.
    pub fn any(self) -> bool {
        self.upstream_errors || self.note_paths
    }
}

/// The note tools whose results carry the note store's paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NoteTool {
    GetNote,
    Relate,
    Backlinks,
    ListNotes,
}

impl NoteTool {
    fn of(name: &str) -> Option<NoteTool> {
        match name {
            "get_note" => Some(NoteTool::GetNote),
            "relate" => Some(NoteTool::Relate),
            "backlinks" => Some(NoteTool::Backlinks),
            "list_notes" => Some(NoteTool::ListNotes),
            _ => None,
        }
    }
}

/// What one request asked for, as far as its answer's rewrite needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Call {
    /// `Some` for a note tool.
    tool: Option<NoteTool>,
    /// The vault-relative path the caller asked for, when it asked for one.
    requested: Option<String>,
}

/// How many places of each kind were rewritten.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Tool results with `isError` whose upstream text was cut.
    pub tool_errors: u64,
    /// Prompt messages whose upstream text was cut.
    pub prompt_errors: u64,
    /// JSON-RPC errors whose upstream text was cut.
    pub rpc_errors: u64,
    /// Absolute paths replaced by the requested path.
    pub paths_replaced: u64,
    /// Absolute paths dropped.
    pub paths_dropped: u64,
}

impl Counts {
    /// Whether nothing was rewritten.
    pub fn is_empty(&self) -> bool {
        *self == Counts::default()
    }
}

/// Rewrites the answers to one forwarded request (or to requests not known: a replayed
/// event stream).
#[derive(Debug, Clone)]
pub struct Sanitizer {
    settings: Settings,
    /// Echoed request id → what the request asked for; `None`: not known.
    calls: Option<HashMap<String, Call>>,
}

impl Sanitizer {
    /// For the answers to `message` (one JSON-RPC message or a batch), as forwarded.
    pub fn for_request(settings: Settings, message: &Value) -> Sanitizer {
        let mut calls = HashMap::new();
        let items: &[Value] = match message {
            Value::Array(items) => items,
            one => std::slice::from_ref(one),
        };
        for m in items {
            let Some(id) = m.get("id").and_then(echo_id) else {
                continue;
            };
            let params = m.get("params");
            let is_call = m.get("method").and_then(Value::as_str) == Some("tools/call");
            let tool = params
                .and_then(|p| p.get("name"))
                .and_then(Value::as_str)
                .filter(|_| is_call)
                .and_then(NoteTool::of);
            let requested = params
                .and_then(|p| p.get("arguments"))
                .and_then(|a| a.get("path"))
                .and_then(Value::as_str)
                .map(vault_path_key)
                .filter(|p| !p.is_empty() && !is_absolute_path(p));
            calls.insert(id, Call { tool, requested });
        }
        Sanitizer {
            settings,
            calls: Some(calls),
        }
    }

    /// For answers whose requests are not known (an event stream replayed on `GET`).
    pub fn unknown(settings: Settings) -> Sanitizer {
        Sanitizer {
            settings,
            calls: None,
        }
    }

    /// The settings it applies.
    pub fn settings(&self) -> Settings {
        self.settings
    }

    /// `text` (one JSON-RPC message, or a batch of them) rewritten; `None` when nothing
    /// changed or it is not JSON.
    pub fn message(&self, text: &str, counts: &mut Counts) -> Option<String> {
        if !self.settings.any() {
            return None;
        }
        let trimmed = text.trim_start();
        if trimmed.starts_with('[') {
            let items: Vec<Box<RawValue>> = serde_json::from_str(text).ok()?;
            let mut changed = false;
            let parts: Vec<String> = items
                .iter()
                .map(|item| match self.one(item.get(), counts) {
                    Some(new) => {
                        changed = true;
                        new
                    }
                    None => item.get().to_owned(),
                })
                .collect();
            return changed.then(|| format!("[{}]", parts.join(",")));
        }
        self.one(text, counts)
    }

    /// One message rewritten, or `None`.
    fn one(&self, text: &str, counts: &mut Counts) -> Option<String> {
        let mut msg = Ordered::parse(text)?;
        let id = msg
            .get("id")
            .and_then(|v| serde_json::from_str::<Value>(v.get()).ok())
            .and_then(|v| echo_id(&v));
        let mut changed = false;
        if self.settings.upstream_errors {
            if let Some(error) = msg.get("error").and_then(|e| Ordered::parse(e.get())) {
                if let Some(new) = edit_string_field(error, "message", cut_upstream) {
                    msg.set("error", new);
                    counts.rpc_errors += 1;
                    changed = true;
                }
            }
        }
        if let Some(mut result) = msg.get("result").and_then(|r| Ordered::parse(r.get())) {
            let call = match (&self.calls, &id) {
                (Some(calls), Some(id)) => calls.get(id).cloned(),
                _ => None,
            };
            if self.result(&mut result, call.as_ref(), counts) {
                if let Ok(raw) = RawValue::from_string(result.to_json()) {
                    msg.set("result", raw);
                    changed = true;
                }
            }
        }
        changed.then(|| msg.to_json())
    }

    /// Rewrites a result in place; whether it changed.
    fn result(&self, result: &mut Ordered, call: Option<&Call>, counts: &mut Counts) -> bool {
        let is_error = result
            .get("isError")
            .is_some_and(|v| v.get().trim() == "true");
        if result.get("content").is_some() {
            if is_error {
                if !self.settings.upstream_errors {
                    return false;
                }
                let changed = edit_content(result, "content", &mut |text| cut_tool_error(text));
                if changed {
                    counts.tool_errors += 1;
                }
                return changed;
            }
            if !self.settings.note_paths {
                return false;
            }
            // A note tool's result, or any tool's where the request is not known.
            let (applies, requested) = match (&self.calls, call) {
                (None, _) => (true, None),
                (Some(_), Some(c)) => (c.tool.is_some(), c.requested.as_deref()),
                (Some(_), None) => (false, None),
            };
            if !applies {
                return false;
            }
            let mut local = Counts::default();
            let changed = edit_content(result, "content", &mut |text| {
                note_paths(text, requested, &mut local)
            });
            counts.paths_replaced += local.paths_replaced;
            counts.paths_dropped += local.paths_dropped;
            return changed;
        }
        if self.settings.upstream_errors && result.get("messages").is_some() {
            let changed = edit_prompt_messages(result);
            if changed {
                counts.prompt_errors += 1;
            }
            return changed;
        }
        false
    }
}

/// The gateway's `vaultPathKey`: `\` read as `/`, trimmed.
fn vault_path_key(p: &str) -> String {
    crate::js::trim(&p.replace('\\', "/")).to_owned()
}

/// Whether `s` is an absolute filesystem path: POSIX (`/…`), Windows with a drive
/// (`C:\…`, `C:/…`) or a UNC or root-relative one (`\…`).
pub fn is_absolute_path(s: &str) -> bool {
    let b = s.as_bytes();
    matches!(b.first(), Some(b'/' | b'\\'))
        || matches!(b, [d, b':', b'/' | b'\\', ..] if d.is_ascii_alphabetic())
}

/// `text` cut after its first `Upstream <three digits>` that a `:` follows; `None` when
/// there is none.
pub fn cut_upstream(text: &str) -> Option<String> {
    const NEEDLE: &str = "Upstream ";
    let mut from = 0;
    while let Some(at) = text.get(from..).and_then(|t| t.find(NEEDLE)) {
        let start = from + at;
        let digits = start + NEEDLE.len();
        let tail = text.as_bytes().get(digits..).unwrap_or_default();
        if tail.len() >= 4 && tail[..3].iter().all(u8::is_ascii_digit) && tail[3] == b':' {
            return text.get(..digits + 3).map(str::to_owned);
        }
        from = digits;
    }
    None
}

/// A tool error's text: the gateway's envelope (`{"error":…,"code":…}`) with its
/// `error` cut, or the plain text cut.
fn cut_tool_error(text: &str) -> Option<String> {
    if let Some(envelope) = Ordered::parse(text) {
        let raw = edit_string_field(envelope, "error", cut_upstream)?;
        return Some(raw.get().to_owned());
    }
    cut_upstream(text)
}

/// `object` with its string field `key` passed through `edit`, as raw JSON; `None` when
/// the field is absent, not a string, or unchanged.
fn edit_string_field(
    mut object: Ordered,
    key: &str,
    edit: impl Fn(&str) -> Option<String>,
) -> Option<Box<RawValue>> {
    let value: String = serde_json::from_str(object.get(key)?.get()).ok()?;
    let new = edit(&value)?;
    object.set(
        key,
        RawValue::from_string(serde_json::to_string(&new).ok()?).ok()?,
    );
    RawValue::from_string(object.to_json()).ok()
}

/// Applies `edit` to the `text` of each `type: "text"` item of the array `key`; whether
/// any changed.
fn edit_content(
    result: &mut Ordered,
    key: &str,
    edit: &mut dyn FnMut(&str) -> Option<String>,
) -> bool {
    let Some(items) = result
        .get(key)
        .and_then(|c| serde_json::from_str::<Vec<Box<RawValue>>>(c.get()).ok())
    else {
        return false;
    };
    let mut changed = false;
    let mut out: Vec<String> = Vec::with_capacity(items.len());
    for item in &items {
        match edit_text_item(item, edit) {
            Some(new) => {
                changed = true;
                out.push(new);
            }
            None => out.push(item.get().to_owned()),
        }
    }
    if !changed {
        return false;
    }
    match RawValue::from_string(format!("[{}]", out.join(","))) {
        Ok(raw) => {
            result.set(key, raw);
            true
        }
        Err(_) => false,
    }
}

/// One content item `{"type":"text","text":…}` with its text edited, as JSON text.
fn edit_text_item(item: &RawValue, edit: &mut dyn FnMut(&str) -> Option<String>) -> Option<String> {
    let mut o = Ordered::parse(item.get())?;
    let kind: String = serde_json::from_str(o.get("type")?.get()).ok()?;
    if kind != "text" {
        return None;
    }
    let text: String = serde_json::from_str(o.get("text")?.get()).ok()?;
    let new = edit(&text)?;
    o.set(
        "text",
        RawValue::from_string(serde_json::to_string(&new).ok()?).ok()?,
    );
    Some(o.to_json())
}

/// A prompt result's `messages`, each `content` (one item, or a list) with its upstream
/// text cut; whether any changed.
fn edit_prompt_messages(result: &mut Ordered) -> bool {
    let Some(messages) = result
        .get("messages")
        .and_then(|m| serde_json::from_str::<Vec<Box<RawValue>>>(m.get()).ok())
    else {
        return false;
    };
    let mut changed = false;
    let mut out = Vec::with_capacity(messages.len());
    for m in &messages {
        let edited = Ordered::parse(m.get()).and_then(|mut o| {
            let content = o.get("content")?;
            let new = if content.get().trim_start().starts_with('[') {
                let mut holder = Ordered(vec![("c".to_owned(), content.to_owned())]);
                edit_content(&mut holder, "c", &mut |t| cut_upstream(t))
                    .then(|| holder.get("c").map(ToOwned::to_owned))
                    .flatten()?
            } else {
                RawValue::from_string(edit_text_item(content, &mut |t| cut_upstream(t))?).ok()?
            };
            o.set("content", new);
            Some(o.to_json())
        });
        match edited {
            Some(new) => {
                changed = true;
                out.push(new);
            }
            None => out.push(m.get().to_owned()),
        }
    }
    if !changed {
        return false;
    }
    match RawValue::from_string(format!("[{}]", out.join(","))) {
        Ok(raw) => {
            result.set("messages", raw);
            true
        }
        Err(_) => false,
    }
}

/// A note tool's text (the gateway's `JSON.stringify` of a document): an absolute
/// top-level `path` replaced by `requested` (dropped without one), an absolute `path`
/// of an entry of `related`, `backlinks` or `notes` dropped. `None` when unchanged or
/// not a JSON object.
fn note_paths(text: &str, requested: Option<&str>, counts: &mut Counts) -> Option<String> {
    let mut doc = Ordered::parse(text)?;
    let mut changed = false;
    if let Some(p) = doc
        .get("path")
        .and_then(|p| serde_json::from_str::<String>(p.get()).ok())
    {
        if is_absolute_path(&p) {
            changed = true;
            match requested.and_then(|r| serde_json::to_string(r).ok()) {
                Some(r) => {
                    if let Ok(raw) = RawValue::from_string(r) {
                        doc.set("path", raw);
                        counts.paths_replaced += 1;
                    }
                }
                None => {
                    doc.remove("path");
                    counts.paths_dropped += 1;
                }
            }
        }
    }
    for list in ["related", "backlinks", "notes"] {
        let Some(items) = doc
            .get(list)
            .and_then(|l| serde_json::from_str::<Vec<Box<RawValue>>>(l.get()).ok())
        else {
            continue;
        };
        let mut list_changed = false;
        let out: Vec<String> = items
            .iter()
            .map(|item| {
                let Some(mut o) = Ordered::parse(item.get()) else {
                    return item.get().to_owned();
                };
                let absolute = o
                    .get("path")
                    .and_then(|p| serde_json::from_str::<String>(p.get()).ok())
                    .is_some_and(|p| is_absolute_path(&p));
                if !absolute {
                    return item.get().to_owned();
                }
                o.remove("path");
                counts.paths_dropped += 1;
                list_changed = true;
                o.to_json()
            })
            .collect();
        if list_changed {
            if let Ok(raw) = RawValue::from_string(format!("[{}]", out.join(","))) {
                doc.set(list, raw);
                changed = true;
            }
        }
    }
    changed.then(|| doc.to_json())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    const ON: Settings = Settings {
        upstream_errors: true,
        note_paths: true,
        max_message_bytes: 1 << 20,
    };

    /// The gateway's `jsonError(e.message, 'UPSTREAM_ERROR')` of an upstream failure, as
    /// the SDK frames the result.
    fn gateway_tool_error(id: u64, status: u16, body: &str) -> String {
        let message = format!("Upstream {status}: {}", &body[..body.len().min(200)]);
        // `JSON.stringify({ error: msg, code })`: the keys in that order.
        let text = format!(
            r#"{{"error":{},"code":"UPSTREAM_ERROR"}}"#,
            serde_json::to_string(&message).unwrap()
        );
        format!(
            r#"{{"result":{{"content":[{{"type":"text","text":{}}}],"isError":true}},"jsonrpc":"2.0","id":{id}}}"#,
            serde_json::to_string(&text).unwrap()
        )
    }

    fn call(name: &str, path: &str) -> Value {
        json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":name,"arguments":{"path":path}}})
    }

    #[test]
    fn upstream_text_is_cut_after_the_status() {
        assert_eq!(
            cut_upstream("Upstream 500: CANARY at /srv/x.js:1").as_deref(),
            Some("Upstream 500")
        );
        assert_eq!(
            cut_upstream("Error: Upstream 404: {\"e\":1}").as_deref(),
            Some("Error: Upstream 404")
        );
        assert_eq!(
            cut_upstream("MCP error -32603: Upstream 502: <html>").as_deref(),
            Some("MCP error -32603: Upstream 502")
        );
        // Already sanitized, or no status: nothing to cut.
        for text in [
            "Upstream 500",
            "Upstream x: y",
            "Upstream 5000: y",
            "fine",
            "",
        ] {
            assert_eq!(cut_upstream(text), None, "{text}");
        }
        assert_eq!(
            cut_upstream("Upstream soon, then Upstream 503: b").as_deref(),
            Some("Upstream soon, then Upstream 503")
        );
    }

    #[test]
    fn a_tool_error_keeps_only_the_status_in_the_gateways_envelope() {
        let s = Sanitizer::for_request(ON, &call("get_note", "a.md"));
        let mut counts = Counts::default();
        let out = s
            .message(
                &gateway_tool_error(1, 500, "CANARY stack trace"),
                &mut counts,
            )
            .unwrap();
        assert_eq!(
            out,
            r#"{"result":{"content":[{"type":"text","text":"{\"error\":\"Upstream 500\",\"code\":\"UPSTREAM_ERROR\"}"}],"isError":true},"jsonrpc":"2.0","id":1}"#
        );
        assert_eq!(counts.tool_errors, 1);
        // A plain-text error is cut the same way; other errors stay.
        let plain = r#"{"result":{"content":[{"type":"text","text":"Upstream 401: CANARY"}],"isError":true},"jsonrpc":"2.0","id":1}"#;
        assert!(!s.message(plain, &mut counts).unwrap().contains("CANARY"));
        let other = r#"{"result":{"content":[{"type":"text","text":"{\"error\":\"Invalid path\",\"code\":\"UPSTREAM_ERROR\"}"}],"isError":true},"jsonrpc":"2.0","id":1}"#;
        assert_eq!(s.message(other, &mut counts), None);
        // Switched off: left alone.
        let off = Sanitizer::for_request(
            Settings {
                upstream_errors: false,
                ..ON
            },
            &call("get_note", "a.md"),
        );
        assert_eq!(
            off.message(&gateway_tool_error(1, 500, "CANARY"), &mut counts),
            None
        );
    }

    #[test]
    fn prompts_and_rpc_errors_are_cut_too() {
        let s = Sanitizer::unknown(ON);
        let mut counts = Counts::default();
        let prompt = r#"{"result":{"description":"Daily brief","messages":[{"role":"user","content":{"type":"text","text":"Error loading notes: Upstream 500: CANARY"}}]},"jsonrpc":"2.0","id":"p"}"#;
        assert_eq!(
            s.message(prompt, &mut counts).unwrap(),
            r#"{"result":{"description":"Daily brief","messages":[{"role":"user","content":{"type":"text","text":"Error loading notes: Upstream 500"}}]},"jsonrpc":"2.0","id":"p"}"#
        );
        let read = r#"{"jsonrpc":"2.0","id":3,"error":{"code":-32603,"message":"MCP error -32603: Upstream 404: CANARY"}}"#;
        assert_eq!(
            s.message(read, &mut counts).unwrap(),
            r#"{"jsonrpc":"2.0","id":3,"error":{"code":-32603,"message":"MCP error -32603: Upstream 404"}}"#
        );
        assert_eq!((counts.prompt_errors, counts.rpc_errors), (1, 1));
        // A batch: each answer on its own.
        let batch = format!("[{prompt},{read}]");
        assert!(!s.message(&batch, &mut counts).unwrap().contains("CANARY"));
        assert_eq!(s.message("not json", &mut counts), None);
    }

    #[test]
    fn absolute_note_paths_become_the_requested_path_or_go() {
        let mut counts = Counts::default();
        let answer = |text: &str| {
            format!(
                r#"{{"result":{{"content":[{{"type":"text","text":{}}}]}},"jsonrpc":"2.0","id":1}}"#,
                serde_json::to_string(text).unwrap()
            )
        };
        let text_of = |m: &str| -> Value {
            let v: Value = serde_json::from_str(m).unwrap();
            serde_json::from_str(v["result"]["content"][0]["text"].as_str().unwrap()).unwrap()
        };
        let note = r#"{"path":"/Users/private/vault/inbox/a.md","frontmatter":{},"body":"x"}"#;
        let s = Sanitizer::for_request(ON, &call("get_note", "inbox\\a.md "));
        let out = s.message(&answer(note), &mut counts).unwrap();
        assert_eq!(
            text_of(&out),
            json!({"path":"inbox/a.md","frontmatter":{},"body":"x"})
        );
        // Windows and UNC paths too; the caller asked for an absolute path: dropped.
        for abs in [
            "C:\\\\vault\\\\a.md",
            "c:/vault/a.md",
            "\\\\\\\\srv\\\\share\\\\a.md",
        ] {
            let note = format!(r#"{{"path":"{abs}","body":"x"}}"#);
            let s = Sanitizer::for_request(ON, &call("get_note", "/etc/passwd"));
            let out = s.message(&answer(&note), &mut counts).unwrap();
            assert_eq!(text_of(&out), json!({"body":"x"}), "{abs}");
        }
        // relate and backlinks: entries' absolute paths go, relative ones stay.
        let related = r#"{"path":"/srv/v/a.md","related":[{"path":"/srv/v/b.md","score":1},{"path":"c.md","score":0.5}]}"#;
        let s = Sanitizer::for_request(ON, &call("relate", "a.md"));
        let out = s.message(&answer(related), &mut counts).unwrap();
        assert_eq!(
            text_of(&out),
            json!({"path":"a.md","related":[{"score":1},{"path":"c.md","score":0.5}]})
        );
        let list = r#"{"notes":[{"path":"/srv/v/b.md","title":"B"}],"total":1}"#;
        let s = Sanitizer::for_request(
            ON,
            &json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_notes","arguments":{}}}),
        );
        let out = s.message(&answer(list), &mut counts).unwrap();
        assert_eq!(text_of(&out), json!({"notes":[{"title":"B"}],"total":1}));
        // Another tool's result is not a note tool's; a relative path stays.
        let s = Sanitizer::for_request(ON, &call("search", "a.md"));
        assert_eq!(s.message(&answer(note), &mut counts), None);
        let s = Sanitizer::for_request(ON, &call("get_note", "a.md"));
        assert_eq!(
            s.message(&answer(r#"{"path":"a.md","body":"x"}"#), &mut counts),
            None
        );
        assert_eq!(counts.paths_replaced, 2);
        assert_eq!(counts.paths_dropped, 5);
    }

    #[test]
    fn absolute_paths_are_told_apart() {
        for p in ["/a", "\\a", "C:\\a", "z:/a", "\\\\srv\\s"] {
            assert!(is_absolute_path(p), "{p}");
        }
        for p in ["a.md", "inbox/a.md", "C:a.md", "1:/a", "", ".//a"] {
            assert!(!is_absolute_path(p), "{p}");
        }
    }
}
