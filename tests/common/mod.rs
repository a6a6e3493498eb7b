//! What several integration tests share.

use serde_json::Value;

/// The upstream project's conformance vectors: the copy committed in `tests/data`, so a
/// clone runs on its own. Where the specification's own copy sits beside the repository
/// (`../*/conformance/reference-vectors.json`), the copy must match it byte for byte, so
/// that the two cannot drift apart unseen.
pub fn reference_vectors() -> Vec<Value> {
    let dir = env!("CARGO_MANIFEST_DIR");
    let text = std::fs::read_to_string(format!("{dir}/tests/data/reference-vectors.json"))
        .expect("tests/data/reference-vectors.json");
    let beside = std::path::Path::new(dir).join("..");
    for entry in std::fs::read_dir(&beside).into_iter().flatten().flatten() {
        let spec = entry.path().join("conformance/reference-vectors.json");
        if let Ok(theirs) = std::fs::read_to_string(&spec) {
            assert!(
                theirs == text,
                "tests/data/reference-vectors.json differs from {}; copy it again",
                spec.display()
            );
        }
    }
    serde_json::from_str(&text).expect("vectors are JSON")
}
