//! Every builder, outline, document-tree, constants and local-note vector of the shared
//! conformance file, run against the extractor. Hosted MCP and REST vectors belong to the
//! proxy tests.
//!
//! `note_outline*` vectors run against the NoteOutline builder and `document_tree*`
//! vectors against the DocumentTree builder (from Markdown, or from the outline headings
//! the vector gives). Every full document or subtree a vector shows is compared byte for
//! byte with the output, written in the views' key order.
// A failed expectation in a test is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use knowtation_sidecar::extract::{
    self, decode_stored, DocumentTree, HeadingRecord, Headings, Limits, SectionSource, Surface,
    MAX_DOCUMENT_TREE_NODES,
};
use knowtation_sidecar::path;
use serde_json::{json, Value};

mod common;

fn vectors() -> Vec<Value> {
    common::reference_vectors()
}

/// Keys that describe the JavaScript harness rather than the document.
const NOT_APPLICABLE: &[&str] = &[
    // Timing is proven by benchmarks, never by timed tests.
    "elapsed_ms_lt",
    // The self-hosted MCP server's error code; the sidecar serves the hosted surface.
    "self_hosted_mcp_error_code",
];

fn limits(v: &Value) -> Limits {
    let mut l = Limits::default();
    if let Some(n) = v["options"]["maxHeadings"].as_u64() {
        l.max_headings = n as usize;
    }
    if let Some(n) = v["options"]["maxInputChars"].as_u64() {
        l.max_input_units = n as usize;
    }
    l
}

enum Input {
    Stored,
    Raw,
}

fn input_of(kind: &str) -> Option<Input> {
    match kind {
        "builder_note" => Some(Input::Stored),
        "builder_markdown" | "local_note" => Some(Input::Raw),
        _ => None,
    }
}

/// The one parse a SectionSource vector's document comes from, for the facts it states
/// about the other views of the same note.
fn parse_section_vector<'p>(
    v: &Value,
    p: &'p path::VaultPath,
    input: &Input,
) -> Result<Headings<'p>, String> {
    let markdown = markdown_of(v);
    let l = limits(v);
    match input {
        Input::Stored => {
            let fm =
                decode_stored(v.get("frontmatter"), Surface::Rest).map_err(|e| e.to_string())?;
            extract::parse(p, &fm, &markdown, &l).map_err(|e| e.to_string())
        }
        Input::Raw => extract::parse_from_raw(p, &markdown, &l).map_err(|e| e.to_string()),
    }
}

/// Builds the document for a vector; `Err` carries a description of the rejection.
fn run(v: &Value, input: &Input) -> Result<SectionSource, String> {
    let p = path::validate(v["path"].as_str().unwrap_or_default()).map_err(|e| e.to_string())?;
    let markdown = markdown_of(v);
    let l = limits(v);
    match input {
        Input::Stored => {
            let fm =
                decode_stored(v.get("frontmatter"), Surface::Rest).map_err(|e| e.to_string())?;
            extract::build(&p, &fm, &markdown, &l).map_err(|e| e.to_string())
        }
        Input::Raw => extract::build_from_raw(&p, &markdown, &l).map_err(|e| e.to_string()),
    }
}

fn markdown_of(v: &Value) -> String {
    v["markdown"].as_str().unwrap_or_default().to_owned()
}

/// The one parse a view vector's document comes from.
fn parse_view<'p>(v: &Value, p: &'p path::VaultPath) -> Result<Headings<'p>, String> {
    let markdown = markdown_of(v);
    let l = limits(v);
    let kind = v["kind"].as_str().unwrap_or_default();
    if kind.ends_with("_markdown") {
        return extract::parse_from_raw(p, &markdown, &l).map_err(|e| e.to_string());
    }
    let fm = decode_stored(v.get("frontmatter"), Surface::Mcp).map_err(|e| e.to_string())?;
    extract::parse(p, &fm, &markdown, &l).map_err(|e| e.to_string())
}

/// Outline heading records as a vector gives them (or its generator describes them).
fn records(v: &Value) -> Vec<HeadingRecord> {
    if v["outline_headings_generator"].is_string() {
        return (1..=MAX_DOCUMENT_TREE_NODES + 1)
            .map(|n| HeadingRecord {
                level: 1,
                text: format!("Heading {n}"),
                id: Some(format!("h1-heading-{n:04}")),
            })
            .collect();
    }
    v["outline_headings"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|h| HeadingRecord {
            level: h["level"].as_i64().unwrap_or(0),
            text: h["text"].as_str().unwrap_or_default().to_owned(),
            id: h["id"].as_str().map(str::to_owned),
        })
        .collect()
}

