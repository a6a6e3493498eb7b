//! HTTP/1.1 as the sidecar speaks it to a plain-http upstream (RFC 9112), without I/O:
//! the request head it writes, the answer head it reads (and how that answer's body is
//! framed), and the chunked decoding of answer bodies.
//!
//! Everything here is strict where RFC 9110 and RFC 9112 allow a choice, because an
//! answer read differently from how the upstream framed it would leave bytes on a
//! connection for the next exchange. An answer whose framing is ambiguous or not allowed
//! is an error, never read one way or another: `Content-Length` beside
//! `Transfer-Encoding`, a repeated or listed `Content-Length` (even of equal values), a
//! transfer coding other than `chunked` alone or on HTTP/1.0, `Content-Length` or
//! `Transfer-Encoding` on a `1xx` or `204` (and `Transfer-Encoding` on a `304`), an
//! obsolete line fold, a bare LF anywhere in a head, a chunk line or the trailers, a
//! status line without the space after its code, a head over the bounds. The connection
//! of such an answer is closed.

use std::mem::MaybeUninit;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version};

/// The largest answer head read (status line and headers), and of a chunked body's
/// trailer section.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// The most headers one answer head may carry.
pub const MAX_HEADERS: usize = 128;

/// The longest chunk-size line (size and extensions).
const MAX_CHUNK_LINE: usize = 4 * 1024;

/// Why an answer cannot be read. The messages name the rule, never the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The status line or a header is not HTTP/1.x.
    #[error("malformed answer head")]
    Head,
    /// The head passed [`MAX_HEAD_BYTES`] or [`MAX_HEADERS`].
    #[error("answer head too large")]
    HeadTooLarge,
    /// `101 Switching Protocols`: the sidecar never asks for an upgrade.
    #[error("unrequested protocol switch")]
    Upgrade,
    /// A `Content-Length` that is not one number in one header, or one beside
    /// `Transfer-Encoding`.
    #[error("invalid or ambiguous content-length")]
    Length,
    /// A `Transfer-Encoding` other than `chunked` alone, or on an HTTP/1.0 answer.
    #[error("unsupported transfer coding")]
    TransferCoding,
    /// Framing headers on a status that has no body (`1xx`, `204`; `Transfer-Encoding`
    /// on `304`).
    #[error("framing headers on a bodiless status")]
    Bodiless,
    /// A chunk-size line, a chunk's end or the trailers are malformed.
    #[error("malformed chunked body")]
    Chunked,
}

impl WireError {
    /// Every variant, for label sets.
    pub const ALL: [WireError; 7] = [
        WireError::Head,
        WireError::HeadTooLarge,
        WireError::Upgrade,
        WireError::Length,
        WireError::TransferCoding,
        WireError::Bodiless,
        WireError::Chunked,
    ];
}

/// How an answer's body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body: a `HEAD` answer, `204`, `304`.
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// Everything until the upstream closes the connection.
    UntilClose,
}

/// Headers that describe one connection (RFC 9110 §7.6.1), besides those `Connection`
/// names: they are never passed on.
pub const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
    header::PROXY_AUTHENTICATE,
];

/// An answer head, ready to become an [`http::Response`].
#[derive(Debug)]
pub struct Head {
    /// The status, never informational.
    pub status: StatusCode,
    /// HTTP/1.0 or HTTP/1.1.
    pub version: Version,
    /// The end-to-end headers as they came, in order: the hop-by-hop ones and those
    /// `Connection` names are left out, as a proxy must leave them.
    pub headers: HeaderMap,
    /// How the body is delimited.
    pub framing: Framing,
    /// Whether the connection may carry another exchange once this answer is read whole.
    pub keep_alive: bool,
}

/// What [`parse_head`] found at the front of a buffer.
#[derive(Debug)]
pub enum Parsed {
    /// More bytes are needed.
    Partial,
    /// An informational (`1xx`) head of this many bytes, to be skipped.
    Informational(usize),
    /// The final head and its length in bytes.
    Final(Head, usize),
}

