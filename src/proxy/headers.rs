//! The header rewriting of everything the sidecar forwards (wire contract §7): hop-by-hop
//! headers out in both directions, and the request headers the gateway is owed.
//!
//! Both run on every passthrough request, so each starts with one pass over the names
//! present, comparing typed names (no hashing, no parsing), and touches the map only for
//! what it found: an ordinary request carries none of the headers removed here.

use std::net::{IpAddr, SocketAddr};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::Authority;

use super::forwarded::{ip_value, said_at, scheme, Trust};

// Headers that describe one hop, never forwarded (RFC 9110 §7.6.1), besides those the
// `Connection` header names; the plain-http client leaves them out of answers itself.
use crate::upstream::wire::HOP_BY_HOP;

const X_GATEWAY_AUTH: HeaderName = HeaderName::from_static("x-gateway-auth");
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// What one pass over the names found. The `X-Forwarded-*` headers are not looked for:
/// every request gets its own, replacing theirs, and only trusted hops' are read.
#[derive(Debug, Default)]
struct Present {
    hop_by_hop: bool,
    gateway_auth: bool,
    forwarded: bool,
}

impl Present {
    fn scan(headers: &HeaderMap) -> Present {
        let mut found = Present::default();
        for name in headers.keys() {
            if HOP_BY_HOP.contains(name) {
                found.hop_by_hop = true;
            } else if name == X_GATEWAY_AUTH {
                found.gateway_auth = true;
            } else if name == header::FORWARDED {
                found.forwarded = true;
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

/// The sidecar's peer on a connection: its address (IPv4-mapped IPv6 as IPv4) and that
/// address as `X-Forwarded-For` carries it, formatted once per connection.
#[derive(Debug, Clone)]
pub struct Peer {
    ip: IpAddr,
    value: HeaderValue,
}

impl Peer {
    /// Formats `addr`'s IP once.
    pub fn new(addr: SocketAddr) -> Peer {
        let ip = addr.ip().to_canonical();
        Peer {
            ip,
            value: ip_value(ip),
        }
    }
}

/// Where a request came from, as the sidecar saw it.
#[derive(Debug, Clone, Copy)]
pub struct Downstream<'a> {
    /// The connection's peer.
    pub peer: &'a Peer,
    /// Whether the listener terminated TLS.
    pub tls: bool,
    /// The proxies in front of the sidecar whose forwarding headers count.
    pub trust: &'a Trust,
}

/// The request headers sent to the gateway (wire contract §7): hop-by-hop removed,
/// `X-Gateway-Auth` removed (a gateway secret never comes from a client), and the client
/// as the gateway, trusting the sidecar as its one proxy hop, must see it:
///
/// - `X-Forwarded-For`: exactly one entry, the client's address ([`Trust::walk`]: the
///   peer unless trusted hops are configured);
/// - `X-Forwarded-Proto`: `https` when the listener terminated TLS, else `http`; or, when
///   the peer is a trusted hop, what the trusted hops said (`http` or `https`), read at
///   the client's depth ([`said_at`]);
/// - `X-Forwarded-Host`: the host the client asked for (its `Host`, or the `:authority`
///   on HTTP/2, `authority`); or, when the peer is a trusted hop that sent one, what
///   the trusted hops said;
/// - `Forwarded` (RFC 7239) removed: the gateway does not read it, and a header the
///   sidecar cannot vouch for must not reach it.
///
/// Whatever the client sent in those headers is replaced. The client's `Host` is then
/// replaced by `host`, the gateway's own (see [`crate::upstream::http1_host`]), or
/// removed when there is none, and the upstream client then sends the gateway's
/// authority itself (`Host` on HTTP/1.1, `:authority` on h2, where a `Host` header does
/// not belong).
pub fn forward_request_headers(
    headers: &mut HeaderMap,
    from: &Downstream<'_>,
    authority: Option<&Authority>,
    host: Option<&HeaderValue>,
) {
    let present = Present::scan(headers);
    if present.hop_by_hop {
        remove_hop_by_hop(headers);
    }
    if present.gateway_auth {
        headers.remove(X_GATEWAY_AUTH);
    }
    if present.forwarded {
        headers.remove(header::FORWARDED);
    }
    let own_scheme = if from.tls { "https" } else { "http" };
    // With no trusted hop (the default) nothing in the request is read.
    let (client, proto, trusted_host) = if from.trust.is_none() {
        (from.peer.value.clone(), own_scheme, None)
    } else {
        said_by_hops(headers, from, own_scheme)
    };
    // Each insert replaces every prior value.
    headers.insert(X_FORWARDED_FOR, client);
    headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(proto));
    let client_host = match host {
        Some(host) => headers.insert(header::HOST, host.clone()),
        None => headers.remove(header::HOST),
    };
    // The first `Host` is the one Node keeps.
    let forwarded_host = trusted_host
        .or(client_host)
        .or_else(|| authority.and_then(|a| HeaderValue::from_str(a.as_str()).ok()));
    match forwarded_host {
        Some(value) => {
            headers.insert(X_FORWARDED_HOST, value);
        }
        // No host at all (HTTP/1.0): a client's claim still goes.
        None => {
            headers.remove(X_FORWARDED_HOST);
        }
    }
}

/// The client's address, scheme and host from what the trusted hops in front said
/// ([`Trust::walk`]); the listener's scheme and the client's own host where they said
/// nothing the gateway could use.
fn said_by_hops(
    headers: &HeaderMap,
    from: &Downstream<'_>,
    own_scheme: &'static str,
) -> (HeaderValue, &'static str, Option<HeaderValue>) {
    let walk = from
        .trust
        .walk(from.peer.ip, headers.get_all(X_FORWARDED_FOR).iter());
    if walk.depth == 0 {
        // The peer is not a trusted hop: nothing it sent counts.
        return (from.peer.value.clone(), own_scheme, None);
    }
    let client = if walk.client == from.peer.ip {
        from.peer.value.clone()
    } else {
        ip_value(walk.client)
    };
    let proto = said_at(headers.get_all(X_FORWARDED_PROTO).iter(), walk.depth)
        .and_then(scheme)
        .unwrap_or(own_scheme);
    let host = said_at(headers.get_all(X_FORWARDED_HOST).iter(), walk.depth)
        .filter(|h| !h.is_empty())
        .and_then(|h| HeaderValue::from_bytes(h).ok());
    (client, proto, host)
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;
    use crate::config;
    use proptest::prelude::*;

    fn trust(hops: u32, proxies: &[&str]) -> Trust {
        Trust::new(&config::Forwarded {
            trusted_hops: hops,
            trusted_proxies: proxies.iter().map(|p| (*p).to_owned()).collect(),
        })
        .expect("valid")
    }

    fn rewrite(
        h: &mut HeaderMap,
        peer: &str,
        tls: bool,
        trust: &Trust,
        host: Option<&HeaderValue>,
    ) {
        let peer = Peer::new(peer.parse().expect("addr"));
        let from = Downstream {
            peer: &peer,
            tls,
            trust,
        };
        forward_request_headers(h, &from, None, host);
    }

    fn all<'a>(h: &'a HeaderMap, name: &str) -> Vec<&'a str> {
        h.get_all(name)
            .iter()
            .map(|v| v.to_str().expect("text"))
            .collect()
    }

