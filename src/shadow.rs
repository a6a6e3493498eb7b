//! Shadow mode (`intercept.mode = "shadow"`): the gateway answers the intercepted
//! surface, the sidecar computes its own answer beside it, and this module compares the
//! two, for each view the sidecar owns (`knowtation.section_source/v0`,
//! `knowtation.note_outline/v1`, `knowtation.document_tree/v0`; wire contract §5 and
//! §6). The comparison looks at the status class, the allowlisted fields, fields the
//! sidecar would not send, and whether anything the gateway sent holds text of the note's body. Its
//! only output is a [`Shadow`] label: nothing either answer said is logged or counted.
//!
//! The gateway's answer reaches the client unchanged and unbuffered; [`Observed`] copies
//! at most [`MAX_OBSERVED_BYTES`] of it on the way and compares once it has ended.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::StatusCode;
use hyper::body::{Body, Frame, SizeHint};
use serde_json::Value;

use crate::telemetry::{self, Metrics, Shadow, Surface};

/// The most of a gateway answer kept for the comparison. A SectionSource document is
/// bounded by the extractor's limits (500 headings) far below this; a larger answer is
/// passed on whole and counted as [`Shadow::Unreadable`].
pub const MAX_OBSERVED_BYTES: usize = 4 * 1024 * 1024;

/// The shortest run of characters that counts as body text: shorter strings (a word, a
/// number) occur in any note by chance.
const MIN_BODY_TEXT: usize = 12;

/// The most runs [`body_text`] looks up for one answer.
const MAX_PROBES: usize = 1024;

/// The sidecar's own answer, computed and not sent.
#[derive(Debug)]
pub struct Own {
    /// Its status.
    pub status: StatusCode,
    /// Its body (empty for `HEAD` and preflight answers).
    pub body: Bytes,
    /// The answer came from one of the sidecar's deliberate limits (rate limit,
    /// admission): the gateway has none to agree with.
    pub limited: bool,
    /// Whether the bodies are compared (a `GET` or an MCP call), or only statuses.
    pub compare_body: bool,
    /// The note's Markdown body, when the sidecar read it: what "body text" means.
    pub witness: Option<String>,
}

impl Own {
    /// The sidecar's answer as built; its bodies are whole, so reading one never waits.
    pub async fn from_response(
        response: http::Response<http_body_util::Full<Bytes>>,
        limited: bool,
        witness: Option<String>,
    ) -> Own {
        use http_body_util::BodyExt;
        let (parts, body) = response.into_parts();
        let body = match body.collect().await {
            Ok(c) => c.to_bytes(),
            Err(never) => match never {},
        };
        Own {
            status: parts.status,
            body,
            limited,
            compare_body: true,
            witness,
        }
    }
}

/// The gateway's answer as observed.
#[derive(Debug)]
pub struct Gateway<'a> {
    /// Its status.
    pub status: StatusCode,
    /// Its `Content-Type`, if readable.
    pub content_type: Option<&'a str>,
    /// Its body, or `None` when it was larger than [`MAX_OBSERVED_BYTES`].
    pub body: Option<&'a [u8]>,
}

/// Compares a REST answer of a view's route (wire contract §5).
pub fn compare_rest(own: &Own, gateway: &Gateway<'_>) -> Shadow {
    if rest_no_route(gateway) {
        return Shadow::NoRoute;
    }
    if own.limited {
        return Shadow::NotCompared;
    }
    if class(own.status) != class(gateway.status) {
        return Shadow::StatusClass;
    }
    if !own.compare_body {
        return Shadow::Agree;
    }
    let Some(body) = gateway.body else {
        return Shadow::Unreadable;
    };
    let (Ok(mine), Ok(theirs)) = (
        serde_json::from_slice::<Value>(&own.body),
        serde_json::from_slice::<Value>(body),
    ) else {
        return Shadow::Unreadable;
    };
    compare_values(&mine, &theirs, own.witness.as_deref())
}

