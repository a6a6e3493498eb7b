//! Splitting a raw Markdown note into the JSON object the canister stores as its
//! `frontmatter` text and the body.
//!
//! This is deliberately a small subset of YAML, enough for the demo vault and test
//! fixtures, not js-yaml: top-level `key: value` lines, block lists (`key:` followed by
//! `- item` lines), flow lists (`[a, b]`), `{}`, quoted strings, booleans, null, numbers
//! and comments. Dates stay plain strings. Nested maps, multi-line scalars, anchors and
//! tags are refused with an error rather than misread. The sidecar's own frontmatter
//! handling lives in the extractor and is not used here, so a fixture cannot hide a bug
//! in it.

use serde_json::{Map, Number, Value};

/// Why a frontmatter block is outside the supported subset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("frontmatter line {line}: {reason}")]
pub struct FrontmatterError {
    /// 1-based line number within the file.
    pub line: usize,
    /// What is not supported.
    pub reason: &'static str,
}

/// Splits `raw` into its frontmatter object and its body. A file that does not start
/// with a `---` line, or whose block is never closed by `---` or `...`, has no
/// frontmatter and is all body. The line ending after the closing fence is not part of
/// the body.
pub fn split_markdown(raw: &str) -> Result<(Map<String, Value>, &str), FrontmatterError> {
    let Some(after_open) = strip_fence_line(raw, "---") else {
        return Ok((Map::new(), raw));
    };
    let mut offset = raw.len() - after_open.len();
    let mut lines = Vec::new();
    for line in after_open.split_inclusive('\n') {
        offset += line.len();
        let content = line.trim_end_matches(['\n', '\r']);
        if content.trim_end() == "---" || content.trim_end() == "..." {
            let body = raw.get(offset..).unwrap_or("");
            return Ok((parse_block(&lines)?, body));
        }
        lines.push(content);
    }
    Ok((Map::new(), raw))
}

/// The rest of `text` after a first line that is exactly `fence` (trailing spaces
/// allowed).
fn strip_fence_line<'a>(text: &'a str, fence: &str) -> Option<&'a str> {
    let (first, rest) = match text.split_once('\n') {
        Some((first, rest)) => (first, rest),
        None => (text, ""),
    };
    (first.trim_end() == fence).then_some(rest)
}

fn parse_block(lines: &[&str]) -> Result<Map<String, Value>, FrontmatterError> {
    let mut map = Map::new();
    // The key whose value was empty: `- item` lines that follow build its list.
    let mut open_list: Option<String> = None;
    for (i, line) in lines.iter().enumerate() {
        let err = |reason| FrontmatterError {
            line: i + 2, // the opening fence is line 1
            reason,
        };
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if let Some(item) = trimmed
            .strip_prefix('-')
            .filter(|r| r.is_empty() || r.starts_with(' ') || r.starts_with('\t'))
        {
            let key = open_list
                .as_ref()
                .ok_or_else(|| err("list item without a key"))?;
            let item = parse_scalar(item.trim()).ok_or_else(|| err("unsupported list item"))?;
            match map.get_mut(key) {
                Some(Value::Array(items)) => items.push(item),
                Some(slot) => *slot = Value::Array(vec![item]),
                None => return Err(err("list item without a key")),
            }
            continue;
        }
        if line.starts_with([' ', '\t']) {
            return Err(err("nested mappings are not supported"));
        }
        let (key, value) = split_key(trimmed).ok_or_else(|| err("expected `key: value`"))?;
        if map.contains_key(&key) {
            // js-yaml refuses duplicated mapping keys too.
            return Err(err("duplicated key"));
        }
        if value.is_empty() {
            map.insert(key.clone(), Value::Null);
            open_list = Some(key);
        } else {
            let value = parse_scalar(value).ok_or_else(|| err("unsupported value"))?;
            map.insert(key, value);
            open_list = None;
        }
    }
    Ok(map)
}

/// `key: value` or `key:`; the key may be quoted.
fn split_key(line: &str) -> Option<(String, &str)> {
    let (key, rest) = if let Some(quoted) = line.strip_prefix('"') {
        let end = quoted.find('"')?;
        (quoted[..end].to_owned(), &quoted[end + 1..])
    } else if let Some(quoted) = line.strip_prefix('\'') {
        let end = quoted.find('\'')?;
        (quoted[..end].to_owned(), &quoted[end + 1..])
    } else {
        let colon = line
            .find(": ")
            .or_else(|| line.ends_with(':').then(|| line.len() - 1))?;
        (line[..colon].trim_end().to_owned(), &line[colon..])
    };
    let value = rest.strip_prefix(':')?;
    if !(value.is_empty() || value.starts_with([' ', '\t'])) || key.is_empty() {
        return None;
    }
    Some((key, value.trim()))
}

