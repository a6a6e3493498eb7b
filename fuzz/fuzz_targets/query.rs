//! The REST route's query string, read as `req.query.path` (wire contract §3, §5). The
//! checks live in `knowtation_testkit::fuzz::query`, which `tests/fuzz_corpus.rs`
//! replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| knowtation_testkit::fuzz::query(data));
