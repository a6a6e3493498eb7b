//! The one door: which handler the gateway would run for a request path (wire contract
//! §5 and §6). Both intercepted surfaces and the passthrough are chosen here, once per
//! request, so a path can never be read one way by the REST surface and another way by
//! the MCP surface.
//!
//! Matching is a deliberate superset of Express's: percent-escapes of unreserved
//! characters are decoded, case is ignored, empty and `.` segments are dropped and `..`
//! resolved, and the `/.netlify/functions/gateway` prefix is stripped **as often as it
//! appears** (the gateway strips it once, but a Netlify rewrite in front of it adds it
//! again, so a twice-prefixed path can reach the handler). Express 4.22 routes none of
//! `//api/v1/section-source` or `/api/v1/./section-source` to the handler, but a
//! normalizing hop in front of the gateway (nginx merges slashes by default) could;
//! a gap would be a bypass, while a superset only answers a request Express would have
//! refused.

use std::borrow::Cow;

use http::Uri;

/// The REST route, as segments (§5).
const SECTION_SOURCE: [&str; 3] = ["api", "v1", "section-source"];

/// The gateway's MCP mount (§6: `app.use('/mcp')` with `router.post('/')`).
const MCP: [&str; 1] = ["mcp"];

/// The prefix the gateway strips on every host (§5), as a string and as segments.
const GATEWAY_PREFIX: &str = "/.netlify/functions/gateway";
const GATEWAY_PREFIX_SEGMENTS: [&str; 3] = [".netlify", "functions", "gateway"];

/// Which handler a request path belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `/api/v1/section-source` (§5): answered here for GET, HEAD and OPTIONS.
    SectionSource,
    /// The MCP mount `/mcp` (§6): every POST is classified here.
    Mcp,
    /// Anything else: passed through to the gateway.
    Passthrough,
}

/// Classifies `uri` by its path.
pub fn classify(uri: &Uri) -> Route {
    let decoded = decode_unreserved(uri.path());
    if matches(&decoded, &SECTION_SOURCE) {
        Route::SectionSource
    } else if matches(&decoded, &MCP) {
        Route::Mcp
    } else {
        Route::Passthrough
    }
}

/// Whether the decoded path could reach the handler mounted at `route`.
fn matches(decoded: &str, route: &[&str]) -> bool {
    // Every passed-through request comes here. Segments are compared after decoding and
    // `..` only removes segments, so a match needs the route's last segment in the
    // decoded path: without it, nothing more to check.
    if let Some(last) = route.last() {
        if !contains_ignore_ascii_case(decoded, last) {
            return false;
        }
    }
    let is_route = |segs: &[&str]| {
        segs.len() == route.len()
            && segs
                .iter()
                .zip(route)
                .all(|(a, b)| a.eq_ignore_ascii_case(b))
    };
    // The gateway strips its prefix from the raw path: strip it from the string as often
    // as it appears, then compare segments.
    let mut raw = decoded;
    loop {
        if is_route(&segments(raw)) {
            return true;
        }
        match strip_prefix_ignore_case(raw, GATEWAY_PREFIX) {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => raw = rest,
            _ => break,
        }
    }
    // And after normalizing, so `..` and empty segments around a prefix cannot hide it.
    let segs = segments(decoded);
    let mut rest: &[&str] = &segs;
    loop {
        if is_route(rest) {
            return true;
        }
        let prefixed = rest.len() >= GATEWAY_PREFIX_SEGMENTS.len()
            && rest
                .iter()
                .zip(GATEWAY_PREFIX_SEGMENTS)
                .all(|(a, b)| a.eq_ignore_ascii_case(b));
        if !prefixed {
            return false;
        }
        rest = rest
            .get(GATEWAY_PREFIX_SEGMENTS.len()..)
            .unwrap_or_default();
    }
}

