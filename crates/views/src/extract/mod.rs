//! The body-free views of a note: pure, no I/O, no async, no HTTP types. SectionSource
//! v0 (`docs/section-source.md`), NoteOutline v1 and DocumentTree v0, all three from
//! one heading extraction.
//!
//! Entry points: [`build`] for the SectionSource of a stored note (path, decoded
//! frontmatter, body) and [`build_from_raw`] for a raw file (frontmatter split first);
//! [`parse`] and [`parse_from_raw`] for the one parse the three views are built from
//! ([`Headings`]); [`build_view_charged`] for any [`View`]. Each output type has exactly
//! the allowlisted fields.

pub mod frontmatter;
/// JavaScript string and number semantics (re-exported: the extractor was their first
/// user).
pub use crate::js;
pub mod json;
mod markdown;
mod prepare;
pub mod stored;
mod views;
pub mod yaml;

pub use frontmatter::{decode_stored, FmValue, Frontmatter, FrontmatterError, Surface};
pub use stored::{parse_note, parse_note_charged, NoteError, StoredNote, MAX_NOTE_JSON_BYTES};
pub use views::{
    DocumentTree, HeadingRecord, NoteOutline, OutlineHeading, TreeError, TreeNode,
    DOCUMENT_TREE_SCHEMA, MAX_DOCUMENT_TREE_NODES, NOTE_OUTLINE_SCHEMA,
};

use crate::path::VaultPath;

/// Why a note could not be turned into a view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ExtractError {
    /// The body is longer than the cap in UTF-16 code units (spec §10).
    #[error("note body exceeds the input cap")]
    TooLarge,
    /// `String()` of the title threw (spec §5).
    #[error("note title cannot be converted to a string")]
    TitleThrows,
    /// The document would hold more memory than the caller may (see [`build_charged`]).
    #[error("document too costly to build")]
    TooCostly,
}

/// Caps applied by the extractor (spec §6, §10); the same for all three views.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bodies longer than this many UTF-16 code units are refused.
    pub max_input_units: usize,
    /// Only this many headings are visible; more sets `truncated`.
    pub max_headings: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_input_units: 1_000_000,
            max_headings: 500,
        }
    }
}

/// The `knowtation.section_source/v0` document.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SectionSource {
    schema: Schema,
    path: String,
    title: Option<String>,
    sections: Vec<Section>,
    truncated: bool,
}

/// The constant schema name, serialized as a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Schema;

impl serde::Serialize for Schema {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(SCHEMA)
    }
}

/// The schema name every document carries.
pub const SCHEMA: &str = "knowtation.section_source/v0";

/// One section of a [`SectionSource`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Section {
    section_id: String,
    heading_id: String,
    level: u8,
    heading_path: Vec<String>,
    heading_text: String,
    child_section_ids: Vec<String>,
    body_available: bool,
    body_returned: False,
    snippet_returned: False,
}

