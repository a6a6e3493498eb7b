//! Loading: built-in defaults, then a TOML file, then `KNOWTATION_SIDECAR_<SECTION>__<KEY>`
//! environment variables, then the secret files the result names. Files are read with a
//! size bound; every error names the key it is about and never shows a secret.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use figment::error::{Actual, Kind};
use figment::providers::{Format, Serialized, Toml};
use figment::value::Value;
use figment::{Figment, Provider};

use super::{validate, Config, ConfigError, Secret, SecretOrigin, DEFAULT_CONFIG_PATH, ENV_PREFIX};

/// A config file larger than this is refused (it is a few hundred bytes in practice).
const MAX_CONFIG_FILE_BYTES: u64 = 1024 * 1024;

/// A secret file larger than this is refused.
const MAX_SECRET_FILE_BYTES: u64 = 64 * 1024;

/// Keys whose environment value is taken verbatim as a string. Everything else is parsed
/// as a TOML-like scalar; these must not be, or a secret such as `12345` or `true…`
/// would turn into a number or a boolean.
const ENV_STRING_KEYS: &[&str] = &[
    "listen.address",
    "listen.tls_cert_file",
    "listen.tls_key_file",
    "admin.address",
    "upstream.gateway_url",
    "upstream.canister_url",
    "upstream.bridge_url",
    "upstream.gateway_secret",
    "upstream.gateway_secret_file",
    "upstream.ca_file",
    "auth.jwt_secrets_file",
    "mcp.policy_file",
    "state.directory",
    "log.level",
    "tracing.endpoint",
    "tracing.service_name",
];

/// Keys holding a list of strings. From the environment they are comma-separated
/// (`a,b`; items trimmed, empty items dropped), or, when the value starts with `[`, an
/// array of double-quoted strings (`["a", "b,c"]`).
const ENV_LIST_KEYS: &[&str] = &[
    "auth.jwt_secrets",
    "cors.allowed_origins",
    "forwarded.trusted_proxies",
    "mcp.allowed_origins",
];

/// Keys whose values are secrets: errors about them never quote the value, and
/// `check-config` prints them only as comments.
const SECRET_KEYS: &[&str] = &["upstream.gateway_secret", "auth.jwt_secrets"];

/// Loads the configuration: built-in defaults, then the TOML file (`file`, or
/// [`DEFAULT_CONFIG_PATH`] when it exists), then `KNOWTATION_SIDECAR_<SECTION>__<KEY>`
/// environment variables; then reads the `*_file` secrets and validates everything.
pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
    let mut env = Vec::new();
    for (name, value) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        if !has_env_prefix(name) {
            continue;
        }
        let value = value
            .into_string()
            .map_err(|_| ConfigError::new(name, "value is not valid UTF-8"))?;
        env.push((name.to_owned(), value));
    }
    load_with_env(resolve_file(file).as_deref(), &env)
}

/// The file [`load`] reads: `explicit` (`--config`), else [`DEFAULT_CONFIG_PATH`] when it
/// exists, else none (defaults and the environment only).
pub fn resolve_file(explicit: Option<&Path>) -> Option<PathBuf> {
    let default = Path::new(DEFAULT_CONFIG_PATH);
    match explicit {
        Some(f) => Some(f.to_path_buf()),
        None if default.exists() => Some(default.to_path_buf()),
        None => None,
    }
}

/// [`load`] with an explicit file and environment (name, value) pairs; variables without
/// the [`ENV_PREFIX`] are ignored. The process environment is not read.
pub fn load_with_env(file: Option<&Path>, env: &[(String, String)]) -> Result<Config, ConfigError> {
    let mut figment = Figment::new();
    if let Some(path) = file {
        let text = read_bounded(path, MAX_CONFIG_FILE_BYTES)
            .map_err(|e| ConfigError::new(path.display().to_string(), e))?;
        let toml = Toml::string(&text);
        // Syntax first, so the error names the file rather than a key.
        if let Err(e) = toml.data() {
            return Err(ConfigError::new(
                path.display().to_string(),
                format!("not valid TOML: {}", e.kind),
            ));
        }
        figment = figment.merge(toml);
    }
    let known = known_keys();
    let mut from_env = Vec::new();
    for (name, raw) in env {
        if !has_env_prefix(name) {
            continue;
        }
        let key = env_key(name, &known)?;
        let value = if ENV_LIST_KEYS.contains(&key.as_str()) {
            env_list(name, raw)?
        } else if ENV_STRING_KEYS.contains(&key.as_str()) {
            Value::from(raw.clone())
        } else {
            // Numbers, booleans and enum names; figment's parser never fails.
            raw.parse::<Value>().unwrap_or_else(|never| match never {})
        };
        figment = figment.merge(Serialized::global(&key, value));
        from_env.push(key);
    }
    let mut config: Config = figment.extract().map_err(from_figment)?;
    // A key set in the environment replaces the file's value whole (lists included).
    let env_set = |key: &str| from_env.iter().any(|k| k == key);
    if env_set("upstream.gateway_secret") {
        if let Some(secret) = &mut config.upstream.gateway_secret {
            secret.origin = SecretOrigin::Environment;
        }
    }
    if env_set("auth.jwt_secrets") {
        for secret in &mut config.auth.jwt_secrets {
            secret.origin = SecretOrigin::Environment;
        }
    }
    resolve_secret_files(&mut config)?;
    validate(&config)?;
    Ok(config)
}

