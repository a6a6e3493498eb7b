//! The leak proof: a few hundred generated notes, each carrying its own canaries in every
//! place that is not heading text, run through both intercepted surfaces of the real
//! binary (`serve`): the REST route (wire contract §5) and the MCP `tools/call` of
//! `get_section_source` (wire contract §6), with the test-kit canister, bridge and
//! gateway behind it.
//!
//! Canaries sit in body paragraphs, emphasis, inline code, fenced (backtick and tilde)
//! and indented code, HTML blocks (div, comment, script, processing instruction, CDATA)
//! and inline HTML, link text, destinations and titles, reference definitions, images,
//! autolinks, lists, block quotes, tables, footnotes, escapes and entities; in the link
//! and image destinations and titles of heading lines (section-source §6: a link or image
//! contributes its text or alt only); in every frontmatter key and value but the title
//! (nested maps, lists, multi-line strings, `project`); in the canister's own `path` and
//! unknown fields; in canister and bridge error bodies and malformed 2xx bodies; in
//! headers the canister and bridge answer with; in the bridge's effective user, role,
//! scope and unknown fields; in the token's `sub` and extra claims; in the vault id; and
//! in request headers, query parameters and MCP `clientInfo` / `_meta` the client sends.
//!
//! Every byte the sidecar answers on the intercepted surfaces (status line, headers,
//! body before and after de-chunking), every log line (debug level, JSON, access log
//! `all`) and the admin metrics scrape are scanned for every canary: three ways (the
//! `LEAK` marker in any letter case, each canary's random payload wherever it appears,
//! and the secrets and token segments verbatim); there must be no hit (wire contract §5
//! "Upstream bodies are never forwarded", §7 "Never log a request path, query, header
//! value, body, heading or user id"). The passthrough `initialize` answers come from the
//! mock gateway, which echoes none of the canaries, so they are scanned too.
//!
//! So that the proof cannot pass by answering nothing, each note's outcome is asserted
//! exactly: the served headings (level and text, in order) and title on both surfaces,
//! the REST bytes equal to the MCP tool text, the sanitized error bodies, the canister
//! reads per note and the metrics counters per outcome.

// A failed expectation in a test is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use knowtation_testkit::{
    self as testkit, client, CanisterOverride, MockBridge, MockCanister, MockGateway, Reply,
};
use serde_json::{json, Map, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

// The real binary with debug JSON logs read as they come (`log.access = "all"` added
// below): the same start-up as the fault tests.
#[path = "support/sidecar.rs"]
mod support;
use support::Sidecar;

/// How many notes are generated.
const NOTES: usize = 300;
/// The generator's fixed seed: the same notes, canaries and requests on every run.
const SEED: u64 = 0x5eed_1eaf_c0de_2f1b;
const JWT_SECRET: &str = "proof-jwt-secret-0123456789abcdef";
/// Every canary starts with it; it is searched for in any letter case.
const MARKER: &[u8] = b"leak";
/// Hex digits of each canary's random payload.
const PAYLOAD_LEN: usize = 16;
const ACCEPT_MCP: &str = "application/json, text/event-stream";
/// The SectionSource content type (wire contract §5).
const REST_CONTENT_TYPE: &str = "application/json; charset=utf-8";
/// Notes past the cap of section-source §10 (1,000,000 UTF-16 units).
const OVERSIZED_BODY_CHARS: usize = 1_000_100;

// ---------------------------------------------------------------------------------------
// The deterministic generator.

/// Marsaglia's xorshift64 (13, 7, 17): enough randomness for unique canaries and layout
/// choices, reproducible from [`SEED`], no dependency.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Every canary made, by kind, and the payload → canary index for the scanner.
#[derive(Default)]
struct Canaries {
    all: Vec<String>,
    kinds: BTreeMap<String, usize>,
    payloads: HashMap<String, usize>,
}

impl Canaries {
    /// `LEAK-<kind>-<note>-<16 hex>`: unique, and only `[A-Za-z0-9-]`, so it fits a URL,
    /// a header name or value, a cookie, a vault id and a JSON key unchanged.
    fn make(&mut self, rng: &mut XorShift, kind: &str, note: usize) -> String {
        loop {
            let payload = format!("{:0width$x}", rng.next(), width = PAYLOAD_LEN);
            // A payload of digits only could match a run of timestamp digits in a log.
            if !payload.bytes().any(|b| b.is_ascii_alphabetic())
                || self.payloads.contains_key(&payload)
            {
                continue;
            }
            let canary = format!("LEAK-{kind}-{note}-{payload}");
            self.payloads.insert(payload, self.all.len());
            *self.kinds.entry(kind.to_owned()).or_default() += 1;
            self.all.push(canary.clone());
            return canary;
        }
    }
}

/// One note's generator state.
struct Gen<'a> {
    rng: &'a mut XorShift,
    canaries: &'a mut Canaries,
    n: usize,
    /// Distinguishes the reference labels of one note.
    seq: usize,
}

impl Gen<'_> {
    fn c(&mut self, kind: &str) -> String {
        self.canaries.make(self.rng, kind, self.n)
    }

    fn label(&mut self, prefix: &str) -> String {
        self.seq += 1;
        format!("{prefix}{}x{}", self.n, self.seq)
    }
}

/// What the canister and the bridge do for one note.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    /// A note served on both surfaces.
    Ok,
    /// Served on both; the hosted context has a scope the note passes by folder.
    Scoped,
    /// The bridge's `allowed_vault_ids` lacks the vault: REST 403, MCP serves (§2).
    VaultNotAllowed,
    /// The canister answers this non-2xx status with a canary body.
    CanisterStatus(u16),
    /// The canister answers 200 with HTML.
    NotJson,
    /// The canister answers 200 with cut-off JSON.
    Truncated,
    /// The canister answers 200 with a JSON string: zero sections (§4).
    JsonString,
    /// A title object with its own `toString` (section-source §5).
    ThrowingTitle,
    /// Frontmatter `"a"…"`: REST decodes `{}`, MCP fails (section-source §3).
    QuotedFrontmatter,
    /// A lone surrogate escape: treated as not JSON (§4 Deviation).
    LoneSurrogate,
    /// A body over the cap (section-source §10).
    Oversized,
    /// The bridge answers this non-2xx status with a canary body.
    BridgeStatus(u16),
    /// The bridge answers 200 with a malformed context.
    BridgeMalformed,
    /// The bridge answers 200 with HTML.
    BridgeHtml,
    /// The bridge answers 200 with a non-string effective user.
    BridgeWrongType,
}

const CANISTER_STATUSES: [u16; 20] = [
    400, 401, 403, 404, 405, 409, 410, 418, 422, 429, 451, 500, 501, 502, 503, 504, 301, 302, 307,
    308,
];
const ODD_BODIES: [Case; 7] = [
    Case::NotJson,
    Case::Truncated,
    Case::JsonString,
    Case::ThrowingTitle,
    Case::QuotedFrontmatter,
    Case::LoneSurrogate,
    Case::Oversized,
];
const BRIDGE_FAILURES: [Case; 10] = [
    Case::BridgeStatus(401),
    Case::BridgeStatus(403),
    Case::BridgeStatus(404),
    Case::BridgeStatus(429),
    Case::BridgeStatus(500),
    Case::BridgeStatus(502),
    Case::BridgeStatus(503),
    Case::BridgeMalformed,
    Case::BridgeHtml,
    Case::BridgeWrongType,
];

fn case_of(n: usize) -> Case {
    match n % 10 {
        0..=5 => Case::Ok,
        6 => Case::CanisterStatus(CANISTER_STATUSES[(n / 10) % CANISTER_STATUSES.len()]),
        7 => ODD_BODIES[(n / 10) % ODD_BODIES.len()],
        8 => BRIDGE_FAILURES[(n / 10) % BRIDGE_FAILURES.len()],
        _ if n % 20 == 9 => Case::VaultNotAllowed,
        _ => Case::Scoped,
    }
}

fn is_bridge_failure(case: Case) -> bool {
    BRIDGE_FAILURES.contains(&case)
}

/// What the REST route must answer: a document, or this exact status and body.
#[derive(Debug, Clone)]
enum RestExpect {
    Doc,
    Err(u16, String),
}

/// What the MCP surface must answer.
#[derive(Debug, Clone)]
enum McpExpect {
    Doc,
    /// The tool's handled-failure text (isError).
    ToolError(String),
    /// `initialize` refused with 403 "No hosted access".
    InitRefused,
}

