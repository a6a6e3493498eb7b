//! One test per rule of the SectionSource v0 spec (`docs/section-source.md`), through the
//! public API. Section numbers in comments refer to that spec.
// A failed expectation in a test is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use knowtation_views::extract::{self, decode_stored, ExtractError, Frontmatter, Limits, Surface};
use knowtation_views::path;
use serde_json::{json, Value};

fn stored(path: &str, frontmatter: Value, body: &str) -> Result<Value, ExtractError> {
    let p = path::validate(path).expect("valid test path");
    let fm = decode_stored(Some(&frontmatter), Surface::Rest).expect("decodable");
    extract::build(&p, &fm, body, &Limits::default())
        .map(|d| serde_json::from_str(&d.to_json()).expect("JSON"))
}

fn doc(body: &str) -> Value {
    stored("notes/t.md", json!({}), body).expect("builds")
}

fn texts(body: &str) -> Vec<String> {
    doc(body)["sections"]
        .as_array()
        .expect("sections")
        .iter()
        .map(|s| s["heading_text"].as_str().expect("text").to_owned())
        .collect()
}

fn text(body: &str) -> String {
    let t = texts(body);
    assert_eq!(t.len(), 1, "one heading in {body:?}: {t:?}");
    t[0].clone()
}

fn available(body: &str) -> Vec<bool> {
    doc(body)["sections"]
        .as_array()
        .expect("sections")
        .iter()
        .map(|s| s["body_available"].as_bool().expect("bool"))
        .collect()
}

fn ids(body: &str) -> Vec<String> {
    doc(body)["sections"]
        .as_array()
        .expect("sections")
        .iter()
        .map(|s| s["heading_id"].as_str().expect("id").to_owned())
        .collect()
}

// §6: observable results listed in the spec.
#[test]
fn heading_text_observable_results() {
    assert_eq!(text("## Hello, **World**!"), "Hello, World !");
    assert_eq!(text("# foo*bar*baz"), "foo bar baz");
    assert_eq!(text("# a \\# b &amp; c"), "a # b & c");
    assert_eq!(
        text("## <script>alert(1)</script>"),
        "<script> alert(1) </script>"
    );
    assert_eq!(text("Two\nlines\n==="), "Two lines");
}

// §6: adjacent text merges without a separator; inline elements are joined by a space.
#[test]
fn heading_text_merging_and_joining() {
    assert_eq!(text("# a&amp;b\\*c"), "a&b*c");
    assert_eq!(text("# a`b`c"), "a b c");
    assert_eq!(text("# *a `b` c*"), "a b c");
    assert_eq!(text("# [x**y**](u)z"), "x y z");
    assert_eq!(text("# <http://e.com>"), "http://e.com");
    assert_eq!(text("# ` a  b `"), "a b");
}

// §6: image alt concatenates text, code, html and nested alts; hard breaks add nothing.
#[test]
fn image_alt_is_concatenated() {
    assert_eq!(
        text("# ![a `c` <b>x</b> ![n](m) *e*](u)"),
        "a c <b>x</b> n e"
    );
    assert_eq!(text("# x![al*t*](u)y"), "x alt y");
    assert_eq!(text("![a\\\nb](u)\n==="), "ab");
    assert_eq!(text("![a\nb](u)\n==="), "a b");
    assert_eq!(text("# ![r][d]\n\n[d]: /u"), "r");
    assert_eq!(text("# ![](u)"), "");
}

// §6: a hard line break contributes one space.
#[test]
fn hard_breaks_in_setext_headings() {
    assert_eq!(text("a\\\nb\n==="), "a b");
    assert_eq!(text("a  \nb\n---"), "a b");
}

// §6, §9: NFC, then the ECMAScript whitespace set, then trim.
#[test]
fn normalization_and_whitespace() {
    assert_eq!(text("# Cafe\u{0301}"), "Caf\u{00E9}");
    assert_eq!(text("# a&nbsp;&nbsp;b"), "a b");
    assert_eq!(text("# a\u{3000}b\u{FEFF}"), "a b");
    // U+0085 and U+200B are not whitespace in ECMAScript.
    assert_eq!(text("# a\u{0085}b\u{200B}"), "a\u{0085}b\u{200B}");
    assert_eq!(text("# 😀 *x*"), "😀 x");
}

// §6: headings anywhere count; code and HTML blocks never produce headings.
#[test]
fn headings_in_containers_and_not_in_code() {
    assert_eq!(
        texts("> # q\n\n- ## l\n  - ### n\n\n1. #### o"),
        ["q", "l", "n", "o"]
    );
    assert_eq!(
        texts("```\n# no\n```\n\n    # no\n\n<div>\n# no\n</div>\n\n# yes"),
        ["yes"]
    );
    assert_eq!(texts("~~~\n# unclosed"), Vec::<String>::new());
}

