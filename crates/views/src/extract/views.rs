//! The two other body-free views of a note, built from the same heading extraction as
//! SectionSource: NoteOutline v1 (the headings in document order) and DocumentTree v0
//! (the same headings nested by level).
//!
//! Both hold exactly the allowlisted fields: the schema, the normalized vault path, the
//! title, per heading its level, text and id, and `truncated`. Nothing else of a note
//! (body, frontmatter other than the title, offsets, lengths) is ever held in them.

use serde::Serialize;

use super::json;
use crate::path::VaultPath;

/// The schema name every NoteOutline carries.
pub const NOTE_OUTLINE_SCHEMA: &str = "knowtation.note_outline/v1";

/// The schema name every DocumentTree carries.
pub const DOCUMENT_TREE_SCHEMA: &str = "knowtation.document_tree/v0";

/// Most nodes a DocumentTree holds; later headings are left out and `truncated` set.
pub const MAX_DOCUMENT_TREE_NODES: usize = 500;

/// One heading of a [`NoteOutline`]: `{"level","text","id"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OutlineHeading {
    level: u8,
    text: String,
    id: String,
}

impl OutlineHeading {
    pub(super) fn new(level: u8, text: String, id: String) -> OutlineHeading {
        OutlineHeading { level, text, id }
    }

    /// Heading depth 1–6.
    pub fn level(&self) -> u8 {
        self.level
    }

    /// The normalized heading text (SectionSource's `heading_text`).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// `h{level}-{slug}-{ordinal}` (SectionSource's `heading_id`).
    pub fn id(&self) -> &str {
        &self.id
    }

    fn write_json(&self, out: &mut String) {
        out.push_str(r#"{"level":"#);
        json::push_u64(out, u64::from(self.level));
        out.push_str(r#","text":"#);
        json::push_str(out, &self.text);
        out.push_str(r#","id":"#);
        json::push_str(out, &self.id);
        out.push('}');
    }
}

/// The `knowtation.note_outline/v1` document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NoteOutline {
    schema: OutlineSchema,
    path: String,
    title: Option<String>,
    headings: Vec<OutlineHeading>,
    truncated: bool,
}

/// The constant schema name, serialized as a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct OutlineSchema;

impl Serialize for OutlineSchema {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(NOTE_OUTLINE_SCHEMA)
    }
}

impl NoteOutline {
    pub(super) fn new(
        path: &VaultPath,
        title: Option<String>,
        headings: Vec<OutlineHeading>,
        truncated: bool,
    ) -> NoteOutline {
        NoteOutline {
            schema: OutlineSchema,
            path: path.as_str().to_owned(),
            title,
            headings,
            truncated,
        }
    }

    /// The document as compact JSON, escaped as `JSON.stringify` escapes.
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(self.json_len_hint());
        self.write_json(&mut out);
        out
    }

