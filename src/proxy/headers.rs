//! The header rewriting of everything the sidecar forwards (wire contract §7): hop-by-hop
//! headers out in both directions, and the request headers the gateway is owed.
//!
//! Both run on every passthrough request, so each starts with one pass over the names
//! present, comparing typed names (no hashing, no parsing), and touches the map only for
//! what it found: an ordinary request carries none of the headers removed here.

use std::net::SocketAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

// Headers that describe one hop, never forwarded (RFC 9110 §7.6.1), besides those the
// `Connection` header names; the plain-http client leaves them out of answers itself.
use crate::upstream::wire::HOP_BY_HOP;

const X_GATEWAY_AUTH: HeaderName = HeaderName::from_static("x-gateway-auth");
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// What one pass over the names found.
#[derive(Debug, Default)]
struct Present {
    hop_by_hop: bool,
    gateway_auth: bool,
    forwarded_for: bool,
}

impl Present {
    fn scan(headers: &HeaderMap) -> Present {
        let mut found = Present::default();
        for name in headers.keys() {
            if HOP_BY_HOP.contains(name) {
                found.hop_by_hop = true;
            } else if name == X_GATEWAY_AUTH {
                found.gateway_auth = true;
            } else if name == X_FORWARDED_FOR {
                found.forwarded_for = true;
            }
        }
        found
    }
}

/// Removes the hop-by-hop headers, including every header `Connection` names, and a
/// `Content-Length` sent beside `Transfer-Encoding` (RFC 9112 §6.3: the length did not
/// frame the message and must not be forwarded; kept, it would cut the re-framed body).
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    if Present::scan(headers).hop_by_hop {
        remove_hop_by_hop(headers);
    }
}

/// [`strip_hop_by_hop`] once a hop-by-hop name is known to be present (`Connection` and
/// `Transfer-Encoding` are among them).
fn remove_hop_by_hop(headers: &mut HeaderMap) {
    if headers.contains_key(header::TRANSFER_ENCODING) {
        headers.remove(header::CONTENT_LENGTH);
    }
    for name in connection_named(headers) {
        headers.remove(name);
    }
    let present: Vec<HeaderName> = headers
        .keys()
        .filter(|name| HOP_BY_HOP.contains(name))
        .cloned()
        .collect();
    for name in present {
        headers.remove(name);
    }
}

/// The header names the `Connection` values list.
fn connection_named(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect()
}

/// A client's address as `X-Forwarded-For` carries it (IPv4-mapped IPv6 as IPv4).
#[derive(Debug, Clone)]
pub struct Peer(HeaderValue);

impl Peer {
    /// Formats `addr`'s IP once.
    pub fn new(addr: SocketAddr) -> Peer {
        let ip = addr.ip().to_canonical().to_string();
        // An IP address's text is always a valid header value.
        Peer(HeaderValue::from_str(&ip).unwrap_or_else(|_| HeaderValue::from_static("unknown")))
    }
}

