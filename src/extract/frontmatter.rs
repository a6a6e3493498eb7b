//! Frontmatter as the gateway sees it: only `title` (and, for the REST scope filter,
//! `project`) is ever read (spec §2, §3, §5).

/// A frontmatter value as JavaScript holds it after `JSON.parse` or js-yaml `load`.
#[derive(Debug, Clone, PartialEq)]
pub enum FmValue {
    /// `null` (and YAML `~`, empty).
    Null,
    /// A boolean.
    Bool(bool),
    /// A number (IEEE double).
    Number(f64),
    /// A string.
    String(String),
    /// An array.
    Array(Vec<FmValue>),
    /// A plain object; only whether it has an own `toString` key matters.
    Object {
        /// `String()` throws on such an object.
        has_own_to_string: bool,
    },
}

/// `String()` threw (an object with its own `toString` key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("String() of the value throws")]
pub struct ToStringThrows;

impl FmValue {
    /// Converts a parsed JSON value.
    pub fn from_json(v: &serde_json::Value) -> FmValue {
        match v {
            serde_json::Value::Null => FmValue::Null,
            serde_json::Value::Bool(b) => FmValue::Bool(*b),
            serde_json::Value::Number(n) => FmValue::Number(n.as_f64().unwrap_or(f64::NAN)),
            serde_json::Value::String(s) => FmValue::String(s.clone()),
            serde_json::Value::Array(a) => FmValue::Array(a.iter().map(FmValue::from_json).collect()),
            serde_json::Value::Object(o) => FmValue::Object {
                has_own_to_string: o.contains_key("toString"),
            },
        }
    }

    /// JavaScript `String(value)`.
    pub fn js_string(&self) -> Result<String, ToStringThrows> {
        Ok(match self {
            FmValue::Null => "null".into(),
            FmValue::Bool(b) => b.to_string(),
            FmValue::Number(n) => super::js::number_to_string(*n),
            FmValue::String(s) => s.clone(),
            FmValue::Array(_) => String::new(),
            FmValue::Object { has_own_to_string: true } => return Err(ToStringThrows),
            FmValue::Object { .. } => "[object Object]".into(),
        })
    }
}

/// The only frontmatter fields the sidecar ever reads.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Frontmatter {
    /// The `title` value, if the key is present.
    pub title: Option<FmValue>,
    /// The `project` value, if present (REST scope filter only).
    pub project: Option<FmValue>,
}

/// Which surface's decoder to apply (spec §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    /// The REST route's decoder.
    Rest,
    /// The hosted MCP tool's decoder.
    Mcp,
}

/// The MCP decoder's unguarded `JSON.parse` threw (spec §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("frontmatter could not be decoded")]
pub struct FrontmatterError;

/// Decodes the canister's `frontmatter` field (`None` when absent) as `surface` does.
pub fn decode_stored(
    value: Option<&serde_json::Value>,
    _surface: Surface,
) -> Result<Frontmatter, FrontmatterError> {
    let Some(serde_json::Value::Object(o)) = value else {
        return Ok(Frontmatter::default());
    };
    Ok(Frontmatter {
        title: o.get("title").map(FmValue::from_json),
        project: o.get("project").map(FmValue::from_json),
    })
}
