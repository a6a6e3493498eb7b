//! The differential corpus (`tests/data/differential.json`): inputs whose expected
//! output was produced by the reference JavaScript stack (see `tests/data/README.md`).
//! Every case must match byte for byte, except the ones listed with a reason in
//! `tests/data/known-divergences.txt`; a listed case that starts matching fails too, so
//! the list stays exact.

// A failed expectation in a test is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use knowtation_sidecar::extract::{self, Limits, Surface};
use knowtation_sidecar::path;
use serde_json::Value;

fn run(case: &Value) -> Result<String, String> {
    let p = path::validate(case["path"].as_str().unwrap()).map_err(|e| e.to_string())?;
    if let Some(raw) = case["raw"].as_str() {
        return extract::build_from_raw(&p, raw, &Limits::default())
            .map(|d| d.to_json())
            .map_err(|e| e.to_string());
    }
    let surface = match case["surface"].as_str() {
        Some("rest") => Surface::Rest,
        _ => Surface::Mcp,
    };
    let bytes = serde_json::to_vec(&case["stored"]).unwrap();
    let note = extract::parse_note(&bytes, surface).map_err(|e| e.to_string())?;
    extract::build(&p, &note.frontmatter, &note.body, &Limits::default())
        .map(|d| d.to_json())
        .map_err(|e| e.to_string())
}

fn known_divergences() -> BTreeSet<String> {
    include_str!("data/known-divergences.txt")
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

#[test]
fn differential_corpus_matches_the_reference_stack() {
    let cases: Vec<Value> = serde_json::from_str(include_str!("data/differential.json")).unwrap();
    let known = known_divergences();
    let mut mismatches = Vec::new();
    let mut now_matching = Vec::new();
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        let got = run(case);
        let ok = match (&case["expect"], &got) {
            (Value::String(want), Ok(out)) => want == out,
            (Value::Object(o), Err(_)) => o.get("error") == Some(&Value::Bool(true)),
            _ => false,
        };
        match (ok, known.contains(name)) {
            (false, false) => {
                mismatches.push(format!("{name}: got {got:?}\n  want {}", case["expect"]))
            }
            (true, true) => now_matching.push(name.to_owned()),
            _ => {}
        }
    }
    assert!(cases.len() > 1000, "corpus has {} cases", cases.len());
    assert!(
        mismatches.is_empty(),
        "{} of {} cases differ from the reference stack:\n{}",
        mismatches.len(),
        cases.len(),
        mismatches.join("\n")
    );
    assert!(
        now_matching.is_empty(),
        "now matching, remove from known-divergences.txt: {now_matching:?}"
    );
}
