//! Fuzzes vault-path validation (wire contract §3, §4): never panics, and every accepted
//! path keeps the invariants.
#![no_main]

use knowtation_sidecar::extract::js::is_js_whitespace;
use knowtation_sidecar::path::{validate, VaultPath, MAX_PATH_BYTES, MAX_SEGMENTS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|raw: &str| {
    if let Ok(p) = validate(raw) {
        check(&p);
    }
});

fn check(p: &VaultPath) {
    let s = p.as_str();
    assert!(!s.is_empty());
    assert!(!s.starts_with('/'));
    assert!(!s.contains('\\'));
    assert!(s.len() <= MAX_PATH_BYTES);
    assert!(!s
        .chars()
        .any(|c| matches!(c, '\u{0000}'..='\u{001F}' | '\u{007F}'..='\u{009F}')));
    let lower = s.to_ascii_lowercase();
    assert!(!lower.contains("%2e") && !lower.contains("%2f") && !lower.contains("%5c"));
    assert!(!matches!(s.as_bytes(), [l, b':', ..] if l.is_ascii_alphabetic()));

    let segments: Vec<&str> = s.split('/').collect();
    assert!(segments.len() <= MAX_SEGMENTS);
    for seg in &segments {
        assert!(!seg.is_empty() && *seg != "." && *seg != "..");
        assert!(!seg.starts_with(is_js_whitespace) && !seg.ends_with(is_js_whitespace));
    }

    // Idempotent.
    assert_eq!(validate(s).as_ref(), Ok(p));

    // file_name and folder split the path at its last separator.
    match segments.split_last() {
        Some((last, rest)) => {
            assert_eq!(p.file_name(), *last);
            assert_eq!(p.folder(), rest.join("/"));
        }
        None => unreachable!("split always yields one item"),
    }

    // encodeURIComponent: only unreserved bytes and uppercase %XX, decoding back.
    let encoded = p.encode_component();
    let b = encoded.as_bytes();
    let mut decoded = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = &b[i + 1..i + 3];
            assert!(hex
                .iter()
                .all(|h| h.is_ascii_digit() || (b'A'..=b'F').contains(h)));
            let byte = hex.iter().fold(0u8, |acc, h| {
                acc * 16 + (*h as char).to_digit(16).unwrap_or(0) as u8
            });
            assert!(!is_unreserved(byte));
            decoded.push(byte);
            i += 3;
        } else {
            assert!(is_unreserved(b[i]));
            decoded.push(b[i]);
            i += 1;
        }
    }
    assert_eq!(decoded, s.as_bytes());
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'-' | b'_' | b'.' | b'!' | b'~' | b'*' | b'\'' | b'(' | b')'
        )
}
