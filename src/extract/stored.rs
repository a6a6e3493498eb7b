//! Reading a canister note (a 2xx body) the way each surface does (wire contract §4).
//!
//! The two surfaces treat odd bodies differently and the sidecar keeps both: REST reads
//! the text and parses it itself, MCP calls `res.json()`.

use super::frontmatter::{decode_stored, FmValue, Frontmatter, Surface};
use crate::json_cost::{json_parse_cost, nested_json_parse_cost};

/// The largest canister note body accepted, in bytes. The note cap is 1,000,000 UTF-16
/// units; JSON escaping (`\uXXXX`) can make each up to six bytes, plus frontmatter.
pub const MAX_NOTE_JSON_BYTES: usize = 8 * 1024 * 1024;

/// A canister note reduced to what the extractor reads.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StoredNote {
    /// Decoded frontmatter (title and project only).
    pub frontmatter: Frontmatter,
    /// The body after JavaScript `String()`.
    pub body: String,
}

/// Why a canister 2xx body could not be read. The wire mapping lives with each surface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NoteError {
    /// Empty body on MCP (`res.json()` throws).
    #[error("empty note response")]
    Empty,
    /// Not JSON (including a lone surrogate escape, not UTF-8, or over the size cap).
    #[error("invalid note response")]
    NotJson,
    /// JSON `null` on REST.
    #[error("null note response")]
    Null,
    /// The MCP frontmatter decoder's unguarded parse threw.
    #[error("frontmatter could not be decoded")]
    Frontmatter,
    /// `String()` of the body threw.
    #[error("note body cannot be converted to a string")]
    Body,
    /// Parsing it would take more memory than the caller may hold.
    #[error("note too costly to parse")]
    TooCostly,
}

/// Reads a canister 2xx body as `surface` does (wire contract §4 table).
pub fn parse_note(bytes: &[u8], surface: Surface) -> Result<StoredNote, NoteError> {
    parse_note_charged(bytes, surface, &mut |_| true)
}

/// [`parse_note`], asking `charge` for the memory each parse may hold before it runs
/// ([`crate::json_cost`]): the parse of the note's bytes, then a frontmatter string's
/// parse (decoders unwrap it string by string). The bytes themselves are the caller's to
/// charge, as they arrive. When `charge` says no, [`NoteError::TooCostly`].
pub fn parse_note_charged(
    bytes: &[u8],
    surface: Surface,
    charge: &mut dyn FnMut(usize) -> bool,
) -> Result<StoredNote, NoteError> {
    // The extract phase's first step: the stored note read.
    let _span = tracing::trace_span!(
        target: crate::telemetry::trace::TARGET,
        "extract",
        step = "parse",
    )
    .entered();
    if bytes.is_empty() {
        return match surface {
            Surface::Rest => Ok(StoredNote::default()),
            Surface::Mcp => Err(NoteError::Empty),
        };
    }
    if bytes.len() > MAX_NOTE_JSON_BYTES {
        return Err(NoteError::NotJson);
    }
    if !charge(json_parse_cost(bytes)) {
        return Err(NoteError::TooCostly);
    }
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|_| NoteError::NotJson)?;
    let serde_json::Value::Object(mut note) = value else {
        return match (value, surface) {
            (serde_json::Value::Null, Surface::Rest) => Err(NoteError::Null),
            // null on MCP, and strings, numbers, booleans, arrays on both: no fields.
            _ => Ok(StoredNote::default()),
        };
    };
    if let Some(serde_json::Value::String(s)) = note.get("frontmatter") {
        if !charge(nested_json_parse_cost(s.as_bytes())) {
            return Err(NoteError::TooCostly);
        }
    }
    let frontmatter =
        decode_stored(note.get("frontmatter"), surface).map_err(|_| NoteError::Frontmatter)?;
    // Taken out of the parsed note, not copied: it is the largest field.
    let body = match note.remove("body") {
        None | Some(serde_json::Value::Null) => String::new(),
        Some(serde_json::Value::String(s)) => s,
        Some(other) => FmValue::from_json(&other)
            .js_string()
            .map_err(|_| NoteError::Body)?,
    };
    Ok(StoredNote { frontmatter, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_bodies_follow_the_surface_table() {
        assert_eq!(parse_note(b"", Surface::Rest), Ok(StoredNote::default()));
        assert_eq!(parse_note(b"", Surface::Mcp), Err(NoteError::Empty));
        for s in [Surface::Rest, Surface::Mcp] {
            assert_eq!(parse_note(b"<html>", s), Err(NoteError::NotJson));
            assert_eq!(parse_note(b" ", s), Err(NoteError::NotJson));
            assert_eq!(parse_note(b"\"\\ud800\"", s), Err(NoteError::NotJson));
            assert_eq!(parse_note(b"\xff", s), Err(NoteError::NotJson));
            for odd in [&b"\"x\""[..], b"1", b"true", b"[1]"] {
                assert_eq!(parse_note(odd, s), Ok(StoredNote::default()));
            }
        }
        assert_eq!(parse_note(b"null", Surface::Rest), Err(NoteError::Null));
        assert_eq!(parse_note(b"null", Surface::Mcp), Ok(StoredNote::default()));
    }

    #[test]
    fn body_is_converted_with_string() {
        let body = |j: &str| parse_note(j.as_bytes(), Surface::Rest).map(|n| n.body);
        assert_eq!(body(r##"{"body":"# a"}"##), Ok("# a".into()));
        assert_eq!(body(r##"{"body":["# a","b"]}"##), Ok("# a,b".into()));
        assert_eq!(body(r#"{"body":{"x":1}}"#), Ok("[object Object]".into()));
        assert_eq!(body(r#"{"body":12}"#), Ok("12".into()));
        assert_eq!(body(r#"{"body":null}"#), Ok(String::new()));
        assert_eq!(body(r#"{}"#), Ok(String::new()));
        assert_eq!(body(r#"{"body":{"toString":1}}"#), Err(NoteError::Body));
    }

    #[test]
    fn duplicate_keys_last_wins() {
        let n = parse_note(br##"{"body":"# a","body":"# b"}"##, Surface::Mcp);
        assert_eq!(n.map(|n| n.body), Ok("# b".into()));
    }
}