impl SectionSource {
    /// The document as compact JSON, escaped as `JSON.stringify` escapes (spec §11).
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(self.json_len_hint());
        self.write_json(&mut out);
        out
    }

    /// Appends [`Self::to_json`] to `out`. Byte for byte what `serde_json` makes of the
    /// derived `Serialize` (field order, escapes), written directly: this runs once per
    /// served note and per manifest row, and the generic serializer spent most of its
    /// time on field names and per-piece writes.
    pub fn write_json(&self, out: &mut String) {
        out.push_str(r#"{"schema":"#);
        json::push_str(out, SCHEMA);
        out.push_str(r#","path":"#);
        json::push_str(out, &self.path);
        out.push_str(r#","title":"#);
        match &self.title {
            Some(t) => json::push_str(out, t),
            None => out.push_str("null"),
        }
        out.push_str(r#","sections":["#);
        for (i, s) in self.sections.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            s.write_json(out);
        }
        out.push_str(r#"],"truncated":"#);
        out.push_str(if self.truncated { "true}" } else { "false}" });
    }

    /// A guess at the JSON's length, so that it is written without regrowing.
    fn json_len_hint(&self) -> usize {
        let sections: usize = self
            .sections
            .iter()
            .map(|s| {
                200 + 2 * s.section_id.len()
                    + s.heading_path.iter().map(|p| p.len() + 3).sum::<usize>()
                    + s.heading_text.len()
                    + s.child_section_ids
                        .iter()
                        .map(|c| c.len() + 3)
                        .sum::<usize>()
            })
            .sum();
        80 + 2 * self.path.len() + self.title.as_ref().map_or(4, String::len) + sections
    }

    /// The normalized vault path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The title, if any.
    pub fn title(&self) -> Option<&str> {
        self.title.as_deref()
    }

    /// The visible sections in document order.
    pub fn sections(&self) -> &[Section] {
        &self.sections
    }

    /// Whether headings past the cap were left out.
    pub fn truncated(&self) -> bool {
        self.truncated
    }
}

impl Section {
    /// Appends the section's JSON (see [`SectionSource::write_json`]).
    fn write_json(&self, out: &mut String) {
        out.push_str(r#"{"section_id":"#);
        json::push_str(out, &self.section_id);
        out.push_str(r#","heading_id":"#);
        json::push_str(out, &self.heading_id);
        out.push_str(r#","level":"#);
        json::push_u64(out, u64::from(self.level));
        out.push_str(r#","heading_path":"#);
        json::push_str_array(out, &self.heading_path);
        out.push_str(r#","heading_text":"#);
        json::push_str(out, &self.heading_text);
        out.push_str(r#","child_section_ids":"#);
        json::push_str_array(out, &self.child_section_ids);
        out.push_str(r#","body_available":"#);
        out.push_str(if self.body_available { "true" } else { "false" });
        out.push_str(r#","body_returned":false,"snippet_returned":false}"#);
    }

    /// `{path slug}:{heading_id}`.
    pub fn section_id(&self) -> &str {
        &self.section_id
    }

    /// `h{level}-{slug}-{ordinal}`.
    pub fn heading_id(&self) -> &str {
        &self.heading_id
    }

    /// Heading depth 1–6.
    pub fn level(&self) -> u8 {
        self.level
    }

    /// Ancestors' texts, then this heading's.
    pub fn heading_path(&self) -> &[String] {
        &self.heading_path
    }

    /// The normalized heading text.
    pub fn heading_text(&self) -> &str {
        &self.heading_text
    }

    /// Direct children's section ids.
    pub fn child_section_ids(&self) -> &[String] {
        &self.child_section_ids
    }

    /// Whether substantive body follows the heading within its range.
    pub fn body_available(&self) -> bool {
        self.body_available
    }
}

/// A boolean that can only be `false`: bodies and snippets are never returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct False;

impl serde::Serialize for False {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bool(false)
    }
}

/// The body-free views of a note.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum View {
    /// `knowtation.section_source/v0`.
    SectionSource,
    /// `knowtation.note_outline/v1`.
    NoteOutline,
    /// `knowtation.document_tree/v0`.
    DocumentTree,
}

impl View {
    /// Every view, in a fixed order.
    pub const ALL: [View; 3] = [View::SectionSource, View::NoteOutline, View::DocumentTree];

    /// The name used on the command line, in configuration and in metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            View::SectionSource => "section-source",
            View::NoteOutline => "note-outline",
            View::DocumentTree => "document-tree",
        }
    }

    /// The schema name of its documents.
    pub fn schema(self) -> &'static str {
        match self {
            View::SectionSource => SCHEMA,
            View::NoteOutline => NOTE_OUTLINE_SCHEMA,
            View::DocumentTree => DOCUMENT_TREE_SCHEMA,
        }
    }

    /// The view named `name` (see [`Self::as_str`]).
    pub fn from_name(name: &str) -> Option<View> {
        View::ALL.into_iter().find(|v| v.as_str() == name)
    }
}

/// A built view of one note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Document {
    /// A SectionSource.
    SectionSource(SectionSource),
    /// A NoteOutline.
    NoteOutline(NoteOutline),
    /// A DocumentTree.
    DocumentTree(DocumentTree),
}

impl Document {
    /// The document as compact JSON.
    pub fn to_json(&self) -> String {
        match self {
            Document::SectionSource(d) => d.to_json(),
            Document::NoteOutline(d) => d.to_json(),
            Document::DocumentTree(d) => d.to_json(),
        }
    }

    /// Appends [`Self::to_json`] to `out`.
    pub fn write_json(&self, out: &mut String) {
        match self {
            Document::SectionSource(d) => d.write_json(out),
            Document::NoteOutline(d) => d.write_json(out),
            Document::DocumentTree(d) => d.write_json(out),
        }
    }

    /// How many headings it holds (sections, outline headings or tree nodes).
    pub fn headings(&self) -> usize {
        match self {
            Document::SectionSource(d) => d.sections().len(),
            Document::NoteOutline(d) => d.headings().len(),
            Document::DocumentTree(d) => d.node_count(),
        }
    }

    /// Whether headings past a cap were left out.
    pub fn truncated(&self) -> bool {
        match self {
            Document::SectionSource(d) => d.truncated(),
            Document::NoteOutline(d) => d.truncated(),
            Document::DocumentTree(d) => d.truncated(),
        }
    }
}

/// The one parse of a note that every view is built from: the validated path, the
/// title and the heading scan.
#[derive(Debug)]
pub struct Headings<'p> {
    path: &'p VaultPath,
    title: Option<String>,
    scan: markdown::Scan,
}

/// Parses a stored note (spec §1.1: `body` is Markdown as-is): the input cap, the title,
/// the heading scan.
pub fn parse<'p>(
    path: &'p VaultPath,
    frontmatter: &Frontmatter,
    body: &str,
    limits: &Limits,
) -> Result<Headings<'p>, ExtractError> {
    // The cap counts what JavaScript's `length` counts, before anything else runs. A
    // string has at most as many UTF-16 units as UTF-8 bytes, so only a body longer in
    // bytes than the cap needs counting.
    if body.len() > limits.max_input_units && js::utf16_len(body) > limits.max_input_units {
        return Err(ExtractError::TooLarge);
    }
    let title = match frontmatter.title_string() {
        Ok(Some(t)) => Some(t),
        Ok(None) => basename_title(path.file_name()),
        Err(_) => return Err(ExtractError::TitleThrows),
    };
    // micromark drops one leading byte-order mark before parsing (spec §6).
    let body = body.strip_prefix('\u{FEFF}').unwrap_or(body);
    let scan = markdown::scan(body, limits.max_headings);
    Ok(Headings { path, title, scan })
}

/// Parses a raw file: frontmatter split first (spec §1.2, §2).
pub fn parse_from_raw<'p>(
    path: &'p VaultPath,
    text: &str,
    limits: &Limits,
) -> Result<Headings<'p>, ExtractError> {
    let (frontmatter, body) = yaml::split_raw(text);
    parse(path, &frontmatter, body, limits)
}

