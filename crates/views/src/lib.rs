//! The body-free views of a Knowtation note, and the rules they rest on.
//!
//! - [`extract`]: SectionSource v0, NoteOutline v1 and DocumentTree v0 from a note's
//!   Markdown and frontmatter, byte for byte as the hub's reference computes them, with
//!   the frontmatter and YAML decoding they need.
//! - [`path`]: the vault-path rules every surface applies before a note is read.
//! - [`js`]: the ECMAScript semantics the hub's JavaScript gives strings and numbers.
//! - [`json_cost`]: what a JSON parse will hold in memory, counted before the parse.
//!
//! Pure: no I/O, no async, no HTTP types. It depends on no other crate of the
//! knowtation-sidecar workspace, so any Rust program can compute the views on its own:
//!
//! ```
//! use knowtation_views::extract::{parse_from_raw, Limits};
//! use knowtation_views::path::validate;
//!
//! let path = validate("projects/plan.md").expect("a vault path");
//! let note = "---\ntitle: Plan\n---\n# Goals\n\nbody text\n\n## Risks\n";
//! let headings = parse_from_raw(&path, note, &Limits::default()).expect("a note");
//! let outline = headings.note_outline();
//! let tree = outline.document_tree();
//! let sections = headings.section_source();
//! for json in [outline.to_json(), tree.to_json(), sections.to_json()] {
//!     assert!(json.contains("Goals") && json.contains("Risks"));
//!     assert!(!json.contains("body text")); // body-free
//! }
//! ```
#![forbid(unsafe_code)]

pub mod extract;
pub mod js;
pub mod json_cost;
pub mod path;
