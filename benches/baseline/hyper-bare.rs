//! The framework floors of the cost comparisons (`benches/load.rs`), on hyper and
//! nothing else: the sidecar's server (hyper-util's auto connection), hyper-util's pooled
//! client (the sidecar's on https upstreams; on plain http it has its own since
//! `src/upstream/`), the same allocator and a one-thread runtime, as the sidecar runs on
//! one core. Not a proxy to deploy.
//!
//! - `hyper-bare LISTEN UPSTREAM` forwards whatever it reads to `UPSTREAM`, without the
//!   sidecar's controls (classification, framing checks, deadlines, header rewriting,
//!   drain, metrics): the floor of passthrough.
//! - `hyper-bare LISTEN CANISTER NOTE_PATH ANSWER_BYTES` answers every request by reading
//!   one note from the canister (`GET NOTE_PATH` with the REST header set), parsing its
//!   JSON, running one bare pulldown-cmark pass over its body, and sending a fixed answer
//!   of `ANSWER_BYTES`: the floor of a REST answer, without the sidecar's token check,
//!   hosted context, validation, extraction or answer JSON.
//!
//! `UPSTREAM` and `CANISTER` are `host:port`.

use std::convert::Infallible;
use std::process::ExitCode;

use bytes::Bytes;
use http::uri::{Authority, Uri};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;

#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

type Body = http_body_util::combinators::UnsyncBoxBody<bytes::Bytes, hyper::Error>;

/// What each request gets.
#[derive(Clone)]
enum Mode {
    /// Forwarded to the upstream.
    Forward,
    /// A note read from the upstream, parsed, and a fixed answer.
    Rest { note: Uri, answer: Bytes },
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (listen, upstream, mode) = match args.as_slice() {
        [listen, upstream] => (listen, upstream, Some(Mode::Forward)),
        [listen, upstream, note, bytes] => {
            let note = format!("http://{upstream}{note}").parse::<Uri>().ok();
            let answer = bytes
                .parse::<usize>()
                .ok()
                .map(|n| Bytes::from(vec![b' '; n]));
            let mode = note
                .zip(answer)
                .map(|(note, answer)| Mode::Rest { note, answer });
            (listen, upstream, mode)
        }
        _ => {
            eprintln!("usage: hyper-bare LISTEN UPSTREAM [NOTE_PATH ANSWER_BYTES]");
            return ExitCode::FAILURE;
        }
    };
    let (Ok(upstream), Some(mode)) = (upstream.parse::<Authority>(), mode) else {
        eprintln!("UPSTREAM must be host:port, NOTE_PATH a path, ANSWER_BYTES a number");
        return ExitCode::FAILURE;
    };
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return ExitCode::FAILURE;
    };
    match rt.block_on(serve(listen, upstream, mode)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hyper-bare: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(listen: &str, upstream: Authority, mode: Mode) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    let builder = Client::builder(TokioExecutor::new());
    match mode {
        Mode::Forward => {
            let client: Client<HttpConnector, Incoming> = builder.build(http);
            accept(listener, move |req| {
                forward(client.clone(), upstream.clone(), req)
            })
            .await
        }
        Mode::Rest { note, answer } => {
            let reader: Client<HttpConnector, Empty<Bytes>> = builder.build(http);
            accept(listener, move |_| {
                section(reader.clone(), note.clone(), answer.clone())
            })
            .await
        }
    }
}

/// Serves every connection `listener` accepts with `handle`.
async fn accept<F, Fut>(listener: tokio::net::TcpListener, handle: F) -> std::io::Result<()>
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<Response<Body>, Infallible>> + Send + 'static,
{
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let handle = handle.clone();
        tokio::spawn(async move {
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), hyper::service::service_fn(handle))
                .await;
        });
    }
}

async fn forward(
    client: Client<HttpConnector, Incoming>,
    upstream: Authority,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let mut parts = http::uri::Parts::default();
    parts.scheme = Some(http::uri::Scheme::HTTP);
    parts.authority = Some(upstream);
    parts.path_and_query = req.uri().path_and_query().cloned();
    let Ok(uri) = Uri::from_parts(parts) else {
        return Ok(status(StatusCode::BAD_REQUEST));
    };
    *req.uri_mut() = uri;
    Ok(match client.request(req).await {
        Ok(response) => response.map(BodyExt::boxed_unsync),
        Err(_) => status(StatusCode::BAD_GATEWAY),
    })
}

async fn section(
    reader: Client<HttpConnector, Empty<Bytes>>,
    note: Uri,
    answer: Bytes,
) -> Result<Response<Body>, Infallible> {
    let request = Request::get(note)
        .header(http::header::ACCEPT, "application/json")
        .header("x-vault-id", "default")
        .header("x-user-id", "bench-user")
        .body(Empty::new());
    let Ok(request) = request else {
        return Ok(status(StatusCode::INTERNAL_SERVER_ERROR));
    };
    let body = match reader.request(request).await {
        Ok(response) => response.into_body().collect().await.map(|c| c.to_bytes()),
        Err(_) => return Ok(status(StatusCode::BAD_GATEWAY)),
    };
    let Ok(body) = body else {
        return Ok(status(StatusCode::BAD_GATEWAY));
    };
    let events = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|note| {
            let markdown = note.get("body")?.as_str()?;
            let parser =
                pulldown_cmark::Parser::new_ext(markdown, pulldown_cmark::Options::empty());
            Some(parser.into_offset_iter().count())
        });
    let Some(events) = events else {
        return Ok(status(StatusCode::BAD_GATEWAY));
    };
    std::hint::black_box(events);
    let mut response = Response::new(
        Full::new(answer)
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

fn status(code: StatusCode) -> Response<Body> {
    let mut response = Response::new(Empty::new().map_err(|never| match never {}).boxed_unsync());
    *response.status_mut() = code;
    response
}
