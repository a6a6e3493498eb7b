//! The request id that follows one request: on its access line and to the gateway as
//! `X-Request-Id`. The caller's own `X-Request-Id` when it sends one in a bounded form,
//! else the trace id of its W3C `traceparent`, else one made here.
//!
//! A caller's id is the caller's word, logged as it came: only letters, digits and
//! `._:-`, at most 64 of them, so it can carry no space, quote or control character into
//! a log line, and nothing longer than an id.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use http::header::HeaderName;
use http::{HeaderMap, HeaderValue};

/// The header the id comes in and goes to the gateway in. A name made once: a name
/// given as text is parsed again at every lookup, and every request looks.
pub const HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// The W3C trace context header an id may come from.
const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// Longest caller id taken.
pub const MAX_LEN: usize = 64;

tokio::task_local! {
    /// The id of the request the current task is answering.
    static CURRENT: HeaderValue;
}

/// The id for a request with `headers`.
pub fn of(headers: &HeaderMap) -> HeaderValue {
    from_caller(headers).unwrap_or_else(make)
}

/// The id the caller gave: its `X-Request-Id` in the bounded form, else the trace id of
/// its `traceparent`.
pub fn from_caller(headers: &HeaderMap) -> Option<HeaderValue> {
    from_header(headers).or_else(|| from_traceparent(headers))
}

/// Runs `f` as the request with `id`: [`current`] answers it inside. A plain function,
/// not an `async` one, so that `f` is held once and not also as an argument.
pub fn scope<F: std::future::Future>(
    id: HeaderValue,
    f: F,
) -> impl std::future::Future<Output = F::Output> {
    CURRENT.scope(id, f)
}

/// Runs `f` as the request with `id`, synchronously: for work that outlives the request's
/// task, such as a shadow comparison run when the answer body ends.
pub fn sync_scope<R>(id: Option<HeaderValue>, f: impl FnOnce() -> R) -> R {
    match id {
        Some(id) => CURRENT.sync_scope(id, f),
        None => f(),
    }
}

/// The id of the request being answered, if any.
pub fn current() -> Option<HeaderValue> {
    CURRENT.try_with(HeaderValue::clone).ok()
}

/// A caller's `X-Request-Id`: exactly one, in the bounded form.
fn from_header(headers: &HeaderMap) -> Option<HeaderValue> {
    let mut values = headers.get_all(&HEADER).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    let bytes = value.as_bytes();
    let valid = !bytes.is_empty()
        && bytes.len() <= MAX_LEN
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    valid.then(|| value.clone())
}

/// The trace id of a valid W3C `traceparent` (version `00`, or a later one read as `00`
/// reads it): 32 lowercase hex digits, not all zero.
fn from_traceparent(headers: &HeaderMap) -> Option<HeaderValue> {
    let mut values = headers.get_all(&TRACEPARENT).iter();
    let value = values.next()?.to_str().ok()?;
    if values.next().is_some() {
        return None;
    }
    let mut parts = value.trim().split('-');
    let (version, trace, parent, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let valid = hex(version, 2)
        && version != "ff"
        && (version != "00" || parts.next().is_none())
        && hex(trace, 32)
        && trace.bytes().any(|b| b != b'0')
        && hex(parent, 16)
        && parent.bytes().any(|b| b != b'0')
        && hex(flags, 2);
    valid.then(|| HeaderValue::from_str(trace).ok()).flatten()
}

/// Numbers each thread takes from the process-wide counter at a time: a worker counts
/// its requests' ids itself and touches the shared counter once per block.
const ID_BLOCK: u64 = 1 << 16;

/// The next number of the calling thread's block of `counter`, unique in the process.
fn next_number(counter: &AtomicU64) -> u64 {
    thread_local! {
        static BLOCK: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
    }
    BLOCK.with(|block| {
        let (mut next, mut end) = block.get();
        if next == end {
            next = counter.fetch_add(ID_BLOCK, Ordering::Relaxed);
            end = next.wrapping_add(ID_BLOCK);
        }
        block.set((next.wrapping_add(1), end));
        next
    })
}

/// A new id: 32 hex digits, a per-process random half and a counter, so ids are unique
/// within a process and unlikely to repeat across processes.
pub fn make() -> HeaderValue {
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        // The standard library's per-process random keys; no dependency needed.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(u64::from(std::process::id()));
        h.finish()
    });
    let n = next_number(&NEXT);
    let mut text = [0u8; 32];
    hex_into(&mut text[..16], prefix);
    hex_into(&mut text[16..], n);
    // 32 ASCII hex digits are always a valid header value.
    HeaderValue::from_bytes(&text).unwrap_or_else(|_| HeaderValue::from_static("0"))
}

fn hex_into(out: &mut [u8], mut v: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for slot in out.iter_mut().rev() {
        *slot = DIGITS[(v & 0xf) as usize];
        v >>= 4;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_callers_id_then_the_trace_id_then_a_new_one() {
        assert_eq!(
            of(&headers(&[("x-request-id", "req-42.a:b_c")])),
            "req-42.a:b_c"
        );
        assert_eq!(
            of(&headers(&[("x-request-id", "abc"), ("traceparent", TP)])),
            "abc"
        );
        assert_eq!(
            of(&headers(&[("traceparent", TP)])),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        let made = of(&HeaderMap::new());
        assert_eq!(made.len(), 32);
        assert!(made.as_bytes().iter().all(u8::is_ascii_hexdigit));
        assert_ne!(made, of(&HeaderMap::new()), "ids are unique");
    }

    #[test]
    fn threads_number_ids_from_blocks_of_their_own() {
        let counter = AtomicU64::new(0);
        let mut all: Vec<u64> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..3)
                .map(|_| {
                    s.spawn(|| {
                        (0..ID_BLOCK + 5)
                            .map(|_| next_number(&counter))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            threads
                .into_iter()
                .flat_map(|t| t.join().unwrap_or_default())
                .collect()
        });
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "no number twice");
        assert_eq!(n as u64, 3 * (ID_BLOCK + 5));
        // Each thread took two blocks: the shared counter moved six times, not 196,623.
        assert_eq!(counter.load(Ordering::Relaxed), 6 * ID_BLOCK);
    }

    #[test]
    fn ids_outside_the_bounded_form_are_replaced() {
        let long = "a".repeat(MAX_LEN + 1);
        for bad in [
            "",
            "has space",
            "quote\"d",
            "a/b",
            "x=1",
            long.as_str(),
            "é",
        ] {
            let Ok(value) = HeaderValue::from_str(bad) else {
                continue;
            };
            let mut h = HeaderMap::new();
            h.insert(HEADER, value);
            let id = of(&h);
            assert_ne!(id.as_bytes(), bad.as_bytes(), "{bad:?}");
            assert_eq!(id.len(), 32, "{bad:?}");
        }
        // Two ids: neither is believed.
        let two = headers(&[("x-request-id", "a"), ("x-request-id", "b")]);
        assert_eq!(of(&two).len(), 32);
        for tp in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        ] {
            let id = of(&headers(&[("traceparent", tp)]));
            assert_ne!(id, "4bf92f3577b34da6a3ce929d0e0e4736", "{tp}");
        }
    }

    #[tokio::test]
    async fn the_current_id_is_the_scopes() {
        assert!(current().is_none());
        let id = HeaderValue::from_static("abc");
        let seen = scope(id, async { current() }).await;
        assert_eq!(seen, Some(HeaderValue::from_static("abc")));
    }
}
