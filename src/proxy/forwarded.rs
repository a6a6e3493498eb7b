//! Who a forwarded request came from, as the gateway is told it (wire contract §7). The
//! gateway trusts exactly one proxy hop (Express `trust proxy` = 1): it takes the client's
//! address from the last `X-Forwarded-For` entry, the scheme from `X-Forwarded-Proto` and
//! the host from `X-Forwarded-Host`, as its one trusted hop sent them. The sidecar is that
//! hop, so it works them out here from its peer, its listener and what the proxies it
//! trusts (`[forwarded]`) said, and never from what an untrusted client claimed.
//!
//! The rule. The chain is the request's `X-Forwarded-For` entries (every field line, in
//! order), then the peer. It is walked from the right, starting at the peer. An address
//! is a trusted hop when fewer than `trusted_hops` hops have been passed and it is in
//! `trusted_proxies` (any address when that list is empty); then the entry to its left,
//! which that hop wrote, is read next. The first address reached that is not a trusted
//! hop is the client. When the walk runs out first (no entry left, or one that is not an
//! IP address), the client is the last address reached: the peer, or an entry a trusted
//! hop wrote. So every address the walk reaches was seen by the sidecar or written by a
//! trusted hop, and no entry a client wrote itself can decide: with no trusted hop the
//! client is the peer, whatever it sent.
//!
//! At most `trusted_hops` entries are read, from the right, without allocating; with the
//! default (no trusted hop) nothing is read at all.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use http::header::HeaderValue;
use ipnet::IpNet;

use crate::config::{self, ConfigError};

/// The proxies in front of the sidecar whose forwarding headers count (`[forwarded]`).
#[derive(Debug, Clone, Default)]
pub struct Trust {
    hops: u32,
    proxies: Vec<IpNet>,
}

/// What the walk found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Walk {
    /// The client's address.
    pub client: IpAddr,
    /// Trusted hops passed, the peer included when it is one: `0` when the peer is not
    /// trusted, and nothing in the request's headers counts.
    pub depth: u32,
}

/// The longest entry that can be an address: `[` + 45 bytes of IPv6 text + `]:65535`.
const MAX_ENTRY: usize = 53;

impl Trust {
    /// Reads `[forwarded]` (validated: this only fails on a configuration built by hand).
    pub fn new(forwarded: &config::Forwarded) -> Result<Trust, ConfigError> {
        Ok(Trust {
            hops: forwarded.trusted_hops.min(config::MAX_TRUSTED_HOPS),
            proxies: config::trusted_proxies(forwarded)?,
        })
    }

    /// Whether no hop is trusted (the default): the peer is the client and the listener
    /// gives the scheme, whatever the request says.
    pub fn is_none(&self) -> bool {
        self.hops == 0
    }

    fn trusts(&self, addr: &IpAddr) -> bool {
        self.proxies.is_empty() || self.proxies.iter().any(|net| net.contains(addr))
    }

    /// Walks the chain (the `X-Forwarded-For` field lines `forwarded_for`, in order, then
    /// `peer`) from the right, as the module's rule says. Addresses are compared and
    /// returned in canonical form (IPv4-mapped IPv6 as IPv4).
    pub fn walk<'a, I>(&self, peer: IpAddr, forwarded_for: I) -> Walk
    where
        I: DoubleEndedIterator<Item = &'a HeaderValue>,
    {
        let mut at = Walk {
            client: peer.to_canonical(),
            depth: 0,
        };
        if !self.trusts(&at.client) {
            return at;
        }
        let mut entries = entries_from_right(forwarded_for);
        while at.depth < self.hops && self.trusts(&at.client) {
            at.depth += 1;
            match entries.next().and_then(address) {
                Some(next) => at.client = next,
                // The header ran out or holds something a hop would not write: the last
                // address reached stands.
                None => break,
            }
        }
        at
    }
}

/// The comma-separated entries of a header's field lines, last first.
fn entries_from_right<'a, I>(values: I) -> impl Iterator<Item = &'a [u8]>
where
    I: DoubleEndedIterator<Item = &'a HeaderValue>,
{
    values
        .rev()
        .flat_map(|v| v.as_bytes().rsplit(|&b| b == b','))
}

/// The entry of a header written by the `depth`-th trusted hop, counted from the right as
/// `X-Forwarded-For` is (hops that append write one entry each), or its first entry when
/// it has fewer (hops that set a single value). `None` when the header is absent or
/// `depth` is 0.
pub fn said_at<'a, I>(values: I, depth: u32) -> Option<&'a [u8]>
where
    I: DoubleEndedIterator<Item = &'a HeaderValue>,
{
    let mut found = None;
    for (entry, n) in entries_from_right(values).zip(1..=depth) {
        found = Some(entry);
        if n == depth {
            break;
        }
    }
    found.map(trim)
}

