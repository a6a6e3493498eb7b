//! The configuration as TOML with secrets redacted: what `check-config` prints.

use super::{Config, Secret, SecretOrigin, ENV_PREFIX};

/// The effective configuration as TOML. Every key is listed: an unset optional key (TOML
/// has no null) as a comment, `# key = unset`. A secret is never printed in a form that
/// loads: each secret key that holds any is a comment saying how many there are and
/// where each came from, so the output, used as a configuration, holds no secret (the
/// `*_file` keys still name their files).
pub fn to_toml(config: &Config) -> String {
    let mut out = String::new();
    let Ok(serde_json::Value::Object(sections)) = serde_json::to_value(config) else {
        return out;
    };
    for (section, fields) in sections {
        let serde_json::Value::Object(fields) = fields else {
            continue;
        };
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&format!("[{section}]\n"));
        for (key, value) in fields {
            let secrets: &[Secret] = match (section.as_str(), key.as_str()) {
                ("upstream", "gateway_secret") => config.upstream.gateway_secret.as_slice(),
                ("auth", "jwt_secrets") => &config.auth.jwt_secrets,
                _ => {
                    match toml_value(&value) {
                        Some(v) => out.push_str(&format!("{key} = {v}\n")),
                        None => out.push_str(&format!("# {key} = unset\n")),
                    }
                    continue;
                }
            };
            out.push_str(&redacted_line(&section, &key, secrets, value.is_array()));
        }
    }
    out
}

/// The line for a secret key: a comment naming where each secret came from, or the
/// empty value when there are none.
fn redacted_line(section: &str, key: &str, secrets: &[Secret], list: bool) -> String {
    if secrets.is_empty() {
        return if list {
            format!("{key} = []\n")
        } else {
            format!("# {key} = unset\n")
        };
    }
    // Runs of one origin, in order: the first secret is the one that matters most.
    let mut runs: Vec<(SecretOrigin, usize)> = Vec::new();
    for secret in secrets {
        match runs.last_mut() {
            Some((origin, n)) if *origin == secret.origin() => *n += 1,
            _ => runs.push((secret.origin(), 1)),
        }
    }
    let from = |origin: SecretOrigin| match origin {
        SecretOrigin::ConfigFile => "the config file".to_owned(),
        SecretOrigin::Environment => format!(
            "the environment ({ENV_PREFIX}{}__{})",
            section.to_ascii_uppercase(),
            key.to_ascii_uppercase()
        ),
        SecretOrigin::SecretFile => format!("{key}_file"),
    };
    let what = match (list, secrets) {
        (false, [one]) => format!("redacted, from {}", from(one.origin())),
        _ => {
            let runs: Vec<String> = runs
                .iter()
                .map(|(origin, n)| format!("{n} from {}", from(*origin)))
                .collect();
            format!("{} redacted: {}", secrets.len(), runs.join(", then "))
        }
    };
    format!("# {key} = <{what}>\n")
}

/// One TOML value. A JSON string literal is a valid TOML basic string (same escapes).
fn toml_value(value: &serde_json::Value) -> Option<String> {
    match value {
        serde_json::Value::Null => None,
        serde_json::Value::Bool(b) => Some(b.to_string()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        serde_json::Value::String(_) => Some(value.to_string()),
        serde_json::Value::Array(items) => Some(format!(
            "[{}]",
            items
                .iter()
                .filter_map(toml_value)
                .collect::<Vec<_>>()
                .join(", ")
        )),
        serde_json::Value::Object(map) => Some(format!(
            "{{ {} }}",
            map.iter()
                .filter_map(|(k, v)| toml_value(v).map(|v| format!("{k} = {v}")))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}
