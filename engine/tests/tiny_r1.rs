//! The embedded default model: cleave's greedy answers to the 20 fixed problems of
//! `models/tiny-r1/expected_answers.json` equal HF transformers' recorded outputs, token for token,
//! and the prompts cleave renders through the chat template equal HF's.

use std::path::PathBuf;

use cleave_engine::backend::cpu::CpuBackend;
use cleave_engine::tokenizer::{ChatMessage, ChatOptions, ToolCall};
use cleave_engine::{Engine, EngineConfig, FinishReason, Request, SamplingParams};
use serde_json::Value;

fn model_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models").join(name)
}

/// The 20 fixed problems with HF's recorded prompt ids, output ids and text.
fn fixed_problems() -> Vec<Value> {
    let path = model_dir("tiny-r1").join("expected_answers.json");
    let expected: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(expected.len(), 20);
    expected
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// Greedy outputs (ids, text) of `model` for the fixed problems, each ended by EOS; the
/// chat-rendered prompts are checked against HF's on the way.
fn answer_fixed_problems(model: &str) -> Vec<(Vec<u32>, String)> {
    let expected = fixed_problems();
    let cfg = EngineConfig {
        max_num_seqs: 20,
        max_num_batched_tokens: 2048,
        block_size: 64,
        num_blocks: 20 * 32,
        max_model_len: None,
        ..EngineConfig::default()
    };
    let mut engine = Engine::load(CpuBackend, &model_dir(model), cfg).expect("the model loads");
    let tok = engine.tokenizer().expect("the model has a tokenizer").clone();
    let mut requests = Vec::new();
    for (i, e) in expected.iter().enumerate() {
        let user = e["user"].as_str().unwrap();
        let prompt = tok.encode_chat(&[ChatMessage::new("user", user)], ChatOptions::generation()).unwrap();
        assert_eq!(prompt, ids(&e["prompt_ids"]), "chat-rendered prompt of {user:?}");
        requests.push(Request { id: i as u64, prompt, params: SamplingParams::greedy(400), prefill_only: false });
    }
    let mut out = engine.generate(requests).unwrap();
    assert_eq!(engine.stats().used_blocks, 0);
    (0..expected.len())
        .map(|i| {
            let got = out.remove(&(i as u64)).unwrap();
            assert_eq!(got.last().unwrap().finish, Some(FinishReason::Stop), "ends with EOS");
            (got.iter().map(|t| t.token).collect(), got.iter().map(|t| t.text.as_str()).collect())
        })
        .collect()
}

fn hf_text(e: &Value) -> &str {
    e["text"].as_str().unwrap().trim_end_matches("<｜end▁of▁sentence｜>")
}

#[test]
fn greedy_answers_equal_hf_on_the_fixed_problems() {
    for (e, (got_ids, text)) in fixed_problems().iter().zip(answer_fixed_problems("tiny-r1")) {
        assert_eq!(got_ids, ids(&e["output_ids"]), "{:?}: cleave wrote {text:?}", e["user"]);
        assert_eq!(text, hf_text(e), "text of {:?}", e["user"]);
    }
}

/// models/tiny-r1-awq (AutoAWQ int4, group 32) keeps every answer of the bf16 model.
#[test]
fn the_awq_quantized_default_answers_the_fixed_problems_right() {
    let answer = |t: &str| t.rsplit("</think>").next().unwrap_or("").trim().to_string();
    for (e, (_, text)) in fixed_problems().iter().zip(answer_fixed_problems("tiny-r1-awq")) {
        assert_eq!(answer(&text), answer(hf_text(e)), "{:?}: tiny-r1-awq wrote {text:?}", e["user"]);
    }
}

/// Text held back because it might start a stop string comes out when the sequence ends on EOS or
/// a stop token instead.
#[test]
fn held_back_text_is_released_when_eos_or_a_stop_token_ends_the_sequence() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/tiny-r1");
    let cfg = EngineConfig {
        max_num_seqs: 4,
        max_num_batched_tokens: 512,
        block_size: 64,
        num_blocks: 64,
        max_model_len: None,
        ..EngineConfig::default()
    };
    let mut engine = Engine::load(CpuBackend, &dir, cfg).unwrap();
    let tok = engine.tokenizer().unwrap().clone();
    let msg = ChatMessage::new("user", "What is 347 + 589?");
    let prompt = tok.encode_chat(&[msg], ChatOptions::generation()).unwrap();
    let mut run = |params: SamplingParams| {
        let out =
            engine.generate(vec![Request { id: 1, prompt: prompt.clone(), params, prefill_only: false }]).unwrap();
        let toks = &out[&1];
        (toks.iter().map(|t| t.text.as_str()).collect::<String>(), toks.last().unwrap().finish)
    };
    let (full, _) = run(SamplingParams::greedy(400));
    assert!(full.ends_with("347 + 589 = 936"), "{full:?}");
    // "6" could start "6 and more" until EOS arrives.
    let (text, finish) = run(SamplingParams { stop: vec!["6 and more".into()], ..SamplingParams::greedy(400) });
    assert_eq!((text.as_str(), finish), (full.as_str(), Some(FinishReason::Stop)));
    // The reasoning ends "... = 936\n" right before `</think>`, a stop token here.
    let think_end = tok.think_end_id().unwrap();
    let (text, _) = run(SamplingParams {
        stop: vec!["936\nX".into()],
        stop_token_ids: vec![think_end],
        ..SamplingParams::greedy(400)
    });
    assert_eq!(text, full.split("</think>").next().unwrap());
    // A stop string that does occur still cuts the text before it.
    let (text, finish) = run(SamplingParams { stop: vec![" = 936\n".into()], ..SamplingParams::greedy(400) });
    assert!(
        full.starts_with(&text) && text.ends_with("so 347 + 589") && finish == Some(FinishReason::Stop),
        "{text:?}"
    );
}

