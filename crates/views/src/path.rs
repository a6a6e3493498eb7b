//! Vault-relative path validation shared by every surface (wire contract §3).
//!
//! [`validate`] runs the gateway's algorithm (JS-trim, `\` → `/`, reject empty, a
//! leading `/` or a drive prefix, split on `/`, drop empty segments, reject `..`, join)
//! and then the sidecar's stricter rules from the wire contract §3 **Deviation**
//! paragraph. Under those rules the builder's second normalization pass (section-source
//! spec §4) changes nothing, so the path we validate is exactly the path we report.
//!
//! Limits: the raw input is bounded first ([`MAX_RAW_BYTES`]) so no work is spent on a
//! huge value; the contract's limits ([`MAX_PATH_BYTES`], [`MAX_SEGMENTS`]) apply to the
//! normalized result, because that is what is fetched and echoed.
//!
//! Whitespace around the whole value is trimmed, as the gateway does (`notes/a.md ` is
//! `notes/a.md`); whitespace at either end of a segment inside it is refused
//! (`notes/a.md /`). Control characters are refused anywhere, even in the trimmed part.
//!
//! Unicode is never normalized: NFC and NFD spellings of a name are different paths,
//! as they are to the gateway and the canister.

use std::fmt;

use crate::js;

/// Most UTF-8 bytes a normalized path may have (wire contract §3).
pub const MAX_PATH_BYTES: usize = 1024;

/// Most segments a normalized path may have (wire contract §3).
pub const MAX_SEGMENTS: usize = 64;

/// Most UTF-8 bytes of raw input looked at. Larger input is refused before any other
/// work; trimming and dropping empty segments cannot plausibly legitimize it.
pub const MAX_RAW_BYTES: usize = 4 * MAX_PATH_BYTES;

/// A validated, normalized vault-relative path (wire contract §3, including the
/// sidecar's stricter rules). The only way to build one is [`validate`].
///
/// Invariants: non-empty; segments joined by single `/`; no leading or trailing `/`;
/// no `\`; no `.` or `..` segment; no segment with leading or trailing JavaScript
/// whitespace; no control character; no drive-letter prefix; no `%2e`/`%2f`/`%5c`;
/// at most [`MAX_PATH_BYTES`] bytes and [`MAX_SEGMENTS`] segments.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VaultPath(String);

impl VaultPath {
    /// The normalized path, segments joined with `/`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The last segment (`b.md` for `a/b.md`, the whole path at top level).
    pub fn file_name(&self) -> &str {
        match self.0.rsplit_once('/') {
            Some((_, name)) => name,
            None => &self.0,
        }
    }

    /// All segments but the last, joined with `/` (`a/b` for `a/b/c.md`); `""` at top
    /// level.
    pub fn folder(&self) -> &str {
        match self.0.rsplit_once('/') {
            Some((folder, _)) => folder,
            None => "",
        }
    }

    /// JavaScript `encodeURIComponent` of the whole path, for the one upstream read
    /// (wire contract §4): `A–Z a–z 0–9 - _ . ! ~ * ' ( )` kept, every other UTF-8 byte
    /// percent-encoded with uppercase hex, so `/` becomes `%2F`. A `str` holds no lone
    /// surrogates, so the JavaScript `URIError` case cannot arise.
    pub fn encode_component(&self) -> String {
        let mut out = String::new();
        self.encode_component_into(&mut out);
        out
    }

    /// [`VaultPath::encode_component`], appended to `out`.
    pub fn encode_component_into(&self, out: &mut String) {
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        out.reserve(self.0.len() * 3);
        for &b in self.0.as_bytes() {
            if is_uri_component_unreserved(b) {
                out.push(char::from(b));
            } else {
                out.push('%');
                out.push(char::from(HEX[usize::from(b >> 4)]));
                out.push(char::from(HEX[usize::from(b & 0x0F)]));
            }
        }
    }
}

