//! Hostile upstreams, through the real binary (`serve`) on loopback: the gateway, the
//! canister and the bridge in turn answer with every framing shape RFC 9112 leaves
//! ambiguous or forbids, and with bytes after a correctly framed answer, either at once
//! or late (the rest of the answer held back until the next request on the same
//! upstream connection has been read, then written before that request's own answer).
//! Several callers (distinct `sub`s; anonymous clients on distinct connections for
//! passthrough) go through the same upstream pools, over plain http and over https.
//!
//! An upstream connection carries the requests of one principal only
//! (`upstream.reuse = "principal"`, the default): the authenticated `sub` (with the vault
//! for the canister), or one client connection for a request without a verified token.
//! An answer whose framing is ambiguous or not allowed is refused and its connection
//! closed, never pooled; so is a connection on which bytes follow a complete answer.
//! Each case asserts:
//! - no byte of one caller's answer reaches another: every upstream answer carries a
//!   marker of its caller (the note's title and headings for the canister, the effective
//!   user for the bridge, a header and the body for the gateway), and every answer each
//!   caller got is searched for the others' markers;
//! - on the upstream's side, no connection carried two callers' requests, and a refused
//!   answer's connection (or one with bytes after its answer) carried nothing more and
//!   was closed;
//! - the first caller's answer is the documented one: passthrough 502
//!   `{"error":"Bad Gateway","code":"BAD_GATEWAY"}` for a refused head (a body found
//!   malformed after the head was passed on is cut instead); REST section-source 502
//!   `Bad Gateway` (canister) or 503 `Hosted access context unavailable` (bridge); MCP
//!   `get_section_source` `Runtime failure` (canister), `initialize` 403 `No hosted
//!   access` (bridge);
//! - the other callers and a fresh one afterwards get their own answers, `/live` and
//!   `/ready` answer 200, nothing is left in flight;
//! - `knowtation_sidecar_upstream_framing_errors_total{upstream,kind}` moved for the
//!   expected kind of that upstream, and no other series of the family moved.
//!
//! Shapes (`SHAPES`; `timing`: at once, or late; late cases have three callers, the two
//! after the first sent at the same time):
//!
//! | shape | first caller gets | kind (at once / late) |
//! |---|---|---|
//! | clean (control) | its answer | none |
//! | extra bytes after `Content-Length` | its answer | `bytes_after_answer` / `malformed_head` on its own next request |
//! | a second answer pipelined after it | its answer | `bytes_after_answer` / same, on its own next request |
//! | bytes after the last chunk | its answer | `bytes_after_answer` / `malformed_head` on its own next request |
//! | trailer line ended by a bare LF; trailer section ended by a bare LF; last chunk followed by a bare LF; chunk-size line ended by a bare LF; chunk longer than its size | refused (body) | `malformed_chunked` |
//! | `Content-Length` with `Transfer-Encoding: chunked` (either order); two equal `Content-Length`; a list `n, n`; two different lengths | refused | `ambiguous_length` |
//! | `Transfer-Encoding: gzip, chunked`; `chunked` twice; chunked on an HTTP/1.0 answer | refused | `transfer_coding` |
//! | obs-fold; bare LF line ends in the head | refused | `malformed_head` |
//! | a 70 KB head | refused | `head_too_large` |
//! | `103` with `Content-Length`; `204` with `Content-Length`; `204` chunked | refused | `bodiless_status` |
//! | `304` with `Content-Length`, no body (control) | 304 (passthrough), `Upstream 304` (canister), lookup failed (bridge) | none |
//! | `304` with `Content-Length`, then a body | as above | `bytes_after_answer` |
//! | `304` chunked, then a body | 304 or refused (RFC 9112 §6.1 allows the header on a 304) | `bodiless_status` or `bytes_after_answer` |
//! | `HEAD` answer with `Content-Length` (control, passthrough) | the head | none |
//! | `HEAD` answer, then a body (passthrough) | the head | `bytes_after_answer` |
//! | `101 Switching Protocols` | refused | `upgrade` |
//!
//! A late "rest" after a correctly framed answer stays on the first caller's own
//! connection and surfaces only on that caller's next request there (then the kind in
//! the table moves); on the bridge it never does, since the lookup is cached.
//!
//! Groups: plain http: passthrough with tokens, canister REST, bridge REST (every shape);
//! anonymous passthrough, canister and bridge over MCP (the `core` shapes: about one per
//! kind). https: passthrough, canister REST and bridge REST (the `core` shapes). Beside
//! the table: the finding end to end (user B's own section-source read, REST and MCP,
//! after a canister misframed user A's), `upstream.reuse = "connection"` and `"shared"`
//! (what shared reuse cannot prevent), and the idle bounds of the pools.
//!
//! `HOSTILE_CASE=<substring>` runs only the cases whose name contains it; every case
//! prints one line (`--nocapture`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/sidecar.rs"]
mod support;

#[path = "support/hostile.rs"]
mod hostile;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hostile::{fixture, Answer, Client, Reply, Request, Upstream};
use knowtation_testkit::{client, MockBridge, MockGateway};
use serde_json::{json, Value};
use support::{token, Metrics, Sidecar, BIN, IN_FLIGHT, SECRET};

const FRAMING: &str = "knowtation_sidecar_upstream_framing_errors_total";
const ACCEPT_BOTH: &str = "application/json, text/event-stream";
const INIT: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"hostile","version":"0"}}}"#;

const BAD_GATEWAY: &str = r#"{"error":"Bad Gateway","code":"BAD_GATEWAY"}"#;
const REST_UPSTREAM_304: &str = r#"{"error":"Upstream 304","code":"BAD_GATEWAY"}"#;
const REST_UNAVAILABLE: &str =
    r#"{"error":"Hosted access context unavailable","code":"SERVICE_UNAVAILABLE"}"#;
const MCP_NO_HOSTED_ACCESS: &str =
    r#"{"jsonrpc":"2.0","error":{"code":-32600,"message":"No hosted access"}}"#;
const TOOL_RUNTIME_FAILURE: &str = r#"{"error":"Runtime failure","code":"UPSTREAM_ERROR"}"#;
const TOOL_UPSTREAM_304: &str = r#"{"error":"Upstream 304","code":"UPSTREAM_ERROR"}"#;

// ---------------------------------------------------------------------------------------
// The shapes.

