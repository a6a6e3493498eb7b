//! The framework floor of the passthrough cost comparison (`benches/load.rs`): a bare
//! HTTP/1 proxy on the libraries the sidecar forwards with and nothing else. The same
//! server (hyper-util's auto connection), the same pooled client, the same allocator and
//! a one-thread runtime, as the sidecar runs on one core; none of the sidecar's controls
//! (classification, framing checks, deadlines, header rewriting, drain, metrics). Not a
//! proxy to deploy: it forwards whatever it reads.
//!
//! Usage: `hyper-bare LISTEN UPSTREAM` (both `host:port`).

use std::convert::Infallible;
use std::process::ExitCode;

use http::uri::{Authority, Uri};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;

#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

type Body = http_body_util::combinators::UnsyncBoxBody<bytes::Bytes, hyper::Error>;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(upstream)) = (args.next(), args.next()) else {
        eprintln!("usage: hyper-bare LISTEN UPSTREAM");
        return ExitCode::FAILURE;
    };
    let Ok(upstream) = upstream.parse::<Authority>() else {
        eprintln!("UPSTREAM must be host:port");
        return ExitCode::FAILURE;
    };
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return ExitCode::FAILURE;
    };
    match rt.block_on(serve(&listen, upstream)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hyper-bare: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(listen: &str, upstream: Authority) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    let client: Client<HttpConnector, Incoming> = Client::builder(TokioExecutor::new()).build(http);
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let (client, upstream) = (client.clone(), upstream.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                forward(client.clone(), upstream.clone(), req)
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
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

fn status(code: StatusCode) -> Response<Body> {
    let mut response = Response::new(Empty::new().map_err(|never| match never {}).boxed_unsync());
    *response.status_mut() = code;
    response
}