impl Headings<'_> {
    /// The SectionSource (spec §7, §8).
    pub fn section_source(self) -> SectionSource {
        assemble(self.path, self.title, self.scan)
    }

    /// [`Self::section_source`], asking `charge` first (see [`build_charged`]).
    pub fn section_source_charged(
        self,
        charge: &mut dyn FnMut(usize) -> bool,
    ) -> Result<SectionSource, ExtractError> {
        if !charge(json_len_bound(self.path, self.title.as_deref(), &self.scan)) {
            return Err(ExtractError::TooCostly);
        }
        Ok(self.section_source())
    }

    /// The NoteOutline: the visible headings' levels, texts and ids, in order.
    pub fn note_outline(&self) -> NoteOutline {
        let headings = self
            .scan
            .texts
            .iter()
            .zip(&self.scan.headings)
            .enumerate()
            .map(|(i, (text, h))| {
                OutlineHeading::new(h.level, text.clone(), heading_id(h.level, text, i + 1))
            })
            .collect();
        NoteOutline::new(self.path, self.title.clone(), headings, self.truncated())
    }

    /// The DocumentTree: the outline's headings nested by level.
    pub fn document_tree(&self) -> DocumentTree {
        DocumentTree::from_outline(&self.note_outline())
    }

    /// Whether headings past the cap were left out.
    pub fn truncated(&self) -> bool {
        self.scan.headings.len() > self.scan.texts.len()
    }

    /// At least the length of the JSON of the outline or the tree (and so of the
    /// strings they hold): each text escaped, its id at most twice the text plus the
    /// prefix and ordinal, and each record's keys.
    fn outline_json_len_bound(&self) -> usize {
        /// Keys, punctuation and the level of one heading or node.
        const RECORD: usize = 80;
        let head = 120
            + json::str_len(self.path.as_str())
            + self.title.as_deref().map_or(4, json::str_len);
        self.scan.texts.iter().fold(head, |total, t| {
            total.saturating_add(RECORD + json::str_len(t) + 2 * t.len() + 24)
        })
    }

    /// The `view` of this note, asking `charge` for the length of its JSON first.
    pub fn view_charged(
        self,
        view: View,
        charge: &mut dyn FnMut(usize) -> bool,
    ) -> Result<Document, ExtractError> {
        match view {
            View::SectionSource => self
                .section_source_charged(charge)
                .map(Document::SectionSource),
            View::NoteOutline | View::DocumentTree => {
                // The outline, then the tree copied from it, are held at once.
                let factor = if view == View::DocumentTree { 2 } else { 1 };
                if !charge(self.outline_json_len_bound().saturating_mul(factor)) {
                    return Err(ExtractError::TooCostly);
                }
                Ok(match view {
                    View::NoteOutline => Document::NoteOutline(self.note_outline()),
                    _ => Document::DocumentTree(self.document_tree()),
                })
            }
        }
    }
}