impl fmt::Display for VaultPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a path was rejected: the rule broken. Never carries the input (rejections never
/// echo it, wire contract §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Empty after trimming.
    #[error("path is empty")]
    Empty,
    /// Starts with `/` (or `\`) after trimming.
    #[error("path is absolute: a note path is vault-relative")]
    Absolute,
    /// Starts with a drive letter and `:`, with or without a slash after it.
    #[error("path has a drive-letter prefix")]
    DriveLetter,
    /// Has a `..` segment.
    #[error("path has a parent-directory segment: it could escape vault root")]
    Traversal,
    /// Has a `.` segment.
    #[error("path has a current-directory segment")]
    DotSegment,
    /// Contains a character in U+0000–U+001F or U+007F–U+009F.
    #[error("path contains a control character")]
    ControlCharacter,
    /// A segment starts or ends with JavaScript whitespace.
    #[error("path segment starts or ends with whitespace")]
    SegmentWhitespace,
    /// Contains a literal `%2e`, `%2f` or `%5c` (any case).
    #[error("path contains an encoded dot or separator")]
    EncodedSeparator,
    /// Raw input over [`MAX_RAW_BYTES`], or normalized path over [`MAX_PATH_BYTES`].
    #[error("path is too long")]
    TooLong,
    /// Normalized path has more than [`MAX_SEGMENTS`] segments.
    #[error("path has too many segments")]
    TooManySegments,
}

/// Validates and normalizes a vault-relative path (wire contract §3, gateway algorithm
/// plus the sidecar's stricter rules).
///
/// Checks run in a fixed order, so the error names the first rule broken: raw size,
/// control characters, empty, absolute, drive letter, encoded escapes, then per segment
/// (left to right) `..`, `.`, whitespace, then the segment count and byte length of the
/// normalized path.
pub fn validate(raw: &str) -> Result<VaultPath, PathError> {
    // Bound the work before anything else; the real limit is checked on the result.
    if raw.len() > MAX_RAW_BYTES {
        return Err(PathError::TooLong);
    }
    // Wire contract §3 Deviation: control characters anywhere, including in the
    // whitespace that trimming would remove (a TAB or LF is both).
    if raw.chars().any(is_control) {
        return Err(PathError::ControlCharacter);
    }

    // Gateway algorithm (wire contract §3): JS-trim, then every `\` → `/`.
    let value = js::trim(raw).replace('\\', "/");
    if value.is_empty() {
        return Err(PathError::Empty);
    }
    if value.starts_with('/') {
        return Err(PathError::Absolute);
    }
    // The gateway rejects `X:/`; the Deviation also rejects `X:` without a slash (`C:`,
    // `C:foo`), which Windows resolves against the drive's current directory.
    if has_drive_prefix(&value) {
        return Err(PathError::DriveLetter);
    }
    // Deviation: an escape left in the decoded value could be decoded a second time
    // further along into a dot or separator.
    if has_encoded_separator(&value) {
        return Err(PathError::EncodedSeparator);
    }

    let mut segments = Vec::new();
    for segment in value.split('/').filter(|s| !s.is_empty()) {
        match segment {
            ".." => return Err(PathError::Traversal),
            // Deviation: `.` is harmless to the gateway but never meaningful.
            "." => return Err(PathError::DotSegment),
            // Deviation: the builder's second pass trims the joined value again, so a
            // last segment ending in whitespace would change (`x/.. /` → `x/.. ` →
            // `x/..`); rejecting such segments keeps that pass a no-op.
            s if s.starts_with(js::is_js_whitespace) || s.ends_with(js::is_js_whitespace) => {
                return Err(PathError::SegmentWhitespace)
            }
            s => segments.push(s),
        }
    }
    // Unreachable after the leading-`/` check, kept so the invariant does not depend
    // on that ordering.
    if segments.is_empty() {
        return Err(PathError::Empty);
    }
    if segments.len() > MAX_SEGMENTS {
        return Err(PathError::TooManySegments);
    }
    let joined = segments.join("/");
    if joined.len() > MAX_PATH_BYTES {
        return Err(PathError::TooLong);
    }
    Ok(VaultPath(joined))
}

/// C0 and C1 control characters, U+0000–U+001F and U+007F–U+009F (wire contract §3).
fn is_control(c: char) -> bool {
    matches!(c, '\u{0000}'..='\u{001F}' | '\u{007F}'..='\u{009F}')
}

/// Whether the value starts with an ASCII letter and `:` (wire contract §3 Deviation).
fn has_drive_prefix(value: &str) -> bool {
    matches!(value.as_bytes(), [letter, b':', ..] if letter.is_ascii_alphabetic())
}

