//! The OpenAI-compatible API over real HTTP against a real cluster (golden checkpoint, greedy):
//! SSE framing, chat and completions streaming and not, usage, finish reasons, stop strings, n > 1,
//! logprobs, and the auxiliary routes.

mod common;

use common::*;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_stream_framing_usage_and_finish_match_the_non_streaming_answer() {
    let s = TestServer::golden(16).await;
    let mut body = chat("Tell me a story", 12);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let events = s.stream("/v1/chat/completions", &body).await;
    let (choices, usage) = gather_chat(&events, 1);
    let c = &choices[0];
    assert_eq!(c.finish.as_deref(), Some("length"));
    let usage = usage.expect("usage chunk");
    assert_eq!(usage["completion_tokens"], 12);
    let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap();
    assert_eq!(usage["total_tokens"].as_u64().unwrap(), prompt_tokens + 12);
    // The template tokens count: the rendered prompt is longer than the user's words.
    let (_, tok) = s.json("/tokenize", &json!({"messages": [{"role": "user", "content": "Tell me a story"}]})).await;
    assert_eq!(tok["count"].as_u64().unwrap(), prompt_tokens);
    // Intermediate chunks carry no finish_reason and no usage key.
    for e in &events[..events.len() - 3] {
        let v = e.json();
        assert!(v.get("usage").is_none());
        assert!(v["choices"][0]["finish_reason"].is_null());
    }

    body["stream"] = json!(false);
    body.as_object_mut().unwrap().remove("stream_options");
    let (status, v) = s.json("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["model"], MODEL);
    let msg = &v["choices"][0]["message"];
    assert_eq!(msg["role"], "assistant");
    // The golden tokenizer has </think> and its random model never emits it: all reasoning.
    assert_eq!(msg["reasoning_content"].as_str().unwrap(), c.reasoning);
    assert_eq!(msg["content"], Value::Null);
    assert_eq!(c.content, "");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"], usage);
    assert!(!c.reasoning.is_empty());
    assert_eq!(s.wait_idle().blocks_in_use(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_stream_and_not_with_text_and_token_id_prompts() {
    let s = TestServer::golden(16).await;
    let (status, tok) = s.json("/tokenize", &json!({"prompt": "Once upon a time"})).await;
    assert_eq!(status, 200);
    assert_eq!(tok["max_model_len"], 1024);
    let ids = tok["tokens"].clone();
    assert_eq!(tok["count"].as_u64().unwrap() as usize, ids.as_array().unwrap().len());
    assert_eq!(ids[0], 0, "completions prompts get BOS");

    let body =
        json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 10, "temperature": 0, "ignore_eos": true});
    let (status, text_v) = s.json("/v1/completions", &body).await;
    assert_eq!(status, 200, "{text_v}");
    assert_eq!(text_v["object"], "text_completion");
    assert!(text_v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(text_v["choices"][0]["finish_reason"], "length");
    assert_eq!(text_v["usage"]["completion_tokens"], 10);
    let text = text_v["choices"][0]["text"].as_str().unwrap().to_string();

    let by_ids = json!({"prompt": ids, "max_tokens": 10, "temperature": 0, "ignore_eos": true});
    let (_, ids_v) = s.json("/v1/completions", &by_ids).await;
    assert_eq!(ids_v["choices"][0]["text"], text.as_str(), "a token-id prompt gives the same greedy text");

    let mut sb = body.clone();
    sb["stream"] = json!(true);
    sb["stream_options"] = json!({"include_usage": true});
    let events = s.stream("/v1/completions", &sb).await;
    let mut streamed = String::new();
    let id = events[0].json()["id"].clone();
    let n = events.len();
    for e in &events[..n - 2] {
        let v = e.json();
        assert_eq!(v["id"], id);
        assert_eq!(v["object"], "text_completion");
        streamed.push_str(v["choices"][0]["text"].as_str().unwrap());
    }
    assert_eq!(events[n - 3].json()["choices"][0]["finish_reason"], "length");
    assert_eq!(events[n - 2].json()["choices"], json!([]));
    assert_eq!(events[n - 2].json()["usage"]["completion_tokens"], 10);
    assert_eq!(streamed, text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_end_with_stop_and_never_leak() {
    let s = TestServer::golden(16).await;
    let body = json!({"prompt": "The answer is", "max_tokens": 24, "temperature": 0, "ignore_eos": true});
    let (_, v) = s.json("/v1/completions", &body).await;
    let full = v["choices"][0]["text"].as_str().unwrap().to_string();
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() >= 12, "enough text to cut: {full:?}");
    // A stop string from the middle of the text, most likely spanning a token boundary.
    let stop: String = chars[6..10].iter().collect();
    let expected = &full[..full.find(&stop).unwrap()];
    for stream in [false, true] {
        let mut b = body.clone();
        b["stop"] = json!([stop.clone(), "\u{1F600}never"]);
        b["stream"] = json!(stream);
        let (text, finish) = if stream {
            let ev = s.stream("/v1/completions", &b).await;
            let text: String = ev
                .iter()
                .filter_map(|e| match e {
                    Event::Json(v) => v["choices"][0]["text"].as_str().map(str::to_string),
                    Event::Done => None,
                })
                .collect();
            (text, ev[ev.len() - 2].json()["choices"][0]["finish_reason"].clone())
        } else {
            let (_, v) = s.json("/v1/completions", &b).await;
            (v["choices"][0]["text"].as_str().unwrap().to_string(), v["choices"][0]["finish_reason"].clone())
        };
        assert_eq!(text, expected, "stream={stream}");
        assert!(!text.contains(&stop));
        assert_eq!(finish, "stop");
    }
    // Chat: the stop string is cut from the reasoning text too.
    let mut c = chat("hi", 24);
    let (_, v) = s.json("/v1/chat/completions", &c).await;
    let reasoning = v["choices"][0]["message"]["reasoning_content"].as_str().unwrap().to_string();
    let rc: Vec<char> = reasoning.chars().collect();
    let stop: String = rc[5..8].iter().collect();
    c["stop"] = json!(stop);
    c["stream"] = json!(true);
    let (choices, _) = gather_chat(&s.stream("/v1/chat/completions", &c).await, 1);
    assert_eq!(choices[0].reasoning, &reasoning[..reasoning.find(&stop).unwrap()]);
    assert_eq!(choices[0].finish.as_deref(), Some("stop"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_choices_are_indexed_and_each_finishes() {
    let s = TestServer::golden(16).await;
    let mut body = chat("pick a number", 8);
    body["n"] = json!(3);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let (choices, usage) = gather_chat(&s.stream("/v1/chat/completions", &body).await, 3);
    for c in &choices {
        assert_eq!(c.finish.as_deref(), Some("length"));
        assert!(c.chunks >= 2);
        assert_eq!(c.reasoning, choices[0].reasoning, "greedy choices agree");
    }
    assert_eq!(usage.unwrap()["completion_tokens"], 24, "usage sums the choices");

    // Sampled with a seed: choice i uses seed + i, so the request is reproducible.
    let body = json!({"prompt": "x", "max_tokens": 16, "n": 2, "temperature": 1.0, "seed": 7, "ignore_eos": true});
    let (_, a) = s.json("/v1/completions", &body).await;
    let (_, b) = s.json("/v1/completions", &body).await;
    let texts = |v: &Value| {
        v["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["index"].as_u64().unwrap(), c["text"].as_str().unwrap().to_string()))
            .collect::<Vec<_>>()
    };
    assert_eq!(texts(&a), texts(&b));
    assert_eq!(texts(&a).iter().map(|t| t.0).collect::<Vec<_>>(), vec![0, 1]);
    assert_eq!(a["usage"]["completion_tokens"], 32);
    assert_eq!(s.wait_idle().blocks_in_use(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_in_chat_and_completion_shapes() {
    let s = TestServer::golden(16).await;
    let mut body = chat("logprobs please", 6);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(3);
    let (status, v) = s.json("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    let lps = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(lps.len(), 6, "one entry per generated token");
    for lp in lps {
        let top = lp["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(top[0]["token"], lp["token"]);
        assert!((top[0]["logprob"].as_f64().unwrap() - lp["logprob"].as_f64().unwrap()).abs() < 1e-6);
        assert!(top[0]["logprob"].as_f64() >= top[1]["logprob"].as_f64());
        assert!(lp["logprob"].as_f64().unwrap() <= 0.0);
        assert_eq!(lp["bytes"].as_array().unwrap().len(), lp["token"].as_str().unwrap().len());
    }
    body["stream"] = json!(true);
    let (choices, _) = gather_chat(&s.stream("/v1/chat/completions", &body).await, 1);
    assert_eq!(&choices[0].logprobs, lps, "streamed logprobs are the same entries");

    let body = json!({"prompt": "abc", "max_tokens": 5, "temperature": 0, "logprobs": 2, "ignore_eos": true});
    let (_, v) = s.json("/v1/completions", &body).await;
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 5);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 5);
    assert_eq!(lp["text_offset"][0], 0);
    assert!(lp["top_logprobs"][0].as_object().unwrap().len() <= 2);
    let (_, plain) = s.json("/v1/chat/completions", &chat("x", 2)).await;
    assert_eq!(plain["choices"][0]["logprobs"], Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_health_metrics_tokenize_detokenize() {
    let s = TestServer::golden(16).await;
    let r = s.get("/health").await;
    assert_eq!(r.status(), 200);
    let v: Value = s.get("/v1/models").await.json().await.unwrap();
    assert_eq!(v["object"], "list");
    let m = &v["data"][0];
    assert_eq!(m["id"], MODEL);
    assert_eq!(m["object"], "model");
    assert_eq!(m["owned_by"], "cleave");
    assert_eq!(m["parent"], Value::Null);
    assert_eq!(m["max_model_len"], 1024);
    assert!(m["root"].as_str().unwrap().ends_with("bf16-qlora"));

    let (_, t) = s.json("/tokenize", &json!({"prompt": "hello world", "add_special_tokens": false})).await;
    let (status, d) = s.json("/detokenize", &json!({"tokens": t["tokens"]})).await;
    assert_eq!(status, 200);
    assert_eq!(d["prompt"], "hello world");
    let (_, chat_t) = s
        .json("/tokenize", &json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]}))
        .await;
    let (_, text) = s.json("/detokenize", &json!({"tokens": chat_t["tokens"]})).await;
    assert_eq!(text["prompt"], "<｜begin▁of▁sentence｜><｜User｜>hello<｜Assistant｜><think>\n");
    let (status, _) = s.json("/detokenize", &json!({"tokens": [100000]})).await;
    assert_eq!(status, 400);

    let _ = s.json("/v1/completions", &json!({"prompt": "a", "max_tokens": 2})).await;
    let text = s.get("/metrics").await.text().await.unwrap();
    assert!(text.contains("cleave_gateway_http_requests_total{route=\"/v1/completions\",status=\"200\"} 1"), "{text}");
    assert!(text.contains("cleave_gateway_requests_in_flight 0"));
    assert!(
        text.lines().any(|l| l.starts_with("cleave_") && !l.starts_with("cleave_gateway_")),
        "the cluster's metrics are included"
    );
    let r = s.get("/v1/chat/completions").await;
    assert_eq!(r.status(), 405);
    let r = s.get("/nope").await;
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logit_bias_and_penalties_over_http() {
    let s = TestServer::golden(16).await;
    let (_, t) = s.json("/tokenize", &json!({"prompt": "q", "add_special_tokens": false})).await;
    let q = t["tokens"][0].as_u64().unwrap();
    let (_, want) = s.json("/detokenize", &json!({"tokens": [q, q, q, q]})).await;
    // OpenAI's form: token ids as string keys; +100 makes the token every greedy pick.
    let body = json!({"prompt": "abc", "max_tokens": 4, "temperature": 0, "ignore_eos": true,
                      "logit_bias": {q.to_string(): 100}, "presence_penalty": 0.5, "frequency_penalty": 0.5});
    let (status, v) = s.json("/v1/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], want["prompt"], "{v}");
    let chat_body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0,
                           "logit_bias": {q.to_string(): 100}});
    let (status, v) = s.json("/v1/chat/completions", &chat_body).await;
    assert_eq!(status, 200, "{v}");
    let (_, want3) = s.json("/detokenize", &json!({"tokens": [q, q, q]})).await;
    let reply = &v["choices"][0]["message"];
    let got =
        format!("{}{}", reply["reasoning_content"].as_str().unwrap_or(""), reply["content"].as_str().unwrap_or(""));
    assert_eq!(got, want3["prompt"].as_str().unwrap(), "{v}");
    for (key, value) in [
        ("logit_bias", json!({"100000": 1})),
        ("logit_bias", json!({"x": 1})),
        ("presence_penalty", json!(2.5)),
        ("frequency_penalty", json!(-2.5)),
    ] {
        let mut b = body.clone();
        b[key] = value;
        let (status, v) = s.json("/v1/completions", &b).await;
        assert_eq!((status, v["error"]["param"].as_str()), (400, Some(key)), "{v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_prompts_in_one_completion_request() {
    let s = TestServer::golden(16).await;
    let prompts = ["abc", "hello world", "x"];
    let one = |p: &str| json!({"prompt": p, "max_tokens": 5, "temperature": 0, "ignore_eos": true});
    let mut alone = Vec::new();
    let mut prompt_tokens = 0;
    for p in prompts {
        let (_, v) = s.json("/v1/completions", &one(p)).await;
        alone.push(v["choices"][0]["text"].as_str().unwrap().to_string());
        prompt_tokens += v["usage"]["prompt_tokens"].as_u64().unwrap();
    }
    // As vLLM: prompt p's choice j is choice p n + j; usage sums over the prompts.
    let body = json!({"prompt": prompts, "max_tokens": 5, "temperature": 0, "ignore_eos": true, "n": 2});
    let (status, v) = s.json("/v1/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 6);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["text"], alone[i / 2].as_str(), "choice {i}");
        assert_eq!(c["finish_reason"], "length");
    }
    assert_eq!(v["usage"]["prompt_tokens"], prompt_tokens);
    assert_eq!(v["usage"]["completion_tokens"], 30);
    // Streamed: the same texts, gathered by index.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let events = s.stream("/v1/completions", &streamed).await;
    let mut texts = vec![String::new(); 6];
    let mut usage = None;
    for e in events.iter().filter_map(|e| if let Event::Json(v) = e { Some(v) } else { None }) {
        for c in e["choices"].as_array().unwrap() {
            texts[c["index"].as_u64().unwrap() as usize] += c["text"].as_str().unwrap();
        }
        if !e["usage"].is_null() {
            usage = Some(e["usage"].clone());
        }
    }
    assert_eq!(texts, (0..6).map(|i| alone[i / 2].clone()).collect::<Vec<_>>());
    assert_eq!(usage.unwrap()["prompt_tokens"], prompt_tokens);
    // Token-id lists too; one prompt past the context refuses the whole request.
    let (status, v) = s.json("/v1/completions", &json!({"prompt": [[5, 6], [7]], "max_tokens": 2})).await;
    assert_eq!((status, v["choices"].as_array().map(Vec::len)), (200, Some(2)), "{v}");
    let (status, v) = s.json("/v1/completions", &json!({"prompt": [[5], vec![5; 5000]], "max_tokens": 2})).await;
    assert_eq!((status, v["error"]["param"].as_str()), (400, Some("prompt")), "{v}");
    assert_eq!(s.wait_idle().blocks_in_use(), 0);
}