// §6: the reference parser drops one leading BOM; CRLF works; setext both levels.
#[test]
fn bom_crlf_setext() {
    assert_eq!(texts("\u{FEFF}# Title"), ["Title"]);
    assert_eq!(texts("\u{FEFF}\u{FEFF}# Title"), Vec::<String>::new());
    assert_eq!(texts("# A\r\n\r\nB\r\n---\r\n"), ["A", "B"]);
    assert_eq!(ids("T\n=\n\nS\n-"), ["h1-t-0001", "h2-s-0002"]);
}

// §6, §10: empty and whitespace-only notes have no sections.
#[test]
fn empty_and_blank_notes() {
    for body in ["", "   \n\t\n", "\u{FEFF}", "plain text"] {
        let d = doc(body);
        assert_eq!(d["sections"], json!([]), "{body:?}");
        assert_eq!(d["truncated"], json!(false));
    }
}

// §6: at most 500 visible headings; truncated exactly when there are more.
#[test]
fn heading_cap() {
    let many = |n: usize| (1..=n).map(|i| format!("## H{i}\n\n")).collect::<String>();
    let d500 = doc(&many(500));
    assert_eq!(d500["sections"].as_array().map(Vec::len), Some(500));
    assert_eq!(d500["truncated"], json!(false));
    let d501 = doc(&many(501));
    assert_eq!(d501["sections"].as_array().map(Vec::len), Some(500));
    assert_eq!(d501["truncated"], json!(true));
    assert_eq!(d501["sections"][499]["heading_id"], json!("h2-h500-0500"));
}

// §7: ordinals grow past four digits.
#[test]
fn ordinals_grow_past_9999() {
    let p = path::validate("n.md").expect("path");
    let body = "#\n".repeat(10_000);
    let limits = Limits {
        max_headings: 10_000,
        ..Limits::default()
    };
    let d = extract::build(&p, &Frontmatter::default(), &body, &limits).expect("builds");
    assert_eq!(d.sections()[9_998].heading_id(), "h1-heading-9999");
    assert_eq!(d.sections()[9_999].heading_id(), "h1-heading-10000");
}

// §10: the cap counts UTF-16 code units, exactly at the cap passes.
#[test]
fn input_cap_in_utf16_units() {
    let at = "a".repeat(1_000_000);
    assert!(stored("n.md", json!({}), &at).is_ok());
    let over = "a".repeat(1_000_001);
    assert_eq!(
        stored("n.md", json!({}), &over),
        Err(ExtractError::TooLarge)
    );
    // 500,000 emoji are 1,000,000 units (2,000,000 UTF-8 bytes): at the cap.
    let emoji = "😀".repeat(500_000);
    assert!(stored("n.md", json!({}), &emoji).is_ok());
    assert_eq!(
        stored("n.md", json!({}), &format!("{emoji}a")),
        Err(ExtractError::TooLarge)
    );
    // The BOM counts too: it is part of the body before parsing.
    assert_eq!(
        stored("n.md", json!({}), &format!("\u{FEFF}{at}")),
        Err(ExtractError::TooLarge)
    );
}

// §7: slugs.
#[test]
fn slugs() {
    assert_eq!(ids("# Café"), ["h1-caf-0001"]);
    assert_eq!(ids("# \u{212A}elvin"), ["h1-kelvin-0001"]);
    assert_eq!(ids("# İstanbul"), ["h1-i-stanbul-0001"]);
    assert_eq!(ids("# 日本語"), ["h1-heading-0001"]);
    assert_eq!(ids("# --a--b--"), ["h1-a-b-0001"]);
    assert_eq!(ids("#"), ["h1-heading-0001"]);
    let d = stored("日本/語.md", json!({}), "# x").expect("builds");
    assert_eq!(d["sections"][0]["section_id"], json!("md:h1-x-0001"));
    let d = stored("日本", json!({}), "# x").expect("builds");
    assert_eq!(d["sections"][0]["section_id"], json!("note:h1-x-0001"));
}

// §8: skipped levels nest under the nearest shallower heading.
#[test]
fn tree_with_skipped_levels() {
    let d = doc("# A\n### B\n## C\n# D");
    let s = &d["sections"];
    assert_eq!(
        s[0]["child_section_ids"],
        json!(["notes-t-md:h3-b-0002", "notes-t-md:h2-c-0003"])
    );
    assert_eq!(s[1]["heading_path"], json!(["A", "B"]));
    assert_eq!(s[2]["heading_path"], json!(["A", "C"]));
    assert_eq!(s[3]["heading_path"], json!(["D"]));
    assert_eq!(s[3]["child_section_ids"], json!([]));
}

