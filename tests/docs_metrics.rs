//! The metrics reference, the alerting rules and the runbook are held to the code and to
//! each other:
//!
//! - every family the sidecar registers is described in `docs/metrics.md`, and every
//!   family described there is registered, with the same type, help text, label names and
//!   label values (the closed sets the code exposes, and every series it creates);
//! - every metric, label and label value an alert in `deploy/prometheus/alerts.yml` uses
//!   exists, and each family's `alerts` row lists exactly the alerts that use it;
//! - every alert has a section in `docs/runbook.md` its `runbook_url` points to, and every
//!   section there belongs to an alert.

// A failed expectation in a test is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/yaml.rs"]
mod yaml;

use std::collections::{BTreeMap, BTreeSet};

use knowtation_sidecar::budget::Refusal;
use knowtation_sidecar::telemetry::{
    eviction_labels, outcome_labels, HeadRefusal, Metrics, TokenRefusal, METRIC_PREFIX,
    STATUS_CLASSES,
};
use serde_json::Value;

/// Families an alert may use before they are registered and described (their rules are
/// written ahead of the code). Once registered, they must be described like any other.
const PENDING: [&str; 2] = [
    "knowtation_sidecar_config_reloads_total",
    "knowtation_sidecar_session_store_errors_total",
];

/// Labels whose values are not a closed set (family, label).
const OPEN_LABELS: [(&str, &str); 3] = [
    ("knowtation_sidecar_build_info", "version"),
    ("knowtation_sidecar_build_info", "commit"),
    ("knowtation_sidecar_build_info", "rustc"),
];

/// The standard families every Prometheus client exports, named without the prefix.
const STANDARD_PREFIX: &str = "process_";

/// Labels the scrape adds to every series (`job`, `instance`) or histograms carry (`le`).
const TARGET_LABELS: [&str; 2] = ["job", "instance"];