/// Compares an answer to an MCP `tools/call` of a view's tool (wire contract §6).
pub fn compare_mcp(own: &Own, gateway: &Gateway<'_>) -> Shadow {
    let theirs = gateway
        .body
        .and_then(|b| jsonrpc_message(gateway.content_type, b));
    let mine = jsonrpc_message(Some("text/event-stream"), &own.body)
        .or_else(|| jsonrpc_message(Some("application/json"), &own.body));
    if let Some(t) = &theirs {
        if mcp_no_route(t) && !mine.as_ref().is_some_and(mcp_no_route) {
            return Shadow::NoRoute;
        }
    }
    if own.limited {
        return Shadow::NotCompared;
    }
    if class(own.status) != class(gateway.status) {
        return Shadow::StatusClass;
    }
    let Some(body) = gateway.body else {
        return Shadow::Unreadable;
    };
    let (Some(mine), Some(theirs)) = (mine, theirs) else {
        // Two non-JSON answers of the same class (e.g. empty 202s) agree.
        return if body.is_empty() && own.body.is_empty() {
            Shadow::Agree
        } else {
            Shadow::Unreadable
        };
    };
    if result_kind(&mine) != result_kind(&theirs) {
        return Shadow::StatusClass;
    }
    compare_values(
        &expand_text(mine),
        &expand_text(theirs),
        own.witness.as_deref(),
    )
}

fn class(status: StatusCode) -> u16 {
    status.as_u16() / 100
}

/// The gateway's 404 for a route it does not have (Express's `Cannot GET`
/// page, or the canister's own 404 through the `/api/v1` catch-all) differs from the
/// section-source route's exact `Not found` body (§5).
fn rest_no_route(gateway: &Gateway<'_>) -> bool {
    match gateway.status {
        StatusCode::NOT_FOUND => !gateway.body.is_some_and(rest_not_found_body),
        StatusCode::METHOD_NOT_ALLOWED | StatusCode::NOT_IMPLEMENTED => true,
        _ => false,
    }
}

/// The section-source route's own 404 body (§5): a missing note, not a missing route.
fn rest_not_found_body(body: &[u8]) -> bool {
    serde_json::from_slice::<Value>(body)
        .is_ok_and(|v| v == serde_json::json!({"error": "Not found", "code": "NOT_FOUND"}))
}

/// An unknown tool or method: the SDK's `Tool <name> not found` result (for whichever
/// view's tool was called), or JSON-RPC -32601.
fn mcp_no_route(message: &Value) -> bool {
    if message.pointer("/error/code").and_then(Value::as_i64) == Some(-32601) {
        return true;
    }
    message
        .pointer("/result/content/0/text")
        .and_then(Value::as_str)
        .and_then(|t| t.strip_prefix("MCP error -32602: Tool "))
        .and_then(|t| t.strip_suffix(" not found"))
        .and_then(crate::mcp::view_of_tool)
        .is_some()
        && message.pointer("/result/isError") == Some(&Value::Bool(true))
}

/// `result`, `result` with `isError`, or `error`.
fn result_kind(message: &Value) -> u8 {
    if message.get("error").is_some() {
        2
    } else if message.pointer("/result/isError") == Some(&Value::Bool(true)) {
        1
    } else {
        0
    }
}

/// The JSON-RPC answer in a JSON body or in the `data:` lines of an SSE stream (the first
/// message carrying `result` or `error`).
fn jsonrpc_message(content_type: Option<&str>, body: &[u8]) -> Option<Value> {
    let text = std::str::from_utf8(body).ok()?;
    let sse = content_type.is_some_and(|c| c.to_ascii_lowercase().contains("event-stream"));
    if !sse {
        return serde_json::from_str(text).ok();
    }
    let mut data = String::new();
    let mut found = None;
    let mut flush = |data: &mut String| {
        if found.is_none() && !data.is_empty() {
            if let Ok(v) = serde_json::from_str::<Value>(data) {
                if v.get("result").is_some() || v.get("error").is_some() {
                    found = Some(v);
                }
            }
        }
        data.clear();
    };
    // Lines end at CRLF, LF or a lone CR, as an event-stream parser reads them.
    let text = text
        .strip_prefix('\u{FEFF}')
        .unwrap_or(text)
        .replace("\r\n", "\n")
        .replace('\r', "\n");
    for line in text.split('\n') {
        if line.is_empty() {
            flush(&mut data);
        } else if let Some(d) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(d.strip_prefix(' ').unwrap_or(d));
        }
    }
    flush(&mut data);
    found
}

