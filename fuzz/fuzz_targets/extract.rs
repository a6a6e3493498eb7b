//! Fuzzes the SectionSource v0 extractor on arbitrary note text: never panics, and the
//! serialized document carries only the allowlisted fields, with `body_returned` and
//! `snippet_returned` always false (section-source spec §11).
#![no_main]

use knowtation_sidecar::extract::{build, build_from_raw, SectionSource, SCHEMA};
use knowtation_sidecar::path::validate;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

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

fuzz_target!(|data: &[u8]| {
    // Lossy, so every input reaches the extractor.
    let text = String::from_utf8_lossy(data);
    let Ok(path) = validate("notes/fuzz.md") else {
        panic!("fixed path rejected");
    };
    if let Ok(doc) = build_from_raw(&path, &text, &Default::default()) {
        check(&doc);
    }
    if let Ok(doc) = build(&path, &Default::default(), &text, &Default::default()) {
        check(&doc);
    }
});

fn check(doc: &SectionSource) {
    let json = match serde_json::to_string(doc) {
        Ok(json) => json,
        Err(e) => panic!("serialization failed: {e}"),
    };
    let prefix = format!("{{\"schema\":\"{SCHEMA}\",\"path\":\"notes/fuzz.md\",");
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

/// Exactly the allowlisted keys, compared as sorted lists: the map's iteration order
/// depends on serde_json features, and the wire order is fixed by the struct
/// definitions (and checked for the first keys by the serialized prefix).
fn assert_keys(map: &serde_json::Map<String, Value>, allowed: &[&str]) {
    let mut want = allowed.to_vec();
    want.sort_unstable();
    let mut got: Vec<&str> = map.keys().map(String::as_str).collect();
    got.sort_unstable();
    assert_eq!(got, want);
}
