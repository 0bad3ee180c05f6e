//! `cleave-bench multi-turn`: chat conversations the way R1 users hold them. Every conversation
//! starts with the same long system prompt, then sends `--turns` user messages, each with the
//! whole history (the earlier answers included) once the previous answer is complete;
//! `--max-concurrency` conversations run at once. Reported: TTFT of first turns and of later
//! turns, ITL, output throughput, and the prompt tokens the server says it served from its
//! prefix cache (`usage.prompt_tokens_details.cached_tokens`).

use std::time::Instant;

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use serde_json::{json, Value};

use crate::bench::{prompt_tokenizer, resolve_target, write_json};
use crate::cli::MultiTurnArgs;
use crate::client::{send_request, Endpoint, Prompt, RequestInput, RequestOutput};
use crate::dataset::{random_requests, RandomSpec};
use crate::metrics::{mean, percentile};

/// One answered turn.
struct TurnResult {
    turn: usize,
    out: RequestOutput,
    cached: usize,
}

/// Random text of `len` tokens, `n` times.
async fn texts(
    tok: &crate::dataset::PromptTokenizer<'_>,
    a: &MultiTurnArgs,
    len: usize,
    n: usize,
    seed: u64,
) -> Result<Vec<String>> {
    let spec = RandomSpec {
        input_len: len,
        prefix_len: 0,
        output_len: 1,
        range_ratio: 0.0,
        num_prompts: n,
        token_id_range: a.token_id_range,
        as_token_ids: false,
        seed,
    };
    Ok(random_requests(tok, &spec)
        .await?
        .into_iter()
        .map(|r| match r.prompt {
            Prompt::Text(t) => t,
            _ => unreachable!("text prompts were asked for"),
        })
        .collect())
}

fn cached_tokens(out: &RequestOutput) -> usize {
    out.usage.as_ref().and_then(|u| u["prompt_tokens_details"]["cached_tokens"].as_u64()).unwrap_or(0) as usize
}

/// Runs the conversations and prints (and saves) the summary.
pub async fn main(a: MultiTurnArgs) -> Result<()> {
    if a.turns == 0 || a.num_conversations == 0 || a.max_concurrency == 0 {
        bail!("--turns, --num-conversations and --max-concurrency must be positive");
    }
    let (mut target, max_len) = resolve_target(&a.server).await?;
    if a.server.endpoint.is_none() {
        target.api_url = target.client.url("/v1/chat/completions");
    }
    let need = a.system_prompt_len + a.turns * (a.user_len + a.output_len + 8);
    if let Some(max) = max_len.filter(|&m| need > m) {
        bail!("{} turns need about {need} tokens, more than the server's max_model_len {max}", a.turns);
    }
    let tok = prompt_tokenizer(&target, a.tokenizer.as_deref())?;
    let system = texts(&tok, &a, a.system_prompt_len, 1, a.seed).await.context("building the system prompt")?.remove(0);
    let users = texts(&tok, &a, a.user_len, a.num_conversations * a.turns, a.seed ^ 0x7u64)
        .await
        .context("building the user messages")?;
    let extra_body = a.server.extra_body()?;
    println!(
        "{} conversations x {} turns, system prompt {} tokens, user {} / answer {} tokens, {} at once",
        a.num_conversations, a.turns, a.system_prompt_len, a.user_len, a.output_len, a.max_concurrency
    );
    let epoch = Instant::now();
    let (target, system, users, extra_body) = (&target, &system, &users, &extra_body);
    let conversations: Vec<Vec<TurnResult>> = futures::stream::iter(0..a.num_conversations)
        .map(|c| async move {
            let mut messages = vec![json!({"role": "system", "content": system})];
            let mut done = Vec::new();
            for turn in 0..a.turns {
                messages.push(json!({"role": "user", "content": users[c * a.turns + turn]}));
                let input = RequestInput {
                    prompt: Prompt::Messages(messages.clone()),
                    prompt_len: 0,
                    output_len: a.output_len,
                    ignore_eos: true,
                    extra_body: extra_body.clone(),
                };
                let out =
                    send_request(&target.client.http, &target.api_url, Endpoint::Chat, &target.model, &input, epoch)
                        .await;
                let ok = out.success;
                // The history keeps the answer's content, as chat clients do; an answer with
                // none (a random-weight model never closes its think block) keeps its reasoning,
                // so that the prompt still grows turn by turn as a real chat's does.
                let answer = if out.generated_text.is_empty() { &out.reasoning_text } else { &out.generated_text };
                messages.push(json!({"role": "assistant", "content": answer}));
                done.push(TurnResult { turn, cached: cached_tokens(&out), out });
                if !ok {
                    break;
                }
            }
            done
        })
        .buffer_unordered(a.max_concurrency)
        .collect()
        .await;
    let duration = epoch.elapsed().as_secs_f64();
    let summary = summarize(&conversations, duration, &a);
    print_summary(&summary);
    if let Some(path) = &a.save_result {
        write_json(path, &summary)?;
        println!("saved {}", path.display());
    }
    if summary["failed_turns"].as_u64() != Some(0) {
        bail!("{} turns failed", summary["failed_turns"]);
    }
    Ok(())
}

