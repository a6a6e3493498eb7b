//! The SectionSource v0 extractor (section-source spec §11). The checks live in
//! `knowtation_testkit::fuzz::extract`, which `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| knowtation_testkit::fuzz::extract(data));