/// Whether the value holds `%2e`, `%2f` or `%5c` in any case (wire contract §3).
fn has_encoded_separator(value: &str) -> bool {
    value.as_bytes().windows(3).any(|w| {
        matches!(
            w,
            [b'%', b'2', b'e' | b'E' | b'f' | b'F'] | [b'%', b'5', b'c' | b'C']
        )
    })
}

/// The bytes JavaScript `encodeURIComponent` leaves as they are (wire contract §4).
fn is_uri_component_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'-' | b'_' | b'.' | b'!' | b'~' | b'*' | b'\'' | b'(' | b')'
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid(raw: &str) -> VaultPath {
        match validate(raw) {
            Ok(p) => p,
            Err(e) => panic!("{raw:?} rejected: {e:?}"),
        }
    }

    fn ok(raw: &str) -> String {
        valid(raw).as_str().to_owned()
    }

    fn err(raw: &str) -> PathError {
        match validate(raw) {
            Ok(p) => panic!("{raw:?} accepted as {:?}", p.as_str()),
            Err(e) => e,
        }
    }

    #[test]
    fn plain_paths_pass_unchanged() {
        assert_eq!(ok("a.md"), "a.md");
        assert_eq!(ok("notes/a-b.md"), "notes/a-b.md");
        assert_eq!(ok("inbox/hello world.md"), "inbox/hello world.md");
        assert_eq!(ok("a/b/c/d.md"), "a/b/c/d.md");
        // Dots inside a segment are not dot segments.
        assert_eq!(ok("a/.hidden/b..c/...md"), "a/.hidden/b..c/...md");
        assert_eq!(ok("a/.../b"), "a/.../b");
    }

    #[test]
    fn gateway_normalization_is_kept() {
        assert_eq!(ok("a//b"), "a/b");
        assert_eq!(ok("a\\b.md"), "a/b.md");
        assert_eq!(ok("a\\\\b/\\c"), "a/b/c");
        assert_eq!(ok("a/b/"), "a/b");
        assert_eq!(ok("a/b\\"), "a/b");
        // The whole value is JS-trimmed first, as the gateway does.
        assert_eq!(ok("  notes/a.md  "), "notes/a.md");
        assert_eq!(ok("\u{FEFF}\u{00A0}notes/a.md\u{3000}"), "notes/a.md");
    }

    #[test]
    fn empty_is_rejected() {
        assert_eq!(err(""), PathError::Empty);
        assert_eq!(err("   "), PathError::Empty);
        assert_eq!(err("\u{FEFF}\u{2028}"), PathError::Empty);
    }

    #[test]
    fn absolute_is_rejected() {
        assert_eq!(err("/Users/x"), PathError::Absolute);
        assert_eq!(err("\\Users\\x"), PathError::Absolute);
        assert_eq!(err("/"), PathError::Absolute);
        assert_eq!(err("//"), PathError::Absolute);
        assert_eq!(err("  /a"), PathError::Absolute);
        assert_eq!(err("\\\\server\\share\\a.md"), PathError::Absolute);
    }

    #[test]
    fn drive_letters_are_rejected_with_or_without_slash() {
        assert_eq!(err("C:/x"), PathError::DriveLetter);
        assert_eq!(err("C:\\x"), PathError::DriveLetter);
        assert_eq!(err("C:x"), PathError::DriveLetter);
        assert_eq!(err("C:foo/bar.md"), PathError::DriveLetter);
        assert_eq!(err("c:"), PathError::DriveLetter);
        assert_eq!(err("z:"), PathError::DriveLetter);
        assert_eq!(err(" C:/x"), PathError::DriveLetter);
        // Only a leading letter and colon is a drive prefix.
        assert_eq!(ok("1:/x"), "1:/x");
        assert_eq!(ok("ab:c"), "ab:c");
        assert_eq!(ok("a/C:x"), "a/C:x");
        assert_eq!(ok("é:x"), "é:x");
    }

    #[test]
    fn traversal_is_rejected() {
        assert_eq!(err("../secret.md"), PathError::Traversal);
        assert_eq!(err(".."), PathError::Traversal);
        assert_eq!(err("a/../b"), PathError::Traversal);
        assert_eq!(err("a/.."), PathError::Traversal);
        assert_eq!(err("a\\..\\b"), PathError::Traversal);
        assert_eq!(err("a//..//b"), PathError::Traversal);
    }

    #[test]
    fn dot_segments_are_rejected() {
        assert_eq!(err("a/./b"), PathError::DotSegment);
        assert_eq!(err("./a"), PathError::DotSegment);
        assert_eq!(err("a/."), PathError::DotSegment);
        assert_eq!(err("."), PathError::DotSegment);
        assert_eq!(err("a\\.\\b"), PathError::DotSegment);
    }

    #[test]
    fn segment_whitespace_is_rejected() {
        // The gateway accepts this and its builder trims it to `notes/a-b.md`.
        assert_eq!(err("notes/a-b.md /"), PathError::SegmentWhitespace);
        // The gateway fetches `x/.. ` and only then fails; we fail first.
        assert_eq!(err("x/.. /"), PathError::SegmentWhitespace);
        assert_eq!(err("a/ b"), PathError::SegmentWhitespace);
        assert_eq!(err("a /b"), PathError::SegmentWhitespace);
        assert_eq!(err("a/ /b"), PathError::SegmentWhitespace);
        assert_eq!(err("a/\u{00A0}b"), PathError::SegmentWhitespace);
        assert_eq!(err("a/b\u{FEFF}/c"), PathError::SegmentWhitespace);
        assert_eq!(err("a\u{3000}\\b"), PathError::SegmentWhitespace);
        // Inner whitespace is fine; U+200B is not JavaScript whitespace.
        assert_eq!(ok("a b/c\u{00A0}d"), "a b/c\u{00A0}d");
        assert_eq!(ok("\u{200B}a/b\u{200B}"), "\u{200B}a/b\u{200B}");
    }

    #[test]
    fn control_characters_are_rejected_anywhere() {
        for c in ('\u{0000}'..='\u{001F}').chain('\u{007F}'..='\u{009F}') {
            assert_eq!(
                err(&format!("a/b{c}c.md")),
                PathError::ControlCharacter,
                "{c:?}"
            );
            // Even where trimming would have removed it (TAB, LF, …).
            assert_eq!(
                err(&format!("{c}a/b.md")),
                PathError::ControlCharacter,
                "{c:?}"
            );
            assert_eq!(
                err(&format!("a/b.md{c}")),
                PathError::ControlCharacter,
                "{c:?}"
            );
        }
        assert_eq!(ok("a\u{00A0}b\u{00A1}"), "a\u{00A0}b\u{00A1}");
    }

    #[test]
    fn encoded_separators_are_rejected_in_any_case() {
        for esc in ["%2e", "%2E", "%2f", "%2F", "%5c", "%5C"] {
            assert_eq!(
                err(&format!("a/{esc}b")),
                PathError::EncodedSeparator,
                "{esc}"
            );
            assert_eq!(err(esc), PathError::EncodedSeparator, "{esc}");
        }
        assert_eq!(err("%2E%2E/x"), PathError::EncodedSeparator);
        assert_eq!(err("a/%2e%2e/b"), PathError::EncodedSeparator);
        assert_eq!(err("a%2Fb"), PathError::EncodedSeparator);
        assert_eq!(err("a%5cb"), PathError::EncodedSeparator);
        // Other escapes and lone percent signs are ordinary characters.
        assert_eq!(ok("100%/a%20b%41.md"), "100%/a%20b%41.md");
        assert_eq!(ok("%2/%e/%5"), "%2/%e/%5");
    }

    #[test]
    fn unicode_is_kept_as_is() {
        assert_eq!(ok("📝/notes 😀.md"), "📝/notes 😀.md");
        let nfc = "caf\u{00E9}.md";
        let nfd = "cafe\u{0301}.md";
        assert_eq!(ok(nfc), nfc);
        assert_eq!(ok(nfd), nfd);
        assert_ne!(ok(nfc), ok(nfd));
        assert_eq!(ok("日本語/ノート.md"), "日本語/ノート.md");
    }

    #[test]
    fn byte_limit_applies_to_the_normalized_path() {
        let max = "a".repeat(MAX_PATH_BYTES);
        assert_eq!(ok(&max), max);
        assert_eq!(err(&"a".repeat(MAX_PATH_BYTES + 1)), PathError::TooLong);
        // Multibyte: 256 four-byte chars is exactly 1024 bytes.
        let emoji = "😀".repeat(MAX_PATH_BYTES / 4);
        assert_eq!(ok(&emoji), emoji);
        assert_eq!(err(&format!("{emoji}a")), PathError::TooLong);
        // Trimmed whitespace and dropped separators do not count.
        assert_eq!(ok(&format!("   {max}   ")), max);
        let a = "a".repeat(MAX_PATH_BYTES / 2 - 1);
        let b = "b".repeat(MAX_PATH_BYTES / 2);
        assert_eq!(ok(&format!("{a}//////{b}/")), format!("{a}/{b}"));
        assert_eq!(err(&format!("{a}//////{b}c/")), PathError::TooLong);
    }

    #[test]
    fn raw_input_is_bounded_before_normalizing() {
        let raw = format!("a{}", "/".repeat(MAX_RAW_BYTES - 1));
        assert_eq!(raw.len(), MAX_RAW_BYTES);
        assert_eq!(ok(&raw), "a");
        let raw = format!("a{}", "/".repeat(MAX_RAW_BYTES));
        assert_eq!(err(&raw), PathError::TooLong);
        // Raw size wins over every other rule.
        assert_eq!(err(&" ".repeat(MAX_RAW_BYTES + 1)), PathError::TooLong);
    }

    #[test]
    fn segment_limit_applies_to_the_normalized_path() {
        let max = vec!["a"; MAX_SEGMENTS].join("/");
        assert_eq!(ok(&max), max);
        let over = vec!["a"; MAX_SEGMENTS + 1].join("/");
        assert_eq!(err(&over), PathError::TooManySegments);
        // Empty segments are dropped before counting.
        let sparse = vec!["a"; MAX_SEGMENTS].join("//");
        assert_eq!(ok(&sparse), max);
    }

    #[test]
    fn errors_never_echo_the_input() {
        let cases = [
            "",
            "/secret",
            "C:secret",
            "../secret",
            "./secret",
            "secret\n",
            "secret /x",
            "secret%2e",
        ];
        for raw in cases {
            let e = err(raw);
            let shown = format!("{e} {e:?}");
            assert!(!shown.contains("secret"), "{shown}");
        }
        assert!(!format!("{}", err(&"secret".repeat(200))).contains("secret"));
    }

    #[test]
    fn file_name_and_folder() {
        let p = valid("a/b/c.md");
        assert_eq!(p.file_name(), "c.md");
        assert_eq!(p.folder(), "a/b");
        let p = valid("top.md");
        assert_eq!(p.file_name(), "top.md");
        assert_eq!(p.folder(), "");
        let p = valid("x\\\\y.md ");
        assert_eq!(p.as_str(), "x/y.md");
        assert_eq!(p.file_name(), "y.md");
        assert_eq!(p.folder(), "x");
    }

    #[test]
    fn encode_component_matches_javascript() {
        let enc = |raw: &str| valid(raw).encode_component();
        assert_eq!(enc("inbox/hello world.md"), "inbox%2Fhello%20world.md");
        assert_eq!(enc("AZaz09-_.!~*'()"), "AZaz09-_.!~*'()");
        assert_eq!(
            enc("a#b?c&d=e+f,g;h:i@j$k%l[m]n\"o<p>q`r{s}t|u^v"),
            "a%23b%3Fc%26d%3De%2Bf%2Cg%3Bh%3Ai%40j%24k%25l%5Bm%5Dn%22o%3Cp%3Eq%60r%7Bs%7Dt%7Cu%5Ev"
        );
        assert_eq!(enc("caf\u{00E9}"), "caf%C3%A9");
        assert_eq!(enc("cafe\u{0301}"), "cafe%CC%81");
        assert_eq!(enc("😀"), "%F0%9F%98%80");
        assert_eq!(enc("a\u{00A0}b"), "a%C2%A0b");
    }

    #[test]
    fn display_is_the_path() {
        assert_eq!(valid("a//b").to_string(), "a/b");
    }
}
