//! Frontmatter decoding: the raw YAML split and both stored-field decoders (section-source
//! spec §2, §3, §5). The checks live in `knowtation_testkit::fuzz::frontmatter`,
//! which `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| knowtation_testkit::fuzz::frontmatter(data));
