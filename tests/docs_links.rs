//! The project's documents stand on their own: every relative link, every file a page
//! or a configuration comment cites, and every "wire contract §N" resolves in this
//! repository (`docs/`, `deploy/`, the top-level pages and the sources' citations).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every file under `dir` (relative to the root) whose name ends with one of `exts`.
fn files(dir: &str, exts: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root().join(dir)];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if !["node_modules", "target", "testdata"].contains(&name.as_str()) {
                    stack.push(path);
                }
            } else if exts.iter().any(|e| name.ends_with(e)) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The pages held to this test.
fn pages() -> Vec<PathBuf> {
    let mut out = files("docs", &[".md"]);
    out.extend(files("deploy", &[".md"]));
    for top in ["README.md", "CONTRIBUTING.md", "CHANGELOG.md"] {
        out.push(root().join(top));
    }
    out
}

/// The configuration and deployment files whose comments cite documents.
fn commented() -> Vec<PathBuf> {
    let mut out = files(
        "deploy",
        &[".toml", ".yml", ".yaml", ".service", "Dockerfile"],
    );
    out.push(root().join("Dockerfile"));
    out.extend(files("policy", &[".toml"]));
    out
}

/// `text` without its fenced code blocks (commands and examples, not citations).
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            out.push('\n');
            continue;
        }
        if !fenced {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

/// The `[text](target)` targets of a page.
fn link_targets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        out.push(after[..end].trim().to_owned());
        rest = &after[end..];
    }
    out
}

