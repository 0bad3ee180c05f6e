//! Unit tests of [`super`]: parameters, defaults and the errors each bad field gets.

use std::path::Path;

use cleave_engine::tokenizer::Tokenizer;
use serde_json::{json, Value};

use super::*;

fn tokenizer() -> Tokenizer {
    Tokenizer::from_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/golden/bf16-qlora")).unwrap()
}

fn info() -> ModelInfo {
    ModelInfo { served_model_name: "m".into(), max_model_len: 100, vocab_size: 400, think_end_id: Some(383) }
}

fn chat(tok: &Tokenizer, d: &SamplingDefaults, body: Value) -> Result<GenerateRequest, ApiError> {
    let info = info();
    Validator { info: &info, tokenizer: Some(tok), defaults: d, max_n: 8 }.chat(body.to_string().as_bytes())
}

/// A completion of one prompt.
fn completion(tok: &Tokenizer, body: Value) -> Result<GenerateRequest, ApiError> {
    completions(tok, body).map(|mut reqs| {
        assert_eq!(reqs.len(), 1, "one prompt");
        reqs.remove(0)
    })
}

fn completions(tok: &Tokenizer, body: Value) -> Result<Vec<GenerateRequest>, ApiError> {
    let info = info();
    Validator { info: &info, tokenizer: Some(tok), defaults: &SamplingDefaults::default(), max_n: 8 }
        .completion(body.to_string().as_bytes())
}

fn param(r: Result<GenerateRequest, ApiError>) -> String {
    match r {
        Err(ApiError::InvalidField { param, .. }) => param,
        other => panic!("expected a field error, got {other:?}"),
    }
}

