//! The workers: `runtime.threads` threads, each with a single-threaded event loop of its
//! own that accepts on the listening socket and serves the connections it accepted
//! start to finish, upstream exchanges included. Nothing moves a task between threads,
//! so a request wakes no other thread, and what a request touches per worker (its copy
//! of the shared handles, its upstream pools, its metric shards) no other thread writes.
//!
//! Each worker accepts on a listening socket of its own, all bound to the listen address
//! with `SO_REUSEPORT`: the kernel spreads new connections over them by a hash of the
//! client's address and port. One socket shared by every worker's event loop was tried
//! first: whichever worker woke first took a whole burst of connections (32 of 32 went
//! to one of four workers), so the other workers idled. So that a second process on the
//! same port still fails to start instead of quietly taking a share of the connections
//! (which `SO_REUSEPORT` alone would allow a process of the same user), the address is
//! first bound once without it: that fails while anything listens there.

use std::io;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};

use super::listener::accept_loop;
use super::ConnCtx;

/// The started workers; see [`Workers::wait`].
pub(super) struct Workers {
    done: Vec<oneshot::Receiver<()>>,
}

/// Binds `n` listening sockets to `addr` (one without `SO_REUSEPORT` when `n` is 1),
/// each with an accept queue of `backlog` (the kernel caps it at `net.core.somaxconn`;
/// with tokio's default of 1024, refused flood connections reconnecting at thousands a
/// second overflowed it and an honest client's handshake was dropped and retried a
/// second later). Called inside a runtime; the sockets come back unregistered.
pub(super) fn bind(addr: SocketAddr, backlog: u32, n: usize) -> io::Result<Vec<StdListener>> {
    let shared = n > 1;
    if shared && addr.port() != 0 {
        // Fails while any socket, of this process or another, listens on the address.
        drop(StdListener::bind(addr)?);
    }
    let mut out: Vec<StdListener> = Vec::with_capacity(n.max(1));
    for _ in 0..n.max(1) {
        // Port 0: the first socket's port for the others.
        let at = match out.first() {
            Some(first) => first.local_addr()?,
            None => addr,
        };
        let socket = if at.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        if shared {
            socket.set_reuseport(true)?;
        }
        socket.bind(at)?;
        out.push(socket.listen(backlog)?.into_std()?);
    }
    Ok(out)
}

/// The address the sockets of [`bind`] listen on.
pub(super) fn local_addr(listeners: &[StdListener]) -> io::Result<SocketAddr> {
    listeners
        .first()
        .ok_or_else(|| io::Error::other("no listening socket"))?
        .local_addr()
}

/// Starts a worker for each of `listeners`, accepting on it until `stop`; returns once
/// each has its event loop and its socket registered, or the first error.
pub(super) fn spawn(
    listeners: Vec<StdListener>,
    ctx: &ConnCtx,
    stop: &watch::Receiver<bool>,
) -> io::Result<Workers> {
    let n = listeners.len();
    let mut done = Vec::with_capacity(n);
    let mut ready = Vec::with_capacity(n);
    for (index, socket) in listeners.into_iter().enumerate() {
        // Every worker its own copy of the handles, and of their reference counts.
        let mut ctx = ctx.clone();
        ctx.shared = Arc::new((*ctx.shared).clone());
        let ctx = Arc::new(ctx);
        let stop = stop.clone();
        let (finished, finished_rx) = oneshot::channel();
        let (started, started_rx) = std::sync::mpsc::sync_channel::<io::Result<()>>(1);
        std::thread::Builder::new()
            .name(format!("worker-{index}"))
            .spawn(move || {
                crate::worker::enter(index);
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = started.send(Err(e));
                        return;
                    }
                };
                let registered = runtime.block_on(async { TcpListener::from_std(socket) });
                let listener = match registered {
                    Ok(l) => l,
                    Err(e) => {
                        let _ = started.send(Err(e));
                        return;
                    }
                };
                let _ = started.send(Ok(()));
                runtime.block_on(accept_loop(listener, ctx, stop));
                // Tasks still parked (an upstream pool's reaper) end with the loop.
                drop(runtime);
                let _ = finished.send(());
            })?;
        done.push(finished_rx);
        ready.push(started_rx);
    }
    for started in ready {
        match started.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(io::Error::other("a worker stopped while starting")),
        }
    }
    Ok(Workers { done })
}

impl Workers {
    /// Resolves once every worker has drained and stopped; an error names a worker that
    /// ended without finishing (it panicked).
    pub(super) async fn wait(self) -> Result<(), String> {
        let mut failed = Vec::new();
        for (index, done) in self.done.into_iter().enumerate() {
            if done.await.is_err() {
                failed.push(index);
            }
        }
        match failed.as_slice() {
            [] => Ok(()),
            _ => Err(format!(
                "worker threads {failed:?} stopped without draining"
            )),
        }
    }
}