/// Builds the SectionSource for a stored note (spec §1.1): `body` is Markdown as-is.
pub fn build(
    path: &VaultPath,
    frontmatter: &Frontmatter,
    body: &str,
    limits: &Limits,
) -> Result<SectionSource, ExtractError> {
    build_charged(path, frontmatter, body, limits, &mut |_| true)
}

/// [`build`], asking `charge` for the length of the document's JSON before assembling
/// it: every `heading_path` repeats its ancestors' texts (spec §7), so a note of 150 KB
/// (one long heading over 499 short ones) makes a document of 500 MB. When `charge`
/// says no, [`ExtractError::TooCostly`].
pub fn build_charged(
    path: &VaultPath,
    frontmatter: &Frontmatter,
    body: &str,
    limits: &Limits,
    charge: &mut dyn FnMut(usize) -> bool,
) -> Result<SectionSource, ExtractError> {
    parse(path, frontmatter, body, limits)?.section_source_charged(charge)
}

/// Builds `view` of a stored note, asking `charge` for the length of its JSON before
/// assembling it (see [`build_charged`]).
pub fn build_view_charged(
    view: View,
    path: &VaultPath,
    frontmatter: &Frontmatter,
    body: &str,
    limits: &Limits,
    charge: &mut dyn FnMut(usize) -> bool,
) -> Result<Document, ExtractError> {
    parse(path, frontmatter, body, limits)?.view_charged(view, charge)
}

/// At least the length of the JSON [`assemble`] makes of `scan` (and so of the strings
/// the document holds): the texts' escaped lengths, each ancestor's once per
/// descendant, and slugs counted at twice their text (a lowercase mapping at most
/// grows a character by half).
fn json_len_bound(path: &VaultPath, title: Option<&str>, scan: &markdown::Scan) -> usize {
    /// Keys, punctuation, the level, the ordinal and the booleans of one section.
    const SECTION: usize = 200;
    let path_slug = 2 * path.as_str().len() + 4;
    let mut total = 100 + json::str_len(path.as_str()) + title.map_or(4, json::str_len);
    // (level, escaped length of the heading_path so far) of the open ancestors.
    let mut open: Vec<(u8, usize)> = Vec::new();
    for (text, h) in scan.texts.iter().zip(&scan.headings) {
        while open.last().is_some_and(|&(l, _)| l >= h.level) {
            open.pop();
        }
        let own = json::str_len(text);
        let heading_path = open.last().map_or(0, |&(_, p)| p) + own + 1;
        let heading_id = 2 * text.len() + 24;
        // The section id is written twice: in its section and in its parent's children.
        let section_id = path_slug + 1 + heading_id + 2;
        total = total.saturating_add(SECTION + 2 * section_id + heading_id + heading_path + own);
        open.push((h.level, heading_path));
    }
    total
}

