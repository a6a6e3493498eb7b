//! The checks behind the fuzz targets in `fuzz/`, one function per target.
//!
//! Each takes the raw input bytes, runs one parser or rewriter of the crate on them and
//! panics when an invariant breaks. The fuzz targets are one-line calls of these, and
//! `tests/fuzz_corpus.rs` replays every committed corpus and regression input through
//! the same functions on the stable toolchain, so what the fuzzer learned stays checked
//! by `cargo test`.

use std::fmt;

use http::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use http::Uri;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use knowtation_sidecar::mcp::door::{canonical, check_headers, DoorError};
use knowtation_sidecar::mcp::wire::{
    needles, rewrite_message, rewrite_sse, tool_descriptor, tool_name, Listed, Listing, Rewrite,
};
use knowtation_sidecar::mcp::{echo_id, watched, Watched};
use knowtation_sidecar::rest::{path_parameter, QueryError, MAX_QUERY_PARAMETERS};
use knowtation_sidecar::route::{
    classify, contains_ignore_ascii_case, is_route, merge_slashes, normalizes_to, routes, segments,
    GATEWAY_PREFIX, MAX_SEARCHED_PATH, MCP, NOTE_OUTLINE, SECTION_SOURCE,
};
use knowtation_views::extract::{
    self, decode_stored, parse_note, yaml, FmValue, Frontmatter, Limits, SectionSource, Surface,
    View, SCHEMA,
};
use knowtation_views::js;
use knowtation_views::json_cost;
use knowtation_views::path::{validate, VaultPath, MAX_PATH_BYTES, MAX_SEGMENTS};

/// The path every extractor check runs under.
const NOTE_PATH: &str = "notes/fuzz.md";

/// `path`: vault-path validation (wire contract §3, §4) never panics; an accepted path
/// keeps every invariant of §3, re-validates to itself, and `encode_component` yields
/// only unreserved characters and uppercase `%XX` that decode back to it.
pub fn path(data: &[u8]) {
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(p) = validate(raw) {
        check_path(&p);
    }
}

fn check_path(p: &VaultPath) {
    let s = p.as_str();
    assert!(!s.is_empty());
    assert!(!s.starts_with('/'));
    assert!(!s.contains('\\'));
    assert!(s.len() <= MAX_PATH_BYTES);
    assert!(!s
        .chars()
        .any(|c| matches!(c, '\u{0000}'..='\u{001F}' | '\u{007F}'..='\u{009F}')));
    let lower = s.to_ascii_lowercase();
    assert!(!lower.contains("%2e") && !lower.contains("%2f") && !lower.contains("%5c"));
    assert!(!matches!(s.as_bytes(), [l, b':', ..] if l.is_ascii_alphabetic()));

    let segments: Vec<&str> = s.split('/').collect();
    assert!(segments.len() <= MAX_SEGMENTS);
    for seg in &segments {
        assert!(!seg.is_empty() && *seg != "." && *seg != "..");
        assert!(!seg.starts_with(js::is_js_whitespace) && !seg.ends_with(js::is_js_whitespace));
    }

    assert_eq!(validate(s).as_ref(), Ok(p), "validation is idempotent");

    // file_name and folder split the path at its last separator.
    if let Some((last, rest)) = segments.split_last() {
        assert_eq!(p.file_name(), *last);
        assert_eq!(p.folder(), rest.join("/"));
    }

    // encodeURIComponent: only unreserved bytes and uppercase %XX, decoding back.
    let encoded = p.encode_component();
    let b = encoded.as_bytes();
    let mut decoded = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let Some(hex) = b.get(i + 1..i + 3) else {
                panic!("truncated escape in {encoded}");
            };
            assert!(hex
                .iter()
                .all(|h| h.is_ascii_digit() || (b'A'..=b'F').contains(h)));
            let byte = hex.iter().fold(0u8, |acc, h| {
                acc * 16 + (*h as char).to_digit(16).unwrap_or(0) as u8
            });
            assert!(!is_unreserved(byte));
            decoded.push(byte);
            i += 3;
        } else {
            assert!(is_unreserved(b[i]));
            decoded.push(b[i]);
            i += 1;
        }
    }
    assert_eq!(decoded, s.as_bytes());
}

/// `encodeURIComponent`'s unreserved set.
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'-' | b'_' | b'.' | b'!' | b'~' | b'*' | b'\'' | b'(' | b')'
        )
}