fn contains_ignore_ascii_case(haystack: &str, needle: &str) -> bool {
    needle.is_empty()
        || haystack
            .as_bytes()
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

/// Decodes `%XX` escapes of unreserved characters (`A–Z a–z 0–9 - . _ ~`); every other
/// escape, valid or not, is kept as written.
fn decode_unreserved(path: &str) -> Cow<'_, str> {
    if !path.contains('%') {
        return Cow::Borrowed(path);
    }
    let b = path.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            if let Some(c) = b.get(i + 1..i + 3).and_then(hex_pair) {
                if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') {
                    out.push(c);
                    i += 3;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    // Only ASCII bytes were substituted into a `str`, so this cannot fail.
    Cow::Owned(String::from_utf8(out).unwrap_or_default())
}

/// The byte a two-digit hex escape (`%XX` without the `%`) stands for.
pub(crate) fn hex_pair(pair: &[u8]) -> Option<u8> {
    let digit = |c: u8| (c as char).to_digit(16);
    match pair {
        [h, l] => Some((digit(*h)? * 16 + digit(*l)?) as u8),
        _ => None,
    }
}

/// Path segments with empty and `.` segments dropped and `..` resolved.
fn segments(path: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for s in path.split('/') {
        match s {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
    out
}

fn strip_prefix_ignore_case<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| s.get(prefix.len()..))
        .flatten()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn m(uri: &str) -> bool {
        classify(&uri.parse::<Uri>().unwrap()) == Route::SectionSource
    }

    #[test]
    fn s5_matches_the_route_case_insensitively_with_one_trailing_slash() {
        for uri in [
            "/api/v1/section-source",
            "/api/v1/section-source?path=a.md",
            "/api/v1/section-source/",
            "/API/V1/Section-Source/?path=a.md",
            "/.netlify/functions/gateway/api/v1/section-source?path=a",
            "/.NETLIFY/Functions/Gateway/api/v1/section-source",
            "http://evil.example/api/v1/section-source?path=a",
        ] {
            assert!(m(uri), "{uri}");
        }
    }

    #[test]
    fn s5_matches_after_decoding_unreserved_escapes() {
        for uri in [
            "/%61pi/v1/section-source",
            "/api/v1/section%2Dsource",
            "/api/v1/section%2dsource",
            "/%41%50%49/%76%31/%73ection-source",
            "/%2Enetlify/functions/gateway/api/v1/section-source",
            "/.netlify/functions/%67ateway/api/v1/section-source",
            "/api/v1/section-source/%2E",
        ] {
            assert!(m(uri), "{uri}");
        }
    }

    #[test]
    fn s5_matches_normalized_paths_as_a_superset() {
        // Express 4.22 answers 404 to these; a normalizing hop in front could not.
        for uri in [
            "//api/v1/section-source",
            "/api//v1/section-source",
            "/api/v1/section-source//",
            "/api/v1/./section-source",
            "/api/v1/x/../section-source",
            "/api/v1/notes/%2E%2E/section-source",
            "/.netlify/functions/gateway//api/v1/section-source",
            "//.netlify/functions/gateway/api/v1/section-source",
        ] {
            assert!(m(uri), "{uri}");
        }
    }

    #[test]
    fn s5_matches_steals_no_other_route() {
        for uri in [
            "/api/v1/section-sources",
            "/api/v1/section-source/x",
            "/api/v1/section-source-x",
            "/api/v1/section_source",
            "/api/v1/sectionsource",
            "/api/v1/section-source;x",
            "/api/v1/section-source%2F",
            "/api/v1/section-source%3Fpath=a",
            "/api/v2/section-source",
            "/v1/section-source",
            "/section-source",
            "/x/api/v1/section-source",
            "/api/v1/notes/section-source",
            "/.netlify/functions/gatewayapi/v1/section-source",
            "/.netlify/functions/other/api/v1/section-source",
            "/api/v1/section%20source",
            "/api/v1/section-source%2E",
            "/api/v1/section-source.",
            "/mcp",
            "/",
            "*",
        ] {
            let parsed = uri.parse::<Uri>();
            if let Ok(u) = parsed {
                assert_ne!(classify(&u), Route::SectionSource, "{uri}");
            }
        }
    }

    #[test]
    fn decode_unreserved_keeps_reserved_and_invalid_escapes() {
        assert_eq!(decode_unreserved("/%61%2F%2f%zz%4"), "/a%2F%2f%zz%4");
        assert_eq!(decode_unreserved("%7e%5F%2d%2E%30"), "~_-.0");
        assert_eq!(decode_unreserved("%25%61"), "%25a");
    }

    #[test]
    fn s5_the_prefix_is_stripped_as_often_as_it_appears() {
        for uri in [
            "/.netlify/functions/gateway/.netlify/functions/gateway/api/v1/section-source",
            "/.netlify/functions/gateway/.NETLIFY/functions/gateway/.netlify/functions/gateway/api/v1/section-source/",
            "/.netlify/functions/gateway/../api/v1/section-source",
            "/.netlify/functions/gateway/.netlify/functions/gateway/mcp",
        ] {
            assert_ne!(classify(&uri.parse().unwrap()), Route::Passthrough, "{uri}");
        }
        assert_eq!(
            classify(
                &"/.netlify/functions/gateway/.netlify/functions/gatewayapi/v1/section-source"
                    .parse()
                    .unwrap()
            ),
            Route::Passthrough
        );
    }

    #[test]
    fn s6_every_mount_matches() {
        for p in [
            "/mcp",
            "/mcp/",
            "/MCP/",
            "/Mcp?x=1",
            "/.netlify/functions/gateway/mcp",
            "/.NETLIFY/functions/gateway/MCP/",
            "/%6dcp",
        ] {
            assert_eq!(classify(&p.parse().unwrap()), Route::Mcp, "{p}");
        }
        for p in ["/mcpx", "/api/mcp", "/mcp/sub"] {
            assert_eq!(classify(&p.parse().unwrap()), Route::Passthrough, "{p}");
        }
    }
}
