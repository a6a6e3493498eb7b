//! JSON-RPC and SSE text as the TypeScript SDK writes it (wire contract §6): request ids,
//! message framing, and the raw-preserving rewrite of list answers.

use std::collections::HashMap;
use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::policy::{view_index, ViewMode};
use super::Policy;
use crate::extract::View;

/// The SectionSource tool.
pub const TOOL_NAME: &str = "get_section_source";

/// The SectionSource tool's descriptor, exactly as the SDK lists it (§6).
pub const TOOL_DESCRIPTOR: &str = r#"{"name":"get_section_source","description":"Return body-free SectionSource v0 metadata for one hosted note.","inputSchema":{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","properties":{"path":{"type":"string","description":"Vault-relative note path"}},"required":["path"]},"execution":{"taskSupport":"forbidden"}}"#;

/// The NoteOutline tool.
pub const NOTE_OUTLINE_TOOL: &str = "get_note_outline";

/// The NoteOutline tool's descriptor, as the SDK lists a tool registered with the same
/// input schema as `get_section_source`.
pub const NOTE_OUTLINE_DESCRIPTOR: &str = r#"{"name":"get_note_outline","description":"Return the body-free NoteOutline v1 (headings only) for one hosted note.","inputSchema":{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","properties":{"path":{"type":"string","description":"Vault-relative note path"}},"required":["path"]},"execution":{"taskSupport":"forbidden"}}"#;

/// The DocumentTree tool.
pub const DOCUMENT_TREE_TOOL: &str = "get_document_tree";

/// The DocumentTree tool's descriptor, as the SDK lists a tool registered with the same
/// input schema as `get_section_source`.
pub const DOCUMENT_TREE_DESCRIPTOR: &str = r#"{"name":"get_document_tree","description":"Return the body-free DocumentTree v0 (headings nested by level) for one hosted note.","inputSchema":{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","properties":{"path":{"type":"string","description":"Vault-relative note path"}},"required":["path"]},"execution":{"taskSupport":"forbidden"}}"#;

/// The MCP tool that serves `view`.
pub fn tool_name(view: View) -> &'static str {
    match view {
        View::SectionSource => TOOL_NAME,
        View::NoteOutline => NOTE_OUTLINE_TOOL,
        View::DocumentTree => DOCUMENT_TREE_TOOL,
    }
}

/// The descriptor of the tool that serves `view`.
pub fn tool_descriptor(view: View) -> &'static str {
    match view {
        View::SectionSource => TOOL_DESCRIPTOR,
        View::NoteOutline => NOTE_OUTLINE_DESCRIPTOR,
        View::DocumentTree => DOCUMENT_TREE_DESCRIPTOR,
    }
}

/// The view a tool name serves, compared exactly (as the SDK looks tools up).
pub fn view_of_tool(name: &str) -> Option<View> {
    View::ALL.into_iter().find(|v| tool_name(*v) == name)
}

/// A set of views.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ViewSet(u8);

impl ViewSet {
    /// Every view.
    pub const ALL: ViewSet = ViewSet(0b111);

    /// No view.
    pub const NONE: ViewSet = ViewSet(0);

    /// The set holding only `view`.
    pub fn of(view: View) -> ViewSet {
        ViewSet(1 << view_index(view))
    }

    /// Whether `view` is in the set.
    pub fn contains(self, view: View) -> bool {
        self.0 & ViewSet::of(view).0 != 0
    }

    /// The set with `view` added.
    #[must_use]
    pub fn with(self, view: View) -> ViewSet {
        ViewSet(self.0 | ViewSet::of(view).0)
    }

    /// Whether the sets share a view.
    pub fn meets(self, other: ViewSet) -> bool {
        self.0 & other.0 != 0
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The views in the set, in [`View::ALL`] order.
    pub fn iter(self) -> impl Iterator<Item = View> {
        View::ALL.into_iter().filter(move |v| self.contains(*v))
    }
}

/// What a list rewrite does with one view's tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listed {
    /// Leave it as the gateway lists it (and its resources): the view passes.
    Keep,
    /// Listed: added on the last page when the gateway lacks it.
    Show,
    /// Not listed: removed.
    Hide,
}

/// What a list rewrite does with each view's tool and resources (§6 ACL): a view's
/// resources are removed unless the view passes ([`Listed::Keep`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listing([Listed; 3]);

