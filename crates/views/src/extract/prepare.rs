//! Input normalization that makes pulldown-cmark see what micromark sees.
//!
//! The reference parser (micromark, via remark-parse) differs from pulldown-cmark in a
//! few places that a rewrite of the input can neutralize without changing anything the
//! extractor reads (heading structure, heading text up to whitespace, blankness):
//!
//! - U+0000 becomes U+FFFD before parsing (micromark's preprocessing).
//! - A lone CR is a line ending to both, but pulldown-cmark mishandles it inside code
//!   and HTML blocks; it becomes LF (same length, so offsets stay comparable).
//! - Trailing spaces-and-tabs containing a tab are never a hard break to micromark,
//!   and never part of the text; pulldown-cmark may take them for a hard break or
//!   keep them before a shortcut reference. They are removed.
//! - A tab right before an ATX closing `#` run is accepted as its separator by
//!   micromark only; it becomes a space.
//! - micromark classifies characters per UTF-16 code unit, so a character outside the
//!   BMP (an emoji) flanks emphasis like a letter, while pulldown-cmark sees it as a
//!   symbol. Each one is swapped for an unused private-use character (a letter-like
//!   class to pulldown-cmark) and swapped back in heading text.

use std::borrow::Cow;
use std::collections::HashMap;

/// The first and last private-use characters available as placeholders.
const PUA_FIRST: u32 = 0xE000;
const PUA_LAST: u32 = 0xF8FF;

/// The text to parse, and how to undo the placeholder swap.
pub(crate) struct Prepared<'a> {
    pub text: Cow<'a, str>,
    /// Placeholder → original character, empty when nothing was swapped.
    pub restore: HashMap<char, char>,
}

impl Prepared<'_> {
    /// Swaps placeholders back into `s`.
    pub fn restore(&self, s: String) -> String {
        if self.restore.is_empty() || !s.chars().any(|c| self.restore.contains_key(&c)) {
            return s;
        }
        s.chars()
            .map(|c| *self.restore.get(&c).unwrap_or(&c))
            .collect()
    }
}

pub(crate) fn prepare(body: &str) -> Prepared<'_> {
    let needs = Needs::of(body.as_bytes());
    let (text, restore) = if needs.swap {
        let (text, restore) = swap_chars(body);
        (Cow::Owned(text), restore)
    } else {
        (Cow::Borrowed(body), HashMap::new())
    };
    // Tabs are common (code blocks), the lines fix_tabs changes are not.
    let text = match needs.tabs.then(|| fix_tabs(&text)).flatten() {
        Some(fixed) => Cow::Owned(fixed),
        None => text,
    };
    Prepared { text, restore }
}

/// Which rewrites the body may need.
#[derive(Debug, Default, PartialEq, Eq)]
struct Needs {
    /// A NUL, a lone CR or a character outside the BMP (for [`swap_chars`]); CRLF alone
    /// (common in notes written on Windows) needs no rewrite.
    swap: bool,
    /// A tab (for [`fix_tabs`]).
    tabs: bool,
}

impl Needs {
    /// Bytes this long are tested together: a fold without an early exit, which the
    /// compiler turns into vector instructions; this runs over every byte of every note.
    const CHUNK: usize = 64;

    fn of(bytes: &[u8]) -> Needs {
        let mut needs = Needs::default();
        for (n, chunk) in bytes.chunks(Self::CHUNK).enumerate() {
            let (tabs, maybe_swap) = chunk.iter().fold((0u8, 0u8), |(t, s), &b| {
                (
                    t | u8::from(b == b'\t'),
                    s | u8::from(b == 0 || b == b'\r' || b >= 0xF0),
                )
            });
            needs.tabs |= tabs != 0;
            if maybe_swap != 0 && !needs.swap {
                let at = n * Self::CHUNK;
                needs.swap = chunk.iter().enumerate().any(|(i, &b)| {
                    b == 0 || b >= 0xF0 || (b == b'\r' && bytes.get(at + i + 1) != Some(&b'\n'))
                });
            }
            if needs.tabs && needs.swap {
                break;
            }
        }
        needs
    }
}

