//! Fuzzes the one request classifier (wire contract §5, §6): never panics, and adding
//! the gateway's prefix in front of a path never changes its class (the prefix is
//! stripped as often as it appears).
#![no_main]

use http::Uri;
use knowtation_sidecar::route::classify;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|raw: &str| {
    let Ok(uri) = raw.parse::<Uri>() else { return };
    let class = classify(&uri);
    let path = uri.path();
    if !path.starts_with('/') {
        return;
    }
    let prefixed = format!("/.netlify/functions/gateway{path}");
    if let Ok(p) = prefixed.parse::<Uri>() {
        assert_eq!(classify(&p), class, "{raw}");
    }
});
