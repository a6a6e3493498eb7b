//! Every builder, outline, document-tree and local-note vector of the shared conformance
//! file, run against the extractor. Hosted MCP and REST vectors belong to the proxy tests.
//!
//! `note_outline` and `document_tree` vectors come from sibling builders of the same
//! upstream module; they share the heading scan, texts, ids and nesting with
//! SectionSource, so they are checked against the corresponding view of our output.
// A failed expectation in a test is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use knowtation_sidecar::extract::{self, decode_stored, Limits, SectionSource, Surface};
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
    // Cross-builder facts of the upstream module (the document-tree schema name).
    "document_tree_schema",
    "heading_ids_equal_note_outline_heading_ids",
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
        "builder_note" | "note_outline" | "document_tree" | "document_tree_from_outline" => {
            Some(Input::Stored)
        }
        "builder_markdown" | "local_note" | "note_outline_markdown" | "document_tree_markdown" => {
            Some(Input::Raw)
        }
        _ => None,
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

/// The Markdown of a vector; outline-only vectors are rendered as ATX headings.
fn markdown_of(v: &Value) -> String {
    if let Some(m) = v["markdown"].as_str() {
        return m.to_owned();
    }
    if let Some(hs) = v["outline_headings"].as_array() {
        return hs
            .iter()
            .map(|h| {
                format!(
                    "{} {}\n",
                    "#".repeat(h["level"].as_u64().unwrap_or(1) as usize),
                    h["text"].as_str().unwrap_or("")
                )
            })
            .collect();
    }
    if v["outline_headings_generator"].is_string() {
        return (1..=501).map(|n| format!("# Heading {n}\n")).collect();
    }
    String::new()
}

fn outline(doc: &Value) -> Value {
    Value::Array(
        doc["sections"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| json!({"level": s["level"], "text": s["heading_text"], "id": s["heading_id"]}))
            .collect(),
    )
}

fn tree(doc: &Value) -> Value {
    let sections = doc["sections"].as_array().cloned().unwrap_or_default();
    fn node(sections: &[Value], s: &Value) -> Value {
        let children: Vec<Value> = s["child_section_ids"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|id| sections.iter().find(|c| c["section_id"] == *id))
            .map(|c| node(sections, c))
            .collect();
        json!({"id": s["heading_id"], "level": s["level"], "text": s["heading_text"], "children": children})
    }
    let child_ids: BTreeSet<String> = sections
        .iter()
        .flat_map(|s| {
            s["child_section_ids"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    let roots = sections
        .iter()
        .filter(|s| !child_ids.contains(s["section_id"].as_str().unwrap_or_default()))
        .map(|s| node(&sections, s))
        .collect();
    json!({"children": Value::Array(roots)})
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
    if kind == "local_error" || kind == "document_tree_error" {
        for case in expect["cases"].as_array()? {
            let Some(p) = case["path"].as_str() else {
                // Invalid outline records have no Markdown counterpart: the scan only
                // ever produces levels 1–6 and ids it computed itself.
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
    let is_outline = kind.starts_with("note_outline");
    let is_tree = kind.starts_with("document_tree");
    let mut view = doc.clone();
    view["headings"] = outline(&doc);
    view["heading_texts"] = resolve(&view, "headings.text");
    view["heading_text_list"] = view["heading_texts"].clone();
    view["root"] = tree(&doc);

    for (key, want) in expect {
        if NOT_APPLICABLE.contains(&key.as_str()) {
            continue;
        }
        match key.as_str() {
            // The sibling builders carry their own schema names.
            "schema" if is_outline || is_tree => {}
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
}