impl Listing {
    /// Every view owned: all shown (`allowed`) or all hidden.
    pub const fn all(allowed: bool) -> Listing {
        Listing([if allowed { Listed::Show } else { Listed::Hide }; 3])
    }

    /// Each view's treatment, in [`View::ALL`] order.
    pub const fn new(each: [Listed; 3]) -> Listing {
        Listing(each)
    }

    /// Per `policy`, for a session whose role `allowed` says whether it may use the
    /// views the sidecar owns: owned views shown or hidden, denied ones hidden, passed
    /// ones kept.
    pub fn for_policy(policy: &Policy, allowed: bool) -> Listing {
        let mut l = Listing::all(allowed);
        for v in View::ALL {
            l.0[view_index(v)] = match policy.mode(v) {
                ViewMode::Own if allowed => Listed::Show,
                ViewMode::Own | ViewMode::Deny => Listed::Hide,
                ViewMode::Pass => Listed::Keep,
            };
        }
        l
    }

    /// Per `policy` in shadow mode, where the gateway answers the views the sidecar
    /// owns: only denied views are hidden. `None` when nothing is.
    pub fn for_shadow(policy: &Policy) -> Option<Listing> {
        let mut l = Listing([Listed::Keep; 3]);
        for v in View::ALL {
            if policy.mode(v) == ViewMode::Deny {
                l.0[view_index(v)] = Listed::Hide;
            }
        }
        (l != Listing([Listed::Keep; 3])).then_some(l)
    }

    /// What happens to `view`'s tool.
    pub fn of(self, view: View) -> Listed {
        self.0[view_index(view)]
    }

    /// The views whose resources are removed: every view that does not pass.
    pub fn hidden_resources(self) -> ViewSet {
        View::ALL
            .into_iter()
            .filter(|v| self.of(*v) != Listed::Keep)
            .fold(ViewSet::NONE, ViewSet::with)
    }
}

/// Largest integer JavaScript represents exactly (`Number.MAX_SAFE_INTEGER`).
const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_991.0;

/// The id as the SDK echoes it: a string unchanged, a safe integer as JavaScript prints
/// it (`1.0` → `1`, `1e2` → `100`, `-0` → `0`). `None` for anything the SDK's
/// `RequestIdSchema` refuses (§6 step 7).
pub fn echo_id(id: &Value) -> Option<String> {
    match id {
        Value::String(s) => serde_json::to_string(s).ok(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                return (i.unsigned_abs() <= MAX_SAFE_INTEGER as u64).then(|| i.to_string());
            }
            if let Some(u) = n.as_u64() {
                return (u <= MAX_SAFE_INTEGER as u64).then(|| u.to_string());
            }
            let f = n.as_f64()?;
            if f.fract() != 0.0 || f.abs() > MAX_SAFE_INTEGER {
                return None;
            }
            // In range and integral, so the cast is exact; `+ 0` would not fix -0, the
            // integer does.
            Some((f as i64).to_string())
        }
        _ => None,
    }
}

/// One SSE message as the SDK frames it: `event: message`, one `data:` line, a blank line.
pub fn sse_event(json: &str) -> String {
    format!("event: message\ndata: {json}\n\n")
}

/// [`sse_event`] of a success message with the SDK's key order,
/// `{"result":…,"jsonrpc":"2.0","id":…}`, written once into a buffer of its length: a
/// result may be megabytes.
pub fn sse_result(result: &str, id: &str) -> String {
    const PARTS: [&str; 3] = [
        "event: message\ndata: {\"result\":",
        r#","jsonrpc":"2.0","id":"#,
        "}\n\n",
    ];
    let mut out = String::with_capacity(
        PARTS.iter().map(|p| p.len()).sum::<usize>() + result.len() + id.len(),
    );
    out.push_str(PARTS[0]);
    out.push_str(result);
    out.push_str(PARTS[1]);
    out.push_str(id);
    out.push_str(PARTS[2]);
    out
}

/// The SDK's error for a `resources/read` URI that no resource matches, with its key
/// order `{"jsonrpc":"2.0","id":…,"error":…}` (§6). The URI is echoed as the client sent
/// it, where the SDK prints its WHATWG-normalized form.
pub fn unknown_resource_message(uri: &str, id: &str) -> String {
    error_message(
        -32602,
        &format!("MCP error -32602: Resource {uri} not found"),
        id,
    )
}

