//! Property tests for vault-path validation (wire contract §3, §4) through the public
//! API only.

use knowtation_views::extract::js;
use knowtation_views::path::{validate, VaultPath, MAX_PATH_BYTES, MAX_SEGMENTS};
use proptest::prelude::*;

/// Characters that exercise every rule: separators, dots, escapes, drive letters,
/// JavaScript whitespace (and U+0085/U+200B, which are not), control characters,
/// multibyte and non-BMP text.
const PATHISH: &[char] = &[
    'a', 'b', 'C', 'z', '0', '2', '5', 'e', 'E', 'f', 'F', 'c', '/', '/', '\\', '.', '.', ':', '%',
    ' ', '-', '_', '~', '\t', '\n', '\u{0000}', '\u{007F}', '\u{0085}', '\u{009F}', '\u{00A0}',
    '\u{00A1}', '\u{2028}', '\u{200B}', '\u{3000}', '\u{FEFF}', 'é', '\u{0301}', '日', '😀',
];

fn pathish() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(PATHISH), 0..200)
        .prop_map(|cs| cs.into_iter().collect())
}

/// Mostly harmless characters, so that [`segmented`] paths are often accepted.
const SAFE: &[char] = &[
    'a', 'b', 'x', 'Y', '0', '9', '.', '-', '_', '~', '(', '%', '2', 'e', 'é', '日', '😀',
];

/// Path-like strings made of short segments, biased towards acceptance (rare spaces and
/// rule-breaking characters) and, in one case out of four, towards the segment limit.
fn segmented() -> impl Strategy<Value = String> {
    let c = prop_oneof![
        97 => prop::sample::select(SAFE),
        2 => Just(' '),
        1 => prop::sample::select(PATHISH),
    ];
    let segment = prop::collection::vec(c, 1..12).prop_map(|cs| cs.into_iter().collect::<String>());
    let sep = prop::sample::select(vec!["/", "/", "/", "//", "\\"]);
    let count = prop_oneof![3 => 1usize..10, 1 => 55usize..75];
    count
        .prop_flat_map(move |n| prop::collection::vec((segment.clone(), sep.clone()), n))
        .prop_map(|parts| {
            parts
                .into_iter()
                .flat_map(|(seg, sep)| [seg, sep.to_owned()])
                .collect()
        })
}

/// A segment every rule accepts (checked by [`clean_segment`]).
fn clean_segment() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 ._~!*'()%:,;=@#é日😀\u{00A0}\u{200B}\u{0301}-]{1,12}".prop_filter(
        "segment must be clean",
        |s| {
            s != "."
                && s != ".."
                && !s.starts_with(js::is_js_whitespace)
                && !s.ends_with(js::is_js_whitespace)
                && !has_escape(s)
        },
    )
}

fn has_escape(s: &str) -> bool {
    let lower = s.to_ascii_lowercase();
    lower.contains("%2e") || lower.contains("%2f") || lower.contains("%5c")
}

fn is_control(c: char) -> bool {
    matches!(c, '\u{0000}'..='\u{001F}' | '\u{007F}'..='\u{009F}')
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'-' | b'_' | b'.' | b'!' | b'~' | b'*' | b'\'' | b'(' | b')'
        )
}

/// The gateway's first pass (wire contract §3), as a reference: `None` if rejected.
fn gateway(raw: &str) -> Option<String> {
    let value = js::trim(raw).replace('\\', "/");
    let b = value.as_bytes();
    let drive = matches!(b, [l, b':', b'/', ..] if l.is_ascii_alphabetic());
    if value.is_empty() || value.starts_with('/') || drive {
        return None;
    }
    builder_pass(&value)
}

/// The builder's second pass (section-source spec §4): trim, split, drop empty
/// segments, reject `..`, join.
fn builder_pass(value: &str) -> Option<String> {
    let segments: Vec<&str> = js::trim(value)
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    if segments.contains(&"..") {
        return None;
    }
    Some(segments.join("/"))
}