/// A seeded request picks the same tokens whether its row is sampled by the backend
/// (`Backend::sample`) or on the host (here forced by asking for top logprobs): both draw the
/// same uniform from the request's generator and cut the distribution the same way.
#[test]
fn backend_and_host_sampling_agree_for_a_seed() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/tiny-r1");
    let cfg = EngineConfig {
        max_num_seqs: 4,
        max_num_batched_tokens: 512,
        block_size: 64,
        num_blocks: 64,
        max_model_len: None,
        ..EngineConfig::default()
    };
    let mut engine = Engine::load(CpuBackend, &dir, cfg).expect("models/tiny-r1 loads");
    let prompt = engine.tokenizer().unwrap().encode("What is 12 + 7?", false).unwrap();
    let params = |top_logprobs| SamplingParams {
        temperature: 1.4,
        top_p: 0.95,
        top_k: 40,
        min_p: 0.01,
        seed: Some(11),
        max_tokens: 48,
        ignore_eos: true,
        top_logprobs,
        ..Default::default()
    };
    let run = |engine: &mut Engine<CpuBackend>, top_logprobs| {
        let r = Request { id: 1, prompt: prompt.clone(), params: params(top_logprobs), prefill_only: false };
        let out = engine.generate(vec![r]).unwrap().remove(&1).unwrap();
        out.iter().map(|t| (t.token, t.logprob)).collect::<Vec<_>>()
    };
    let device = run(&mut engine, 0);
    let host = run(&mut engine, 2);
    assert_eq!(device.len(), 48);
    assert_eq!(device.iter().map(|t| t.0).collect::<Vec<_>>(), host.iter().map(|t| t.0).collect::<Vec<_>>());
    for (d, h) in device.iter().zip(&host) {
        assert!((d.1 - h.1).abs() < 1e-4, "logprob {} vs {}", d.1, h.1);
    }
    // The temperature makes the draws matter: the answer is not the greedy one throughout.
    let greedy = engine
        .generate(vec![Request {
            id: 2,
            prompt: prompt.clone(),
            params: SamplingParams::greedy(48),
            prefill_only: false,
        }])
        .unwrap()
        .remove(&2)
        .unwrap();
    assert_ne!(greedy.iter().map(|t| t.token).collect::<Vec<_>>(), device.iter().map(|t| t.0).collect::<Vec<_>>());
}

/// An OpenAI-shaped message of `tool_cases.json` as the engine takes it.
fn message(m: &Value) -> ChatMessage {
    let calls = m["tool_calls"].as_array().into_iter().flatten();
    ChatMessage {
        tool_calls: calls
            .map(|c| ToolCall {
                id: c["id"].as_str().unwrap().into(),
                name: c["function"]["name"].as_str().unwrap().into(),
                arguments: c["function"]["arguments"].as_str().unwrap().into(),
            })
            .collect(),
        tool_call_id: m["tool_call_id"].as_str().map(str::to_string),
        ..ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap_or(""))
    }
}

/// With tools, cleave renders HF's prompts (tools section, tool calls, tool results) and writes
/// HF's greedy calls and answers to the results (`models/tiny-r1/tool_cases.json`, held-out
/// problems that `eval_hf.py` recorded).
#[test]
fn tool_calls_and_answers_to_tool_results_equal_hf() {
    let path = model_dir("tiny-r1").join("tool_cases.json");
    let cases: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let cfg = EngineConfig { max_num_seqs: 16, block_size: 64, num_blocks: 16 * 16, ..EngineConfig::default() };
    let mut engine = Engine::load(CpuBackend, &model_dir("tiny-r1"), cfg).unwrap();
    let tok = engine.tokenizer().unwrap().clone();
    let mut requests = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let tools = c["tools"].as_array().unwrap();
        let opts = ChatOptions { tools: Some(tools), ..ChatOptions::generation() };
        for (j, (msgs, ids_key)) in
            [("messages", "prompt_ids"), ("result_messages", "result_prompt_ids")].iter().enumerate()
        {
            let msgs: Vec<ChatMessage> = c[msgs].as_array().unwrap().iter().map(message).collect();
            let prompt = tok.encode_chat(&msgs, opts).unwrap();
            assert_eq!(prompt, ids(&c[ids_key]), "case {i}: {ids_key}");
            requests.push(Request {
                id: (2 * i + j) as u64,
                prompt,
                params: SamplingParams::greedy(200),
                prefill_only: false,
            });
        }
    }
    let out = engine.generate(requests).unwrap();
    for (i, c) in cases.iter().enumerate() {
        let call: Vec<u32> = out[&(2 * i as u64)].iter().map(|t| t.token).collect();
        assert_eq!(call, ids(&c["output_ids"]), "case {i}: {}", c["text"]);
        let answer = &out[&(2 * i as u64 + 1)];
        let text: String = answer.iter().map(|t| t.text.as_str()).collect();
        assert_eq!(text, c["result_text"].as_str().unwrap().trim_end_matches("<｜end▁of▁sentence｜>"), "case {i}");
        assert!(!text.is_empty());
    }
}