/// Compact JSON of `v` with the views' key order: a document `schema, path, title,
/// headings|root, truncated`; the root `children`; a tree node `id, level, text,
/// children`; an outline heading `level, text, id`. Keys outside these lists keep
/// serde_json's order after them.
fn ordered(v: &Value) -> String {
    const DOC: &[&str] = &["schema", "path", "title", "headings", "root", "truncated"];
    const NODE: &[&str] = &["id", "level", "text", "children"];
    const HEADING: &[&str] = &["level", "text", "id"];
    match v {
        Value::Array(items) => {
            let parts: Vec<String> = items.iter().map(ordered).collect();
            format!("[{}]", parts.join(","))
        }
        Value::Object(map) => {
            let order = if map.contains_key("schema") {
                DOC
            } else if map.contains_key("children") {
                NODE
            } else {
                HEADING
            };
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_by_key(|k| order.iter().position(|o| o == k).unwrap_or(order.len()));
            let parts: Vec<String> = keys
                .iter()
                .map(|k| {
                    format!(
                        "{}:{}",
                        serde_json::to_string(k).unwrap(),
                        ordered(&map[*k])
                    )
                })
                .collect();
            format!("{{{}}}", parts.join(","))
        }
        other => serde_json::to_string(other).unwrap(),
    }
}

/// A view vector (`note_outline*`, `document_tree*`): every expectation against the
/// NoteOutline or DocumentTree builder.
fn check_view(v: &Value, name: &str, kind: &str) -> Option<String> {
    let expect = v["expect"].as_object()?;
    let p = path::validate(v["path"].as_str().unwrap_or_default());
    let built: Result<(String, bool), String> = match (kind, &p) {
        (_, Err(e)) => Err(e.to_string()),
        ("document_tree_from_outline", Ok(p)) => {
            DocumentTree::from_records(p, None, &records(v), false)
                .map(|t| (t.to_json(), true))
                .map_err(|e| e.to_string())
        }
        (k, Ok(p)) => parse_view(v, p).map(|h| {
            if k.starts_with("document_tree") {
                (h.document_tree().to_json(), true)
            } else {
                (h.note_outline().to_json(), false)
            }
        }),
    };
    if let Some(pattern) = expect.get("throws_matching").and_then(Value::as_str) {
        let e = built.expect_err(name);
        assert!(
            e.contains(pattern),
            "{name}: {e:?} does not say {pattern:?}"
        );
        return Some(name.to_owned());
    }
    let (text, is_tree) = built.unwrap_or_else(|e| panic!("{name}: {e}"));
    let doc: Value = serde_json::from_str(&text).expect("output is JSON");
    let schema = if is_tree {
        extract::DOCUMENT_TREE_SCHEMA
    } else {
        extract::NOTE_OUTLINE_SCHEMA
    };
    assert!(
        text.starts_with(&format!("{{\"schema\":\"{schema}\",\"path\":")),
        "{name}: {text}"
    );
    let mut view = doc.clone();
    view["heading_texts"] = resolve(&doc, "headings.text");
    let full = ["schema", "path", "title", "truncated"]
        .iter()
        .all(|k| expect.contains_key(*k))
        && (expect.contains_key("headings") || expect.contains_key("root"));
    if full {
        // The whole document, byte for byte.
        assert_eq!(
            text,
            ordered(&Value::Object(expect.clone())),
            "{name}: bytes"
        );
    }
    for (key, want) in expect {
        if NOT_APPLICABLE.contains(&key.as_str()) {
            continue;
        }
        match key.as_str() {
            "serialized_excludes" => {
                for s in want.as_array().into_iter().flatten() {
                    let s = s.as_str().unwrap_or_default();
                    assert!(!text.contains(s), "{name}: output contains {s:?}");
                }
            }
            "top_level_keys_absent" => {
                for k in want.as_array().into_iter().flatten() {
                    assert!(
                        doc.get(k.as_str().unwrap_or_default()).is_none(),
                        "{name}: key {k}"
                    );
                }
            }
            "deterministic_across_calls" => {
                let again = check_view_text(v);
                assert_eq!(
                    again.as_deref(),
                    Some(text.as_str()),
                    "{name}: deterministic"
                );
            }
            _ => {
                let got = resolve(&view, key);
                assert_eq!(&got, want, "{name}: {key}");
                // A whole subtree (not a projection or a count) appears byte for byte.
                if !key.contains("_projection") && !key.ends_with("_length") && !got.is_null() {
                    let records = want.is_object()
                        || want
                            .as_array()
                            .is_some_and(|a| !a.is_empty() && a.iter().all(Value::is_object));
                    if records {
                        let exact = ordered(want);
                        assert!(text.contains(&exact), "{name}: {key} bytes {exact}");
                    }
                }
            }
        }
    }
    Some(name.to_owned())
}