/// A tool result's `content[].text` holds a JSON document as a string (the SectionSource
/// or the error envelope); compared as the document it holds, so that an extra field
/// inside it counts as one.
fn expand_text(mut message: Value) -> Value {
    if let Some(Value::Array(items)) = message.pointer_mut("/result/content") {
        for item in items {
            if let Some(text) = item.get_mut("text") {
                let parsed = text.as_str().and_then(|t| serde_json::from_str(t).ok());
                if let Some(doc @ (Value::Object(_) | Value::Array(_))) = parsed {
                    *text = doc;
                }
            }
        }
    }
    message
}

/// Walks the gateway's value against the sidecar's: a key the sidecar does not send is
/// an extra field, a differing or missing one a mismatch, and any string in either that
/// the sidecar did not send is searched for in the note's body.
fn compare_values(mine: &Value, theirs: &Value, witness: Option<&str>) -> Shadow {
    let mut walk = Walk::default();
    walk.value(mine, theirs);
    if let Some(w) = witness {
        let mut probes = MAX_PROBES;
        if walk
            .unexplained
            .iter()
            .any(|s| body_text(s, w, &mut probes))
        {
            return Shadow::BodyText;
        }
    }
    if walk.extra {
        Shadow::ExtraField
    } else if walk.mismatch {
        Shadow::FieldMismatch
    } else {
        Shadow::Agree
    }
}

#[derive(Default)]
struct Walk<'a> {
    extra: bool,
    mismatch: bool,
    /// Strings the gateway sent where the sidecar sent something else or nothing.
    unexplained: Vec<&'a str>,
}

impl<'a> Walk<'a> {
    fn value(&mut self, mine: &Value, theirs: &'a Value) {
        match (mine, theirs) {
            (Value::Object(m), Value::Object(t)) => {
                for (k, tv) in t {
                    match m.get(k) {
                        Some(mv) => self.value(mv, tv),
                        None => {
                            self.extra = true;
                            self.strings(tv);
                        }
                    }
                }
                if m.keys().any(|k| !t.contains_key(k)) {
                    self.mismatch = true;
                }
            }
            (Value::Array(m), Value::Array(t)) => {
                if m.len() != t.len() {
                    self.mismatch = true;
                }
                for (i, tv) in t.iter().enumerate() {
                    match m.get(i) {
                        Some(mv) => self.value(mv, tv),
                        None => self.strings(tv),
                    }
                }
            }
            (m, t) if m == t => {}
            (_, t) => {
                self.mismatch = true;
                self.strings(t);
            }
        }
    }

    fn strings(&mut self, v: &'a Value) {
        match v {
            Value::String(s) => self.unexplained.push(s),
            Value::Array(a) => a.iter().for_each(|v| self.strings(v)),
            Value::Object(o) => o.values().for_each(|v| self.strings(v)),
            _ => {}
        }
    }
}

/// Whether `s` carries a run of the note's body: [`MIN_BODY_TEXT`] bytes starting at a
/// word of `s`, found in the body. Each lookup spends one of `probes`, so the work per
/// answer stays bounded however large the disagreement.
fn body_text(s: &str, witness: &str, probes: &mut usize) -> bool {
    let starts = s
        .char_indices()
        .filter(|&(i, c)| !c.is_whitespace() && (i == 0 || s[..i].ends_with(char::is_whitespace)))
        .map(|(i, _)| i);
    starts
        .filter_map(|i| {
            let mut end = i + MIN_BODY_TEXT;
            while end < s.len() && !s.is_char_boundary(end) {
                end += 1;
            }
            s.get(i..end)
        })
        .any(|run| {
            if *probes == 0 {
                return false;
            }
            *probes -= 1;
            witness.contains(run)
        })
}

