//! Parallel groups against one rank: every layout (TP, TP+EP, DP+EP, TP x DP) on CPU ranks that
//! are threads with in-process collectives gives the same greedy ids as one rank with logprobs
//! within 1e-4, and HF's recorded answers within 2e-3.

use std::path::PathBuf;

use cleave_engine::backend::cpu::CpuBackend;
use cleave_engine::kv_port::MemHub;
use cleave_engine::{Engine, EngineConfig, ParallelConfig, Request, SamplingParams};
use serde_json::Value;

fn models() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models")
}

fn cfg() -> EngineConfig {
    EngineConfig {
        max_num_seqs: 8,
        max_num_batched_tokens: 96,
        block_size: 16,
        num_blocks: 128,
        max_model_len: Some(512),
        ..EngineConfig::default()
    }
}

fn layout(tp: usize, dp: usize, ep: bool) -> ParallelConfig {
    ParallelConfig { tensor_parallel_size: tp, data_parallel_size: dp, enable_expert_parallel: ep }
}

/// Prompts with the ids and logprobs HF produced for them.
struct Expected {
    prompts: Vec<Vec<u32>>,
    ids: Vec<Vec<u32>>,
    logprobs: Vec<Option<Vec<f64>>>,
}

fn golden(case: &str) -> Expected {
    let text = std::fs::read_to_string(models().join("golden").join(case).join("expected.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let ids = |x: &Value| x.as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect::<Vec<_>>();
    let floats = |x: &Value| x.as_array().unwrap().iter().map(|t| t.as_f64().unwrap()).collect::<Vec<_>>();
    let p = v["prompts"].as_array().unwrap();
    Expected {
        prompts: p.iter().map(|p| ids(&p["prompt_ids"])).collect(),
        ids: p.iter().map(|p| ids(&p["token_ids"])).collect(),
        logprobs: p.iter().map(|p| Some(floats(&p["logprobs"]))).collect(),
    }
}

/// The first problems of tiny-r1's recorded HF answers, cut to `n` tokens.
fn tiny_r1(problems: usize, n: usize) -> Expected {
    let text = std::fs::read_to_string(models().join("tiny-r1/expected_answers.json")).unwrap();
    let v: Vec<Value> = serde_json::from_str(&text).unwrap();
    let ids = |x: &Value| x.as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect::<Vec<_>>();
    let mut e = Expected { prompts: Vec::new(), ids: Vec::new(), logprobs: Vec::new() };
    for p in v.iter().take(problems) {
        e.prompts.push(ids(&p["prompt_ids"]));
        e.ids.push(ids(&p["output_ids"]).into_iter().take(n).collect());
        e.logprobs.push(None);
    }
    e
}

type Outputs = Vec<Vec<(u32, f32)>>;

fn generate(mut engine: Engine<CpuBackend>, exp: &Expected) -> Outputs {
    let lens: Vec<usize> = exp.ids.iter().map(Vec::len).collect();
    let out = engine.generate_greedy(&exp.prompts, &lens).expect("generate");
    assert_eq!(engine.stats().used_blocks, 0, "blocks leaked");
    out.iter().map(|o| o.iter().map(|t| (t.token, t.logprob)).collect()).collect()
}

fn check(model: &str, exp: &Expected, layouts: &[ParallelConfig]) {
    let dir = models().join(model);
    let one = generate(Engine::load(CpuBackend, &dir, cfg()).expect("one rank loads"), exp);
    for (i, out) in one.iter().enumerate() {
        let ids: Vec<u32> = out.iter().map(|t| t.0).collect();
        assert_eq!(ids, exp.ids[i], "{model}: one rank against HF, prompt {i}");
        if let Some(lp) = &exp.logprobs[i] {
            for (t, want) in out.iter().zip(lp) {
                assert!((t.1 as f64 - want).abs() < 2e-3, "{model}: logprob {} against HF {want}", t.1);
            }
        }
    }
    for &par in layouts {
        let engine = Engine::load_parallel(par, &dir, cfg(), |_| Ok(CpuBackend))
            .unwrap_or_else(|e| panic!("{model} {par:?} loads: {e}"));
        assert_eq!(engine.parallel(), par);
        let got = generate(engine, exp);
        for (i, (a, b)) in one.iter().zip(&got).enumerate() {
            let ids = |v: &Vec<(u32, f32)>| v.iter().map(|t| t.0).collect::<Vec<_>>();
            assert_eq!(ids(a), ids(b), "{model} {par:?} prompt {i}: ids against one rank");
            for (x, y) in a.iter().zip(b) {
                assert!((x.1 - y.1).abs() < 1e-4, "{model} {par:?} prompt {i}: logprob {} vs one rank {}", y.1, x.1);
            }
        }
    }
}

#[test]
fn bf16_golden_in_every_layout() {
    let layouts = [
        layout(2, 1, false),
        layout(4, 1, false),
        layout(2, 1, true),
        layout(1, 2, true),
        layout(1, 4, true),
        layout(2, 2, true),
        layout(1, 2, false),
    ];
    check("golden/bf16-qlora", &golden("bf16-qlora"), &layouts);
}

#[test]
fn f32_golden_without_q_lora_in_tp_and_dp_layouts() {
    check(
        "golden/f32-noqlora",
        &golden("f32-noqlora"),
        &[layout(2, 1, false), layout(4, 1, false), layout(1, 2, true)],
    );
}

#[test]
fn awq_golden_keeps_its_int4_slices_in_dp_ep() {
    check("golden/awq-g64-attn16", &golden("awq-g64-attn16"), &[layout(1, 2, true)]);
}

#[test]
fn tiny_r1_in_tp_ep_and_dp_ep() {
    check(
        "tiny-r1",
        &tiny_r1(6, 40),
        &[layout(2, 1, false), layout(4, 1, true), layout(1, 2, true), layout(2, 2, true)],
    );
}

#[test]
fn layouts_that_do_not_divide_the_model_are_refused_with_the_reason() {
    let dir = models().join("golden/fp8-blocks");
    let err = |par| Engine::load_parallel(par, &dir, cfg(), |_| Ok(CpuBackend)).err().expect("refused").to_string();
    let e = err(layout(2, 1, false));
    assert!(e.contains("tensor_parallel_size 2") && e.contains("3 attention heads"), "{e}");
    let e = err(layout(1, 3, false));
    assert!(e.contains("moe_intermediate_size 40"), "{e}");
    let e = err(layout(1, 2, true));
    assert!(e.contains("FP8 scale blocks"), "{e}");
    let awq = models().join("golden/awq-g128");
    let e = Engine::load_parallel(layout(2, 1, false), &awq, cfg(), |_| Ok(CpuBackend)).err().unwrap().to_string();
    assert!(e.contains("AWQ group size 128"), "{e}");
    let e = err(layout(0, 1, false));
    assert!(e.contains("tensor_parallel_size must be at least 1"), "{e}");
}

/// Prefills every prompt on `prefill`, moves each request's KV to `decode` over the groups'
/// in-process ports (sampling rank of the holding DP rank -> every TP rank of the receiving DP
/// rank), decodes it there.
fn handed_off(mut prefill: Engine<CpuBackend>, mut decode: Engine<CpuBackend>, exp: &Expected) -> Outputs {
    let hub = MemHub::new();
    prefill.link_in_process(&hub, 0).unwrap();
    decode.link_in_process(&hub, 10).unwrap();
    let mut out: Outputs = vec![Vec::new(); exp.prompts.len()];
    let req = |i: usize, prefill_only| Request {
        id: i as u64,
        prompt: exp.prompts[i].clone(),
        params: SamplingParams { ignore_eos: true, ..SamplingParams::greedy(exp.ids[i].len()) },
        prefill_only,
    };
    for i in 0..exp.prompts.len() {
        prefill.add_request(req(i, true)).unwrap();
    }
    while prefill.has_work() {
        for o in prefill.step().unwrap() {
            let i = o.id as usize;
            out[i].push((o.token, o.logprob));
            prefill.move_prefilled(&mut decode, req(i, false), o.token).unwrap();
        }
    }
    while decode.has_work() {
        for o in decode.step().unwrap() {
            out[o.id as usize].push((o.token, o.logprob));
        }
    }
    assert_eq!((prefill.stats().used_blocks, decode.stats().used_blocks), (0, 0), "blocks leaked");
    assert_eq!(hub.pending(), 0, "a parcel was left behind");
    out
}

#[test]
fn kv_moves_between_groups_of_any_shape_decode_as_one_rank_does() {
    let dir = models().join("golden/bf16-qlora");
    let exp = golden("bf16-qlora");
    let one = generate(Engine::load(CpuBackend, &dir, cfg()).unwrap(), &exp);
    let load = |par| Engine::load_parallel(par, &dir, cfg(), |_| Ok(CpuBackend)).unwrap();
    // DP senders (either DP rank holds a request) into a TP receiver (both ranks need the KV),
    // and a TP sender into DP + EP receivers.
    for (p, d) in [(layout(1, 2, true), layout(2, 1, false)), (layout(2, 1, false), layout(1, 2, true))] {
        let got = handed_off(load(p), load(d), &exp);
        for (i, (a, b)) in one.iter().zip(&got).enumerate() {
            let ids = |v: &Vec<(u32, f32)>| v.iter().map(|t| t.0).collect::<Vec<_>>();
            assert_eq!(b.len(), exp.ids[i].len(), "{p:?} -> {d:?} prompt {i}: every token");
            assert_eq!(ids(a), ids(b), "{p:?} -> {d:?} prompt {i}: ids against one rank");
            for (x, y) in a.iter().zip(b) {
                assert!((x.1 - y.1).abs() < 1e-4, "{p:?} -> {d:?} prompt {i}: logprob {} vs {}", y.1, x.1);
            }
        }
    }
}