    #[test]
    fn forwarded_headers() {
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("close, x-hop"));
        h.insert("x-hop", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-gateway-auth", HeaderValue::from_static("forged"));
        h.append("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
        h.append("x-forwarded-for", HeaderValue::from_static("10.0.0.2"));
        h.insert("x-forwarded-proto", HeaderValue::from_static("http"));
        h.insert(
            "x-forwarded-host",
            HeaderValue::from_static("forged.example"),
        );
        h.insert(
            "forwarded",
            HeaderValue::from_static("for=10.0.0.3;proto=http"),
        );
        h.insert("x-kept", HeaderValue::from_static("yes"));
        h.insert("host", HeaderValue::from_static("client.example"));
        rewrite(&mut h, "127.0.0.1:5000", true, &Trust::default(), None);
        assert!(h.get("connection").is_none());
        assert!(h.get("x-hop").is_none());
        assert!(h.get("keep-alive").is_none());
        assert!(h.get("x-gateway-auth").is_none());
        assert!(h.get("forwarded").is_none());
        // A client connecting straight to the sidecar chooses none of them.
        assert_eq!(all(&h, "x-forwarded-for"), ["127.0.0.1"]);
        assert_eq!(all(&h, "x-forwarded-proto"), ["https"]);
        assert_eq!(all(&h, "x-forwarded-host"), ["client.example"]);
        assert!(h.get("host").is_none());
        assert_eq!(h["x-kept"], "yes");
    }

    #[test]
    fn the_gateway_host_replaces_every_client_host() {
        let mut h = HeaderMap::new();
        h.append("host", HeaderValue::from_static("client.example"));
        h.append("host", HeaderValue::from_static("other.example"));
        let gateway = HeaderValue::from_static("gw.internal:3000");
        rewrite(
            &mut h,
            "127.0.0.1:5000",
            false,
            &Trust::default(),
            Some(&gateway),
        );
        assert_eq!(all(&h, "host"), ["gw.internal:3000"]);
        // The first, as Node keeps it.
        assert_eq!(all(&h, "x-forwarded-host"), ["client.example"]);
    }

    #[test]
    fn an_http2_authority_is_the_forwarded_host() {
        let mut h = HeaderMap::new();
        h.insert(
            "x-forwarded-host",
            HeaderValue::from_static("forged.example"),
        );
        let peer = Peer::new("127.0.0.1:5000".parse().expect("addr"));
        let trust = Trust::default();
        let from = Downstream {
            peer: &peer,
            tls: true,
            trust: &trust,
        };
        let authority: Authority = "hub.example:8443".parse().expect("authority");
        forward_request_headers(&mut h, &from, Some(&authority), None);
        assert_eq!(all(&h, "x-forwarded-host"), ["hub.example:8443"]);
        // No host at all: a client's claim is still dropped.
        let mut h = HeaderMap::new();
        h.insert(
            "x-forwarded-host",
            HeaderValue::from_static("forged.example"),
        );
        forward_request_headers(&mut h, &from, None, None);
        assert!(h.get("x-forwarded-host").is_none());
    }

    #[test]
    fn behind_a_trusted_balancer_its_word_counts() {
        let mut h = HeaderMap::new();
        h.append(
            "x-forwarded-for",
            HeaderValue::from_static("6.6.6.6, 198.51.100.7"),
        );
        h.insert("x-forwarded-proto", HeaderValue::from_static("HTTPS"));
        h.insert("x-forwarded-host", HeaderValue::from_static("hub.example"));
        h.insert("host", HeaderValue::from_static("sidecar.internal"));
        rewrite(
            &mut h,
            "10.0.0.9:5000",
            false,
            &trust(1, &["10.0.0.0/8"]),
            None,
        );
        assert_eq!(all(&h, "x-forwarded-for"), ["198.51.100.7"]);
        assert_eq!(all(&h, "x-forwarded-proto"), ["https"]);
        assert_eq!(all(&h, "x-forwarded-host"), ["hub.example"]);

        // The same headers from a peer outside the balancer's range: its own word only.
        let mut h = HeaderMap::new();
        h.append(
            "x-forwarded-for",
            HeaderValue::from_static("6.6.6.6, 198.51.100.7"),
        );
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        h.insert(
            "x-forwarded-host",
            HeaderValue::from_static("forged.example"),
        );
        h.insert("host", HeaderValue::from_static("hub.example"));
        rewrite(
            &mut h,
            "203.0.113.5:5000",
            false,
            &trust(1, &["10.0.0.0/8"]),
            None,
        );
        assert_eq!(all(&h, "x-forwarded-for"), ["203.0.113.5"]);
        assert_eq!(all(&h, "x-forwarded-proto"), ["http"]);
        assert_eq!(all(&h, "x-forwarded-host"), ["hub.example"]);

        // A balancer that says nothing usable: the listener's scheme, the client's host,
        // the balancer's own address.
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-proto", HeaderValue::from_static("gopher"));
        h.insert("x-forwarded-host", HeaderValue::from_static(" "));
        h.insert("host", HeaderValue::from_static("hub.example"));
        rewrite(&mut h, "10.0.0.9:5000", true, &trust(1, &[]), None);
        assert_eq!(all(&h, "x-forwarded-for"), ["10.0.0.9"]);
        assert_eq!(all(&h, "x-forwarded-proto"), ["https"]);
        assert_eq!(all(&h, "x-forwarded-host"), ["hub.example"]);
    }

    #[test]
    fn every_hop_by_hop_value_goes_and_a_first_forwarded_for_is_the_peer() {
        let mut h = HeaderMap::new();
        for name in &HOP_BY_HOP {
            h.append(name, HeaderValue::from_static("a"));
            h.append(name, HeaderValue::from_static("b"));
        }
        h.insert("x-kept", HeaderValue::from_static("yes"));
        rewrite(
            &mut h,
            "[::ffff:10.1.2.3]:5000",
            false,
            &Trust::default(),
            None,
        );
        for name in &HOP_BY_HOP {
            assert!(h.get(name).is_none(), "{name} left");
        }
        assert_eq!(all(&h, "x-forwarded-for"), ["10.1.2.3"]);
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

    /// The rewriting with no trusted hop, a lookup per rule: what the single pass must
    /// agree with.
    fn reference(headers: &mut HeaderMap, peer: &Peer, tls: bool, host: Option<&HeaderValue>) {
        reference_strip(headers);
        headers.remove(X_GATEWAY_AUTH);
        headers.remove(header::FORWARDED);
        headers.insert(X_FORWARDED_FOR, peer.value.clone());
        headers.insert(
            X_FORWARDED_PROTO,
            HeaderValue::from_static(if tls { "https" } else { "http" }),
        );
        let client_host = headers.get(header::HOST).cloned();
        headers.remove(X_FORWARDED_HOST);
        if let Some(client_host) = client_host {
            headers.insert(X_FORWARDED_HOST, client_host);
        }
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

    const NAMES: [&str; 18] = [
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
        "x-forwarded-host",
        "forwarded",
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

    /// What a client could put in an `X-Forwarded-For` entry: mostly addresses.
    fn claimed_address() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<[u8; 4]>().prop_map(|o| std::net::Ipv4Addr::from(o).to_string()),
            any::<[u16; 8]>().prop_map(|s| std::net::Ipv6Addr::from(s).to_string()),
            "[ -+--~]{0,20}",
        ]
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
            let trust = Trust::default();
            let from = Downstream { peer: &peer, tls, trust: &trust };
            let mut fast = map.clone();
            forward_request_headers(&mut fast, &from, None, host);
            let mut slow = map.clone();
            reference(&mut slow, &peer, tls, host);
            prop_assert_eq!(by_name(&fast), by_name(&slow));

            let mut fast = map.clone();
            strip_hop_by_hop(&mut fast);
            let mut slow = map;
            reference_strip(&mut slow);
            prop_assert_eq!(by_name(&fast), by_name(&slow));
        }

        /// Whatever a client sends, with no trusted hop the gateway gets exactly one
        /// `X-Forwarded-For`, the peer, and one `X-Forwarded-Proto`, the listener's.
        #[test]
        fn a_direct_client_chooses_neither_address_nor_scheme(
            lines in proptest::collection::vec(
                proptest::collection::vec(claimed_address(), 1..4).prop_map(|l| l.join(", ")),
                0..4,
            ),
            protos in proptest::collection::vec(
                prop_oneof![
                    proptest::sample::select(vec!["http", "https", "HTTPS", "https, http"])
                        .prop_map(str::to_owned),
                    "[ -~]{0,12}",
                ],
                0..3,
            ),
            tls in any::<bool>(),
            hops in 0u32..=3,
        ) {
            let mut h = HeaderMap::new();
            for l in &lines {
                h.append("x-forwarded-for", HeaderValue::from_str(l).expect("value"));
            }
            for p in &protos {
                h.append("x-forwarded-proto", HeaderValue::from_str(p).expect("value"));
            }
            // With hops configured, a peer outside the trusted range is as direct.
            let t = if hops == 0 { Trust::default() } else { trust(hops, &["10.0.0.0/8"]) };
            rewrite(&mut h, "203.0.113.5:1", tls, &t, None);
            prop_assert_eq!(all(&h, "x-forwarded-for"), ["203.0.113.5"]);
            prop_assert_eq!(all(&h, "x-forwarded-proto"), [if tls { "https" } else { "http" }]);
        }
    }
}
