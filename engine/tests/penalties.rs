//! The presence and frequency penalties and logit bias through the engine on tiny-r1: each greedy
//! pick is recomputed from the model's own (unmodified) top logprobs that the engine returns, so
//! the test checks the arithmetic and what the penalties count (the output, not the prompt).

use std::collections::HashMap;
use std::path::PathBuf;

use cleave_engine::backend::cpu::CpuBackend;
use cleave_engine::{Engine, EngineConfig, Request, SamplingParams, TokenOutput};

const PROMPT: [u32; 8] = [5, 9, 13, 17, 21, 25, 29, 33];
const TOP: usize = 20;

fn engine() -> Engine<CpuBackend> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/tiny-r1");
    let cfg = EngineConfig {
        max_num_seqs: 4,
        block_size: 16,
        num_blocks: 64,
        max_model_len: Some(256),
        ..EngineConfig::default()
    };
    Engine::load(CpuBackend, &dir, cfg).expect("tiny-r1 loads")
}

fn run(e: &mut Engine<CpuBackend>, params: SamplingParams) -> Vec<TokenOutput> {
    let req = Request { id: 1, prompt: PROMPT.to_vec(), params, prefill_only: false };
    e.generate(vec![req]).unwrap().remove(&1).unwrap()
}

fn greedy(tokens: usize) -> SamplingParams {
    SamplingParams { top_logprobs: TOP, ignore_eos: true, ..SamplingParams::greedy(tokens) }
}

#[test]
fn presence_and_frequency_penalties_count_each_output_token_and_no_prompt_token() {
    let mut e = engine();
    let (presence, frequency) = (0.7f32, 0.9f32);
    let p = SamplingParams { presence_penalty: presence, frequency_penalty: frequency, ..greedy(24) };
    let out = run(&mut e, p);
    assert_eq!(out.len(), 24);
    let mut counts: HashMap<u32, u32> = HashMap::new();
    for (i, t) in out.iter().enumerate() {
        // The engine's pick is the best penalized candidate among the model's top logprobs.
        let penalized = |&(tok, lp): &(u32, f32)| {
            let n = counts.get(&tok).copied().unwrap_or(0);
            (tok, lp - if n > 0 { presence + frequency * n as f32 } else { 0.0 })
        };
        let best = t.top_logprobs.iter().map(penalized).max_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
        assert!(t.top_logprobs.iter().any(|&(tok, _)| tok == t.token), "position {i}: the pick is in the top {TOP}");
        assert_eq!(t.token, best.0, "position {i}: counts {counts:?}");
        *counts.entry(t.token).or_default() += 1;
    }
    let plain = run(&mut e, greedy(24));
    assert_eq!(plain[0].token, out[0].token, "the first pick sees no output yet (the prompt is not counted)");
    let ids = |o: &[TokenOutput]| o.iter().map(|t| t.token).collect::<Vec<_>>();
    assert_ne!(ids(&out), ids(&plain), "the penalties changed later picks");
    assert_eq!(e.stats().used_blocks, 0);
}

#[test]
fn logit_bias_moves_the_pick_by_exactly_the_bias() {
    let mut e = engine();
    let first = run(&mut e, greedy(1)).remove(0);
    let (a, la) = first.top_logprobs[0];
    let (b, lb) = first.top_logprobs[1];
    assert_eq!(first.token, a);
    // Logits and logprobs differ by one constant per position: the gap is the same.
    let gap = la - lb;
    let with_bias = |bias: f32| SamplingParams { logit_bias: vec![(b, bias)], ..greedy(1) };
    assert_eq!(run(&mut e, with_bias(gap + 0.05))[0].token, b, "a bias past the gap turns the pick");
    let kept = run(&mut e, with_bias(gap - 0.05)).remove(0);
    assert_eq!(kept.token, a, "a bias short of it does not");
    assert_eq!(kept.top_logprobs[0], (a, la), "logprobs stay the model's own");
    // -100 takes a token out; +100 makes it every pick.
    let p = SamplingParams { logit_bias: vec![(a, -100.0)], ..greedy(1) };
    assert_ne!(run(&mut e, p)[0].token, a);
    let p = SamplingParams { logit_bias: vec![(77, 100.0)], ..greedy(6) };
    assert!(run(&mut e, p).iter().all(|t| t.token == 77));
}
