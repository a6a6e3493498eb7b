//! The operator's tool policy (wire contract §6 ACL): which session roles may list and
//! call `get_section_source`. The default is the gateway's: `viewer`, `editor`,
//! `evaluator`, `admin` and any other role (which the gateway treats as `viewer`).

use std::collections::HashMap;
use std::path::Path;

use figment::providers::{Format, Toml};
use figment::Figment;
use serde::Deserialize;

use crate::config::ConfigError;

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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    /// The decision for a role not listed in `roles`.
    #[serde(default = "allow")]
    default: Decision,
    #[serde(default)]
    roles: HashMap<String, Decision>,
}

fn allow() -> Decision {
    Decision::Allow
}

/// The loaded policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    default: Decision,
    roles: HashMap<String, Decision>,
}

impl Default for Policy {
    /// The gateway's behaviour: every role allowed.
    fn default() -> Self {
        Policy {
            default: Decision::Allow,
            roles: HashMap::new(),
        }
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
        Ok(Policy {
            default: file.default,
            roles: file.roles,
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

    /// Whether `role` may list and call `get_section_source`.
    pub fn allows(&self, role: &str) -> bool {
        self.roles.get(role).copied().unwrap_or(self.default) == Decision::Allow
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
    fn s6_deny_by_role_and_by_default() {
        let p = Policy::parse("default = \"deny\"\n[roles]\nadmin = \"allow\"\n").unwrap();
        assert!(p.allows("admin"));
        assert!(!p.allows("viewer"));
        assert!(Policy::parse("[roles]\nviewer = \"maybe\"\n").is_err());
        assert!(Policy::parse("surprise = 1\n").is_err());
    }
}