/// A JSON-RPC error message with the SDK's key order, `{"jsonrpc":"2.0","id":…,"error":…}`.
pub fn error_message(code: i64, message: &str, id: &str) -> String {
    let error = serde_json::json!({ "code": code, "message": message });
    format!(r#"{{"jsonrpc":"2.0","id":{id},"error":{error}}}"#)
}

/// A JSON object kept as written: keys in order, values as raw text; a repeated key
/// keeps its first place and its last value (as `JSON.parse` does).
pub struct Ordered(pub Vec<(String, Box<RawValue>)>);

impl Ordered {
    /// Parses `text` when it is a JSON object.
    pub fn parse(text: &str) -> Option<Ordered> {
        serde_json::from_str(text).ok()
    }

    /// The raw value of `key`.
    pub fn get(&self, key: &str) -> Option<&RawValue> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| &**v)
    }

    /// Replaces the value of `key` (which must exist).
    pub fn set(&mut self, key: &str, value: Box<RawValue>) {
        if let Some(slot) = self.0.iter_mut().find(|(k, _)| k == key) {
            slot.1 = value;
        }
    }

    /// Removes `key`, if present.
    pub fn remove(&mut self, key: &str) {
        self.0.retain(|(k, _)| k != key);
    }

    /// Compact JSON text in the kept order.
    pub fn to_json(&self) -> String {
        let mut out = String::from("{");
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&serde_json::to_string(k).unwrap_or_default());
            out.push(':');
            out.push_str(v.get());
        }
        out.push('}');
        out
    }
}

impl<'de> Deserialize<'de> for Ordered {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Ordered, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Ordered;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Ordered, A::Error> {
                let mut entries: Vec<(String, Box<RawValue>)> = Vec::new();
                let mut index: HashMap<String, usize> = HashMap::new();
                while let Some((k, v)) = map.next_entry::<String, Box<RawValue>>()? {
                    match index.get(&k) {
                        Some(&i) => entries[i].1 = v,
                        None => {
                            index.insert(k.clone(), entries.len());
                            entries.push((k, v));
                        }
                    }
                }
                Ok(Ordered(entries))
            }
        }
        d.deserialize_map(V)
    }
}

/// Which list answer is rewritten, and how (§6 ACL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rewrite {
    /// `tools/list`: each view's descriptor removed, added where missing on the last
    /// page, or kept, per the listing.
    Tools(Listing),
    /// `resources/list` and `resources/templates/list`: entries of every view that does
    /// not pass removed.
    Resources(Listing),
    /// Any list result, told by its shape: both of the above. For answers replayed on a
    /// `GET /mcp` event stream, where the request they answer is not known.
    Any(Listing),
}

/// Rewrites one JSON-RPC message (text) per `rewrite`; messages that are not a result
/// of the expected shape come back unchanged. `None` when the text is not JSON.
pub fn rewrite_message(text: &str, rewrite: Rewrite) -> Option<String> {
    let mut msg = Ordered::parse(text)?;
    let Some(result) = msg.get("result").map(RawValue::get) else {
        return Some(text.to_owned());
    };
    let Some(mut result) = Ordered::parse(result) else {
        return Some(text.to_owned());
    };
    let resources = |result: &mut Ordered, hidden: ViewSet| {
        let a = filter_resources(result, "resources", hidden);
        let b = filter_resources(result, "resourceTemplates", hidden);
        a || b
    };
    let changed = match rewrite {
        Rewrite::Tools(listing) => rewrite_tools(&mut result, listing),
        Rewrite::Resources(listing) => resources(&mut result, listing.hidden_resources()),
        Rewrite::Any(listing) => {
            let tools = rewrite_tools(&mut result, listing);
            resources(&mut result, listing.hidden_resources()) || tools
        }
    };
    if !changed {
        return Some(text.to_owned());
    }
    let raw = RawValue::from_string(result.to_json()).ok()?;
    msg.set("result", raw);
    Some(msg.to_json())
}

fn raw_array(v: &RawValue) -> Option<Vec<Box<RawValue>>> {
    serde_json::from_str(v.get()).ok()
}

fn array_text(items: &[Box<RawValue>]) -> Option<Box<RawValue>> {
    let parts: Vec<&str> = items.iter().map(|v| v.get()).collect();
    RawValue::from_string(format!("[{}]", parts.join(","))).ok()
}

