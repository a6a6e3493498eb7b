//! The operator's policy for the body-free views: who answers each view (`[views]`:
//! `own`, `pass` or `deny`), and which session roles may list and call the views the
//! sidecar owns (wire contract §6 ACL). The defaults: the sidecar owns all three views,
//! and every role may use them, as the gateway lets `viewer`, `editor`, `evaluator`,
//! `admin` and any other role (which it treats as `viewer`) use `get_section_source`.

use std::collections::HashMap;
use std::path::Path;

use figment::providers::{Format, Toml};
use figment::Figment;
use serde::Deserialize;

use crate::config::ConfigError;
use crate::extract::View;

/// Largest policy file read.
const MAX_POLICY_BYTES: u64 = 64 * 1024;

/// Most roles a policy may name.
const MAX_ROLES: usize = 1024;

/// Allow or deny.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    /// The role may list and call the tool.
    Allow,
    /// The tool is hidden from the role and calling it gets the unknown-tool answer.
    Deny,
}

/// Who answers one view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ViewMode {
    /// The sidecar answers it (tool, REST route) and lists its tool: the gateway never
    /// runs it.
    #[default]
    Own,
    /// The gateway's own, untouched: for a gateway that serves the view and is trusted.
    Pass,
    /// Hidden from `tools/list` and refused as an unknown tool (its REST route as a
    /// route that does not exist); the gateway never runs it.
    Deny,
}

/// `[views]`: one mode per view, each `own` unless set.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ViewsTable {
    #[serde(default, rename = "section-source")]
    section_source: ViewMode,
    #[serde(default, rename = "note-outline")]
    note_outline: ViewMode,
    #[serde(default, rename = "document-tree")]
    document_tree: ViewMode,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    /// The decision for a role not listed in `roles`.
    #[serde(default = "allow")]
    default: Decision,
    #[serde(default)]
    roles: HashMap<String, Decision>,
    #[serde(default)]
    views: ViewsTable,
}

fn allow() -> Decision {
    Decision::Allow
}

/// The loaded policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    default: Decision,
    roles: HashMap<String, Decision>,
    /// Indexed by [`view_index`].
    views: [ViewMode; 3],
}

impl Default for Policy {
    /// Every view owned by the sidecar, and every role allowed, as the gateway allows
    /// them.
    fn default() -> Self {
        Policy {
            default: Decision::Allow,
            roles: HashMap::new(),
            views: [ViewMode::Own; 3],
        }
    }
}

/// The position of `view` in [`View::ALL`].
pub(crate) fn view_index(view: View) -> usize {
    match view {
        View::SectionSource => 0,
        View::NoteOutline => 1,
        View::DocumentTree => 2,
    }
}

impl Policy {
    /// Parses a policy from TOML text (`default = "allow"|"deny"` and a `[roles]` table).
    pub fn parse(text: &str) -> Result<Policy, ConfigError> {
        let file: PolicyFile = Figment::from(Toml::string(text)).extract().map_err(|e| {
            let message = match e.into_iter().next() {
                Some(first) => match crate::config::explain(&first) {
                    (path, what) if path.is_empty() => format!("invalid policy: {what}"),
                    (path, what) => format!("invalid policy: {}: {what}", path.join(".")),
                },
                None => "invalid policy".to_owned(),
            };
            ConfigError::new("mcp.policy_file", message)
        })?;
        if file.roles.len() > MAX_ROLES {
            return Err(ConfigError::new(
                "mcp.policy_file",
                format!("at most {MAX_ROLES} roles"),
            ));
        }
        let v = file.views;
        Ok(Policy {
            default: file.default,
            roles: file.roles,
            views: [v.section_source, v.note_outline, v.document_tree],
        })
    }

    /// Reads and parses the policy file at `path` (bounded).
    pub fn load(path: &Path) -> Result<Policy, ConfigError> {
        use std::io::Read;
        let err = |m: String| ConfigError::new("mcp.policy_file", m);
        let file = std::fs::File::open(path)
            .map_err(|e| err(format!("cannot open {}: {e}", path.display())))?;
        let mut text = String::new();
        file.take(MAX_POLICY_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|e| err(format!("cannot read {}: {e}", path.display())))?;
        if text.len() as u64 > MAX_POLICY_BYTES {
            return Err(err(format!(
                "{} is larger than {MAX_POLICY_BYTES} bytes",
                path.display()
            )));
        }
        // Errors in the file name it: the key alone points at the config, not the policy.
        Policy::parse(&text).map_err(|e| err(format!("{}: {}", path.display(), e.message)))
    }

    /// Whether `role` may list and call the views the sidecar owns.
    pub fn allows(&self, role: &str) -> bool {
        self.roles.get(role).copied().unwrap_or(self.default) == Decision::Allow
    }

    /// Who answers `view`.
    pub fn mode(&self, view: View) -> ViewMode {
        self.views[view_index(view)]
    }

    /// Sets who answers `view` (for tests and embedders).
    pub fn set_mode(&mut self, view: View, mode: ViewMode) {
        self.views[view_index(view)] = mode;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn s6_default_allows_every_role() {
        let p = Policy::default();
        for role in ["viewer", "editor", "evaluator", "admin", "someone-new"] {
            assert!(p.allows(role));
        }
    }

    #[test]
    fn s6_shipped_policy_matches_the_gateway() {
        let text = include_str!("../../policy/mcp-tools.toml");
        let p = Policy::parse(text).unwrap();
        for role in ["viewer", "editor", "evaluator", "admin", "someone-new"] {
            assert!(p.allows(role), "{role}");
        }
    }

    #[test]
    fn views_are_owned_unless_the_file_says_otherwise() {
        let p = Policy::default();
        for v in View::ALL {
            assert_eq!(p.mode(v), ViewMode::Own, "{v:?}");
        }
        let text = include_str!("../../policy/mcp-tools.toml");
        let shipped = Policy::parse(text).unwrap();
        for v in View::ALL {
            assert_eq!(shipped.mode(v), ViewMode::Own, "shipped: {v:?}");
        }
        let p =
            Policy::parse("[views]\nnote-outline = \"pass\"\ndocument-tree = \"deny\"\n").unwrap();
        assert_eq!(p.mode(View::SectionSource), ViewMode::Own);
        assert_eq!(p.mode(View::NoteOutline), ViewMode::Pass);
        assert_eq!(p.mode(View::DocumentTree), ViewMode::Deny);
        // Unknown views and modes are refused, not ignored.
        for bad in [
            "[views]\nsection_source = \"pass\"\n",
            "[views]\nnote-outline = \"allow\"\n",
            "[views]\nnote-outline = \"Own\"\n",
            "views = \"own\"\n",
        ] {
            assert!(Policy::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn s6_deny_by_role_and_by_default() {
        let p = Policy::parse("default = \"deny\"\n[roles]\nadmin = \"allow\"\n").unwrap();
        assert!(p.allows("admin"));
        assert!(!p.allows("viewer"));
        assert!(Policy::parse("[roles]\nviewer = \"maybe\"\n").is_err());
        assert!(Policy::parse("surprise = 1\n").is_err());
    }
}