/// An `X-Forwarded-Proto` entry as a scheme the gateway knows, `http` or `https` in any
/// case; anything else is ignored.
pub fn scheme(entry: &[u8]) -> Option<&'static str> {
    if entry.eq_ignore_ascii_case(b"https") {
        Some("https")
    } else if entry.eq_ignore_ascii_case(b"http") {
        Some("http")
    } else {
        None
    }
}

/// Optional whitespace around a list entry (RFC 9110 §5.6.1).
fn trim(entry: &[u8]) -> &[u8] {
    let start = entry
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t'))
        .unwrap_or(entry.len());
    let end = entry
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t'))
        .map_or(start, |i| i + 1);
    &entry[start..end]
}

/// One `X-Forwarded-For` entry as an address, in canonical form (IPv4-mapped IPv6 as
/// IPv4): an IPv4 or IPv6 address, IPv6 optionally in brackets, either with a port
/// (`192.0.2.1:443`, `[2001:db8::1]:443`, as some balancers write it). Anything else
/// (`unknown`, an obfuscated name, a zone index, an empty entry) is `None`.
fn address(entry: &[u8]) -> Option<IpAddr> {
    let entry = trim(entry);
    if entry.is_empty() || entry.len() > MAX_ENTRY {
        return None;
    }
    let text = std::str::from_utf8(entry).ok()?;
    if let Some(rest) = text.strip_prefix('[') {
        let (inner, after) = rest.split_once(']')?;
        if !after.is_empty() && !after.strip_prefix(':').is_some_and(is_port) {
            return None;
        }
        return inner
            .parse::<Ipv6Addr>()
            .ok()
            .map(|ip| IpAddr::V6(ip).to_canonical());
    }
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    let (host, port) = text.split_once(':')?;
    if !is_port(port) {
        return None;
    }
    host.parse::<Ipv4Addr>().ok().map(IpAddr::V4)
}

fn is_port(text: &str) -> bool {
    (1..=5).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_digit())
}

/// `ip` as header text, formatted without a heap buffer of its own. IPv4, what clients
/// behind a balancer mostly have, is written digit by digit: `fmt` machinery cost about a
/// thousand instructions a request for it.
pub fn ip_value(ip: IpAddr) -> HeaderValue {
    // The longest IPv6 text is 45 bytes.
    let mut buf = [0u8; 48];
    let len = match ip {
        IpAddr::V4(v4) => {
            let mut len = 0;
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    buf[len] = b'.';
                    len += 1;
                }
                let digits = [octet / 100, octet / 10 % 10, octet % 10];
                let skip = if octet >= 100 {
                    0
                } else if octet >= 10 {
                    1
                } else {
                    2
                };
                for d in &digits[skip..] {
                    buf[len] = b'0' + d;
                    len += 1;
                }
            }
            len
        }
        IpAddr::V6(_) => {
            let mut rest = &mut buf[..];
            let _ = write!(rest, "{ip}");
            48 - rest.len()
        }
    };
    // An IP address's text is always a valid header value.
    HeaderValue::from_bytes(&buf[..len]).unwrap_or_else(|_| HeaderValue::from_static("unknown"))
}