#[test]
fn chat_parameters_map_to_engine_params() {
    let tok = tokenizer();
    let d = SamplingDefaults { temperature: 0.6, top_p: 0.95, ..Default::default() };
    let r = chat(&tok, &d, json!({"messages": [{"role": "user", "content": "hi"}]})).unwrap();
    assert_eq!((r.params.temperature, r.params.top_p), (0.6, 0.95), "generation_config defaults");
    assert_eq!(r.params.max_tokens, 100 - r.prompt.len(), "default: the rest of the context, as vLLM");
    assert_eq!(r.prompt, tok.encode_chat(&[ChatMessage::new("user", "hi")], ChatOptions::generation()).unwrap());
    assert_eq!((r.n, r.stream, r.include_usage, r.logprobs, r.include_reasoning), (1, false, false, None, true));

    let r = chat(
        &tok,
        &d,
        json!({"model": "m", "messages": [{"role": "developer", "content": "sys"}, {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
               "temperature": 0, "top_p": 0.5, "top_k": -1, "min_p": 0.1, "seed": -1, "stop": "x", "stop_token_ids": [7], "ignore_eos": true,
               "min_tokens": 2, "repetition_penalty": 1.1, "skip_special_tokens": false, "max_tokens": 9, "max_completion_tokens": 5,
               "presence_penalty": 0.5, "frequency_penalty": -1.5, "logit_bias": {"12": 150, " 7": -3.5},
               "n": 2, "stream": true, "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 4,
               "include_reasoning": false, "some_future_field": {"x": 1}}),
    )
    .unwrap();
    let p = &r.params;
    assert_eq!((p.temperature, p.top_p, p.top_k, p.min_p, p.seed), (0.0, 0.5, 0, 0.1, Some(u64::MAX)));
    assert_eq!(
        (p.stop.clone(), p.stop_token_ids.clone(), p.ignore_eos, p.min_tokens),
        (vec!["x".to_string()], vec![7], true, 2)
    );
    assert_eq!(
        (p.repetition_penalty, p.skip_special_tokens, p.max_tokens, p.top_logprobs),
        (1.1, false, 5, 4),
        "max_completion_tokens wins"
    );
    assert_eq!((p.presence_penalty, p.frequency_penalty), (0.5, -1.5));
    assert_eq!(p.logit_bias, vec![(7, -3.5), (12, 100.0)], "ids sorted, biases clamped to [-100, 100] as vLLM");
    assert_eq!((r.n, r.stream, r.include_usage, r.logprobs, r.include_reasoning), (2, true, true, Some(4), false));
    let text = tok.decode(&r.prompt, false).unwrap();
    assert!(text.starts_with("<｜begin▁of▁sentence｜>sys<｜User｜>ab"), "{text}");
}

#[test]
fn each_bad_field_is_named() {
    let tok = tokenizer();
    let d = SamplingDefaults::default();
    let with = |k: &str, v: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
        b[k] = v;
        chat(&tok, &d, b)
    };
    for (k, v) in [
        ("temperature", json!(-1)),
        ("temperature", json!("1")),
        ("top_p", json!(0.0)),
        ("top_p", json!(1.01)),
        ("top_k", json!(-2)),
        ("min_p", json!(2)),
        ("repetition_penalty", json!(0)),
        ("max_tokens", json!(0)),
        ("max_tokens", json!(1.5)),
        ("n", json!(0)),
        ("n", json!(9)),
        ("seed", json!("abc")),
        ("stop", json!([1])),
        ("stop_token_ids", json!("x")),
        ("logprobs", json!(3)),
        ("top_logprobs", json!(21)),
        ("min_tokens", json!(5)),
        ("presence_penalty", json!(2.5)),
        ("presence_penalty", json!("0.5")),
        ("frequency_penalty", json!(-3)),
        ("logit_bias", json!([1])),
        ("logit_bias", json!({"abc": 1})),
        ("logit_bias", json!({"-1": 1})),
        ("logit_bias", json!({"5": "x"})),
        ("logit_bias", json!({"400": 1})),
        ("chat_template_kwargs", json!([1])),
        ("messages", json!([])),
        ("messages", json!("hi")),
        ("stream_options", json!({"include_usage": true})),
    ] {
        assert_eq!(param(with(k, v.clone())), k, "{k} = {v}");
    }
    assert_eq!(
        param(with("messages", json!([{"role": "user", "content": [{"type": "text", "text": 1}]}]))),
        "messages[0].content[0].text"
    );
    assert_eq!(param(with("messages", json!([{"role": "user"}]))), "messages[0].content");
    assert_eq!(param(with("messages", json!(["x"]))), "messages[0]");
    assert!(matches!(with("model", json!("other")), Err(ApiError::ModelNotFound(m)) if m == "other"));
    assert!(with("frequency_penalty", json!(0)).is_ok(), "zero penalties are accepted");
    assert!(with("logit_bias", json!({})).is_ok() && with("logit_bias", Value::Null).is_ok());
    assert!(with("messages", json!([{"role": "assistant", "content": null}, {"role": "user", "content": "x"}])).is_ok());
    assert!(matches!(
        chat(&tok, &d, json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 99})),
        Err(ApiError::ContextLength { param: "messages", .. })
    ));
    assert!(matches!(
        Validator { info: &info(), tokenizer: Some(&tok), defaults: &d, max_n: 8 }.chat(b"{oops"),
        Err(ApiError::MalformedJson(_))
    ));
}

