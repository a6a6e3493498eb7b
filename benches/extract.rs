//! Extractor benchmarks (filled in with the corpus).
fn main() {}