    /// Appends [`Self::to_json`] to `out`: what `serde_json` makes of the derived
    /// `Serialize`, written directly.
    pub fn write_json(&self, out: &mut String) {
        write_head(out, NOTE_OUTLINE_SCHEMA, &self.path, self.title.as_deref());
        out.push_str(r#","headings":["#);
        for (i, h) in self.headings.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            h.write_json(out);
        }
        out.push_str(r#"],"truncated":"#);
        out.push_str(if self.truncated { "true}" } else { "false}" });
    }

    fn json_len_hint(&self) -> usize {
        80 + 2 * self.path.len()
            + self.title.as_ref().map_or(4, String::len)
            + self
                .headings
                .iter()
                .map(|h| 40 + h.text.len() + h.id.len())
                .sum::<usize>()
    }

    /// The normalized vault path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The title, if any.
    pub fn title(&self) -> Option<&str> {
        self.title.as_deref()
    }

    /// The visible headings in document order.
    pub fn headings(&self) -> &[OutlineHeading] {
        &self.headings
    }

    /// Whether headings past the cap were left out.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// The DocumentTree of these headings (see [`DocumentTree::from_outline`]).
    pub fn document_tree(&self) -> DocumentTree {
        DocumentTree::from_outline(self)
    }
}

/// `{"schema":…,"path":…,"title":…` of either view.
fn write_head(out: &mut String, schema: &str, path: &str, title: Option<&str>) {
    out.push_str(r#"{"schema":"#);
    json::push_str(out, schema);
    out.push_str(r#","path":"#);
    json::push_str(out, path);
    out.push_str(r#","title":"#);
    match title {
        Some(t) => json::push_str(out, t),
        None => out.push_str("null"),
    }
}

/// One node of a [`DocumentTree`]: `{"id","level","text","children"}`. Children are
/// deeper than their parent, so a tree is at most six nodes deep.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TreeNode {
    id: String,
    level: u8,
    text: String,
    children: Vec<TreeNode>,
}

impl TreeNode {
    /// The heading id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Heading depth 1–6.
    pub fn level(&self) -> u8 {
        self.level
    }

    /// The heading text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The headings nested under this one, in document order.
    pub fn children(&self) -> &[TreeNode] {
        &self.children
    }

    fn write_json(&self, out: &mut String) {
        out.push_str(r#"{"id":"#);
        json::push_str(out, &self.id);
        out.push_str(r#","level":"#);
        json::push_u64(out, u64::from(self.level));
        out.push_str(r#","text":"#);
        json::push_str(out, &self.text);
        out.push_str(r#","children":"#);
        write_nodes(out, &self.children);
        out.push('}');
    }
}

fn write_nodes(out: &mut String, nodes: &[TreeNode]) {
    out.push('[');
    for (i, n) in nodes.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        n.write_json(out);
    }
    out.push(']');
}

/// The root of a [`DocumentTree`]: only its children.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TreeRoot {
    children: Vec<TreeNode>,
}

/// The `knowtation.document_tree/v0` document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DocumentTree {
    schema: TreeSchema,
    path: String,
    title: Option<String>,
    root: TreeRoot,
    truncated: bool,
}

/// The constant schema name, serialized as a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TreeSchema;

impl Serialize for TreeSchema {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(DOCUMENT_TREE_SCHEMA)
    }
}

/// An outline heading as a caller hands it to [`DocumentTree::from_records`]: the
/// fields of a NoteOutline heading, not yet checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadingRecord {
    /// The heading's level; 1–6 is valid.
    pub level: i64,
    /// Its text.
    pub text: String,
    /// Its id; absent or empty is invalid.
    pub id: Option<String>,
}

/// Why heading records make no DocumentTree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TreeError {
    /// A level outside 1–6.
    #[error("heading.level must be an integer from 1 to 6")]
    Level,
    /// No id, or an empty one.
    #[error("heading.id must be a non-empty string")]
    Id,
}

impl DocumentTree {
    /// Nests the headings of `outline`: each heading is a child of the nearest
    /// preceding heading of a smaller level, else of the root. At most
    /// [`MAX_DOCUMENT_TREE_NODES`] nodes, the first in document order; `truncated` when
    /// the outline was truncated or nodes were left out.
    pub fn from_outline(outline: &NoteOutline) -> DocumentTree {
        let items = outline
            .headings
            .iter()
            .map(|h| (h.level, h.text.as_str(), h.id.as_str()));
        let (root, dropped) = nest(items);
        DocumentTree {
            schema: TreeSchema,
            path: outline.path.clone(),
            title: outline.title.clone(),
            root: TreeRoot { children: root },
            truncated: outline.truncated || dropped,
        }
    }

    /// [`Self::from_outline`] for outline headings from elsewhere: a level outside 1–6
    /// or a missing id is an error, not a node.
    pub fn from_records(
        path: &VaultPath,
        title: Option<String>,
        headings: &[HeadingRecord],
        truncated: bool,
    ) -> Result<DocumentTree, TreeError> {
        let mut items = Vec::with_capacity(headings.len());
        for h in headings {
            let level = u8::try_from(h.level)
                .ok()
                .filter(|l| (1..=6).contains(l))
                .ok_or(TreeError::Level)?;
            let id =
                h.id.as_deref()
                    .filter(|i| !i.is_empty())
                    .ok_or(TreeError::Id)?;
            items.push((level, h.text.as_str(), id));
        }
        let (root, dropped) = nest(items.into_iter());
        Ok(DocumentTree {
            schema: TreeSchema,
            path: path.as_str().to_owned(),
            title,
            root: TreeRoot { children: root },
            truncated: truncated || dropped,
        })
    }

    /// The document as compact JSON, escaped as `JSON.stringify` escapes.
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(80 + 2 * self.path.len() + 64 * self.node_count());
        self.write_json(&mut out);
        out
    }

