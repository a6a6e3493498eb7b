//! A floor below the framework for the passthrough cost comparison (`benches/load.rs`):
//! what forwarding costs with no HTTP library at all. Each client connection is one task
//! that owns one upstream connection; request and answer heads are parsed with httparse
//! (the head parser hyper itself uses) and written again by hand, bodies only by
//! Content-Length. It is the shape nginx has (one event loop, no per-request tasks, no
//! header maps), on the sidecar's runtime and allocator. Not a proxy: no chunked bodies,
//! no HTTP/2, no deadlines, no bounds beyond a head of 64 KiB; anything else closes the
//! connection.
//!
//! `raw-bare LISTEN UPSTREAM`, `UPSTREAM` as `host:port`.

use std::process::ExitCode;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The largest head read, and the most headers in one.
const MAX_HEAD: usize = 64 * 1024;
const MAX_HEADERS: usize = 100;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [listen, upstream] = args.as_slice() else {
        eprintln!("usage: raw-bare LISTEN UPSTREAM");
        return ExitCode::FAILURE;
    };
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return ExitCode::FAILURE;
    };
    match rt.block_on(serve(listen, upstream.clone())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("raw-bare: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(listen: &str, upstream: String) -> std::io::Result<()> {
    let listener = TcpListener::bind(listen).await?;
    loop {
        let (client, peer) = listener.accept().await?;
        let _ = client.set_nodelay(true);
        let upstream = upstream.clone();
        let peer = peer.ip().to_string();
        tokio::spawn(async move {
            let _ = connection(client, &upstream, &peer).await;
        });
    }
}

/// Headers that name the connection they arrive on, never forwarded.
fn hop_by_hop(name: &str) -> bool {
    [
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "upgrade",
        "trailer",
    ]
    .iter()
    .any(|h| name.eq_ignore_ascii_case(h))
}

/// The Content-Length of a parsed head, `Err` for a body framed any other way.
fn body_length(headers: &[httparse::Header<'_>]) -> Result<usize, ()> {
    let mut length = 0;
    for h in headers {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(());
        }
        if h.name.eq_ignore_ascii_case("content-length") {
            length = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .ok_or(())?;
        }
    }
    Ok(length)
}

/// Appends every header but the hop-by-hop ones.
fn push_headers(out: &mut Vec<u8>, headers: &[httparse::Header<'_>]) {
    for h in headers.iter().filter(|h| !hop_by_hop(h.name)) {
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
}

/// Reads into `buf` until it holds `n` bytes; false at end of stream.
async fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>, n: usize) -> std::io::Result<bool> {
    while buf.len() < n {
        if stream.read_buf(buf).await? == 0 {
            return Ok(false);
        }
    }
    Ok(true)
}

async fn connection(mut client: TcpStream, upstream: &str, peer: &str) -> std::io::Result<()> {
    let mut up: Option<TcpStream> = None;
    let (mut inbuf, mut upbuf) = (Vec::with_capacity(8192), Vec::with_capacity(8192));
    let mut out = Vec::with_capacity(8192);
    loop {
        // The request head, then its body.
        let (head_len, body_len) = loop {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut req = httparse::Request::new(&mut headers);
            match req.parse(&inbuf) {
                Ok(httparse::Status::Complete(head_len)) => {
                    let Ok(body_len) = body_length(req.headers) else {
                        return Ok(());
                    };
                    out.clear();
                    out.extend_from_slice(req.method.unwrap_or("GET").as_bytes());
                    out.push(b' ');
                    out.extend_from_slice(req.path.unwrap_or("/").as_bytes());
                    out.extend_from_slice(b" HTTP/1.1\r\n");
                    push_headers(&mut out, req.headers);
                    out.extend_from_slice(b"X-Forwarded-For: ");
                    out.extend_from_slice(peer.as_bytes());
                    out.extend_from_slice(b"\r\n\r\n");
                    break (head_len, body_len);
                }
                Ok(httparse::Status::Partial) if inbuf.len() < MAX_HEAD => {
                    if client.read_buf(&mut inbuf).await? == 0 {
                        return Ok(());
                    }
                }
                _ => return Ok(()),
            }
        };
        if !fill(&mut client, &mut inbuf, head_len + body_len).await? {
            return Ok(());
        }
        out.extend_from_slice(&inbuf[head_len..head_len + body_len]);
        inbuf.drain(..head_len + body_len);
        let stream = match &mut up {
            Some(stream) => stream,
            None => {
                let stream = TcpStream::connect(upstream).await?;
                stream.set_nodelay(true)?;
                up.insert(stream)
            }
        };
        stream.write_all(&out).await?;

        // The answer head, then its body, written to the client at once.
        let (head_len, body_len) = loop {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut res = httparse::Response::new(&mut headers);
            match res.parse(&upbuf) {
                Ok(httparse::Status::Complete(head_len)) => {
                    let Ok(body_len) = body_length(res.headers) else {
                        return Ok(());
                    };
                    out.clear();
                    out.extend_from_slice(b"HTTP/1.1 ");
                    let code = res.code.unwrap_or(502);
                    out.extend_from_slice(&[
                        b'0' + (code / 100 % 10) as u8,
                        b'0' + (code / 10 % 10) as u8,
                        b'0' + (code % 10) as u8,
                    ]);
                    out.push(b' ');
                    out.extend_from_slice(res.reason.unwrap_or("").as_bytes());
                    out.extend_from_slice(b"\r\n");
                    push_headers(&mut out, res.headers);
                    out.extend_from_slice(b"\r\n");
                    break (head_len, body_len);
                }
                Ok(httparse::Status::Partial) if upbuf.len() < MAX_HEAD => {
                    if stream.read_buf(&mut upbuf).await? == 0 {
                        return Ok(());
                    }
                }
                _ => return Ok(()),
            }
        };
        if !fill(stream, &mut upbuf, head_len + body_len).await? {
            return Ok(());
        }
        out.extend_from_slice(&upbuf[head_len..head_len + body_len]);
        upbuf.drain(..head_len + body_len);
        client.write_all(&out).await?;
    }
}
