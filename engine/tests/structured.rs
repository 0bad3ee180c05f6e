//! Structured outputs on the embedded default (tiny-r1, CPU): a JSON schema, any JSON object, a
//! regex and a choice constrain what the model writes, after its free reasoning when the
//! constraint starts at `</think>`; sampled answers at temperature 0.7 still fit; an invalid
//! constraint is refused when the request is added.

use std::path::PathBuf;

use cleave_engine::backend::cpu::CpuBackend;
use cleave_engine::structured::{Constraint, Guided};
use cleave_engine::tokenizer::{ChatMessage, ChatOptions};
use cleave_engine::{Engine, EngineConfig, EngineError, FinishReason, Request, SamplingParams};
use serde_json::{json, Value};

fn engine() -> Engine<CpuBackend> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/tiny-r1");
    let cfg = EngineConfig { max_num_seqs: 8, num_blocks: 256, ..EngineConfig::default() };
    Engine::load(CpuBackend, &dir, cfg).expect("models/tiny-r1 loads")
}

fn chat(e: &Engine<CpuBackend>, user: &str) -> Vec<u32> {
    let m = ChatMessage::new("user", user);
    e.tokenizer().unwrap().encode_chat(&[m], ChatOptions::generation()).unwrap()
}

/// Runs each (prompt, params) and returns the text after `</think>` (all of it when the
/// output has none) and the finish reason.
fn run(e: &mut Engine<CpuBackend>, jobs: Vec<(Vec<u32>, SamplingParams)>) -> Vec<(String, Option<FinishReason>)> {
    let think_end = e.tokenizer().unwrap().think_end_id();
    let n = jobs.len();
    let reqs = jobs.into_iter().enumerate().map(|(i, (prompt, params))| Request {
        id: i as u64,
        prompt,
        params,
        prefill_only: false,
    });
    let mut out = e.generate(reqs.collect()).unwrap();
    assert_eq!(e.stats().used_blocks, 0);
    (0..n as u64)
        .map(|i| {
            let toks = out.remove(&i).unwrap();
            let start = toks.iter().position(|t| Some(t.token) == think_end).map_or(0, |k| k + 1);
            (toks[start..].iter().map(|t| t.text.as_str()).collect(), toks.last().and_then(|t| t.finish))
        })
        .collect()
}

fn guided(c: Constraint, after: Option<u32>, temperature: f32, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature,
        seed: Some(seed),
        max_tokens: 400,
        guided: Some(Guided { constraint: c, after_token: after }),
        ..SamplingParams::default()
    }
}

#[test]
fn answers_after_the_reasoning_fit_a_json_schema_even_when_sampled() {
    let mut e = engine();
    let after = e.tokenizer().unwrap().think_end_id();
    let schema = json!({
        "type": "object",
        "properties": {"answer": {"type": "integer"}, "unit": {"enum": ["apples", "pears"]}},
        "required": ["answer", "unit"],
        "additionalProperties": false
    });
    let jobs = (0..4)
        .map(|s| {
            (
                chat(&e, &format!("What is {} + 7?", 12 + s)),
                guided(Constraint::JsonSchema(schema.clone()), after, 0.7, s),
            )
        })
        .collect();
    for (text, finish) in run(&mut e, jobs) {
        let v: Value = serde_json::from_str(text.trim()).unwrap_or_else(|err| panic!("not JSON ({err}): {text:?}"));
        assert!(v["answer"].is_i64(), "{v}");
        assert!(v["unit"] == "apples" || v["unit"] == "pears", "{v}");
        assert_eq!(v.as_object().unwrap().len(), 2, "{v}");
        assert_eq!(finish, Some(FinishReason::Stop));
    }
}

