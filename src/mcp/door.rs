//! The door of `POST /mcp` (wire contract §6 Deviations): what a body must look like
//! before anything reads it as JSON-RPC, and the one form in which it may leave.
//!
//! The gateway reads a body with body-parser (which inflates gzip and deflate and decodes
//! any charset iconv-lite knows, taking the *last* `charset` parameter) and then zod
//! (which copies keys by assignment, so a `__proto__` key becomes a prototype whose
//! fields the SDK reads). Any difference between that reading and ours could run the
//! tool behind the sidecar. So the door accepts one reading only and forwards only what
//! it read:
//! - `Content-Type` is `application/json` with no parameter or exactly one
//!   `charset=utf-8` (any case, quoted or not), parsed by the RFC 9110 grammar; anything
//!   else, a repeated header included, is 415.
//! - `Content-Encoding` is absent or `identity`; anything else is 415.
//! - The body is UTF-8 JSON (no BOM) whose objects carry no `__proto__` key at any depth,
//!   however it is escaped (keys are compared after unescaping); repeated keys resolve as
//!   `JSON.parse` resolves them: the first position, the last value.
//! - What goes to the gateway is [`Canonical::text`], the sidecar's own compact
//!   serialization of that value, and the message is classified by reading exactly those
//!   bytes, so what is classified and what is forwarded cannot differ. Numbers are
//!   written as JavaScript prints the double `JSON.parse` would make of them (a number
//!   beyond the double range, which serde refuses, makes the body unreadable: 400).

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap};
use http_body_util::BodyExt;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use crate::budget::{Refusal, Slot};
use crate::js;

/// Why a body is refused at the door.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoorError {
    /// No `application/json` in `Content-Type` at all: what the SDK itself refuses (§6
    /// step 6), answered with its body.
    NotJson,
    /// `application/json` with another parameter or charset, several `Content-Type`
    /// headers, or a non-identity encoding.
    MediaType,
    /// Not UTF-8 JSON, or a `__proto__` key.
    Body,
}

/// The key zod would turn into a prototype.
const PROTO: &str = "__proto__";

/// Objects with more keys than this get an index for repeated-key lookups.
const INDEX_FROM: usize = 16;

/// Checks `Content-Type` and `Content-Encoding`.
pub fn check_headers(headers: &HeaderMap) -> Result<(), DoorError> {
    for v in headers.get_all(header::CONTENT_ENCODING) {
        let text = v.to_str().map_err(|_| DoorError::MediaType)?;
        let identity = text
            .split(',')
            .map(|t| t.trim_matches([' ', '\t']))
            .all(|t| t.is_empty() || t.eq_ignore_ascii_case("identity"));
        if !identity {
            return Err(DoorError::MediaType);
        }
    }
    let mut all = headers.get_all(header::CONTENT_TYPE).iter();
    let (first, second) = (all.next(), all.next());
    let mentions_json = |v: Option<&http::HeaderValue>| {
        v.is_some_and(|v| {
            String::from_utf8_lossy(v.as_bytes())
                .to_ascii_lowercase()
                .contains("application/json")
        })
    };
    let (Some(ct), None) = (first, second) else {
        return Err(if mentions_json(first) || mentions_json(second) {
            DoorError::MediaType
        } else {
            DoorError::NotJson
        });
    };
    let text = ct.to_str().map_err(|_| DoorError::MediaType)?;
    if json_utf8(text) {
        Ok(())
    } else if mentions_json(Some(ct)) {
        Err(DoorError::MediaType)
    } else {
        Err(DoorError::NotJson)
    }
}

/// `application/json`, then no parameter or exactly one `charset=utf-8`.
fn json_utf8(value: &str) -> bool {
    let Some(params) = parse_media_type(value, "application/json") else {
        return false;
    };
    match params.as_slice() {
        [] => true,
        [(name, v)] => name.eq_ignore_ascii_case("charset") && v.eq_ignore_ascii_case("utf-8"),
        _ => false,
    }
}