#[cfg(test)]
#[allow(clippy::expect_used, clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn trust(hops: u32, proxies: &[&str]) -> Trust {
        Trust::new(&config::Forwarded {
            trusted_hops: hops,
            trusted_proxies: proxies.iter().map(|p| (*p).to_owned()).collect(),
        })
        .expect("valid")
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("ip")
    }

    fn values(lines: &[&str]) -> Vec<HeaderValue> {
        lines
            .iter()
            .map(|l| HeaderValue::from_str(l).expect("value"))
            .collect()
    }

    fn walk(t: &Trust, peer: &str, lines: &[&str]) -> (IpAddr, u32) {
        let v = values(lines);
        let w = t.walk(ip(peer), v.iter());
        (w.client, w.depth)
    }

    #[test]
    fn entries_parse_as_balancers_write_them() {
        for (entry, want) in [
            ("192.0.2.1", Some("192.0.2.1")),
            (" 192.0.2.1\t", Some("192.0.2.1")),
            ("192.0.2.1:8443", Some("192.0.2.1")),
            ("2001:db8::1", Some("2001:db8::1")),
            ("[2001:db8::1]", Some("2001:db8::1")),
            ("[2001:db8::1]:443", Some("2001:db8::1")),
            ("::ffff:192.0.2.7", Some("192.0.2.7")),
            ("[::ffff:192.0.2.7]:1", Some("192.0.2.7")),
            ("unknown", None),
            ("_hidden", None),
            ("", None),
            ("192.0.2.1:", None),
            ("192.0.2.1:123456", None),
            ("192.0.2.1:80:80", None),
            ("[2001:db8::1]x", None),
            ("[192.0.2.1]", None),
            ("fe80::1%eth0", None),
            ("192.0.2.256", None),
            ("example.com", None),
        ] {
            assert_eq!(address(entry.as_bytes()), want.map(ip), "{entry:?}");
        }
        let long = format!("192.0.2.1:{}", "0".repeat(MAX_ENTRY));
        assert_eq!(address(long.as_bytes()), None);
    }

    #[test]
    fn no_trusted_hop_means_the_peer() {
        let t = trust(0, &[]);
        assert!(t.is_none());
        assert_eq!(
            walk(&t, "203.0.113.5", &["198.51.100.1, 10.0.0.1"]),
            (ip("203.0.113.5"), 0)
        );
    }

    #[test]
    fn one_trusted_hop_reads_the_entry_it_wrote() {
        let t = trust(1, &[]);
        // The balancer appended the client it saw; what the client claimed is left of it.
        assert_eq!(
            walk(&t, "10.0.0.9", &["6.6.6.6", "198.51.100.1"]),
            (ip("198.51.100.1"), 1)
        );
        assert_eq!(
            walk(&t, "10.0.0.9", &["6.6.6.6, 198.51.100.1"]),
            (ip("198.51.100.1"), 1)
        );
        // No header, an empty or malformed last entry: the balancer itself.
        assert_eq!(walk(&t, "10.0.0.9", &[]), (ip("10.0.0.9"), 1));
        assert_eq!(walk(&t, "10.0.0.9", &["1.2.3.4, "]), (ip("10.0.0.9"), 1));
        assert_eq!(
            walk(&t, "10.0.0.9", &["1.2.3.4, unknown"]),
            (ip("10.0.0.9"), 1)
        );
    }

    #[test]
    fn two_hops_and_a_short_header() {
        let t = trust(2, &[]);
        assert_eq!(
            walk(&t, "10.0.0.9", &["6.6.6.6, 198.51.100.1, 10.1.1.1"]),
            (ip("198.51.100.1"), 2)
        );
        // One hop appended: the address it wrote, never the peer's claim of more.
        assert_eq!(
            walk(&t, "10.0.0.9", &["198.51.100.1"]),
            (ip("198.51.100.1"), 2)
        );
        // The second hop's entry does not parse: the first hop's entry stands.
        assert_eq!(walk(&t, "10.0.0.9", &["x, 10.1.1.1"]), (ip("10.1.1.1"), 2));
    }

    #[test]
    fn proxies_restrict_which_hops_are_trusted() {
        let t = trust(2, &["10.0.0.0/8"]);
        // A peer outside the ranges is the client, whatever it sent.
        assert_eq!(
            walk(&t, "203.0.113.5", &["198.51.100.1"]),
            (ip("203.0.113.5"), 0)
        );
        // Through one listed balancer only: the client is the first unlisted address.
        assert_eq!(
            walk(&t, "10.0.0.9", &["6.6.6.6, 198.51.100.1"]),
            (ip("198.51.100.1"), 1)
        );
        // Through two listed hops.
        assert_eq!(
            walk(&t, "10.0.0.9", &["6.6.6.6, 198.51.100.1, 10.2.2.2"]),
            (ip("198.51.100.1"), 2)
        );
        // The cap holds even when the next address is listed: a client inside the ranges
        // cannot pass its own claim through the count.
        assert_eq!(
            walk(&t, "10.0.0.9", &["6.6.6.6, 10.3.3.3, 10.2.2.2"]),
            (ip("10.3.3.3"), 2)
        );
        // IPv4-mapped peers are compared as IPv4.
        assert_eq!(
            walk(&t, "::ffff:10.0.0.9", &["198.51.100.1"]),
            (ip("198.51.100.1"), 1)
        );
    }

    #[test]
    fn said_at_counts_like_forwarded_for() {
        let v = values(&["https", "http, HTTP "]);
        assert_eq!(said_at(v.iter(), 1), Some(&b"HTTP"[..]));
        assert_eq!(said_at(v.iter(), 2), Some(&b"http"[..]));
        assert_eq!(said_at(v.iter(), 3), Some(&b"https"[..]));
        // Fewer entries than the depth: the first one.
        assert_eq!(said_at(v.iter(), 9), Some(&b"https"[..]));
        assert_eq!(said_at(v.iter(), 0), None);
        assert_eq!(said_at(std::iter::empty(), 1), None);
        assert_eq!(scheme(b"HTTPS"), Some("https"));
        assert_eq!(scheme(b"ws"), None);
    }

    proptest! {
        #[test]
        fn every_address_formats_as_its_display(v4 in any::<[u8; 4]>(), v6 in any::<[u16; 8]>()) {
            for ip in [IpAddr::from(v4), IpAddr::from(v6)] {
                let value = ip_value(ip);
                prop_assert_eq!(value.to_str().expect("text"), ip.to_string());
            }
        }
    }

    #[test]
    fn addresses_format_as_header_text() {
        for text in [
            "192.0.2.1",
            "2001:db8::1",
            "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255",
        ] {
            assert_eq!(
                ip_value(ip(text)).to_str().expect("text"),
                ip(text).to_string()
            );
        }
    }

    /// An address the generators choose from, some inside `10.0.0.0/8`.
    fn any_ip() -> impl Strategy<Value = IpAddr> {
        prop_oneof![
            any::<[u8; 4]>().prop_map(IpAddr::from),
            any::<[u8; 3]>().prop_map(|o| IpAddr::from([10, o[0], o[1], o[2]])),
            any::<[u16; 8]>().prop_map(|s| IpAddr::from(s).to_canonical()),
        ]
    }

    /// Anything a client could put in an entry.
    fn any_entry() -> impl Strategy<Value = String> {
        prop_oneof![any_ip().prop_map(|ip| ip.to_string()), "[ -~&&[^,]]{0,20}",]
    }

    proptest! {
        /// With no trusted hop, no header a client sends moves its address off the peer.
        #[test]
        fn without_trusted_hops_the_peer_is_the_client(
            peer in any_ip(),
            lines in proptest::collection::vec(proptest::collection::vec(any_entry(), 0..6), 0..4),
            proxies in proptest::bool::ANY,
        ) {
            let lines: Vec<String> = lines.iter().map(|l| l.join(", ")).collect();
            let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
            let t = trust(0, &[]);
            prop_assert_eq!(walk(&t, &peer.to_string(), &lines), (peer, 0));
            // A peer outside the trusted ranges is the client too.
            if proxies && !IpNet::from(ip("192.0.2.0")).contains(&peer) {
                let t = trust(3, &["192.0.2.0/32"]);
                prop_assert_eq!(walk(&t, &peer.to_string(), &lines), (peer, 0));
            }
        }

        /// Behind N trusted hops that each append the address they saw, whatever the
        /// client wrote before them, the client is the address the outermost hop saw.
        #[test]
        fn the_clients_own_entries_never_decide(
            hops in 1u32..=4,
            client in any_ip(),
            claimed in proptest::collection::vec(any_entry(), 0..6),
            hop_addrs in proptest::collection::vec(any_ip(), 4),
            ranges in proptest::bool::ANY,
        ) {
            // The chain the hops build: the client's own entries, then what each hop saw.
            let mut chain: Vec<String> = claimed.clone();
            chain.push(client.to_string());
            let inner: Vec<IpAddr> = hop_addrs[..hops as usize].to_vec();
            // Hop k (1 = outermost) saw hop k-1; the sidecar's peer is the innermost hop.
            for a in &inner[..inner.len() - 1] {
                chain.push(a.to_string());
            }
            let peer = inner[inner.len() - 1];
            let line = chain.join(", ");
            let t = if ranges {
                // Every hop listed: the count still stops the walk at the client, even
                // when the client's address is listed too.
                let nets: Vec<String> = inner.iter().map(|a| a.to_string()).collect();
                let nets: Vec<&str> = nets.iter().map(String::as_str).collect();
                trust(hops, &nets)
            } else {
                trust(hops, &[])
            };
            prop_assert_eq!(walk(&t, &peer.to_string(), &[&line]), (client, hops));
        }

        /// The walk reads at most `trusted_hops` entries, and its answer is always the
        /// peer or an entry within that reach.
        #[test]
        fn the_walk_stays_within_its_reach(
            hops in 0u32..=16,
            peer in any_ip(),
            lines in proptest::collection::vec(proptest::collection::vec(any_entry(), 0..8), 0..4),
        ) {
            let lines: Vec<String> = lines.iter().map(|l| l.join(",")).collect();
            let v: Vec<HeaderValue> = lines.iter().map(|l| HeaderValue::from_str(l).expect("value")).collect();
            let w = trust(hops, &[]).walk(peer, v.iter());
            prop_assert!(w.depth <= hops);
            let reach: Vec<IpAddr> = entries_from_right(v.iter())
                .take(hops as usize)
                .filter_map(address)
                .collect();
            prop_assert!(w.client == peer || reach.contains(&w.client));
        }
    }
}