/// NUL → U+FFFD, lone CR → LF, characters outside the BMP → placeholders.
fn swap_chars(body: &str) -> (String, HashMap<char, char>) {
    let mut placeholder_of: HashMap<char, char> = HashMap::new();
    let mut free = PUA_FIRST..=PUA_LAST;
    let has_astral = body.bytes().any(|b| b >= 0xF0);
    let used: std::collections::HashSet<char> = if has_astral {
        body.chars()
            .filter(|c| (PUA_FIRST..=PUA_LAST).contains(&(*c as u32)))
            .collect()
    } else {
        Default::default()
    };
    let mut out = String::with_capacity(body.len());
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\0' => out.push('\u{FFFD}'),
            '\r' if chars.peek() != Some(&'\n') => out.push('\n'),
            c if (c as u32) > 0xFFFF => {
                let p = match placeholder_of.get(&c) {
                    Some(p) => Some(*p),
                    None => {
                        let next = free
                            .by_ref()
                            .filter_map(char::from_u32)
                            .find(|p| !used.contains(p));
                        if let Some(p) = next {
                            placeholder_of.insert(c, p);
                        }
                        next
                    }
                };
                // With every placeholder taken, the character stays as it is.
                out.push(p.unwrap_or(c));
            }
            c => out.push(c),
        }
    }
    let restore = placeholder_of.into_iter().map(|(c, p)| (p, c)).collect();
    (out, restore)
}

/// Per line: drop trailing blanks that contain a tab; a tab before a closing `#` run
/// becomes a space. `None` when no line changes.
fn fix_tabs(text: &str) -> Option<String> {
    let mut out: Option<String> = None;
    // Bytes of `text` before this are in `out` already (or unchanged, while it is None).
    let mut copied = 0;
    let mut from = 0;
    // Only lines that contain a tab can change: jump from tab to tab.
    while let Some(tab) = text.get(from..).and_then(|rest| rest.find('\t')) {
        let tab = from + tab;
        let start = text[..tab].rfind('\n').map_or(0, |i| i + 1);
        let end = text[tab..].find('\n').map_or(text.len(), |i| tab + i + 1);
        let line = &text[start..end];
        if let Some(fixed) = fix_line(line) {
            let o = out.get_or_insert_with(|| String::with_capacity(text.len()));
            o.push_str(&text[copied..start]);
            o.push_str(&fixed);
            copied = end;
        }
        from = end;
    }
    let mut out = out?;
    out.push_str(&text[copied..]);
    Some(out)
}

/// One line of [`fix_tabs`], its line ending included; `None` when it stays as it is.
fn fix_line(line: &str) -> Option<String> {
    let (content, ending) = match line.strip_suffix("\r\n") {
        Some(c) => (c, "\r\n"),
        None => match line.strip_suffix('\n') {
            Some(c) => (c, "\n"),
            None => (line, ""),
        },
    };
    if !content.contains('\t') {
        return None;
    }
    let kept = content.trim_end_matches([' ', '\t']);
    let content = if content[kept.len()..].contains('\t') {
        kept
    } else {
        content
    };
    let unblanked = content.trim_end_matches([' ', '\t']);
    let before_run = unblanked.trim_end_matches('#');
    let mut out = String::with_capacity(line.len());
    match before_run.strip_suffix('\t') {
        Some(head)
            if before_run.len() < unblanked.len()
                && head.contains(|c: char| c != ' ' && c != '\t') =>
        {
            out.push_str(head);
            out.push(' ');
            out.push_str(&content[before_run.len()..]);
        }
        _ => out.push_str(content),
    }
    out.push_str(ending);
    (out != line).then_some(out)
}

