//! The three body-free views of a note agree with each other: built from one parse, the
//! NoteOutline's headings are the SectionSource's sections (level, `heading_text`,
//! `heading_id`, in order), the DocumentTree flattens back to the outline in pre-order
//! and nests as the SectionSource's `child_section_ids` do, and path, title and
//! `truncated` are the same in all three. Checked on generated notes and on every note
//! of the repository's Markdown corpus (its Markdown files, the differential corpus and
//! the vectors' Markdown).
// A failed expectation in a test is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use knowtation_sidecar::extract::{self, Headings, Limits, Surface};
use knowtation_sidecar::path;
use proptest::prelude::*;
use serde_json::Value;

mod common;

/// Every way the three views of one parse must agree; `what` names the note.
fn assert_agree(headings: Headings<'_>, what: &str) {
    let outline = headings.note_outline();
    let tree = headings.document_tree();
    let ss = headings.section_source();

    assert_eq!(outline.path(), ss.path(), "{what}: path");
    assert_eq!(tree.path(), ss.path(), "{what}: path");
    assert_eq!(outline.title(), ss.title(), "{what}: title");
    assert_eq!(tree.title(), ss.title(), "{what}: title");
    assert_eq!(outline.truncated(), ss.truncated(), "{what}: truncated");
    assert_eq!(tree.truncated(), ss.truncated(), "{what}: truncated");

    // The outline's ids are the section source's heading ids, in order; and its levels
    // and texts are the sections'.
    let from_outline: Vec<(u8, &str, &str)> = outline
        .headings()
        .iter()
        .map(|h| (h.level(), h.text(), h.id()))
        .collect();
    let from_ss: Vec<(u8, &str, &str)> = ss
        .sections()
        .iter()
        .map(|s| (s.level(), s.heading_text(), s.heading_id()))
        .collect();
    assert_eq!(from_outline, from_ss, "{what}: outline against sections");

    // The tree flattens back to the outline.
    let flat: Vec<(u8, &str, &str)> = tree
        .nodes()
        .iter()
        .map(|n| (n.level(), n.text(), n.id()))
        .collect();
    assert_eq!(flat, from_outline, "{what}: tree flattened");

    // And nests as the sections do: a node's children are the section's children.
    let ids_of_section = |id: &str| -> Vec<String> {
        let s = ss
            .sections()
            .iter()
            .find(|s| s.heading_id() == id)
            .expect("every node is a section");
        s.child_section_ids()
            .iter()
            .map(|c| c.rsplit_once(':').map_or(c.as_str(), |(_, h)| h).to_owned())
            .collect()
    };
    for node in tree.nodes() {
        let children: Vec<String> = node.children().iter().map(|c| c.id().to_owned()).collect();
        assert_eq!(
            children,
            ids_of_section(node.id()),
            "{what}: children of {}",
            node.id()
        );
        for c in node.children() {
            assert!(c.level() > node.level(), "{what}: a child is deeper");
        }
    }
    let top: Vec<&str> = tree.children().iter().map(|n| n.id()).collect();
    let top_ss: Vec<&str> = ss
        .sections()
        .iter()
        .filter(|s| s.heading_path().len() == 1)
        .map(|s| s.heading_id())
        .collect();
    assert_eq!(top, top_ss, "{what}: the root's children");

    // Every document is its schema's, and JSON.
    for (json, schema) in [
        (outline.to_json(), extract::NOTE_OUTLINE_SCHEMA),
        (tree.to_json(), extract::DOCUMENT_TREE_SCHEMA),
    ] {
        assert!(
            json.starts_with(&format!("{{\"schema\":\"{schema}\",")),
            "{what}"
        );
        serde_json::from_str::<Value>(&json).expect("JSON");
    }
}