/// The `` `x` `` spans of a text.
fn spans(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

const FILE_EXTENSIONS: &[&str] = &[
    ".md", ".rs", ".toml", ".yml", ".yaml", ".sh", ".mjs", ".cjs", ".py", ".json", ".service",
    ".lock",
];
const TOP_DIRS: &[&str] = &[
    "docs/", "deploy/", "src/", "tests/", "benches/", "fuzz/", "policy/", ".ci/", "../",
];

/// Spans that look like file names but name something else: Express's JSON body parser,
/// and the file the offline advisory snapshot carries (`docs/supply-chain.md`).
const NOT_FILES: &[&str] = &["express.json", "SNAPSHOT.md", "LICENSE.txt"];

/// Every file name in the repository (a bare name cited in a page, such as `door.rs`
/// beside its folder in a table, must be one of them).
fn all_names() -> BTreeSet<String> {
    let exts: Vec<&str> = FILE_EXTENSIONS.to_vec();
    let mut out = BTreeSet::new();
    for dir in [
        "src", "tests", "benches", "fuzz", "policy", "deploy", "docs", ".ci",
    ] {
        for f in files(dir, &exts) {
            out.insert(f.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    out
}

/// Whether a backquoted span names a file of the repository (rather than a path inside
/// a vault, an absolute path on a host, a route or a shell word).
fn names_a_file(span: &str) -> bool {
    let plain = !span.is_empty()
        && !span.starts_with('/')
        && !span.contains("://")
        && span
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
    let anchored = TOP_DIRS.iter().any(|d| span.starts_with(d));
    let bare = !span.contains('/')
        && FILE_EXTENSIONS
            .iter()
            .any(|e| span.len() > e.len() && span.ends_with(e));
    plain && (anchored || bare) && !NOT_FILES.contains(&span)
}

/// Where a citation in `from` may point: beside the page, at the root, or in docs/.
fn resolves(from: &Path, target: &str) -> bool {
    let target = target.split('#').next().unwrap();
    if target.is_empty() {
        return true;
    }
    let dir = from.parent().unwrap();
    [
        dir.join(target),
        root().join(target),
        root().join("docs").join(target),
    ]
    .iter()
    .any(|p| p.exists())
}

/// GitHub's anchor of a heading: lowercase, punctuation dropped (but `-` and `_`),
/// spaces made `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(page: &Path) -> BTreeSet<String> {
    std::fs::read_to_string(page)
        .map(|t| {
            prose(&t)
                .lines()
                .filter(|l| l.starts_with('#'))
                .map(|l| anchor(l.trim_start_matches('#')))
                .collect()
        })
        .unwrap_or_default()
}

fn rel(p: &Path) -> String {
    p.strip_prefix(root()).unwrap().display().to_string()
}

#[test]
fn every_relative_link_resolves_with_its_anchor() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = prose(&std::fs::read_to_string(&page).unwrap());
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, fragment) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let file_path = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            if !file_path.exists() {
                broken.push(format!("{}: link to {target}", rel(&page)));
                continue;
            }
            if let Some(fragment) = fragment.filter(|_| file_path.extension() == page.extension()) {
                if !anchors(&file_path).contains(fragment) {
                    broken.push(format!("{}: no heading #{fragment} in {file}", rel(&page)));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_cited_file_exists() {
    let names = all_names();
    let mut missing = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = prose(&std::fs::read_to_string(&page).unwrap());
        for span in spans(&text) {
            if names_a_file(&span) {
                checked += 1;
                let bare_known = !span.contains('/') && names.contains(&span);
                if !bare_known && !resolves(&page, &span) {
                    missing.push(format!("{}: `{span}`", rel(&page)));
                }
            }
        }
    }
    // Comments of configuration and deployment files cite documents too.
    for file in commented() {
        let text = std::fs::read_to_string(&file).unwrap();
        for line in text.lines().filter(|l| l.trim_start().starts_with('#')) {
            for word in line.split(|c: char| c.is_whitespace() || ",;()`\"'".contains(c)) {
                let word = word.trim_end_matches(['.', ':']);
                if word.ends_with(".md") || TOP_DIRS.iter().any(|d| word.starts_with(d)) {
                    checked += 1;
                    if !resolves(&file, word) {
                        missing.push(format!("{}: {word}", rel(&file)));
                    }
                }
            }
        }
    }
    assert!(checked > 200, "only {checked} citations found");
    assert!(
        missing.is_empty(),
        "cited but not in the repository:\n{}",
        missing.join("\n")
    );
}

/// The sections of `docs/wire-contract.md` (`## N. Title`).
fn contract_sections() -> BTreeSet<String> {
    std::fs::read_to_string(root().join("docs/wire-contract.md"))
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .filter_map(|h| h.split_once(". ").map(|(n, _)| n.to_owned()))
        .collect()
}

/// The section numbers a text cites as "wire contract §N" (and the `§M` right after, as
/// in "wire contract §5 and §6" or "§1, §2").
fn contract_citations(text: &str) -> Vec<String> {
    let flat = text.replace('\n', " ");
    let mut out = Vec::new();
    for part in flat.split("wire contract").skip(1) {
        let head: String = part.chars().take(40).collect();
        let Some(first) = head.find('§') else {
            continue;
        };
        // Only a citation right after the words, not a § further on.
        if head[..first].chars().any(char::is_alphabetic)
            && !head[..first].trim().ends_with("(`wire-contract.md`")
        {
            continue;
        }
        let digits: String = head[first..]
            .chars()
            .skip(1)
            .take_while(char::is_ascii_digit)
            .collect();
        if !digits.is_empty() {
            out.push(digits);
        }
    }
    out
}

#[test]
fn every_wire_contract_citation_names_a_section_of_its_page() {
    let sections = contract_sections();
    assert!(sections.len() >= 7, "{sections:?}");
    let mut sources = pages();
    sources.extend(files("src", &[".rs"]));
    sources.extend(files("tests", &[".rs", ".md"]));
    sources.extend(commented());
    let mut broken = Vec::new();
    let mut cited = 0;
    for file in sources {
        let text = std::fs::read_to_string(&file).unwrap();
        for n in contract_citations(&text) {
            cited += 1;
            if !sections.contains(&n) {
                broken.push(format!("{}: wire contract §{n}", rel(&file)));
            }
        }
    }
    assert!(cited > 50, "only {cited} citations found");
    assert!(broken.is_empty(), "no such section:\n{}", broken.join("\n"));
}

#[test]
fn no_page_cites_a_document_outside_the_repository() {
    // The names of specification files that lived outside the repository: citing one
    // sends a reader nowhere.
    let outside = [
        "section-source-v0.md",
        "body-free-views.md",
        "shared specification",
    ];
    let mut sources = pages();
    sources.extend(files("src", &[".rs"]));
    sources.extend(commented());
    let mut found = Vec::new();
    for file in sources {
        let text = std::fs::read_to_string(&file).unwrap();
        for name in outside {
            if text.contains(name) {
                found.push(format!("{}: {name}", rel(&file)));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}
