//! The gateway's CORS headers (wire contract §5). The gateway sets them on every answer
//! (one Express middleware before every route), so every answer the sidecar builds
//! itself carries them too: the REST route and `/mcp` alike.

use http::HeaderValue;

use crate::config::ConfigError;

/// `Access-Control-Allow-Methods`, as the gateway sends it.
pub const ALLOW_METHODS: &str = "GET, POST, PUT, PATCH, DELETE, OPTIONS";
/// `Access-Control-Allow-Headers`, as the gateway sends it.
pub const ALLOW_HEADERS: &str = "Authorization, Content-Type, X-Vault-Id, X-User-Id";

/// The gateway's CORS headers (§5).
#[derive(Debug, Clone)]
pub struct Cors {
    origins: Vec<String>,
    parsed: Vec<Option<Origin>>,
    first: Option<HeaderValue>,
}

/// An origin reduced to what the www/apex twin rule compares.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Origin {
    scheme: String,
    host: String,
}

impl Origin {
    /// `scheme://host[:port]` and nothing else; scheme and host lowercased.
    fn parse(s: &str) -> Option<Origin> {
        let (scheme, rest) = s.split_once("://")?;
        let scheme_ok = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
        if !scheme_ok || rest.is_empty() || rest.contains(['/', '?', '#', '@', '\\']) {
            return None;
        }
        let host = if rest.starts_with('[') {
            let end = rest.find(']')?;
            let after = &rest[end + 1..];
            if !(after.is_empty() || valid_port(after.strip_prefix(':')?)) {
                return None;
            }
            &rest[..=end]
        } else {
            match rest.rsplit_once(':') {
                Some((h, port)) if valid_port(port) => h,
                Some(_) => return None,
                None => rest,
            }
        };
        if host.is_empty() {
            return None;
        }
        Some(Origin {
            scheme: scheme.to_ascii_lowercase(),
            host: host.to_ascii_lowercase(),
        })
    }

    /// Same scheme; hosts equal or differing by one leading `www.`; port ignored.
    fn is_twin(&self, other: &Origin) -> bool {
        let www = |a: &str, b: &str| a.strip_prefix("www.") == Some(b);
        self.scheme == other.scheme
            && (self.host == other.host
                || www(&self.host, &other.host)
                || www(&other.host, &self.host))
    }
}

fn valid_port(p: &str) -> bool {
    !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit())
}

impl Cors {
    /// Parses `cors.allowed_origins`.
    pub fn new(origins: &[String]) -> Result<Cors, ConfigError> {
        let values = origins
            .iter()
            .map(|o| HeaderValue::from_str(o))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| ConfigError {
                key: "cors.allowed_origins".to_owned(),
                message: "an origin is not a valid header value".to_owned(),
            })?;
        Ok(Cors {
            origins: origins.to_vec(),
            parsed: origins.iter().map(|o| Origin::parse(o)).collect(),
            first: values.into_iter().next(),
        })
    }

    /// The origin to allow for a request `Origin`: itself when listed or a twin of a
    /// listed one, else the first listed.
    fn allow_origin(&self, request: Option<&HeaderValue>) -> Option<HeaderValue> {
        let first = self.first.clone()?;
        let Some((value, text)) = request.and_then(|v| Some((v, v.to_str().ok()?))) else {
            return Some(first);
        };
        if self.origins.iter().any(|o| o == text) {
            return Some(value.clone());
        }
        let twin = Origin::parse(text)
            .is_some_and(|r| self.parsed.iter().flatten().any(|o| o.is_twin(&r)));
        Some(if twin { value.clone() } else { first })
    }

    /// Sets the CORS headers for a request with `origin` on an answer's headers.
    pub fn apply(&self, h: &mut http::HeaderMap, origin: Option<&HeaderValue>) {
        match self.allow_origin(origin) {
            None => {
                h.insert(
                    http::header::ACCESS_CONTROL_ALLOW_ORIGIN,
                    HeaderValue::from_static("*"),
                );
            }
            Some(allow) => {
                h.insert(http::header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
                h.insert(
                    http::header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                    HeaderValue::from_static("true"),
                );
                h.insert(http::header::VARY, HeaderValue::from_static("Origin"));
            }
        }
        h.insert(
            http::header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static(ALLOW_METHODS),
        );
        h.insert(
            http::header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static(ALLOW_HEADERS),
        );
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn cors(origins: &[&str]) -> Cors {
        Cors::new(&origins.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    fn allowed(c: &Cors, origin: &str) -> Option<String> {
        let v = HeaderValue::from_str(origin).unwrap();
        c.allow_origin(Some(&v))
            .map(|v| v.to_str().unwrap().to_owned())
    }

    #[test]
    fn s5_cors_without_configured_origins_is_star() {
        let c = cors(&[]);
        let mut h = http::HeaderMap::new();
        c.apply(&mut h, Some(&HeaderValue::from_static("https://x.example")));
        assert_eq!(h["access-control-allow-origin"], "*");
        assert!(h.get("access-control-allow-credentials").is_none());
        assert!(h.get("vary").is_none());
        assert_eq!(h["access-control-allow-methods"], ALLOW_METHODS);
        assert_eq!(h["access-control-allow-headers"], ALLOW_HEADERS);
    }

    #[test]
    fn s5_cors_listed_twin_or_first() {
        let c = cors(&["https://app.example.com", "https://www.other.example"]);
        let first = Some("https://app.example.com".to_owned());
        assert_eq!(allowed(&c, "https://app.example.com"), first);
        assert_eq!(
            allowed(&c, "https://www.other.example"),
            Some("https://www.other.example".into())
        );
        // Twins: a leading www. either way, port ignored, same scheme.
        for twin in [
            "https://www.app.example.com",
            "https://other.example",
            "https://app.example.com:8443",
            "https://WWW.App.Example.com",
        ] {
            assert_eq!(allowed(&c, twin), Some(twin.to_owned()), "{twin}");
        }
        for stranger in [
            "http://app.example.com",
            "https://www.www.app.example.com",
            "https://evilapp.example.com",
            "https://app.example.com.evil",
            "https://wwwapp.example.com",
            "https://app.example.com/path",
            "https://user@app.example.com",
            "null",
            "",
            "https://app.example.com:x",
        ] {
            assert_eq!(allowed(&c, stranger), first, "{stranger}");
        }
        assert_eq!(
            c.allow_origin(None).map(|v| v.to_str().unwrap().to_owned()),
            first
        );
        let mut h = http::HeaderMap::new();
        c.apply(&mut h, None);
        assert_eq!(h["access-control-allow-credentials"], "true");
        assert_eq!(h["vary"], "Origin");
    }

    #[test]
    fn s5_cors_rejects_unusable_configured_origins() {
        assert!(Cors::new(&["https://a\nb".to_owned()]).is_err());
    }
}
