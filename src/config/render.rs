//! The configuration as TOML with secrets redacted: what `check-config` prints.

use super::Config;

/// The effective configuration as TOML, secrets shown as `<redacted>`. Every key is
/// listed: an unset optional key (TOML has no null) as a comment, `# key = unset`.
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
            match toml_value(&value) {
                Some(v) => out.push_str(&format!("{key} = {v}\n")),
                None => out.push_str(&format!("# {key} = unset\n")),
            }
        }
    }
    out
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
