//! Prefix caching through HTTP on the default model (tiny-r1): multi-turn chats that share a
//! ~1.5k-token system prompt, colocated and 2p2d, against the same deployment with
//! `enable_prefix_caching: false`. With caching the second turn reports its cached prompt tokens
//! in `usage.prompt_tokens_details.cached_tokens` and its first token comes at least twice as
//! fast; the answers are identical; every KV block is returned.

mod common;

use std::time::{Duration, Instant};

use cleave_engine::tokenizer::Tokenizer;
use common::{gather_chat, parse_sse, repo, tiny_r1_config, TestServer};
use serde_json::{json, Value};

/// A system prompt of at least `tokens` tokens for tiny-r1's tokenizer.
fn system_prompt(tokens: usize) -> String {
    let tok = Tokenizer::from_dir_if_present(&repo().join("models/tiny-r1")).unwrap().expect("tiny-r1 has a tokenizer");
    let mut text = String::from("You are a careful calculator. ");
    let mut i = 0;
    while tok.encode(&text, false).unwrap().len() < tokens {
        text.push_str(&format!("Rule {i}: check {} plus {} twice before answering. ", 17 * i + 3, 29 * i + 11));
        i += 1;
    }
    text
}

async fn server(config: &str, caching: bool) -> Option<TestServer> {
    let mut text = tiny_r1_config(config)?;
    if !caching {
        text.push_str("enable_prefix_caching: false\n");
    }
    Some(TestServer::from_yaml(&text, |_| {}).await)
}

/// One streamed turn: the answer (reasoning and content), the usage chunk and the time to the
/// first token.
struct Turn {
    reasoning: String,
    content: String,
    usage: Value,
    ttft: Duration,
}

async fn turn(s: &TestServer, messages: &[Value]) -> Turn {
    let body = json!({
        "model": "tiny-r1", "messages": messages, "temperature": 0, "max_tokens": 24,
        "stream": true, "stream_options": {"include_usage": true},
    });
    let t0 = Instant::now();
    let mut r = s.post("/v1/chat/completions", &body).await;
    assert_eq!(r.status(), 200);
    let mut body = Vec::new();
    let mut ttft = None;
    while let Some(chunk) = r.chunk().await.expect("stream chunk") {
        body.extend_from_slice(&chunk);
        ttft = ttft.or_else(|| String::from_utf8_lossy(&body).contains("data: ").then(|| t0.elapsed()));
    }
    let (c, usage) = gather_chat(&parse_sse(&String::from_utf8(body).unwrap()), 1);
    Turn {
        reasoning: c[0].reasoning.clone(),
        content: c[0].content.clone(),
        usage: usage.expect("usage chunk"),
        ttft: ttft.expect("a first event"),
    }
}

/// Two-turn conversations sharing `system`; returns every turn.
async fn conversations(s: &TestServer, system: &str) -> Vec<[Turn; 2]> {
    let mut out = Vec::new();
    for (a, b) in [(347, 589), (128, 64), (905, 77)] {
        let mut msgs = vec![
            json!({"role": "system", "content": system}),
            json!({"role": "user", "content": format!("What is {a} + {b}?")}),
        ];
        let first = turn(s, &msgs).await;
        msgs.push(json!({"role": "assistant", "content": first.content.clone()}));
        msgs.push(json!({"role": "user", "content": format!("And {b} + {a}?")}));
        let second = turn(s, &msgs).await;
        out.push([first, second]);
    }
    let stats = s.wait_idle();
    assert_eq!(stats.blocks_in_use(), 0, "{stats:?}");
    out
}

fn median(mut d: Vec<Duration>) -> Duration {
    d.sort();
    d[d.len() / 2]
}

async fn check(config: &str) {
    let system = system_prompt(1500);
    let Some(on) = server(config, true).await else { return };
    let cached = conversations(&on, &system).await;
    let metrics = on.get("/metrics").await.text().await.unwrap();
    drop(on);
    let Some(off) = server(config, false).await else { return };
    let plain = conversations(&off, &system).await;
    drop(off);

    for (i, (c, p)) in cached.iter().zip(&plain).enumerate() {
        for t in 0..2 {
            let what = format!("{config}: conversation {i}, turn {}", t + 1);
            assert_eq!((&c[t].reasoning, &c[t].content), (&p[t].reasoning, &p[t].content), "{what}: answers differ");
            assert_eq!(p[t].usage["prompt_tokens_details"]["cached_tokens"], 0, "{what}: nothing cached when off");
            assert_eq!(c[t].usage["prompt_tokens"], p[t].usage["prompt_tokens"]);
        }
        let second = &c[1].usage;
        let got = second["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
        assert!(
            got >= 1400 && got < second["prompt_tokens"].as_u64().unwrap(),
            "{config}: turn 2 cached {got}: {second}"
        );
    }
    let ttft = |runs: &[[Turn; 2]]| median(runs.iter().map(|c| c[1].ttft).collect());
    let (with, without) = (ttft(&cached), ttft(&plain));
    assert!(with * 2 <= without, "{config}: second-turn TTFT {with:?} with caching, {without:?} without");
    let hits: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("cleave_prefix_cache_hits_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(hits >= 3.0 * 1400.0, "the metrics count the hits: {hits}");
    eprintln!("{config}: second-turn TTFT {with:?} with caching, {without:?} without");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_turn_chats_reuse_the_system_prompt_colocated() {
    check("cpu-colocated.yaml").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_turn_chats_reuse_the_system_prompt_2p2d() {
    check("cpu-2p2d.yaml").await;
}
