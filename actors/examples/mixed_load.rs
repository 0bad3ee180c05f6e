//! Mixed CPU load: many short streams with long outputs, and a few long prompts arriving while
//! they decode. Reports the inter-token latency of the short streams (what a long prefill does
//! to everyone else's decoding) for colocated serving versus 1 prefill + 1 decode rank.
//!
//! ```text
//! cargo run --release -p cleave-actors --example mixed_load -- \
//!     [--model models/tiny-r1] [--short 16] [--short-prompt 24] [--short-output 192] \
//!     [--long 6] [--long-prompt 1536] [--long-output 16] [--long-every-ms 250] [--modes colocated,1p1d]
//! ```
//! Modes use the shipped `configs/cpu-colocated.yaml` and `configs/cpu-tiny.yaml` (1P1D).
//! Percentiles interpolate linearly (as `vllm bench serve` does).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cleave_actors::config::DeployConfig;
use cleave_actors::{Cluster, SamplingParams, StreamEvent};

struct Args {
    model: Option<PathBuf>,
    short: usize,
    short_prompt: usize,
    short_output: usize,
    long: usize,
    long_prompt: usize,
    long_output: usize,
    long_every: Duration,
    modes: Vec<String>,
}

fn args() -> Args {
    let mut kv: HashMap<String, String> = HashMap::new();
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        kv.insert(k.trim_start_matches("--").to_string(), v);
    }
    let num = |k: &str, d: usize| kv.get(k).map_or(d, |v| v.parse().unwrap_or_else(|_| panic!("--{k}: not a number")));
    Args {
        model: kv.get("model").map(PathBuf::from),
        short: num("short", 16),
        short_prompt: num("short-prompt", 24),
        short_output: num("short-output", 192),
        long: num("long", 6),
        long_prompt: num("long-prompt", 1536),
        long_output: num("long-output", 16),
        long_every: Duration::from_millis(num("long-every-ms", 250) as u64),
        modes: kv
            .get("modes")
            .map_or_else(|| vec!["colocated".into(), "1p1d".into()], |m| m.split(',').map(String::from).collect()),
    }
}

fn prompt(len: usize, seed: usize, vocab: usize) -> Vec<u32> {
    (0..len).map(|i| (((i * 31 + seed * 17) ^ (i >> 3)) % (vocab - 20) + 10) as u32).collect()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let x = p / 100.0 * (sorted.len() - 1) as f64;
    let (lo, hi) = (x.floor() as usize, x.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (x - lo as f64)
}

/// Per-stream receive times: (submit time, token arrival times).
async fn timed(cluster: Cluster, prompt: Vec<u32>, max_tokens: usize) -> (Instant, Vec<Instant>) {
    let t0 = Instant::now();
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(max_tokens) };
    let mut s = cluster.submit(prompt, params).await.expect("submit");
    let mut times = Vec::new();
    while let Some(ev) = s.recv_async().await {
        match ev {
            StreamEvent::Token(_) => times.push(Instant::now()),
            StreamEvent::Error(e) => panic!("stream failed: {e}"),
        }
    }
    (t0, times)
}

async fn run(mode: &str, a: &Args) -> String {
    let file = match mode {
        "colocated" => "cpu-colocated.yaml",
        "1p1d" => "cpu-tiny.yaml",
        other => panic!("unknown mode {other} (colocated | 1p1d)"),
    };
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../configs").join(file);
    let mut cfg = DeployConfig::from_yaml_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    if let Some(m) = &a.model {
        cfg.model = m.clone();
    }
    cfg.resolve_model(Some(&path)).expect("model directory");
    let cluster = Cluster::start(cfg).expect("cluster");
    let vocab = cluster.model_info().vocab_size;
    // Warm-up (page in the weights, first allocations).
    timed(cluster.clone(), prompt(a.long_prompt, 999, vocab), 2).await;
    timed(cluster.clone(), prompt(a.short_prompt, 998, vocab), 2).await;

    let start = Instant::now();
    let shorts: Vec<_> = (0..a.short)
        .map(|i| tokio::spawn(timed(cluster.clone(), prompt(a.short_prompt, i, vocab), a.short_output)))
        .collect();
    let mut longs = Vec::new();
    for i in 0..a.long {
        tokio::time::sleep(if i == 0 { a.long_every / 2 } else { a.long_every }).await;
        longs.push(tokio::spawn(timed(cluster.clone(), prompt(a.long_prompt, 100 + i, vocab), a.long_output)));
    }
    let mut itl = Vec::new();
    let mut ttft_short = Vec::new();
    let mut tokens = 0;
    for h in shorts {
        let (t0, times) = h.await.unwrap();
        ttft_short.push((times[0] - t0).as_secs_f64() * 1e3);
        itl.extend(times.windows(2).map(|w| (w[1] - w[0]).as_secs_f64() * 1e3));
        tokens += times.len();
    }
    let mut ttft_long = Vec::new();
    for h in longs {
        let (t0, times) = h.await.unwrap();
        ttft_long.push((times[0] - t0).as_secs_f64() * 1e3);
        tokens += times.len();
    }
    let wall = start.elapsed().as_secs_f64();
    let stats = cluster.wait_idle(Duration::from_secs(10));
    assert!(stats.is_idle(), "leak: {stats:?}");
    let metrics = cluster.metrics_text();
    let routed = |r: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("cleave_router_requests_total{{route=\"{r}\"}} ")))
            .unwrap_or("0")
            .to_string()
    };
    cluster.shutdown();
    for v in [&mut itl, &mut ttft_short, &mut ttft_long] {
        v.sort_by(|x, y| x.partial_cmp(y).unwrap());
    }
    format!(
        "| {mode:<9} | {:>7.2} | {:>7.2} | {:>7.2} | {:>8.2} | {:>8.1} | {:>8.1} | {:>8.1} | {:>6.1} | {:>5}/{:<5} |",
        percentile(&itl, 50.0),
        percentile(&itl, 90.0),
        percentile(&itl, 99.0),
        itl.last().copied().unwrap_or(f64::NAN),
        percentile(&ttft_short, 50.0),
        percentile(&ttft_long, 50.0),
        percentile(&ttft_long, 99.0),
        tokens as f64 / wall,
        routed("prefill_pool"),
        routed("decode_local"),
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let a = args();
    println!(
        "short streams: {} x ({} prompt -> {} output tokens); long prompts: {} x ({} -> {}), one every {} ms; cores: {}",
        a.short,
        a.short_prompt,
        a.short_output,
        a.long,
        a.long_prompt,
        a.long_output,
        a.long_every.as_millis(),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!("| mode      | ITL p50 | ITL p90 | ITL p99 |  ITL max | TTFT short p50 | TTFT long p50 | TTFT long p99 | tok/s | routes prefill/local |");
    println!("|-----------|---------|---------|---------|----------|----------|----------|----------|--------|-------------|");
    for mode in &a.modes {
        println!("{}", run(mode, &a).await);
    }
    println!("(latencies in ms; ITL over the short streams only)");
}
