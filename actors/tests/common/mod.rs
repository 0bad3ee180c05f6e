//! Helpers for the cluster tests: the golden bf16-qlora checkpoint (it has a tokenizer and a
//! chat template), the shipped configs pointed at it, prompts, and the engine's own outputs.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use cleave_actors::config::DeployConfig;
use cleave_actors::{Cluster, ClusterStats, StreamEvent, TokenStream};
use cleave_engine::backend::cpu::CpuBackend;
use cleave_engine::{Engine, EngineConfig, FinishReason, Request, SamplingParams};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn golden() -> PathBuf {
    repo().join("models/golden/bf16-qlora")
}

/// A shipped config with the golden model, small caches and `edit` applied.
pub fn config(name: &str, edit: impl FnOnce(&mut DeployConfig)) -> DeployConfig {
    let text = std::fs::read_to_string(repo().join("configs").join(name)).expect("shipped config");
    let mut cfg = DeployConfig::from_yaml_str(&text).expect("valid config");
    cfg.model = golden();
    cfg.kv_cache.num_blocks = Some(256);
    edit(&mut cfg);
    cfg
}

pub fn start(cfg: DeployConfig) -> Cluster {
    Cluster::start(cfg).expect("cluster starts")
}

/// A deterministic prompt of `len` token ids (no special tokens).
pub fn prompt(len: usize, seed: usize) -> Vec<u32> {
    (0..len).map(|i| (((i * 31 + seed * 17) ^ (i >> 3)) % 380 + 12) as u32).collect()
}

pub fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams { ignore_eos: true, ..SamplingParams::greedy(max_tokens) }
}

/// What a stream delivered.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub tokens: Vec<u32>,
    pub text: String,
    pub finish: Option<FinishReason>,
    pub error: Option<cleave_actors::ActorError>,
}

pub async fn collect(mut s: TokenStream) -> Outcome {
    let mut o = Outcome { tokens: Vec::new(), text: String::new(), finish: None, error: None };
    let wait = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(ev) = s.recv_async().await {
            match ev {
                StreamEvent::Token(t) => {
                    assert!(o.finish.is_none(), "token after the final one");
                    o.tokens.push(t.token);
                    o.text.push_str(&t.text);
                    o.finish = t.finish;
                }
                StreamEvent::Error(e) => o.error = Some(e),
            }
        }
    });
    wait.await.expect("the stream must not hang");
    o
}

/// The engine's own greedy outputs (what `cleave generate` prints), one rank, no actors.
pub fn reference(prompts: &[Vec<u32>], max_tokens: usize) -> Vec<Outcome> {
    let cfg = EngineConfig {
        max_num_seqs: 64,
        max_num_batched_tokens: 2048,
        block_size: 64,
        num_blocks: 256,
        max_model_len: None,
        ..EngineConfig::default()
    };
    let mut engine = Engine::load(CpuBackend, &golden(), cfg).expect("load golden");
    let reqs = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| Request { id: i as u64, prompt: p.clone(), params: greedy(max_tokens), prefill_only: false })
        .collect();
    let mut out = engine.generate(reqs).expect("generate");
    (0..prompts.len())
        .map(|i| {
            let toks = out.remove(&(i as u64)).unwrap();
            Outcome {
                tokens: toks.iter().map(|t| t.token).collect(),
                text: toks.iter().map(|t| t.text.as_str()).collect(),
                finish: toks.last().and_then(|t| t.finish),
                error: None,
            }
        })
        .collect()
}

/// Waits for the cluster to drain and asserts nothing leaked.
pub fn assert_no_leaks(c: &Cluster) -> ClusterStats {
    let s = c.wait_idle(Duration::from_secs(20));
    assert!(s.is_idle(), "leaked: {s:#?}");
    s
}

/// The value of a metric line `name{labels} value` in Prometheus text, 0 when absent.
/// The value of `series` (written without the `model_name` label every series carries).
pub fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .map(without_model_name)
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse::<f64>().ok()))
        .unwrap_or(0.0)
}

/// `l` without its `model_name="..."` label.
pub fn without_model_name(l: &str) -> String {
    let Some(at) = l.find("model_name=\"") else { return l.to_string() };
    let end = l[at + 12..].find('"').map_or(l.len(), |e| at + 12 + e + 1);
    let (mut head, mut tail) = (l[..at].to_string(), l[end..].to_string());
    if tail.starts_with(',') {
        tail.remove(0);
    } else if head.ends_with(',') {
        head.pop();
    }
    if head.ends_with('{') && tail.starts_with('}') {
        head.pop();
        tail.remove(0);
    }
    head + &tail
}
