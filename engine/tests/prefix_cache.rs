//! Automatic prefix caching: a request whose prompt starts with a cached prefix computes only the
//! rest, and its output equals the output without caching (greedy ids, logprobs within 1e-4):
//! one after another, under eviction and preemption pressure, across a transfer that moves only
//! the blocks the receiver lacks, and with DP ranks placed by their caches. No block leaks.

use std::collections::HashMap;
use std::path::PathBuf;

use cleave_engine::backend::cpu::CpuBackend;
use cleave_engine::kv_port::MemHub;
use cleave_engine::{Engine, EngineConfig, ParallelConfig, Request, SamplingParams, TokenOutput};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/golden/bf16-qlora")
}

fn cfg(caching: bool, num_blocks: usize) -> EngineConfig {
    EngineConfig {
        max_num_seqs: 8,
        max_num_batched_tokens: 96,
        block_size: 16,
        num_blocks,
        max_model_len: Some(512),
        enable_prefix_caching: caching,
        ..EngineConfig::default()
    }
}

fn engine(caching: bool, num_blocks: usize) -> Engine<CpuBackend> {
    Engine::load(CpuBackend, &dir(), cfg(caching, num_blocks)).expect("golden checkpoint")
}

fn tokens(len: usize, seed: usize) -> Vec<u32> {
    (0..len).map(|i| (((i * 31 + seed * 17) ^ (i >> 3)) % 380 + 12) as u32).collect()
}

fn prompt(prefix: usize, tail: usize) -> Vec<u32> {
    let mut p = tokens(200, 1000 + prefix);
    p.extend(tokens(20 + tail % 7, tail));
    p
}

fn req(id: u64, prompt: Vec<u32>, n: usize, prefill_only: bool) -> Request {
    Request { id, prompt, params: SamplingParams { ignore_eos: true, ..SamplingParams::greedy(n) }, prefill_only }
}

fn run_all(e: &mut Engine<CpuBackend>, out: &mut HashMap<u64, Vec<TokenOutput>>) {
    while e.has_work() {
        for t in e.step().unwrap() {
            out.entry(t.id).or_default().push(t);
        }
    }
}

fn assert_same(a: &[TokenOutput], b: &[TokenOutput], what: &str) {
    let ids = |o: &[TokenOutput]| o.iter().map(|t| t.token).collect::<Vec<_>>();
    assert_eq!(ids(a), ids(b), "{what}: token ids differ");
    for (x, y) in a.iter().zip(b) {
        assert!((x.logprob - y.logprob).abs() < 1e-4, "{what}: logprob {} vs {}", x.logprob, y.logprob);
    }
}

#[test]
fn a_second_prompt_with_the_same_prefix_computes_only_its_tail() {
    let mut outs = Vec::new();
    for caching in [true, false] {
        let mut e = engine(caching, 128);
        let mut out = HashMap::new();
        for (id, tail) in [(1, 1), (2, 2)] {
            e.add_request(req(id, prompt(0, tail), 12, false)).unwrap();
            run_all(&mut e, &mut out);
        }
        let s = e.stats();
        assert_eq!(s.used_blocks, 0);
        if caching {
            assert_eq!(out[&1][0].cached_tokens, 0);
            assert_eq!(out[&2][0].cached_tokens, 192, "12 full blocks of the 200-token prefix");
            assert_eq!(s.prefix.hit_tokens, 192);
            assert_eq!(s.prefix.queried_tokens, (prompt(0, 1).len() + prompt(0, 2).len()) as u64);
            assert!(s.prefix.cached_blocks > 12);
        } else {
            assert_eq!(out[&2][0].cached_tokens, 0);
            assert_eq!(s.prefix, Default::default());
        }
        outs.push(out);
    }
    for id in [1, 2] {
        assert_same(&outs[0][&id], &outs[1][&id], &format!("request {id}"));
    }
}