/// One scalar or flow collection; `None` when outside the subset.
fn parse_scalar(s: &str) -> Option<Value> {
    if let Some(inner) = s.strip_prefix('"') {
        return parse_double_quoted(inner).map(Value::String);
    }
    if let Some(inner) = s.strip_prefix('\'') {
        let inner = inner.strip_suffix('\'')?;
        return Some(Value::String(inner.replace("''", "'")));
    }
    if let Some(inner) = s.strip_prefix('[') {
        let inner = inner.strip_suffix(']')?.trim();
        if inner.is_empty() {
            return Some(Value::Array(Vec::new()));
        }
        // Flat flow lists only: a nested `[`/`{` or a quoted comma would be misread.
        if inner.contains(['[', ']', '{', '}', '"', '\'']) {
            return None;
        }
        return inner
            .split(',')
            .map(|item| parse_scalar(item.trim()))
            .collect::<Option<Vec<_>>>()
            .map(Value::Array);
    }
    if s == "{}" {
        return Some(Value::Object(Map::new()));
    }
    if s.starts_with(['{', '&', '*', '!', '|', '>', '%', '@', '`']) {
        return None;
    }
    // A plain scalar ends at ` #` (a comment).
    let s = s.split(" #").next().unwrap_or(s).trim_end();
    Some(match s {
        "" | "~" | "null" | "Null" | "NULL" => Value::Null,
        "true" | "True" | "TRUE" => Value::Bool(true),
        "false" | "False" | "FALSE" => Value::Bool(false),
        _ => number(s).unwrap_or_else(|| Value::String(s.to_owned())),
    })
}

fn parse_double_quoted(inner: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return chars.as_str().is_empty().then_some(out),
            '\\' => out.push(match chars.next()? {
                'n' => '\n',
                't' => '\t',
                '"' => '"',
                '\\' => '\\',
                '/' => '/',
                _ => return None,
            }),
            c => out.push(c),
        }
    }
    None
}

/// YAML 1.2 core-schema integers and floats (decimal only).
fn number(s: &str) -> Option<Value> {
    let digits = s.strip_prefix(['-', '+']).unwrap_or(s);
    if digits.is_empty() || !digits.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
        return None;
    }
    if digits.bytes().all(|b| b.is_ascii_digit()) {
        if let Ok(i) = s.parse::<i64>() {
            return Some(Value::Number(i.into()));
        }
    }
    let ok = digits
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'-' | b'+'));
    let f: f64 = if ok { s.parse().ok()? } else { return None };
    Number::from_f64(f).map(Value::Number)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;
    use serde_json::json;

    fn fm(raw: &str) -> Value {
        match split_markdown(raw) {
            Ok((map, _)) => Value::Object(map),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn splits_block_and_body() {
        let raw = "---\ntitle: Hello\n---\n# Body\n";
        let (map, body) = split_markdown(raw).unwrap();
        assert_eq!(Value::Object(map), json!({"title": "Hello"}));
        assert_eq!(body, "# Body\n");
    }

    #[test]
    fn crlf_and_dots_close() {
        let raw = "---\r\ntitle: A\r\n...\r\nbody";
        let (map, body) = split_markdown(raw).unwrap();
        assert_eq!(Value::Object(map), json!({"title": "A"}));
        assert_eq!(body, "body");
    }

    #[test]
    fn no_or_unclosed_block_is_all_body() {
        for raw in ["# Just a note\n", "---\ntitle: x\n# never closed\n", ""] {
            let (map, body) = split_markdown(raw).unwrap();
            assert!(map.is_empty());
            assert_eq!(body, raw);
        }
    }

    #[test]
    fn scalars_lists_and_comments() {
        let v = fm(concat!(
            "---\n",
            "# a comment\n",
            "title: \"Quoted: \\\"yes\\\"\"\n",
            "alt: 'it''s'\n",
            "date: 2025-03-04\n",
            "draft: false\n",
            "count: 42\n",
            "ratio: 0.5\n",
            "none: ~\n",
            "project: sidecar # trailing comment\n",
            "tags:\n",
            "  - proxy\n",
            "  - rust\n",
            "flow: [a, 2, true]\n",
            "empty: []\n",
            "obj: {}\n",
            "blank:\n",
            "---\n",
        ));
        assert_eq!(
            v,
            json!({
                "title": "Quoted: \"yes\"",
                "alt": "it's",
                "date": "2025-03-04",
                "draft": false,
                "count": 42,
                "ratio": 0.5,
                "none": null,
                "project": "sidecar",
                "tags": ["proxy", "rust"],
                "flow": ["a", 2, true],
                "empty": [],
                "obj": {},
                "blank": null,
            })
        );
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        for (raw, line) in [
            ("---\nouter:\n  inner: 1\n---\n", 3),
            ("---\n- orphan\n---\n", 2),
            ("---\nno colon here\n---\n", 2),
            ("---\na: 1\na: 2\n---\n", 3),
            ("---\nx: |\n  text\n---\n", 2),
            ("---\nx: [a, [b]]\n---\n", 2),
            ("---\nx: \"unterminated\n---\n", 2),
        ] {
            let err = split_markdown(raw).unwrap_err();
            assert_eq!(err.line, line, "{raw:?}: {err}");
        }
    }
}