/// Parses the answer head at the front of `buf`, for a request with `method`.
pub fn parse_head(buf: &[u8], method: &Method) -> Result<Parsed, WireError> {
    // Uninitialised: httparse writes only the headers it finds.
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut response,
        buf,
        &mut slots,
    );
    let len = match parsed {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD_BYTES => {
            return Err(WireError::HeadTooLarge)
        }
        Ok(httparse::Status::Partial) => return Ok(Parsed::Partial),
        Err(httparse::Error::TooManyHeaders) => return Err(WireError::HeadTooLarge),
        Err(_) => return Err(WireError::Head),
    };
    if len > MAX_HEAD_BYTES {
        return Err(WireError::HeadTooLarge);
    }
    // What httparse accepts beyond RFC 9112: lines ended by a bare LF, and a status
    // line without the space after its code ("HTTP/1.1 200\r\n").
    if has_bare_lf(&buf[..len]) || buf.get(12) != Some(&b' ') {
        return Err(WireError::Head);
    }
    let code = response.code.ok_or(WireError::Head)?;
    let status = StatusCode::from_u16(code).map_err(|_| WireError::Head)?;
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Err(WireError::Upgrade);
    }
    let connection = Connection::read(response.headers)?;
    if status.is_informational() {
        // RFC 9110 §8.6, RFC 9112 §6.1: never on a 1xx.
        if connection.framed() {
            return Err(WireError::Bodiless);
        }
        return Ok(Parsed::Informational(len));
    }
    let version = match response.version {
        Some(1) => Version::HTTP_11,
        Some(0) => Version::HTTP_10,
        _ => return Err(WireError::Head),
    };
    if connection.transfer_encoding > 0 {
        if version == Version::HTTP_10 || !connection.chunked {
            return Err(WireError::TransferCoding);
        }
        if connection.length.is_some() {
            return Err(WireError::Length);
        }
    }
    if status == StatusCode::NO_CONTENT && connection.framed()
        || status == StatusCode::NOT_MODIFIED && connection.transfer_encoding > 0
    {
        return Err(WireError::Bodiless);
    }
    // One copy of the head that every value shares, instead of an allocation a value.
    let copy = Bytes::copy_from_slice(&buf[..len]);
    let base = buf.as_ptr() as usize;
    let mut headers = HeaderMap::with_capacity(response.headers.len());
    for h in response.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| WireError::Head)?;
        // Every value lies inside the head; were one not to, it is copied on its own.
        let value = match (h.value.as_ptr() as usize).checked_sub(base) {
            Some(start) if start + h.value.len() <= len => {
                HeaderValue::from_maybe_shared(copy.slice(start..start + h.value.len()))
            }
            _ => HeaderValue::from_bytes(h.value),
        }
        .map_err(|_| WireError::Head)?;
        if HOP_BY_HOP.contains(&name) || connection.names(&name) {
            continue;
        }
        headers.append(name, value);
    }
    let bodiless = method == Method::HEAD
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let framing = if bodiless {
        Framing::Empty
    } else if connection.transfer_encoding > 0 {
        Framing::Chunked
    } else {
        match connection.length {
            Some(n) => Framing::Length(n),
            None => Framing::UntilClose,
        }
    };
    // A bodiless answer that announces a body (a `HEAD` or `304` answer with a length or
    // a coding, as RFC 9110 allows) is read as bodiless, but a body the upstream might
    // send after it all the same would lie on the connection: not used again.
    let announced = bodiless && (connection.transfer_encoding > 0 || connection.length > Some(0));
    let keep_alive = version == Version::HTTP_11
        && framing != Framing::UntilClose
        && !connection.close
        && !announced;
    Ok(Parsed::Final(
        Head {
            status,
            version,
            headers,
            framing,
            keep_alive,
        },
        len,
    ))
}

/// Whether a line of `head` ends with a LF that no CR precedes.
fn has_bare_lf(head: &[u8]) -> bool {
    memchr::memchr_iter(b'\n', head).any(|i| i == 0 || head[i - 1] != b'\r')
}