/// RFC 9110 §8.3.1: `type "/" subtype *( OWS ";" OWS [ parameter ] )` with `parameter =
/// token "=" ( token / quoted-string )`. Returns the parameters (names as written, quoted
/// values unescaped) when the essence equals `essence` (case-insensitive) and the whole
/// value parses; `None` otherwise.
fn parse_media_type(value: &str, essence: &str) -> Option<Vec<(String, String)>> {
    let ows = |s: &str| s.trim_start_matches([' ', '\t']).len();
    let value = value.trim_matches([' ', '\t']);
    let end = value.find([';', ' ', '\t']).unwrap_or(value.len());
    let (head, mut rest) = value.split_at(end);
    if !head.eq_ignore_ascii_case(essence) {
        return None;
    }
    let mut params = Vec::new();
    loop {
        rest = &rest[rest.len() - ows(rest)..];
        if rest.is_empty() {
            return Some(params);
        }
        rest = rest.strip_prefix(';')?;
        rest = &rest[rest.len() - ows(rest)..];
        if rest.is_empty() || rest.starts_with(';') {
            continue;
        }
        let name_end = rest.find(|c: char| !is_tchar(c)).unwrap_or(rest.len());
        if name_end == 0 {
            return None;
        }
        let name = &rest[..name_end];
        rest = rest[name_end..].strip_prefix('=')?;
        let v = if let Some(quoted) = rest.strip_prefix('"') {
            let mut out = String::new();
            let mut chars = quoted.char_indices();
            let mut closed = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '"' => {
                        closed = Some(i + 1);
                        break;
                    }
                    '\\' => out.push(chars.next()?.1),
                    c => out.push(c),
                }
            }
            rest = &quoted[closed?..];
            out
        } else {
            let end = rest.find(|c: char| !is_tchar(c)).unwrap_or(rest.len());
            if end == 0 {
                return None;
            }
            let token = rest[..end].to_owned();
            rest = &rest[end..];
            token
        };
        params.push((name.to_owned(), v));
    }
}

/// RFC 9110 `tchar`.
fn is_tchar(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)
}

/// A body as the door read it.
#[derive(Debug)]
pub struct Canonical {
    /// The compact serialization forwarded to the gateway.
    pub text: String,
    /// The same bytes parsed back: what the sidecar classifies.
    pub value: Value,
    /// The parse's memory reserved in the caller's budget, beyond the bytes, to give back
    /// once the value is dropped.
    pub parse_cost: usize,
}

/// Reads a body: UTF-8 JSON with JavaScript's repeated-key rule and no `__proto__` key;
/// returns its canonical form and the value classified from it. Takes the bytes by value
/// (or by reference) so an owned body is freed as soon as it has been parsed.
pub fn canonical(bytes: impl AsRef<[u8]>) -> Result<Canonical, DoorError> {
    let len = bytes.as_ref().len();
    let parsed: Js = {
        let text = std::str::from_utf8(bytes.as_ref()).map_err(|_| DoorError::Body)?;
        serde_json::from_str(text).map_err(|_| DoorError::Body)?
    };
    // The client's bytes go before the canonical copy is made: one body-sized block less
    // at the peak.
    drop(bytes);
    let mut out = String::with_capacity(len);
    parsed.write(&mut out);
    drop(parsed);
    let value = serde_json::from_str(&out).map_err(|_| DoorError::Body)?;
    Ok(Canonical {
        text: out,
        value,
        parse_cost: 0,
    })
}

/// A JSON value as `JSON.parse` builds it: numbers are doubles, object keys keep their
/// first position and their last value.
enum Js {
    Null,
    Bool(bool),
    Number(f64),
    String(String),
    Array(Vec<Js>),
    Object(Vec<(String, Js)>),
}