/// The request headers sent to the gateway (wire contract §7): hop-by-hop removed,
/// `X-Gateway-Auth` removed (a gateway secret never comes from a client), the peer
/// appended to `X-Forwarded-For`, `X-Forwarded-Proto` set. The client's `Host` is
/// replaced by `host`, the gateway's own (see [`crate::upstream::http1_host`]), or
/// removed when there is none, and the upstream client then sends the gateway's
/// authority itself (`Host` on HTTP/1.1, `:authority` on h2, where a `Host` header does
/// not belong).
pub fn forward_request_headers(
    headers: &mut HeaderMap,
    peer: &Peer,
    tls: bool,
    host: Option<&HeaderValue>,
) {
    let present = Present::scan(headers);
    if present.hop_by_hop {
        remove_hop_by_hop(headers);
    }
    if present.gateway_auth {
        headers.remove(X_GATEWAY_AUTH);
    }
    let forwarded_for = if present.forwarded_for {
        let mut joined = Vec::new();
        for v in headers.get_all(X_FORWARDED_FOR) {
            joined.extend_from_slice(v.as_bytes());
            joined.extend_from_slice(b", ");
        }
        joined.extend_from_slice(peer.0.as_bytes());
        HeaderValue::from_bytes(&joined).unwrap_or_else(|_| peer.0.clone())
    } else {
        peer.0.clone()
    };
    // Replaces every prior value.
    headers.insert(X_FORWARDED_FOR, forwarded_for);
    headers.insert(
        X_FORWARDED_PROTO,
        HeaderValue::from_static(if tls { "https" } else { "http" }),
    );
    match host {
        Some(host) => {
            headers.insert(header::HOST, host.clone());
        }
        None => {
            headers.remove(header::HOST);
        }
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn forwarded_headers() {
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("close, x-hop"));
        h.insert("x-hop", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-gateway-auth", HeaderValue::from_static("forged"));
        h.append("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
        h.append("x-forwarded-for", HeaderValue::from_static("10.0.0.2"));
        h.insert("x-kept", HeaderValue::from_static("yes"));
        h.insert("host", HeaderValue::from_static("client.example"));
        forward_request_headers(
            &mut h,
            &Peer::new("127.0.0.1:5000".parse().expect("addr")),
            true,
            None,
        );
        assert!(h.get("connection").is_none());
        assert!(h.get("x-hop").is_none());
        assert!(h.get("keep-alive").is_none());
        assert!(h.get("x-gateway-auth").is_none());
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 10.0.0.2, 127.0.0.1");
        assert_eq!(h["x-forwarded-proto"], "https");
        assert!(h.get("host").is_none());
        assert_eq!(h["x-kept"], "yes");
    }

    #[test]
    fn the_gateway_host_replaces_every_client_host() {
        let mut h = HeaderMap::new();
        h.append("host", HeaderValue::from_static("client.example"));
        h.append("host", HeaderValue::from_static("other.example"));
        let gateway = HeaderValue::from_static("gw.internal:3000");
        forward_request_headers(
            &mut h,
            &Peer::new("127.0.0.1:5000".parse().expect("addr")),
            false,
            Some(&gateway),
        );
        assert_eq!(
            h.get_all("host").iter().collect::<Vec<_>>(),
            ["gw.internal:3000"]
        );
    }

    #[test]
    fn every_hop_by_hop_value_goes_and_a_first_forwarded_for_is_the_peer() {
        let mut h = HeaderMap::new();
        for name in &HOP_BY_HOP {
            h.append(name, HeaderValue::from_static("a"));
            h.append(name, HeaderValue::from_static("b"));
        }
        h.insert("x-kept", HeaderValue::from_static("yes"));
        forward_request_headers(
            &mut h,
            &Peer::new("[::ffff:10.1.2.3]:5000".parse().expect("addr")),
            false,
            None,
        );
        for name in &HOP_BY_HOP {
            assert!(h.get(name).is_none(), "{name} left");
        }
        assert_eq!(
            h.get_all("x-forwarded-for").iter().collect::<Vec<_>>(),
            ["10.1.2.3"]
        );
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-kept"], "yes");
        assert_eq!(h.len(), 3);
    }

    /// Hop-by-hop removal as first written, a lookup per rule.
    fn reference_strip(headers: &mut HeaderMap) {
        if headers.contains_key(header::TRANSFER_ENCODING) {
            headers.remove(header::CONTENT_LENGTH);
        }
        let named = connection_named(headers);
        for name in named.iter().chain(&HOP_BY_HOP) {
            headers.remove(name);
        }
    }

    /// The rewriting as first written, a lookup per rule: what the single pass must
    /// agree with.
    fn reference(headers: &mut HeaderMap, peer: &Peer, tls: bool, host: Option<&HeaderValue>) {
        reference_strip(headers);
        headers.remove(X_GATEWAY_AUTH);
        let mut parts: Vec<&[u8]> = headers
            .get_all(X_FORWARDED_FOR)
            .iter()
            .map(HeaderValue::as_bytes)
            .collect();
        parts.push(peer.0.as_bytes());
        let joined = parts.join(&b", "[..]);
        let forwarded_for = HeaderValue::from_bytes(&joined).expect("joined values");
        headers.insert(X_FORWARDED_FOR, forwarded_for);
        headers.insert(
            X_FORWARDED_PROTO,
            HeaderValue::from_static(if tls { "https" } else { "http" }),
        );
        headers.remove(header::HOST);
        if let Some(host) = host {
            headers.insert(header::HOST, host.clone());
        }
    }

    /// Each name with its values in order; the order between names does not matter.
    fn by_name(headers: &HeaderMap) -> Vec<(String, Vec<Vec<u8>>)> {
        let mut names: Vec<String> = headers.keys().map(|n| n.as_str().to_owned()).collect();
        names.sort();
        names
            .into_iter()
            .map(|n| {
                let values = headers
                    .get_all(n.as_str())
                    .iter()
                    .map(|v| v.as_bytes().to_vec())
                    .collect();
                (n, values)
            })
            .collect()
    }

    const NAMES: [&str; 16] = [
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "proxy-authorization",
        "proxy-authenticate",
        "content-length",
        "host",
        "x-gateway-auth",
        "x-forwarded-for",
        "x-forwarded-proto",
        "x-hop",
        "x-kept",
    ];

    fn header() -> impl Strategy<Value = (usize, String)> {
        // Values include names, so `Connection` names other headers, and lists.
        let value = prop_oneof![
            proptest::sample::select(NAMES.to_vec()).prop_map(str::to_owned),
            "[a-z0-9 ,-]{0,24}",
        ];
        (0..NAMES.len(), value)
    }

    proptest! {
        #[test]
        fn the_single_pass_agrees_with_a_lookup_per_rule(
            headers in proptest::collection::vec(header(), 0..12),
            tls in any::<bool>(),
            with_host in any::<bool>(),
        ) {
            let mut map = HeaderMap::new();
            for (i, value) in headers {
                let value = HeaderValue::from_str(&value).expect("value");
                map.append(NAMES[i], value);
            }
            let peer = Peer::new("192.0.2.7:1234".parse().expect("addr"));
            let gateway = HeaderValue::from_static("gw:3000");
            let host = with_host.then_some(&gateway);
            let mut fast = map.clone();
            forward_request_headers(&mut fast, &peer, tls, host);
            let mut slow = map.clone();
            reference(&mut slow, &peer, tls, host);
            prop_assert_eq!(by_name(&fast), by_name(&slow));

            let mut fast = map.clone();
            strip_hop_by_hop(&mut fast);
            let mut slow = map;
            reference_strip(&mut slow);
            prop_assert_eq!(by_name(&fast), by_name(&slow));
        }
    }
}
