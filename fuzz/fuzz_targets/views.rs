//! The three body-free views (SectionSource, NoteOutline, DocumentTree) of one parse. The
//! checks live in `knowtation_testkit::fuzz::views`, which
//! `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| knowtation_testkit::fuzz::views(data));
