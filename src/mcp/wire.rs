//! JSON-RPC and SSE text as the TypeScript SDK writes it (wire contract §6): request ids,
//! message framing, and the raw-preserving rewrite of list answers.

use std::collections::HashMap;
use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

/// The tool the sidecar answers.
pub const TOOL_NAME: &str = "get_section_source";

/// The tool descriptor, exactly as the SDK lists it (§6).
pub const TOOL_DESCRIPTOR: &str = r#"{"name":"get_section_source","description":"Return body-free SectionSource v0 metadata for one hosted note.","inputSchema":{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","properties":{"path":{"type":"string","description":"Vault-relative note path"}},"required":["path"]},"execution":{"taskSupport":"forbidden"}}"#;

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
    /// `tools/list`: the descriptor removed (`allowed == false`) or added where missing
    /// on the last page (`allowed == true`).
    Tools {
        /// Whether the session's role may see the tool.
        allowed: bool,
    },
    /// `resources/list` and `resources/templates/list`: section-source entries removed.
    Resources,
    /// Any list result, told by its shape: both of the above. For answers replayed on a
    /// `GET /mcp` event stream, where the request they answer is not known.
    Any {
        /// Whether the session's role may see the tool.
        allowed: bool,
    },
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
    let resources = |result: &mut Ordered| {
        let a = filter_resources(result, "resources");
        let b = filter_resources(result, "resourceTemplates");
        a || b
    };
    let changed = match rewrite {
        Rewrite::Tools { allowed } => rewrite_tools(&mut result, allowed),
        Rewrite::Resources => resources(&mut result),
        Rewrite::Any { allowed } => {
            let tools = rewrite_tools(&mut result, allowed);
            resources(&mut result) || tools
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

fn rewrite_tools(result: &mut Ordered, allowed: bool) -> bool {
    let Some(mut tools) = result.get("tools").and_then(raw_array) else {
        return false;
    };
    // The entry's `name` as a client's `JSON.parse` reads it: a repeated key keeps its
    // last value (a derived struct refuses a repeated field, which hid the tool).
    let is_ours = |t: &RawValue| {
        Ordered::parse(t.get())
            .and_then(|o| {
                o.get("name")
                    .map(|n| serde_json::from_str::<Value>(n.get()))
            })
            .and_then(Result::ok)
            .is_some_and(|n| n == TOOL_NAME)
    };
    let before = tools.len();
    let present = tools.iter().any(|t| is_ours(t));
    if allowed {
        // Pagination: only the last page (no `nextCursor`) may gain the tool.
        if present || result.get("nextCursor").is_some() {
            return false;
        }
        match RawValue::from_string(TOOL_DESCRIPTOR.to_owned()) {
            Ok(d) => tools.push(d),
            Err(_) => return false,
        }
    } else {
        tools.retain(|t| !is_ours(t));
        if tools.len() == before {
            return false;
        }
    }
    match array_text(&tools) {
        Some(raw) => {
            result.set("tools", raw);
            true
        }
        None => false,
    }
}

/// What marks a resource as a section source, in lowercase text.
const SECTION_SOURCE_NEEDLES: [&str; 3] = ["section-source", "section_source", TOOL_NAME];

/// Whether a resource entry mentions section sources, compared on its decoded text so
/// escapes cannot hide it.
fn mentions_section_source(entry: &RawValue) -> bool {
    let decoded = serde_json::from_str::<Value>(entry.get())
        .map(|v| v.to_string())
        .unwrap_or_else(|_| entry.get().to_owned())
        .to_lowercase();
    SECTION_SOURCE_NEEDLES
        .iter()
        .any(|needle| decoded.contains(needle))
}

/// Whether a `resources/read` URI names a resource the lists hide (§6 ACL): the needles
/// of [`mentions_section_source`], looked for in the URI as the gateway's SDK could
/// read it. The SDK matches `new URL(uri).toString()`, and the WHATWG parser drops ASCII
/// tab, LF and CR anywhere; a gateway's own handler might also decode percent-escapes,
/// so they are decoded until nothing changes. Each pass costs the URI's length, so after
/// [`MAX_URI_DECODINGS`] passes a URI that still decodes further counts as naming one
/// (fail closed). Case is ignored.
pub fn uri_names_section_source(uri: &str) -> bool {
    let folded = |bytes: &[u8]| -> Vec<u8> {
        bytes
            .iter()
            .filter(|b| !matches!(b, b'\t' | b'\n' | b'\r'))
            .map(u8::to_ascii_lowercase)
            .collect()
    };
    let mut text = folded(uri.as_bytes());
    for _ in 0..=MAX_URI_DECODINGS {
        if SECTION_SOURCE_NEEDLES
            .iter()
            .any(|n| memchr::memmem::find(&text, n.as_bytes()).is_some())
        {
            return true;
        }
        let decoded = percent_decoded(&text);
        if decoded.len() == text.len() {
            return false;
        }
        text = folded(&decoded);
    }
    true
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

fn filter_resources(result: &mut Ordered, key: &str) -> bool {
    let Some(mut items) = result.get(key).and_then(raw_array) else {
        return false;
    };
    let before = items.len();
    items.retain(|e| !mentions_section_source(e));
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
        let added = rewrite_message(msg, Rewrite::Tools { allowed: true }).unwrap();
        assert_eq!(
            added,
            format!(
                r#"{{"result":{{"tools":[{{"name":"search","zeta":1,"alpha":2}},{TOOL_DESCRIPTOR}]}},"jsonrpc":"2.0","id":7}}"#
            )
        );
        let removed = rewrite_message(&added, Rewrite::Tools { allowed: false }).unwrap();
        assert_eq!(removed, msg);
        let paged = r#"{"result":{"tools":[],"nextCursor":"x"},"jsonrpc":"2.0","id":7}"#;
        assert_eq!(
            rewrite_message(paged, Rewrite::Tools { allowed: true }).unwrap(),
            paged
        );
    }

    #[test]
    fn s6_a_repeated_name_key_is_read_as_a_client_reads_it() {
        // `JSON.parse` keeps the last `name`: the entry is the tool and must go.
        let msg = r#"{"result":{"tools":[{"name":"a","name":"get_section_source"},{"name":"get_section_source","name":"b"}]},"jsonrpc":"2.0","id":1}"#;
        assert_eq!(
            rewrite_message(msg, Rewrite::Tools { allowed: false }).unwrap(),
            r#"{"result":{"tools":[{"name":"get_section_source","name":"b"}]},"jsonrpc":"2.0","id":1}"#
        );
        // Present as a client sees it, so nothing is added.
        assert_eq!(
            rewrite_message(msg, Rewrite::Tools { allowed: true }).unwrap(),
            msg
        );
    }

    #[test]
    fn s6_resources_never_list_section_sources() {
        let msg = r#"{"result":{"resources":[{"uri":"knowtation://a"},{"uri":"knowtation://section\u002dsource/x"}],"resourceTemplates":[{"name":"GET_SECTION_SOURCE"}]},"jsonrpc":"2.0","id":"r"}"#;
        let out = rewrite_message(msg, Rewrite::Resources).unwrap();
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
            assert!(uri_names_section_source(uri), "{uri:?}");
        }
        for uri in [
            "knowtation://notes/a.md",
            "knowtation://hosted/sections/a.md",
            "knowtation://hosted/section source",
            "knowtation://hosted/section-%source",
            "knowtation://hosted/%252541",
            "",
        ] {
            assert!(!uri_names_section_source(uri), "{uri:?}");
        }
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
        let out = rewrite_sse(text, Rewrite::Tools { allowed: true }).unwrap();
        assert_eq!(
            out,
            format!("event: message\nid: 3\ndata: {{\"result\":{{\"tools\":[{TOOL_DESCRIPTOR}]}},\"jsonrpc\":\"2.0\",\"id\":1}}\n\n")
        );
        assert!(rewrite_sse("data: not json\n\n", Rewrite::Resources).is_none());
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