/// The answer a well-behaved upstream gives one caller, in parts a shape rearranges.
struct Good {
    /// The caller's marker.
    marker: String,
    /// End-to-end headers (content type, and the marker for the gateway).
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Good {
    /// A head: `status_line`, the end-to-end headers, then `extra`.
    fn head(&self, status_line: &str, extra: &[(&str, String)]) -> Vec<u8> {
        let mut out = format!("{status_line}\r\n");
        for (k, v) in &self.headers {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        for (k, v) in extra {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        out.push_str("\r\n");
        out.into_bytes()
    }

    fn length(&self) -> (&'static str, String) {
        ("Content-Length", self.body.len().to_string())
    }

    /// The whole answer, framed by its length.
    fn complete(&self) -> Vec<u8> {
        let mut out = self.head("HTTP/1.1 200 OK", &[self.length()]);
        out.extend_from_slice(&self.body);
        out
    }

    /// The head of the answer to a `HEAD`: the length it would have, no body.
    fn head_only(&self) -> Vec<u8> {
        self.head("HTTP/1.1 200 OK", &[self.length()])
    }

    /// The body as one chunk (`size_line_end` after the size) and the last chunk
    /// (`after_last`: what follows `0\r\n`).
    fn chunked(&self, size_line_end: &str, after_last: &str) -> Vec<u8> {
        let mut out = format!("{:x}{size_line_end}", self.body.len()).into_bytes();
        out.extend_from_slice(&self.body);
        out.extend_from_slice(b"\r\n0\r\n");
        out.extend_from_slice(after_last.as_bytes());
        out
    }

    /// Bytes that are no answer at all (they carry the marker, should they leak).
    fn garbage(&self) -> Vec<u8> {
        format!("{}-stray-bytes\r\n\r\n", self.marker).into_bytes()
    }
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn chunked_head(g: &Good) -> Vec<u8> {
    g.head(
        "HTTP/1.1 200 OK",
        &[("Transfer-Encoding", "chunked".to_owned())],
    )
}

/// What the first caller must get.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Outcome {
    /// Its own answer.
    Served,
    /// The 304 as such (passthrough), `Upstream 304` (canister), a failed lookup (bridge).
    NotModified,
    /// Refused at the head.
    Refused,
    /// Refused in the body: on passthrough the head may have been passed on, then the
    /// body is cut.
    RefusedInBody,
    /// Either [`Outcome::NotModified`] or [`Outcome::Refused`].
    NotModifiedOrRefused,
}

/// What the framing-error family must show.
#[derive(Debug, Clone, Copy)]
enum Framing {
    /// Nothing wrong: nothing moves.
    Clean,
    /// The answer is refused, whatever the timing: one of these kinds.
    Refused(&'static [&'static str]),
    /// A complete answer with bytes after it: at once, one of `at_once`, and the
    /// connection closed; late, the bytes surface on the first caller's own next
    /// request on that connection (when one is made), as one of `late`.
    Stray {
        at_once: &'static [&'static str],
        late: &'static [&'static str],
    },
}

struct Shape {
    name: &'static str,
    /// What comes at once, and what follows it (at once or late).
    build: fn(&Good) -> (Vec<u8>, Vec<u8>),
    outcome: Outcome,
    framing: Framing,
    /// The first caller sends `HEAD` (passthrough only).
    head: bool,
    /// Also run over https, over MCP and for anonymous callers.
    core: bool,
}

const AMBIGUOUS: &[&str] = &["ambiguous_length"];
const CODING: &[&str] = &["transfer_coding"];
const CHUNKED: &[&str] = &["malformed_chunked"];
const HEAD: &[&str] = &["malformed_head"];
const LARGE: &[&str] = &["head_too_large"];
const AFTER: &[&str] = &["bytes_after_answer"];
const BODILESS: &[&str] = &["bodiless_status"];
const UPGRADE: &[&str] = &["upgrade"];
/// RFC 9112 §6.1 lets a 304 carry `Transfer-Encoding`: refused, or read as bodiless with
/// bytes after it; either way its connection closes.
const BODILESS_OR_AFTER: &[&str] = &["bodiless_status", "bytes_after_answer"];

const CLEAN: Framing = Framing::Clean;
const fn refused(kinds: &'static [&'static str]) -> Framing {
    Framing::Refused(kinds)
}
const fn stray(at_once: &'static [&'static str], late: &'static [&'static str]) -> Framing {
    Framing::Stray { at_once, late }
}

/// Flags of a row: run everywhere (`CORE`), or only where the first request is `HEAD`.
const CORE: u8 = 1;
const HEAD_REQUEST: u8 = 2;
const MORE: u8 = 0;

const fn row(
    name: &'static str,
    build: fn(&Good) -> (Vec<u8>, Vec<u8>),
    outcome: Outcome,
    framing: Framing,
    flags: u8,
) -> Shape {
    Shape {
        name,
        build,
        outcome,
        framing,
        head: flags & HEAD_REQUEST != 0,
        core: flags & CORE != 0,
    }
}

use Outcome::{NotModified, NotModifiedOrRefused, Refused, RefusedInBody, Served};

/// Every shape, one a row: name, what the upstream writes, what the first caller gets,
/// what the framing-error family shows, where it runs.
#[rustfmt::skip]
const SHAPES: &[Shape] = &[
    row("clean", clean, Served, CLEAN, CORE),
    row("extra-bytes-after-length", extra_after_length, Served, stray(AFTER, HEAD), CORE),
    row("pipelined-second-answer", pipelined, Served, stray(AFTER, AFTER), CORE),
    row("bytes-after-last-chunk", after_last_chunk, Served, stray(AFTER, HEAD), MORE),
    row("trailer-line-bare-lf", trailer_line_bare_lf, RefusedInBody, refused(CHUNKED), CORE),
    row("trailer-section-bare-lf", trailer_section_bare_lf, RefusedInBody, refused(CHUNKED), MORE),
    row("last-chunk-bare-lf", last_chunk_bare_lf, RefusedInBody, refused(CHUNKED), MORE),
    row("chunk-size-bare-lf", chunk_size_bare_lf, RefusedInBody, refused(CHUNKED), MORE),
    row("chunk-longer-than-size", chunk_longer, RefusedInBody, refused(CHUNKED), MORE),
    row("length-and-chunked", length_and_chunked, Refused, refused(AMBIGUOUS), CORE),
    row("chunked-and-length", chunked_and_length, Refused, refused(AMBIGUOUS), MORE),
    row("two-equal-lengths", two_equal_lengths, Refused, refused(AMBIGUOUS), MORE),
    row("length-list", length_list, Refused, refused(AMBIGUOUS), MORE),
    row("two-different-lengths", two_different_lengths, Refused, refused(AMBIGUOUS), MORE),
    row("gzip-then-chunked", gzip_then_chunked, Refused, refused(CODING), CORE),
    row("chunked-twice", chunked_twice, Refused, refused(CODING), MORE),
    row("chunked-on-http-1-0", chunked_on_http_1_0, Refused, refused(CODING), MORE),
    row("obs-fold", obs_fold, Refused, refused(HEAD), CORE),
    row("bare-lf-in-head", bare_lf_in_head, Refused, refused(HEAD), MORE),
    row("head-too-large", head_too_large, Refused, refused(LARGE), CORE),
    row("informational-with-length", informational_with_length, Refused, refused(BODILESS), CORE),
    row("no-content-with-length", no_content_with_length, Refused, refused(BODILESS), MORE),
    row("no-content-chunked", no_content_chunked, Refused, refused(BODILESS), MORE),
    row("not-modified-with-length", not_modified, NotModified, CLEAN, MORE),
    row("not-modified-then-body", not_modified_then_body, NotModified, stray(AFTER, AFTER), MORE),
    row("not-modified-chunked-then-body", not_modified_chunked, NotModifiedOrRefused, refused(BODILESS_OR_AFTER), MORE),
    row("head-answer-with-length", head_answer, Served, CLEAN, HEAD_REQUEST),
    row("head-answer-then-body", head_answer_then_body, Served, stray(AFTER, AFTER), HEAD_REQUEST),
    row("switching-protocols", switching_protocols, Refused, refused(UPGRADE), CORE),
];

// What each shape writes: (at once, what follows). What follows a refused answer is the
// first caller's whole answer again (its marker in it), as the rest of an answer the
// sidecar framed shorter than the upstream did would be; after a good answer, stray bytes
// or a second answer.

fn clean(g: &Good) -> (Vec<u8>, Vec<u8>) {
    (g.complete(), Vec::new())
}

fn extra_after_length(g: &Good) -> (Vec<u8>, Vec<u8>) {
    (g.complete(), g.garbage())
}