#[test]
fn completion_prompts_text_ids_and_limits() {
    let tok = tokenizer();
    let r = completion(&tok, json!({"prompt": "hello", "max_tokens": 3})).unwrap();
    assert_eq!(r.prompt, tok.encode("hello", true).unwrap());
    assert_eq!(r.endpoint, Endpoint::Completion);
    assert_eq!(completion(&tok, json!({"prompt": ["hello"]})).unwrap().prompt, r.prompt);
    assert_eq!(completion(&tok, json!({"prompt": [5, 6, 7]})).unwrap().prompt, vec![5, 6, 7]);
    assert_eq!(completion(&tok, json!({"prompt": [[5, 6]]})).unwrap().prompt, vec![5, 6]);
    assert_eq!(completion(&tok, json!({"prompt": [5], "logprobs": 3})).unwrap().logprobs, Some(3));
    assert_eq!(
        completion(&tok, json!({"prompt": [5], "max_completion_tokens": 2, "max_tokens": 7}))
            .unwrap()
            .params
            .max_tokens,
        7,
        "completions read max_tokens"
    );
    // Several prompts: one request each, alike but for the prompt and its default max_tokens.
    let many = completions(&tok, json!({"prompt": ["hello", "a b c d"], "n": 2, "temperature": 0.5})).unwrap();
    assert_eq!(
        many.iter().map(|r| r.prompt.clone()).collect::<Vec<_>>(),
        [tok.encode("hello", true).unwrap(), tok.encode("a b c d", true).unwrap()]
    );
    assert_eq!(
        many.iter().map(|r| r.params.max_tokens).collect::<Vec<_>>(),
        many.iter().map(|r| 100 - r.prompt.len()).collect::<Vec<_>>()
    );
    assert!(many.iter().all(|r| r.n == 2 && r.params.temperature == 0.5));
    let lists = completions(&tok, json!({"prompt": [[5, 6], [7]], "max_tokens": 4})).unwrap();
    assert_eq!(
        lists.iter().map(|r| (r.prompt.clone(), r.params.max_tokens)).collect::<Vec<_>>(),
        [(vec![5, 6], 4), (vec![7], 4)]
    );
    let param_of = |body: Value| match completions(&tok, body) {
        Err(ApiError::InvalidField { param, message }) => (param, message),
        other => panic!("{other:?}"),
    };
    assert_eq!(param_of(json!({"prompt": ["a", 5]})).0, "prompt");
    assert_eq!(param_of(json!({"prompt": [[5], [400]]})).0, "prompt", "each prompt's ids are checked");
    let (p, m) = param_of(json!({"prompt": ["a", "b", "c"], "n": 3}));
    assert!(p == "prompt" && m.contains("9 sequences") && m.contains("at most 8"), "{m}");
    assert!(matches!(completions(&tok, json!({"prompt": [[1], vec![1; 100]]})), Err(ApiError::ContextLength { .. })));
    for bad in [
        json!({}),
        json!({"prompt": []}),
        json!({"prompt": [1, 400]}),
        json!({"prompt": 5}),
        json!({"prompt": "x", "echo": true}),
        json!({"prompt": "x", "logprobs": 30}),
    ] {
        assert!(completion(&tok, bad.clone()).is_err(), "{bad}");
    }
    let e = completion(&tok, json!({"prompt": vec![1; 98], "max_tokens": 3})).unwrap_err();
    assert_eq!(
        e,
        ApiError::ContextLength {
            param: "prompt",
            max_model_len: 100,
            prompt_tokens: 98,
            max_tokens: 3,
            requested: 101
        }
    );
    assert!(completion(&tok, json!({"prompt": vec![1; 100]})).is_err(), "no room left at all");
}

#[test]
fn without_a_tokenizer_text_is_refused_and_token_ids_pass() {
    let (info, d) = (info(), SamplingDefaults::default());
    let v = Validator { info: &info, tokenizer: None, defaults: &d, max_n: 8 };
    let no_tok = |r: Result<(), ApiError>| matches!(r, Err(ApiError::InvalidRequest(m)) if m.contains("no tokenizer"));
    let messages = json!({"messages": [{"role": "user", "content": "hi"}]}).to_string();
    assert!(no_tok(v.chat(messages.as_bytes()).map(|_| ())));
    assert!(no_tok(v.tokenize(messages.as_bytes()).map(|_| ())));
    assert!(no_tok(v.completion(json!({"prompt": "hi"}).to_string().as_bytes()).map(|_| ())));
    let ids = v.completion(json!({"prompt": [5, 9, 13], "max_tokens": 2}).to_string().as_bytes()).unwrap();
    assert_eq!(ids[0].prompt, vec![5, 9, 13]);
}