/// What an answer's head says about its connection and framing (RFC 9112 §6.3, §9.6).
#[derive(Debug, Default)]
struct Connection<'h> {
    /// `Connection: close`.
    close: bool,
    /// Other `Connection` tokens: headers for this connection only.
    named: Vec<&'h [u8]>,
    /// How many `Transfer-Encoding` headers there are.
    transfer_encoding: usize,
    /// Whether there is one `Transfer-Encoding` and its value is `chunked` alone.
    chunked: bool,
    /// The value of the one `Content-Length`.
    length: Option<u64>,
}

impl<'h> Connection<'h> {
    fn read(headers: &[httparse::Header<'h>]) -> Result<Connection<'h>, WireError> {
        let mut found = Connection::default();
        for h in headers {
            if h.name.eq_ignore_ascii_case("connection") {
                let tokens = h.value.split(|&b| b == b',').map(<[u8]>::trim_ascii);
                for token in tokens.filter(|t| !t.is_empty()) {
                    if token.eq_ignore_ascii_case(b"close") {
                        found.close = true;
                    } else if !token.eq_ignore_ascii_case(b"keep-alive") {
                        found.named.push(token);
                    }
                }
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                found.transfer_encoding += 1;
                found.chunked = found.transfer_encoding == 1
                    && h.value.trim_ascii().eq_ignore_ascii_case(b"chunked");
            } else if h.name.eq_ignore_ascii_case("content-length") {
                // A second header or a list, even of one value repeated, is a length
                // another reader might take differently.
                if found.length.is_some() {
                    return Err(WireError::Length);
                }
                found.length = Some(parse_decimal(h.value.trim_ascii()).ok_or(WireError::Length)?);
            }
        }
        Ok(found)
    }

    /// Whether any framing header is present.
    fn framed(&self) -> bool {
        self.transfer_encoding > 0 || self.length.is_some()
    }

    /// Whether `Connection` lists `name`.
    fn names(&self, name: &HeaderName) -> bool {
        !self.named.is_empty()
            && self
                .named
                .iter()
                .any(|t| t.eq_ignore_ascii_case(name.as_str().as_bytes()))
    }
}

/// A `Content-Length` value: one or more ASCII digits, nothing else.
fn parse_decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    digits.iter().try_fold(0u64, |n, d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

/// How a request body is delimited on the way up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestFraming {
    /// No body and no framing header.
    None,
    /// `Content-Length` with this value.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// Writes a request head to `out`: the request line in origin form, every header but
/// `Content-Length` and `Transfer-Encoding` (the body's framing is written from
/// `framing`, never taken from the client), and `Host` from `authority` when `headers`
/// has none. Names and values are `http` types, so no CR, LF or NUL can be written.
pub fn write_request_head(
    out: &mut Vec<u8>,
    method: &Method,
    target: &str,
    authority: &str,
    headers: &HeaderMap,
    framing: RequestFraming,
) {
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    if !headers.contains_key(header::HOST) {
        out.extend_from_slice(b"host: ");
        out.extend_from_slice(authority.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    for (name, value) in headers {
        if name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    match framing {
        RequestFraming::None => {}
        RequestFraming::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            push_decimal(out, n);
            out.extend_from_slice(b"\r\n");
        }
        RequestFraming::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    out.extend_from_slice(b"\r\n");
}

fn push_decimal(out: &mut Vec<u8>, n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// Appends one chunk of a chunked request body: its size line, the data and its CRLF.
pub fn push_chunk(out: &mut Vec<u8>, data: &[u8]) {
    if data.is_empty() {
        // A zero-size chunk would end the body.
        return;
    }
    push_chunk_size(out, data.len());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// Appends the size line of a chunk of `n` bytes (`n` > 0).
pub fn push_chunk_size(out: &mut Vec<u8>, n: usize) {
    let mut size = [0u8; 16];
    let mut i = size.len();
    let mut n = n;
    loop {
        i -= 1;
        size[i] = b"0123456789abcdef"[n % 16];
        n /= 16;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&size[i..]);
    out.extend_from_slice(b"\r\n");
}

/// The end of a chunked request body (no trailers).
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// What [`Chunked::decode`] made of the front of a buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// Body bytes, taken from the buffer.
    Data(Bytes),
    /// More bytes are needed.
    Partial,
    /// The last chunk and the trailers have been read; the body is complete.
    End,
}

/// An incremental decoder of one chunked body (RFC 9112 §7.1). Trailers are read and
/// dropped: nothing the sidecar forwards carries them on.
#[derive(Debug, Default)]
pub struct Chunked {
    state: ChunkState,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// At a chunk-size line.
    #[default]
    Size,
    /// Inside a chunk's data, this many bytes left.
    Data(u64),
    /// At the CRLF after a chunk's data.
    DataEnd,
    /// At the trailer section after the last chunk.
    Trailers,
    /// Done.
    End,
}

impl Chunked {
    /// Decodes from the front of `buf`, removing what it consumed.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, WireError> {
        loop {
            match self.state {
                ChunkState::Size => {
                    let line = match httparse::parse_chunk_size(buf) {
                        Ok(httparse::Status::Complete((len, size))) => (len, size),
                        Ok(httparse::Status::Partial) if buf.len() > MAX_CHUNK_LINE => {
                            return Err(WireError::Chunked)
                        }
                        Ok(httparse::Status::Partial) => return Ok(Decoded::Partial),
                        Err(_) => return Err(WireError::Chunked),
                    };
                    let (len, size) = line;
                    // The line ends at its first CRLF: a lone CR or LF inside an extension
                    // is a line another reader would end elsewhere.
                    if !(3..=MAX_CHUNK_LINE).contains(&len)
                        || &buf[len - 2..len] != b"\r\n"
                        || buf[..len - 2].iter().any(|&b| b == b'\r' || b == b'\n')
                    {
                        return Err(WireError::Chunked);
                    }
                    buf.advance(len);
                    self.state = if size == 0 {
                        ChunkState::Trailers
                    } else {
                        ChunkState::Data(size)
                    };
                }
                ChunkState::Data(left) => {
                    if buf.is_empty() {
                        return Ok(Decoded::Partial);
                    }
                    let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                    let data = buf.split_to(n).freeze();
                    let left = left - n as u64;
                    self.state = if left == 0 {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data(left)
                    };
                    return Ok(Decoded::Data(data));
                }
                ChunkState::DataEnd => {
                    if buf.len() < 2 {
                        return Ok(Decoded::Partial);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(WireError::Chunked);
                    }
                    buf.advance(2);
                    self.state = ChunkState::Size;
                }
                ChunkState::Trailers => {
                    if buf.starts_with(b"\r\n") {
                        buf.advance(2);
                        self.state = ChunkState::End;
                        continue;
                    }
                    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
                    let parsed = httparse::parse_headers(buf, &mut slots);
                    // httparse ends trailer lines at a bare LF too; RFC 9112 does not.
                    let end = match parsed {
                        Ok(httparse::Status::Complete((len, _))) => len.min(buf.len()),
                        _ => buf.len(),
                    };
                    if has_bare_lf(&buf[..end]) {
                        return Err(WireError::Chunked);
                    }
                    match parsed {
                        Ok(httparse::Status::Complete((len, _))) if len <= MAX_HEAD_BYTES => {
                            buf.advance(len);
                            self.state = ChunkState::End;
                        }
                        Ok(httparse::Status::Partial) if buf.len() <= MAX_HEAD_BYTES => {
                            return Ok(Decoded::Partial)
                        }
                        _ => return Err(WireError::Chunked),
                    }
                }
                ChunkState::End => return Ok(Decoded::End),
            }
        }
    }

    /// Whether the body has been read to its end.
    pub fn is_done(&self) -> bool {
        self.state == ChunkState::End
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn head(raw: &str, method: &Method) -> Result<(Head, usize), WireError> {
        match parse_head(raw.as_bytes(), method)? {
            Parsed::Final(head, len) => Ok((head, len)),
            other => panic!("not a final head: {other:?}"),
        }
    }

    fn framing_of(raw: &str) -> Result<Framing, WireError> {
        head(raw, &Method::GET).map(|(h, _)| h.framing)
    }

    #[test]
    fn an_answer_head_is_read_with_its_framing() {
        let raw = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nX-A: 1\r\nX-A: 2\r\n\r\nhello";
        let (h, len) = head(raw, &Method::GET).unwrap();
        assert_eq!(len, raw.len() - 5);
        assert_eq!(h.status, StatusCode::OK);
        assert_eq!(h.version, Version::HTTP_11);
        assert_eq!(h.framing, Framing::Length(5));
        assert!(h.keep_alive);
        let a: Vec<_> = h.headers.get_all("x-a").iter().collect();
        assert_eq!(a, ["1", "2"]);
    }

    #[test]
    fn framing_follows_rfc_9112_section_6_3() {
        assert_eq!(
            framing_of("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Ok(Framing::Chunked)
        );
        assert_eq!(
            framing_of("HTTP/1.1 200 OK\r\nTransfer-Encoding:  Chunked \r\n\r\n"),
            Ok(Framing::Chunked)
        );
        assert_eq!(
            framing_of("HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n"),
            Ok(Framing::Length(7))
        );
        assert_eq!(
            framing_of("HTTP/1.1 200 OK\r\n\r\n"),
            Ok(Framing::UntilClose)
        );
        let (h, _) = head(
            "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n",
            &Method::HEAD,
        )
        .unwrap();
        assert_eq!(h.framing, Framing::Empty);
        let (h, _) = head(
            "HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
            &Method::GET,
        )
        .unwrap();
        assert_eq!(h.framing, Framing::Empty);
        let (h, _) = head("HTTP/1.1 204 No Content\r\n\r\n", &Method::GET).unwrap();
        assert_eq!(h.framing, Framing::Empty);
    }

    #[test]
    fn ambiguous_or_disallowed_framing_is_refused() {
        let refused = [
            // Two framings: which one the upstream meant is anyone's guess.
            (
                "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n",
                WireError::Length,
            ),
            (
                "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n",
                WireError::Length,
            ),
            // Lengths repeated or listed, even equal ones.
            (
                "Content-Length: 7\r\nContent-Length: 7\r\n",
                WireError::Length,
            ),
            (
                "Content-Length: 7\r\nContent-Length: 8\r\n",
                WireError::Length,
            ),
            ("Content-Length: 7, 7\r\n", WireError::Length),
            // Codings other than chunked alone.
            (
                "Transfer-Encoding: gzip, chunked\r\n",
                WireError::TransferCoding,
            ),
            (
                "Transfer-Encoding: chunked, gzip\r\n",
                WireError::TransferCoding,
            ),
            (
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
                WireError::TransferCoding,
            ),
            ("Transfer-Encoding: identity\r\n", WireError::TransferCoding),
            ("Transfer-Encoding: \r\n", WireError::TransferCoding),
        ];
        for (headers, error) in refused {
            let raw = format!("HTTP/1.1 200 OK\r\n{headers}\r\n");
            assert_eq!(framing_of(&raw), Err(error), "{headers:?}");
        }
        for bad in ["+7", "-1", "0x7", "", "7 7", "99999999999999999999"] {
            let raw = format!("HTTP/1.1 200 OK\r\nContent-Length: {bad}\r\n\r\n");
            assert_eq!(framing_of(&raw), Err(WireError::Length), "{bad:?}");
        }
        // A coding on HTTP/1.0 (RFC 9112 §6.1).
        assert_eq!(
            framing_of("HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Err(WireError::TransferCoding)
        );
        // Framing headers on a status that has no body.
        for raw in [
            "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n",
            "HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n",
            "HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
        ] {
            assert_eq!(framing_of(raw), Err(WireError::Bodiless), "{raw:?}");
        }
        for raw in [
            "HTTP/1.1 100 Continue\r\nContent-Length: 5\r\n\r\n",
            "HTTP/1.1 103 Early Hints\r\nTransfer-Encoding: chunked\r\n\r\n",
        ] {
            assert_eq!(
                parse_head(raw.as_bytes(), &Method::GET).unwrap_err(),
                WireError::Bodiless,
                "{raw:?}"
            );
        }
    }

    #[test]
    fn connection_level_headers_are_left_out() {
        let raw = "HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Hop\r\nKeep-Alive: timeout=5\r\nX-Hop: 1\r\nX-Kept: 2\r\nTrailer: X-T\r\nContent-Length: 4\r\nUpgrade: h2c\r\nProxy-Authenticate: Basic\r\n\r\n";
        let (h, _) = head(raw, &Method::GET).unwrap();
        let names: Vec<&str> = h.headers.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["x-kept", "content-length"]);
        assert_eq!(h.framing, Framing::Length(4));
        assert!(h.keep_alive);
        let raw = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Kept: 1\r\n\r\n";
        let (h, _) = head(raw, &Method::GET).unwrap();
        let names: Vec<&str> = h.headers.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["x-kept"]);
        assert_eq!(h.framing, Framing::Chunked);
        // What is left agrees with the proxy's own removal of the same names.
        for name in HOP_BY_HOP {
            let value = if name == header::TRANSFER_ENCODING {
                "chunked"
            } else {
                "x"
            };
            let raw = format!("HTTP/1.1 200 OK\r\n{name}: {value}\r\n\r\n");
            let (h, _) = head(&raw, &Method::GET).unwrap();
            assert!(!h.headers.contains_key(&name), "{name}");
        }
    }

    #[test]
    fn only_a_framed_http_1_1_answer_keeps_its_connection() {
        let keeps = |raw: &str, method: &Method| head(raw, method).unwrap().0.keep_alive;
        let get = &Method::GET;
        assert!(keeps("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", get));
        assert!(keeps("HTTP/1.1 204 No Content\r\n\r\n", get));
        assert!(keeps("HTTP/1.1 304 Not Modified\r\n\r\n", get));
        assert!(keeps(
            "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
            &Method::HEAD
        ));
        assert!(!keeps(
            "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: Keep-Alive, CLOSE\r\n\r\n",
            get
        ));
        assert!(!keeps(
            "HTTP/1.0 200 OK\r\nContent-Length: 0\r\nConnection: keep-alive\r\n\r\n",
            get
        ));
        assert!(!keeps("HTTP/1.1 200 OK\r\n\r\n", get));
        // Bodiless answers that announce a body: a body sent after all would lie on the
        // connection.
        assert!(!keeps(
            "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n",
            &Method::HEAD
        ));
        assert!(!keeps(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            &Method::HEAD
        ));
        assert!(!keeps(
            "HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
            get
        ));
    }

    #[test]
    fn informational_heads_are_skipped_and_upgrades_refused() {
        let raw = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n";
        match parse_head(raw, &Method::POST).unwrap() {
            Parsed::Informational(len) => assert_eq!(len, 25),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            parse_head(b"HTTP/1.1 101 Switching Protocols\r\n\r\n", &Method::GET).unwrap_err(),
            WireError::Upgrade
        );
    }

    #[test]
    fn malformed_or_oversized_heads_are_errors() {
        for bad in [
            "HTTP/2 200 OK\r\n\r\n",
            "HTTP/1.1 2000 OK\r\n\r\n",
            "HTTP/1.1 200 OK\r\nX-Fold: a\r\n b\r\n\r\n",
            "HTTP/1.1 200 OK\r\nBad Name: a\r\n\r\n",
            "HTTP/1.1 200 OK\r\nX: a\rb\r\n\r\n",
            "ICY 200 OK\r\n\r\n",
            // Bare LFs, wherever httparse would take them.
            "HTTP/1.1 200 OK\nContent-Length: 0\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 0\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\n",
            "HTTP/1.1 200 OK\n\n",
            // No space after the status code.
            "HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n",
        ] {
            assert_eq!(
                parse_head(bad.as_bytes(), &Method::GET).unwrap_err(),
                WireError::Head,
                "{bad:?}"
            );
        }
        let long = format!("HTTP/1.1 200 OK\r\nX: {}", "a".repeat(MAX_HEAD_BYTES));
        assert_eq!(
            parse_head(long.as_bytes(), &Method::GET).unwrap_err(),
            WireError::HeadTooLarge
        );
        let many = format!(
            "HTTP/1.1 200 OK\r\n{}\r\n",
            "X: a\r\n".repeat(MAX_HEADERS + 1)
        );
        assert_eq!(
            parse_head(many.as_bytes(), &Method::GET).unwrap_err(),
            WireError::HeadTooLarge
        );
        assert!(matches!(
            parse_head(b"HTTP/1.1 200 OK\r\nContent-Le", &Method::GET),
            Ok(Parsed::Partial)
        ));
    }

    #[test]
    fn the_request_head_carries_our_framing_only() {
        let mut headers = HeaderMap::new();
        headers.insert("x-a", HeaderValue::from_static("1"));
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("99"));
        headers.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        let mut out = Vec::new();
        write_request_head(
            &mut out,
            &Method::POST,
            "/a?b=%2F",
            "gw:3000",
            &headers,
            RequestFraming::Length(12),
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST /a?b=%2F HTTP/1.1\r\nhost: gw:3000\r\nx-a: 1\r\ncontent-length: 12\r\n\r\n"
        );
        headers.insert(header::HOST, HeaderValue::from_static("gw"));
        let mut out = Vec::new();
        write_request_head(
            &mut out,
            &Method::GET,
            "/",
            "x",
            &headers,
            RequestFraming::Chunked,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "GET / HTTP/1.1\r\nx-a: 1\r\nhost: gw\r\ntransfer-encoding: chunked\r\n\r\n"
        );
        let mut out = Vec::new();
        push_decimal(&mut out, 0);
        push_decimal(&mut out, u64::MAX);
        assert_eq!(out, b"018446744073709551615");
    }

    fn decode_all(input: &[u8], piece: usize) -> Result<Vec<u8>, WireError> {
        let mut decoder = Chunked::default();
        let mut buf = BytesMut::new();
        let mut body = Vec::new();
        let mut rest = input;
        loop {
            match decoder.decode(&mut buf)? {
                Decoded::Data(d) => body.extend_from_slice(&d),
                Decoded::End => {
                    assert!(decoder.is_done());
                    return Ok(body);
                }
                Decoded::Partial => {
                    if rest.is_empty() {
                        return Err(WireError::Chunked);
                    }
                    let n = piece.min(rest.len());
                    buf.extend_from_slice(&rest[..n]);
                    rest = &rest[n..];
                }
            }
        }
    }

    #[test]
    fn chunked_bodies_decode_in_any_pieces() {
        let input = b"5;ext=1\r\nhello\r\n1\r\n \r\nA\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\n";
        for piece in [1, 2, 3, 7, 64] {
            assert_eq!(
                decode_all(input, piece).unwrap(),
                b"hello 0123456789",
                "piece {piece}"
            );
        }
        assert_eq!(decode_all(b"0\r\n\r\n", 1).unwrap(), b"");
        let mut out = Vec::new();
        push_chunk(&mut out, b"");
        push_chunk(&mut out, &[b'x'; 300]);
        out.extend_from_slice(LAST_CHUNK);
        assert_eq!(decode_all(&out, 5).unwrap(), vec![b'x'; 300]);
    }

    #[test]
    fn malformed_chunked_bodies_are_errors() {
        for bad in [
            &b"5\r\nhelloXX0\r\n\r\n"[..],
            b"g\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"5;a\nb\r\nhello\r\n0\r\n\r\n",
            b"1ffffffffffffffff\r\n",
            b"0\r\nBad Trailer\r\n\r\n",
            // Bare LFs ending the last chunk, a trailer or the trailer section.
            b"0\n\r\n",
            b"0\r\n\n",
            b"0\r\nX-T: 1\n\r\n",
            b"0\r\nX-T: 1\r\n\n",
            b"5\r\nhello\r\n0\r\nX-T: 1\nX-U: 2\r\n\r\n",
        ] {
            assert_eq!(
                decode_all(bad, 64).unwrap_err(),
                WireError::Chunked,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = format!("5;{}\r\n", "e".repeat(MAX_CHUNK_LINE));
        assert_eq!(
            decode_all(long.as_bytes(), 64).unwrap_err(),
            WireError::Chunked
        );
    }
}