/// micromark's numeric character reference decoding: code points HTML forbids become
/// U+FFFD (pulldown-cmark keeps them). `source` is the reference as written (`&#…;`).
pub(crate) fn numeric_reference(source: &str) -> Option<char> {
    let digits = source.strip_prefix("&#")?.strip_suffix(';')?;
    let code = match digits.strip_prefix(['x', 'X']) {
        Some(hex) => u32::from_str_radix(hex, 16).ok()?,
        None => digits.parse::<u32>().ok()?,
    };
    let replaced = code < 9
        || code == 11
        || (14..32).contains(&code)
        || (127..160).contains(&code)
        || (0xD800..0xE000).contains(&code)
        || (0xFDD0..0xFDF0).contains(&code)
        || code & 0xFFFF == 0xFFFF
        || code & 0xFFFF == 0xFFFE
        || code > 0x10FFFF;
    replaced.then_some('\u{FFFD}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untouched_input_is_borrowed() {
        assert!(matches!(prepare("# a\n\nb\r\n").text, Cow::Borrowed(_)));
        // Tabs that change nothing: inside a line, and in a code block.
        let tabs = "a\tb\n\n```\n\tcode\tx\n```\n\t# h #\n";
        assert!(matches!(prepare(tabs).text, Cow::Borrowed(_)));
    }

    #[test]
    fn needs_are_found_in_any_chunk() {
        let long = "x".repeat(3 * Needs::CHUNK);
        for at in [0, 1, Needs::CHUNK - 1, Needs::CHUNK, 2 * Needs::CHUNK + 5] {
            let with = |c: &str| format!("{}{c}{}", &long[..at], &long[at..]);
            let needs = |s: String| Needs::of(s.as_bytes());
            assert_eq!(
                needs(with("\t")),
                Needs {
                    swap: false,
                    tabs: true
                }
            );
            assert_eq!(
                needs(with("\0")),
                Needs {
                    swap: true,
                    tabs: false
                }
            );
            assert_eq!(
                needs(with("\r")),
                Needs {
                    swap: true,
                    tabs: false
                }
            );
            assert_eq!(
                needs(with("😀")),
                Needs {
                    swap: true,
                    tabs: false
                }
            );
            assert_eq!(needs(with("\r\n")), Needs::default());
            assert_eq!(needs(with("é\u{FFFF}")), Needs::default());
        }
        // A CR at the end of a chunk, its LF in the next one.
        let cr_lf = format!("{}\r\n", "x".repeat(Needs::CHUNK - 1));
        assert_eq!(Needs::of(cr_lf.as_bytes()), Needs::default());
        assert_eq!(
            Needs::of(b"x\r"),
            Needs {
                swap: true,
                tabs: false
            }
        );
    }

    #[test]
    fn rewrites() {
        let p = |s: &str| prepare(s).text.into_owned();
        assert_eq!(p("a\0b"), "a\u{FFFD}b");
        assert_eq!(p("a\rb\r\nc\r"), "a\nb\r\nc\n");
        assert_eq!(p("a \t\nb\t\r\n\tc"), "a\nb\r\n\tc");
        assert_eq!(p("a  \nb"), "a  \nb");
        assert_eq!(p("# a\t#\n# a\t## \n\t#\n#\t#"), "# a #\n# a ## \n\t#\n# #");
        assert_eq!(p("# a\t\\#"), "# a\t\\#");
        // Changed and unchanged tab lines mixed, CRLF kept, no final line break.
        assert_eq!(
            p("a\tb\r\nc \t\r\nd\te\n# x\t#\nend\t"),
            "a\tb\r\nc\r\nd\te\n# x #\nend"
        );
    }

    #[test]
    fn astral_characters_round_trip() {
        let prepared = prepare("# *😀*a \u{E000} 😀 🎉");
        assert!(!prepared.text.contains('😀'));
        assert!(prepared.text.contains('\u{E000}'));
        assert_eq!(
            prepared.restore(prepared.text.to_string()),
            "# *😀*a \u{E000} 😀 🎉"
        );
    }

    #[test]
    fn numeric_references() {
        assert_eq!(numeric_reference("&#133;"), Some('\u{FFFD}'));
        assert_eq!(numeric_reference("&#11;"), Some('\u{FFFD}'));
        assert_eq!(numeric_reference("&#xFDD0;"), Some('\u{FFFD}'));
        assert_eq!(numeric_reference("&#x1FFFF;"), Some('\u{FFFD}'));
        assert_eq!(numeric_reference("&#x27;"), None);
        assert_eq!(numeric_reference("&#13;"), None);
        assert_eq!(numeric_reference("&amp;"), None);
    }
}
