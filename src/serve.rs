//! `cleave serve`: start the cluster of a deployment config and the OpenAI-compatible gateway in
//! front of it.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use cleave_actors::config::DeployConfig;
use cleave_actors::Cluster;
use cleave_gateway::{GatewayConfig, Server};

#[derive(clap::Args)]
pub struct Args {
    /// Deployment YAML (default: configs/cpu-tiny.yaml, the tiny-r1 model on the CPU).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Address to listen on (default: the config's server.host).
    #[arg(long)]
    host: Option<String>,
    /// Port (default: the config's server.port; 0 picks a free port).
    #[arg(long)]
    port: Option<u16>,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 32 << 20)]
    max_body_bytes: usize,
    /// Require `Authorization: Bearer KEY` on /v1/* (default: $CLEAVE_API_KEY, else vLLM's
    /// $VLLM_API_KEY; none: open).
    #[arg(long)]
    api_key: Option<String>,
}

/// The API key: the flag, else `CLEAVE_API_KEY`, else `VLLM_API_KEY`; empty means none.
fn api_key(flag: Option<String>) -> Option<String> {
    flag.or_else(|| std::env::var("CLEAVE_API_KEY").ok())
        .or_else(|| std::env::var("VLLM_API_KEY").ok())
        .filter(|k| !k.is_empty())
}

/// `configs/cpu-tiny.yaml`, looked up from the working directory, then beside the executable
/// (`target/release/cleave` -> `../../configs`), then in the source tree the binary was built from.
fn default_config() -> PathBuf {
    let rel = Path::new("configs").join("cpu-tiny.yaml");
    let mut candidates = vec![rel.clone()];
    if let Some(dir) = std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf)) {
        candidates.push(dir.join("../..").join(&rel));
    }
    candidates.push(Path::new(env!("CARGO_MANIFEST_DIR")).join(&rel));
    candidates.iter().find(|p| p.is_file()).cloned().unwrap_or(rel)
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let path = a.config.clone().unwrap_or_else(default_config);
    let mut cfg = DeployConfig::from_yaml_file(&path).with_context(|| format!("loading {}", path.display()))?;
    if let Some(h) = a.host {
        cfg.server.host = h;
    }
    if let Some(p) = a.port {
        cfg.server.port = p;
    }
    let host_port = format!("{}:{}", cfg.server.host, cfg.server.port);
    let addr: SocketAddr = host_port
        .to_socket_addrs()
        .with_context(|| format!("resolving {host_port}"))?
        .next()
        .with_context(|| format!("{host_port} resolves to no address"))?;
    let api_key = api_key(a.api_key);
    if api_key.is_some() {
        tracing::info!("an API key is required on /v1/*");
    }
    let gw = GatewayConfig { max_body_bytes: a.max_body_bytes, api_key, ..GatewayConfig::from_deploy(&cfg)? };
    let model = cfg.served_model_name();
    let cluster = Cluster::start(cfg).context("starting the cluster")?;

    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().thread_name("cleave-gateway").build()?;
    let result = rt.block_on(async {
        let server = Server::start(Arc::new(cluster.clone()), gw, addr).await?;
        let url = format!("http://{}", server.local_addr());
        // The one ready line: scripts and tests wait for it and read the port from it.
        println!("cleave serve: ready at {url} (model {model})");
        tracing::info!(%url, %model, "ready");
        shutdown_signal().await;
        eprintln!("cleave serve: shutting down");
        cluster.shutdown();
        if tokio::time::timeout(Duration::from_secs(5), server.shutdown()).await.is_err() {
            tracing::warn!("connections still open after 5 s; exiting");
        }
        anyhow::Ok(())
    });
    rt.shutdown_timeout(Duration::from_secs(1));
    result
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
