//! `cleave-bench soak`: a server under sustained abuse. Workers send, until the time is up,
//! a mix of normal streamed requests (read to the end), requests whose client hangs up after a
//! few chunks, and bad input (malformed JSON, out-of-range fields, a wrong content type); at
//! more concurrency than the server admits, so some are refused. Every answer must be what it
//! should: a complete stream, a 4xx for bad input, a 429 with Retry-After when full. Never a
//! 5xx, a hang, or a broken stream. Afterwards nothing may be left in flight and no KV block
//! held; with `--pid` the server's resident memory is sampled and must stay flat.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::json;

use crate::bench::{resolve_target, write_json};
use crate::cli::SoakArgs;

/// What happened to the requests, by kind.
#[derive(Default)]
struct Tally {
    completed: AtomicU64,
    refused: AtomicU64,
    disconnected: AtomicU64,
    bad_input_rejected: AtomicU64,
    /// Anything else: 5xx, a 4xx for a good request, a stream without [DONE], a timeout.
    unexpected: AtomicU64,
}

fn bump(a: &AtomicU64) {
    a.fetch_add(1, Ordering::Relaxed);
}

/// Bad bodies (and content types) a server must refuse with a 4xx.
fn bad_request(i: u64, model: &str) -> (&'static str, String) {
    match i % 5 {
        0 => ("application/json", "{\"messages\": [".into()),
        1 => (
            "application/json",
            json!({"model": model, "messages": [{"role": "user", "content": "x"}], "temperature": -1}).to_string(),
        ),
        2 => ("application/json", json!({"model": model, "prompt": [1, 2, 99_999_999]}).to_string()),
        3 => ("text/plain", json!({"model": model, "prompt": "hi"}).to_string()),
        _ => ("application/json", json!({"model": model, "prompt": "hi", "stop": vec!["s"; 100]}).to_string()),
    }
}

/// Reads a streamed answer to its end (or `chunks` chunks, then hangs up); true when it ended
/// with `data: [DONE]`.
async fn read_stream(resp: reqwest::Response, chunks: Option<usize>) -> Result<bool> {
    let mut s = resp.bytes_stream();
    let mut tail = Vec::new();
    let mut n = 0;
    while let Some(c) = s.next().await {
        let c = c?;
        n += 1;
        tail.extend_from_slice(&c);
        if tail.len() > 64 {
            tail.drain(..tail.len() - 64);
        }
        if chunks.is_some_and(|k| n >= k) {
            return Ok(false);
        }
    }
    Ok(String::from_utf8_lossy(&tail).contains("data: [DONE]"))
}

async fn worker(
    c: reqwest::Client,
    url: String,
    model: String,
    a: Arc<SoakArgs>,
    t: Arc<Tally>,
    id: u64,
    end: Instant,
) {
    let mut rng = StdRng::seed_from_u64(a.seed ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut i = 0u64;
    while Instant::now() < end {
        i += 1;
        let roll: f64 = rng.random();
        let endpoint = format!("{url}/v1/completions");
        if roll < a.bad_fraction {
            let (ct, body) = bad_request(i, &model);
            match c.post(&endpoint).header("content-type", ct).body(body).send().await {
                Ok(r) if r.status().is_client_error() && r.status() != 429 => bump(&t.bad_input_rejected),
                Ok(r) if r.status() == 429 => bump(&t.refused),
                _ => bump(&t.unexpected),
            }
            continue;
        }
        let hang_up = roll < a.bad_fraction + a.disconnect_fraction;
        let body = json!({"model": model, "prompt": format!("soak {id} {i}: count to ten."), "max_tokens": a.max_tokens,
            "ignore_eos": true, "stream": true});
        let sent = tokio::time::timeout(Duration::from_secs(a.request_timeout_s), async {
            let r = c.post(&endpoint).json(&body).send().await?;
            match r.status().as_u16() {
                200 => read_stream(r, hang_up.then_some(2)).await.map(Some),
                429 if r.headers().contains_key("retry-after") => Ok(None),
                s => bail!("status {s}"),
            }
        })
        .await;
        match sent {
            Ok(Ok(Some(true))) => bump(&t.completed),
            Ok(Ok(Some(false))) if hang_up => bump(&t.disconnected),
            Ok(Ok(None)) => {
                bump(&t.refused);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => {
                if a.verbose {
                    eprintln!("unexpected: {:?}", other.map(|r| r.map_err(|e| e.to_string())));
                }
                bump(&t.unexpected)
            }
        }
    }
}

/// Resident memory of `pid` in MiB (Linux).
fn rss_mib(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 = s.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// The sum of every series of `name` in a Prometheus text.
fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `cleave-bench soak`.
pub async fn main(args: SoakArgs) -> Result<()> {
    let (target, _) = resolve_target(&args.server).await?;
    let (url, model) = (args.server.base_url(), target.model.clone());
    let client = target.client.http.clone();
    let a = Arc::new(args);
    let t = Arc::new(Tally::default());
    let start = Instant::now();
    let end = start + Duration::from_secs(a.duration_s);
    let tasks: Vec<_> = (0..a.concurrency as u64)
        .map(|id| tokio::spawn(worker(client.clone(), url.clone(), model.clone(), a.clone(), t.clone(), id, end)))
        .collect();
    let mut rss = Vec::new();
    while Instant::now() < end {
        if let Some(r) = a.pid.and_then(rss_mib) {
            rss.push((start.elapsed().as_secs_f64(), r));
        }
        tokio::time::sleep(Duration::from_secs(1).min(end.saturating_duration_since(Instant::now()))).await;
    }
    for task in tasks {
        task.await.context("a soak worker panicked")?;
    }
    // Nothing may stay in flight or hold KV blocks once the clients are done.
    let metrics_url = format!("{url}/metrics");
    let mut left = (f64::NAN, f64::NAN);
    for _ in 0..100 {
        let text = client.get(&metrics_url).send().await?.text().await?;
        left = (metric_sum(&text, "cleave_num_requests_in_flight"), metric_sum(&text, "cleave_kv_blocks_in_use"));
        if left == (0.0, 0.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let load = |v: &AtomicU64| v.load(Ordering::Relaxed);
    // RSS: the median of the first and of the last quarter of the samples.
    let quarter = |part: &[(f64, f64)]| {
        let mut v: Vec<f64> = part.iter().map(|s| s.1).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    let q = (rss.len() / 4).max(1);
    let (rss_first, rss_last) = (quarter(&rss[..q.min(rss.len())]), quarter(&rss[rss.len().saturating_sub(q)..]));
    let result = json!({
        "duration_s": start.elapsed().as_secs_f64(), "concurrency": a.concurrency,
        "completed": load(&t.completed), "refused_429": load(&t.refused), "disconnected": load(&t.disconnected),
        "bad_input_rejected": load(&t.bad_input_rejected), "unexpected": load(&t.unexpected),
        "in_flight_after": left.0, "kv_blocks_in_use_after": left.1,
        "rss_mib_first_quarter": rss_first, "rss_mib_last_quarter": rss_last, "rss_samples": rss.len(),
    });
    println!("{}", serde_json::to_string_pretty(&result)?);
    if let Some(p) = &a.save_result {
        write_json(p, &result)?;
    }
    let grew = match (rss_first, rss_last) {
        (Some(f), Some(l)) => l - f > a.max_rss_growth_mib,
        _ => false,
    };
    if load(&t.unexpected) > 0 || left != (0.0, 0.0) || load(&t.completed) == 0 || grew {
        bail!("soak failed: {result}");
    }
    Ok(())
}