fn read(rel: &str) -> String {
    let path = format!("{}/{rel}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

// ---------------------------------------------------------------------------------------
// docs/metrics.md

#[derive(Debug, Clone, PartialEq)]
enum Values {
    Closed(BTreeSet<String>),
    Open,
}

#[derive(Debug)]
struct DocFamily {
    kind: String,
    help: String,
    labels: BTreeMap<String, Values>,
    alerts: BTreeSet<String>,
}

/// The `` `x` `` spans of a cell, in order.
fn backquoted(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The cells of a table row, trimmed (`None` for a line that is not a row).
fn row(line: &str) -> Option<Vec<String>> {
    let inner = line.trim().strip_prefix('|')?.strip_suffix('|')?;
    Some(inner.split('|').map(|c| c.trim().to_owned()).collect())
}

/// `[`Name`](runbook.md#anchor)` links of a cell, as (name, anchor).
fn runbook_links(cell: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = cell;
    while let Some(open) = rest.find('[') {
        let after = &rest[open + 1..];
        let close = after.find("](").expect("a link's text ends with ](");
        let name = after[..close].trim_matches('`').to_owned();
        let target_start = &after[close + 2..];
        let end = target_start.find(')').expect("a link's target ends with )");
        let target = &target_start[..end];
        let anchor = target
            .strip_prefix("runbook.md#")
            .unwrap_or_else(|| panic!("alert links point into runbook.md: {target}"));
        out.push((name, anchor.to_owned()));
        rest = &target_start[end + 1..];
    }
    out
}

/// Every family section of `docs/metrics.md`: a `### ` heading holding the name in
/// backquotes, then its `| field | value |` table.
fn doc_families() -> BTreeMap<String, DocFamily> {
    let text = read("docs/metrics.md");
    let mut out = BTreeMap::new();
    let mut current: Option<(String, BTreeMap<String, String>)> = None;
    let mut finish = |section: Option<(String, BTreeMap<String, String>)>| {
        let Some((name, fields)) = section else {
            return;
        };
        let field = |k: &str| {
            fields
                .get(k)
                .unwrap_or_else(|| panic!("docs/metrics.md: {name} has no `{k}` row"))
                .clone()
        };
        let kind = field("type");
        let help = field("help");
        let alerts_cell = field("alerts");
        let alerts = if alerts_cell == "none" {
            BTreeSet::new()
        } else {
            runbook_links(&alerts_cell)
                .into_iter()
                .map(|(alert, anchor)| {
                    assert_eq!(
                        anchor,
                        alert.to_lowercase(),
                        "docs/metrics.md: {name}: the link to {alert} has the wrong anchor"
                    );
                    alert
                })
                .collect()
        };
        let mut labels = BTreeMap::new();
        for (key, value) in &fields {
            let Some(label) = key.strip_prefix("label ") else {
                assert!(
                    ["type", "help", "alerts"].contains(&key.as_str()),
                    "docs/metrics.md: {name}: unknown row {key:?}"
                );
                continue;
            };
            let label = backquoted(label)
                .pop()
                .unwrap_or_else(|| panic!("docs/metrics.md: {name}: label names go in backquotes"));
            let values = if value.starts_with("any:") {
                Values::Open
            } else {
                let listed = backquoted(value);
                let rebuilt = listed
                    .iter()
                    .map(|v| format!("`{v}`"))
                    .collect::<Vec<_>>()
                    .join(", ");
                assert_eq!(
                    &rebuilt, value,
                    "docs/metrics.md: {name}: label {label}: values are backquoted and comma-separated"
                );
                Values::Closed(listed.into_iter().collect())
            };
            labels.insert(label, values);
        }
        let family = DocFamily {
            kind,
            help,
            labels,
            alerts,
        };
        assert!(
            out.insert(name.clone(), family).is_none(),
            "docs/metrics.md: {name} is described twice"
        );
    };
    for line in text.lines() {
        if line.starts_with('#') {
            finish(current.take());
            if let Some(heading) = line.strip_prefix("### ") {
                let names = backquoted(heading);
                if let [name] = names.as_slice() {
                    if name.starts_with(METRIC_PREFIX) || name.starts_with(STANDARD_PREFIX) {
                        current = Some((name.clone(), BTreeMap::new()));
                    }
                }
            }
            continue;
        }
        let Some((name, fields)) = current.as_mut() else {
            continue;
        };
        let Some(cells) = row(line) else { continue };
        if cells.iter().all(|c| c.chars().all(|ch| ch == '-')) || cells[0] == "field" {
            continue;
        }
        assert_eq!(
            cells.len(),
            2,
            "docs/metrics.md: {name}: rows have two cells: {line}"
        );
        assert!(
            fields.insert(cells[0].clone(), cells[1].clone()).is_none(),
            "docs/metrics.md: {name}: row {} twice",
            cells[0]
        );
    }
    finish(current.take());
    assert!(!out.is_empty(), "docs/metrics.md describes no family");
    out
}

// ---------------------------------------------------------------------------------------
// The registry

struct Registered {
    kind: String,
    help: String,
    labels: BTreeSet<String>,
}

fn registered() -> BTreeMap<String, Registered> {
    Metrics::new()
        .families()
        .into_iter()
        .map(|(name, kind, help, labels)| {
            let reg = Registered {
                kind: kind.to_owned(),
                help,
                labels: labels.into_iter().collect(),
            };
            (name, reg)
        })
        .collect()
}

/// The label values of every series a fresh registry exposes: family → label → values.
fn exposed_values() -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let families = registered();
    let mut out: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for line in Metrics::new().encode().lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let Some((series, labels)) = line.split_once('{') else {
            continue;
        };
        let family = family_of(series, &families).unwrap_or_else(|| panic!("series {series}"));
        let labels = labels.rsplit_once('}').expect("labels end with }").0;
        for pair in labels.split("\",") {
            let (k, v) = pair.split_once("=\"").expect("label=\"value\"");
            if k == "le" {
                continue;
            }
            out.entry(family.clone())
                .or_default()
                .entry(k.to_owned())
                .or_default()
                .insert(v.trim_end_matches('"').to_owned());
        }
    }
    out
}

/// The family a series name belongs to (histograms expose `_bucket`, `_sum`, `_count`).
fn family_of<T>(series: &str, families: &BTreeMap<String, T>) -> Option<String> {
    if families.contains_key(series) {
        return Some(series.to_owned());
    }
    ["_bucket", "_sum", "_count"]
        .iter()
        .filter_map(|s| series.strip_suffix(s))
        .find(|base| families.contains_key(*base))
        .map(str::to_owned)
}

/// The closed set of `label` on `family` as the code states it, where it does.
fn code_values(family: &str, label: &str) -> Option<BTreeSet<String>> {
    let set = |it: &mut dyn Iterator<Item = &'static str>| it.map(str::to_owned).collect();
    match (family, label) {
        (_, "outcome") => Some(set(&mut outcome_labels())),
        (_, "status_class") => Some(set(&mut STATUS_CLASSES.iter().copied())),
        ("knowtation_sidecar_mcp_session_evictions_total", "reason") => {
            Some(set(&mut eviction_labels()))
        }
        ("knowtation_sidecar_admission_refused_total", "reason") => {
            Some(set(&mut Refusal::ALL.iter().map(|r| r.as_str())))
        }
        ("knowtation_sidecar_head_refused_total", "reason") => {
            Some(set(&mut HeadRefusal::ALL.iter().map(|r| r.as_str())))
        }
        ("knowtation_sidecar_tokens_refused_total", "reason") => {
            Some(set(&mut TokenRefusal::ALL.iter().map(|r| r.as_str())))
        }
        _ => None,
    }
}

#[test]
fn every_registered_family_is_described_and_every_described_family_is_registered() {
    let code = registered();
    let doc = doc_families();
    let undocumented: Vec<_> = code.keys().filter(|n| !doc.contains_key(*n)).collect();
    let unregistered: Vec<_> = doc.keys().filter(|n| !code.contains_key(*n)).collect();
    assert!(
        undocumented.is_empty() && unregistered.is_empty(),
        "registered but not described in docs/metrics.md: {undocumented:?}; \
         described there but not registered: {unregistered:?}"
    );
    for (name, reg) in &code {
        let d = &doc[name];
        assert_eq!(d.kind, reg.kind, "docs/metrics.md: type of {name}");
        assert_eq!(d.help, reg.help, "docs/metrics.md: help of {name}");
        let labels: BTreeSet<String> = d.labels.keys().cloned().collect();
        assert_eq!(labels, reg.labels, "docs/metrics.md: label names of {name}");
    }
}

#[test]
fn described_label_values_are_the_closed_sets_of_the_code() {
    let code = registered();
    let doc = doc_families();
    let exposed = exposed_values();
    // The values each label name shows across families, for a family that has no series
    // yet (the latency histogram): usable only when every family agrees.
    let mut by_label: BTreeMap<String, Vec<BTreeSet<String>>> = BTreeMap::new();
    for labels in exposed.values() {
        for (label, values) in labels {
            by_label
                .entry(label.clone())
                .or_default()
                .push(values.clone());
        }
    }
    for (name, d) in &doc {
        if !code.contains_key(name) {
            continue; // reported by the other test
        }
        for (label, documented) in &d.labels {
            let open = OPEN_LABELS.contains(&(name.as_str(), label.as_str()));
            let seen = exposed.get(name).and_then(|l| l.get(label));
            let documented = match documented {
                Values::Open => {
                    assert!(
                        open,
                        "docs/metrics.md: {name}: label {label} is a closed set; list its values"
                    );
                    continue;
                }
                Values::Closed(v) => {
                    assert!(
                        !open,
                        "docs/metrics.md: {name}: label {label} is open; write `any:` and what it holds"
                    );
                    v
                }
            };
            let expected = code_values(name, label)
                .or_else(|| seen.cloned())
                .or_else(|| {
                    let sets = by_label.get(label)?;
                    sets.iter().all(|s| s == &sets[0]).then(|| sets[0].clone())
                })
                .unwrap_or_else(|| {
                    panic!(
                        "{name}: the values of label {label} cannot be checked: create its \
                         series at zero in Metrics::new, as for the other closed labels, or \
                         name its closed set in code_values() here"
                    )
                });
            assert_eq!(
                documented, &expected,
                "docs/metrics.md: values of label {label} of {name}"
            );
            if let Some(seen) = seen {
                assert!(
                    seen.is_subset(documented),
                    "{name}: label {label} has series {:?} not described in docs/metrics.md",
                    seen.difference(documented).collect::<Vec<_>>()
                );
            }
        }
    }
}

#[test]
fn the_outcome_glossary_lists_every_outcome() {
    let text = read("docs/metrics.md");
    let section = text
        .split("\n## Outcomes\n")
        .nth(1)
        .expect("docs/metrics.md has an Outcomes section");
    let section = section.split("\n#").next().unwrap_or(section);
    let glossary: BTreeSet<String> = section
        .lines()
        .filter_map(row)
        .filter_map(|cells| backquoted(&cells[0]).pop())
        .collect();
    let code: BTreeSet<String> = outcome_labels().map(str::to_owned).collect();
    assert_eq!(glossary, code, "docs/metrics.md: the Outcomes table");
}

// ---------------------------------------------------------------------------------------
// deploy/prometheus/alerts.yml

struct Alert {
    name: String,
    expr: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

fn alerts() -> Vec<Alert> {
    let doc = yaml::parse(&read("deploy/prometheus/alerts.yml")).expect("alerts.yml is YAML");
    let strings = |v: Option<&Value>| -> BTreeMap<String, String> {
        v.and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().expect("a string").to_owned()))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    for group in doc["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            let name = rule["alert"]
                .as_str()
                .expect("only alerting rules")
                .to_owned();
            out.push(Alert {
                name,
                expr: rule["expr"].as_str().expect("expr").to_owned(),
                labels: strings(rule.get("labels")),
                annotations: strings(rule.get("annotations")),
            });
        }
    }
    let names: BTreeSet<_> = out.iter().map(|a| &a.name).collect();
    assert_eq!(names.len(), out.len(), "alert names are unique");
    out
}