fn pipelined(g: &Good) -> (Vec<u8>, Vec<u8>) {
    (g.complete(), g.complete())
}

fn after_last_chunk(g: &Good) -> (Vec<u8>, Vec<u8>) {
    (
        cat(&[&chunked_head(g), &g.chunked("\r\n", "\r\n")]),
        g.garbage(),
    )
}

fn trailer_line_bare_lf(g: &Good) -> (Vec<u8>, Vec<u8>) {
    let body = g.chunked("\r\n", "X-Trailer: 1\n\r\n");
    (cat(&[&chunked_head(g), &body]), g.complete())
}

fn trailer_section_bare_lf(g: &Good) -> (Vec<u8>, Vec<u8>) {
    let body = g.chunked("\r\n", "X-Trailer: 1\r\n\n");
    (cat(&[&chunked_head(g), &body]), g.complete())
}

fn last_chunk_bare_lf(g: &Good) -> (Vec<u8>, Vec<u8>) {
    (
        cat(&[&chunked_head(g), &g.chunked("\r\n", "\n")]),
        g.complete(),
    )
}

fn chunk_size_bare_lf(g: &Good) -> (Vec<u8>, Vec<u8>) {
    (
        cat(&[&chunked_head(g), &g.chunked("\n", "\r\n")]),
        g.complete(),
    )
}

fn chunk_longer(g: &Good) -> (Vec<u8>, Vec<u8>) {
    let mut body = format!("{:x}\r\n", g.body.len() - 1).into_bytes();
    body.extend_from_slice(&g.body);
    body.extend_from_slice(b"\r\n0\r\n\r\n");
    (cat(&[&chunked_head(g), &body]), g.complete())
}

/// The finding: the length frames what the chunked reading leaves over.
fn length_and_chunked(g: &Good) -> (Vec<u8>, Vec<u8>) {
    let body = g.chunked("\r\n", "\r\n");
    let rest = g.complete();
    let length = ("Content-Length", (body.len() + rest.len()).to_string());
    let chunked = ("Transfer-Encoding", "chunked".to_owned());
    (
        cat(&[&g.head("HTTP/1.1 200 OK", &[length, chunked]), &body]),
        rest,
    )
}

fn chunked_and_length(g: &Good) -> (Vec<u8>, Vec<u8>) {
    let body = g.chunked("\r\n", "\r\n");
    let rest = g.complete();
    let length = ("Content-Length", (body.len() + rest.len()).to_string());
    let chunked = ("Transfer-Encoding", "chunked".to_owned());
    (
        cat(&[&g.head("HTTP/1.1 200 OK", &[chunked, length]), &body]),
        rest,
    )
}

fn two_equal_lengths(g: &Good) -> (Vec<u8>, Vec<u8>) {
    let head = g.head("HTTP/1.1 200 OK", &[g.length(), g.length()]);
    (cat(&[&head, &g.body]), g.complete())
}

fn length_list(g: &Good) -> (Vec<u8>, Vec<u8>) {
    let n = g.body.len();
    let head = g.head(
        "HTTP/1.1 200 OK",
        &[("Content-Length", format!("{n}, {n}"))],
    );
    (cat(&[&head, &g.body]), g.complete())
}

fn two_different_lengths(g: &Good) -> (Vec<u8>, Vec<u8>) {
    let rest = g.complete();
    let longer = ("Content-Length", (g.body.len() + rest.len()).to_string());
    let head = g.head("HTTP/1.1 200 OK", &[g.length(), longer]);
    (cat(&[&head, &g.body]), rest)
}

fn coded(g: &Good, status_line: &str, codings: &[&str]) -> (Vec<u8>, Vec<u8>) {
    let headers: Vec<_> = codings
        .iter()
        .map(|c| ("Transfer-Encoding", (*c).to_owned()))
        .collect();
    let body = g.chunked("\r\n", "\r\n");
    (cat(&[&g.head(status_line, &headers), &body]), g.complete())
}

fn gzip_then_chunked(g: &Good) -> (Vec<u8>, Vec<u8>) {
    coded(g, "HTTP/1.1 200 OK", &["gzip, chunked"])
}

fn chunked_twice(g: &Good) -> (Vec<u8>, Vec<u8>) {
    coded(g, "HTTP/1.1 200 OK", &["chunked", "chunked"])
}

fn chunked_on_http_1_0(g: &Good) -> (Vec<u8>, Vec<u8>) {
    coded(g, "HTTP/1.0 200 OK", &["chunked"])
}

fn obs_fold(g: &Good) -> (Vec<u8>, Vec<u8>) {
    let head = g.head(
        "HTTP/1.1 200 OK",
        &[("X-Folded", "a\r\n b".to_owned()), g.length()],
    );
    (cat(&[&head, &g.body]), g.complete())
}

fn bare_lf_in_head(g: &Good) -> (Vec<u8>, Vec<u8>) {
    let head = g.head("HTTP/1.1 200 OK", &[g.length()]);
    let head = String::from_utf8(head).unwrap().replace("\r\n", "\n");
    (cat(&[head.as_bytes(), &g.body]), g.complete())
}

fn head_too_large(g: &Good) -> (Vec<u8>, Vec<u8>) {
    let big = ("X-Big", "b".repeat(70 * 1024));
    let head = g.head("HTTP/1.1 200 OK", &[big, g.length()]);
    (cat(&[&head, &g.body]), g.complete())
}

/// The 1xx's length covers an answer the sidecar would read as the final one.
fn informational_with_length(g: &Good) -> (Vec<u8>, Vec<u8>) {
    let inner = g.complete();
    let head = format!(
        "HTTP/1.1 103 Early Hints\r\nContent-Length: {}\r\n\r\n",
        inner.len()
    );
    (cat(&[head.as_bytes(), &inner]), g.complete())
}

fn no_content_with_length(g: &Good) -> (Vec<u8>, Vec<u8>) {
    let rest = g.complete();
    let length = ("Content-Length", rest.len().to_string());
    (g.head("HTTP/1.1 204 No Content", &[length]), rest)
}

fn no_content_chunked(g: &Good) -> (Vec<u8>, Vec<u8>) {
    let chunked = ("Transfer-Encoding", "chunked".to_owned());
    (g.head("HTTP/1.1 204 No Content", &[chunked]), g.complete())
}

/// RFC 9110 §8.6: a 304 may say the length the answer would have had.
fn not_modified(g: &Good) -> (Vec<u8>, Vec<u8>) {
    (
        g.head("HTTP/1.1 304 Not Modified", &[g.length()]),
        Vec::new(),
    )
}

fn not_modified_then_body(g: &Good) -> (Vec<u8>, Vec<u8>) {
    (not_modified(g).0, g.complete())
}

fn not_modified_chunked(g: &Good) -> (Vec<u8>, Vec<u8>) {
    let chunked = ("Transfer-Encoding", "chunked".to_owned());
    (
        g.head("HTTP/1.1 304 Not Modified", &[chunked]),
        g.complete(),
    )
}

fn head_answer(g: &Good) -> (Vec<u8>, Vec<u8>) {
    (g.head_only(), Vec::new())
}

fn head_answer_then_body(g: &Good) -> (Vec<u8>, Vec<u8>) {
    (g.head_only(), g.complete())
}

fn switching_protocols(g: &Good) -> (Vec<u8>, Vec<u8>) {
    let head =
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";
    (head.to_vec(), g.complete())
}