#[test]
fn eviction_and_preemption_keep_every_output_exact() {
    // 40 blocks of 16 tokens: 12 requests of ~260 tokens over 3 shared prefixes cannot all fit.
    let requests: Vec<Request> = (0..12).map(|i| req(i, prompt(i as usize % 3, i as usize), 40, false)).collect();
    let mut outs = Vec::new();
    let mut stats = Vec::new();
    for caching in [true, false] {
        let mut e = engine(caching, 40);
        let mut out = HashMap::new();
        for r in &requests {
            e.add_request(r.clone()).unwrap();
        }
        run_all(&mut e, &mut out);
        stats.push(e.stats());
        outs.push(out);
    }
    let on = stats[0];
    assert!(on.preemptions > 0, "the test must preempt: {on:?}");
    assert!(on.prefix.evicted_blocks > 0, "the test must evict: {on:?}");
    assert!(on.prefix.hit_tokens > 0, "{on:?}");
    assert_eq!((on.used_blocks, stats[1].used_blocks), (0, 0));
    for r in &requests {
        assert_same(&outs[0][&r.id], &outs[1][&r.id], &format!("request {}", r.id));
    }
}

/// Prefills `r` on `p`, moves it to `d`, decodes it there; returns its outputs and the bytes moved.
fn prefill_then_move(p: &mut Engine<CpuBackend>, d: &mut Engine<CpuBackend>, r: Request) -> (Vec<TokenOutput>, usize) {
    let id = r.id;
    p.add_request(Request { prefill_only: true, ..r.clone() }).unwrap();
    let mut out = Vec::new();
    while out.is_empty() {
        out = p.step().unwrap();
    }
    assert!(out[0].prefilled);
    let bytes = p.move_prefilled(d, r, out[0].token).unwrap();
    let mut rest = HashMap::new();
    run_all(d, &mut rest);
    out.extend(rest.remove(&id).unwrap_or_default());
    (out, bytes)
}

#[test]
fn a_transfer_moves_only_the_blocks_the_decode_side_does_not_cache() {
    let (mut p, mut d) = (engine(true, 128), engine(true, 128));
    let hub = MemHub::new();
    p.link_in_process(&hub, 0).unwrap();
    d.link_in_process(&hub, 1).unwrap();
    let (first, bytes1) = prefill_then_move(&mut p, &mut d, req(1, prompt(0, 1), 10, false));
    let (second, bytes2) = prefill_then_move(&mut p, &mut d, req(2, prompt(0, 2), 10, false));
    assert_eq!(second[0].cached_tokens, 192, "the prefill side skipped the cached prefix");
    // 14 blocks each; the second moves only the 2 after the 12 cached ones.
    assert_eq!((bytes1 / 14, bytes2 / 2), (bytes1 / 14, bytes1 / 14), "{bytes1} then {bytes2} bytes");
    assert_eq!(bytes2 * 7, bytes1);
    assert_eq!((p.stats().used_blocks, d.stats().used_blocks), (0, 0));
    let mut plain = engine(false, 128);
    let mut want = HashMap::new();
    for r in [req(1, prompt(0, 1), 10, false), req(2, prompt(0, 2), 10, false)] {
        plain.add_request(r).unwrap();
        run_all(&mut plain, &mut want);
    }
    assert_same(&first, &want[&1], "moved request 1");
    assert_same(&second, &want[&2], "moved request 2");
}

#[test]
fn a_dp_group_places_a_prompt_on_the_rank_caching_its_prefix() {
    let par = ParallelConfig { tensor_parallel_size: 1, data_parallel_size: 2, enable_expert_parallel: true };
    let mut e = Engine::load_parallel(par, &dir(), cfg(true, 128), |_| Ok(CpuBackend)).unwrap();
    let mut out = HashMap::new();
    e.add_request(req(1, prompt(0, 1), 4, false)).unwrap();
    run_all(&mut e, &mut out);
    // A long request keeps one DP rank busier; the prompt with the cached prefix still goes to
    // the rank that caches it.
    e.add_request(req(9, tokens(40, 9), 30, false)).unwrap();
    e.step().unwrap();
    e.add_request(req(2, prompt(0, 2), 4, false)).unwrap();
    run_all(&mut e, &mut out);
    assert_eq!(out[&2][0].cached_tokens, 192);
    assert_eq!(e.stats().used_blocks, 0);
}