/// Builds the SectionSource for a raw file: frontmatter split first (spec §1.2, §2).
pub fn build_from_raw(
    path: &VaultPath,
    text: &str,
    limits: &Limits,
) -> Result<SectionSource, ExtractError> {
    let (frontmatter, body) = yaml::split_raw(text);
    build(path, &frontmatter, body, limits)
}

/// Title from the file name: `.md`/`.markdown` dropped (any case), runs of `-`/`_` as
/// one space, trimmed; `None` when nothing is left (spec §5).
fn basename_title(name: &str) -> Option<String> {
    let stem = strip_suffix_ignore_ascii_case(name, ".markdown")
        .or_else(|| strip_suffix_ignore_ascii_case(name, ".md"))
        .unwrap_or(name);
    let mut out = String::with_capacity(stem.len());
    let mut in_run = false;
    for c in stem.chars() {
        if c == '-' || c == '_' {
            if !in_run {
                out.push(' ');
            }
            in_run = true;
        } else {
            out.push(c);
            in_run = false;
        }
    }
    let t = js::trim(&out);
    (!t.is_empty()).then(|| t.to_owned())
}

fn strip_suffix_ignore_ascii_case<'a>(s: &'a str, suffix: &str) -> Option<&'a str> {
    let cut = s.len().checked_sub(suffix.len())?;
    let (head, tail) = (s.get(..cut)?, s.get(cut..)?);
    tail.eq_ignore_ascii_case(suffix).then_some(head)
}

/// `slug(s)` of spec §7: JavaScript `toLowerCase`, everything outside `[a-z0-9-]` to
/// `-`, runs collapsed, ends stripped.
fn slug(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    push_slug(&mut out, s);
    out
}

/// Appends `slug(s)` to `out`; returns whether it is empty.
fn push_slug(out: &mut String, s: &str) -> bool {
    let start = out.len();
    // Start as if a dash was just written, so leading dashes never appear.
    let mut last_dash = true;
    let mut keep = |out: &mut String, c: char| {
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
            last_dash = false;
        } else if !last_dash {
            out.push('-');
            last_dash = true;
        }
    };
    let mut rest = s;
    while let Some(&b) = rest.as_bytes().first() {
        // ASCII lowercases to one ASCII char; only the rest needs the Unicode tables.
        if b.is_ascii() {
            keep(out, char::from(b.to_ascii_lowercase()));
            rest = rest.get(1..).unwrap_or_default();
        } else {
            let mut chars = rest.chars();
            if let Some(c) = chars.next() {
                c.to_lowercase().for_each(|l| keep(out, l));
            }
            rest = chars.as_str();
        }
    }
    if out.len() > start && out.ends_with('-') {
        out.pop();
    }
    out.len() == start
}

/// `h{level}-{slug of text, or "heading"}-{ordinal}`, the ordinal zero-padded to four
/// digits (spec §7).
fn heading_id(level: u8, text: &str, ordinal: usize) -> String {
    let mut id = String::with_capacity(text.len() + 12);
    id.push('h');
    json::push_u64(&mut id, u64::from(level));
    id.push('-');
    if push_slug(&mut id, text) {
        id.push_str("heading");
    }
    id.push('-');
    for pad in [1000, 100, 10] {
        if ordinal < pad {
            id.push('0');
        }
    }
    json::push_u64(&mut id, ordinal as u64);
    id
}