fn has_env_prefix(name: &str) -> bool {
    name.get(..ENV_PREFIX.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(ENV_PREFIX))
}

/// `KNOWTATION_SIDECAR_UPSTREAM__GATEWAY_URL` → `upstream.gateway_url`, or an error
/// naming the variable when it names no setting.
fn env_key(name: &str, known: &[String]) -> Result<String, ConfigError> {
    let rest = name.get(ENV_PREFIX.len()..).unwrap_or_default();
    let key = match rest.split_once("__") {
        Some((section, key)) if !section.is_empty() && !key.is_empty() => {
            format!("{section}.{key}").to_ascii_lowercase()
        }
        _ => {
            return Err(ConfigError::new(
                name,
                format!("not a setting; use {ENV_PREFIX}<SECTION>__<KEY>"),
            ))
        }
    };
    if !known.contains(&key) {
        return Err(ConfigError::new(
            name,
            format!("unknown key `{key}` (from the environment)"),
        ));
    }
    Ok(key)
}

/// Every `section.key` of the schema.
fn known_keys() -> Vec<String> {
    let mut keys = Vec::new();
    if let Ok(serde_json::Value::Object(sections)) = serde_json::to_value(Config::default()) {
        for (section, fields) in sections {
            if let serde_json::Value::Object(fields) = fields {
                keys.extend(fields.keys().map(|k| format!("{section}.{k}")));
            }
        }
    }
    keys
}

fn env_list(name: &str, raw: &str) -> Result<Value, ConfigError> {
    let trimmed = raw.trim();
    if trimmed.starts_with('[') {
        let bad = || {
            ConfigError::new(
                name,
                "expected an array of double-quoted strings, or a comma-separated list",
            )
        };
        let parsed = trimmed
            .parse::<Value>()
            .unwrap_or_else(|never| match never {});
        let Value::Array(_, items) = parsed else {
            return Err(bad());
        };
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            match item {
                Value::String(_, s) => out.push(Value::from(s)),
                _ => return Err(bad()),
            }
        }
        return Ok(Value::from(out));
    }
    let items: Vec<Value> = trimmed
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| Value::from(s.to_owned()))
        .collect();
    Ok(Value::from(items))
}

/// Maps the first figment error to a [`ConfigError`] naming its key, in the words of the
/// file rather than of the schema's Rust types; a secret's value is never quoted.
fn from_figment(err: figment::Error) -> ConfigError {
    let Some(first) = err.into_iter().next() else {
        return ConfigError::new("config", "invalid configuration");
    };
    let (path, message) = explain(&first);
    let key = if path.is_empty() {
        "config".to_owned()
    } else {
        path.join(".")
    };
    let message = if key == "auth.jwt_secrets"
        && matches!(&first.kind, Kind::InvalidType(Actual::Str(_), _))
    {
        // The commonest slip: one secret where a list is needed.
        "must be a list of strings, such as jwt_secrets = [\"<current>\", \"<previous>\"] \
         (or set auth.jwt_secrets_file, one secret per line); the value is not shown \
         because it is a secret"
            .to_owned()
    } else if SECRET_KEYS.iter().any(|s| key.starts_with(s)) {
        "invalid value (must be a string; not shown because it is a secret)".to_owned()
    } else if ADDRESS_KEYS.contains(&key.as_str()) && matches!(&first.kind, Kind::Message(_)) {
        "not an address: expected IP:PORT, such as \"0.0.0.0:8080\", \"127.0.0.1:9901\" or \
         \"[::]:8080\" (an IP address, not a host name)"
            .to_owned()
    } else {
        message
    };
    ConfigError::new(key, message)
}

/// Keys holding a socket address, whose parse error says only "invalid socket address
/// syntax".
const ADDRESS_KEYS: &[&str] = &["listen.address", "admin.address"];