/// Blocks of every kind that makes or hides a heading.
fn block() -> impl Strategy<Value = String> {
    let words = "[a-zA-Z0-9 *_`<>&#]{0,16}";
    prop_oneof![
        4 => (1usize..=6, words).prop_map(|(l, t)| format!("{} {t}", "#".repeat(l))),
        1 => (words, any::<bool>()).prop_map(|(t, one)| format!("x{t}\n{}", if one { "===" } else { "---" })),
        1 => words.prop_map(|t| format!("```\n# {t}\n```")),
        1 => words.prop_map(|t| format!("    # {t}")),
        1 => words.prop_map(|t| format!("<div>\n# {t}\n</div>")),
        1 => (1usize..=6, words).prop_map(|(l, t)| format!("> {} {t}", "#".repeat(l))),
        1 => (1usize..=6, words).prop_map(|(l, t)| format!("- {} {t}", "#".repeat(l))),
        2 => words.prop_map(|t| format!("para {t}")),
        1 => Just("***".to_owned()),
    ]
}

fn note() -> impl Strategy<Value = String> {
    prop::collection::vec(block(), 0..40).prop_map(|b| b.join("\n\n"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Generated notes, with small heading caps so that truncation is common.
    #[test]
    fn the_three_views_agree(body in note(), cap in 0usize..12, title in proptest::option::of("[a-z ]{0,8}")) {
        let p = path::validate("notes/gen-note.md").unwrap();
        let limits = Limits { max_headings: cap, ..Limits::default() };
        let raw = match &title {
            Some(t) => format!("---\ntitle: \"{t}\"\n---\n{body}"),
            None => body,
        };
        let h = extract::parse_from_raw(&p, &raw, &limits).unwrap();
        assert_agree(h, &raw);
    }

    /// Any text at all, at the default caps.
    #[test]
    fn any_text_agrees(text in "\\PC{0,600}") {
        let p = path::validate("a.md").unwrap();
        if let Ok(h) = extract::parse_from_raw(&p, &text, &Limits::default()) {
            assert_agree(h, &text);
        }
    }
}

/// Every Markdown file of the repository, outside build and dependency folders.
fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let p = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if p.is_dir() {
            if !matches!(name.as_ref(), "target" | "node_modules" | ".git") {
                markdown_files(&p, out);
            }
        } else if name.ends_with(".md") || name.ends_with(".markdown") {
            out.push(p);
        }
    }
}

#[test]
fn the_three_views_agree_on_the_repositorys_markdown() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let p = path::validate("corpus/note.md").unwrap();
    let mut n = 0;

    let mut files = Vec::new();
    markdown_files(root, &mut files);
    files.sort();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let h = extract::parse_from_raw(&p, &text, &Limits::default()).unwrap();
        assert_agree(h, &f.display().to_string());
        n += 1;
    }
    assert!(n >= 20, "only {n} Markdown files found");

    // The differential corpus: raw files and stored notes, decoded as the surfaces do.
    let cases: Vec<Value> = serde_json::from_str(include_str!("data/differential.json")).unwrap();
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        let Ok(cp) = path::validate(case["path"].as_str().unwrap()) else {
            continue;
        };
        let parsed = if let Some(raw) = case["raw"].as_str() {
            extract::parse_from_raw(&cp, raw, &Limits::default())
        } else {
            let surface = match case["surface"].as_str() {
                Some("rest") => Surface::Rest,
                _ => Surface::Mcp,
            };
            let bytes = serde_json::to_vec(&case["stored"]).unwrap();
            let Ok(note) = extract::parse_note(&bytes, surface) else {
                continue;
            };
            extract::parse(&cp, &note.frontmatter, &note.body, &Limits::default())
        };
        if let Ok(h) = parsed {
            assert_agree(h, name);
            n += 1;
        }
    }

    // The Markdown of every vector that carries some.
    for v in common::reference_vectors() {
        if let Some(m) = v["markdown"].as_str() {
            if let Ok(h) = extract::parse_from_raw(&p, m, &Limits::default()) {
                assert_agree(h, v["name"].as_str().unwrap_or_default());
                n += 1;
            }
        }
    }
    assert!(n >= 100, "only {n} notes compared");
}
