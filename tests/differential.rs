//! The differential corpus (`tests/data/differential.json`): inputs whose expected
//! output was produced by the reference JavaScript stack (see `tests/data/README.md`).
//! Every case must match byte for byte, except the ones listed with a reason in
//! `tests/data/known-divergences.txt`; a listed case that starts matching fails too, so
//! the list stays exact.

// A failed expectation in a test is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use knowtation_sidecar::extract::{self, ExtractError, Limits, NoteError, Surface};
use knowtation_sidecar::path;
use serde_json::Value;

/// Why a case produced no document.
#[derive(Debug)]
enum Failure {
    /// The path was refused: the reference stack never refuses a corpus path.
    Path,
    /// The stored note could not be read.
    Note(NoteError),
    /// The document could not be built.
    Extract(ExtractError),
}

impl Failure {
    /// Whether JavaScript throws here too: `String()` of a title or body that has its own
    /// `toString`, or the MCP decoder's unguarded parse of a malformed quoted string. A
    /// refused path, a cap or an unreadable answer is not what an expected error means.
    fn is_a_javascript_throw(&self) -> bool {
        matches!(
            self,
            Failure::Note(NoteError::Frontmatter | NoteError::Body)
                | Failure::Extract(ExtractError::TitleThrows)
        )
    }
}

fn run(case: &Value) -> Result<String, Failure> {
    let p = path::validate(case["path"].as_str().unwrap()).map_err(|_| Failure::Path)?;
    if let Some(raw) = case["raw"].as_str() {
        return extract::build_from_raw(&p, raw, &Limits::default())
            .map(|d| d.to_json())
            .map_err(Failure::Extract);
    }
    let surface = match case["surface"].as_str() {
        Some("rest") => Surface::Rest,
        _ => Surface::Mcp,
    };
    let bytes = serde_json::to_vec(&case["stored"]).unwrap();
    let note = extract::parse_note(&bytes, surface).map_err(Failure::Note)?;
    extract::build(&p, &note.frontmatter, &note.body, &Limits::default())
        .map(|d| d.to_json())
        .map_err(Failure::Extract)
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
            (Value::Object(o), Err(e)) => {
                o.get("error") == Some(&Value::Bool(true)) && e.is_a_javascript_throw()
            }
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
    let errors = cases.iter().filter(|c| c["expect"].is_object()).count();
    assert!(errors >= 17, "{errors} expected errors");
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