/// One figment error in the words of a TOML file: the dotted path it is about (the field
/// included for an unknown or missing one) and what is wrong, with the values allowed
/// where they are a closed set. Shared with the other TOML files the sidecar reads (the
/// MCP tool policy).
pub(crate) fn explain(err: &figment::Error) -> (Vec<String>, String) {
    let mut path = err.path.clone();
    let message = match &err.kind {
        Kind::UnknownField(field, expected) => {
            if path.last() != Some(field) {
                path.push(field.clone());
            }
            format!("unknown key (expected one of: {})", expected.join(", "))
        }
        Kind::MissingField(field) => {
            if path.last().map(String::as_str) != Some(field.as_ref()) {
                path.push(field.to_string());
            }
            "missing".to_owned()
        }
        Kind::UnknownVariant(found, allowed) => format!(
            "must be one of {} (found {found:?})",
            allowed
                .iter()
                .map(|v| format!("{v:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Kind::InvalidType(actual, expected) | Kind::InvalidValue(actual, expected) => format!(
            "expected {}, found {}",
            expected_words(expected),
            actual_words(actual)
        ),
        kind => kind.to_string(),
    };
    (path, message)
}

/// What serde expected, as a TOML value rather than a Rust type.
fn expected_words(expected: &str) -> String {
    match expected {
        "usize" | "u64" | "u32" | "u16" | "u8" | "u128" => "a whole number, 0 or more".to_owned(),
        "isize" | "i64" | "i32" | "i16" | "i8" | "i128" => "a whole number".to_owned(),
        "f64" | "f32" => "a number".to_owned(),
        "a boolean" => "true or false".to_owned(),
        "a string" => "a string in double quotes".to_owned(),
        "a sequence" => "a list, such as [\"a\", \"b\"]".to_owned(),
        "a map" => "a table".to_owned(),
        e if e.starts_with("struct ") => "a table (a [section] of keys)".to_owned(),
        e if e.starts_with("enum ") => "one of the names listed for the key".to_owned(),
        other => other.to_owned(),
    }
}

/// A value found in the file, as the file wrote it.
fn actual_words(actual: &Actual) -> String {
    match actual {
        Actual::Bool(b) => b.to_string(),
        Actual::Unsigned(n) => n.to_string(),
        Actual::Signed(n) => n.to_string(),
        Actual::Float(n) => n.to_string(),
        Actual::Char(c) => format!("{:?}", c.to_string()),
        Actual::Str(s) => format!("the string {s:?}"),
        Actual::Seq => "a list".to_owned(),
        Actual::Map => "a table".to_owned(),
        other => other.to_string(),
    }
}

fn read_bounded(path: &Path, max: u64) -> Result<String, String> {
    let file = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let mut buf = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if buf.len() as u64 > max {
        return Err(format!("{} is larger than {max} bytes", path.display()));
    }
    String::from_utf8(buf).map_err(|_| format!("{} is not UTF-8", path.display()))
}

/// Reads `upstream.gateway_secret_file` and `auth.jwt_secrets_file` into the config.
fn resolve_secret_files(config: &mut Config) -> Result<(), ConfigError> {
    if let Some(path) = &config.upstream.gateway_secret_file {
        const KEY: &str = "upstream.gateway_secret_file";
        if config.upstream.gateway_secret.is_some() {
            return Err(ConfigError::new(
                KEY,
                "set either upstream.gateway_secret or upstream.gateway_secret_file, not both",
            ));
        }
        let text =
            read_bounded(path, MAX_SECRET_FILE_BYTES).map_err(|e| ConfigError::new(KEY, e))?;
        let secret = text.trim_end_matches(['\r', '\n']);
        if secret.is_empty() {
            return Err(ConfigError::new(KEY, "the file holds no secret"));
        }
        config.upstream.gateway_secret =
            Some(Secret::with_origin(secret, SecretOrigin::SecretFile));
    }
    if let Some(path) = &config.auth.jwt_secrets_file {
        const KEY: &str = "auth.jwt_secrets_file";
        let text =
            read_bounded(path, MAX_SECRET_FILE_BYTES).map_err(|e| ConfigError::new(KEY, e))?;
        let mut added = 0;
        for line in text.lines() {
            let line = line.trim_end_matches('\r');
            // Blank lines (a trailing newline, a separator) are not secrets.
            if line.trim().is_empty() {
                continue;
            }
            config
                .auth
                .jwt_secrets
                .push(Secret::with_origin(line, SecretOrigin::SecretFile));
            added += 1;
        }
        if added == 0 {
            return Err(ConfigError::new(KEY, "the file holds no secret"));
        }
    }
    Ok(())
}