impl Js {
    fn write(&self, out: &mut String) {
        match self {
            Js::Null => out.push_str("null"),
            Js::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Js::Number(x) => out.push_str(&js::number_to_string(*x)),
            Js::String(s) => write_string(s, out),
            Js::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    item.write(out);
                }
                out.push(']');
            }
            Js::Object(entries) => {
                out.push('{');
                for (i, (k, v)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_string(k, out);
                    out.push(':');
                    v.write(out);
                }
                out.push('}');
            }
        }
    }
}

fn write_string(s: &str, out: &mut String) {
    // serde_json escapes exactly what JSON requires (quote, backslash, controls) and
    // writes everything else as UTF-8, which `JSON.parse` reads back unchanged.
    match serde_json::to_string(s) {
        Ok(quoted) => out.push_str(&quoted),
        // Serializing a `str` cannot fail; an empty string keeps the output valid JSON.
        Err(_) => out.push_str("\"\""),
    }
}

impl<'de> Deserialize<'de> for Js {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Js, D::Error> {
        d.deserialize_any(JsVisitor)
    }
}

struct JsVisitor;

impl<'de> Visitor<'de> for JsVisitor {
    type Value = Js;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Js, E> {
        Ok(Js::Null)
    }

    fn visit_bool<E>(self, v: bool) -> Result<Js, E> {
        Ok(Js::Bool(v))
    }