/// The comparison an [`Observed`] body runs at its end.
type Compare = Box<dyn FnOnce(Option<&[u8]>) -> Shadow + Send>;

/// The gateway's answer body on its way to the client: every frame passes at once; up
/// to [`MAX_OBSERVED_BYTES`] are copied, and when the body ends `on_end` gets the copy
/// (`None` if it outgrew the cap). A body dropped before its end (the client left, the
/// gateway broke off) is counted [`Shadow::NotCompared`].
pub struct Observed<B> {
    inner: B,
    copy: Vec<u8>,
    overflow: bool,
    done: Option<Compare>,
    surface: Surface,
    metrics: Arc<Metrics>,
    /// The request's id, for the comparison's log line when the body ends.
    request_id: Option<http::HeaderValue>,
}

impl<B> Observed<B> {
    /// Observes `inner`; `compare` runs once, at its end.
    pub fn new(
        inner: B,
        surface: Surface,
        metrics: Arc<Metrics>,
        compare: impl FnOnce(Option<&[u8]>) -> Shadow + Send + 'static,
    ) -> Observed<B> {
        Observed {
            inner,
            copy: Vec::new(),
            overflow: false,
            done: Some(Box::new(compare)),
            surface,
            metrics,
            request_id: crate::telemetry::request_id::current(),
        }
    }

    fn finish(&mut self, result: Option<Shadow>) {
        if let Some(compare) = self.done.take() {
            let result = result.unwrap_or_else(|| {
                let copy = std::mem::take(&mut self.copy);
                compare((!self.overflow).then_some(copy.as_slice()))
            });
            crate::telemetry::request_id::sync_scope(self.request_id.take(), || {
                record(&self.metrics, self.surface, result);
            });
        }
    }
}

/// Counts and logs one comparison.
pub fn record(metrics: &Metrics, surface: Surface, result: Shadow) {
    metrics.shadow(surface, result);
    telemetry::log_shadow(surface, result);
}

impl<B> Drop for Observed<B> {
    fn drop(&mut self) {
        self.finish(Some(Shadow::NotCompared));
    }
}

