//! What several integration tests share.

use serde_json::Value;

/// The upstream project's conformance vectors: the copy committed in `tests/data`, so a
/// clone runs on its own. Where the shared specification sits beside the repository,
/// the copy must match it byte for byte, so that the two cannot drift apart unseen.
pub fn reference_vectors() -> Vec<Value> {
    let dir = env!("CARGO_MANIFEST_DIR");
    let text = std::fs::read_to_string(format!("{dir}/tests/data/reference-vectors.json"))
        .expect("tests/data/reference-vectors.json");
    if let Ok(shared) = std::fs::read_to_string(format!(
        "{dir}/../shared/conformance/reference-vectors.json"
    )) {
        assert!(
            shared == text,
            "tests/data/reference-vectors.json differs from ../shared/conformance/reference-vectors.json; copy it again"
        );
    }
    serde_json::from_str(&text).expect("vectors are JSON")
}