#[test]
fn json_objects_regexes_and_choices_constrain_the_whole_output() {
    let mut e = engine();
    let p = chat(&e, "What is 3 + 4?");
    let after = e.tokenizer().unwrap().think_end_id();
    let jobs = vec![
        (p.clone(), SamplingParams { max_tokens: 200, ..guided(Constraint::JsonObject, after, 0.0, 0) }),
        (p.clone(), guided(Constraint::Regex("[0-9]{1,3} (apples|pears)".into()), None, 0.7, 1)),
        (p.clone(), guided(Constraint::Choice(vec!["yes".into(), "no".into(), "maybe so".into()]), None, 0.7, 2)),
    ];
    let out = run(&mut e, jobs);
    // tiny-r1 never learnt JSON: its object may run to max_tokens, but never breaks the syntax.
    match serde_json::from_str::<Value>(out[0].0.trim()) {
        Ok(obj) => assert!(obj.is_object() && out[0].1 == Some(FinishReason::Stop), "{obj}"),
        Err(err) => assert!(err.is_eof() && out[0].1 == Some(FinishReason::Length), "{err}: {:?}", out[0].0),
    }
    let (count, fruit) = out[1].0.split_once(' ').unwrap_or_else(|| panic!("{:?}", out[1].0));
    assert!(count.len() <= 3 && count.chars().all(|c| c.is_ascii_digit()) && ["apples", "pears"].contains(&fruit));
    assert!(["yes", "no", "maybe so"].contains(&out[2].0.as_str()), "{:?}", out[2].0);
    assert!(out[1..].iter().all(|o| o.1 == Some(FinishReason::Stop)), "{out:?}");
}

#[test]
fn an_invalid_constraint_is_refused_with_the_reason() {
    let mut e = engine();
    let p = chat(&e, "Hi");
    for c in [
        Constraint::JsonSchema(json!({"type": "frobnicate"})),
        Constraint::Regex("(unclosed".into()),
        Constraint::Grammar("start: undefined_rule".into()),
        Constraint::Choice(vec![]),
    ] {
        let r = Request { id: 1, prompt: p.clone(), params: guided(c.clone(), None, 0.0, 0), prefill_only: false };
        match e.add_request(r) {
            Err(EngineError::InvalidRequest(m)) => assert!(!m.is_empty()),
            other => panic!("{c:?}: {other:?}"),
        }
    }
    assert_eq!(e.num_requests(), 0);
}

/// A constrained row sampled by the backend (its mask applied in the backend's sampler) picks
/// the same tokens as when it is sampled on the host (asking for top logprobs sends it there):
/// the same mask, the same draws, the same raw logprobs.
#[test]
fn the_backend_sampler_and_the_host_sampler_apply_masks_alike() {
    let mut e = engine();
    let after = e.tokenizer().unwrap().think_end_id();
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}, "w": {"enum": ["yes", "no"]}}, "required": ["n", "w"]});
    let prompt = chat(&e, "What is 41 + 7?");
    let mut jobs = Vec::new();
    for seed in 0..3 {
        let p = guided(Constraint::JsonSchema(schema.clone()), after, 0.9, seed);
        jobs.push((prompt.clone(), p.clone()));
        jobs.push((prompt.clone(), SamplingParams { top_logprobs: 1, ..p }));
    }
    let reqs = jobs.into_iter().enumerate().map(|(i, (prompt, params))| Request {
        id: i as u64,
        prompt,
        params,
        prefill_only: false,
    });
    let out = e.generate(reqs.collect()).unwrap();
    for seed in 0..3u64 {
        let (device, host) = (&out[&(2 * seed)], &out[&(2 * seed + 1)]);
        let ids = |t: &[cleave_engine::TokenOutput]| t.iter().map(|t| t.token).collect::<Vec<_>>();
        assert_eq!(ids(device), ids(host), "seed {seed}");
        for (d, h) in device.iter().zip(host) {
            assert!((d.logprob - h.logprob).abs() < 1e-5, "seed {seed}: {} vs {}", d.logprob, h.logprob);
        }
        let text: String = device.iter().map(|t| t.text.as_str()).collect();
        let answer: Value = serde_json::from_str(text.rsplit("</think>").next().unwrap()).unwrap();
        assert!(answer["n"].is_i64() && answer["w"].is_string(), "{answer}");
    }
}