    /// Appends [`Self::to_json`] to `out`: what `serde_json` makes of the derived
    /// `Serialize`, written directly.
    pub fn write_json(&self, out: &mut String) {
        write_head(out, DOCUMENT_TREE_SCHEMA, &self.path, self.title.as_deref());
        out.push_str(r#","root":{"children":"#);
        write_nodes(out, &self.root.children);
        out.push_str(r#"},"truncated":"#);
        out.push_str(if self.truncated { "true}" } else { "false}" });
    }

    /// The normalized vault path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The title, if any.
    pub fn title(&self) -> Option<&str> {
        self.title.as_deref()
    }

    /// The top-level nodes (the root's children).
    pub fn children(&self) -> &[TreeNode] {
        &self.root.children
    }

    /// Whether headings were left out (by the outline's cap or the node cap).
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// Every node in pre-order, which is document order.
    pub fn nodes(&self) -> Vec<&TreeNode> {
        fn walk<'a>(nodes: &'a [TreeNode], out: &mut Vec<&'a TreeNode>) {
            for n in nodes {
                out.push(n);
                walk(&n.children, out);
            }
        }
        let mut out = Vec::new();
        walk(&self.root.children, &mut out);
        out
    }

    /// How many nodes the tree holds.
    pub fn node_count(&self) -> usize {
        fn count(nodes: &[TreeNode]) -> usize {
            nodes.iter().map(|n| 1 + count(&n.children)).sum()
        }
        count(&self.root.children)
    }
}

/// Nests `(level, text, id)` items in order with a stack of open levels; the first
/// [`MAX_DOCUMENT_TREE_NODES`] only. Returns the root's children and whether any item
/// was left out.
fn nest<'a>(items: impl Iterator<Item = (u8, &'a str, &'a str)>) -> (Vec<TreeNode>, bool) {
    // Each open node is built in its own frame and attached to its parent (or the root)
    // when a heading at its level or shallower closes it.
    let mut root: Vec<TreeNode> = Vec::new();
    let mut open: Vec<TreeNode> = Vec::new();
    let mut dropped = false;
    let close = |open: &mut Vec<TreeNode>, root: &mut Vec<TreeNode>| {
        if let Some(node) = open.pop() {
            match open.last_mut() {
                Some(parent) => parent.children.push(node),
                None => root.push(node),
            }
        }
    };
    for (taken, (level, text, id)) in items.enumerate() {
        if taken == MAX_DOCUMENT_TREE_NODES {
            dropped = true;
            break;
        }
        while open.last().is_some_and(|n| n.level >= level) {
            close(&mut open, &mut root);
        }
        open.push(TreeNode {
            id: id.to_owned(),
            level,
            text: text.to_owned(),
            children: Vec::new(),
        });
    }
    while !open.is_empty() {
        close(&mut open, &mut root);
    }
    (root, dropped)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn record(level: i64, text: &str, id: Option<&str>) -> HeadingRecord {
        HeadingRecord {
            level,
            text: text.to_owned(),
            id: id.map(str::to_owned),
        }
    }

    #[test]
    fn skipped_levels_nest_under_the_closest_shallower_ancestor() {
        let p = crate::path::validate("notes/a.md").unwrap();
        let hs = [
            record(1, "A", Some("h1-a-0001")),
            record(3, "B", Some("h3-b-0002")),
            record(2, "C", Some("h2-c-0003")),
            record(1, "D", Some("h1-d-0004")),
        ];
        let t = DocumentTree::from_records(&p, None, &hs, false).unwrap();
        let shape: Vec<(&str, Vec<&str>)> = t
            .children()
            .iter()
            .map(|n| (n.text(), n.children().iter().map(TreeNode::text).collect()))
            .collect();
        assert_eq!(shape, vec![("A", vec!["B", "C"]), ("D", vec![])]);
        assert_eq!(
            t.to_json(),
            serde_json::to_string(&t).unwrap(),
            "direct JSON is serde's"
        );
    }

    #[test]
    fn invalid_records_are_errors() {
        let p = crate::path::validate("a.md").unwrap();
        for (bad, want) in [
            (record(7, "x", Some("h7-x-0001")), TreeError::Level),
            (record(0, "x", Some("h0-x-0001")), TreeError::Level),
            (record(-1, "x", Some("x")), TreeError::Level),
            (record(1, "x", None), TreeError::Id),
            (record(1, "x", Some("")), TreeError::Id),
        ] {
            assert_eq!(
                DocumentTree::from_records(&p, None, &[bad], false),
                Err(want)
            );
        }
    }

    #[test]
    fn the_node_cap_truncates() {
        let p = crate::path::validate("a.md").unwrap();
        let hs: Vec<HeadingRecord> = (1..=501)
            .map(|n| {
                record(
                    1,
                    &format!("Heading {n}"),
                    Some(&format!("h1-heading-{n:04}")),
                )
            })
            .collect();
        let t = DocumentTree::from_records(&p, None, &hs, false).unwrap();
        assert_eq!(t.node_count(), 500);
        assert!(t.truncated());
        let t = DocumentTree::from_records(&p, None, &hs[..500], false).unwrap();
        assert!(!t.truncated());
        let t = DocumentTree::from_records(&p, None, &hs[..2], true).unwrap();
        assert!(t.truncated(), "an outline's truncation carries over");
    }
}