fn rewrite_tools(result: &mut Ordered, listing: Listing) -> bool {
    let Some(mut tools) = result.get("tools").and_then(raw_array) else {
        return false;
    };
    // The entry's `name` as a client's `JSON.parse` reads it: a repeated key keeps its
    // last value (a derived struct refuses a repeated field, which hid the tool).
    let name_of = |t: &RawValue| {
        Ordered::parse(t.get())
            .and_then(|o| {
                o.get("name")
                    .map(|n| serde_json::from_str::<Value>(n.get()))
            })
            .and_then(Result::ok)
    };
    let is_view = |t: &RawValue, view: View| name_of(t).is_some_and(|n| n == tool_name(view));
    let mut changed = false;
    for view in View::ALL {
        match listing.of(view) {
            Listed::Keep => {}
            Listed::Show => {
                // Pagination: only the last page (no `nextCursor`) may gain the tool.
                if tools.iter().any(|t| is_view(t, view)) || result.get("nextCursor").is_some() {
                    continue;
                }
                if let Ok(d) = RawValue::from_string(tool_descriptor(view).to_owned()) {
                    tools.push(d);
                    changed = true;
                }
            }
            Listed::Hide => {
                let before = tools.len();
                tools.retain(|t| !is_view(t, view));
                changed |= tools.len() != before;
            }
        }
    }
    if !changed {
        return false;
    }
    match array_text(&tools) {
        Some(raw) => {
            result.set("tools", raw);
            true
        }
        None => false,
    }
}

/// What marks a resource as one of a view's, in lowercase text.
pub fn needles(view: View) -> [&'static str; 3] {
    match view {
        View::SectionSource => ["section-source", "section_source", TOOL_NAME],
        View::NoteOutline => ["note-outline", "note_outline", NOTE_OUTLINE_TOOL],
        View::DocumentTree => ["document-tree", "document_tree", DOCUMENT_TREE_TOOL],
    }
}

/// The views a resource entry mentions, compared on its decoded text so escapes cannot
/// hide them.
fn mentioned_views(entry: &RawValue) -> ViewSet {
    let decoded = serde_json::from_str::<Value>(entry.get())
        .map(|v| v.to_string())
        .unwrap_or_else(|_| entry.get().to_owned())
        .to_lowercase();
    View::ALL
        .into_iter()
        .filter(|v| needles(*v).iter().any(|n| decoded.contains(n)))
        .fold(ViewSet::NONE, ViewSet::with)
}

/// The views whose resources a `resources/read` URI names (§6 ACL: the lists hide
/// them): the needles of each view, looked for in the URI as the gateway's SDK could
/// read it. The SDK matches `new URL(uri).toString()`, and the WHATWG parser drops ASCII
/// tab, LF and CR anywhere; a gateway's own handler might also decode percent-escapes,
/// so they are decoded until nothing changes. Each pass costs the URI's length, so after
/// [`MAX_URI_DECODINGS`] passes a URI that still decodes further counts as naming every
/// view (fail closed). Case is ignored.
pub fn uri_names_views(uri: &str) -> ViewSet {
    let folded = |bytes: &[u8]| -> Vec<u8> {
        bytes
            .iter()
            .filter(|b| !matches!(b, b'\t' | b'\n' | b'\r'))
            .map(u8::to_ascii_lowercase)
            .collect()
    };
    let named = |text: &[u8]| {
        View::ALL
            .into_iter()
            .filter(|v| {
                needles(*v)
                    .iter()
                    .any(|n| memchr::memmem::find(text, n.as_bytes()).is_some())
            })
            .fold(ViewSet::NONE, ViewSet::with)
    };
    let mut text = folded(uri.as_bytes());
    let mut found = ViewSet::NONE;
    for _ in 0..=MAX_URI_DECODINGS {
        found = ViewSet(found.0 | named(&text).0);
        let decoded = percent_decoded(&text);
        if decoded.len() == text.len() {
            return found;
        }
        text = folded(&decoded);
    }
    ViewSet::ALL
}

/// How many layers of percent-escapes [`uri_names_section_source`] takes off.
pub const MAX_URI_DECODINGS: usize = 3;