/// Every `knowtation_sidecar_…` series name in an expression.
fn metric_names(expr: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let bytes = expr.as_bytes();
    let mut from = 0;
    while let Some(at) = expr[from..].find(METRIC_PREFIX) {
        let start = from + at;
        let boundary =
            start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        if boundary {
            out.push((end, expr[start..end].to_owned()));
        }
        from = end;
    }
    out
}

/// The matchers of the selector right after a metric name: (label, op, value).
fn matchers(expr: &str, at: usize) -> Vec<(String, String, String)> {
    let Some(rest) = expr[at..].strip_prefix('{') else {
        return Vec::new();
    };
    let body = &rest[..rest.find('}').expect("a selector ends with }")];
    body.split(',')
        .filter(|m| !m.trim().is_empty())
        .map(|m| {
            let m = m.trim();
            let op_at = m.find(['=', '!']).expect("label op value");
            let op_len = if m[op_at..].starts_with("=~")
                || m[op_at..].starts_with("!=")
                || m[op_at..].starts_with("!~")
            {
                2
            } else {
                1
            };
            let value = m[op_at + op_len..].trim().trim_matches('"').to_owned();
            (
                m[..op_at].trim().to_owned(),
                m[op_at..op_at + op_len].to_owned(),
                value,
            )
        })
        .collect()
}

