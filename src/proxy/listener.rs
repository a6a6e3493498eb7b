//! Accepting connections and serving each one: the connection bound, the TLS handshake,
//! HTTP/1.1 and HTTP/2 with the head bounds, the idle and first-request deadlines, and
//! the drain on shutdown.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::conn::{ConnIo, ConnState};
use super::dispatch::handle;
use super::{ConnCtx, Peer};
use crate::admin::stopped;
use crate::config;
use crate::limits::Admitted;
use crate::telemetry::HeadRefusal;

/// After an idle connection is told to close, it gets this long to go before it is
/// dropped (an HTTP/2 peer that never acknowledges the GOAWAY keeps nothing open).
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// HTTP/1.1 and HTTP/2 (h2c by prior knowledge on plaintext) with the head bounds.
pub(super) fn http_builder(listen: &config::Listen) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(listen.header_read_timeout_ms))
        .max_buf_size(listen.max_header_bytes)
        .max_headers(listen.max_headers)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(listen.max_header_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(listen.http2_max_concurrent_streams)
        .max_pending_accept_reset_streams(listen.http2_max_pending_accept_reset_streams)
        .max_local_error_reset_streams(listen.http2_max_local_error_reset_streams);
    builder
}

pub(super) async fn accept_loop(
    listener: TcpListener,
    ctx: Arc<ConnCtx>,
    mut stop: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    // Tells open connections to finish: sent once the grace period is over.
    let (close, close_rx) = watch::channel(false);
    let mut grace_until: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            () = stopped(&mut stop), if grace_until.is_none() => {
                // Readiness is already false; load balancers and endpoints need a moment
                // to stop sending here, so new connections are still served meanwhile.
                let grace = ctx.shared.live.load().config.shutdown.grace_seconds;
                tracing::info!(worker = crate::worker::current(), grace_seconds = grace, "shutting down: still accepting during the grace period");
                grace_until = Some(tokio::time::Instant::now() + Duration::from_secs(grace));
            }
            () = tokio::time::sleep_until(grace_until.unwrap_or_else(tokio::time::Instant::now)), if grace_until.is_some() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => match ctx.connections.try_admit() {
                    Some(admitted) => {
                        conns.spawn(serve_connection(
                            stream,
                            peer,
                            Arc::clone(&ctx),
                            admitted,
                            close_rx.clone(),
                        ));
                    }
                    None => {
                        // Over the bound: accepted only to be closed at once.
                        ctx.shared.metrics.connection_rejected();
                        drop(stream);
                    }
                },
                Err(e) => {
                    // Usually out of descriptors; back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        while conns.try_join_next().is_some() {}
    }
    // New connections are refused from here on.
    drop(listener);
    let drain = Duration::from_secs(ctx.shared.live.load().config.shutdown.drain_seconds);
    tracing::info!(
        worker = crate::worker::current(),
        open_connections = conns.len(),
        in_flight = ctx.shared.drain.in_flight(),
        "draining"
    );
    let _ = close.send(true);
    let shared = Arc::clone(&ctx.shared);
    let drained = tokio::time::timeout(drain, async {
        let streams = async {
            shared.drain.until_idle().await;
            shared.drain.end_streams();
        };
        let connections = async { while conns.join_next().await.is_some() {} };
        tokio::join!(streams, connections);
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            worker = crate::worker::current(),
            open_connections = conns.len(),
            "drain deadline passed; closing the remaining connections"
        );
        conns.shutdown().await;
    }
}

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    ctx: Arc<ConnCtx>,
    admitted: Admitted,
    stop: watch::Receiver<bool>,
) {
    let _admitted = admitted;
    let _ = stream.set_nodelay(true);
    match &ctx.tls {
        Some(acceptor) => {
            let handshake = tokio::time::timeout(ctx.handshake_timeout, acceptor.accept(stream));
            // A failed or too slow handshake just closes the connection.
            if let Ok(Ok(tls)) = handshake.await {
                drive(tls, peer, &ctx, stop).await;
            }
        }
        None => drive(stream, peer, &ctx, stop).await,
    }
}

/// Serves one connection until it closes, shutting it down gracefully on stop or idle.
async fn drive<S>(stream: S, peer: SocketAddr, ctx: &ConnCtx, mut stop: watch::Receiver<bool>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let state = Arc::new(ConnState::new());
    let io = TokioIo::new(ConnIo::new(
        stream,
        Arc::clone(&state),
        ctx.write_stall_timeout,
    ));
    let shared = Arc::clone(&ctx.shared);
    let conn_state = Arc::clone(&state);
    // Formatted once per connection, not per forwarded request.
    let peer = Peer::new(peer);
    let service = service_fn(move |req| {
        let shared = Arc::clone(&shared);
        let conn_state = Arc::clone(&conn_state);
        let peer = peer.clone();
        async move { Ok::<_, Infallible>(handle(shared, conn_state, &peer, req).await) }
    });
    let conn = ctx.builder.serve_connection(io, service);
    tokio::pin!(conn);
    let (idle, first) = (ctx.idle_timeout, ctx.first_request_timeout);
    let mut closing = false;
    // Set when the connection was told to close for idleness: past it, a connection
    // still without a request is dropped whatever the peer does.
    let mut drop_at: Option<tokio::time::Instant> = None;
    loop {
        let idle_at = state.idle_deadline(idle, first);
        tokio::select! {
            done = conn.as_mut() => {
                if let Some(reason) = done.err().and_then(|e| head_refusal(&*e)) {
                    ctx.shared.metrics.head_refused(reason);
                }
                return;
            }
            () = stopped(&mut stop), if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            _ = tokio::time::sleep_until(idle_at), if !closing => {
                if state.is_idle(idle, first) {
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                    drop_at = Some(tokio::time::Instant::now() + CLOSE_GRACE);
                }
            }
            _ = tokio::time::sleep_until(drop_at.unwrap_or_else(tokio::time::Instant::now)), if drop_at.is_some() => {
                if state.active() == 0 {
                    return;
                }
                drop_at = Some(tokio::time::Instant::now() + CLOSE_GRACE);
            }
        }
    }
}

/// Why hyper refused a request head itself, when that is how a connection ended: it
/// answered 400, 431 or 414 before any request reached [`handle`], so nothing else
/// counts it.
fn head_refusal(e: &(dyn std::error::Error + 'static)) -> Option<HeadRefusal> {
    let e = e.downcast_ref::<hyper::Error>()?;
    if e.is_parse_too_large() {
        Some(HeadRefusal::TooLarge)
    } else if e.is_parse() {
        Some(HeadRefusal::Malformed)
    } else {
        None
    }
}
