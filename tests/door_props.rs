//! Property tests of the `/mcp` door's canonical reading (wire contract §6 Deviations):
//! the canonical text is a fixed point, means what the client's body meant, and no
//! `__proto__` key survives, wherever and however it is written.

// Test code: a failed unwrap is a failed test, which is what we want here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use knowtation_sidecar::mcp::door::{canonical, DoorError};
use proptest::prelude::*;
use serde_json::{Map, Value};

/// JSON values whose numbers survive a double round trip unchanged.
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(Value::from),
        (-1.0e6f64..1.0e6).prop_map(Value::from),
        "[a-z_\\u{e9}\\u{1F600}\"\\\\\n]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec(("[a-z]{1,6}", inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Equal as JavaScript sees them: numbers by value (`3.0` and `3` are one double).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

/// `value` written with whitespace between tokens.
fn spaced(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap()
}

/// Inserts `key: 1` into the `n`th object of `text` (a crude but total textual splice:
/// after the `n`th `{` that opens an object).
fn splice_key(text: &str, key: &str, n: usize) -> Option<String> {
    let opens: Vec<usize> = text
        .char_indices()
        .filter(|(_, c)| *c == '{')
        .map(|(i, _)| i)
        .collect();
    let at = *opens.get(n % opens.len().max(1))?;
    // Only splice outside strings: the value generator never puts `{` inside a string.
    Some(format!("{}{{{key}:1,{}", &text[..at], &text[at + 1..]))
}

proptest! {
    #[test]
    fn canonical_text_is_a_fixed_point_and_means_the_same(v in json()) {
        let c = canonical(spaced(&v).as_bytes()).unwrap();
        prop_assert!(same(&c.value, &v), "{} vs {}", c.value, v);
        let again = canonical(c.text.as_bytes()).unwrap();
        prop_assert_eq!(&again.text, &c.text);
    }

    #[test]
    fn a_prototype_key_anywhere_is_refused(
        v in json(),
        n in 0usize..16,
        key in prop_oneof![
            Just(r#""__proto__""#),
            Just(r#""\u005f_proto__""#),
            Just(r#""__pr\u006fto__""#),
            Just(r#""\u005F\u005Fproto\u005F\u005F""#),
        ],
    ) {
        let wrapped = serde_json::json!({"params": v});
        if let Some(text) = splice_key(&spaced(&wrapped), key, n) {
            prop_assert_eq!(canonical(text.as_bytes()).map(|c| c.text), Err(DoorError::Body));
        }
    }

    #[test]
    fn the_last_of_repeated_keys_wins_in_the_first_place(a in json(), b in json()) {
        let text = format!(
            "{{\"name\":{},\"x\":0,\"name\":{}}}",
            serde_json::to_string(&a).unwrap(),
            serde_json::to_string(&b).unwrap()
        );
        let c = canonical(text.as_bytes()).unwrap();
        prop_assert!(same(&c.value["name"], &b));
        let first = c.text.starts_with(r#"{"name":"#);
        prop_assert!(first);
    }
}
