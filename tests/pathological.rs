//! The pathological inputs of the benchmark, at a tenth of the cap, must build (the
//! time bound itself is checked by `cargo bench --bench extract -- pathological`).
// A failed expectation in a test is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use knowtation_sidecar::extract::{self, Frontmatter, Limits};
use knowtation_sidecar::path;

#[path = "../benches/pathological_inputs.rs"]
mod pathological_inputs;

#[test]
fn every_pathological_input_builds() {
    let p = path::validate("p.md").expect("path");
    for (name, input) in pathological_inputs::cases(100_000) {
        assert!(
            input.chars().map(char::len_utf16).sum::<usize>() <= 100_000,
            "{name}"
        );
        let doc = extract::build(&p, &Frontmatter::default(), &input, &Limits::default());
        let doc = doc.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(doc.sections().len() <= 500, "{name}");
    }
}
