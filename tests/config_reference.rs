//! `docs/configuration.md` is checked against the configuration schema: every key, and
//! nothing else, with its default and its environment variable, and a meaning; and for
//! every key with a closed set of values, exactly that set.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeMap;

use knowtation_sidecar::config::{self, Config, ENV_PREFIX};

/// `section.key` → the default as `check-config` prints it (`unset` for an unset
/// optional key).
fn schema_defaults() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut section = String::new();
    for line in config::to_toml(&Config::default()).lines() {
        if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = s.to_owned();
        } else if let Some(rest) = line.strip_prefix("# ") {
            let key = rest.strip_suffix(" = unset").expect("unset marker");
            out.insert(format!("{section}.{key}"), "unset".to_owned());
        } else if let Some((key, value)) = line.split_once(" = ") {
            out.insert(format!("{section}.{key}"), format!("`{value}`"));
        }
    }
    out
}

/// The reference rows: key → (default, environment, meaning).
fn documented() -> BTreeMap<String, (String, String, String)> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/configuration.md"
    ))
    .unwrap();
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let cells: Vec<&str> = line.split(" | ").collect();
        if cells.len() != 4 || !line.starts_with("| `") {
            continue;
        }
        let key = cells[0].trim_start_matches("| ").trim_matches('`');
        if !key.contains('.') {
            continue;
        }
        let meaning = cells[3].trim_end_matches(" |").trim();
        let previous = out.insert(
            key.to_owned(),
            (
                cells[1].to_owned(),
                cells[2].trim_matches('`').to_owned(),
                meaning.to_owned(),
            ),
        );
        assert!(previous.is_none(), "{key} documented twice");
    }
    out
}

#[test]
fn the_reference_lists_every_key_with_its_default_and_environment_name() {
    let schema = schema_defaults();
    let docs = documented();
    let missing: Vec<_> = schema.keys().filter(|k| !docs.contains_key(*k)).collect();
    let extra: Vec<_> = docs.keys().filter(|k| !schema.contains_key(*k)).collect();
    assert!(missing.is_empty(), "undocumented keys: {missing:?}");
    assert!(
        extra.is_empty(),
        "documented keys that do not exist: {extra:?}"
    );
    for (key, (default, env, meaning)) in &docs {
        let want = if key == "upstream.gateway_url" {
            "required"
        } else {
            schema[key].as_str()
        };
        assert_eq!(default, want, "default of {key}");
        let (section, field) = key.split_once('.').unwrap();
        assert_eq!(
            env,
            &format!(
                "{ENV_PREFIX}{}__{}",
                section.to_ascii_uppercase(),
                field.to_ascii_uppercase()
            ),
            "environment name of {key}"
        );
        assert!(meaning.len() > 10, "{key} has no meaning");
    }
}

/// Every documented environment name is accepted by the loader, with its default as
/// the value (so each name maps to a real key, parsed the way this page implies).
#[test]
fn every_documented_environment_name_loads() {
    let gateway = (
        format!("{ENV_PREFIX}UPSTREAM__GATEWAY_URL"),
        "http://gateway.example".to_owned(),
    );
    let mut tried = 0;
    for (key, (default, env, _)) in documented() {
        if default == "unset" || key == "upstream.gateway_url" {
            continue;
        }
        let raw = default.trim_matches('`');
        // Strings are taken verbatim from the environment: no TOML quotes.
        let value = raw
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(raw);
        let loaded =
            config::load_with_env(None, &[gateway.clone(), (env.clone(), value.to_owned())]);
        assert!(loaded.is_ok(), "{env}={value}: {loaded:?}");
        tried += 1;
    }
    assert!(tried > 40, "only {tried} keys tried");
    // Unknown names are refused, so a typo in an operator's environment is caught.
    let err = config::load_with_env(
        None,
        &[
            gateway,
            (format!("{ENV_PREFIX}LOG__LEVL"), "info".to_owned()),
        ],
    )
    .unwrap_err();
    assert!(err.key.contains("LOG__LEVL"), "{err}");
}

/// The values a key allows when they are a closed set, as the loader states them when
/// refusing another: the list after `must be one of` (`"a", "b"`), up to the next
/// element that is not a quoted value.
fn allowed_values(key: &str) -> Option<Vec<String>> {
    let (section, field) = key.split_once('.').unwrap();
    let env = format!(
        "{ENV_PREFIX}{}__{}",
        section.to_ascii_uppercase(),
        field.to_ascii_uppercase()
    );
    let loaded = config::load_with_env(
        None,
        &[
            (
                format!("{ENV_PREFIX}UPSTREAM__GATEWAY_URL"),
                "http://gateway.example".to_owned(),
            ),
            (env, "zz-not-a-value".to_owned()),
        ],
    );
    let err = loaded.err()?;
    let list = err.message.split("must be one of ").nth(1)?;
    let mut values = Vec::new();
    for item in list.split(", ") {
        let Some(v) = item.strip_prefix('"').and_then(|i| i.split('"').next()) else {
            break;
        };
        values.push(v.to_owned());
        if !item.ends_with('"') {
            break;
        }
    }
    Some(values)
}

/// The values a meaning cell lists: the backquoted items after `One of `, up to the first
/// element that is not one.
fn documented_values(meaning: &str) -> Option<Vec<String>> {
    let list = meaning.split("One of ").nth(1)?;
    let mut values = Vec::new();
    for item in list.split(", ") {
        let Some(v) = item.strip_prefix('`').and_then(|i| i.split('`').next()) else {
            break;
        };
        values.push(v.to_owned());
        if !item.trim_end_matches('.').ends_with('`') {
            break;
        }
    }
    Some(values)
}

#[test]
fn every_closed_set_of_values_is_documented_exactly() {
    let mut enumerated = 0;
    for (key, (default, _, meaning)) in documented() {
        let code = allowed_values(&key);
        let docs = documented_values(&meaning);
        assert_eq!(
            docs, code,
            "{key}: the values `One of ...` lists in docs/configuration.md, and those the \
             loader allows"
        );
        if let Some(values) = code {
            enumerated += 1;
            let default = default.trim_matches('`').trim_matches('"');
            assert!(
                values.iter().any(|v| v == default),
                "{key}: default {default}"
            );
        }
    }
    // log.format, log.access, log.level, hosted_context.on_failure, intercept.mode,
    // upstream.reuse.
    assert!(enumerated >= 6, "only {enumerated} enumerated keys found");
}
