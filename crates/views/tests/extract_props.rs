//! Property tests of the extractor: it never panics, is deterministic, never returns a
//! body or snippet, and nothing placed only in bodies or non-title frontmatter leaks.
// A failed expectation in a test is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use knowtation_views::extract::{self, Frontmatter, Limits};
use knowtation_views::path;
use proptest::prelude::*;

const CANARY: &str = "CANARYzq";

/// Body blocks that carry the canary anywhere but in a heading's text.
fn body_block() -> impl Strategy<Value = String> {
    let c = CANARY;
    prop_oneof![
        Just(format!("{c} paragraph with *{c}* and `{c}`")),
        Just(format!("```\n# {c}\n{c}\n```")),
        Just(format!("    {c} indented code")),
        Just(format!("<div>\n{c}\n</div>")),
        Just(format!("<!-- {c} -->")),
        Just(format!("> {c} quoted\n> more {c}")),
        Just(format!("- {c} item\n  - nested {c}")),
        Just(format!("1. {c}\n2. {c}")),
        Just(format!("[{c}]: https://{c}.example/{c}")),
        Just(format!(
            "see [link](https://{c}.example) and ![](https://{c}.example/i.png)"
        )),
        Just(format!("<https://{c}.example>")),
        Just("***".to_owned()),
        Just(format!("text with a hard  \nbreak {c}")),
        Just(format!("&nbsp;{c}&amp;")),
    ]
}

/// Headings whose text uses only words without the canary; links in them point at the
/// canary, which must not leak because URLs are not text.
fn heading() -> impl Strategy<Value = String> {
    (1usize..=6, "[a-y ]{0,12}", any::<bool>()).prop_map(|(level, words, link)| {
        let text = if link {
            format!("[{words}](https://{CANARY}.example \"{CANARY}\")")
        } else {
            words
        };
        format!("{} {text}", "#".repeat(level))
    })
}

fn note() -> impl Strategy<Value = String> {
    prop::collection::vec(prop_oneof![heading(), body_block()], 0..24)
        .prop_map(|blocks| blocks.join("\n\n"))
}

fn raw_file() -> impl Strategy<Value = String> {
    (note(), any::<bool>(), "[a-y ]{0,10}").prop_map(|(body, with_title, title)| {
        let title_line = if with_title { format!("title: \"{title}\"\n") } else { String::new() };
        format!("---\n{title_line}secret: {CANARY}\ntags: [{CANARY}]\nnested:\n  key: {CANARY}\n---\n{body}")
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn canaries_never_leak_from_raw_files(raw in raw_file()) {
        let p = path::validate("vault/note.md").expect("path");
        let out = extract::build_from_raw(&p, &raw, &Limits::default()).expect("builds").to_json();
        prop_assert!(!out.contains(CANARY), "leak in {out}");
        prop_assert!(!out.contains("canaryzq"), "leak through a slug in {out}");
    }

    #[test]
    fn canaries_never_leak_from_stored_notes(body in note()) {
        let p = path::validate("vault/note.md").expect("path");
        let out = extract::build(&p, &Frontmatter::default(), &body, &Limits::default()).expect("builds").to_json();
        prop_assert!(!out.contains(CANARY), "leak in {out}");
        prop_assert!(!out.contains("canaryzq"), "leak through a slug in {out}");
    }

    #[test]
    fn any_text_is_deterministic_and_body_free(text in "\\PC{0,400}", raw in any::<bool>()) {
        let p = path::validate("n.md").expect("path");
        let run = || {
            if raw {
                extract::build_from_raw(&p, &text, &Limits::default())
            } else {
                extract::build(&p, &Frontmatter::default(), &text, &Limits::default())
            }
            .map(|d| d.to_json())
        };
        let first = run();
        prop_assert_eq!(&first, &run());
        let out = first.expect("small inputs always build");
        let v: serde_json::Value = serde_json::from_str(&out).expect("output is JSON");
        for s in v["sections"].as_array().expect("sections") {
            prop_assert_eq!(&s["body_returned"], &serde_json::Value::Bool(false));
            prop_assert_eq!(&s["snippet_returned"], &serde_json::Value::Bool(false));
            prop_assert_eq!(s.as_object().map(|o| o.len()), Some(9));
        }
        prop_assert_eq!(v.as_object().map(|o| o.len()), Some(5));
    }

    #[test]
    fn markdown_shaped_text_is_deterministic(text in "([#>*_`\\[\\]()!<>\\-= \n\t\\\\a-c1&;]|\r\n){0,300}") {
        let p = path::validate("n.md").expect("path");
        let a = extract::build(&p, &Frontmatter::default(), &text, &Limits::default()).map(|d| d.to_json());
        let b = extract::build(&p, &Frontmatter::default(), &text, &Limits::default()).map(|d| d.to_json());
        prop_assert_eq!(a, b);
    }

    /// What `build_charged` asks for covers the JSON it makes, for any heading nesting
    /// and text (quotes, controls, non-ASCII case mappings, a long path and title).
    #[test]
    fn the_charge_covers_the_document(
        headings in prop::collection::vec((1usize..=6, "[a-zA-Z\"\\\u{1}\t İß\u{fb03}]{0,24}"), 0..40),
        title in "[a\"\u{2}İ]{0,10}",
        long in any::<bool>(),
    ) {
        let body: String = headings
            .iter()
            .map(|(level, text)| format!("{} x{text}\n\n", "#".repeat(*level)))
            .collect();
        let name = if long { format!("{}/n.md", "İ".repeat(60)) } else { "n.md".to_owned() };
        let p = path::validate(&name).expect("path");
        let fm = extract::decode_stored(
            Some(&serde_json::json!({ "title": title })),
            extract::Surface::Rest,
        ).expect("frontmatter");
        let mut asked = 0;
        let doc = extract::build_charged(&p, &fm, &body, &Limits::default(), &mut |n| {
            asked += n;
            true
        })
        .expect("builds");
        let json = doc.to_json();
        prop_assert!(asked >= json.len(), "{asked} < {}", json.len());
        prop_assert!(asked <= 8 * json.len() + 4096, "{asked} far over {}", json.len());
    }
}