fn shape(name: &str) -> &'static Shape {
    SHAPES.iter().find(|s| s.name == name).expect("a shape")
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Timing {
    /// Everything in one write.
    AtOnce,
    /// The rest after the next request on the same connection.
    Late,
}

// ---------------------------------------------------------------------------------------
// Upstreams and what they answer.

#[derive(Debug, Clone, Copy, PartialEq)]
enum Up {
    Gateway,
    Canister,
    Bridge,
}

impl Up {
    fn label(self) -> &'static str {
        match self {
            Up::Gateway => "gateway",
            Up::Canister => "canister",
            Up::Bridge => "bridge",
        }
    }
}

/// The caller's marker as it reaches an answer: the effective user the bridge names is
/// `eff-<marker>`, and the echo canister titles the note with it.
fn effective_user(marker: &str) -> String {
    format!("eff-{marker}")
}

/// A note whose title and headings carry `marker`.
fn note(marker: &str) -> Vec<u8> {
    json!({
        "path": format!("hx/{marker}.md"),
        "frontmatter": json!({"title": format!("T-{marker}")}).to_string(),
        "body": format!("# H-{marker}\n\ntext\n\n## H2-{marker}\n"),
    })
    .to_string()
    .into_bytes()
}

fn good(up: Up, marker: &str) -> Good {
    let json_type = ("Content-Type".to_owned(), "application/json".to_owned());
    match up {
        Up::Gateway => Good {
            marker: marker.to_owned(),
            headers: vec![
                ("Content-Type".to_owned(), "text/plain".to_owned()),
                ("X-Hx-Mark".to_owned(), marker.to_owned()),
            ],
            body: format!("gateway answer for {marker}\n").into_bytes(),
        },
        Up::Canister => Good {
            marker: marker.to_owned(),
            headers: vec![json_type],
            body: note(marker),
        },
        Up::Bridge => Good {
            marker: marker.to_owned(),
            headers: vec![json_type],
            body: json!({
                "effective_canister_user_id": effective_user(marker),
                "allowed_vault_ids": ["default"],
                "scope": null,
                "role": "editor",
            })
            .to_string()
            .into_bytes(),
        },
    }
}

/// The one answer the hostile upstream gives differently.
struct Armed {
    tag: String,
    shape: &'static Shape,
    timing: Timing,
}

/// What the hostile upstream's handler shares with the test.
#[derive(Default)]
struct Script {
    armed: Mutex<Option<Armed>>,
    /// Bearer token → marker: the bridge knows its callers by their `Authorization`.
    tokens: Mutex<HashMap<String, String>>,
}

/// The marker in a request to `up`, if it comes from a caller the test follows.
fn tag_of(up: Up, script: &Script, req: &Request) -> Option<String> {
    match up {
        Up::Gateway => req.target.strip_prefix("/hx/").map(str::to_owned),
        Up::Canister => {
            let (_, after) = req.target.split_once("hx%2F")?;
            after.strip_suffix(".md").map(str::to_owned)
        }
        Up::Bridge => {
            let auth = req.header("authorization")?;
            let bearer = auth.strip_prefix("Bearer ")?;
            script.tokens.lock().unwrap().get(bearer).cloned()
        }
    }
}

fn hostile_handler(up: Up, script: Arc<Script>) -> hostile::Handler {
    Arc::new(move |req: &Request| {
        let Some(tag) = tag_of(up, &script, req) else {
            // The readiness probe (gateway), or nothing the test sent.
            let body = "ok\n";
            return Answer::plain(
                None,
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )
                .into_bytes(),
            );
        };
        let g = good(up, &tag);
        let armed = {
            let mut armed = script.armed.lock().unwrap();
            match armed.as_ref() {
                Some(a) if a.tag == tag => armed.take(),
                _ => None,
            }
        };
        match armed {
            Some(a) => {
                let (now, rest) = (a.shape.build)(&g);
                Answer {
                    tag: Some(tag),
                    now,
                    rest,
                    late: a.timing == Timing::Late,
                    ..Answer::default()
                }
            }
            None if req.method == "HEAD" => Answer::plain(Some(tag), g.head_only()),
            None => Answer::plain(Some(tag), g.complete()),
        }
    })
}

/// A well-behaved canister that titles each note with the `X-User-Id` it was asked for
/// (the effective user the bridge named), for the bridge's cases.
fn echo_canister() -> hostile::Handler {
    Arc::new(|req: &Request| {
        let user = req.header("x-user-id").unwrap_or("nobody").to_owned();
        Answer::plain(None, good(Up::Canister, &user).complete())
    })
}

// ---------------------------------------------------------------------------------------
// The sidecar in front of them.

/// Starts the binary with `env`, after `check-config` accepted the same configuration
/// (so a refused key fails at once, with the binary's own message).
async fn start_sidecar(env: &[(&str, String)]) -> Sidecar {
    let mut cmd = std::process::Command::new(BIN);
    cmd.arg("check-config")
        .env_clear()
        .env("KNOWTATION_SIDECAR_AUTH__JWT_SECRETS", SECRET);
    for (k, v) in env {
        cmd.env(format!("KNOWTATION_SIDECAR_{k}"), v);
    }
    let out = cmd.output().expect("check-config runs");
    assert!(
        out.status.success(),
        "the sidecar refused its configuration (exit {:?}): {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    let sidecar = Sidecar::spawn(env);
    sidecar.wait_ready().await;
    sidecar
}

/// Short deadlines, so that a case that goes wrong fails in seconds.
fn base_env() -> Vec<(&'static str, String)> {
    vec![
        ("UPSTREAM__CONNECT_TIMEOUT_MS", "1000".to_owned()),
        ("UPSTREAM__CANISTER_TIMEOUT_MS", "2000".to_owned()),
        ("UPSTREAM__GATEWAY_TIMEOUT_MS", "2000".to_owned()),
        ("UPSTREAM__GATEWAY_IDLE_TIMEOUT_MS", "2000".to_owned()),
        ("HOSTED_CONTEXT__TIMEOUT_MS", "2000".to_owned()),
        // A refused lookup is asked again at once.
        ("HOSTED_CONTEXT__FAILURE_CACHE_TTL_SECONDS", "0".to_owned()),
        ("MCP__CALLS_PER_MINUTE", "100000".to_owned()),
    ]
}

/// How callers reach the upstream under test.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Surface {
    /// Passthrough with a token (the principal is its `sub`).
    Passthrough,
    /// Passthrough without a token (the principal is the client connection).
    Anonymous,
    /// `GET /api/v1/section-source`.
    Rest,
    /// `get_section_source` on `/mcp` (after `initialize`).
    Mcp,
}

/// One caller: its marker, token, client connection (kept), MCP session, and every byte
/// it received.
struct Caller {
    marker: String,
    token: String,
    client: Client,
    session: Option<String>,
    seen: Vec<u8>,
}

/// A sidecar in front of one hostile upstream, with the others well-behaved.
struct Group {
    name: &'static str,
    up: Up,
    surface: Surface,
    sidecar: Sidecar,
    hostile: Upstream,
    script: Arc<Script>,
    cases: usize,
    _gateway: Option<MockGateway>,
    _bridge: Option<MockBridge>,
    _canister: Option<Upstream>,
}

/// Options of a case beyond its shape and timing.
#[derive(Debug, Clone, Copy, Default)]
struct Opts {
    /// Three callers instead of two (the two after the first at the same time).
    three: bool,
    /// The second caller is the first one's `sub` on another client connection (for
    /// `upstream.reuse = "connection"`).
    second_same_sub: bool,
    /// `upstream.reuse = "shared"`: callers may share upstream connections.
    shared: bool,
}