/// The labels of every `by (…)` clause in an expression.
fn grouping_labels(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for part in expr.split("by (").skip(1) {
        let list = &part[..part.find(')').expect("by (…) ends with )")];
        out.extend(list.split(',').map(|l| l.trim().to_owned()));
    }
    out
}

#[test]
fn alerts_use_only_metrics_labels_and_values_that_exist() {
    let code = registered();
    let doc = doc_families();
    for alert in alerts() {
        let names = metric_names(&alert.expr);
        let mut families = BTreeSet::new();
        for (end, series) in &names {
            let family = family_of(series, &code)
                .or_else(|| family_of(series, &doc))
                .or_else(|| PENDING.contains(&series.as_str()).then(|| series.clone()))
                .unwrap_or_else(|| {
                    panic!(
                        "alert {}: {series} is neither registered nor described",
                        alert.name
                    )
                });
            let bucket = series.ends_with("_bucket");
            families.insert(family.clone());
            let Some(d) = doc.get(&family) else {
                continue; // pending: its labels are not described yet
            };
            for (label, op, value) in matchers(&alert.expr, *end) {
                if TARGET_LABELS.contains(&label.as_str()) || (bucket && label == "le") {
                    continue;
                }
                let values = d.labels.get(&label).unwrap_or_else(|| {
                    panic!("alert {}: {family} has no label {label}", alert.name)
                });
                let Values::Closed(values) = values else {
                    continue;
                };
                let literal = value
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '|');
                assert!(
                    literal && (op.ends_with('~') || !value.contains('|')),
                    "alert {}: write {label} values as literals or |-alternations of them",
                    alert.name
                );
                for v in value.split('|') {
                    assert!(
                        values.contains(v),
                        "alert {}: {label}={v:?} is not a value of {family}",
                        alert.name
                    );
                }
            }
        }
        assert!(
            !names.is_empty() || alert.expr.contains("up{"),
            "alert {}: no metric",
            alert.name
        );
        let mut known: BTreeSet<String> = TARGET_LABELS.iter().map(|s| (*s).to_owned()).collect();
        known.insert("le".to_owned());
        for family in &families {
            if let Some(d) = doc.get(family) {
                known.extend(d.labels.keys().cloned());
            } else if let Some(r) = code.get(family) {
                known.extend(r.labels.iter().cloned());
            }
        }
        let pending_only = families
            .iter()
            .all(|f| !doc.contains_key(f) && !code.contains_key(f));
        for label in grouping_labels(&alert.expr) {
            assert!(
                pending_only || known.contains(&label),
                "alert {}: groups by {label}, a label none of its metrics has",
                alert.name
            );
        }
    }
}