fn rest_error(status: u16, error: &str, code: &str) -> RestExpect {
    RestExpect::Err(status, format!(r#"{{"error":"{error}","code":"{code}"}}"#))
}

/// The wire contract §5 table; the second value is the metrics outcome label.
fn rest_expect(case: Case) -> (RestExpect, &'static str) {
    match case {
        Case::Ok | Case::Scoped | Case::QuotedFrontmatter | Case::JsonString => {
            (RestExpect::Doc, "ok")
        }
        Case::VaultNotAllowed | Case::BridgeStatus(403) => (
            rest_error(403, "Access to this vault is not allowed.", "FORBIDDEN"),
            "vault_forbidden",
        ),
        Case::BridgeStatus(_)
        | Case::BridgeMalformed
        | Case::BridgeHtml
        | Case::BridgeWrongType => (
            rest_error(
                503,
                "Hosted access context unavailable",
                "SERVICE_UNAVAILABLE",
            ),
            "hosted_context_unavailable",
        ),
        Case::CanisterStatus(401 | 403) => (
            rest_error(403, "Forbidden", "FORBIDDEN"),
            "upstream_forbidden",
        ),
        Case::CanisterStatus(404) => (rest_error(404, "Not found", "NOT_FOUND"), "not_found"),
        Case::CanisterStatus(s) => (
            rest_error(502, &format!("Upstream {s}"), "BAD_GATEWAY"),
            "upstream_status",
        ),
        Case::NotJson | Case::Truncated | Case::LoneSurrogate => (
            rest_error(502, "Invalid note response", "BAD_GATEWAY"),
            "bad_gateway",
        ),
        Case::ThrowingTitle | Case::Oversized => {
            (rest_error(502, "Bad Gateway", "BAD_GATEWAY"), "bad_gateway")
        }
    }
}

fn tool_error(msg: &str) -> McpExpect {
    McpExpect::ToolError(format!(r#"{{"error":"{msg}","code":"UPSTREAM_ERROR"}}"#))
}

/// The wire contract §6 tool results; the second value is the metrics outcome label.
fn mcp_expect(case: Case) -> (McpExpect, &'static str) {
    match case {
        Case::Ok | Case::Scoped | Case::VaultNotAllowed | Case::JsonString => {
            (McpExpect::Doc, "ok")
        }
        // Counted as on REST: a missing note is `not_found`, a refused read
        // `upstream_forbidden`, whatever the tool result says.
        Case::CanisterStatus(s) => (
            tool_error(&format!("Upstream {s}")),
            match s {
                404 => "not_found",
                401 | 403 => "upstream_forbidden",
                _ => "upstream_status",
            },
        ),
        Case::NotJson
        | Case::Truncated
        | Case::LoneSurrogate
        | Case::ThrowingTitle
        | Case::Oversized
        | Case::QuotedFrontmatter => (tool_error("Runtime failure"), "bad_gateway"),
        Case::BridgeStatus(_)
        | Case::BridgeMalformed
        | Case::BridgeHtml
        | Case::BridgeWrongType => (McpExpect::InitRefused, "no_hosted_access"),
    }
}

/// One generated note with everything sent about it and everything expected of it.
struct Note {
    n: usize,
    case: Case,
    path: String,
    vault: String,
    token: String,
    /// The effective user the bridge names (canary), when it answers a context.
    effective_user: Option<String>,
    canister_status: u16,
    canister_body: Bytes,
    bridge_reply: Reply,
    /// Headers the canister's and the bridge's answers carry for this note's vault.
    canister_headers: Vec<(String, String)>,
    bridge_headers: Vec<(String, String)>,
    /// Extra headers of the REST request and of the MCP requests.
    rest_headers: Vec<(String, String)>,
    mcp_headers: Vec<(String, String)>,
    rest_query: String,
    mcp_client: (String, String),
    mcp_meta: String,
    title: Option<String>,
    headings: Vec<(u64, String)>,
}

/// Canary-valued headers an upstream answers with; `side` is `c` (canister) or `b`.
fn upstream_headers(g: &mut Gen<'_>, side: &str) -> Vec<(String, String)> {
    let name = g.c(&format!("{side}-hname")).to_ascii_lowercase();
    vec![
        (name, "1".to_owned()),
        ("x-upstream-debug".to_owned(), g.c(&format!("{side}-hdr"))),
        (
            "set-cookie".to_owned(),
            format!("sid={}; Path=/; HttpOnly", g.c(&format!("{side}-cookie"))),
        ),
        (
            "www-authenticate".to_owned(),
            format!("Bearer error=\"{}\"", g.c(&format!("{side}-wwwauth"))),
        ),
        (
            "location".to_owned(),
            format!("https://upstream.invalid/{}", g.c(&format!("{side}-loc"))),
        ),
        ("x-request-id".to_owned(), g.c(&format!("{side}-rid"))),
        ("server".to_owned(), g.c(&format!("{side}-server"))),
        ("retry-after".to_owned(), g.c(&format!("{side}-retry"))),
    ]
}

/// Canary-valued headers a client sends; `side` is `rq` (REST) or `mq` (MCP).
fn request_headers(g: &mut Gen<'_>, side: &str) -> Vec<(String, String)> {
    let name = g.c(&format!("{side}-hname")).to_ascii_lowercase();
    vec![
        (name, "1".to_owned()),
        ("x-leak-probe".to_owned(), g.c(&format!("{side}-xhdr"))),
        (
            "user-agent".to_owned(),
            format!("Probe/1.0 ({})", g.c(&format!("{side}-ua"))),
        ),
        (
            "cookie".to_owned(),
            format!("sid={}", g.c(&format!("{side}-cookie"))),
        ),
        (
            "referer".to_owned(),
            format!("https://client.invalid/{}", g.c(&format!("{side}-referer"))),
        ),
        (
            "origin".to_owned(),
            format!("https://{}.invalid", g.c(&format!("{side}-origin"))),
        ),
        // Spoofed identity headers: the sidecar sets its own (wire contract §4).
        ("x-user-id".to_owned(), g.c(&format!("{side}-xuid"))),
        ("x-actor-id".to_owned(), g.c(&format!("{side}-xactor"))),
        ("x-gateway-auth".to_owned(), g.c(&format!("{side}-xgw"))),
    ]
}

/// Frontmatter with canaries in every key and value but the title.
fn frontmatter(g: &mut Gen<'_>, title: Option<Value>) -> Map<String, Value> {
    let mut m = Map::new();
    if let Some(t) = title {
        m.insert("title".to_owned(), t);
    }
    m.insert(g.c("fm-key"), Value::String(g.c("fm-val")));
    m.insert(
        "tags".to_owned(),
        json!([g.c("fm-tag"), g.c("fm-tag"), 7, null]),
    );
    let mut inner = Map::new();
    inner.insert(
        g.c("fm-nkey"),
        json!({"deep": [g.c("fm-deep"), {"x": g.c("fm-deeper")}]}),
    );
    inner.insert("author".to_owned(), Value::String(g.c("fm-author")));
    m.insert("meta".to_owned(), Value::Object(inner));
    m.insert(
        "summary".to_owned(),
        Value::String(format!(
            "line one {}\nline two {}\n",
            g.c("fm-ml1"),
            g.c("fm-ml2")
        )),
    );
    m.insert("project".to_owned(), Value::String(g.c("fm-project")));
    m.insert("aliases".to_owned(), json!([[g.c("fm-alias")]]));
    m
}

/// The number of heading shapes [`heading`] knows.
const HEADING_KINDS: usize = 12;

/// One heading line (or lines): level, Markdown, and the heading text section-source §6
/// computes from it. Canaries only where §6 leaves them out: link and image
/// destinations and titles, and reference definitions (pushed to `defs`).
fn heading(
    g: &mut Gen<'_>,
    kind: usize,
    k: usize,
    defs: &mut Vec<String>,
) -> (u64, String, String) {
    let n = g.n;
    let tag = format!("{n}-{k}");
    let level = 1 + g.rng.below(6) as u64;
    let hashes = "#".repeat(level as usize);
    match kind {
        0 => (
            level,
            format!("{hashes} Topic {tag} overview"),
            format!("Topic {tag} overview"),
        ),
        1 => {
            let (u, t) = (g.c("h-link"), g.c("h-linktitle"));
            (
                level,
                format!("{hashes} See [guide {tag}](https://docs.invalid/{u} \"{t}\") now"),
                format!("See guide {tag} now"),
            )
        }
        2 => {
            let (u, t) = (g.c("h-img"), g.c("h-imgtitle"));
            (
                level,
                format!("{hashes} Logo ![badge {tag}](https://img.invalid/{u}.png \"{t}\") end"),
                format!("Logo badge {tag} end"),
            )
        }
        3 => {
            let label = g.label("hr");
            let (u, t) = (g.c("h-refdef"), g.c("h-reftitle"));
            defs.push(format!("[{label}]: https://ref.invalid/{u} \"{t}\""));
            (
                level,
                format!("{hashes} Ref [manual {tag}][{label}]"),
                format!("Ref manual {tag}"),
            )
        }
        4 => {
            let (u, t) = (g.c("h-angle"), g.c("h-sqtitle"));
            (
                level,
                format!("{hashes} *Deep* [dive {tag}](<https://x.invalid/{u} more> '{t}')"),
                format!("Deep dive {tag}"),
            )
        }
        5 => {
            let (u, t) = (g.c("h-setext"), g.c("h-setexttitle"));
            let (level, underline) = if g.rng.below(2) == 0 {
                (1, "=====")
            } else {
                (2, "-----")
            };
            (
                level,
                format!("Setext {tag} [link](https://s.invalid/{u} ({t}))\n{underline}"),
                format!("Setext {tag} link"),
            )
        }
        6 => {
            let u = g.c("h-quoted");
            (
                2,
                format!("> ## Quoted {tag} [q](https://q.invalid/{u})"),
                format!("Quoted {tag} q"),
            )
        }
        7 => {
            let (u, t) = (g.c("h-listed"), g.c("h-listedtitle"));
            (
                3,
                format!("- ### Listed {tag} ![i](https://li.invalid/{u}.png \"{t}\")"),
                format!("Listed {tag} i"),
            )
        }
        8 => (
            level,
            format!("{hashes} Code `cfg{n}` {k} ##"),
            format!("Code cfg{n} {k}"),
        ),
        9 => {
            let (u, t) = (g.c("h-refimg"), g.c("h-refimgtitle"));
            defs.push(format!("[pic {tag}]: https://img.invalid/{u} \"{t}\""));
            (
                level,
                format!("{hashes} Shot ![pic {tag}][]"),
                format!("Shot pic {tag}"),
            )
        }
        10 => {
            let (u, t) = (g.c("h-shortcut"), g.c("h-shortcuttitle"));
            defs.push(format!("[ref {tag}]: <https://sr.invalid/{u}> '{t}'"));
            (
                level,
                format!("{hashes} Short [ref {tag}]"),
                format!("Short ref {tag}"),
            )
        }
        _ => {
            let (u, v) = (g.c("h-nestimg"), g.c("h-nestlink"));
            (
                level,
                format!(
                    "{hashes} Nest [![inner {tag}](https://ni.invalid/{u})](https://no.invalid/{v})"
                ),
                format!("Nest inner {tag}"),
            )
        }
    }
}

/// The number of block shapes [`block`] knows.
const BLOCK_KINDS: usize = 16;

/// One body block full of canaries. Each shape starts at column 0 with something that
/// closes a preceding list or quote, and none can become a heading (code and HTML blocks
/// hold `#` lines on purpose: they never produce headings).
fn block(g: &mut Gen<'_>, kind: usize, defs: &mut Vec<String>) -> String {
    match kind {
        0 => format!(
            "Plain {} and *{}* and **{}** with `{}` plus <span class=\"{}\">{}</span> end.",
            g.c("para"),
            g.c("em"),
            g.c("strong"),
            g.c("icode"),
            g.c("ihtmlattr"),
            g.c("ihtml")
        ),
        1 => {
            let label = g.label("r");
            defs.push(format!(
                "[{label}]: https://r.invalid/{} \"{}\"",
                g.c("refdef"),
                g.c("reftitle")
            ));
            format!(
                "Read [{}](https://l.invalid/{} \"{}\"), ![{}](https://i.invalid/{}.png \"{}\"), <https://a.invalid/{}>, <{}@mail.invalid> and [{}][{label}].",
                g.c("ltext"),
                g.c("lurl"),
                g.c("ltitle"),
                g.c("alt"),
                g.c("iurl"),
                g.c("ititle"),
                g.c("autolink"),
                g.c("mail"),
                g.c("rtext")
            )
        }
        2 => format!(
            "```{}\n# {}\n{}\n```",
            g.c("finfo"),
            g.c("fhash"),
            g.c("fence")
        ),
        3 => format!("~~~\n## {}\n{}\n~~~", g.c("thash"), g.c("tilde")),
        4 => format!(
            "Indented sample:\n\n    # {}\n    {}",
            g.c("ihash"),
            g.c("indent")
        ),
        5 => format!(
            "<div class=\"{}\">\n<h2>{}</h2>\n{}\n</div>",
            g.c("dattr"),
            g.c("htmlh2"),
            g.c("html")
        ),
        6 => format!("<!--\n# {}\n-->", g.c("comment")),
        7 => format!("<script>\nvar s = \"{}\";\n</script>", g.c("script")),
        8 => format!(
            "- {}\n- [ ] {}\n  - {}\n\n1. {}\n2. `{}`",
            g.c("li"),
            g.c("task"),
            g.c("linested"),
            g.c("ol"),
            g.c("olcode")
        ),
        9 => format!(
            "> {}\n> > {}\n>\n> ```\n> # {}\n> ```",
            g.c("bq"),
            g.c("bqnested"),
            g.c("bqcode")
        ),
        10 => format!(
            "| Key | {} |\n| --- | --- |\n| {} | `{}` |",
            g.c("th"),
            g.c("td"),
            g.c("tdcode")
        ),
        11 => {
            let label = g.label("f");
            format!(
                "Claim {}[^{label}].\n\n[^{label}]: {} with more",
                g.c("fnref"),
                g.c("fnbody")
            )
        }
        12 => format!(
            "{}  \n{}\\\n{}\n\n***",
            g.c("hardbreak"),
            g.c("hardbreak"),
            g.c("hardbreak")
        ),
        13 => format!(
            "\\# {} and &#35; {} and &lt;{}&gt;",
            g.c("escaped"),
            g.c("entity"),
            g.c("entity")
        ),
        14 => format!(
            "<?php echo '{}'; ?>\n\n<![CDATA[ {} ]]>",
            g.c("pi"),
            g.c("cdata")
        ),
        _ => {
            let label = g.label("d");
            format!(
                "[{label}]: <https://d.invalid/{} path> ({})",
                g.c("refonly"),
                g.c("refonlytitle")
            )
        }
    }
}

/// A Markdown body and the headings section-source §6 finds in it, in document order.
fn body(g: &mut Gen<'_>) -> (String, Vec<(u64, String)>) {
    let mut out = String::new();
    let mut defs = Vec::new();
    let mut headings = Vec::new();
    let kind = g.rng.below(BLOCK_KINDS);
    out.push_str(&block(g, kind, &mut defs));
    out.push_str("\n\n");
    let sections = 3 + g.rng.below(4);
    for k in 0..sections {
        // Every note walks the shapes from a different start, so all are covered.
        let (level, md, text) = heading(g, (g.n * 5 + k) % HEADING_KINDS, k, &mut defs);
        out.push_str(&md);
        out.push_str("\n\n");
        headings.push((level, text));
        for _ in 0..1 + g.rng.below(3) {
            let kind = g.rng.below(BLOCK_KINDS);
            out.push_str(&block(g, kind, &mut defs));
            out.push_str("\n\n");
        }
    }
    for d in defs {
        out.push_str(&d);
        out.push('\n');
    }
    (out, headings)
}

/// A stored-note answer with canaries in the canister's own `path` and an unknown field.
fn stored(g: &mut Gen<'_>, frontmatter: Value, body: &str) -> String {
    let mut m = Map::new();
    m.insert("path".to_owned(), Value::String(g.c("c-path")));
    m.insert("frontmatter".to_owned(), frontmatter);
    m.insert("body".to_owned(), Value::String(body.to_owned()));
    m.insert(g.c("c-extrakey"), Value::String(g.c("c-extraval")));
    Value::Object(m).to_string()
}

impl Note {
    fn generate(n: usize, rng: &mut XorShift, canaries: &mut Canaries) -> Note {
        let g = &mut Gen {
            rng,
            canaries,
            n,
            seq: 0,
        };
        let case = case_of(n);
        let path = format!("notes/b{}/note_{n}-field--log.md", n / 50);
        let basename_title = format!("note {n} field log");
        let vault = g.c("vault");
        let user = g.c("sub");
        let token = testkit::sign_token(
            JWT_SECRET,
            json!({
                "sub": user,
                "type": "mcp_access",
                "scopes": ["vault:read", "vault:write"],
                "exp": testkit::unix_now() + 3600,
                "iat": testkit::unix_now(),
                "name": g.c("tk-name"),
                "email": format!("{}@mail.invalid", g.c("tk-email")),
                "role": g.c("tk-role"),
                g.c("tk-claimkey"): g.c("tk-claimval"),
            }),
        );

        let (title_value, title) = match n % 4 {
            0 => (
                Some(json!(format!("Note {n} title"))),
                format!("Note {n} title"),
            ),
            1 => (None, basename_title.clone()),
            2 => (
                Some(json!(format!("  Padded {n}  "))),
                format!("Padded {n}"),
            ),
            _ => (Some(json!(1000 + n)), (1000 + n).to_string()),
        };
        let (markdown, headings) = body(g);
        let fm = frontmatter(g, title_value);
        // The three stored forms both decoders read (section-source §3).
        let fm_stored = match n % 3 {
            0 => Value::String(Value::Object(fm).to_string()),
            1 => Value::String(Value::String(Value::Object(fm).to_string()).to_string()),
            _ => Value::Object(fm),
        };

        let (canister_status, canister_body, title, headings) = match case {
            Case::CanisterStatus(s) => {
                let body = if n % 20 < 10 {
                    json!({
                        "error": g.c("c-err"),
                        "message": g.c("c-msg"),
                        "stack": format!("Error: {}\n    at handler", g.c("c-stack")),
                    })
                    .to_string()
                } else {
                    format!("<html><body><h1>{}</h1></body></html>", g.c("c-errhtml"))
                };
                (s, body, None, Vec::new())
            }
            Case::NotJson => (
                200,
                format!(
                    "<html><head><title>{}</title></head><body>{}</body></html>",
                    g.c("c-html"),
                    g.c("c-html")
                ),
                None,
                Vec::new(),
            ),
            Case::Truncated => (
                200,
                format!(
                    "{{\"path\":\"{}\",\"frontmatter\":\"{{}}\",\"body\":\"# Cut {}",
                    g.c("c-path"),
                    g.c("c-trunc")
                ),
                None,
                Vec::new(),
            ),
            Case::JsonString => (
                200,
                Value::String(format!("# {} {}", g.c("c-string"), markdown)).to_string(),
                Some(basename_title),
                Vec::new(),
            ),
            Case::ThrowingTitle => {
                let mut fm = Map::new();
                fm.insert("title".to_owned(), json!({"toString": g.c("c-tostring")}));
                fm.insert(g.c("fm-key"), Value::String(g.c("fm-val")));
                let fm = Value::String(Value::Object(fm).to_string());
                (200, stored(g, fm, &markdown), None, Vec::new())
            }
            Case::QuotedFrontmatter => {
                let fm = Value::String(format!("\"a\"{}\"", g.c("c-quoted")));
                (
                    200,
                    stored(g, fm, &markdown),
                    Some(basename_title),
                    headings,
                )
            }
            Case::LoneSurrogate => (
                200,
                format!(
                    "{{\"path\":\"{}\",\"frontmatter\":\"{{}}\",\"body\":\"# Broken \\ud800 {}\"}}",
                    g.c("c-path"),
                    g.c("c-surrogate")
                ),
                None,
                Vec::new(),
            ),
            Case::Oversized => {
                let big = format!(
                    "# Big {}\n\n{}\n\n{}",
                    g.c("c-big"),
                    "x".repeat(OVERSIZED_BODY_CHARS),
                    g.c("c-big")
                );
                (200, stored(g, fm_stored, &big), None, Vec::new())
            }
            // Bridge failures never reach the canister; a served note would leak there.
            _ => (200, stored(g, fm_stored, &markdown), Some(title), headings),
        };

        let effective_user = g.c("b-eff");
        let role = match n % 4 {
            0 => "editor".to_owned(),
            1 => "viewer".to_owned(),
            2 => "admin".to_owned(),
            // Any other role is treated as `viewer` (wire contract §6).
            _ => g.c("b-role"),
        };
        let other_vault = g.c("b-othervault");
        let context = |allowed: Value, scope: Value, g: &mut Gen<'_>| {
            let mut m = Map::new();
            m.insert("allowed_vault_ids".to_owned(), allowed);
            m.insert(
                "effective_canister_user_id".to_owned(),
                Value::String(effective_user.clone()),
            );
            m.insert("scope".to_owned(), scope);
            m.insert("role".to_owned(), Value::String(role.clone()));
            m.insert(g.c("b-extrakey"), Value::String(g.c("b-extraval")));
            Value::Object(m)
        };
        let bridge_error =
            |g: &mut Gen<'_>| json!({"error": g.c("b-err"), "message": g.c("b-msg")}).to_string();
        let bridge_reply = match case {
            Case::VaultNotAllowed => {
                Reply::json(200, &context(json!([other_vault]), Value::Null, g))
            }
            Case::Scoped => {
                let scope = json!({"folders": ["notes"], "projects": [g.c("b-project")]});
                Reply::json(200, &context(json!([vault, other_vault]), scope, g))
            }
            Case::BridgeStatus(s) => Reply::raw(s, bridge_error(g)),
            Case::BridgeMalformed => Reply::raw(
                200,
                json!({"allowed_vault_ids": g.c("b-malformed"), "role": g.c("b-role")}).to_string(),
            ),
            Case::BridgeHtml => Reply::raw(200, format!("<html>{}</html>", g.c("b-html")))
                .with_content_type(Some("text/html")),
            Case::BridgeWrongType => Reply::json(
                200,
                &json!({"allowed_vault_ids": [vault], "effective_canister_user_id": 7, "note": g.c("b-wrongtype")}),
            ),
            _ => Reply::json(200, &context(json!([vault, other_vault]), Value::Null, g)),
        };

        let canister_headers = upstream_headers(g, "c");
        let bridge_headers = upstream_headers(g, "b");
        let rest_headers = request_headers(g, "rq");
        let mcp_headers = request_headers(g, "mq");
        let rest_query = format!("{}={}", g.c("rq-qkey"), g.c("rq-qval"));
        let mcp_client = (g.c("mq-client"), g.c("mq-clientver"));
        let mcp_meta = g.c("mq-meta");
        Note {
            n,
            case,
            path,
            vault,
            token,
            effective_user: (!is_bridge_failure(case)).then_some(effective_user),
            canister_status,
            canister_body: Bytes::from(canister_body),
            bridge_reply,
            canister_headers,
            bridge_headers,
            rest_headers,
            mcp_headers,
            rest_query,
            mcp_client,
            mcp_meta,
            title,
            headings,
        }
    }

    /// How many times the canister must be read for this note: once per surface that
    /// gets past the hosted-context checks.
    fn expected_reads(&self) -> usize {
        match self.case {
            c if is_bridge_failure(c) => 0,
            Case::VaultNotAllowed => 1,
            _ => 2,
        }
    }

    /// Checks a served document: schema, path, title, and every heading (level, text,
    /// order), each of which must also appear literally in the answer.
    fn check_doc(&self, what: &str, text: &str) -> usize {
        let doc: Value =
            serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {text}"));
        assert_eq!(doc["schema"], "knowtation.section_source/v0", "{what}");
        assert_eq!(doc["path"], self.path.as_str(), "{what}");
        assert_eq!(doc["title"], json!(self.title), "{what}");
        assert_eq!(doc["truncated"], false, "{what}");
        let got: Vec<(u64, String)> = doc["sections"]
            .as_array()
            .unwrap_or_else(|| panic!("{what}: no sections: {text}"))
            .iter()
            .map(|s| {
                (
                    s["level"].as_u64().unwrap(),
                    s["heading_text"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        assert_eq!(got, self.headings, "{what}: headings\n{text}");
        for (_, h) in &self.headings {
            assert!(text.contains(h.as_str()), "{what}: heading {h:?} missing");
        }
        self.headings.len()
    }
}

// ---------------------------------------------------------------------------------------
// An upstream front: the canister or bridge mock behind a relay that adds canary headers.

/// Relays every request to a test-kit mock and adds, to its answer, the headers listed
/// for the request's `X-Vault-Id` (the mocks themselves send a fixed header set).
struct Front {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

type HeaderPlan = Arc<HashMap<String, Vec<(String, String)>>>;

impl Front {
    async fn start(backend: String, plan: HashMap<String, Vec<(String, String)>>) -> Front {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let plan: HeaderPlan = Arc::new(plan);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (backend, plan) = (backend.clone(), Arc::clone(&plan));
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        relay(backend.clone(), Arc::clone(&plan), req)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Front { addr, task }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(
    backend: String,
    plan: HeaderPlan,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    let headers: Vec<(String, String)> = parts
        .headers
        .iter()
        .filter(|(k, _)| *k != http::header::HOST && *k != http::header::CONNECTION)
        .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap().to_owned()))
        .collect();
    let refs: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let (addr, forwarded) =
        client::request(parts.method, &format!("{backend}{target}"), &refs, body).unwrap();
    let answer = client::send(addr, forwarded).await.unwrap();
    let mut resp = Response::new(Full::new(answer.body));
    *resp.status_mut() = answer.status;
    for (name, value) in &answer.headers {
        if name != http::header::CONTENT_LENGTH
            && name != http::header::TRANSFER_ENCODING
            && name != http::header::CONNECTION
        {
            resp.headers_mut().append(name, value.clone());
        }
    }
    let vault = parts
        .headers
        .get("x-vault-id")
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    for (name, value) in vault.and_then(|v| plan.get(v)).into_iter().flatten() {
        resp.headers_mut().append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            http::HeaderValue::from_str(value).unwrap(),
        );
    }
    Ok(resp)
}

// ---------------------------------------------------------------------------------------
// The binary.

// ---------------------------------------------------------------------------------------
// Raw exchanges: every byte of the answer, framing included.

struct Answer {
    /// Everything read: status line, headers, body as framed on the wire.
    raw: Vec<u8>,
    status: u16,
    headers: Vec<(String, String)>,
    /// The body after de-chunking (a canary split by chunk framing shows up here).
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

async fn read_more(stream: &mut TcpStream, raw: &mut Vec<u8>) -> bool {
    let mut buf = [0u8; 16 * 1024];
    let n = stream.read(&mut buf).await.unwrap();
    raw.extend_from_slice(&buf[..n]);
    n > 0
}

/// `method target HTTP/1.1` with `headers`, a body, and `Connection: close`.
fn http_request(
    method: &str,
    target: &str,
    host: SocketAddr,
    headers: &[(String, String)],
    body: &str,
) -> Vec<u8> {
    let mut r = format!("{method} {target} HTTP/1.1\r\nhost: {host}\r\n");
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    if method == "POST" {
        r.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    r.push_str("connection: close\r\n\r\n");
    r.push_str(body);
    r.into_bytes()
}

/// Sends `request` on a fresh connection and reads one whole answer (content-length,
/// chunked, or until close).
async fn exchange(addr: SocketAddr, request: Vec<u8>) -> Answer {
    let work = async move {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&request).await.unwrap();
        let mut raw = Vec::new();
        let head_end = loop {
            if let Some(i) = find(&raw, b"\r\n\r\n") {
                break i + 4;
            }
            assert!(read_more(&mut s, &mut raw).await, "closed before the head");
        };
        let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
        let mut lines = head.split("\r\n");
        let status: u16 = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line: {head}"));
        let headers: Vec<(String, String)> = lines
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (k, v) = l.split_once(':').unwrap();
                (k.trim().to_ascii_lowercase(), v.trim().to_owned())
            })
            .collect();
        let get = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let mut body = Vec::new();
        if get("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
            let mut pos = head_end;
            loop {
                let line_end = loop {
                    if let Some(i) = find(&raw[pos..], b"\r\n") {
                        break pos + i;
                    }
                    assert!(read_more(&mut s, &mut raw).await, "closed inside a chunk");
                };
                let size_line = String::from_utf8_lossy(&raw[pos..line_end]).into_owned();
                let size_hex = size_line.split(';').next().unwrap().trim();
                let size = usize::from_str_radix(size_hex, 16).unwrap();
                pos = line_end + 2;
                if size == 0 {
                    // Trailers, if any, end with an empty line.
                    while !(raw[pos..].starts_with(b"\r\n")
                        || find(&raw[pos..], b"\r\n\r\n").is_some())
                    {
                        assert!(read_more(&mut s, &mut raw).await, "closed in trailers");
                    }
                    break;
                }
                while raw.len() < pos + size + 2 {
                    assert!(read_more(&mut s, &mut raw).await, "closed inside a chunk");
                }
                body.extend_from_slice(&raw[pos..pos + size]);
                pos += size + 2;
            }
        } else if let Some(len) = get("content-length") {
            let len: usize = len.parse().unwrap();
            while raw.len() < head_end + len {
                assert!(read_more(&mut s, &mut raw).await, "closed inside the body");
            }
            body = raw[head_end..head_end + len].to_vec();
        } else {
            while read_more(&mut s, &mut raw).await {}
            body = raw[head_end..].to_vec();
        }
        Answer {
            raw,
            status,
            headers,
            body,
        }
    };
    tokio::time::timeout(Duration::from_secs(20), work)
        .await
        .expect("an answer within 20 s")
}

/// The single SSE message of an MCP answer (wire contract §6 framing).
fn sse_message(what: &str, a: &Answer) -> Value {
    assert_eq!(a.status, 200, "{what}: {}", a.text());
    assert_eq!(
        a.header("content-type"),
        Some("text/event-stream"),
        "{what}"
    );
    let text = a.text();
    let data = text
        .strip_prefix("event: message\ndata: ")
        .and_then(|t| t.strip_suffix("\n\n"))
        .unwrap_or_else(|| panic!("{what}: not one SSE message: {text:?}"));
    serde_json::from_str(data).unwrap()
}

// ---------------------------------------------------------------------------------------
// The scanner.

/// Finds any trace of any canary or secret in a byte string.
struct Scanner {
    /// Canary payload (lowercase hex) → the canary.
    payloads: HashMap<String, String>,
    /// Token segments (payload and signature) → which token.
    segments: HashMap<String, String>,
    /// Secrets searched verbatim.
    secrets: Vec<String>,
}

impl Scanner {
    fn new(canaries: &Canaries, tokens: &[String], secrets: Vec<String>) -> Scanner {
        let payloads = canaries
            .payloads
            .iter()
            .map(|(p, i)| (p.clone(), canaries.all[*i].clone()))
            .collect();
        let mut segments = HashMap::new();
        for (i, t) in tokens.iter().enumerate() {
            for seg in t.split('.').skip(1) {
                segments.insert(seg.to_owned(), format!("token of note {i}"));
            }
        }
        Scanner {
            payloads,
            segments,
            secrets,
        }
    }

    fn hits(&self, bytes: &[u8]) -> Vec<String> {
        let lower = bytes.to_ascii_lowercase();
        let context = |i: usize| {
            let from = i.saturating_sub(60);
            let to = (i + 80).min(bytes.len());
            String::from_utf8_lossy(&bytes[from..to]).into_owned()
        };
        let mut hits = Vec::new();
        // 1. The marker in any letter case (a slug or a lowercased header keeps it).
        for (i, w) in lower.windows(MARKER.len()).enumerate() {
            if w == MARKER {
                hits.push(format!("marker at {i}: …{}…", context(i)));
            }
        }
        // 2. Any canary's payload, even without its prefix, in any letter case.
        let mut run = 0;
        for (i, b) in lower.iter().enumerate() {
            run = if b.is_ascii_hexdigit() { run + 1 } else { 0 };
            if run >= PAYLOAD_LEN {
                let window = std::str::from_utf8(&lower[i + 1 - PAYLOAD_LEN..=i]).unwrap();
                if let Some(c) = self.payloads.get(window) {
                    hits.push(format!("payload of {c}: …{}…", context(i)));
                }
            }
        }
        // 3. Token segments, which carry the `sub` and claim canaries base64-encoded.
        for seg in bytes.split(|b| !(b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')) {
            if let Some(which) = std::str::from_utf8(seg)
                .ok()
                .and_then(|s| self.segments.get(s))
            {
                hits.push(which.clone());
            }
        }
        for s in &self.secrets {
            if find(bytes, s.as_bytes()).is_some() {
                hits.push("a secret".to_owned());
            }
        }
        hits
    }

    fn assert_clean(&self, what: &str, bytes: &[u8]) {
        let hits = self.hits(bytes);
        assert!(
            hits.is_empty(),
            "{what}: {} canary hit(s):\n{}",
            hits.len(),
            hits.join("\n")
        );
    }
}

/// The scanner is not blind: each of its channels finds what it is for, every canary is
/// found whole, lowercased and by its payload alone, and every note's upstream answer is
/// full of hits.
fn scanner_sees_what_it_must(scanner: &Scanner, canaries: &Canaries, notes: &[Note]) {
    for c in &canaries.all {
        assert!(!scanner.hits(c.as_bytes()).is_empty(), "{c}");
        assert!(
            !scanner.hits(c.to_ascii_lowercase().as_bytes()).is_empty(),
            "{c}"
        );
        let payload = &c[c.len() - PAYLOAD_LEN..];
        assert!(
            !scanner
                .hits(payload.to_ascii_uppercase().as_bytes())
                .is_empty(),
            "payload of {c}"
        );
    }
    for note in notes {
        assert!(
            scanner.hits(&note.canister_body).len() >= 2,
            "note {}",
            note.n
        );
        assert!(
            !scanner
                .hits(format!("Bearer {}", note.token).as_bytes())
                .is_empty(),
            "token of note {}",
            note.n
        );
    }
    assert!(!scanner
        .hits(format!("k={JWT_SECRET};").as_bytes())
        .is_empty());
    assert!(scanner
        .hits(b"schema knowtation.section_source/v0 Topic 1-2 overview")
        .is_empty());
}

// ---------------------------------------------------------------------------------------
// The proof.

#[derive(Default, Debug)]
struct Tally {
    rest_ok: usize,
    rest_err: BTreeMap<u16, usize>,
    mcp_ok: usize,
    mcp_tool_err: usize,
    mcp_init_refused: usize,
    headings_checked: usize,
    answers: usize,
    answer_bytes: usize,
    expected_outcomes: BTreeMap<(&'static str, &'static str), u64>,
}

impl Tally {
    /// Scans an answer's wire bytes and its de-chunked body.
    fn scan(&mut self, scanner: &Scanner, what: &str, a: &Answer) {
        scanner.assert_clean(what, &a.raw);
        scanner.assert_clean(what, &a.body);
        self.answers += 1;
        self.answer_bytes += a.raw.len();
    }
}

/// The intercepted-requests counters of a metrics scrape, by (surface, outcome).
fn intercepted_counters(metrics: &str) -> BTreeMap<(String, String), u64> {
    let mut out = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("knowtation_sidecar_intercepted_requests_total{") else {
            continue;
        };
        let (labels, value) = rest.split_once("} ").unwrap();
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
                .unwrap()
        };
        let value: u64 = value.trim().parse().unwrap();
        if value > 0 {
            out.insert((label("surface"), label("outcome")), value);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_canary_reaches_an_answer_a_log_line_or_the_metrics() {
    let started = Instant::now();
    let mut rng = XorShift(SEED);
    let mut canaries = Canaries::default();
    let gateway_secret = canaries.make(&mut rng, "gwsecret", 0);
    let notes: Vec<Note> = (0..NOTES)
        .map(|n| Note::generate(n, &mut rng, &mut canaries))
        .collect();
    // Every shape of heading and block was generated, and every case occurs.
    for kind in [
        "h-link",
        "h-img",
        "h-refdef",
        "h-angle",
        "h-setext",
        "h-quoted",
        "h-listed",
        "h-refimg",
        "h-shortcut",
        "h-nestimg",
        "para",
        "lurl",
        "fence",
        "tilde",
        "indent",
        "html",
        "comment",
        "script",
        "li",
        "bq",
        "td",
        "fnbody",
        "hardbreak",
        "entity",
        "pi",
        "refonly",
        "fm-deeper",
        "fm-ml1",
        "c-err",
        "c-errhtml",
        "c-html",
        "c-trunc",
        "c-string",
        "c-tostring",
        "c-quoted",
        "c-surrogate",
        "c-big",
        "b-err",
        "b-malformed",
        "b-html",
        "b-wrongtype",
        "b-role",
        "b-project",
        "c-hdr",
        "b-hdr",
        "rq-ua",
        "mq-ua",
        "mq-meta",
    ] {
        assert!(
            canaries.kinds.contains_key(kind),
            "no canary of kind {kind}"
        );
    }
    for case in ODD_BODIES.iter().chain(&BRIDGE_FAILURES) {
        assert!(notes.iter().any(|n| n.case == *case), "no note of {case:?}");
    }

    let gateway = MockGateway::start().await;
    let canister = MockCanister::start().await;
    let bridge = MockBridge::start().await;
    canister.set_gateway_secret(Some(&gateway_secret));
    for note in &notes {
        canister.set_override(
            &note.path,
            CanisterOverride::new()
                .status(note.canister_status)
                .body(note.canister_body.clone()),
        );
        bridge.set_reply_for_vault(&note.vault, note.bridge_reply.clone());
    }
    let canister_plan = notes
        .iter()
        .map(|n| (n.vault.clone(), n.canister_headers.clone()))
        .collect();
    let bridge_plan = notes
        .iter()
        .map(|n| (n.vault.clone(), n.bridge_headers.clone()))
        .collect();
    let canister_front = Front::start(canister.url(), canister_plan).await;
    let bridge_front = Front::start(bridge.url(), bridge_plan).await;

    // The MCP requests carry a canary `Origin`: each is allowed, so that the requests
    // pass the `Origin` check and the canary travels the whole MCP path.
    let mcp_origins: Vec<&str> = notes
        .iter()
        .flat_map(|n| &n.mcp_headers)
        .filter(|(k, _)| k == "origin")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(mcp_origins.len(), notes.len());
    let sidecar = Sidecar::spawn(&[
        ("UPSTREAM__GATEWAY_URL", gateway.url()),
        ("UPSTREAM__CANISTER_URL", canister_front.url()),
        ("UPSTREAM__BRIDGE_URL", bridge_front.url()),
        ("UPSTREAM__GATEWAY_SECRET", gateway_secret.clone()),
        ("AUTH__JWT_SECRETS", JWT_SECRET.to_owned()),
        ("LOG__ACCESS", "all".to_owned()),
        ("MCP__ALLOWED_ORIGINS", mcp_origins.join(",")),
    ]);
    sidecar.wait_ready().await;

    let tokens: Vec<String> = notes.iter().map(|n| n.token.clone()).collect();
    let scanner = Scanner::new(
        &canaries,
        &tokens,
        vec![JWT_SECRET.to_owned(), gateway_secret.clone()],
    );
    scanner_sees_what_it_must(&scanner, &canaries, &notes);
    let mut tally = Tally::default();
    let host = sidecar.addr;

    for note in &notes {
        let n = note.n;
        let bearer = format!("Bearer {}", note.token);
        let auth = vec![
            ("authorization".to_owned(), bearer.clone()),
            ("x-vault-id".to_owned(), note.vault.clone()),
        ];

        // REST (wire contract §5).
        let mut headers = auth.clone();
        headers.extend(note.rest_headers.iter().cloned());
        let target = format!(
            "/api/v1/section-source?path={}&{}",
            note.path, note.rest_query
        );
        let rest = exchange(host, http_request("GET", &target, host, &headers, "")).await;
        let what = format!("REST note {n} ({:?})", note.case);
        tally.scan(&scanner, &what, &rest);
        assert_eq!(
            rest.header("content-type"),
            Some(REST_CONTENT_TYPE),
            "{what}"
        );
        let (expect, outcome) = rest_expect(note.case);
        *tally
            .expected_outcomes
            .entry(("rest", outcome))
            .or_default() += 1;
        let rest_doc = match expect {
            RestExpect::Doc => {
                assert_eq!(rest.status, 200, "{what}: {}", rest.text());
                tally.headings_checked += note.check_doc(&what, &rest.text());
                tally.rest_ok += 1;
                Some(rest.text())
            }
            RestExpect::Err(status, body) => {
                assert_eq!((rest.status, rest.text()), (status, body), "{what}");
                *tally.rest_err.entry(status).or_default() += 1;
                None
            }
        };

        // MCP (wire contract §6): initialize (passed through), then the tool call.
        let mut headers = auth.clone();
        headers.extend([
            ("accept".to_owned(), ACCEPT_MCP.to_owned()),
            ("content-type".to_owned(), "application/json".to_owned()),
        ]);
        headers.extend(note.mcp_headers.iter().cloned());
        let init = json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": note.mcp_client.0, "version": note.mcp_client.1},
            },
        })
        .to_string();
        let init = exchange(host, http_request("POST", "/mcp", host, &headers, &init)).await;
        let what = format!("MCP initialize note {n} ({:?})", note.case);
        tally.scan(&scanner, &what, &init);
        let (expect, outcome) = mcp_expect(note.case);
        *tally.expected_outcomes.entry(("mcp", outcome)).or_default() += 1;
        if let McpExpect::InitRefused = expect {
            assert_eq!(
                (init.status, init.text()),
                (
                    403,
                    r#"{"jsonrpc":"2.0","error":{"code":-32600,"message":"No hosted access"}}"#
                        .to_owned()
                ),
                "{what}"
            );
            tally.mcp_init_refused += 1;
            continue;
        }
        let message = sse_message(&what, &init);
        assert_eq!(
            message["result"]["serverInfo"]["name"], "mock-gateway",
            "{what}"
        );
        let session = init.header("mcp-session-id").unwrap().to_owned();

        headers.push(("mcp-session-id".to_owned(), session));
        let call = json!({
            "jsonrpc": "2.0", "id": n + 1, "method": "tools/call",
            "params": {
                "name": "get_section_source",
                "arguments": {"path": note.path},
                "_meta": {"progressToken": note.mcp_meta},
            },
        })
        .to_string();
        let call = exchange(host, http_request("POST", "/mcp", host, &headers, &call)).await;
        let what = format!("MCP call note {n} ({:?})", note.case);
        tally.scan(&scanner, &what, &call);
        let message = sse_message(&what, &call);
        assert_eq!(message["id"], n + 1, "{what}");
        let result = &message["result"];
        let text = result["content"][0]["text"].as_str().unwrap();
        let is_error = result.get("isError") == Some(&Value::Bool(true));
        match expect {
            McpExpect::Doc => {
                assert!(!is_error, "{what}: {text}");
                tally.headings_checked += note.check_doc(&what, text);
                if let Some(rest_doc) = &rest_doc {
                    assert_eq!(text, rest_doc, "{what}: the surfaces differ");
                }
                tally.mcp_ok += 1;
            }
            McpExpect::ToolError(expected) => {
                assert!(is_error, "{what}: {text}");
                assert_eq!(text, expected, "{what}");
                tally.mcp_tool_err += 1;
            }
            McpExpect::InitRefused => unreachable!(),
        }
    }

    // The canaries really went out: the canister was read exactly as the cases say,
    // with the sidecar's own identity headers, never the client's spoofed ones.
    let mut reads: HashMap<String, Vec<_>> = HashMap::new();
    for r in canister.requests() {
        reads.entry(r.path().to_owned()).or_default().push(r);
    }
    for note in &notes {
        let key = format!("/api/v1/notes/{}", note.path.replace('/', "%2F"));
        let got = reads.get(&key).map_or(&[][..], Vec::as_slice);
        assert_eq!(
            got.len(),
            note.expected_reads(),
            "canister reads of note {}",
            note.n
        );
        for r in got {
            assert_eq!(r.header("x-vault-id"), Some(note.vault.as_str()));
            assert_eq!(r.header("x-user-id"), note.effective_user.as_deref());
            assert_eq!(r.header("x-gateway-auth"), Some(gateway_secret.as_str()));
        }
    }

    // The metrics scrape, whole and raw.
    let admin = sidecar.admin;
    let metrics = exchange(admin, http_request("GET", "/metrics", admin, &[], "")).await;
    assert_eq!(metrics.status, 200);
    tally.scan(&scanner, "metrics", &metrics);
    let counters = intercepted_counters(&metrics.text());
    let expected: BTreeMap<(String, String), u64> = tally
        .expected_outcomes
        .iter()
        .map(|((s, o), c)| ((s.to_string(), o.to_string()), *c))
        .collect();
    assert_eq!(
        counters, expected,
        "intercepted requests by surface and outcome"
    );

    drop(canister_front);
    drop(bridge_front);
    let logs = sidecar.stop_bytes();
    scanner.assert_clean("logs", &logs);
    let logs = String::from_utf8(logs).expect("logs are UTF-8");
    let mut log_lines = 0;
    let mut by_level: BTreeMap<String, usize> = BTreeMap::new();
    let mut access: BTreeMap<(String, String), usize> = BTreeMap::new();
    for line in logs.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("a log line that is not JSON ({e}): {line}"));
        log_lines += 1;
        *by_level
            .entry(v["level"].as_str().unwrap_or("?").to_owned())
            .or_default() += 1;
        if let Some(route) = v["route"].as_str() {
            let surface = v["surface"].as_str().unwrap_or("-").to_owned();
            *access.entry((route.to_owned(), surface)).or_default() += 1;
        }
    }
    // One access line per request (`log.access = "all"`): the scan saw them all.
    let rest_lines = access.get(&("intercepted".into(), "rest".into())).copied();
    let mcp_lines = access.get(&("intercepted".into(), "mcp".into())).copied();
    let passthrough_lines = access.get(&("passthrough".into(), "-".into())).copied();
    assert_eq!(rest_lines, Some(NOTES), "REST access lines: {access:?}");
    assert_eq!(
        mcp_lines,
        Some(tally.mcp_ok + tally.mcp_tool_err + tally.mcp_init_refused),
        "MCP access lines: {access:?}"
    );
    assert_eq!(
        passthrough_lines,
        Some(tally.mcp_ok + tally.mcp_tool_err),
        "passthrough (initialize) access lines: {access:?}"
    );

    // Not vacuous: most notes were served, on both surfaces, with their headings.
    let expected_rest_ok = notes
        .iter()
        .filter(|n| matches!(rest_expect(n.case).0, RestExpect::Doc))
        .count();
    let expected_mcp_ok = notes
        .iter()
        .filter(|n| matches!(mcp_expect(n.case).0, McpExpect::Doc))
        .count();
    assert_eq!(tally.rest_ok, expected_rest_ok);
    assert_eq!(tally.mcp_ok, expected_mcp_ok);
    assert!(tally.rest_ok >= NOTES * 2 / 3 && tally.mcp_ok >= NOTES * 2 / 3);
    assert!(tally.headings_checked >= 2 * 3 * NOTES * 2 / 3);
    assert_eq!(
        tally.rest_ok + tally.rest_err.values().sum::<usize>(),
        NOTES
    );

    println!(
        "leak proof: {NOTES} notes, {} canaries of {} kinds; {} answers ({} bytes) scanned; \
         {} log lines ({} bytes) scanned {by_level:?}; metrics {} bytes; \
         REST 200: {}, REST errors by status: {:?}; MCP served: {}, tool errors: {}, \
         initialize refused: {}; headings checked: {}; {:.1} s",
        canaries.all.len(),
        canaries.kinds.len(),
        tally.answers,
        tally.answer_bytes,
        log_lines,
        logs.len(),
        metrics.raw.len(),
        tally.rest_ok,
        tally.rest_err,
        tally.mcp_ok,
        tally.mcp_tool_err,
        tally.mcp_init_refused,
        tally.headings_checked,
        started.elapsed().as_secs_f64(),
    );
}

// ---------------------------------------------------------------------------------------
// What the sidecar passes through: the gateway's own formats, sanitized.

/// Every place of `[sanitize]`, through the real binary in front of the test-kit
/// gateway scripted with the real gateway's formats (`hub/gateway/mcp-hosted-server.mjs`:
/// `Upstream <status>: <first 200 characters of the body>` in tool errors, prompt
/// messages and `resources/read` errors; the note store's `path` verbatim in `get_note`,
/// `relate`, `backlinks` and `list_notes`; a canister error body verbatim on the REST note
/// routes), each carrying canaries. No canary reaches an answer, a log line or the
/// metrics; each answer is exactly the gateway's with the canary cut out; the metrics
/// count each rewrite by kind. With the settings off, the same canaries come through:
/// the scripted answers do carry them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passed_through_answers_are_sanitized() {
    const CANARY: &str = "LEAK-sanitize-7c1e";
    let body = format!("<html>{CANARY} TypeError at /srv/canister/app.js:42</html>");
    let upstream = |status: u16| format!("Upstream {status}: {}", &body[..body.len().min(200)]);
    let envelope = |msg: &str| json!({"error": msg, "code": "UPSTREAM_ERROR"}).to_string();
    let tool_error = |msg: &str| json!({"result": {"content": [{"type": "text", "text": envelope(msg)}], "isError": true}});
    let tool_ok =
        |doc: Value| json!({"result": {"content": [{"type": "text", "text": doc.to_string()}]}});
    let abs = format!("/Users/{CANARY}/vault");

    let gateway = MockGateway::start().await;
    let bridge = MockBridge::start().await;
    bridge.set_json(&json!({"allowed_vault_ids": ["default"], "role": "viewer"}));
    gateway.set_mcp_answer("tools/call:get_note", tool_error(&upstream(500)));
    gateway.set_mcp_answer("tools/call:cluster", tool_error(&upstream(502)));
    gateway.set_mcp_answer(
        "tools/call:relate",
        tool_ok(json!({"path": format!("{abs}/a.md"), "related": [{"path": format!("{abs}/b.md"), "score": 1, "title": "B"}, {"path": "c.md", "score": 0.5}]})),
    );
    gateway.set_mcp_answer(
        "tools/call:backlinks",
        tool_ok(json!({"path": "a.md", "backlinks": [{"path": format!("C:\\{CANARY}\\b.md"), "title": "B", "context": "[[a]]"}], "backlinks_truncated": false})),
    );
    gateway.set_mcp_answer(
        "tools/call:list_notes",
        tool_ok(json!({"notes": [{"path": format!("{abs}/a.md"), "title": "A"}], "total": 1})),
    );
    gateway.set_mcp_answer(
        "prompts/get",
        json!({"result": {"description": "Daily brief", "messages": [{"role": "user", "content": {"type": "text", "text": format!("Error loading notes: {}", upstream(500))}}]}}),
    );
    gateway.set_mcp_answer(
        "resources/read",
        json!({"error": {"code": -32603, "message": format!("MCP error -32603: {}", upstream(404))}}),
    );
    gateway.set_note_route_answer(Some((500, &body)));

    let get_note_path = |path: &str| {
        tool_ok(json!({"path": format!("{abs}/{path}"), "frontmatter": {}, "body": "note body"}))
    };
    let run = |settings: Vec<(&'static str, String)>| {
        let gateway = &gateway;
        let bridge = &bridge;
        async move {
            let mut env = vec![
                ("UPSTREAM__GATEWAY_URL", gateway.url()),
                ("UPSTREAM__BRIDGE_URL", bridge.url()),
                ("LOG__ACCESS", "all".to_owned()),
            ];
            env.extend(settings);
            let sidecar = Sidecar::spawn(&env);
            sidecar.wait_ready().await;
            sidecar
        }
    };

    // The answers a client gets, for every place, framed as SSE and as JSON.
    let exchange_all = |sidecar: &Sidecar, json_answers: bool| {
        let host = sidecar.addr;
        let gateway = &gateway;
        async move {
            gateway.set_mcp_json_answers(json_answers);
            let token = format!("Bearer {}", support::token("google:sanitize"));
            let mut headers = vec![
                ("authorization".to_owned(), token.clone()),
                ("x-vault-id".to_owned(), "default".to_owned()),
                ("accept".to_owned(), ACCEPT_MCP.to_owned()),
                ("content-type".to_owned(), "application/json".to_owned()),
            ];
            let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#;
            let init = exchange(host, http_request("POST", "/mcp", host, &headers, init)).await;
            assert_eq!(init.status, 200, "{}", init.text());
            headers.push((
                "mcp-session-id".to_owned(),
                init.header("mcp-session-id").unwrap().to_owned(),
            ));
            let mut answers = Vec::new();
            let call = |name: &str, args: Value| {
                json!({"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":name,"arguments":args}}).to_string()
            };
            for body in [
                call("get_note", json!({"path": "a.md"})),
                call("cluster", json!({})),
                call("relate", json!({"path": "a.md"})),
                call("backlinks", json!({"path": "a.md"})),
                call("list_notes", json!({})),
                r#"{"jsonrpc":"2.0","id":7,"method":"prompts/get","params":{"name":"daily-brief"}}"#.to_owned(),
                r#"{"jsonrpc":"2.0","id":7,"method":"resources/read","params":{"uri":"knowtation://hosted/vault/a.md"}}"#.to_owned(),
            ] {
                answers.push(exchange(host, http_request("POST", "/mcp", host, &headers, &body)).await);
            }
            let rest = exchange(
                host,
                http_request("GET", "/api/v1/notes/a.md", host, &headers[..2], ""),
            )
            .await;
            answers.push(rest);
            answers
        }
    };
    let message = |a: &Answer| -> Value {
        let text = a.text();
        if a.header("content-type") == Some("text/event-stream") {
            let data = text
                .strip_prefix("event: message\ndata: ")
                .and_then(|t| t.strip_suffix("\n\n"))
                .unwrap();
            serde_json::from_str(data).unwrap()
        } else {
            serde_json::from_str(&text).unwrap()
        }
    };
    let text_of = |m: &Value| -> Value {
        let t = m["result"]["content"][0]["text"].as_str().unwrap();
        serde_json::from_str(t).unwrap_or(Value::String(t.to_owned()))
    };

    let sidecar = run(Vec::new()).await;
    for json_answers in [false, true] {
        let answers = exchange_all(&sidecar, json_answers).await;
        for (i, a) in answers.iter().enumerate() {
            assert!(
                find(&a.raw, CANARY.as_bytes()).is_none()
                    && find(&a.body, CANARY.as_bytes()).is_none(),
                "answer {i} (JSON answers: {json_answers}) carries the canary: {}",
                a.text()
            );
            assert!(!a.text().contains("/srv/"), "answer {i}: {}", a.text());
        }
        let m: Vec<Value> = answers[..7].iter().map(message).collect();
        assert_eq!(
            text_of(&m[0]),
            json!({"error": "Upstream 500", "code": "UPSTREAM_ERROR"})
        );
        assert_eq!(m[0]["result"]["isError"], true);
        assert_eq!(
            text_of(&m[1]),
            json!({"error": "Upstream 502", "code": "UPSTREAM_ERROR"})
        );
        assert_eq!(
            text_of(&m[2]),
            json!({"path": "a.md", "related": [{"score": 1, "title": "B"}, {"path": "c.md", "score": 0.5}]})
        );
        assert_eq!(
            text_of(&m[3]),
            json!({"path": "a.md", "backlinks": [{"title": "B", "context": "[[a]]"}], "backlinks_truncated": false})
        );
        assert_eq!(
            text_of(&m[4]),
            json!({"notes": [{"title": "A"}], "total": 1})
        );
        assert_eq!(
            m[5]["result"]["messages"][0]["content"]["text"],
            "Error loading notes: Upstream 500"
        );
        assert_eq!(
            m[6],
            json!({"jsonrpc": "2.0", "id": 7, "error": {"code": -32603, "message": "MCP error -32603: Upstream 404"}})
        );
        let rest = &answers[7];
        assert_eq!(rest.status, 500);
        assert_eq!(
            rest.text(),
            r#"{"error":"Upstream 500","code":"UPSTREAM_ERROR"}"#
        );
        assert_eq!(
            rest.header("content-type"),
            Some("application/json; charset=utf-8")
        );
    }
    // A successful get_note: the absolute path becomes the one asked for.
    gateway.set_mcp_json_answers(false);
    gateway.set_mcp_answer("tools/call:get_note", get_note_path("inbox/a.md"));
    let host = sidecar.addr;
    let token = format!("Bearer {}", support::token("google:sanitize"));
    let mut headers = vec![
        ("authorization".to_owned(), token),
        ("x-vault-id".to_owned(), "default".to_owned()),
        ("accept".to_owned(), ACCEPT_MCP.to_owned()),
        ("content-type".to_owned(), "application/json".to_owned()),
    ];
    let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#;
    let init = exchange(host, http_request("POST", "/mcp", host, &headers, init)).await;
    headers.push((
        "mcp-session-id".to_owned(),
        init.header("mcp-session-id").unwrap().to_owned(),
    ));
    let get = r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"get_note","arguments":{"path":"inbox/a.md"}}}"#;
    let a = exchange(host, http_request("POST", "/mcp", host, &headers, get)).await;
    assert_eq!(
        text_of(&sse_message("get_note", &a)),
        json!({"path": "inbox/a.md", "frontmatter": {}, "body": "note body"})
    );
    // Counted by kind, in both framings: two tool errors, one prompt, one read error,
    // one REST error each; paths: relate's (twice) and get_note's replaced, three
    // dropped each time.
    let metrics = exchange(
        sidecar.admin,
        http_request("GET", "/metrics", sidecar.admin, &[], ""),
    )
    .await;
    let scrape = metrics.text();
    assert!(!scrape.contains(CANARY));
    for (kind, n) in [
        ("tool_error", 4),
        ("prompt_error", 2),
        ("rpc_error", 2),
        ("rest_error", 2),
        ("path_replaced", 3),
        ("path_dropped", 6),
        ("too_large", 0),
    ] {
        let series = format!("knowtation_sidecar_sanitized_total{{kind=\"{kind}\"}} {n}");
        assert!(scrape.lines().any(|l| l == series), "{series} in\n{scrape}");
    }
    let logs = sidecar.stop_bytes();
    assert!(
        find(&logs, CANARY.as_bytes()).is_none(),
        "a log line carries the canary"
    );
    assert!(find(&logs, b"/srv/canister").is_none());

    // Switched off, the canaries come through: the scripted answers do carry them. Each
    // switch turns off its own kind and no other: answers 0, 1, 5 and 6 carry upstream
    // error text, 2 to 4 the note store's paths, 7 the REST note route's error body.
    gateway.set_mcp_answer("tools/call:get_note", tool_error(&upstream(500)));
    const UPSTREAM: &str = "SANITIZE__UPSTREAM_ERRORS";
    const PATHS: &str = "SANITIZE__NOTE_PATHS";
    const REST: &str = "SANITIZE__REST_ERRORS";
    for (off, open_places) in [
        (&[UPSTREAM, PATHS, REST][..], &[0, 1, 2, 3, 4, 5, 6, 7][..]),
        (&[UPSTREAM][..], &[0, 1, 5, 6][..]),
        (&[PATHS][..], &[2, 3, 4][..]),
        (&[REST][..], &[7][..]),
    ] {
        let open = run(off.iter().map(|k| (*k, "false".to_owned())).collect()).await;
        let answers = exchange_all(&open, false).await;
        assert_eq!(answers.len(), 8);
        for (i, a) in answers.iter().enumerate() {
            assert_eq!(
                find(&a.body, CANARY.as_bytes()).is_some(),
                open_places.contains(&i),
                "{off:?} off: answer {i}: {}",
                a.text()
            );
        }
        drop(open.stop_bytes());
    }
}