/// The output of a Markdown view vector, built again.
fn check_view_text(v: &Value) -> Option<String> {
    let p = path::validate(v["path"].as_str()?).ok()?;
    let h = parse_view(v, &p).ok()?;
    Some(if v["kind"].as_str()?.starts_with("document_tree") {
        h.document_tree().to_json()
    } else {
        h.note_outline().to_json()
    })
}

/// Applies a projection like `id,level,children[text,children.text]` to a list.
fn project(list: &Value, spec: &str) -> Value {
    let fields = split_top(spec);
    Value::Array(
        list.as_array()
            .into_iter()
            .flatten()
            .map(|item| {
                let mut obj = serde_json::Map::new();
                for f in &fields {
                    if let Some(open) = f.find('[') {
                        let name = &f[..open];
                        obj.insert(
                            name.to_owned(),
                            project(&item[name], &f[open + 1..f.len() - 1]),
                        );
                    } else if let Some((name, sub)) = f.split_once('.') {
                        let mapped = item[name]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(|c| c[sub].clone())
                            .collect();
                        obj.insert(name.to_owned(), Value::Array(mapped));
                    } else {
                        obj.insert(f.clone(), item[f.as_str()].clone());
                    }
                }
                Value::Object(obj)
            })
            .collect(),
    )
}

fn split_top(spec: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth) = (Vec::new(), String::new(), 0);
    for c in spec.chars() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out
}

/// Resolves `a.b[3].c`-style paths and `name_projection[...]` / `name_length` forms.
fn resolve(root: &Value, key: &str) -> Value {
    if let Some((name, spec)) = key.split_once("_projection[") {
        return project(&resolve(root, name), &spec[..spec.len() - 1]);
    }
    if let Some(name) = key.strip_suffix("_length") {
        return json!(resolve(root, name).as_array().map(Vec::len));
    }
    let mut cur = root.clone();
    for part in key.split('.') {
        let (name, index) = match part.split_once('[') {
            Some((n, i)) => (n, i.trim_end_matches(']').parse::<usize>().ok()),
            None => (part, None),
        };
        cur = match (&cur, name) {
            // `root.children.text`: map a list to one field.
            (Value::Array(items), field) => {
                Value::Array(items.iter().map(|i| i[field].clone()).collect())
            }
            _ => cur[name].clone(),
        };
        if let Some(i) = index {
            cur = cur[i].clone();
        }
    }
    cur
}

fn key_order_ok(text: &str, keys: &[Value], prefix: &str) -> bool {
    let mut last = 0;
    for k in keys {
        let needle = format!("\"{}\":", k.as_str().unwrap_or_default());
        match text[last..].find(&needle) {
            Some(pos) => last += pos + needle.len(),
            None => return false,
        }
    }
    text.starts_with(prefix)
}