fn ms(v: f64) -> f64 {
    (v * 1e5).round() / 100.0
}

/// The run's numbers as JSON (times in ms).
fn summarize(conversations: &[Vec<TurnResult>], duration: f64, a: &MultiTurnArgs) -> Value {
    let all: Vec<&TurnResult> = conversations.iter().flatten().collect();
    let ok: Vec<&TurnResult> = all.iter().copied().filter(|t| t.out.success).collect();
    let ttft = |first: bool| -> Vec<f64> { ok.iter().filter(|t| (t.turn == 0) == first).map(|t| t.out.ttft).collect() };
    let (first, later) = (ttft(true), ttft(false));
    let itl: Vec<f64> = ok.iter().flat_map(|t| t.out.itl.iter().copied()).collect();
    let output: usize = ok.iter().map(|t| t.out.output_len()).sum();
    let prompt: usize = ok.iter().map(|t| t.out.prompt_len).sum();
    let cached: usize = ok.iter().map(|t| t.cached).sum();
    let pct = |v: &[f64], p: f64| if v.is_empty() { 0.0 } else { ms(percentile(v, p)) };
    json!({
        "num_conversations": a.num_conversations,
        "turns": a.turns,
        "system_prompt_len": a.system_prompt_len,
        "user_len": a.user_len,
        "output_len": a.output_len,
        "max_concurrency": a.max_concurrency,
        "completed_turns": ok.len(),
        "failed_turns": all.len() - ok.len(),
        "errors": all.iter().filter(|t| !t.out.success).map(|t| t.out.error.clone()).take(5).collect::<Vec<_>>(),
        "duration_s": duration,
        "output_throughput": output as f64 / duration,
        "total_prompt_tokens": prompt,
        "cached_prompt_tokens": cached,
        "prefix_cache_hit_rate": if prompt == 0 { 0.0 } else { cached as f64 / prompt as f64 },
        "mean_ttft_first_turn_ms": if first.is_empty() { 0.0 } else { ms(mean(&first)) },
        "median_ttft_first_turn_ms": pct(&first, 50.0),
        "mean_ttft_later_turns_ms": if later.is_empty() { 0.0 } else { ms(mean(&later)) },
        "median_ttft_later_turns_ms": pct(&later, 50.0),
        "p99_ttft_later_turns_ms": pct(&later, 99.0),
        "median_itl_ms": pct(&itl, 50.0),
        "p99_itl_ms": pct(&itl, 99.0),
    })
}

fn print_summary(s: &Value) {
    println!("{:=^60}", " Multi-turn Result ");
    for (label, key) in [
        ("Completed turns:", "completed_turns"),
        ("Failed turns:", "failed_turns"),
        ("Duration (s):", "duration_s"),
        ("Output token throughput (tok/s):", "output_throughput"),
        ("Prompt tokens:", "total_prompt_tokens"),
        ("Cached prompt tokens:", "cached_prompt_tokens"),
        ("Prefix cache hit rate:", "prefix_cache_hit_rate"),
        ("Median TTFT, first turns (ms):", "median_ttft_first_turn_ms"),
        ("Median TTFT, later turns (ms):", "median_ttft_later_turns_ms"),
        ("P99 TTFT, later turns (ms):", "p99_ttft_later_turns_ms"),
        ("Median ITL (ms):", "median_itl_ms"),
        ("P99 ITL (ms):", "p99_itl_ms"),
    ] {
        let v = &s[key];
        let shown = match v.as_f64() {
            Some(f) if v.is_f64() => format!("{f:.2}"),
            _ => v.to_string(),
        };
        println!("{label:<40}{shown:>20}");
    }
    println!("{}", "=".repeat(60));
}
