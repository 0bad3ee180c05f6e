//! The engine against HF transformers: `models/golden/make_golden.py` made small random-weight
//! DeepSeek-V3 checkpoints and recorded HF's greedy tokens, their logprobs and the logits.

use std::path::PathBuf;

use cleave_engine::backend::cpu::CpuBackend;
use cleave_engine::backend::{AttnBatch, AttnSeq, Backend, KvLayout};
use cleave_engine::model::{LoadOptions, Model, StepInput};
use cleave_engine::{Engine, EngineConfig, TokenOutput};
use serde_json::Value;

/// A step whose top-2 logit gap is below this is a near-tie: HF's f32 and ours may pick either.
const NEAR_TIE: f64 = 1e-3;
const LOGPROB_TOL: f64 = 1e-3;

fn case_dir(case: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/golden").join(case)
}

/// A golden prompt: its ids, HF's greedy continuation, that continuation's logprobs, and each
/// step's margin between the two most likely tokens.
type Prompt = (Vec<u32>, Vec<u32>, Vec<f64>, Vec<f64>);

struct Case {
    prompts: Vec<Prompt>,
    first_logits: Vec<f64>,
}

fn expected(case: &str) -> Case {
    let text = std::fs::read_to_string(case_dir(case).join("expected.json")).expect("expected.json");
    let v: Value = serde_json::from_str(&text).unwrap();
    let ids = |x: &Value| x.as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect::<Vec<_>>();
    let floats = |x: &Value| x.as_array().unwrap().iter().map(|t| t.as_f64().unwrap()).collect::<Vec<_>>();
    Case {
        prompts: v["prompts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (ids(&p["prompt_ids"]), ids(&p["token_ids"]), floats(&p["logprobs"]), floats(&p["margins"])))
            .collect(),
        first_logits: floats(&v["first_logits"]),
    }
}

fn run(case: &str, cfg: EngineConfig) -> Vec<Vec<TokenOutput>> {
    run_counting_preemptions(case, cfg).0
}

/// Generates every prompt of `case` greedily in one engine; also returns the preemption count.
fn run_counting_preemptions(case: &str, cfg: EngineConfig) -> (Vec<Vec<TokenOutput>>, u64) {
    let exp = expected(case);
    let mut engine = Engine::load(CpuBackend, &case_dir(case), cfg).expect("load");
    let prompts: Vec<Vec<u32>> = exp.prompts.iter().map(|p| p.0.clone()).collect();
    let lens: Vec<usize> = exp.prompts.iter().map(|p| p.1.len()).collect();
    let out = engine.generate_greedy(&prompts, &lens).expect("generate");
    assert_eq!(engine.stats().used_blocks, 0, "blocks leaked");
    (out, engine.stats().preemptions)
}

fn check_against_hf(case: &str, cfg: EngineConfig) {
    let exp = expected(case);
    let got = run(case, cfg);
    for (i, ((_, want, logprobs, margins), out)) in exp.prompts.iter().zip(&got).enumerate() {
        assert_eq!(out.len(), want.len(), "{case} prompt {i}: token count");
        for (step, t) in out.iter().enumerate() {
            if t.token != want[step] {
                assert!(
                    margins[step] < NEAR_TIE,
                    "{case} prompt {i} step {step}: cleave chose {} where HF chose {} (HF margin {})",
                    t.token,
                    want[step],
                    margins[step]
                );
                break; // a near-tie went the other way; later tokens legitimately differ
            }
            let d = (t.logprob as f64 - logprobs[step]).abs();
            assert!(
                d < LOGPROB_TOL,
                "{case} prompt {i} step {step}: logprob {} vs HF {} (diff {d})",
                t.logprob,
                logprobs[step]
            );
        }
    }
}

fn chunked(block_size: usize, budget: usize) -> EngineConfig {
    EngineConfig {
        max_num_seqs: 8,
        max_num_batched_tokens: budget,
        block_size,
        num_blocks: 64,
        max_model_len: Some(1024),
        ..EngineConfig::default()
    }
}

#[test]
fn bf16_with_q_lora_matches_hf() {
    check_against_hf("bf16-qlora", chunked(64, 128));
}

#[test]
fn sharded_f32_without_q_lora_matches_hf() {
    check_against_hf("f32-noqlora", chunked(64, 128));
}

#[test]
fn fp8_partial_blocks_match_hf() {
    check_against_hf("fp8-blocks", chunked(64, 128));
}

#[test]
fn awq_group_128_with_attention_quantized_matches_hf() {
    check_against_hf("awq-g128", chunked(64, 128));
}

#[test]
fn awq_group_64_with_attention_unquantized_matches_hf() {
    check_against_hf("awq-g64-attn16", chunked(64, 128));
}

#[test]
fn chunk_budget_and_block_size_do_not_change_the_result() {
    let reference = run("bf16-qlora", chunked(64, 4096));
    for cfg in [chunked(16, 32), chunked(64, 7), EngineConfig { max_num_seqs: 1, ..chunked(32, 100) }] {
        assert_same_outputs(
            &reference,
            &run("bf16-qlora", EngineConfig { num_blocks: 256, ..cfg }),
            &format!("{cfg:?}"),
        );
    }
}

/// Equal token ids and logprobs within 1e-4 for every prompt.
fn assert_same_outputs(reference: &[Vec<TokenOutput>], got: &[Vec<TokenOutput>], label: &str) {
    for (a, b) in reference.iter().zip(got) {
        let ids = |v: &Vec<TokenOutput>| v.iter().map(|t| t.token).collect::<Vec<_>>();
        assert_eq!(ids(a), ids(b), "{label}");
        for (x, y) in a.iter().zip(b) {
            assert!((x.logprob - y.logprob).abs() < 1e-4, "{label}: {} vs {}", x.logprob, y.logprob);
        }
    }
}

#[test]
fn first_step_logits_match_hf() {
    let case = "bf16-qlora";
    let exp = expected(case);
    let be = CpuBackend;
    let model = Model::load(&be, &case_dir(case), LoadOptions { max_len: Some(256), ..Default::default() }).unwrap();
    let cfg = model.config().clone();
    let prompt = &exp.prompts[0].0;
    let n = prompt.len();
    let layout = KvLayout { layers: cfg.num_hidden_layers, num_blocks: 4, block_size: 64, width: cfg.latent_dim() };
    let mut cache = be.alloc_kv_cache(layout).unwrap();
    let input = StepInput {
        ids: prompt.clone(),
        positions: (0..n as u32).collect(),
        slots: (0..n as u32).map(|p| 64 + p).collect(), // block 1: not the first block
        attn: AttnBatch { seqs: vec![AttnSeq { q_start: 0, q_len: n, ctx_len: n, block_table: vec![1] }] },
        sample_rows: vec![n as u32 - 1],
        dp_rows: Vec::new(),
    };
    let logits = be.download(&model.forward(&be, &mut cache, None, &input).unwrap().unwrap()).unwrap();
    let max_diff = logits.iter().zip(&exp.first_logits).map(|(a, b)| (*a as f64 - b).abs()).fold(0.0, f64::max);
    assert!(max_diff < 1e-3, "max |logit - HF| = {max_diff}");
}

#[test]
fn preemption_under_block_pressure_recomputes_to_the_same_result() {
    let reference = run("bf16-qlora", chunked(64, 4096));
    // 16 blocks of 16 tokens hold 256 tokens; the four prompts and their outputs need about 300,
    // so running sequences are preempted and later recomputed from their tokens.
    let cfg = EngineConfig {
        max_num_seqs: 8,
        max_num_batched_tokens: 64,
        block_size: 16,
        num_blocks: 16,
        max_model_len: Some(256),
        ..EngineConfig::default()
    };
    let (got, preemptions) = run_counting_preemptions("bf16-qlora", cfg);
    assert!(preemptions > 0, "the cache was large enough: nothing was preempted");
    assert_same_outputs(&reference, &got, "with preemption");
}