fn decode_percent(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

/// Every invariant an accepted path must satisfy.
fn check_invariants(raw: &str, p: &VaultPath) -> Result<(), TestCaseError> {
    let s = p.as_str();
    prop_assert!(!s.is_empty());
    prop_assert!(!s.starts_with('/'), "leading slash in {s:?}");
    prop_assert!(!s.contains('\\'), "backslash in {s:?}");
    prop_assert!(!s.chars().any(is_control), "control char in {s:?}");
    prop_assert!(!has_escape(s), "escape in {s:?}");
    prop_assert!(s.len() <= MAX_PATH_BYTES, "{} bytes", s.len());
    let segments: Vec<&str> = s.split('/').collect();
    prop_assert!(
        segments.len() <= MAX_SEGMENTS,
        "{} segments",
        segments.len()
    );
    for seg in &segments {
        prop_assert!(!seg.is_empty(), "empty segment in {s:?}");
        prop_assert!(*seg != "." && *seg != "..", "dot segment in {s:?}");
        prop_assert!(
            !seg.starts_with(js::is_js_whitespace) && !seg.ends_with(js::is_js_whitespace),
            "whitespace at a segment end in {s:?}"
        );
    }
    let first = segments[0].as_bytes();
    prop_assert!(
        !matches!(first, [l, b':', ..] if l.is_ascii_alphabetic()),
        "drive prefix in {s:?}"
    );

    // Idempotent, and never looser than the gateway: same result, and the builder's
    // second pass is a no-op (wire contract §3 Deviation).
    let again = validate(s);
    prop_assert_eq!(again.as_ref(), Ok(p));
    let first_pass = gateway(raw);
    prop_assert_eq!(first_pass.as_deref(), Some(s));
    let second_pass = builder_pass(s);
    prop_assert_eq!(second_pass.as_deref(), Some(s));

    prop_assert_eq!(p.to_string(), s);
    let (folder, name) = (p.folder(), p.file_name());
    prop_assert_eq!(name, segments[segments.len() - 1]);
    if folder.is_empty() {
        prop_assert_eq!(name, s);
    } else {
        prop_assert_eq!(format!("{folder}/{name}"), s);
    }

    let encoded = p.encode_component();
    let eb = encoded.as_bytes();
    let mut i = 0;
    while i < eb.len() {
        if eb[i] == b'%' {
            prop_assert!(i + 2 < eb.len(), "truncated escape in {encoded:?}");
            for h in &eb[i + 1..i + 3] {
                prop_assert!(
                    h.is_ascii_digit() || (b'A'..=b'F').contains(h),
                    "bad hex in {encoded:?}"
                );
            }
            // Unreserved bytes are never escaped.
            let byte = u8::from_str_radix(&encoded[i + 1..i + 3], 16);
            prop_assert!(matches!(byte, Ok(b) if !is_unreserved(b)));
            i += 3;
        } else {
            prop_assert!(is_unreserved(eb[i]), "{:?} unescaped", eb[i] as char);
            i += 1;
        }
    }
    prop_assert_eq!(decode_percent(&encoded), Some(s.as_bytes().to_vec()));
    Ok(())
}

fn check(raw: &str) -> Result<(), TestCaseError> {
    match validate(raw) {
        Ok(p) => check_invariants(raw, &p),
        // `PathError` carries no data, so a rejection cannot echo the input.
        Err(_) => Ok(()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn arbitrary_strings(raw in any::<String>()) {
        check(&raw)?;
    }

    #[test]
    fn pathish_strings(raw in pathish()) {
        check(&raw)?;
    }

    #[test]
    fn segmented_strings(raw in segmented()) {
        check(&raw)?;
    }

    /// Clean segments within the limits are always accepted, and come back joined by
    /// single slashes whatever separators and outer whitespace were used.
    #[test]
    fn clean_paths_are_accepted(
        segments in prop::collection::vec(clean_segment(), 1..=MAX_SEGMENTS),
        backslash in any::<bool>(),
        pad in "[ \u{00A0}\u{FEFF}]{0,3}",
    ) {
        let want = segments.join("/");
        let first = segments[0].as_bytes();
        prop_assume!(!matches!(first, [l, b':', ..] if l.is_ascii_alphabetic()));
        prop_assume!(!has_escape(&want));
        prop_assume!(want.len() <= MAX_PATH_BYTES);
        let sep = if backslash { "\\" } else { "//" };
        let raw = format!("{pad}{}{pad}", segments.join(sep));
        let got = validate(&raw);
        prop_assert_eq!(got.as_ref().map(VaultPath::as_str), Ok(want.as_str()));
        if let Ok(p) = got {
            check_invariants(&raw, &p)?;
        }
    }

    /// Adding a forbidden piece to an accepted path gets it rejected.
    #[test]
    fn corrupting_an_accepted_path_is_rejected(
        raw in segmented(),
        bad in prop::sample::select(vec![
            "..", ".", " x", "x ", "\u{00A0}x", "x\u{FEFF}", "%2e", "%2F", "%5C", "a\u{0000}",
            "a\u{0085}", "a\u{001F}b",
        ]),
        before in any::<bool>(),
    ) {
        let Ok(p) = validate(&raw) else { return Ok(()) };
        let corrupted = if before {
            format!("y/{bad}/{}", p.as_str())
        } else {
            format!("{}/{bad}/x", p.as_str())
        };
        prop_assert!(validate(&corrupted).is_err(), "{corrupted:?} accepted");
        let absolute = format!("/{p}");
        prop_assert!(validate(&absolute).is_err());
        let drive = format!("C:{p}");
        prop_assert!(validate(&drive).is_err());
    }

    /// One byte over either limit is rejected.
    #[test]
    fn limits_are_exact(seg_len in 1usize..=16, count in 1usize..=MAX_SEGMENTS + 4) {
        let raw = vec!["x".repeat(seg_len); count].join("/");
        let ok = count <= MAX_SEGMENTS && raw.len() <= MAX_PATH_BYTES;
        prop_assert_eq!(validate(&raw).is_ok(), ok, "{} segments, {} bytes", count, raw.len());
    }
}
