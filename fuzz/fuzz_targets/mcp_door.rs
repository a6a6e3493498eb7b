//! Fuzzes the `/mcp` door (wire contract §6 Deviations): the media-type check and the
//! canonical reading never panic; an accepted body's canonical form reads back as
//! itself, holds no `__proto__` key, and is what the classifier sees.
#![no_main]

use http::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use knowtation_sidecar::mcp::door::{canonical, check_headers};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    // The first line is a Content-Type value, the rest a body.
    let (ct, body) = match data.iter().position(|b| *b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&data[..0], data),
    };
    if let Ok(v) = HeaderValue::from_bytes(ct) {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, v);
        let _ = check_headers(&h);
    }
    let Ok(c) = canonical(body) else { return };
    let again = canonical(c.text.as_bytes()).expect("canonical text reads back");
    assert_eq!(again.text, c.text, "canonical form is a fixed point");
    assert_eq!(again.value, c.value);
    assert!(!has_proto(&c.value));
});

fn has_proto(v: &Value) -> bool {
    match v {
        Value::Object(o) => o.iter().any(|(k, v)| k == "__proto__" || has_proto(v)),
        Value::Array(a) => a.iter().any(has_proto),
        _ => false,
    }
}