#[test]
fn each_family_lists_exactly_the_alerts_that_use_it() {
    let code = registered();
    let doc = doc_families();
    let mut users: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for alert in alerts() {
        for (_, series) in metric_names(&alert.expr) {
            if let Some(family) = family_of(&series, &doc).or_else(|| family_of(&series, &code)) {
                users.entry(family).or_default().insert(alert.name.clone());
            }
        }
    }
    for (name, d) in &doc {
        let expected = users.remove(name).unwrap_or_default();
        assert_eq!(
            d.alerts, expected,
            "docs/metrics.md: the alerts row of {name} lists the alerts in alerts.yml that use it"
        );
    }
}

// ---------------------------------------------------------------------------------------
// docs/runbook.md

/// The `## ` headings of the runbook that name an alert.
fn runbook_sections() -> Vec<String> {
    read("docs/runbook.md")
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .filter(|h| h.starts_with("KnowtationSidecar"))
        .map(|h| h.trim().to_owned())
        .collect()
}

#[test]
fn every_alert_has_a_runbook_section_and_every_section_an_alert() {
    let alerts = alerts();
    let sections = runbook_sections();
    let unique: BTreeSet<_> = sections.iter().cloned().collect();
    assert_eq!(
        unique.len(),
        sections.len(),
        "docs/runbook.md: a section appears twice"
    );
    let names: BTreeSet<String> = alerts.iter().map(|a| a.name.clone()).collect();
    assert_eq!(
        names, unique,
        "alerts in deploy/prometheus/alerts.yml and sections of docs/runbook.md"
    );
    for alert in &alerts {
        assert!(
            alert.name.chars().all(|c| c.is_ascii_alphanumeric()),
            "{}: an alert name is one word, so its anchor is its lowercase form",
            alert.name
        );
        assert_eq!(
            alert.annotations.get("runbook_url").map(String::as_str),
            Some(format!("docs/runbook.md#{}", alert.name.to_lowercase()).as_str()),
            "{}: runbook_url",
            alert.name
        );
        for key in ["summary", "description"] {
            assert!(
                alert.annotations.contains_key(key),
                "{}: no {key}",
                alert.name
            );
        }
        let severity = alert.labels.get("severity").map(String::as_str);
        assert!(
            matches!(severity, Some("critical" | "warning")),
            "{}: severity is critical or warning",
            alert.name
        );
    }
}

#[test]
fn every_pending_exemption_is_used() {
    // Once the code registers a pending family, its description is required like any
    // other (the first test); here: an exemption nobody uses is dropped.
    let used: BTreeSet<String> = alerts()
        .iter()
        .flat_map(|a| metric_names(&a.expr))
        .map(|(_, n)| n)
        .collect();
    for name in PENDING {
        assert!(
            used.contains(name),
            "{name} is pending but no alert uses it: drop it from PENDING"
        );
    }
}
