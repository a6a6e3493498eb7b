//! Hostile Markdown shapes, each sized to `units` UTF-16 code units (the input cap is
//! 1,000,000): deep nesting, long delimiter runs, many link reference definitions, and
//! the inputs known to drive CommonMark parsers superlinear. Shared by the benchmark
//! (at the cap, with a time bound) and a smaller-sized test (no timing).

/// `(name, input)` for every case, each close to `units` long.
pub fn cases(units: usize) -> Vec<(&'static str, String)> {
    let rep = |s: &str| s.repeat(units / s.len());
    let cases = vec![
        ("nested_blockquotes", rep(">")),
        ("nested_blockquotes_lines", rep("> ")),
        (
            "nested_lists",
            (0..units / 64)
                .map(|i| format!("{}- x\n", "  ".repeat(i % 30)))
                .collect(),
        ),
        ("deep_list_markers", rep("- ")),
        ("emphasis_openers", rep("*a ")),
        ("emphasis_mixed", rep("*_")),
        ("strong_runs", rep("**a")),
        ("underscore_intraword", rep("a_")),
        ("unclosed_links", rep("[")),
        (
            "nested_brackets",
            format!("{}{}", "[".repeat(units / 2), "]".repeat(units / 2)),
        ),
        ("link_openers_with_dest", rep("[a](")),
        ("image_openers", rep("![")),
        (
            "backtick_runs",
            (1..)
                .map(|n| "`".repeat(n % 200) + "a")
                .take_while_sum(units),
        ),
        ("html_openers", rep("<a ")),
        ("html_comment_unclosed", format!("<!--{}", rep("a-"))),
        ("autolink_openers", rep("<http:")),
        ("entities", rep("&#x")),
        (
            "many_link_definitions",
            (0..units / 20)
                .map(|i| format!("[r{i}]: /u{i}\n"))
                .collect(),
        ),
        ("many_references", format!("[d]: /u\n\n{}", rep("[d] "))),
        ("heading_flood", rep("#\n")),
        ("setext_flood", rep("a\n=\n")),
        (
            "heading_with_emphasis",
            rep("# *a* _b_ `c` [d](e) ![f](g)\n"),
        ),
        ("fence_flood", rep("```\n")),
        ("table_like_pipes", rep("|a")),
        ("backslashes", rep("\\")),
        ("trailing_spaces", rep("a  \n")),
        ("emoji", "😀".repeat(units / 2)),
    ];
    // A prefix can push a case past the cap; cut every case back to it.
    cases
        .into_iter()
        .map(|(name, input)| (name, fit(input, units)))
        .collect()
}

/// The longest prefix of `s` within `units` UTF-16 code units.
fn fit(s: String, units: usize) -> String {
    let mut used = 0;
    let end = s
        .char_indices()
        .find(|(_, c)| {
            used += c.len_utf16();
            used > units
        })
        .map_or(s.len(), |(i, _)| i);
    s[..end].to_owned()
}

trait TakeWhileSum {
    fn take_while_sum(self, limit: usize) -> String;
}

impl<I: Iterator<Item = String>> TakeWhileSum for I {
    /// Concatenates items until the next one would pass `limit` bytes.
    fn take_while_sum(self, limit: usize) -> String {
        let mut out = String::new();
        for s in self {
            if out.len() + s.len() > limit {
                break;
            }
            out.push_str(&s);
        }
        out
    }
}
