//! The `Origin` check on `/mcp`: the MCP transport's protection against DNS rebinding
//! (a browser page on another origin, or on a name rebound to the sidecar's address,
//! talking to the MCP endpoint).
//!
//! A request that carries no `Origin` (every non-browser MCP client) is not concerned.
//! One that carries exactly one `Origin`, a serialized origin in the allowed set, passes.
//! Anything else is refused with the SDK's own answer to an origin it does not allow:
//! an origin not in the set, `null` (what sandboxed frames, `file:` and `data:` pages
//! and cross-origin redirects send: any page can make one, so it never names a trusted
//! one), a value that is not an origin at all, and more than one `Origin` header (Node
//! joins them with `, `, which is no origin either).
//!
//! The allowed set comes from `mcp.allowed_origins` when it is set, else from
//! `cors.allowed_origins`, each origin with its `www.` twin (the apex of a `www.` host,
//! or the `www.` host of an apex) as the gateway's CORS code pairs them. It never holds
//! the request's own `Host`: under DNS rebinding the attacker's page and the `Host` are
//! the same name, so a "same origin as the Host" rule would let exactly that attack in.
//!
//! Origins compare in their serialized form (RFC 6454 §6.1, as a browser sends them):
//! scheme and host lowercased, an IPv6 host in brackets and compressed, the port
//! dropped when it is the scheme's default, no path, query, fragment or user info.

use std::collections::HashSet;
use std::net::Ipv6Addr;

use http::header::{HeaderMap, ORIGIN};

use crate::config::ConfigError;

/// Most origins `mcp.allowed_origins` may list.
pub const MAX_ALLOWED_ORIGINS: usize = 1024;

/// `text` as a serialized origin, or `None` when it is not one (`null` included).
pub fn normalize(text: &str) -> Option<String> {
    let text = text.trim_matches([' ', '\t']);
    if !text.is_ascii() {
        return None;
    }
    let (scheme, rest) = text.split_once("://")?;
    let scheme_ok = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    if !scheme_ok {
        return None;
    }
    let scheme = scheme.to_ascii_lowercase();
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (inner, after) = v6.split_once(']')?;
        let ip: Ipv6Addr = inner.parse().ok()?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        (format!("[{ip}]"), port)
    } else {
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (rest, None),
        };
        let host_ok = !host.is_empty()
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
        if !host_ok {
            return None;
        }
        (host.to_ascii_lowercase(), port)
    };
    let port = match port {
        None => None,
        Some(p) if !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) => {
            let n: u16 = p.parse().ok()?;
            let default = match scheme.as_str() {
                "http" | "ws" => Some(80),
                "https" | "wss" => Some(443),
                _ => None,
            };
            (default != Some(n)).then_some(n)
        }
        Some(_) => return None,
    };
    Some(match port {
        Some(p) => format!("{scheme}://{host}:{p}"),
        None => format!("{scheme}://{host}"),
    })
}

/// The `www.` twin of a serialized origin whose host is a domain name.
fn twin(origin: &str) -> Option<String> {
    let (scheme, rest) = origin.split_once("://")?;
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p)) if !rest.starts_with('[') => (h, Some(p)),
        _ => (rest, None),
    };
    let ip = host.starts_with('[') || host.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    if ip {
        return None;
    }
    let other = match host.strip_prefix("www.") {
        Some("") => return None,
        Some(apex) => apex.to_owned(),
        None => format!("www.{host}"),
    };
    Some(match port {
        Some(p) => format!("{scheme}://{other}:{p}"),
        None => format!("{scheme}://{other}"),
    })
}

/// What the check made of a request's `Origin`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No `Origin`: not a browser's request.
    Absent,
    /// One allowed origin.
    Allowed,
    /// Refused; the header as the SDK echoes it in its answer (every value, joined
    /// with `, `, each byte read as Latin-1, as Node reads header bytes).
    Refused(String),
}

/// The origins allowed to call `/mcp`.
#[derive(Debug, Clone, Default)]
pub struct AllowedOrigins(HashSet<String>);

impl AllowedOrigins {
    /// The set from `mcp.allowed_origins` (`explicit`) when set, else from the CORS
    /// origins with their twins (an entry there that is not an origin is skipped: no
    /// browser sends it).
    pub fn new(
        explicit: Option<&[String]>,
        cors: &[String],
    ) -> Result<AllowedOrigins, ConfigError> {
        let mut set = HashSet::new();
        match explicit {
            Some(list) => {
                for (i, o) in list.iter().enumerate() {
                    let origin = normalize(o).ok_or_else(|| not_an_origin(i))?;
                    set.insert(origin);
                }
            }
            None => {
                for origin in cors.iter().filter_map(|o| normalize(o)) {
                    set.extend(twin(&origin));
                    set.insert(origin);
                }
            }
        }
        Ok(AllowedOrigins(set))
    }

    /// The check for a request with `headers`.
    pub fn check(&self, headers: &HeaderMap) -> Verdict {
        let mut values = headers.get_all(ORIGIN).iter();
        let Some(first) = values.next() else {
            return Verdict::Absent;
        };
        let repeated = values.next().is_some();
        if !repeated {
            let allowed = first
                .to_str()
                .ok()
                .and_then(normalize)
                .is_some_and(|o| self.0.contains(&o));
            if allowed {
                return Verdict::Allowed;
            }
        }
        let echoed = headers
            .get_all(ORIGIN)
            .iter()
            .map(|v| {
                v.as_bytes()
                    .iter()
                    .map(|b| char::from(*b))
                    .collect::<String>()
            })
            .collect::<Vec<_>>()
            .join(", ");
        Verdict::Refused(echoed)
    }
}

