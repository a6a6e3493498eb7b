//! Compact JSON output, written straight into a `String`: exactly what `serde_json`
//! writes for the same values, which is what `JSON.stringify` writes for strings that
//! are valid Unicode (spec §11): `"` and `\` escaped, control characters as `\b`, `\t`,
//! `\n`, `\f`, `\r` or `\u00xx` (lowercase hex), everything else as is.

/// Whether a byte must be escaped inside a JSON string.
fn needs_escape(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

/// Appends `s` as a JSON string.
pub fn push_str(out: &mut String, s: &str) {
    out.push('"');
    let bytes = s.as_bytes();
    // Most strings need no escape at all: one check over the bytes, then one copy. The
    // check folds chunks without an early exit, which compiles to vector instructions.
    let clean = bytes.chunks(32).all(|chunk| {
        chunk
            .iter()
            .fold(0u8, |any, &b| any | u8::from(needs_escape(b)))
            == 0
    });
    if clean {
        out.push_str(s);
        out.push('"');
        return;
    }
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if !needs_escape(b) {
            continue;
        }
        // `i` is at an ASCII byte, so both slices end on char boundaries.
        out.push_str(s.get(start..i).unwrap_or_default());
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            0x08 => out.push_str("\\b"),
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            0x0C => out.push_str("\\f"),
            b'\r' => out.push_str("\\r"),
            _ => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.push_str("\\u00");
                out.push(char::from(HEX[usize::from(b >> 4)]));
                out.push(char::from(HEX[usize::from(b & 0xF)]));
            }
        }
        start = i + 1;
    }
    out.push_str(s.get(start..).unwrap_or_default());
    out.push('"');
}

/// The length [`push_str`] writes for `s`, quotes included.
pub fn str_len(s: &str) -> usize {
    let bytes = s.as_bytes();
    if !bytes.iter().any(|&b| needs_escape(b)) {
        return bytes.len() + 2;
    }
    2 + bytes
        .iter()
        .map(|&b| match b {
            b'"' | b'\\' | 0x08 | b'\t' | b'\n' | 0x0C | b'\r' => 2,
            0..=0x1F => 6,
            _ => 1,
        })
        .sum::<usize>()
}

/// Appends a JSON array of strings.
pub fn push_str_array(out: &mut String, items: &[String]) {
    out.push('[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_str(out, item);
    }
    out.push(']');
}

/// Appends an unsigned integer in decimal.
pub fn push_u64(out: &mut String, n: u64) {
    if n < 10 {
        // Heading levels, and most of anything else counted here.
        out.push(char::from(b'0' + n as u8));
        return;
    }
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = n;
    while n > 0 {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
    }
    for &d in &digits[at..] {
        out.push(char::from(d));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_string_matches_serde_json(s in any::<String>()) {
            prop_assert_eq!(ours(&s), as_serde(&s));
        }
    }

    fn as_serde(s: &str) -> String {
        serde_json::to_string(s).unwrap_or_default()
    }

    fn ours(s: &str) -> String {
        let mut out = String::new();
        push_str(&mut out, s);
        out
    }

    #[test]
    fn strings_match_serde_json() {
        let mut every_ascii = String::new();
        for b in 0u8..0x80 {
            every_ascii.push(char::from(b));
        }
        for s in [
            "",
            "plain",
            "quote \" and \\ backslash",
            "\u{0}\u{1}\u{8}\t\n\u{b}\u{c}\r\u{1f}\u{7f}",
            "é ü 😀 \u{2028}\u{2029} \u{FEFF}",
            "\"",
            "ends with \\",
            &every_ascii,
        ] {
            assert_eq!(ours(s), as_serde(s), "{s:?}");
        }
    }

    #[test]
    fn numbers_and_arrays() {
        for n in [0, 1, 9, 10, 99, 100, 9_999, 10_000, 123_456_789, u64::MAX] {
            let mut out = String::new();
            push_u64(&mut out, n);
            assert_eq!(out, n.to_string());
        }
        let items = vec!["a".to_owned(), "b\"".to_owned()];
        let mut out = String::new();
        push_str_array(&mut out, &items);
        assert_eq!(out, serde_json::to_string(&items).unwrap_or_default());
        let mut out = String::new();
        push_str_array(&mut out, &[]);
        assert_eq!(out, "[]");
    }
}
