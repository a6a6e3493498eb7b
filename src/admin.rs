//! The admin listener (default `127.0.0.1:9901`; in a pod, the pod address so the kubelet
//! and Prometheus reach it, see `deploy/README.md`):
//!
//! - `GET /live`: 200 while the process runs.
//! - `GET /ready`: 200 when the config is loaded, both listeners are bound, the sidecar
//!   is not shutting down and the gateway answered the last probe; else 503.
//! - `GET /metrics`: the Prometheus text exposition.
//!
//! Anything else is 404. Nothing here changes state.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::limits::ConnectionLimit;
use crate::telemetry::Metrics;
use crate::upstream::{self, Caller};

/// Admin connections are few (a kubelet, a scraper); more than this are closed.
const MAX_ADMIN_CONNECTIONS: usize = 64;
/// Admin request heads must arrive within this.
const ADMIN_HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Probe period while the gateway answers.
const PROBE_PERIOD_UP: Duration = Duration::from_secs(5);
/// Probe period while it does not, so readiness comes quickly once it does.
const PROBE_PERIOD_DOWN: Duration = Duration::from_millis(500);
/// Longest wait for one probe's answer.
const PROBE_TIMEOUT_MAX: Duration = Duration::from_secs(5);

/// The conditions of `/ready`, each set by the part that knows it. Every change of the
/// answer is logged once, with the condition that changed it.
#[derive(Debug, Default)]
pub struct Readiness {
    config_loaded: AtomicBool,
    listeners_bound: AtomicBool,
    shutting_down: AtomicBool,
    gateway_reachable: AtomicBool,
    /// The answer last logged.
    reported: AtomicBool,
}

impl Readiness {
    /// Whether every condition holds.
    pub fn is_ready(&self) -> bool {
        self.config_loaded.load(Ordering::Acquire)
            && self.listeners_bound.load(Ordering::Acquire)
            && !self.shutting_down.load(Ordering::Acquire)
            && self.gateway_reachable.load(Ordering::Acquire)
    }

    /// Logs the answer when it differs from the last one logged.
    fn report(&self, because: &'static str) {
        let ready = self.is_ready();
        if self.reported.swap(ready, Ordering::AcqRel) != ready {
            if ready {
                tracing::info!(ready, because, "readiness changed");
            } else {
                tracing::warn!(ready, because, "readiness changed");
            }
        }
    }

    /// The config was loaded and validated.
    pub fn set_config_loaded(&self) {
        self.config_loaded.store(true, Ordering::Release);
        self.report("config_loaded");
    }

    /// Both listeners are bound.
    pub fn set_listeners_bound(&self) {
        self.listeners_bound.store(true, Ordering::Release);
        self.report("listeners_bound");
    }

    /// Shutdown began: readiness is false from now on.
    pub fn set_shutting_down(&self) {
        self.shutting_down.store(true, Ordering::Release);
        self.report("shutting_down");
    }

    /// Whether shutdown began.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    /// The outcome of the last gateway probe.
    pub fn set_gateway_reachable(&self, reachable: bool) {
        self.gateway_reachable.store(reachable, Ordering::Release);
        self.report(if reachable {
            "gateway_reachable"
        } else {
            "gateway_unreachable"
        });
    }
}

/// Serves the admin endpoints on `listener` until `stop` turns true.
pub(crate) async fn serve(
    listener: TcpListener,
    readiness: Arc<Readiness>,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let limit = ConnectionLimit::new(MAX_ADMIN_CONNECTIONS);
    let mut conns = JoinSet::new();
    let conn_stop = stop.clone();
    loop {
        tokio::select! {
            () = stopped(&mut stop) => break,
            accepted = listener.accept() => {
                let Ok((stream, _peer)) = accepted else {
                    // Out of descriptors or similar: let it pass rather than spin.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let Some(admitted) = limit.try_admit() else { continue };
                let readiness = Arc::clone(&readiness);
                let metrics = Arc::clone(&metrics);
                let mut conn_stop = conn_stop.clone();
                conns.spawn(async move {
                    let _admitted = admitted;
                    let service = service_fn(move |req| {
                        let response = answer(&req, &readiness, &metrics);
                        async move { Ok::<_, Infallible>(response) }
                    });
                    let mut builder = hyper::server::conn::http1::Builder::new();
                    builder
                        .timer(TokioTimer::new())
                        .header_read_timeout(ADMIN_HEADER_TIMEOUT)
                        .max_buf_size(16 * 1024);
                    let conn = builder.serve_connection(TokioIo::new(stream), service);
                    tokio::pin!(conn);
                    tokio::select! {
                        _ = conn.as_mut() => {}
                        () = stopped(&mut conn_stop) => {
                            conn.as_mut().graceful_shutdown();
                            let _ = tokio::time::timeout(ADMIN_HEADER_TIMEOUT, conn).await;
                        }
                    }
                });
            }
        }
        while conns.try_join_next().is_some() {}
    }
    conns.shutdown().await;
}

/// The admin answer to one request.
pub(crate) fn answer(
    req: &Request<Incoming>,
    readiness: &Readiness,
    metrics: &Metrics,
) -> Response<Full<Bytes>> {
    let get = req.method() == Method::GET || req.method() == Method::HEAD;
    match (get, req.uri().path()) {
        (true, "/live") => text(StatusCode::OK, "live\n"),
        (true, "/ready") if readiness.is_ready() => text(StatusCode::OK, "ready\n"),
        (true, "/ready") => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n"),
        (true, "/metrics") => {
            let mut r = Response::new(Full::new(Bytes::from(metrics.encode())));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            r
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    r
}

/// What the gateway probe asks, rebuilt by a reload.
#[derive(Clone)]
pub struct ProbeTarget {
    /// A client of the gateway of its own (CA bundle, connect timeout), so the probe
    /// never uses a caller's connection.
    pub client: upstream::Client,
    /// The gateway base URL.
    pub base: http::Uri,
    /// Longest wait for one answer (capped at 5 s).
    pub timeout: Duration,
}

/// Probes the gateway base URL until `stop` turns true: any HTTP answer counts as
/// reachable; a connect error or a timeout does not. A new target (a reload) is used
/// from the next probe on.
pub(crate) async fn probe_gateway(
    mut target: watch::Receiver<ProbeTarget>,
    readiness: Arc<Readiness>,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let mut current = target.borrow_and_update().clone();
    loop {
        if target.has_changed().unwrap_or(false) {
            current = target.borrow_and_update().clone();
        }
        let mut req = Request::new(Empty::<Bytes>::new());
        *req.uri_mut() = current.base.clone();
        let timeout = current.timeout.min(PROBE_TIMEOUT_MAX);
        let reachable = matches!(
            tokio::time::timeout(timeout, current.client.request(req, Caller::Sidecar)).await,
            Ok(Ok(_))
        );
        // The gauge first: whoever sees `/ready` change finds the metric agreeing.
        metrics.set_gateway_reachable(reachable);
        readiness.set_gateway_reachable(reachable);
        let period = if reachable {
            PROBE_PERIOD_UP
        } else {
            PROBE_PERIOD_DOWN
        };
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            () = stopped(&mut stop) => return,
        }
    }
}

/// Resolves once `stop` holds true (or its sender is gone).
pub(crate) async fn stopped(stop: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is dropped here, not held across the caller's awaits.
    let _ = stop.wait_for(|s| *s).await;
}