fn check(v: &Value) -> Option<String> {
    let kind = v["kind"].as_str().unwrap_or_default();
    let name = v["name"].as_str().unwrap_or_default();
    let expect = v["expect"].as_object()?;
    if kind == "constants" {
        let l = Limits::default();
        assert_eq!(
            expect["MAX_NOTE_OUTLINE_INPUT_CHARS"],
            json!(l.max_input_units),
            "{name}"
        );
        assert_eq!(
            expect["MAX_NOTE_OUTLINE_HEADINGS"],
            json!(l.max_headings),
            "{name}"
        );
        return Some(name.to_owned());
    }
    if kind == "document_tree_error" {
        for case in expect["cases"].as_array()? {
            let pattern = case["throws_matching"].as_str().unwrap_or_default();
            let error = match case["path"].as_str() {
                Some(p) => path::validate(p).map(|_| ()).map_err(|e| e.to_string()),
                None => {
                    let p = path::validate("notes/example.md").unwrap();
                    DocumentTree::from_records(&p, None, &records(case), false)
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                }
            };
            let e = error.expect_err(name);
            assert!(
                e.contains(pattern),
                "{name}: {e:?} does not say {pattern:?}"
            );
        }
        return Some(name.to_owned());
    }
    if kind.starts_with("note_outline") || kind.starts_with("document_tree") {
        return check_view(v, name, kind);
    }
    if kind == "local_error" {
        for case in expect["cases"].as_array()? {
            let Some(p) = case["path"].as_str() else {
                continue;
            };
            if p == "inbox/missing.md" {
                let r = knowtation_sidecar::cli::extract_file(
                    p,
                    std::path::Path::new("/nonexistent/inbox/missing.md"),
                );
                assert_eq!(r.map_err(|e| e.class()), Err("unreadable"), "{name}: {p}");
            } else {
                assert!(path::validate(p).is_err(), "{name}: {p} must be rejected");
            }
        }
        return Some(name.to_owned());
    }
    let input = input_of(kind)?;
    let result = run(v, &input);
    if let Some(pattern) = expect.get("throws_matching") {
        assert!(result.is_err(), "{name}: expected a rejection ({pattern})");
        return Some(name.to_owned());
    }
    let doc_struct = result.unwrap_or_else(|e| panic!("{name}: {e}"));
    let text = doc_struct.to_json();
    let doc: Value = serde_json::from_str(&text).expect("output is JSON");
    let mut view = doc.clone();
    view["heading_text_list"] = Value::Array(
        doc["sections"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| s["heading_text"].clone())
            .collect(),
    );

    for (key, want) in expect {
        if NOT_APPLICABLE.contains(&key.as_str()) {
            continue;
        }
        match key.as_str() {
            "serialized_excludes" => {
                for s in want.as_array().into_iter().flatten() {
                    let s = s.as_str().unwrap_or_default();
                    assert!(!text.contains(s), "{name}: output contains {s:?}");
                }
            }
            "top_level_keys_absent" => {
                for k in want.as_array().into_iter().flatten() {
                    assert!(
                        doc.get(k.as_str().unwrap_or_default()).is_none(),
                        "{name}: key {k}"
                    );
                }
            }
            "top_level_key_order" => {
                let keys = want.as_array()?;
                assert!(
                    key_order_ok(&text, keys, "{\"schema\":"),
                    "{name}: top-level order"
                );
                let actual: Vec<&String> = doc.as_object()?.keys().collect();
                assert_eq!(actual.len(), keys.len(), "{name}: exactly these keys");
            }
            "section_key_order" => {
                let keys = want.as_array()?;
                let first = text.find("{\"section_id\":")?;
                assert!(
                    key_order_ok(&text[first..], keys, "{\"section_id\":"),
                    "{name}: section order"
                );
                for s in doc["sections"].as_array()? {
                    assert_eq!(
                        s.as_object()?.len(),
                        keys.len(),
                        "{name}: exactly these section keys"
                    );
                }
            }
            "deterministic_across_calls" => {
                let again = run(v, &input).map(|d| d.to_json());
                assert_eq!(again.as_deref(), Ok(text.as_str()), "{name}: deterministic");
            }
            "truncated" | "path" | "title" | "sections" | "schema" => {
                assert_eq!(&doc[key.as_str()], want, "{name}: {key}");
            }
            // Facts about the other views of the same note, from the same parse.
            "heading_ids_equal_note_outline_heading_ids" => {
                let p = path::validate(v["path"].as_str()?).unwrap();
                let outline = parse_section_vector(v, &p, &input).unwrap().note_outline();
                let ids: Vec<&str> = outline.headings().iter().map(|h| h.id()).collect();
                let section_ids: Vec<&str> = doc_struct
                    .sections()
                    .iter()
                    .map(|s| s.heading_id())
                    .collect();
                assert!(!ids.is_empty(), "{name}: no headings to compare");
                assert_eq!(
                    Value::Bool(ids == section_ids),
                    *want,
                    "{name}: {key} ({ids:?} against {section_ids:?})"
                );
            }
            "document_tree_schema" => {
                let p = path::validate(v["path"].as_str()?).unwrap();
                let tree = parse_section_vector(v, &p, &input).unwrap().document_tree();
                let tree: Value = serde_json::from_str(&tree.to_json()).unwrap();
                assert_eq!(&tree["schema"], want, "{name}: {key}");
            }
            _ => {
                let got = resolve(&view, key);
                assert_eq!(&got, want, "{name}: {key}");
            }
        }
    }
    Some(name.to_owned())
}

#[test]
fn extractor_vectors() {
    let all = vectors();
    let mut ran = Vec::new();
    let mut skipped = Vec::new();
    let mut failed = Vec::new();
    for v in &all {
        // Run each vector on its own so one report lists every failing vector.
        match std::panic::catch_unwind(|| check(v)) {
            Ok(Some(name)) => ran.push(name),
            Ok(None) => skipped.push(v["kind"].as_str().unwrap_or_default().to_owned()),
            Err(_) => failed.push(v["name"].as_str().unwrap_or_default().to_owned()),
        }
    }
    assert!(failed.is_empty(), "failing vectors: {failed:?}");
    // Only the hosted and REST vectors are left for the proxy's tests.
    for kind in &skipped {
        assert!(
            kind.starts_with("hosted_mcp") || kind.starts_with("rest"),
            "unhandled vector kind {kind}"
        );
    }
    assert!(ran.len() >= 34, "ran only {} vectors: {ran:?}", ran.len());
    // Every vector of the two other views, and the constants, ran.
    let views: Vec<&str> = all
        .iter()
        .filter(|v| {
            let k = v["kind"].as_str().unwrap_or_default();
            k.starts_with("note_outline") || k.starts_with("document_tree") || k == "constants"
        })
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(views.len(), 25, "view vectors: {views:?}");
    for name in views {
        assert!(ran.iter().any(|r| r == name), "{name} did not run");
    }
}