// §8: body availability.
#[test]
fn body_availability() {
    assert_eq!(available("# A\n\n## B\n\ntext"), [true, true]);
    assert_eq!(available("# A\n\n## B\n\n# C\n\nx"), [false, false, true]);
    assert_eq!(available("# A\n\n```\ncode\n```"), [true]);
    assert_eq!(available("# A\n\n```\n   \n```"), [false]);
    assert_eq!(available("# A\n\n<!-- c -->"), [true]);
    assert_eq!(available("# A\n\n***"), [true]);
    assert_eq!(available("# A\n\n- ***"), [true]);
    assert_eq!(available("# A\n\n[d]: /u"), [false]);
    assert_eq!(available("# A\n\n![](u)"), [false]);
    assert_eq!(available("# A\n\n![ ](u)"), [false]);
    assert_eq!(available("# A\n\n![x](u)"), [true]);
    assert_eq!(available("# A\n\n[](u)"), [false]);
    assert_eq!(available("# A\n\n&nbsp;"), [false]);
    assert_eq!(available("# A\n\n\u{200B}"), [true]);
    assert_eq!(available("# A\n\n`x`"), [true]);
    // A heading inside a container never sees its own container; the container is
    // body for the section before it.
    assert_eq!(available("# A\n\n> ## B\n> text"), [true, false]);
    assert_eq!(available("# A\n\n- ## B\n\n  text"), [true, false]);
    assert_eq!(available("> # A\n\ntext"), [true]);
    // Headings past the cap still bound a visible section's range.
    let p = path::validate("n.md").expect("path");
    let limits = Limits {
        max_headings: 1,
        ..Limits::default()
    };
    let d = extract::build(&p, &Frontmatter::default(), "# A\n# B\ntext", &limits).expect("builds");
    assert!(!d.sections()[0].body_available());
}

// §5: titles from frontmatter and from the file name.
#[test]
fn titles() {
    let title = |path: &str, fm: Value| stored(path, fm, "").expect("builds")["title"].clone();
    assert_eq!(title("a/b.md", json!({"title": "  T  "})), json!("T"));
    assert_eq!(title("a/b.md", json!({"title": "   "})), json!("b"));
    assert_eq!(title("a/b.md", json!({"title": null})), json!("b"));
    assert_eq!(title("a/b.md", json!({"title": 42})), json!("42"));
    assert_eq!(title("a/b.md", json!({"title": 1e21})), json!("1e+21"));
    assert_eq!(title("a/b.md", json!({"title": ["a", "b"]})), json!("a,b"));
    assert_eq!(title("a/b.md", json!({"title": false})), json!("false"));
    assert_eq!(
        title("a/b.md", json!({"title": {"x": 1}})),
        json!("[object Object]")
    );
    assert_eq!(title("x/a-b__c.MD", json!({})), json!("a b c"));
    assert_eq!(title("x/notes.Markdown", json!({})), json!("notes"));
    assert_eq!(title("x/---.md", json!({})), json!(null));
    assert_eq!(title("x/.md", json!({})), json!(null));
    assert_eq!(title("x/a.md.md", json!({})), json!("a.md"));
    assert_eq!(title("x/a.txt", json!({})), json!("a.txt"));
    // The first heading is never the title.
    assert_eq!(
        stored("x/n.md", json!({}), "# Heading").expect("builds")["title"],
        json!("n")
    );
    assert_eq!(
        stored("x/n.md", json!({"title": {"toString": 1}}), "# a"),
        Err(ExtractError::TitleThrows)
    );
}

// §11: escaping as JSON.stringify escapes; exact key order; compact.
#[test]
fn serialization_is_json_stringify() {
    let p = path::validate("n.md").expect("path");
    let fm = decode_stored(
        Some(&json!({"title": "q\"\\\u{1}\u{8}\u{c}\n\r\t\u{1f}\u{7f}\u{85}\u{2028}é"})),
        Surface::Mcp,
    )
    .expect("decodes");
    let out = extract::build(&p, &fm, "# h", &Limits::default())
        .expect("builds")
        .to_json();
    assert_eq!(
        out,
        "{\"schema\":\"knowtation.section_source/v0\",\"path\":\"n.md\",\"title\":\"q\\\"\\\\\\u0001\\b\\f\\n\\r\\t\\u001f\u{7f}\u{85}\u{2028}é\",\
\"sections\":[{\"section_id\":\"n-md:h1-h-0001\",\"heading_id\":\"h1-h-0001\",\"level\":1,\"heading_path\":[\"h\"],\
\"heading_text\":\"h\",\"child_section_ids\":[],\"body_available\":false,\"body_returned\":false,\"snippet_returned\":false}],\"truncated\":false}"
    );
}

// §1, §2: a stored body is Markdown as-is; a raw file is split first.
#[test]
fn stored_bodies_are_not_split() {
    assert_eq!(texts("---\ntitle: x\n---\n# H"), ["title: x", "H"]);
    let p = path::validate("n.md").expect("path");
    let raw = extract::build_from_raw(&p, "---\ntitle: x\n---\n# H\n\n", &Limits::default())
        .expect("builds");
    assert_eq!(raw.title(), Some("x"));
    assert_eq!(raw.sections().len(), 1);
}
