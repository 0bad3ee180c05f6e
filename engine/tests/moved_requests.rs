//! A request that moves between ranks — prefilled on one and admitted on another after a KV
//! transfer, or resumed on another after some of its tokens were sent — produces exactly the
//! tokens and text of an uninterrupted run, including text the first rank held back (half a
//! UTF-8 character, the start of a possible stop string).

use std::path::PathBuf;

use cleave_engine::backend::cpu::CpuBackend;
use cleave_engine::kv_port::MemHub;
use cleave_engine::{Engine, EngineConfig, Request, SamplingParams, TokenOutput};

fn engine() -> Engine<CpuBackend> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/golden/bf16-qlora");
    let cfg = EngineConfig {
        max_num_seqs: 8,
        max_num_batched_tokens: 512,
        block_size: 64,
        num_blocks: 64,
        max_model_len: None,
        ..EngineConfig::default()
    };
    Engine::load(CpuBackend, &dir, cfg).expect("golden checkpoint")
}

fn prompt(len: usize, seed: usize) -> Vec<u32> {
    (0..len).map(|i| (((i * 31 + seed * 17) ^ (i >> 3)) % 380 + 12) as u32).collect()
}

fn req(prompt: &[u32], params: &SamplingParams, prefill_only: bool) -> Request {
    Request { id: 7, prompt: prompt.to_vec(), params: params.clone(), prefill_only }
}

fn run(e: &mut Engine<CpuBackend>, out: &mut Vec<TokenOutput>) {
    while e.has_work() {
        out.extend(e.step().unwrap());
    }
    assert_eq!(e.stats().used_blocks, 0);
}

fn text(out: &[TokenOutput]) -> (Vec<u32>, String) {
    (out.iter().map(|t| t.token).collect(), out.iter().map(|t| t.text.as_str()).collect())
}

/// Prefill on one engine, move the KV over in-process ports, decode on another.
fn transferred(p: &[u32], params: &SamplingParams) -> Vec<TokenOutput> {
    let (mut a, mut b) = (engine(), engine());
    let hub = MemHub::new();
    a.link_in_process(&hub, 0).unwrap();
    b.link_in_process(&hub, 1).unwrap();
    a.add_request(req(p, params, true)).unwrap();
    let mut out = Vec::new();
    while out.is_empty() {
        out = a.step().unwrap();
    }
    assert!(out[0].prefilled || out[0].finish.is_some());
    if out[0].finish.is_none() {
        a.move_prefilled(&mut b, req(p, params, false), out[0].token).unwrap();
        run(&mut b, &mut out);
    }
    out
}

/// Run `k` tokens on one engine, then resume on another.
fn resumed(p: &[u32], params: &SamplingParams, k: usize) -> Vec<TokenOutput> {
    let (mut a, mut b) = (engine(), engine());
    a.add_request(req(p, params, false)).unwrap();
    let mut out: Vec<TokenOutput> = Vec::new();
    while out.len() < k && out.last().is_none_or(|t| t.finish.is_none()) {
        out.extend(a.step().unwrap());
    }
    if out.last().is_some_and(|t| t.finish.is_some()) {
        return out;
    }
    a.abort(7);
    let sent: Vec<u32> = out.iter().map(|t| t.token).collect();
    b.add_resumed(req(p, params, false), &sent).unwrap();
    run(&mut b, &mut out);
    out
}

#[test]
fn moved_requests_continue_with_identical_tokens_and_text() {
    let mut held_back = 0;
    let mut stop_cases = 0;
    for (len, seed) in [(611, 5), (7, 1), (40, 2), (300, 3), (64, 4), (256, 6), (90, 11), (150, 12)] {
        let p = prompt(len, seed);
        let plain = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(20) };
        let mut e = engine();
        let mut direct = Vec::new();
        e.add_request(req(&p, &plain, false)).unwrap();
        run(&mut e, &mut direct);
        held_back += usize::from(direct[0].text.is_empty());
        assert_eq!(text(&transferred(&p, &plain)), text(&direct), "prompt {len}/{seed} after a transfer");
        for k in [1, 2, 5] {
            assert_eq!(text(&resumed(&p, &plain, k)), text(&direct), "prompt {len}/{seed} resumed after {k}");
        }
        // A stop string that straddles the first two tokens' text: held back on the first rank.
        let (t0, t1) = (&direct[0].text, &direct[1].text);
        if let (Some(a), Some(b)) = (t0.chars().last(), t1.chars().next()) {
            stop_cases += 1;
            let stop = SamplingParams { stop: vec![format!("{a}{b}")], ..plain.clone() };
            let mut e = engine();
            let mut want = Vec::new();
            e.add_request(req(&p, &stop, false)).unwrap();
            run(&mut e, &mut want);
            assert_eq!(text(&transferred(&p, &stop)), text(&want), "prompt {len}/{seed} with stop {:?}", stop.stop);
            assert_eq!(text(&resumed(&p, &stop, 1)), text(&want), "prompt {len}/{seed} with stop, resumed");
        }
    }
    assert!(held_back > 0, "no prompt had a first token whose text was held back");
    assert!(stop_cases > 0, "no stop-string case");
}

#[test]
fn seeded_sampling_continues_its_random_stream_after_a_move() {
    let p = prompt(120, 8);
    let params =
        SamplingParams { temperature: 1.3, top_k: 50, seed: Some(42), ignore_eos: true, ..SamplingParams::greedy(16) };
    let mut e = engine();
    let mut direct = Vec::new();
    e.add_request(req(&p, &params, false)).unwrap();
    run(&mut e, &mut direct);
    assert_eq!(text(&transferred(&p, &params)), text(&direct));
    assert_eq!(text(&resumed(&p, &params, 4)), text(&direct));
}

#[test]
fn penalties_count_the_same_output_after_a_move() {
    // The tokens a resumed request already emitted are prefilled with its prompt on the new
    // rank, yet the presence and frequency penalties still count them as output.
    let params = SamplingParams {
        presence_penalty: 1.5,
        frequency_penalty: 1.0,
        logit_bias: vec![(40, 2.0)],
        ignore_eos: true,
        ..SamplingParams::greedy(20)
    };
    let mut differ = 0;
    for (len, seed) in [(90, 11), (150, 12), (7, 1)] {
        let p = prompt(len, seed);
        let mut e = engine();
        let (mut direct, mut plain) = (Vec::new(), Vec::new());
        e.add_request(req(&p, &params, false)).unwrap();
        run(&mut e, &mut direct);
        let unpenalized = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(20) };
        e.add_request(req(&p, &unpenalized, false)).unwrap();
        run(&mut e, &mut plain);
        differ += usize::from(text(&plain) != text(&direct));
        assert_eq!(text(&transferred(&p, &params)), text(&direct), "prompt {len}/{seed} after a transfer");
        for k in [1, 5] {
            assert_eq!(text(&resumed(&p, &params, k)), text(&direct), "prompt {len}/{seed} resumed after {k}");
        }
    }
    assert!(differ > 0, "the penalties changed no output");
}

#[test]
fn resuming_with_nothing_left_to_generate_is_refused() {
    let mut e = engine();
    let p = prompt(10, 1);
    let params = SamplingParams::greedy(2);
    assert!(e.add_resumed(req(&p, &params, false), &[5, 6]).is_err());
    assert!(e.add_resumed(req(&p, &params, false), &[5]).is_ok());
}