/// Nests the visible headings, computes ids and body availability (spec §7, §8).
fn assemble(path: &VaultPath, title: Option<String>, scan: markdown::Scan) -> SectionSource {
    let path_slug = match slug(path.as_str()) {
        s if s.is_empty() => "note".to_owned(),
        s => s,
    };
    let visible = scan.texts.len();
    let truncated = scan.headings.len() > visible;

    // End of each visible heading's range: the start of the first later heading (any,
    // visible or not) at the same or a shallower level, else the end of the body.
    let mut range_end = vec![scan.len; visible];
    let mut open: Vec<usize> = Vec::new();
    for (j, h) in scan.headings.iter().enumerate() {
        while let Some(&top) = open.last() {
            if scan.headings[top].level >= h.level {
                range_end[top] = h.start;
                open.pop();
            } else {
                break;
            }
        }
        if j < visible {
            open.push(j);
        } else if open.is_empty() {
            break;
        }
    }

    let mut sections: Vec<Section> = Vec::with_capacity(visible);
    // Stack of (section index, level); the root has level 0.
    let mut stack: Vec<(usize, u8)> = Vec::new();
    for (i, text) in scan.texts.into_iter().enumerate() {
        let h = scan.headings[i];
        while stack.last().is_some_and(|&(_, l)| l >= h.level) {
            stack.pop();
        }
        let heading_id = heading_id(h.level, &text, i + 1);
        let mut section_id = String::with_capacity(path_slug.len() + 1 + heading_id.len());
        section_id.push_str(&path_slug);
        section_id.push(':');
        section_id.push_str(&heading_id);
        let ancestors = match stack.last() {
            Some(&(p, _)) => sections[p].heading_path.as_slice(),
            None => &[],
        };
        let mut heading_path = Vec::with_capacity(ancestors.len() + 1);
        heading_path.extend_from_slice(ancestors);
        heading_path.push(text.clone());
        if let Some(&(p, _)) = stack.last() {
            sections[p].child_section_ids.push(section_id.clone());
        }
        let first_after = scan.body_starts.partition_point(|&s| s < h.end);
        let body_available = scan
            .body_starts
            .get(first_after)
            .is_some_and(|&s| s < range_end[i]);
        sections.push(Section {
            section_id,
            heading_id,
            level: h.level,
            heading_path,
            heading_text: text,
            child_section_ids: Vec::new(),
            body_available,
            body_returned: False,
            snippet_returned: False,
        });
        stack.push((i, h.level));
    }

    SectionSource {
        schema: Schema,
        path: path.as_str().to_owned(),
        title,
        sections,
        truncated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(path: &str, raw: &str) -> SectionSource {
        let path = crate::path::validate(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        build_from_raw(&path, raw, &Limits::default()).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn json_is_what_serde_json_makes_of_the_derive() {
        let notes = [
            ("a.md", ""),
            ("notes/x-y_z.md", "# One\n\n## Two\ntext\n### Three\n## Four\n# Five"),
            (
                "q.md",
                "---\ntitle: \"t \\\" \\\\ \\u0001 \\t é 😀\"\n---\n# \"quoted\" \\ back `code`\n\n\
                 para\n\n## ![alt *x*](i.png) &#0; &amp; \u{1}\u{7f}\n",
            ),
            ("deep.md", "# a\n## b\n### c\n#### d\n##### e\n###### f\n\nbody"),
        ];
        for (path, raw) in notes {
            let d = doc(path, raw);
            let serde = serde_json::to_string(&d).unwrap_or_default();
            assert_eq!(d.to_json(), serde, "{path}");
        }
        // Ordinals past four digits, and the heading cap.
        let many: String = (0..10_001).map(|i| format!("# h{i}\n")).collect();
        let d = doc("many.md", &many);
        assert!(d.truncated());
        assert_eq!(d.to_json(), serde_json::to_string(&d).unwrap_or_default());
        let limits = Limits {
            max_input_units: 1_000_000,
            max_headings: 20_000,
        };
        let path = crate::path::validate("many.md").unwrap_or_else(|e| panic!("{e}"));
        let d = build_from_raw(&path, &many, &limits).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(d.sections()[10_000].heading_id(), "h1-h10000-10001");
        assert_eq!(d.sections()[8].heading_id(), "h1-h8-0009");
        assert_eq!(d.to_json(), serde_json::to_string(&d).unwrap_or_default());
    }
}