impl<B> Body for Observed<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if !this.overflow {
                        if this.copy.len() + data.len() > MAX_OBSERVED_BYTES {
                            this.overflow = true;
                            this.copy = Vec::new();
                        } else {
                            this.copy.extend_from_slice(data);
                        }
                    }
                }
                // A body of known length is not polled past its last frame.
                if this.inner.is_end_stream() {
                    this.finish(None);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                this.finish(None);
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                this.finish(Some(Shadow::NotCompared));
                Poll::Ready(Some(Err(e)))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};
    use serde_json::json;

    const DOC: &str = r#"{"schema":"knowtation.section_source/v0","path":"a.md","title":null,"sections":[{"section_id":"s1","heading_id":"h","level":1,"heading_path":["Intro"],"heading_text":"Intro","child_section_ids":[],"body_available":true,"body_returned":false,"snippet_returned":false}],"truncated":false}"#;
    const WITNESS: &str = "# Intro\n\nThe quarterly numbers are confidential.\n";

    fn own(status: u16, body: &str) -> Own {
        Own {
            status: StatusCode::from_u16(status).unwrap(),
            body: Bytes::from(body.to_owned()),
            limited: false,
            compare_body: true,
            witness: Some(WITNESS.to_owned()),
        }
    }

    fn rest(own: &Own, status: u16, body: &str) -> Shadow {
        compare_rest(
            own,
            &Gateway {
                status: StatusCode::from_u16(status).unwrap(),
                content_type: Some("application/json; charset=utf-8"),
                body: Some(body.as_bytes()),
            },
        )
    }

    #[test]
    fn s5_rest_answers_compare_by_class_fields_and_body_text() {
        let mine = own(200, DOC);
        assert_eq!(rest(&mine, 200, DOC), Shadow::Agree);
        // Key order is no difference.
        let reordered: Value = serde_json::from_str(DOC).unwrap();
        let mut o = reordered.as_object().unwrap().clone();
        let path = o.remove("path").unwrap();
        o.insert("path".into(), path);
        assert_eq!(
            rest(&mine, 200, &Value::Object(o).to_string()),
            Shadow::Agree
        );
        assert_eq!(
            rest(
                &mine,
                502,
                r#"{"error":"Bad Gateway","code":"BAD_GATEWAY"}"#
            ),
            Shadow::StatusClass
        );
        let extra = DOC.replace(r#""truncated":false"#, r#""truncated":false,"etag":"x""#);
        assert_eq!(rest(&mine, 200, &extra), Shadow::ExtraField);
        let leaked = DOC.replace(
            r#""truncated":false"#,
            r#""truncated":false,"body":"The quarterly numbers are confidential.""#,
        );
        assert_eq!(rest(&mine, 200, &leaked), Shadow::BodyText);
        let snippet = DOC.replace(
            r#""heading_text":"Intro""#,
            r#""heading_text":"Intro: The quarterly numbers are confidential.""#,
        );
        assert_eq!(rest(&mine, 200, &snippet), Shadow::BodyText);
        let other = DOC.replace(r#""level":1"#, r#""level":2"#);
        assert_eq!(rest(&mine, 200, &other), Shadow::FieldMismatch);
        let missing = DOC.replace(r#","truncated":false"#, "");
        assert_eq!(rest(&mine, 200, &missing), Shadow::FieldMismatch);
        assert_eq!(rest(&mine, 200, "<html>"), Shadow::Unreadable);
        let cut = compare_rest(
            &mine,
            &Gateway {
                status: StatusCode::OK,
                content_type: None,
                body: None,
            },
        );
        assert_eq!(cut, Shadow::Unreadable);
    }

    #[test]
    fn s5_a_gateway_without_the_route_is_its_own_kind() {
        let mine = own(200, DOC);
        assert_eq!(
            rest(&mine, 404, "<pre>Cannot GET /api/v1/section-source</pre>"),
            Shadow::NoRoute
        );
        // The route's own 404 is a real answer: a missing note.
        let nf = r#"{"error":"Not found","code":"NOT_FOUND"}"#;
        assert_eq!(rest(&mine, 404, nf), Shadow::StatusClass);
        assert_eq!(rest(&own(404, nf), 404, nf), Shadow::Agree);
        // Both 404, but the gateway's is no route answer of §5.
        assert_eq!(rest(&own(404, nf), 404, "{}"), Shadow::NoRoute);
    }

    #[test]
    fn the_sidecars_own_limits_are_not_compared() {
        let mut mine = own(
            429,
            r#"{"error":"Rate limit exceeded","code":"RATE_LIMITED"}"#,
        );
        mine.limited = true;
        assert_eq!(rest(&mine, 200, DOC), Shadow::NotCompared);
    }

    fn call_answer(result: &Value) -> String {
        format!(
            "event: message\ndata: {}\n\n",
            json!({"result": result, "jsonrpc": "2.0", "id": 1})
        )
    }

    fn mcp(own: &Own, status: u16, ct: &str, body: &str) -> Shadow {
        compare_mcp(
            own,
            &Gateway {
                status: StatusCode::from_u16(status).unwrap(),
                content_type: Some(ct),
                body: Some(body.as_bytes()),
            },
        )
    }

    #[test]
    fn s6_mcp_answers_compare_inside_the_tool_text() {
        let ok = json!({"content": [{"type": "text", "text": DOC}]});
        let mine = own(200, &call_answer(&ok));
        assert_eq!(
            mcp(&mine, 200, "text/event-stream", &call_answer(&ok)),
            Shadow::Agree
        );
        // A JSON answer (the SDK's enableJsonResponse) carries the same message.
        let plain = json!({"result": ok, "jsonrpc": "2.0", "id": 1}).to_string();
        assert_eq!(mcp(&mine, 200, "application/json", &plain), Shadow::Agree);
        let extra = DOC.replace(r#""truncated":false"#, r#""truncated":false,"x":1"#);
        let theirs = json!({"content": [{"type": "text", "text": extra}]});
        assert_eq!(
            mcp(&mine, 200, "text/event-stream", &call_answer(&theirs)),
            Shadow::ExtraField
        );
        let structured = json!({"content": [{"type": "text", "text": DOC}], "structuredContent": {"note": WITNESS}});
        assert_eq!(
            mcp(&mine, 200, "text/event-stream", &call_answer(&structured)),
            Shadow::BodyText
        );
        let failed = json!({"content": [{"type": "text", "text": r#"{"error":"Runtime failure","code":"UPSTREAM_ERROR"}"#}], "isError": true});
        assert_eq!(
            mcp(&mine, 200, "text/event-stream", &call_answer(&failed)),
            Shadow::StatusClass
        );
        let unknown = json!({"content": [{"type": "text", "text": "MCP error -32602: Tool get_section_source not found"}], "isError": true});
        assert_eq!(
            mcp(&mine, 200, "text/event-stream", &call_answer(&unknown)),
            Shadow::NoRoute
        );
        // A gateway without the other views says so for their tools too; a tool that is
        // no view's is not the route this comparison is about.
        for name in ["get_note_outline", "get_document_tree"] {
            let unknown = json!({"content": [{"type": "text", "text": format!("MCP error -32602: Tool {name} not found")}], "isError": true});
            assert_eq!(
                mcp(&mine, 200, "text/event-stream", &call_answer(&unknown)),
                Shadow::NoRoute,
                "{name}"
            );
        }
        let other = json!({"content": [{"type": "text", "text": "MCP error -32602: Tool search not found"}], "isError": true});
        assert_eq!(
            mcp(&mine, 200, "text/event-stream", &call_answer(&other)),
            Shadow::StatusClass
        );
        // A role the policy denies gets that answer from both: agreement.
        let denied = own(200, &call_answer(&unknown));
        assert_eq!(
            mcp(&denied, 200, "text/event-stream", &call_answer(&unknown)),
            Shadow::Agree
        );
        assert_eq!(
            mcp(&mine, 200, "text/event-stream", "data: nope\n\n"),
            Shadow::Unreadable
        );
        // CRLF and lone CR line ends read as the client's event-stream parser reads them.
        let crlf = call_answer(&ok).replace('\n', "\r\n");
        assert_eq!(mcp(&mine, 200, "text/event-stream", &crlf), Shadow::Agree);
        let cr = call_answer(&ok).replace('\n', "\r");
        assert_eq!(mcp(&mine, 200, "text/event-stream", &cr), Shadow::Agree);
    }

    #[tokio::test]
    async fn observed_bodies_pass_unchanged_and_compare_once_at_the_end() {
        let metrics = Arc::new(Metrics::new());
        let seen = Arc::new(std::sync::Mutex::new(None));
        let s = seen.clone();
        let body = Observed::new(
            Full::new(Bytes::from_static(b"hello")),
            Surface::Rest,
            metrics.clone(),
            move |b| {
                *s.lock().unwrap() = b.map(<[u8]>::to_vec);
                Shadow::Agree
            },
        );
        let out = body.collect().await.unwrap().to_bytes();
        assert_eq!(&out[..], b"hello");
        assert_eq!(seen.lock().unwrap().as_deref(), Some(&b"hello"[..]));
        let text = metrics.encode();
        assert!(text.contains(
            "knowtation_sidecar_shadow_comparisons_total{result=\"agree\",surface=\"rest\"} 1"
        ));
        // Dropped before its end: not compared, counted once.
        let early = Observed::new(
            Full::new(Bytes::from_static(b"x")),
            Surface::Mcp,
            metrics.clone(),
            |_| Shadow::Agree,
        );
        drop(early);
        assert!(metrics.encode().contains(
            "knowtation_sidecar_shadow_comparisons_total{result=\"not_compared\",surface=\"mcp\"} 1"
        ));
    }
}
