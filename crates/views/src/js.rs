//! The few pieces of ECMAScript semantics the gateway's builder relies on.
//!
//! The gateway is JavaScript, and byte-identical output means matching its notion of
//! whitespace (spec §9), string length (UTF-16 code units, spec §10) and `String()` of
//! numbers (spec §5). Rust's own definitions differ in small but observable ways.

/// Whether `c` is in the ECMAScript `WhiteSpace` ∪ `LineTerminator` set used by `\s`,
/// `trim` and `trimEnd` (spec §9). U+0085 is not; U+FEFF is.
pub fn is_js_whitespace(c: char) -> bool {
    matches!(
        c,
        '\u{0009}'..='\u{000D}'
            | ' '
            | '\u{00A0}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200A}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202F}'
            | '\u{205F}'
            | '\u{3000}'
            | '\u{FEFF}'
    )
}

/// JavaScript `String.prototype.trim`.
pub fn trim(s: &str) -> &str {
    s.trim_matches(is_js_whitespace)
}

/// JavaScript `String.prototype.trimEnd`.
pub fn trim_end(s: &str) -> &str {
    s.trim_end_matches(is_js_whitespace)
}

/// Whether `s` is empty after [`trim`].
pub fn is_blank(s: &str) -> bool {
    s.chars().all(is_js_whitespace)
}

/// Replaces every run of JavaScript whitespace with one space and trims: the
/// `.replace(/\s+/g, " ").trim()` idiom.
pub fn collapse_whitespace(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut pending_space = false;
    for c in s.chars() {
        if is_js_whitespace(c) {
            pending_space = !out.is_empty();
        } else {
            if pending_space {
                out.push(' ');
                pending_space = false;
            }
            out.push(c);
        }
    }
    out
}

/// Length as JavaScript's `String.prototype.length` counts it: UTF-16 code units.
pub fn utf16_len(s: &str) -> usize {
    // Every char of 4 UTF-8 bytes is one surrogate pair; every other char is one unit.
    s.chars().map(char::len_utf16).sum()
}

/// ECMAScript `Number::toString(x)` (radix 10): shortest round-trip digits, `1e+21`
/// from 10^21 on, `1e-7` below 10^-6, `NaN`, `Infinity`, and `-0` printed as `0`.
pub fn number_to_string(x: f64) -> String {
    if x == 0.0 {
        // Covers -0 too: ECMAScript prints both zeros as "0".
        return "0".to_owned();
    }
    let mut buf = ryu_js::Buffer::new();
    buf.format(x).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whitespace_set_is_ecmascript_not_rust() {
        assert!(is_js_whitespace('\u{FEFF}'));
        assert!(!is_js_whitespace('\u{0085}'));
        assert!(!is_js_whitespace('\u{200B}'));
        assert!(is_js_whitespace('\u{000B}'));
        assert!(is_js_whitespace('\u{3000}'));
        assert_eq!(trim("\u{FEFF}\u{00A0} a \u{2029}"), "a");
        assert_eq!(trim("\u{0085}a\u{0085}"), "\u{0085}a\u{0085}");
        assert_eq!(trim_end("  a \t\r\n"), "  a");
    }

    #[test]
    fn collapse_matches_replace_and_trim() {
        assert_eq!(
            collapse_whitespace("  Hello,  \n World ! "),
            "Hello, World !"
        );
        assert_eq!(collapse_whitespace(" \u{00A0} "), "");
        assert_eq!(collapse_whitespace("a\u{200B}b"), "a\u{200B}b");
    }

    #[test]
    fn utf16_length_counts_surrogate_pairs() {
        assert_eq!(utf16_len("abc"), 3);
        assert_eq!(utf16_len("é"), 1);
        assert_eq!(utf16_len("😀"), 2);
        assert_eq!(utf16_len("😀é"), 3);
    }

    #[test]
    fn numbers_print_like_ecmascript() {
        let cases: &[(f64, &str)] = &[
            (42.0, "42"),
            (1.0, "1"),
            (1e21, "1e+21"),
            (1e20, "100000000000000000000"),
            (0.0, "0"),
            (-0.0, "0"),
            (12345678901234567890.0, "12345678901234567000"),
            (1e-7, "1e-7"),
            (1e-6, "0.000001"),
            (0.1, "0.1"),
            (-1.5, "-1.5"),
            (f64::NAN, "NaN"),
            (f64::INFINITY, "Infinity"),
            (f64::NEG_INFINITY, "-Infinity"),
            (123e-20, "1.23e-18"),
        ];
        for (x, want) in cases {
            assert_eq!(number_to_string(*x), *want, "String({x})");
        }
    }
}