    // An integer literal is exact here; converting rounds to the nearest double, ties to
    // even, which is what `JSON.parse` makes of the same digits.
    fn visit_i64<E>(self, v: i64) -> Result<Js, E> {
        Ok(Js::Number(v as f64))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Js, E> {
        Ok(Js::Number(v as f64))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Js, E> {
        Ok(Js::Number(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Js, E> {
        Ok(Js::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Js, E> {
        Ok(Js::String(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Js, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Js::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Js, A::Error> {
        let mut entries: Vec<(String, Js)> = Vec::new();
        let mut index: Option<HashMap<String, usize>> = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == PROTO {
                return Err(de::Error::custom("a __proto__ key"));
            }
            let value: Js = map.next_value()?;
            if index.is_none() && entries.len() >= INDEX_FROM {
                index = Some(
                    entries
                        .iter()
                        .enumerate()
                        .map(|(i, (k, _))| (k.clone(), i))
                        .collect(),
                );
            }
            let found = match &index {
                Some(ix) => ix.get(&key).copied(),
                None => entries.iter().position(|(k, _)| *k == key),
            };
            match found.and_then(|i| entries.get_mut(i)) {
                Some(slot) => slot.1 = value,
                None => {
                    if let Some(ix) = &mut index {
                        ix.insert(key.clone(), entries.len());
                    }
                    entries.push((key, value));
                }
            }
        }
        Ok(Js::Object(entries))
    }
}

/// Why a body could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadError {
    /// Over the cap.
    TooLarge,
    /// Not all in within the read deadline.
    Timeout,
    /// The budget has no room for it.
    Overloaded(Refusal),
    /// The client broke off.
    Broken,
}

/// Reads a body of at most `cap` bytes before `timeout` runs out, reserving each chunk
/// in `slot`'s budget before keeping it.
///
/// Chunks are kept as they arrive and joined into one buffer only once the body is
/// complete: nothing is sized from the announced length, so a body that never finishes
/// holds only what it sent, in small blocks the allocator reuses. (Sizing buffers to
/// announced 9 MiB bodies kept ~250 MiB resident under a flood from one user whose
/// budget held 24 MiB: freed large blocks came back dirty.)
pub async fn read_body<B>(
    body: B,
    announced: Option<u64>,
    slot: &mut Slot,
    cap: usize,
    timeout: Duration,
) -> Result<Bytes, ReadError>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
{
    if announced.is_some_and(|n| n > cap as u64) {
        return Err(ReadError::TooLarge);
    }
    let read = async {
        let mut body = body;
        let mut chunks: Vec<Bytes> = Vec::new();
        let mut len = 0usize;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|_| ReadError::Broken)?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            if len.saturating_add(data.len()) > cap {
                return Err(ReadError::TooLarge);
            }
            slot.reserve(data.len()).map_err(ReadError::Overloaded)?;
            len += data.len();
            chunks.push(data);
        }
        Ok(join(chunks, len))
    };
    tokio::time::timeout(timeout, read)
        .await
        .map_err(|_| ReadError::Timeout)?
}

/// One contiguous buffer of exactly `len` bytes (no copy for a single chunk).
fn join(chunks: Vec<Bytes>, len: usize) -> Bytes {
    if chunks.len() == 1 {
        return chunks.into_iter().next().unwrap_or_default();
    }
    let mut out = BytesMut::with_capacity(len);
    for c in chunks {
        out.extend_from_slice(&c);
    }
    out.freeze()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn ct(v: &str) -> bool {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_str(v).unwrap());
        check_headers(&h).is_ok()
    }

    #[test]
    fn s6_content_type_is_json_with_at_most_utf8() {
        for ok in [
            "application/json",
            "Application/JSON",
            "application/json; charset=utf-8",
            "application/json;charset=UTF-8",
            "application/json ; charset=\"utf-8\"",
            "application/json; charset=\"UTF-8\" ",
            "application/json;",
            "application/json; ;charset=utf-8",
        ] {
            assert!(ct(ok), "{ok}");
        }
        for bad in [
            "application/json; charset=utf-8; charset=utf-7",
            "application/json; x=\"; charset=utf-8\"; charset=utf-7",
            "application/json; charset=utf-7",
            "application/json; charset=utf8",
            "application/json; charset=utf-16le",
            "application/json; charset=\"utf-8",
            "application/json; charset=",
            "application/json; charset",
            "application/json; foo=bar",
            "application/json, text/plain",
            "application/jsonx",
            "application/json-seq",
            "text/json",
            "application/json; charset=utf-8 x",
            "",
        ] {
            assert!(!ct(bad), "{bad}");
        }
        let mut h = HeaderMap::new();
        assert_eq!(check_headers(&h), Err(DoorError::NotJson));
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        assert_eq!(check_headers(&h), Err(DoorError::NotJson));
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=utf-7"),
        );
        assert_eq!(check_headers(&h), Err(DoorError::MediaType));
        h.remove(header::CONTENT_TYPE);
        h.append(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.append(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        assert_eq!(check_headers(&h), Err(DoorError::MediaType));
    }

    #[test]
    fn s6_repeated_content_types_are_json_when_either_names_json() {
        // Two headers are refused either way; which answer depends on whether either
        // names JSON (the SDK's own refusal is for a request that names none).
        for (first, second, want) in [
            ("application/json", "text/plain", DoorError::MediaType),
            ("text/plain", "application/json", DoorError::MediaType),
            ("text/plain", "text/html", DoorError::NotJson),
        ] {
            let mut h = HeaderMap::new();
            h.append(header::CONTENT_TYPE, HeaderValue::from_static(first));
            h.append(header::CONTENT_TYPE, HeaderValue::from_static(second));
            assert_eq!(check_headers(&h), Err(want), "{first}, {second}");
        }
    }

    /// A body sent in these chunks.
    struct Chunks(std::collections::VecDeque<Bytes>);

    impl hyper::body::Body for Chunks {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
            std::task::Poll::Ready(self.0.pop_front().map(|b| Ok(hyper::body::Frame::data(b))))
        }
    }

    fn chunks(parts: &[&'static [u8]]) -> Chunks {
        Chunks(parts.iter().map(|p| Bytes::from_static(p)).collect())
    }

    #[tokio::test]
    async fn a_body_of_exactly_the_cap_is_read_whole_and_one_byte_more_is_not() {
        let budget = crate::budget::Budget::new(
            crate::budget::Limits {
                max_in_flight: 4,
                max_in_flight_per_user: 4,
                max_bytes: 1024,
                max_bytes_per_user: 1024,
            },
            None,
        );
        let read = |body: Chunks, announced: Option<u64>| {
            let mut slot = budget.admit("u").unwrap();
            async move { read_body(body, announced, &mut slot, 5, Duration::from_secs(5)).await }
        };
        // Exactly the cap, announced and sent in two chunks: joined whole.
        assert_eq!(
            read(chunks(&[b"abc", b"de"]), Some(5)).await,
            Ok(Bytes::from_static(b"abcde"))
        );
        assert_eq!(
            read(chunks(&[b"abc", b"de"]), None).await,
            Ok(Bytes::from_static(b"abcde"))
        );
        // One byte more announced is refused before reading; one more sent, at the chunk
        // that takes it over.
        assert_eq!(
            read(chunks(&[b"abc", b"de"]), Some(6)).await,
            Err(ReadError::TooLarge)
        );
        assert_eq!(
            read(chunks(&[b"abc", b"def"]), None).await,
            Err(ReadError::TooLarge)
        );
    }

    #[test]
    fn s6_only_identity_encoding() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(
            header::CONTENT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        assert!(check_headers(&h).is_ok());
        for bad in ["gzip", "deflate", "identity, gzip", "br", "x"] {
            h.insert(header::CONTENT_ENCODING, HeaderValue::from_static(bad));
            assert_eq!(check_headers(&h), Err(DoorError::MediaType), "{bad}");
        }
    }

    fn canon(s: &str) -> Result<String, DoorError> {
        canonical(s.as_bytes()).map(|c| c.text)
    }

    #[test]
    fn s6_prototype_keys_are_refused_however_written() {
        for body in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"__proto__":{"name":"get_section_source"},"arguments":{"path":"a.md"}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"\u005f_proto__":{"name":"get_section_source"}}}"#,
            r#"{"a":{"__prot\u006f__":1}}"#,
            r#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"__proto__":{"name":"get_section_source","arguments":{"path":"a.md"}}}}]"#,
            r#"{"a":[[[{"b":{"__proto__":null}}]]]}"#,
            r#"{"__proto__":1}"#,
        ] {
            assert_eq!(canon(body), Err(DoorError::Body), "{body}");
        }
        // Look-alikes are ordinary keys.
        assert!(canon(r#"{"__proto___":1,"_proto_":2,"__PROTO__":3}"#).is_ok());
    }

    #[test]
    fn s6_repeated_keys_resolve_as_json_parse() {
        assert_eq!(
            canon(r#"{"name":"x","b":1,"name":"get_section_source"}"#).unwrap(),
            r#"{"name":"get_section_source","b":1}"#
        );
        let many: String = (0..40).map(|i| format!(r#""k{i}":{i},"#)).collect();
        let body = format!(r#"{{{many}"k3":"last"}}"#);
        let c = canonical(body.as_bytes()).unwrap();
        assert_eq!(c.value["k3"], "last");
        assert!(c
            .text
            .starts_with(r#"{"k0":0,"k1":1,"k2":2,"k3":"last","k4":4"#));
    }

    #[test]
    fn s6_canonical_form_is_compact_utf8_with_js_numbers() {
        assert_eq!(
            canon(" { \"a\" : [ 1.0 , 1e2 , -0 , 0.1 , 1e21 , 12345678901234567890 , \"\\u0067\\u00e9\\n\" ] } ").unwrap(),
            "{\"a\":[1,100,0,0.1,1e+21,12345678901234567000,\"g\u{e9}\\n\"]}"
        );
        assert_eq!(canon("\"x\"").unwrap(), "\"x\"");
        for bad in [
            "",
            "\u{feff}{}",
            "{",
            "1e400",
            r#""\ud800""#,
            "{\"a\":1}x",
            "nul",
        ] {
            assert_eq!(canon(bad), Err(DoorError::Body), "{bad:?}");
        }
        assert_eq!(
            canonical(b"{\"a\":\"\xff\"}").map(|c| c.text),
            Err(DoorError::Body)
        );
    }
}
