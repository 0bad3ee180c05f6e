//! The gateway's own ceiling: SSE chunks per second it pushes to streaming clients.
//!
//! ```sh
//! cargo run --release -p cleave-gateway --example sse_ceiling -- instant 64 2000
//! cargo run --release -p cleave-gateway --example sse_ceiling -- paced 64 2000
//! cargo run --release -p cleave-gateway --example sse_ceiling -- cluster 64 256
//! ```
//! Arguments: `instant | paced | cluster`, concurrent clients, tokens per request.
//! `instant` serves tiny-r1's tokenizer with a backend whose tokens are ready at once (each
//! request replays a fixed sequence of tiny-r1 tokens), so the gateway (validation, chat
//! template, reasoning split, JSON, SSE, HTTP) is the only work and events leave in batched
//! writes; `paced` is the same with tokens arriving one at a time (one write per event, as in
//! real decoding); `cluster` serves the real tiny-r1 deployment of configs/cpu-tiny.yaml, where
//! the CPU model bounds the rate. Clients run in the same process (reqwest) and count events.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use cleave_engine::tokenizer::Tokenizer;
use cleave_engine::{FinishReason, SamplingParams, TokenOutput};
use cleave_gateway::{ApiError, Backend, GatewayConfig, ModelInfo, Server, TokenEvents};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};

struct Instant_ {
    tokenizer: Arc<Tokenizer>,
    tokens: Arc<Vec<TokenOutput>>,
    /// Yield to the scheduler before each token, so tokens arrive one at a time (one SSE
    /// event per body write, as in real decoding) instead of all at once (batched writes).
    paced: bool,
}

impl Backend for Instant_ {
    fn tokenizer(&self) -> Option<Arc<Tokenizer>> {
        Some(self.tokenizer.clone())
    }
    fn model_info(&self) -> ModelInfo {
        ModelInfo {
            served_model_name: "tiny-r1".into(),
            max_model_len: 1 << 20,
            vocab_size: self.tokenizer.vocab_size(),
            think_end_id: self.tokenizer.think_end_id(),
        }
    }
    fn submit(&self, _prompt: Vec<u32>, params: SamplingParams) -> BoxFuture<'static, Result<TokenEvents, ApiError>> {
        let tokens = self.tokens.clone();
        let n = params.max_tokens.min(tokens.len());
        let paced = self.paced;
        let s = futures::stream::iter(0..n).then(move |i| {
            let mut t = tokens[i].clone();
            if i + 1 == n {
                t.finish = Some(FinishReason::Length);
            }
            async move {
                if paced {
                    tokio::task::yield_now().await;
                }
                Ok(t)
            }
        });
        futures::future::ready(Ok(s.boxed() as TokenEvents)).boxed()
    }
}

/// The repository: the current directory when it holds models/tiny-r1 (a copied binary),
/// else the source tree the example was built from.
fn repo() -> PathBuf {
    if std::path::Path::new("models/tiny-r1/tokenizer.json").is_file() {
        return PathBuf::from(".");
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `len` tiny-r1 tokens: reasoning, `</think>`, then content, with their detokenized text.
fn script(tok: &Tokenizer, len: usize) -> Vec<TokenOutput> {
    let text = "Let me add the digits from the right: 7 + 9 = 16, write 6 carry 1. ";
    let ids = tok.encode(text, false).expect("encode");
    let end = tok.think_end_id();
    (0..len)
        .map(|i| {
            let token =
                if Some(i) == Some(len / 2).filter(|_| end.is_some()) { end.unwrap() } else { ids[i % ids.len()] };
            let text = tok.decode(&[token], false).unwrap_or_default();
            TokenOutput { token, logprob: -0.1, text, ..TokenOutput::default() }
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map(String::as_str).unwrap_or("instant").to_string();
    let clients: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(64);
    let tokens: usize = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(2000);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let model = repo().join("models/tiny-r1");
    let (backend, cluster): (Arc<dyn Backend>, Option<cleave_actors::Cluster>) = match mode.as_str() {
        "instant" | "paced" => {
            let tok = Arc::new(Tokenizer::from_dir(&model).expect("tiny-r1 tokenizer"));
            let tokens = Arc::new(script(&tok, tokens));
            (Arc::new(Instant_ { tokenizer: tok, tokens, paced: mode == "paced" }), None)
        }
        "cluster" => {
            let mut cfg = cleave_actors::config::DeployConfig::from_yaml_file(repo().join("configs/cpu-tiny.yaml"))
                .expect("config");
            cfg.server.max_concurrent_requests = clients.max(1);
            let c = cleave_actors::Cluster::start(cfg).expect("cluster");
            (Arc::new(c.clone()), Some(c))
        }
        other => panic!("mode is instant, paced or cluster, not {other}"),
    };
    let cfg = GatewayConfig { max_concurrent_requests: clients.max(1), ..GatewayConfig::default() };
    rt.block_on(async move {
        let server = Server::start(backend, cfg, "127.0.0.1:0".parse().unwrap()).await.unwrap();
        let url = format!("http://{}/v1/chat/completions", server.local_addr());
        let client = reqwest::Client::new();
        let body = serde_json::json!({"model": "tiny-r1", "messages": [{"role": "user", "content": "What is 347 + 589?"}],
            "max_tokens": tokens, "ignore_eos": true, "temperature": 0, "stream": true});
        // Warm-up.
        let _ = client.post(&url).json(&body).send().await.unwrap().bytes().await.unwrap();
        let start = Instant::now();
        let tasks: Vec<_> = (0..clients)
            .map(|_| {
                let (client, url, body) = (client.clone(), url.clone(), body.clone());
                tokio::spawn(async move {
                    let r = client.post(&url).json(&body).send().await.unwrap();
                    assert_eq!(r.status(), 200);
                    let mut s = r.bytes_stream();
                    let (mut events, mut bytes) = (0usize, 0usize);
                    let mut tail = Vec::new();
                    while let Some(chunk) = s.next().await {
                        let chunk = chunk.unwrap();
                        bytes += chunk.len();
                        tail.extend_from_slice(&chunk);
                        let mut from = 0;
                        while let Some(p) = tail[from..].windows(2).position(|w| w == b"\n\n") {
                            events += 1;
                            from += p + 2;
                        }
                        tail.drain(..from);
                    }
                    (events, bytes)
                })
            })
            .collect();
        let (mut events, mut bytes) = (0, 0);
        for t in tasks {
            let (e, b) = t.await.unwrap();
            events += e;
            bytes += b;
        }
        let secs = start.elapsed().as_secs_f64();
        println!(
            "mode={mode} clients={clients} tokens/request={tokens}: {events} SSE events in {secs:.2} s = {:.0} events/s, {:.1} MB/s, {:.0} requests/s",
            events as f64 / secs,
            bytes as f64 / secs / 1e6,
            clients as f64 / secs
        );
        server.shutdown().await;
        if let Some(c) = cluster {
            c.shutdown();
        }
    });
}