/// The configuration error for entry `index` (0-based) of `mcp.allowed_origins`.
pub fn not_an_origin(index: usize) -> ConfigError {
    ConfigError::new(
        "mcp.allowed_origins",
        format!(
            "entry #{} is not an origin (scheme://host[:port], no path, not null)",
            index + 1
        ),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn origins_are_compared_in_their_serialized_form() {
        for (text, want) in [
            ("https://App.Example.com", "https://app.example.com"),
            ("HTTPS://app.example.com:443", "https://app.example.com"),
            ("http://localhost:80", "http://localhost"),
            ("http://localhost:6274", "http://localhost:6274"),
            ("http://127.0.0.1:3000", "http://127.0.0.1:3000"),
            ("http://[0:0:0:0:0:0:0:1]:8080", "http://[::1]:8080"),
            ("https://[::1]", "https://[::1]"),
            (
                "chrome-extension://abcdefghij",
                "chrome-extension://abcdefghij",
            ),
            ("https://a.example:00443", "https://a.example"),
            (" https://a.example ", "https://a.example"),
        ] {
            assert_eq!(normalize(text).as_deref(), Some(want), "{text}");
        }
        for bad in [
            "null",
            "Null",
            "",
            "*",
            "https://",
            "https://a.example/",
            "https://a.example/path",
            "https://a.example?x",
            "https://a.example#x",
            "https://user@a.example",
            "https://a.example:",
            "https://a.example:99999",
            "https://a.example:x",
            "https://a example",
            "https://bücher.example",
            "a.example",
            "//a.example",
            "1http://a.example",
            "http://[::1",
            "http://[zz]",
            "http://a.example, http://b.example",
        ] {
            assert_eq!(normalize(bad), None, "{bad:?}");
        }
    }

    fn headers(origins: &[&[u8]]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for o in origins {
            h.append(ORIGIN, HeaderValue::from_bytes(o).unwrap());
        }
        h
    }

    #[test]
    fn the_default_set_is_the_cors_origins_and_their_twins() {
        let cors = [
            "https://hub.example".to_owned(),
            "https://www.app.example:8443".to_owned(),
            "http://10.0.0.1".to_owned(),
            "null".to_owned(),
            "not an origin".to_owned(),
        ];
        let set = AllowedOrigins::new(None, &cors).unwrap();
        for ok in [
            &b"https://hub.example"[..],
            b"https://www.hub.example",
            b"https://HUB.example:443",
            b"https://www.app.example:8443",
            b"https://app.example:8443",
            b"http://10.0.0.1",
        ] {
            assert_eq!(set.check(&headers(&[ok])), Verdict::Allowed, "{ok:?}");
        }
        for refused in [
            &b"http://hub.example"[..],
            b"https://hub.example:8443",
            b"https://app.example",
            b"https://www.www.hub.example",
            b"https://evilhub.example",
            b"https://hub.example.evil",
            b"http://www.10.0.0.1",
            b"null",
            b"https://hub.example/",
        ] {
            assert_eq!(
                set.check(&headers(&[refused])),
                Verdict::Refused(String::from_utf8(refused.to_vec()).unwrap()),
                "{refused:?}"
            );
        }
        assert_eq!(set.check(&HeaderMap::new()), Verdict::Absent);
        // Two headers, even both allowed: refused, echoed as Node joins them.
        assert_eq!(
            set.check(&headers(&[b"https://hub.example", b"https://hub.example"])),
            Verdict::Refused("https://hub.example, https://hub.example".to_owned())
        );
        // Bytes beyond ASCII are echoed as Node reads them, one character per byte.
        assert_eq!(
            set.check(&headers(&[b"https://h\xc3\xbcb.example"])),
            Verdict::Refused("https://h\u{c3}\u{bc}b.example".to_owned())
        );
        // Nothing configured: every Origin is refused, none is needed.
        let none = AllowedOrigins::new(None, &[]).unwrap();
        assert!(matches!(
            none.check(&headers(&[b"http://localhost"])),
            Verdict::Refused(_)
        ));
        assert_eq!(none.check(&HeaderMap::new()), Verdict::Absent);
    }

    #[test]
    fn an_explicit_set_replaces_the_default_and_holds_only_origins() {
        let cors = ["https://hub.example".to_owned()];
        let explicit = ["https://App.example:8443".to_owned()];
        let set = AllowedOrigins::new(Some(&explicit), &cors).unwrap();
        assert_eq!(
            set.check(&headers(&[b"https://app.example:8443"])),
            Verdict::Allowed
        );
        for refused in [&b"https://hub.example"[..], b"https://www.app.example:8443"] {
            assert!(matches!(
                set.check(&headers(&[refused])),
                Verdict::Refused(_)
            ));
        }
        let e = AllowedOrigins::new(
            Some(&["https://a.example".to_owned(), "null".to_owned()]),
            &[],
        )
        .unwrap_err();
        assert_eq!(e.key, "mcp.allowed_origins");
        assert!(e.message.contains("#2"), "{}", e.message);
    }
}
