//! The SectionSource v0 extractor: pure, no I/O (spec `section-source-v0.md`).
//!
//! Entry points: [`build`] for a stored note (path, decoded frontmatter, body) and
//! [`build_from_raw`] for a raw file (frontmatter split first). The output type
//! [`SectionSource`] has exactly the allowlisted fields.

pub mod frontmatter;
pub mod js;
pub mod yaml;

pub use frontmatter::{decode_stored, FmValue, Frontmatter, FrontmatterError, Surface};

use crate::path::VaultPath;

/// Why a note could not be turned into a SectionSource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ExtractError {
    /// The body is longer than the cap in UTF-16 code units (spec §10).
    #[error("note body exceeds the input cap")]
    TooLarge,
    /// `String()` of the title threw (spec §5).
    #[error("note title cannot be converted to a string")]
    TitleThrows,
}

/// Caps applied by the extractor (spec §6, §10).
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

/// A boolean that can only be `false`: bodies and snippets are never returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct False;

impl serde::Serialize for False {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bool(false)
    }
}

/// Builds the document for a stored note (spec §1.1).
pub fn build(
    path: &VaultPath,
    frontmatter: &Frontmatter,
    body: &str,
    limits: &Limits,
) -> Result<SectionSource, ExtractError> {
    let _ = (frontmatter, body, limits);
    Ok(SectionSource {
        schema: Schema,
        path: path.as_str().to_owned(),
        title: None,
        sections: Vec::new(),
        truncated: false,
    })
}

/// Builds the document for a raw file: frontmatter split first (spec §1.2, §2).
pub fn build_from_raw(
    path: &VaultPath,
    text: &str,
    limits: &Limits,
) -> Result<SectionSource, ExtractError> {
    let (frontmatter, body) = yaml::split_raw(text);
    build(path, &frontmatter, body, limits)
}