/// One pass of percent-decoding; an invalid escape stays as it is.
fn percent_decoded(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while let Some(&c) = text.get(i) {
        if c == b'%' {
            if let Some(d) = text.get(i + 1..i + 3).and_then(crate::route::hex_pair) {
                out.push(d);
                i += 3;
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    out
}

fn filter_resources(result: &mut Ordered, key: &str, hidden: ViewSet) -> bool {
    if hidden.is_empty() {
        return false;
    }
    let Some(mut items) = result.get(key).and_then(raw_array) else {
        return false;
    };
    let before = items.len();
    items.retain(|e| !mentioned_views(e).meets(hidden));
    if items.len() == before {
        return false;
    }
    match array_text(&items) {
        Some(raw) => {
            result.set(key, raw);
            true
        }
        None => false,
    }
}

/// Rewrites the message events of an event stream per `rewrite`, keeping every other
/// byte as written (see [`super::sse`]). `None` when a message event's data is not a
/// JSON object.
pub fn rewrite_sse(text: &str, rewrite: Rewrite) -> Option<String> {
    let out = super::sse::rewrite_all(text.as_bytes(), rewrite, usize::MAX).ok()?;
    String::from_utf8(out).ok()
}

/// Most bytes of a gateway answer read to tell whether it is the gateway's
/// unknown-session or not-initialized answer (each is under 110 bytes).
pub const MAX_DROPPED_ANSWER_BYTES: usize = 1024;

/// Whether an answer with `status` and `headers` could be one that says the gateway no
/// longer knows the session (see [`drops_session`]): a 404 or 400 labelled
/// `application/json`. An event stream never is.
pub fn may_drop_session(status: http::StatusCode, headers: &http::HeaderMap) -> bool {
    if status != http::StatusCode::NOT_FOUND && status != http::StatusCode::BAD_REQUEST {
        return false;
    }
    let mut types = headers.get_all(http::header::CONTENT_TYPE).iter();
    let (Some(only), None) = (types.next(), types.next()) else {
        return false;
    };
    let media = only
        .as_bytes()
        .split(|b| *b == b';')
        .next()
        .unwrap_or_default();
    media.trim_ascii().eq_ignore_ascii_case(b"application/json")
}

/// Whether the gateway's answer (`status`, `headers`, the whole `body`) is its answer
/// for a session it does not know: 404 `Session not found` (the gateway's `-32600`, or
/// the SDK's own `-32001`), or the SDK's 400 `-32000` `Bad Request: Server not
/// initialized`, which the gateway gives a call on an id it does not know once it has
/// opened a new, uninitialized session for it (§6). Read strictly: exactly the
/// JSON-RPC error envelope, with no `id` or a `null` one, and nothing else.
pub fn drops_session(status: http::StatusCode, headers: &http::HeaderMap, body: &[u8]) -> bool {
    if !may_drop_session(status, headers) || body.len() > MAX_DROPPED_ANSWER_BYTES {
        return false;
    }
    let Ok(Value::Object(envelope)) = serde_json::from_slice::<Value>(body) else {
        return false;
    };
    let shape = envelope.get("jsonrpc").and_then(Value::as_str) == Some("2.0")
        && envelope
            .keys()
            .all(|k| k == "jsonrpc" || k == "error" || k == "id")
        && envelope.get("id").is_none_or(Value::is_null);
    let Some(Value::Object(error)) = envelope.get("error") else {
        return false;
    };
    if !shape || error.len() != 2 {
        return false;
    }
    let (Some(code), Some(message)) = (
        error.get("code").and_then(Value::as_i64),
        error.get("message").and_then(Value::as_str),
    ) else {
        return false;
    };
    match status {
        http::StatusCode::NOT_FOUND => {
            message == "Session not found" && (code == -32600 || code == -32001)
        }
        _ => code == -32000 && message == "Bad Request: Server not initialized",
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// The section-source tool shown, the other views passed: the rewrite of the
    /// section-source tool alone.
    const SECTION_SOURCE_ONLY: Listing = Listing::new([Listed::Show, Listed::Keep, Listed::Keep]);

    #[test]
    fn a_result_event_is_framed_as_the_sdk_frames_it() {
        let e = sse_result(r#"{"content":[]}"#, "\"x\"");
        assert_eq!(
            e,
            sse_event(r#"{"result":{"content":[]},"jsonrpc":"2.0","id":"x"}"#)
        );
        assert_eq!(e.capacity(), e.len());
    }

    #[test]
    fn s6_ids_echo_as_javascript_prints_them() {
        let id = |t: &str| echo_id(&serde_json::from_str(t).unwrap());
        assert_eq!(id("1").as_deref(), Some("1"));
        assert_eq!(id("1.0").as_deref(), Some("1"));
        assert_eq!(id("1e2").as_deref(), Some("100"));
        assert_eq!(id("-0.0").as_deref(), Some("0"));
        assert_eq!(id("\"a\\u0062\"").as_deref(), Some("\"ab\""));
        assert_eq!(id("1.5"), None);
        assert_eq!(id("9007199254740992"), None);
        assert_eq!(id("null"), None);
        assert_eq!(id("true"), None);
    }

    #[test]
    fn s6_tools_list_rewrite_keeps_the_rest_byte_for_byte() {
        let msg =
            r#"{"result":{"tools":[{"name":"search","zeta":1,"alpha":2}]},"jsonrpc":"2.0","id":7}"#;
        let added = rewrite_message(msg, Rewrite::Tools(SECTION_SOURCE_ONLY)).unwrap();
        assert_eq!(
            added,
            format!(
                r#"{{"result":{{"tools":[{{"name":"search","zeta":1,"alpha":2}},{TOOL_DESCRIPTOR}]}},"jsonrpc":"2.0","id":7}}"#
            )
        );
        let removed = rewrite_message(&added, Rewrite::Tools(Listing::all(false))).unwrap();
        assert_eq!(removed, msg);
        let paged = r#"{"result":{"tools":[],"nextCursor":"x"},"jsonrpc":"2.0","id":7}"#;
        assert_eq!(
            rewrite_message(paged, Rewrite::Tools(SECTION_SOURCE_ONLY)).unwrap(),
            paged
        );
    }

    #[test]
    fn each_views_tool_is_listed_per_the_policy() {
        let msg = r#"{"result":{"tools":[{"name":"search"},{"name":"get_note_outline","x":1}]},"jsonrpc":"2.0","id":1}"#;
        // Owned and allowed: the gateway's entry kept as it is, the others added in
        // order at the end of the last page.
        assert_eq!(
            rewrite_message(msg, Rewrite::Tools(Listing::all(true))).unwrap(),
            format!(
                r#"{{"result":{{"tools":[{{"name":"search"}},{{"name":"get_note_outline","x":1}},{TOOL_DESCRIPTOR},{DOCUMENT_TREE_DESCRIPTOR}]}},"jsonrpc":"2.0","id":1}}"#
            )
        );
        // Hidden: every view's entry goes.
        assert_eq!(
            rewrite_message(msg, Rewrite::Tools(Listing::all(false))).unwrap(),
            r#"{"result":{"tools":[{"name":"search"}]},"jsonrpc":"2.0","id":1}"#
        );
        // Mixed: the section source shown, the outline passed (kept as the gateway lists
        // it, or not), the tree hidden.
        let mixed = Listing::new([Listed::Show, Listed::Keep, Listed::Hide]);
        assert_eq!(
            rewrite_message(msg, Rewrite::Tools(mixed)).unwrap(),
            format!(
                r#"{{"result":{{"tools":[{{"name":"search"}},{{"name":"get_note_outline","x":1}},{TOOL_DESCRIPTOR}]}},"jsonrpc":"2.0","id":1}}"#
            )
        );
        let without =
            r#"{"result":{"tools":[{"name":"get_document_tree"}]},"jsonrpc":"2.0","id":1}"#;
        assert_eq!(
            rewrite_message(
                without,
                Rewrite::Tools(Listing::new([Listed::Keep, Listed::Keep, Listed::Hide]))
            )
            .unwrap(),
            r#"{"result":{"tools":[]},"jsonrpc":"2.0","id":1}"#
        );
        // Resources of every view that does not pass go; a passed view's stay.
        let res = r#"{"result":{"resources":[{"uri":"knowtation://a"},{"uri":"knowtation://note-outline/a"},{"uri":"knowtation://document_tree/a"},{"uri":"knowtation://section-source/a"}]},"jsonrpc":"2.0","id":2}"#;
        assert_eq!(
            rewrite_message(res, Rewrite::Resources(Listing::all(true))).unwrap(),
            r#"{"result":{"resources":[{"uri":"knowtation://a"}]},"jsonrpc":"2.0","id":2}"#
        );
        assert_eq!(
            rewrite_message(res, Rewrite::Resources(mixed)).unwrap(),
            r#"{"result":{"resources":[{"uri":"knowtation://a"},{"uri":"knowtation://note-outline/a"}]},"jsonrpc":"2.0","id":2}"#
        );
    }

    #[test]
    fn s6_a_repeated_name_key_is_read_as_a_client_reads_it() {
        // `JSON.parse` keeps the last `name`: the entry is the tool and must go.
        let msg = r#"{"result":{"tools":[{"name":"a","name":"get_section_source"},{"name":"get_section_source","name":"b"}]},"jsonrpc":"2.0","id":1}"#;
        assert_eq!(
            rewrite_message(msg, Rewrite::Tools(Listing::all(false))).unwrap(),
            r#"{"result":{"tools":[{"name":"get_section_source","name":"b"}]},"jsonrpc":"2.0","id":1}"#
        );
        // Present as a client sees it, so nothing is added.
        assert_eq!(
            rewrite_message(msg, Rewrite::Tools(SECTION_SOURCE_ONLY)).unwrap(),
            msg
        );
    }

    #[test]
    fn s6_resources_never_list_section_sources() {
        let msg = r#"{"result":{"resources":[{"uri":"knowtation://a"},{"uri":"knowtation://section\u002dsource/x"}],"resourceTemplates":[{"name":"GET_SECTION_SOURCE"}]},"jsonrpc":"2.0","id":"r"}"#;
        let out = rewrite_message(msg, Rewrite::Resources(Listing::all(false))).unwrap();
        assert_eq!(
            out,
            r#"{"result":{"resources":[{"uri":"knowtation://a"}],"resourceTemplates":[]},"jsonrpc":"2.0","id":"r"}"#
        );
    }

    #[test]
    fn s6_a_read_of_what_the_lists_hide_is_recognized_however_spelled() {
        for uri in [
            "knowtation://section-source/a.md",
            "KNOWTATION://hosted/Section_Source/a.md",
            "knowtation://hosted/x?tool=get_section_source",
            // The WHATWG parser drops tab, LF and CR anywhere.
            "knowtation://hosted/sec\ttion-so\nurce/a.md",
            "knowtation://hosted/section-\r\nsource",
            // Escapes, up to three layers, and mixed with the characters dropped.
            "knowtation://hosted/section%2dsource/a.md",
            "knowtation://hosted/%73ection%5Fsource",
            "knowtation://hosted/section%252Dsource",
            "knowtation://hosted/section%25252Dsource",
            "knowtation://hosted/section-%09source",
            "knowtation://hosted/section-%2509source",
            // A fourth layer still to decode counts as hidden: fail closed.
            "knowtation://hosted/%2525252541",
        ] {
            assert!(
                uri_names_views(uri).contains(View::SectionSource),
                "{uri:?}"
            );
        }
        for uri in [
            "knowtation://notes/a.md",
            "knowtation://hosted/sections/a.md",
            "knowtation://hosted/section source",
            "knowtation://hosted/section-%source",
            "knowtation://hosted/%252541",
            "",
        ] {
            assert!(uri_names_views(uri).is_empty(), "{uri:?}");
        }
        // The other views' resources, however spelled, and only theirs.
        for (uri, view) in [
            ("knowtation://hosted/note-outline/a.md", View::NoteOutline),
            ("KNOWTATION://hosted/Note_Outline/a.md", View::NoteOutline),
            (
                "knowtation://hosted/x?tool=get_note_outline",
                View::NoteOutline,
            ),
            ("knowtation://hosted/note%2doutline/a.md", View::NoteOutline),
            (
                "knowtation://hosted/docu\tment-tree/a.md",
                View::DocumentTree,
            ),
            ("knowtation://hosted/document%252Dtree", View::DocumentTree),
            ("knowtation://hosted/GET_DOCUMENT_TREE", View::DocumentTree),
        ] {
            let named = uri_names_views(uri);
            assert!(named.contains(view), "{uri:?}");
            assert_eq!(named, ViewSet::of(view), "{uri:?}");
        }
        assert_eq!(
            uri_names_views("knowtation://hosted/%2525252541"),
            ViewSet::ALL
        );
    }

    #[test]
    fn s6_the_unknown_resource_answer_is_the_sdks() {
        assert_eq!(
            unknown_resource_message("knowtation://a\"b", "7"),
            r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32602,"message":"MCP error -32602: Resource knowtation://a\"b not found"}}"#
        );
    }

    #[test]
    fn s6_sse_rewrite_keeps_framing() {
        let text = "event: message\nid: 3\ndata: {\"result\":{\"tools\":[]},\"jsonrpc\":\"2.0\",\"id\":1}\n\n";
        let out = rewrite_sse(text, Rewrite::Tools(SECTION_SOURCE_ONLY)).unwrap();
        assert_eq!(
            out,
            format!("event: message\nid: 3\ndata: {{\"result\":{{\"tools\":[{TOOL_DESCRIPTOR}]}},\"jsonrpc\":\"2.0\",\"id\":1}}\n\n")
        );
        assert!(rewrite_sse(
            "data: not json\n\n",
            Rewrite::Resources(Listing::all(false))
        )
        .is_none());
    }

    #[test]
    fn s6_the_gateways_session_answers_are_recognized_strictly() {
        use http::header::{HeaderValue, CONTENT_TYPE};
        use http::{HeaderMap, StatusCode};
        let json = |ct: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_TYPE, HeaderValue::from_static(ct));
            h
        };
        let gateway = json("application/json; charset=utf-8");
        let sdk = json("application/json");
        let not_found =
            br#"{"jsonrpc":"2.0","error":{"code":-32600,"message":"Session not found"}}"#;
        let sdk_not_found =
            br#"{"jsonrpc":"2.0","error":{"code":-32001,"message":"Session not found"},"id":null}"#;
        let not_initialized = br#"{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: Server not initialized"},"id":null}"#;
        assert!(drops_session(StatusCode::NOT_FOUND, &gateway, not_found));
        assert!(drops_session(StatusCode::NOT_FOUND, &sdk, sdk_not_found));
        assert!(drops_session(
            StatusCode::BAD_REQUEST,
            &sdk,
            not_initialized
        ));
        assert!(drops_session(
            StatusCode::BAD_REQUEST,
            &json("Application/JSON ; charset=utf-8"),
            not_initialized
        ));
        // Other statuses, labels and bodies are ordinary answers.
        assert!(!drops_session(StatusCode::BAD_REQUEST, &gateway, not_found));
        assert!(!drops_session(StatusCode::NOT_FOUND, &sdk, not_initialized));
        assert!(!drops_session(StatusCode::OK, &sdk, not_found));
        assert!(!drops_session(
            StatusCode::NOT_FOUND,
            &json("text/event-stream"),
            not_found
        ));
        assert!(!drops_session(
            StatusCode::NOT_FOUND,
            &json("text/html"),
            not_found
        ));
        assert!(!drops_session(
            StatusCode::NOT_FOUND,
            &HeaderMap::new(),
            not_found
        ));
        let mut twice = sdk.clone();
        twice.append(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        assert!(!drops_session(StatusCode::NOT_FOUND, &twice, not_found));
        for body in [
            &br#"{"jsonrpc":"2.0","error":{"code":-32600,"message":"Session not found"},"id":1}"#[..],
            br#"{"jsonrpc":"2.0","error":{"code":-32600,"message":"Session not found","data":1}}"#,
            br#"{"jsonrpc":"2.0","error":{"code":-32602,"message":"Session not found"}}"#,
            br#"{"jsonrpc":"2.0","error":{"code":-32600,"message":"session not found"}}"#,
            br#"{"jsonrpc":"1.0","error":{"code":-32600,"message":"Session not found"}}"#,
            br#"{"jsonrpc":"2.0","error":{"code":-32600,"message":"Session not found"},"x":1}"#,
            br#"{"error":"Not found","code":"NOT_FOUND"}"#,
            br#"[{"jsonrpc":"2.0","error":{"code":-32600,"message":"Session not found"}}]"#,
            b"Session not found",
        ] {
            assert!(!drops_session(StatusCode::NOT_FOUND, &gateway, body));
        }
        let mut padded = not_found.to_vec();
        padded.splice(1..1, std::iter::repeat_n(b' ', MAX_DROPPED_ANSWER_BYTES));
        assert!(!drops_session(StatusCode::NOT_FOUND, &gateway, &padded));
        assert!(!drops_session(
            StatusCode::BAD_REQUEST,
            &sdk,
            br#"{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: Server already initialized"},"id":null}"#
        ));
    }
}
