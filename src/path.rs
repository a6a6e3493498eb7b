//! Vault-relative path validation shared by every surface (wire contract §3).

use std::fmt;

/// A validated, normalized vault-relative path (wire contract §3, including the
/// sidecar's stricter rules). The only way to build one is [`validate`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VaultPath(String);

impl VaultPath {
    /// The normalized path, segments joined with `/`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for VaultPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a path was rejected. Never carries the input (rejections never echo it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Empty after trimming and dropping empty segments.
    #[error("path is empty")]
    Empty,
}

/// Validates and normalizes a vault-relative path.
pub fn validate(raw: &str) -> Result<VaultPath, PathError> {
    let joined = raw
        .split('/')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("/");
    if joined.is_empty() {
        return Err(PathError::Empty);
    }
    Ok(VaultPath(joined))
}
