//! The listening loop: HTTP/1.1 connections served by hyper with the warp filter as the service.
//!
//! warp's own `serve` would do, but it logs every client that hangs up mid-stream at ERROR level
//! and leaves Nagle's algorithm on; SSE wants small writes to leave at once, and disconnecting
//! clients are routine (they are counted in the metrics instead).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, Semaphore};
use warp::Filter;

use crate::{routes, Backend, GatewayConfig, GatewayError, GatewayMetrics, State};

/// A running gateway.
pub struct Server {
    addr: SocketAddr,
    metrics: GatewayMetrics,
    shutdown: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Binds `addr` (port 0 picks a free port) and starts serving on the current tokio runtime.
    pub async fn start(
        backend: Arc<dyn Backend>,
        cfg: GatewayConfig,
        addr: SocketAddr,
    ) -> Result<Server, GatewayError> {
        if cfg.max_connections == 0 || cfg.header_timeout.is_zero() || cfg.body_timeout.is_zero() {
            return Err(GatewayError::Config(
                "max_connections, the header timeout and the body timeout must be positive".into(),
            ));
        }
        if cfg.max_concurrent_requests == 0 {
            return Err(GatewayError::Config("max_concurrent_requests must be at least 1".into()));
        }
        let listener = TcpListener::bind(addr).await.map_err(|source| GatewayError::Bind { addr, source })?;
        let addr = listener.local_addr().map_err(|source| GatewayError::Bind { addr, source })?;
        let metrics = GatewayMetrics::new();
        let state = Arc::new(State {
            info: backend.model_info(),
            tokenizer: backend.tokenizer(),
            parsing: Arc::new(Semaphore::new(
                std::thread::available_parallelism().map_or(2, |n| n.get().div_ceil(2)).max(2),
            )),
            metrics: metrics.clone(),
            started: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            backend,
            cfg,
        });
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(accept_loop(listener, state, rx));
        Ok(Server { addr, metrics, shutdown: Some(tx), task })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The gateway's counters.
    pub fn metrics(&self) -> &GatewayMetrics {
        &self.metrics
    }

    /// Stops accepting connections and waits for open ones to finish.
    pub async fn shutdown(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let _ = (&mut self.task).await;
    }

    /// Waits until the server stops (after [`Server::shutdown`] from a clone of the runtime, or
    /// a panic in the accept loop).
    pub async fn wait(&mut self) {
        let _ = (&mut self.task).await;
    }
}

async fn accept_loop(listener: TcpListener, state: Arc<State>, mut stop: oneshot::Receiver<()>) {
    let state_cfg = state.cfg.clone();
    let filter = routes::api(state).recover(routes::recover).unify();
    let service = warp::service(filter);
    let graceful = GracefulShutdown::new();
    let (slots, header_timeout) = (Arc::new(Semaphore::new(state_cfg.max_connections)), state_cfg.header_timeout);
    loop {
        // A connection is accepted only with a free slot: the rest wait in the listen backlog.
        let slot = tokio::select! {
            s = slots.clone().acquire_owned() => s,
            _ = &mut stop => break,
        };
        let Ok(slot) = slot else { break };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = &mut stop => break,
        };
        let (io, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = io.set_nodelay(true);
        let conn = warp::hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .serve_connection(TokioIo::new(io), TowerToHyperService::new(service.clone()));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _slot = slot;
            if let Err(e) = conn.await {
                // A client that hangs up mid-response ends here; it is routine, not an error.
                tracing::debug!(%peer, error = %e, "connection closed with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