impl Group {
    async fn start(
        name: &'static str,
        up: Up,
        surface: Surface,
        tls: bool,
        extra: &[(&'static str, String)],
    ) -> Group {
        let script = Arc::new(Script::default());
        let hostile = Upstream::start(tls, hostile_handler(up, Arc::clone(&script))).await;
        let mut env = base_env();
        let (mut gateway, mut bridge, mut canister) = (None, None, None);
        match up {
            Up::Gateway => env.push(("UPSTREAM__GATEWAY_URL", hostile.url())),
            Up::Canister => {
                let gw = MockGateway::start().await;
                let br = MockBridge::start().await;
                env.push(("UPSTREAM__GATEWAY_URL", gw.url()));
                env.push(("UPSTREAM__BRIDGE_URL", br.url()));
                env.push(("UPSTREAM__CANISTER_URL", hostile.url()));
                gateway = Some(gw);
                bridge = Some(br);
            }
            Up::Bridge => {
                let gw = MockGateway::start().await;
                let can = Upstream::start(false, echo_canister()).await;
                env.push(("UPSTREAM__GATEWAY_URL", gw.url()));
                env.push(("UPSTREAM__CANISTER_URL", can.url()));
                env.push(("UPSTREAM__BRIDGE_URL", hostile.url()));
                gateway = Some(gw);
                canister = Some(can);
            }
        }
        if tls {
            env.push((
                "UPSTREAM__CA_FILE",
                fixture("localhost.crt").display().to_string(),
            ));
        }
        env.extend(extra.iter().cloned());
        let sidecar = start_sidecar(&env).await;
        Group {
            name,
            up,
            surface,
            sidecar,
            hostile,
            script,
            cases: 0,
            _gateway: gateway,
            _bridge: bridge,
            _canister: canister,
        }
    }

    /// A new caller of case `case`, `letter` telling it apart.
    fn caller(&self, case: usize, letter: char) -> Caller {
        let marker = format!("HX{}{case:03}{letter}Q", self.name_code());
        self.caller_with_sub(marker.clone(), &format!("user-{marker}"))
    }

    fn caller_with_sub(&self, marker: String, sub: &str) -> Caller {
        let token = token(sub);
        self.script
            .tokens
            .lock()
            .unwrap()
            .insert(token.clone(), marker.clone());
        Caller {
            marker,
            token,
            client: Client::new(self.sidecar.addr),
            session: None,
            seen: Vec::new(),
        }
    }

    /// Two letters of the group's name, so that markers differ between groups.
    fn name_code(&self) -> String {
        self.name
            .split(['-', ' '])
            .filter_map(|w| w.chars().next())
            .collect::<String>()
            .to_ascii_uppercase()
    }

    /// One request of `c` through the surface; the answer that decides (for MCP, the
    /// tool's, or `initialize`'s when it failed). Every byte is kept in `c.seen`.
    async fn call(&self, c: &mut Caller, head: bool) -> Reply {
        let reply = match self.surface {
            Surface::Passthrough | Surface::Anonymous => {
                let method = if head { "HEAD" } else { "GET" };
                let mut req = format!(
                    "{method} /hx/{} HTTP/1.1\r\nHost: sidecar.test\r\n",
                    c.marker
                );
                if self.surface == Surface::Passthrough {
                    req.push_str(&format!("Authorization: Bearer {}\r\n", c.token));
                }
                req.push_str("\r\n");
                c.client.send(req.as_bytes(), head).await
            }
            Surface::Rest => {
                let req = format!(
                    "GET /api/v1/section-source?path=hx/{}.md HTTP/1.1\r\nHost: sidecar.test\r\nAuthorization: Bearer {}\r\nX-Vault-Id: default\r\n\r\n",
                    c.marker, c.token
                );
                c.client.send(req.as_bytes(), false).await
            }
            Surface::Mcp => {
                if c.session.is_none() {
                    let init = c.client.send(&mcp_post(c, INIT), false).await;
                    c.seen.extend_from_slice(&init.raw);
                    match init.header("mcp-session-id") {
                        Some(s) if init.status == 200 => c.session = Some(s.to_owned()),
                        _ => return init,
                    }
                }
                let call = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_section_source","arguments":{"path":format!("hx/{}.md", c.marker)}}});
                c.client.send(&mcp_post(c, &call.to_string()), false).await
            }
        };
        c.seen.extend_from_slice(&reply.raw);
        reply
    }

    /// The marker a caller's own answer shows.
    fn shown(&self, marker: &str) -> String {
        match self.up {
            Up::Gateway => marker.to_owned(),
            Up::Canister => format!("T-{marker}"),
            Up::Bridge => format!("T-{}", effective_user(marker)),
        }
    }

    /// Whether `r` is `marker`'s own answer.
    fn check_served(&self, r: &Reply, marker: &str, head: bool) -> Result<(), String> {
        let shown = self.shown(marker);
        let ok = match self.surface {
            Surface::Passthrough | Surface::Anonymous if head => {
                r.status == 200 && r.header("x-hx-mark") == Some(marker)
            }
            Surface::Passthrough | Surface::Anonymous | Surface::Rest => {
                r.status == 200 && r.complete && r.text().contains(&shown)
            }
            Surface::Mcp => {
                let (is_error, text) = tool_result(r);
                r.status == 200 && !is_error && text.contains(&shown)
            }
        };
        ok.then_some(())
            .ok_or_else(|| format!("not its own answer ({shown}): {}", brief(r)))
    }

    /// Whether `r` is the documented refusal (`in_body`: the passthrough head may have
    /// been passed on and the body cut).
    fn check_refused(&self, r: &Reply, in_body: bool) -> Result<(), String> {
        let ok = match (self.up, self.surface) {
            (Up::Gateway, _) => {
                (r.status == 502 && r.text() == BAD_GATEWAY)
                    // The head passed on and the body cut, or the connection closed
                    // before the head went out.
                    || (in_body && (r.status == 200 || r.status == 0) && !r.complete)
            }
            (Up::Canister, Surface::Rest) => r.status == 502 && r.text() == BAD_GATEWAY,
            (Up::Canister, _) => {
                let (is_error, text) = tool_result(r);
                r.status == 200 && is_error && text == TOOL_RUNTIME_FAILURE
            }
            (Up::Bridge, Surface::Rest) => r.status == 503 && r.text() == REST_UNAVAILABLE,
            (Up::Bridge, _) => r.status == 403 && r.text() == MCP_NO_HOSTED_ACCESS,
        };
        ok.then_some(())
            .ok_or_else(|| format!("not the refusal: {}", brief(r)))
    }

    fn check_not_modified(&self, r: &Reply) -> Result<(), String> {
        let ok = match (self.up, self.surface) {
            (Up::Gateway, _) => r.status == 304,
            (Up::Canister, Surface::Rest) => r.status == 502 && r.text() == REST_UPSTREAM_304,
            (Up::Canister, _) => {
                let (is_error, text) = tool_result(r);
                r.status == 200 && is_error && text == TOOL_UPSTREAM_304
            }
            // A 304 is no context: a failed lookup.
            (Up::Bridge, _) => return self.check_refused(r, false),
        };
        ok.then_some(())
            .ok_or_else(|| format!("not the 304 answer: {}", brief(r)))
    }

    fn check_first(&self, shape: &Shape, r: &Reply, marker: &str) -> Result<(), String> {
        match shape.outcome {
            Outcome::Served => self.check_served(r, marker, shape.head),
            Outcome::NotModified => self.check_not_modified(r),
            Outcome::Refused => self.check_refused(r, false),
            Outcome::RefusedInBody => self.check_refused(r, true),
            Outcome::NotModifiedOrRefused => self
                .check_not_modified(r)
                .or_else(|_| self.check_refused(r, false)),
        }
    }

    /// Runs one case; the reasons it failed, if any.
    async fn run(&mut self, shape: &'static Shape, timing: Timing, opts: Opts) -> Vec<String> {
        self.cases += 1;
        let n = self.cases;
        let mut fails = Vec::new();
        let mut a = self.caller(n, 'A');
        let mut b = if opts.second_same_sub {
            let marker = format!("HX{}{n:03}BQ", self.name_code());
            self.caller_with_sub(marker, &format!("user-{}", a.marker))
        } else {
            self.caller(n, 'B')
        };
        let mut c = self.caller(n, 'C');
        let mut h = self.caller(n, 'H');
        let before = self.sidecar.metrics().await;
        let log_from = self.sidecar.log().len();
        let delivered_before = self.hostile.delivered();
        let records_before = self.hostile.records().len();
        *self.script.armed.lock().unwrap() = Some(Armed {
            tag: a.marker.clone(),
            shape,
            timing,
        });

        // The first caller meets the shape; the others follow on the same pools.
        let first = self.call(&mut a, shape.head).await;
        if self.script.armed.lock().unwrap().take().is_some() {
            fails.push("the first request never reached the upstream".to_owned());
        }
        let (second, third) = if opts.three {
            let (rb, rc) = tokio::join!(self.call(&mut b, false), self.call(&mut c, false));
            (rb, Some(rc))
        } else {
            (self.call(&mut b, false).await, None)
        };
        let _again = self.call(&mut a, false).await;
        let healthy = self.call(&mut h, false).await;

        if let Err(e) = self.check_first(shape, &first, &a.marker) {
            fails.push(format!("first caller: {e}"));
        }
        if let Err(e) = self.check_served(&second, &b.marker, false) {
            fails.push(format!("second caller: {e}"));
        }
        if let Some(third) = &third {
            if let Err(e) = self.check_served(third, &c.marker, false) {
                fails.push(format!("third caller: {e}"));
            }
        }
        if let Err(e) = self.check_served(&healthy, &h.marker, false) {
            fails.push(format!("a fresh caller afterwards: {e}"));
        }

        // No caller saw another's bytes.
        let mut callers: Vec<&Caller> = vec![&a, &b, &h];
        if opts.three {
            callers.push(&c);
        }
        for x in &callers {
            for y in &callers {
                if x.marker != y.marker {
                    if let Some(e) = leaked(x, y) {
                        fails.push(e);
                    }
                }
            }
        }

        // No upstream connection carried two callers; a refused answer's connection
        // carried nothing more and was closed.
        let records: Vec<_> = self.hostile.records()[records_before..].to_vec();
        let mut per_conn: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
        for r in &records {
            if let Some(tag) = &r.tag {
                per_conn.entry(r.conn).or_default().insert(tag.clone());
            }
        }
        for (conn, tags) in per_conn.iter().filter(|_| !opts.shared) {
            if tags.len() > 1 {
                fails.push(format!("upstream connection {conn} carried {tags:?}"));
            }
        }
        let delivered = self.hostile.delivered() - delivered_before;
        // The waits below are for a sidecar that does it right: once a case has failed,
        // one look is enough, so that a broken build fails fast.
        let patience =
            |fails: &Vec<String>| Duration::from_secs(if fails.is_empty() { 1 } else { 0 });
        let must_close = matches!(
            (shape.framing, timing),
            (Framing::Refused(_), _) | (Framing::Stray { .. }, Timing::AtOnce)
        );
        if must_close {
            if let Some(conn) = records
                .iter()
                .find(|r| r.tag.as_deref() == Some(a.marker.as_str()))
                .map(|r| r.conn)
            {
                let later = records.iter().filter(|r| r.conn == conn).count() - 1;
                if later > 0 {
                    fails.push(format!(
                        "the first answer's connection carried {later} more request(s)"
                    ));
                }
                let hostile = &self.hostile;
                let within = patience(&fails);
                if !support::eventually(within, || !hostile.is_open(conn)).await {
                    fails.push("the first answer's connection was kept open".to_owned());
                }
            }
        }
        if matches!(shape.framing, Framing::Refused(_)) && delivered > 0 {
            fails.push("what followed a refused answer was read".to_owned());
        }

        // The framing-error family.
        let expected: &[&str] = match (shape.framing, timing) {
            (Framing::Clean, _) => &[],
            (Framing::Refused(kinds), _) => kinds,
            (Framing::Stray { at_once, .. }, Timing::AtOnce) => at_once,
            (Framing::Stray { late, .. }, Timing::Late) if delivered > 0 => late,
            (Framing::Stray { .. }, Timing::Late) => &[],
        };
        let after = settled(&self.sidecar, &before, self.up, expected, patience(&fails)).await;
        fails.extend(check_framing(&before, &after, self.up, expected));

        // Healthy, and nothing an upstream sent (nor a path) in the log.
        fails.extend(healthy_checks(&self.sidecar, &after).await);
        let log = self
            .sidecar
            .log()
            .get(log_from..)
            .unwrap_or_default()
            .to_ascii_lowercase();
        for x in &callers {
            if log.contains(&x.marker.to_ascii_lowercase()) {
                fails.push(format!("{}'s marker reached the sidecar's log", x.marker));
            }
        }

        self.hostile.close_tagged().await;
        fails
    }
}

fn mcp_post(c: &Caller, body: &str) -> Vec<u8> {
    let mut r = format!(
        "POST /mcp HTTP/1.1\r\nHost: sidecar.test\r\nAuthorization: Bearer {}\r\nAccept: {ACCEPT_BOTH}\r\nContent-Type: application/json\r\nX-Vault-Id: default\r\nContent-Length: {}\r\n",
        c.token,
        body.len()
    );
    if let Some(s) = &c.session {
        r.push_str(&format!("Mcp-Session-Id: {s}\r\n"));
    }
    r.push_str("\r\n");
    r.push_str(body);
    r.into_bytes()
}

/// The tool result of an MCP answer: (`isError`, text).
fn tool_result(r: &Reply) -> (bool, String) {
    let msg = support::sse_message(&r.text());
    let result = &msg["result"];
    (
        result["isError"] == Value::Bool(true),
        result["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

/// An answer in one line, for messages.
fn brief(r: &Reply) -> String {
    let text = r.all_text();
    let cut: String = text.chars().take(300).collect();
    format!(
        "status {} complete={} {:?}",
        r.status,
        r.complete,
        one_line(&cut)
    )
}

/// Whether `x` received any byte of `y`'s answers (its marker, in any case: heading ids
/// are lowercased).
fn leaked(x: &Caller, y: &Caller) -> Option<String> {
    let seen = String::from_utf8_lossy(&x.seen).to_ascii_lowercase();
    let marker = y.marker.to_ascii_lowercase();
    let at = seen.find(&marker)?;
    let around: String = seen
        .get(at.saturating_sub(120)..)
        .unwrap_or_default()
        .chars()
        .take(240)
        .collect();
    Some(format!(
        "caller {} received bytes of caller {}: …{}…",
        x.marker,
        y.marker,
        one_line(&around)
    ))
}

/// `text` on one line: CRLF as ` | `, any other line end escaped.
fn one_line(text: &str) -> String {
    text.replace("\r\n", " | ")
        .replace('\n', "\\n")
        .replace('\r', "\\r")
}

/// The deltas of the framing-error family since `before`, by (upstream, kind).
fn framing_deltas(before: &Metrics, after: &Metrics) -> BTreeMap<(String, String), f64> {
    let mut out = BTreeMap::new();
    for (series, value) in &after.samples {
        let Some(labels) = series
            .strip_prefix(FRAMING)
            .and_then(|l| l.strip_prefix('{'))
            .and_then(|l| l.strip_suffix('}'))
        else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .filter_map(|p| p.split_once('='))
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.trim_matches('"').to_owned())
                .unwrap_or_default()
        };
        let delta = value - before.get(series);
        if delta != 0.0 {
            out.insert((label("upstream"), label("kind")), delta);
        }
    }
    out
}

/// A scrape taken once one of `kinds` moved for `up`, or `within` has passed (a second
/// is plenty: a connection is counted when the sidecar lets go of it, by the time its
/// caller has the answer or the upstream sees the close).
async fn settled(
    sidecar: &Sidecar,
    before: &Metrics,
    up: Up,
    kinds: &[&str],
    within: Duration,
) -> Metrics {
    let deadline = Instant::now() + within;
    loop {
        let after = sidecar.metrics().await;
        let moved = framing_deltas(before, &after)
            .iter()
            .any(|((u, k), d)| u == up.label() && kinds.contains(&k.as_str()) && *d > 0.0);
        if kinds.is_empty() || moved || Instant::now() >= deadline {
            return after;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One of `kinds` moved for `up`, and nothing else in the family did.
fn check_framing(before: &Metrics, after: &Metrics, up: Up, kinds: &[&str]) -> Vec<String> {
    let deltas = framing_deltas(before, after);
    let mut fails = Vec::new();
    let hit: f64 = deltas
        .iter()
        .filter(|((u, k), _)| u == up.label() && kinds.contains(&k.as_str()))
        .map(|(_, d)| d)
        .sum();
    if !kinds.is_empty() && hit < 1.0 {
        fails.push(format!(
            "{FRAMING}{{upstream=\"{}\",kind in {kinds:?}}} did not move (moved: {deltas:?})",
            up.label()
        ));
    }
    for ((u, k), d) in &deltas {
        if u != up.label() || !kinds.contains(&k.as_str()) {
            fails.push(format!(
                "{FRAMING}{{upstream=\"{u}\",kind=\"{k}\"}} moved by {d}"
            ));
        }
    }
    fails
}

/// `/live` and `/ready` answer 200 and nothing is left in flight (`scrape`: a recent
/// scrape, looked at first).
async fn healthy_checks(sidecar: &Sidecar, scrape: &Metrics) -> Vec<String> {
    let mut fails = Vec::new();
    let live = client::get(&format!("http://{}/live", sidecar.admin), &[])
        .await
        .map_or(0, |r| r.status.as_u16());
    if live != 200 {
        fails.push(format!("/live answered {live}"));
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut in_flight = scrape.get(IN_FLIGHT);
    loop {
        let ready = sidecar.ready().await;
        if ready == 200 && in_flight == 0.0 {
            break;
        }
        if Instant::now() >= deadline {
            fails.push(format!("/ready {ready}, {in_flight} request(s) in flight"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        in_flight = sidecar.metrics().await.get(IN_FLIGHT);
    }
    fails
}

// ---------------------------------------------------------------------------------------
// The table, run group by group.

/// Runs every shape that applies to the group (`core_only`: one per kind), at once and
/// late; panics with every failing case.
async fn run_table(mut group: Group, core_only: bool) {
    let filter = std::env::var("HOSTILE_CASE").unwrap_or_default();
    let passthrough = matches!(group.surface, Surface::Passthrough | Surface::Anonymous);
    let mut failed = Vec::new();
    let mut ran = 0;
    let t0 = Instant::now();
    for shape in SHAPES {
        if (shape.head && !passthrough) || (core_only && !shape.core) {
            continue;
        }
        let no_rest = (shape.build)(&good(group.up, "HX")).1.is_empty();
        for timing in [Timing::AtOnce, Timing::Late] {
            if timing == Timing::Late && no_rest {
                continue;
            }
            let case = format!("{}/{}/{timing:?}", group.name, shape.name);
            if !case.contains(&filter) {
                continue;
            }
            let opts = Opts {
                three: timing == Timing::Late,
                ..Opts::default()
            };
            let t = Instant::now();
            let fails = group.run(shape, timing, opts).await;
            let ms = t.elapsed().as_millis();
            ran += 1;
            if fails.is_empty() {
                eprintln!("HOSTILE {case} | pass | {ms} ms");
            } else {
                eprintln!("HOSTILE {case} | FAIL | {ms} ms | {}", fails.join(" || "));
                failed.push(format!("{case}:\n    {}", fails.join("\n    ")));
            }
        }
    }
    eprintln!(
        "HOSTILE {} | {ran} cases, {} failed, {} ms",
        group.name,
        failed.len(),
        t0.elapsed().as_millis()
    );
    assert!(
        failed.is_empty(),
        "{} of {ran} cases failed:\n{}\n--- sidecar log tail ---\n{}",
        failed.len(),
        failed.join("\n"),
        tail(&group.sidecar.log(), 4000)
    );
}

fn tail(log: &str, n: usize) -> &str {
    let start = log.len().saturating_sub(n);
    let start = (start..log.len())
        .find(|i| log.is_char_boundary(*i))
        .unwrap_or(log.len());
    &log[start..]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_with_tokens_plain() {
    let g = Group::start(
        "gateway-tokens",
        Up::Gateway,
        Surface::Passthrough,
        false,
        &[],
    )
    .await;
    run_table(g, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_anonymous_plain() {
    let g = Group::start(
        "gateway-anonymous",
        Up::Gateway,
        Surface::Anonymous,
        false,
        &[],
    )
    .await;
    run_table(g, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canister_rest_plain() {
    let g = Group::start("canister-rest", Up::Canister, Surface::Rest, false, &[]).await;
    run_table(g, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canister_mcp_plain() {
    let g = Group::start("canister-mcp", Up::Canister, Surface::Mcp, false, &[]).await;
    run_table(g, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bridge_rest_plain() {
    let g = Group::start("bridge-rest", Up::Bridge, Surface::Rest, false, &[]).await;
    run_table(g, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bridge_mcp_plain() {
    let g = Group::start("bridge-mcp", Up::Bridge, Surface::Mcp, false, &[]).await;
    run_table(g, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_with_tokens_tls() {
    let g = Group::start("gateway-tls", Up::Gateway, Surface::Passthrough, true, &[]).await;
    run_table(g, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canister_rest_tls() {
    let g = Group::start("canister-tls", Up::Canister, Surface::Rest, true, &[]).await;
    run_table(g, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bridge_rest_tls() {
    let g = Group::start("bridge-tls", Up::Bridge, Surface::Rest, true, &[]).await;
    run_table(g, true).await;
}

// ---------------------------------------------------------------------------------------
// The finding, end to end.

/// A canister misframes user A's note read (`Content-Length` beside chunked, the rest
/// arriving once the next request is on the connection); user B's own section-source
/// read right after, on REST and with the MCP tool (each surface has its own canister
/// connections), never carries A's title or headings, and A gets the refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_b_never_reads_user_a_note() {
    let mut g = Group::start("finding", Up::Canister, Surface::Rest, false, &[]).await;
    let mut fails = Vec::new();
    for (case, surface) in [(1, Surface::Rest), (2, Surface::Mcp)] {
        g.surface = surface;
        let mut a = g.caller(case, 'A');
        let mut b = g.caller(case, 'B');
        if surface == Surface::Mcp {
            // Both sessions first, so that only the note reads meet the canister.
            for c in [&mut a, &mut b] {
                let init = c.client.send(&mcp_post(c, INIT), false).await;
                assert_eq!(init.status, 200, "initialize: {}", brief(&init));
                c.session = init.header("mcp-session-id").map(str::to_owned);
            }
        }
        *g.script.armed.lock().unwrap() = Some(Armed {
            tag: a.marker.clone(),
            shape: shape("length-and-chunked"),
            timing: Timing::Late,
        });
        let first = g.call(&mut a, false).await;
        let second = g.call(&mut b, false).await;
        let text = second.all_text();
        for what in [
            format!("T-{}", a.marker),
            format!("H-{}", a.marker),
            format!("H2-{}", a.marker),
        ] {
            if let Some(at) = text.find(&what) {
                let around: String = text[at.saturating_sub(80)..].chars().take(200).collect();
                fails.push(format!(
                    "[{surface:?}] user B's answer carries user A's {what}: …{}…",
                    one_line(&around)
                ));
            }
        }
        if let Err(e) = g.check_served(&second, &b.marker, false) {
            fails.push(format!("[{surface:?}] user B: {e}"));
        }
        if let Err(e) = g.check_refused(&first, false) {
            fails.push(format!("[{surface:?}] user A: {e}"));
        }
    }
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}

// ---------------------------------------------------------------------------------------
// The reuse modes and the pool bounds (new keys: today's binary refuses them, exit 64).

/// `upstream.reuse = "connection"`: one client connection's requests only, even for one
/// `sub` on two connections: what the gateway sends late after the first connection's
/// answer never reaches the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reuse_connection_keeps_one_sub_on_two_connections_apart() {
    let mut failed = Vec::new();
    for (up, surface) in [
        (Up::Gateway, Surface::Passthrough),
        (Up::Canister, Surface::Rest),
    ] {
        let name = if up == Up::Gateway {
            "connection-gateway"
        } else {
            "connection-canister"
        };
        let mut g = Group::start(
            name,
            up,
            surface,
            false,
            &[("UPSTREAM__REUSE", "connection".to_owned())],
        )
        .await;
        for shape_name in ["pipelined-second-answer", "length-and-chunked"] {
            let opts = Opts {
                second_same_sub: true,
                ..Opts::default()
            };
            let fails = g.run(shape(shape_name), Timing::Late, opts).await;
            if !fails.is_empty() {
                failed.push(format!("{name}/{shape_name}: {}", fails.join(" || ")));
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// `upstream.reuse = "shared"`: any caller's request may take any idle connection. Strict
/// framing still refuses a misframed answer, so its rest never reaches the next caller;
/// but a correctly framed answer followed late by a second one cannot be told from the
/// next caller's answer: with one idle connection and the callers one after the other,
/// user B's read deterministically gets what the canister wrote for user A. This is why
/// shared reuse is documented unsafe for mixed callers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reuse_shared_prevents_misframing_but_not_late_answers() {
    let mut g = Group::start(
        "shared-canister",
        Up::Canister,
        Surface::Rest,
        false,
        // One worker: each worker has pools of its own, so callers on two workers
        // would never share a connection.
        &[
            ("UPSTREAM__REUSE", "shared".to_owned()),
            ("RUNTIME__THREADS", "1".to_owned()),
        ],
    )
    .await;

    // What it cannot prevent (first, while the pool holds exactly one connection).
    let mut a = g.caller(1, 'A');
    let mut b = g.caller(1, 'B');
    let before = g.sidecar.metrics().await;
    *g.script.armed.lock().unwrap() = Some(Armed {
        tag: a.marker.clone(),
        shape: shape("pipelined-second-answer"),
        timing: Timing::Late,
    });
    let first = g.call(&mut a, false).await;
    g.check_served(&first, &a.marker, false).unwrap();
    let second = g.call(&mut b, false).await;
    assert!(
        second.text().contains(&format!("T-{}", a.marker)),
        "under shared reuse a late second answer was expected to reach the next caller \
         (if this changed, update the documentation of upstream.reuse): {}",
        brief(&second)
    );
    let after = settled(
        &g.sidecar,
        &before,
        Up::Canister,
        AFTER,
        Duration::from_secs(1),
    )
    .await;
    let fails = check_framing(&before, &after, Up::Canister, AFTER);
    assert!(fails.is_empty(), "{fails:?}");
    g.hostile.close_tagged().await;

    // What it prevents: a refused answer's rest reaches nobody.
    g.cases = 1;
    let opts = Opts {
        three: true,
        shared: true,
        ..Opts::default()
    };
    let fails = g.run(shape("length-and-chunked"), Timing::Late, opts).await;
    assert!(fails.is_empty(), "{fails:?}");
}

/// `upstream.pool_max_idle_per_principal` and `upstream.pool_idle_timeout_ms`: of three
/// connections one principal opened at once, one stays idle, and it closes after the
/// idle timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_bounded_per_principal_and_in_time() {
    let script = Arc::new(Script::default());
    let inner = hostile_handler(Up::Gateway, Arc::clone(&script));
    // Each answer waits a little, so that the three requests need three connections.
    let handler: hostile::Handler = Arc::new(move |req: &Request| {
        let mut answer = inner(req);
        if answer.tag.is_some() {
            answer.delay = Duration::from_millis(300);
        }
        answer
    });
    let hostile = Upstream::start(false, handler).await;
    let mut env = base_env();
    env.push(("UPSTREAM__GATEWAY_URL", hostile.url()));
    env.push(("UPSTREAM__POOL_MAX_IDLE_PER_PRINCIPAL", "1".to_owned()));
    env.push(("UPSTREAM__POOL_IDLE_TIMEOUT_MS", "1500".to_owned()));
    // The bound is each worker's pool's: one worker, one pool.
    env.push(("RUNTIME__THREADS", "1".to_owned()));
    let sidecar = start_sidecar(&env).await;
    let sub_token = token("user-idle");
    let send = |marker: &'static str| {
        let addr = sidecar.addr;
        let auth = sub_token.clone();
        async move {
            let req = format!(
                "GET /hx/{marker} HTTP/1.1\r\nHost: sidecar.test\r\nAuthorization: Bearer {auth}\r\n\r\n"
            );
            Client::new(addr).send(req.as_bytes(), false).await
        }
    };
    let (r1, r2, r3) = tokio::join!(send("IDLE1"), send("IDLE2"), send("IDLE3"));
    for r in [&r1, &r2, &r3] {
        assert_eq!(r.status, 200, "{}", brief(r));
    }
    let conns: BTreeSet<usize> = hostile
        .records()
        .iter()
        .filter(|r| r.tag.is_some())
        .map(|r| r.conn)
        .collect();
    assert_eq!(conns.len(), 3, "three requests at once, three connections");
    assert!(
        support::eventually(Duration::from_secs(1), || hostile.open_tagged() == 1).await,
        "{} idle connection(s) kept for one principal, at most 1 allowed",
        hostile.open_tagged()
    );
    assert!(
        support::eventually(Duration::from_secs(5), || hostile.open_tagged() == 0).await,
        "the idle connection outlived upstream.pool_idle_timeout_ms"
    );
}
