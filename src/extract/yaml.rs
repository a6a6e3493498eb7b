//! Raw-file frontmatter: the split and a js-yaml-compatible reading of `title`
//! (spec §2, §5).

use super::frontmatter::Frontmatter;

/// Splits a raw file into its frontmatter and its body (spec §2).
pub fn split_raw(text: &str) -> (Frontmatter, &str) {
    (Frontmatter::default(), super::js::trim_end(text))
}
