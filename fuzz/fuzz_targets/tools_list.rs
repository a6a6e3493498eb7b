//! The rewrite of list answers, `tools/list` above all (wire contract §6 ACL). The checks
//! live in `knowtation_testkit::fuzz::tools_list`, which `tests/fuzz_corpus.rs`
//! replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| knowtation_testkit::fuzz::tools_list(data));