/// `encodeURIComponent` of `s`.
fn encode_component(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if is_unreserved(b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `query`: reading `req.query.path` from the REST query string (wire contract §3, §5)
/// never panics, and its answer does not change when the query is rewritten in ways
/// `qs` cannot tell apart: a fragment added or dropped, the parameters reversed, an
/// unrelated parameter added (within the limit), letters and non-ASCII characters
/// percent-encoded, or the query read through `http::Uri` as the proxy reads it. A
/// `path` it returns reads back from `path=<encodeURIComponent(path)>`.
pub fn query(data: &[u8]) {
    let Ok(q) = std::str::from_utf8(data) else {
        return;
    };
    let result = path_parameter(Some(q));
    let before_fragment = q.split('#').next().unwrap_or("");
    let parts: Vec<&str> = before_fragment.split('&').collect();

    assert_eq!(path_parameter(Some(before_fragment)), result, "{q:?}");
    assert_eq!(
        path_parameter(Some(&format!("{before_fragment}#path=x&path=y"))),
        result,
        "{q:?}"
    );
    let reversed: Vec<&str> = parts.iter().rev().copied().collect();
    assert_eq!(
        path_parameter(Some(&reversed.join("&"))),
        result,
        "order: {q:?}"
    );
    let extra = path_parameter(Some(&format!("{before_fragment}&x=1")));
    if parts.len() < MAX_QUERY_PARAMETERS {
        assert_eq!(extra, result, "extra parameter: {q:?}");
    } else {
        assert_eq!(extra, Err(QueryError::TooManyParameters), "{q:?}");
    }
    assert_eq!(
        path_parameter(Some(&escape_non_hex(before_fragment))),
        result,
        "escaped: {q:?}"
    );
    match &result {
        Ok(v) => {
            let again = path_parameter(Some(&format!("path={}", encode_component(v))));
            assert_eq!(again.as_ref(), Ok(v), "{q:?}");
        }
        Err(QueryError::TooManyParameters) => assert!(parts.len() > MAX_QUERY_PARAMETERS),
        Err(_) => assert!(parts.len() <= MAX_QUERY_PARAMETERS),
    }
    // As the proxy reads it: the query of the parsed request target.
    if let Ok(uri) = format!("/api/v1/section-source?{q}").parse::<Uri>() {
        assert_eq!(path_parameter(uri.query()), result, "via Uri: {q:?}");
    }
}

/// Percent-encodes every letter that is not a hex digit and every non-ASCII character:
/// none of them can be part of an escape, `]=`, `&`, `=`, `+` or `#`, so the decoded
/// keys and values stay the same.
fn escape_non_hex(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for c in s.chars() {
        if (c.is_ascii_alphabetic() && !c.is_ascii_hexdigit()) || !c.is_ascii() {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `route`: the one request classifier (wire contract §5, §6) never panics, and the
/// class of a path does not change with ASCII case, percent-encoded unreserved
/// characters or a query; nor with the gateway's prefix in front (stripped as often as
/// it appears) of a path that does not climb above the root; nor, in a path without
/// `..`, with an empty, `.` or `x/..` segment inserted.
pub fn route(data: &[u8]) {
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(uri) = raw.parse::<Uri>() else {
        return;
    };
    let found = routes(&uri);
    assert_eq!(classify(&uri), found.for_method(&http::Method::GET));
    let path = uri.path();
    // The classifier's fast forms agree with their plain ones: the block search with a
    // window scan, the backwards walk with the normalized segments, the stretch-wise
    // merge with a merge a character at a time.
    for needle in [SECTION_SOURCE[2], NOTE_OUTLINE[2], MCP[0], GATEWAY_PREFIX] {
        let windows = path
            .as_bytes()
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle.as_bytes()));
        assert_eq!(
            contains_ignore_ascii_case(path, needle),
            windows,
            "{needle} in {raw:?}"
        );
    }
    for route in [&SECTION_SOURCE[..], &NOTE_OUTLINE[..], &MCP[..]] {
        assert_eq!(
            normalizes_to(path, route),
            is_route(&segments(path), route),
            "{route:?} for {raw:?}"
        );
    }
    let mut merged = String::with_capacity(path.len());
    for c in path.chars() {
        if !(c == '/' && merged.ends_with('/')) {
            merged.push(c);
        }
    }
    assert_eq!(merge_slashes(path), merged, "merged slashes of {raw:?}");
    if !path.starts_with('/') {
        return;
    }
    let same = |variant: String, what: &str| {
        if let Ok(u) = variant.parse::<Uri>() {
            assert_eq!(routes(&u), found, "{what}: {raw:?} vs {variant:?}");
        }
    };
    // Behind the prefix, every reading of the path is still a reading (strip first),
    // so nothing it reaches is lost; more may be reached (`/../gateway/mcp` is no MCP
    // path, but behind the prefix it resolves to one).
    if let Ok(u) = format!("{GATEWAY_PREFIX}{path}").parse::<Uri>() {
        let behind = routes(&u);
        assert!(
            (!found.section_source || behind.section_source)
                && (!found.note_outline || behind.note_outline)
                && (!found.mcp || behind.mcp),
            "prefix: {raw:?} reaches {found:?}, behind the prefix {behind:?}"
        );
    }
    same(path.to_ascii_uppercase(), "upper case");
    same(path.to_ascii_lowercase(), "lower case");
    same(escape_unreserved(path), "escaped");
    same(format!("{path}?path=a.md"), "query");
    // Without a `..` segment, every reading agrees with full normalization, so empty,
    // `.` and `x/..` segments may go anywhere. (With one, readings resolve `..` against
    // different segments, and an inserted segment can change which ones there are; an
    // escaped `.`, once or twice, is one after decoding.) Short paths only: past the
    // search's bounds a path is taken to reach whatever it names, and an inserted
    // segment can take it there.
    let short = path.len() <= MAX_SEARCHED_PATH / 5;
    let dots = path.contains("..")
        || contains_ignore_ascii_case(path, "%2e")
        || contains_ignore_ascii_case(path, "%25");
    let at_sign = path.contains('@') || contains_ignore_ascii_case(path, "%40");
    if short && !dots {
        // A few places are enough; every one costs three classifications.
        for (i, _) in path.match_indices('/').take(16) {
            let (head, tail) = path.split_at(i);
            // `//` can make the segment after it an authority (`//user@host`, as url.parse
            // reads it), and one more `/` can unmake it (`///user@host` is a path to Node
            // too). Readings (the prefix stripped, `..` resolved) can put any segment
            // first, so with an `@` in the path, an empty segment anywhere may change
            // what is reached either way.
            if !at_sign {
                same(format!("{head}/{tail}"), "empty segment");
            }
            same(format!("{head}/.{tail}"), "dot segment");
            same(format!("{head}/x/..{tail}"), "dot-dot segment");
        }
    }
}

/// Percent-encodes the unreserved characters the classifier decodes, except hex digits
/// (which may belong to an escape already there).
fn escape_unreserved(path: &str) -> String {
    let mut out = String::with_capacity(path.len() * 3);
    for c in path.chars() {
        if (c.is_ascii_alphabetic() && !c.is_ascii_hexdigit()) || matches!(c, '-' | '.' | '_' | '~')
        {
            out.push_str(&format!("%{:02X}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// `mcp_door`: the `/mcp` door (wire contract §6 Deviations). The first line of the input
/// is a `Content-Type` value, the rest a body.
///
/// - The media-type check never panics and accepts only values naming
///   `application/json`; a repeated header is refused.
/// - A body is refused exactly when it is not UTF-8 JSON or holds a `__proto__` key.
/// - An accepted body's canonical text holds the value `JSON.parse` makes of the body
///   (keys in first position with their last value, numbers as doubles), is compact,
///   has no repeated key, writes every string and number in its one canonical form,
///   reads back as itself, and is classified exactly as the body is.
pub fn mcp_door(data: &[u8]) {
    let (ct, body) = match data.iter().position(|b| *b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&data[..0], data),
    };
    if let Ok(v) = HeaderValue::from_bytes(ct) {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, v.clone());
        if check_headers(&h).is_ok() {
            let lower = String::from_utf8_lossy(ct).to_ascii_lowercase();
            assert!(lower.contains("application/json"), "{lower:?}");
            h.append(CONTENT_TYPE, v);
            assert_eq!(check_headers(&h), Err(DoorError::MediaType));
        }
    }

    // What JavaScript would read, as far as serde_json reads the same text.
    let parsed: Option<Value> = std::str::from_utf8(body)
        .ok()
        .and_then(|t| serde_json::from_str(t).ok());
    let c = match canonical(body) {
        Ok(c) => c,
        Err(e) => {
            assert_eq!(e, DoorError::Body);
            if let Some(v) = &parsed {
                assert!(has_proto(v), "readable JSON without __proto__ refused");
            }
            return;
        }
    };
    let Some(parsed) = parsed else {
        panic!("the door accepted a body serde_json refuses");
    };
    // The charge taken before the parse covers every value and key the parse builds.
    let built = values_and_keys(&parsed);
    assert!(
        json_cost::json_parse_cost(body) >= built * json_cost::VALUE_COST,
        "charged {} for {built} values and keys",
        json_cost::json_parse_cost(body)
    );
    assert!(!has_proto(&c.value));
    let Ok(text) = std::str::from_utf8(body) else {
        panic!("the door accepted a body that is not UTF-8");
    };
    let js_value = tree(text);
    let Some(canonical_tree) = tree(&c.text) else {
        panic!("canonical text is not JSON: {}", c.text);
    };
    assert_eq!(js_value.as_ref(), Some(&canonical_tree), "value changed");
    assert!(!canonical_tree.repeats, "canonical text repeats a key");
    assert_canonical_text(&c.text);

    let again = match canonical(c.text.as_bytes()) {
        Ok(again) => again,
        Err(e) => panic!("canonical text refused ({e:?}): {}", c.text),
    };
    assert_eq!(again.text, c.text, "canonical form is a fixed point");
    assert_eq!(again.value, c.value);

    let class = Class::of(&parsed);
    assert_eq!(Class::of(&c.value), class, "classified differently");
    assert_eq!(Class::of(&again.value), class);
}

/// Every value of `v` and every object key in it.
fn values_and_keys(v: &Value) -> usize {
    1 + match v {
        Value::Object(o) => o.values().map(|v| 1 + values_and_keys(v)).sum(),
        Value::Array(a) => a.iter().map(values_and_keys).sum(),
        _ => 0,
    }
}

fn has_proto(v: &Value) -> bool {
    match v {
        Value::Object(o) => o.iter().any(|(k, v)| k == "__proto__" || has_proto(v)),
        Value::Array(a) => a.iter().any(has_proto),
        _ => false,
    }
}

/// How the sidecar treats a message (wire contract §6): the watched kind and every
/// field the checks before forwarding read.
#[derive(Debug, PartialEq)]
enum Class {
    /// A batch, and whether the door refuses it (a nested array or a watched message).
    Batch { refused: bool, len: usize },
    /// One message.
    Message {
        watched: Option<Watched>,
        method: Option<String>,
        name: Option<String>,
        uri: Option<String>,
        id: Option<Option<String>>,
        arguments: Option<Arguments>,
    },
    /// Anything else is forwarded as it is.
    Other,
}

impl Class {
    fn of(v: &Value) -> Class {
        match v {
            Value::Array(items) => Class::Batch {
                refused: items.iter().any(|m| m.is_array() || watched(m).is_some()),
                len: items.len(),
            },
            Value::Object(o) => {
                let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_owned);
                let params = o.get("params");
                Class::Message {
                    watched: watched(v),
                    method: text(o.get("method")),
                    name: text(params.and_then(|p| p.get("name"))),
                    uri: text(params.and_then(|p| p.get("uri"))),
                    id: o.get("id").map(echo_id),
                    arguments: params.and_then(|p| p.get("arguments")).map(Arguments::of),
                }
            }
            _ => Class::Other,
        }
    }
}

/// What the tool reads of `params.arguments` (wire contract §6 tool results): whether it
/// is an object, its keys, and `path` when it is a string. (Numbers are left out: the
/// door rewrites `1.0` as `1`, which `serde_json` tells apart and JavaScript does not.)
#[derive(Debug, PartialEq)]
enum Arguments {
    Object {
        keys: Vec<String>,
        path: Option<String>,
    },
    NotAnObject,
}

impl Arguments {
    fn of(v: &Value) -> Arguments {
        match v {
            Value::Object(o) => Arguments::Object {
                keys: o.keys().cloned().collect(),
                path: o.get("path").and_then(Value::as_str).map(str::to_owned),
            },
            _ => Arguments::NotAnObject,
        }
    }
}

/// A JSON value as `JSON.parse` builds it: numbers are doubles, an object keeps each key
/// at its first position with its last value. `repeats` says whether any object in it
/// repeated a key.
#[derive(Debug)]
struct Tree {
    node: Node,
    repeats: bool,
}

impl PartialEq for Tree {
    fn eq(&self, other: &Tree) -> bool {
        self.node == other.node
    }
}

#[derive(Debug, PartialEq)]
enum Node {
    Null,
    Bool(bool),
    Number(f64),
    String(String),
    Array(Vec<Node>),
    Object(Vec<(String, Node)>),
}

fn tree(text: &str) -> Option<Tree> {
    serde_json::from_str(text).ok()
}

impl<'de> Deserialize<'de> for Tree {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Tree, D::Error> {
        d.deserialize_any(TreeVisitor)
    }
}

struct TreeVisitor;

impl TreeVisitor {
    fn leaf(node: Node) -> Tree {
        Tree {
            node,
            repeats: false,
        }
    }
}

impl<'de> Visitor<'de> for TreeVisitor {
    type Value = Tree;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Tree, E> {
        Ok(Self::leaf(Node::Null))
    }

    fn visit_bool<E>(self, v: bool) -> Result<Tree, E> {
        Ok(Self::leaf(Node::Bool(v)))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Tree, E> {
        Ok(Self::leaf(Node::Number(v as f64)))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Tree, E> {
        Ok(Self::leaf(Node::Number(v as f64)))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Tree, E> {
        Ok(Self::leaf(Node::Number(v)))
    }

    fn visit_str<E>(self, v: &str) -> Result<Tree, E> {
        Ok(Self::leaf(Node::String(v.to_owned())))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Tree, A::Error> {
        let mut items = Vec::new();
        let mut repeats = false;
        while let Some(item) = seq.next_element::<Tree>()? {
            repeats |= item.repeats;
            items.push(item.node);
        }
        Ok(Tree {
            node: Node::Array(items),
            repeats,
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Tree, A::Error> {
        let mut entries: Vec<(String, Node)> = Vec::new();
        let mut repeats = false;
        while let Some((key, value)) = map.next_entry::<String, Tree>()? {
            repeats |= value.repeats;
            match entries.iter_mut().find(|(k, _)| *k == key) {
                Some(slot) => {
                    repeats = true;
                    slot.1 = value.node;
                }
                None => entries.push((key, value.node)),
            }
        }
        Ok(Tree {
            node: Node::Object(entries),
            repeats,
        })
    }
}

/// The canonical text has no whitespace between tokens, writes every string as
/// `serde_json` writes it (only the escapes JSON requires) and every number as
/// JavaScript prints its double.
fn assert_canonical_text(text: &str) {
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'{' | b'}' | b'[' | b']' | b',' | b':' => i += 1,
            b'"' => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                let Some(literal) = text.get(i..=j) else {
                    panic!("unterminated string in {text}");
                };
                let Ok(s) = serde_json::from_str::<String>(literal) else {
                    panic!("bad string {literal} in {text}");
                };
                let Ok(written) = serde_json::to_string(&s) else {
                    panic!("string does not serialize");
                };
                assert_eq!(written, literal, "string not in canonical form");
                i = j + 1;
            }
            b'-' | b'0'..=b'9' => {
                let end = b[i..]
                    .iter()
                    .position(|c| !matches!(c, b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'))
                    .map_or(b.len(), |n| i + n);
                let token = &text[i..end];
                let Ok(x) = token.parse::<f64>() else {
                    panic!("bad number {token} in {text}");
                };
                assert_eq!(
                    js::number_to_string(x),
                    token,
                    "number not as JavaScript prints it"
                );
                i = end;
            }
            _ => {
                let rest = &text[i..];
                let word = ["true", "false", "null"]
                    .into_iter()
                    .find(|w| rest.starts_with(w));
                let Some(word) = word else {
                    panic!("unexpected byte {:#04x} at {i} in {text}", b[i]);
                };
                i += word.len();
            }
        }
    }
}

/// `tools_list`: the rewrite of list answers (wire contract §6 ACL). The first byte
/// picks the rewrite (`% 3`: tools denied, tools allowed, resources), the framing
/// (`/ 3 % 2`: JSON, SSE) and the views' treatment (`/ 6 % 4`: all owned, or one of
/// three mixes of owned, hidden and passed views); the rest is the gateway's answer.
///
/// - JSON: the rewrite fails only when the answer is not a JSON object; otherwise the
///   output is JSON, a second rewrite changes nothing, and when it changed anything,
///   everything but the rewritten list is kept byte for byte, and the list keeps every
///   other entry byte for byte and in order.
/// - A hidden view: no `tools` entry of a result is named as its tool as a client reads
///   it. A shown view, on a last page (no `nextCursor`): its tool is listed, and when the
///   sidecar added it, as exactly its descriptor. A passed view's entries are kept.
///   Resources: no entry mentions a view that does not pass.
/// - SSE: read as a client's event-stream parser reads it, the stream keeps its events,
///   the data of each JSON-RPC message event (type `message`, data not empty) is the
///   JSON rewrite of the gateway's and the ACL holds for it, and every other event is
///   read as it was.
pub fn tools_list(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let allowed = mode % 3 == 1;
    let listing = match (mode / 6) % 4 {
        0 => Listing::all(allowed),
        1 => Listing::new([Listed::Show, Listed::Hide, Listed::Keep]),
        2 => Listing::new([Listed::Keep, Listed::Show, Listed::Hide]),
        _ => Listing::new([Listed::Hide, Listed::Keep, Listed::Show]),
    };
    let rewrite = match mode % 3 {
        2 => Rewrite::Resources(listing),
        _ => Rewrite::Tools(listing),
    };
    if (mode / 3) % 2 == 0 {
        check_rewrite_json(text, rewrite);
    } else {
        check_rewrite_sse(text, rewrite);
    }
}

fn check_rewrite_json(text: &str, rewrite: Rewrite) {
    let is_object = serde_json::from_str::<RawMap>(text).is_ok();
    let Some(out) = rewrite_message(text, rewrite) else {
        assert!(!is_object, "a JSON object could not be rewritten: {text}");
        return;
    };
    assert!(
        is_object,
        "rewrote something that is not a JSON object: {text}"
    );
    assert_eq!(
        rewrite_message(&out, rewrite).as_deref(),
        Some(out.as_str()),
        "a second rewrite changed the answer"
    );
    if out != text {
        assert_only_list_changed(text, &out, rewrite);
    }
    assert_listed_as_allowed(&out, rewrite, Some(text));
}

/// Everything outside the rewritten list is the same raw text; the list keeps every
/// entry it does not drop, byte for byte and in order.
fn assert_only_list_changed(before: &str, after: &str, rewrite: Rewrite) {
    let (Some(b), Some(a)) = (RawMap::parse(before), RawMap::parse(after)) else {
        panic!("rewrite output is not a JSON object: {after}");
    };
    assert_eq!(b.keys(), a.keys(), "message keys changed");
    b.same_except(&a, "result");
    let (Some(rb), Some(ra)) = (
        b.get("result").and_then(RawMap::parse),
        a.get("result").and_then(RawMap::parse),
    ) else {
        panic!("result changed but is not an object: {after}");
    };
    assert_eq!(rb.keys(), ra.keys(), "result keys changed");
    let lists: &[&str] = match rewrite {
        Rewrite::Tools(_) => &["tools"],
        Rewrite::Resources(_) => &["resources", "resourceTemplates"],
        Rewrite::Any(_) => &["tools", "resources", "resourceTemplates"],
    };
    let last_page = rb.get("nextCursor").is_none();
    for (k, v) in &rb.0 {
        let after_v = ra.get(k).unwrap_or_default();
        if !lists.contains(&k.as_str()) {
            assert_eq!(v.get(), after_v, "result.{k} changed");
            continue;
        }
        let (Some(items_b), Some(items_a)) = (raw_items(v.get()), raw_items(after_v)) else {
            assert_eq!(v.get(), after_v, "result.{k} changed but is not a list");
            continue;
        };
        // A replay's rewrite treats each list as the rewrite of its own method does.
        let (Rewrite::Tools(listing) | Rewrite::Resources(listing) | Rewrite::Any(listing)) =
            rewrite;
        let expected: Vec<&str> = if k == "tools" {
            let mut kept: Vec<&str> = items_b
                .iter()
                .map(|t| t.get())
                .filter(|t| {
                    !View::ALL
                        .into_iter()
                        .any(|v| listing.of(v) == Listed::Hide && named_view(t, v))
                })
                .collect();
            for v in View::ALL {
                let present = items_b.iter().any(|t| named_view(t.get(), v));
                if listing.of(v) == Listed::Show && !present && last_page {
                    kept.push(tool_descriptor(v));
                }
            }
            kept
        } else {
            let hidden = listing.hidden_resources();
            items_b
                .iter()
                .map(|t| t.get())
                .filter(|t| !hidden.iter().any(|v| mentions_view(t, v)))
                .collect()
        };
        let got: Vec<&str> = items_a.iter().map(|t| t.get()).collect();
        assert_eq!(got, expected, "result.{k} rewritten wrongly");
    }
}

/// The ACL as a client sees `text` (one JSON-RPC message): a hidden view's tool is not
/// listed; a shown one is on a last page; resources mention no view that does not pass.
/// `before` is the gateway's answer, when a tool may only have been added by the
/// rewrite (then it is exactly its descriptor).
fn assert_listed_as_allowed(text: &str, rewrite: Rewrite, before: Option<&str>) {
    // Where serde_json cannot read the text (nesting beyond 128, a lone surrogate escape,
    // a number beyond the double range), a client reading it is out of reach here.
    let Ok(Value::Object(msg)) = serde_json::from_str::<Value>(text) else {
        return;
    };
    let Some(Value::Object(result)) = msg.get("result") else {
        return;
    };
    let (tools, resources, listing) = match rewrite {
        Rewrite::Any(l) => (true, true, l),
        Rewrite::Tools(l) => (true, false, l),
        Rewrite::Resources(l) => (false, true, l),
    };
    if tools {
        if let Some(Value::Array(list)) = result.get("tools") {
            for v in View::ALL {
                let name = tool_name(v);
                let ours: Vec<&Value> = list
                    .iter()
                    .filter(|t| t.get("name").and_then(Value::as_str) == Some(name))
                    .collect();
                match listing.of(v) {
                    Listed::Keep => {}
                    Listed::Hide => assert!(ours.is_empty(), "a hidden {name} is listed: {text}"),
                    Listed::Show if !result.contains_key("nextCursor") => {
                        assert!(!ours.is_empty(), "a shown {name} is missing: {text}");
                        let gateway_listed = before.is_none_or(|b| {
                            serde_json::from_str::<Value>(b)
                                .ok()
                                .and_then(|v| v.get("result")?.get("tools").cloned())
                                .and_then(|t| {
                                    t.as_array().map(|a| {
                                        a.iter().any(|t| {
                                            t.get("name").and_then(Value::as_str) == Some(name)
                                        })
                                    })
                                })
                                .unwrap_or(true)
                        });
                        if !gateway_listed {
                            let Ok(descriptor) = serde_json::from_str::<Value>(tool_descriptor(v))
                            else {
                                panic!("the descriptor is not JSON");
                            };
                            assert_eq!(
                                ours,
                                [&descriptor],
                                "added tool differs from the descriptor"
                            );
                        }
                    }
                    Listed::Show => {}
                }
            }
        }
    }
    if resources {
        for key in ["resources", "resourceTemplates"] {
            if let Some(Value::Array(items)) = result.get(key) {
                for item in items {
                    let decoded = item.to_string().to_lowercase();
                    for v in listing.hidden_resources().iter() {
                        assert!(
                            !needles(v).iter().any(|n| decoded.contains(n)),
                            "{key} still lists {item}"
                        );
                    }
                }
            }
        }
    }
}

fn check_rewrite_sse(text: &str, rewrite: Rewrite) {
    let Some(out) = rewrite_sse(text, rewrite) else {
        return;
    };
    // Event by event as a client reads both streams: the data of each JSON-RPC message
    // event is the rewrite of the gateway's, every other event is as it was, and nothing
    // is added or dropped.
    let before = client_events(text);
    let after = client_events(&out);
    assert_eq!(
        after.len(),
        before.len(),
        "events added or dropped: {text:?} -> {out:?}"
    );
    for ((bk, b), (ak, a)) in before.iter().zip(&after) {
        assert_eq!(ak, bk, "an event changed its type");
        // An event of another type, or with empty data, is no message to a client.
        if !(bk.is_empty() || bk == "message") || b.is_empty() {
            assert_eq!(a, b);
            continue;
        }
        let Some(want) = rewrite_message(b, rewrite) else {
            panic!("a client reads a payload the rewrite never saw: {b:?} in {text:?}");
        };
        assert_eq!(*a, want, "payload {b:?} became {a:?}, not {want:?}");
        assert_listed_as_allowed(a, rewrite, None);
    }
}

/// The type and `data` of every event a client dispatches (the HTML event-stream
/// parsing rules: lines end at CRLF, LF or CR; a blank line dispatches; a leading BOM is
/// dropped; a line without a colon is a field with an empty value; the last `event`
/// line gives the type; an unfinished line or event at the end is dropped).
fn client_events(stream: &str) -> Vec<(String, String)> {
    let stream = stream.strip_prefix('\u{FEFF}').unwrap_or(stream);
    let mut events = Vec::new();
    let mut data = String::new();
    let mut kind = String::new();
    let mut has_data = false;
    let normalized = stream.replace("\r\n", "\n").replace('\r', "\n");
    // What follows the last line break is an unfinished line, and an event never ended
    // by a blank line is never dispatched.
    let mut lines: Vec<&str> = normalized.split('\n').collect();
    lines.pop();
    for line in lines {
        if line.is_empty() {
            if has_data {
                let d = data.strip_suffix('\n').unwrap_or(&data).to_owned();
                events.push((std::mem::take(&mut kind), d));
            }
            data.clear();
            kind.clear();
            has_data = false;
            continue;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        if field == "data" {
            data.push_str(value);
            data.push('\n');
            has_data = true;
        } else if field == "event" {
            value.clone_into(&mut kind);
        }
    }
    events
}

/// A JSON object as raw text per key (`JSON.parse`'s last value for a repeated key).
struct RawMap(Vec<(String, Box<RawValue>)>);

impl RawMap {
    fn parse(text: &str) -> Option<RawMap> {
        serde_json::from_str(text).ok()
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.get())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(k, _)| k.as_str()).collect()
    }

    fn same_except(&self, other: &RawMap, key: &str) {
        for (k, v) in &self.0 {
            if k != key {
                assert_eq!(Some(v.get()), other.get(k), "{k} changed");
            }
        }
    }
}

impl<'de> Deserialize<'de> for RawMap {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RawMap, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawMap;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawMap, A::Error> {
                let mut entries: Vec<(String, Box<RawValue>)> = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Box<RawValue>>()? {
                    match entries.iter_mut().find(|(key, _)| *key == k) {
                        Some(slot) => slot.1 = v,
                        None => entries.push((k, v)),
                    }
                }
                Ok(RawMap(entries))
            }
        }
        d.deserialize_map(V)
    }
}

fn raw_items(text: &str) -> Option<Vec<Box<RawValue>>> {
    serde_json::from_str(text).ok()
}

/// Whether a tool entry is named as `view`'s tool as `JSON.parse` reads it (the last
/// `name` wins), without reading anything else of the entry.
fn named_view(entry: &str, view: View) -> bool {
    let Some(map) = RawMap::parse(entry) else {
        return false;
    };
    map.get("name")
        .and_then(|n| serde_json::from_str::<String>(n).ok())
        .is_some_and(|n| n == tool_name(view))
}

/// Whether a resource entry mentions `view` in its decoded text.
fn mentions_view(entry: &str, view: View) -> bool {
    let decoded = serde_json::from_str::<Value>(entry)
        .map(|v| v.to_string())
        .unwrap_or_else(|_| entry.to_owned())
        .to_lowercase();
    needles(view).iter().any(|n| decoded.contains(n))
}

/// `frontmatter`: decoding frontmatter (section-source spec §2, §3, §5). The first byte
/// picks the input (`% 4`): a raw file for the YAML split, a stored string field for both
/// surfaces' decoders, a stored JSON value, or a whole canister note (then the document
/// is built as the tool builds it).
///
/// - Nothing panics; `String()` of what was read never panics.
/// - Raw: the body is the end of the text; without a leading `---` line nothing is read;
///   `project` is never read.
/// - Stored: the REST decoder never fails; the MCP decoder fails only on a quoted text
///   (its unguarded parse); both read a plain JSON object the same way, as
///   [`Frontmatter`] keeps it.
/// - Notes: every document built keeps the allowlist of the extractor check.
pub fn frontmatter(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 4 {
        0 => {
            let text = String::from_utf8_lossy(rest);
            let (fm, body) = yaml::split_raw(&text);
            assert!(fm.project.is_none(), "project read from a raw file");
            assert!(
                js::trim_end(&text).ends_with(body),
                "body is not the text's end"
            );
            if !text.starts_with("---") {
                assert_eq!(fm, Frontmatter::default());
                assert_eq!(body, js::trim_end(&text));
            }
            check_frontmatter(&fm);
        }
        1 => {
            let text = String::from_utf8_lossy(rest);
            check_stored(&Value::String(text.clone().into_owned()));
            let trimmed = js::trim(&text);
            let rest_fm = decode_stored(
                Some(&Value::String(text.clone().into_owned())),
                Surface::Rest,
            );
            let mcp_fm = decode_stored(
                Some(&Value::String(text.clone().into_owned())),
                Surface::Mcp,
            );
            if mcp_fm.is_err() {
                assert!(
                    trimmed.starts_with('"') && trimmed.ends_with('"'),
                    "the MCP decoder failed on an unquoted text"
                );
            }
            if let Ok(Value::Object(o)) = serde_json::from_str::<Value>(trimmed) {
                let want = Frontmatter {
                    title: o.get("title").map(FmValue::from_json),
                    project: o.get("project").map(FmValue::from_json),
                };
                assert_eq!(
                    rest_fm.as_ref(),
                    Ok(&want),
                    "REST reads an object differently"
                );
                assert_eq!(
                    mcp_fm.as_ref(),
                    Ok(&want),
                    "MCP reads an object differently"
                );
            }
        }
        2 => {
            if let Ok(v) = serde_json::from_slice::<Value>(rest) {
                check_stored(&v);
            }
        }
        _ => {
            let Ok(path) = validate(NOTE_PATH) else {
                panic!("fixed path rejected");
            };
            for surface in [Surface::Rest, Surface::Mcp] {
                if let Ok(note) = parse_note(rest, surface) {
                    check_frontmatter(&note.frontmatter);
                    if let Ok(doc) =
                        extract::build(&path, &note.frontmatter, &note.body, &Limits::default())
                    {
                        check_document(&doc);
                    }
                }
            }
        }
    }
}

/// Both decoders on one stored `frontmatter` value.
fn check_stored(v: &Value) {
    let rest = decode_stored(Some(v), Surface::Rest);
    let Ok(rest) = rest else {
        panic!("the REST decoder failed");
    };
    check_frontmatter(&rest);
    if let Ok(mcp) = decode_stored(Some(v), Surface::Mcp) {
        check_frontmatter(&mcp);
    }
    if !matches!(v, Value::Object(_) | Value::String(_)) {
        assert_eq!(rest, Frontmatter::default());
    }
}

fn check_frontmatter(fm: &Frontmatter) {
    // Only whether String() throws matters here; it must not panic.
    let _ = fm.title_string();
    if let Some(p) = &fm.project {
        let _ = p.js_string();
    }
}

/// `extract`: the SectionSource v0 extractor on arbitrary text (decoded lossily, so every
/// input reaches it) never panics, as a raw file or as a stored body; the serialized
/// document carries only the allowlisted keys, with `body_returned` and
/// `snippet_returned` always false (section-source spec §11).
pub fn extract(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let Ok(path) = validate(NOTE_PATH) else {
        panic!("fixed path rejected");
    };
    if let Ok(doc) = extract::build_from_raw(&path, &text, &Limits::default()) {
        check_document(&doc);
    }
    if let Ok(doc) = extract::build(&path, &Frontmatter::default(), &text, &Limits::default()) {
        check_document(&doc);
    }
}

const TOP_KEYS: &[&str] = &["schema", "path", "title", "sections", "truncated"];
const SECTION_KEYS: &[&str] = &[
    "section_id",
    "heading_id",
    "level",
    "heading_path",
    "heading_text",
    "child_section_ids",
    "body_available",
    "body_returned",
    "snippet_returned",
];

fn check_document(doc: &SectionSource) {
    let json = match serde_json::to_string(doc) {
        Ok(json) => json,
        Err(e) => panic!("serialization failed: {e}"),
    };
    let prefix = format!("{{\"schema\":\"{SCHEMA}\",\"path\":\"{NOTE_PATH}\",");
    assert!(json.starts_with(&prefix), "unexpected start: {json}");
    assert!(!json.contains("\"body_returned\":true"));
    assert!(!json.contains("\"snippet_returned\":true"));

    let value: Value = match serde_json::from_str(&json) {
        Ok(v) => v,
        Err(e) => panic!("output is not JSON: {e}"),
    };
    let Value::Object(top) = &value else {
        panic!("document is not an object");
    };
    assert_keys(top, TOP_KEYS);
    let Some(Value::Array(sections)) = top.get("sections") else {
        panic!("sections is not an array");
    };
    for section in sections {
        let Value::Object(section) = section else {
            panic!("section is not an object");
        };
        assert_keys(section, SECTION_KEYS);
        assert_eq!(section.get("body_returned"), Some(&Value::Bool(false)));
        assert_eq!(section.get("snippet_returned"), Some(&Value::Bool(false)));
    }
}

/// Exactly the allowlisted keys, compared as sorted lists (the map's order depends on
/// serde_json features; the wire order is fixed by the struct definitions and checked for
/// the first keys by the serialized prefix).
fn assert_keys(map: &Map<String, Value>, allowed: &[&str]) {
    let mut want = allowed.to_vec();
    want.sort_unstable();
    let mut got: Vec<&str> = map.keys().map(String::as_str).collect();
    got.sort_unstable();
    assert_eq!(got, want);
}

/// `views`: the three body-free views of arbitrary text (decoded lossily), as a raw file
/// and as a stored body, at the default caps and at a small heading cap taken from the
/// first byte. Building never panics; the NoteOutline and the DocumentTree carry only
/// their allowlisted keys; the outline's ids are the SectionSource's heading ids in
/// order (levels and texts too); the tree, walked in pre-order, is the outline, each
/// child deeper than its parent; `truncated`, path and title agree.
pub fn views(data: &[u8]) {
    let Some((&cap, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let Ok(path) = validate(NOTE_PATH) else {
        panic!("fixed path rejected");
    };
    for limits in [
        Limits::default(),
        Limits {
            max_headings: usize::from(cap % 16),
            ..Limits::default()
        },
    ] {
        if let Ok(h) = extract::parse_from_raw(&path, &text, &limits) {
            check_views(h);
        }
        if let Ok(h) = extract::parse(&path, &Frontmatter::default(), &text, &limits) {
            check_views(h);
        }
    }
}

const OUTLINE_KEYS: &[&str] = &["schema", "path", "title", "headings", "truncated"];
const HEADING_KEYS: &[&str] = &["level", "text", "id"];
const TREE_KEYS: &[&str] = &["schema", "path", "title", "root", "truncated"];
const NODE_KEYS: &[&str] = &["id", "level", "text", "children"];

fn check_views(h: extract::Headings<'_>) {
    let outline = h.note_outline();
    let tree = h.document_tree();
    let ss = h.section_source();
    check_document(&ss);

    let parse = |json: &str| -> Map<String, Value> {
        match serde_json::from_str(json) {
            Ok(Value::Object(m)) => m,
            _ => panic!("view is not a JSON object: {json}"),
        }
    };
    let o = parse(&outline.to_json());
    assert_keys(&o, OUTLINE_KEYS);
    assert_eq!(
        o.get("schema").and_then(Value::as_str),
        Some(extract::NOTE_OUTLINE_SCHEMA)
    );
    for heading in o
        .get("headings")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Value::Object(heading) = heading else {
            panic!("heading is not an object");
        };
        assert_keys(heading, HEADING_KEYS);
    }
    let t = parse(&tree.to_json());
    assert_keys(&t, TREE_KEYS);
    assert_eq!(
        t.get("schema").and_then(Value::as_str),
        Some(extract::DOCUMENT_TREE_SCHEMA)
    );
    fn nodes(v: Option<&Value>, parent: u64) {
        for node in v.and_then(Value::as_array).into_iter().flatten() {
            let Value::Object(node) = node else {
                panic!("node is not an object");
            };
            assert_keys(node, NODE_KEYS);
            let level = node.get("level").and_then(Value::as_u64).unwrap_or(0);
            assert!(level > parent && level <= 6, "level {level} under {parent}");
            nodes(node.get("children"), level);
        }
    }
    let Some(Value::Object(root)) = t.get("root") else {
        panic!("root is not an object");
    };
    assert_keys(root, &["children"]);
    nodes(root.get("children"), 0);

    let from_outline: Vec<(u8, &str, &str)> = outline
        .headings()
        .iter()
        .map(|h| (h.level(), h.text(), h.id()))
        .collect();
    let from_ss: Vec<(u8, &str, &str)> = ss
        .sections()
        .iter()
        .map(|s| (s.level(), s.heading_text(), s.heading_id()))
        .collect();
    assert_eq!(from_outline, from_ss);
    let flat: Vec<(u8, &str, &str)> = tree
        .nodes()
        .iter()
        .map(|n| (n.level(), n.text(), n.id()))
        .collect();
    assert_eq!(flat, from_outline);
    assert_eq!(outline.truncated(), ss.truncated());
    assert_eq!(tree.truncated(), ss.truncated());
    assert_eq!((outline.path(), outline.title()), (ss.path(), ss.title()));
    assert_eq!((tree.path(), tree.title()), (ss.path(), ss.title()));
}

/// `upstream_wire`: the HTTP/1.1 the sidecar reads from plain-http upstreams
/// (`upstream::wire`). The first byte picks the request method (bit 0: `HEAD`) and a
/// piece size (the rest); the remaining bytes are an upstream's answer. Reading a head
/// never panics and never takes more than it was given or than `MAX_HEAD_BYTES`; a final
/// head is never informational or an upgrade, carries no hop-by-hop header, and its
/// framing agrees with the headers it kept. The chunked decoder gives the same data, end
/// and error fed whole or in pieces, never more data than it was given, and gives back
/// exactly what `push_chunk` encoded.
pub fn upstream_wire(data: &[u8]) {
    use bytes::BytesMut;
    use http::header::CONTENT_LENGTH;
    use http::{Method, StatusCode};

    use knowtation_sidecar::upstream::wire::{
        parse_head, push_chunk, Chunked, Framing, Parsed, HOP_BY_HOP, LAST_CHUNK, MAX_HEAD_BYTES,
    };

    let Some((&mode, answer)) = data.split_first() else {
        return;
    };
    let method = if mode & 1 == 1 {
        Method::HEAD
    } else {
        Method::GET
    };
    match parse_head(answer, &method) {
        Ok(Parsed::Final(head, len)) => {
            assert!(len <= answer.len() && len <= MAX_HEAD_BYTES);
            assert!(!head.status.is_informational());
            assert_ne!(head.status, StatusCode::SWITCHING_PROTOCOLS);
            for name in HOP_BY_HOP {
                assert!(!head.headers.contains_key(&name), "{name} kept");
            }
            match head.framing {
                Framing::Length(n) => {
                    assert!(method != Method::HEAD);
                    for v in head.headers.get_all(CONTENT_LENGTH) {
                        for part in v.as_bytes().split(|&b| b == b',') {
                            let text = std::str::from_utf8(part.trim_ascii()).unwrap_or("");
                            assert_eq!(text.parse::<u64>().ok(), Some(n));
                        }
                    }
                }
                Framing::Empty => assert!(
                    method == Method::HEAD
                        || head.status == StatusCode::NO_CONTENT
                        || head.status == StatusCode::NOT_MODIFIED
                ),
                Framing::Chunked | Framing::UntilClose => {}
            }
            if head.framing == Framing::UntilClose {
                assert!(!head.keep_alive);
            }
            // Nothing another reader could frame differently was accepted: every line
            // ends in CRLF, at most one framing header, one `chunked` coding alone.
            let raw = &answer[..len];
            for (i, b) in raw.iter().enumerate() {
                assert!(*b != b'\n' || (i > 0 && raw[i - 1] == b'\r'), "bare LF");
            }
            let named = |name: &str| {
                raw.split(|b| *b == b'\n')
                    .filter_map(|line| line.split(|b| *b == b':').next())
                    .filter(|n| n.eq_ignore_ascii_case(name.as_bytes()))
                    .count()
            };
            let (lengths, codings) = (named("content-length"), named("transfer-encoding"));
            assert!(lengths <= 1 && codings <= 1 && lengths + codings <= 1);
            if codings == 1 && head.framing != Framing::Empty {
                assert_eq!(head.framing, Framing::Chunked);
            }
            if lengths + codings == 1 && head.framing == Framing::Empty {
                assert!(head.status != StatusCode::NO_CONTENT);
            }
        }
        Ok(Parsed::Informational(len)) => assert!(len <= answer.len() && len <= MAX_HEAD_BYTES),
        Ok(Parsed::Partial) | Err(_) => {}
    }

    let piece = usize::from(mode >> 1).max(1);
    let whole = decode_chunked(answer, answer.len().max(1));
    let pieces = decode_chunked(answer, piece);
    assert_eq!(whole, pieces, "pieces of {piece}");
    if let (Ok(body), _) = &whole {
        assert!(body.len() <= answer.len());
    }

    let mut encoded = Vec::new();
    for chunk in answer.chunks(piece) {
        push_chunk(&mut encoded, chunk);
    }
    encoded.extend_from_slice(LAST_CHUNK);
    let (decoded, end) = decode_chunked(&encoded, piece);
    assert_eq!(decoded.as_deref(), Ok(answer));
    assert!(end);

    /// Feeds `input` to one decoder `piece` bytes at a time: the data, or the first
    /// error, and whether the body ended.
    fn decode_chunked(
        input: &[u8],
        piece: usize,
    ) -> (
        Result<Vec<u8>, knowtation_sidecar::upstream::wire::WireError>,
        bool,
    ) {
        use knowtation_sidecar::upstream::wire::Decoded;
        let mut decoder = Chunked::default();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let mut rest = input;
        loop {
            match decoder.decode(&mut buf) {
                Ok(Decoded::Data(d)) => out.extend_from_slice(&d),
                Ok(Decoded::End) => return (Ok(out), true),
                Ok(Decoded::Partial) if rest.is_empty() => return (Ok(out), false),
                Ok(Decoded::Partial) => {
                    let n = piece.min(rest.len());
                    buf.extend_from_slice(&rest[..n]);
                    rest = &rest[n..];
                }
                Err(e) => return (Err(e), false),
            }
        }
    }
}
